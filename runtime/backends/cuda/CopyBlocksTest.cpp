//===- CopyBlocksTest.cpp - the CUDA device's row gathers and sums -------===//
//
// gatherRows against memcpy on the host, sumRows against a host sum of the
// same rows, localExperts against the rule on the host, staged uploads;
// destinations start poisoned.

#include "runtime/backends/cuda/CopyBlocks.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"

namespace moec::runtime::cuda {
namespace {

/// gatherRows against memcpy on the host: rows of `rowBytes` (16-byte multiples take the vector
/// path, 4-byte multiples the word path, odd sizes bytes), sources in any order and repeated;
/// the destination starts poisoned and bytes past the gathered rows keep the poison.
void expectGather(size_t rowBytes, size_t rows, uint64_t seed) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    GTEST_SKIP() << "no GPU available";
  std::mt19937_64 rng(seed);
  const size_t sourceRows = 97;
  std::vector<int64_t> table(rows);
  for (int64_t &r : table)
    r = static_cast<int64_t>(rng() % sourceRows);
  std::vector<uint8_t> src(sourceRows * rowBytes), want((rows + 1) * rowBytes, 0xAB);
  for (uint8_t &v : src)
    v = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < rows; ++i)
    std::memcpy(want.data() + i * rowBytes, src.data() + table[i] * rowBytes, rowBytes);
  void *dSrc = nullptr, *dDst = nullptr;
  ASSERT_EQ(cudaMalloc(&dSrc, src.size() + 1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dDst, want.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dSrc, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
  BlockCopier copier(nullptr);
  // Three times with a fresh destination: the ring's further table buffers.
  for (int again = 0; again < 3; ++again) {
    ASSERT_EQ(cudaMemset(dDst, 0xAB, want.size()), cudaSuccess);
    EXPECT_EQ(copier.gatherRows(dDst, dSrc, table, rowBytes), "");
  }
  std::vector<uint8_t> got(want.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dDst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i)
    wrong += got[i] != want[i];
  EXPECT_EQ(wrong, 0u) << "of " << got.size() << " bytes";
  cudaFree(dSrc);
  cudaFree(dDst);
}

TEST(GatherRows, SixteenByteRows) { expectGather(4096, 1000, 1); }
TEST(GatherRows, FourByteRows) { expectGather(36, 333, 2); }
TEST(GatherRows, ByteRows) { expectGather(7, 257, 3); }
TEST(GatherRows, Nothing) { expectGather(16, 0, 4); }

// Staged uploads: the host buffer may change right after the call; each upload lands whole,
// also when the ring of pinned buffers comes round again (more uploads than buffers).
TEST(CopyBlocks, StagedUploads) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    GTEST_SKIP() << "no GPU available";
  BlockCopier copier(nullptr);
  std::vector<int64_t> host(1000);
  const int uploads = 40;
  int64_t *device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, uploads * host.size() * sizeof(int64_t)), cudaSuccess);
  for (int k = 0; k < uploads; ++k) {
    for (size_t i = 0; i < host.size(); ++i)
      host[i] = k * 100000 + static_cast<int64_t>(i);
    EXPECT_EQ(copier.upload(device + k * host.size(), host.data(), host.size() * sizeof(int64_t)), "");
  }
  std::vector<int64_t> got(uploads * host.size());
  ASSERT_EQ(cudaMemcpy(got.data(), device, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], static_cast<int64_t>(i / host.size()) * 100000 + static_cast<int64_t>(i % host.size())) << i;
  cudaFree(device);
}

/// sumRows against a host sum: tokens with rows from none, one or several of 3 sources, a
/// width that is no multiple of the block, f32 or bf16 rows in and out (bf16 out: the host
/// rounds the f32 sum once, as the kernel does).
void expectSums(bool srcBf16, bool dstBf16, uint64_t seed) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    GTEST_SKIP() << "no GPU available";
  std::mt19937_64 rng(seed);
  const size_t tokens = 301, sources = 3, width = 333, srcRows = 700;
  std::vector<int64_t> rows(tokens * sources);
  for (int64_t &r : rows)
    r = rng() % 3 == 0 ? -1 : static_cast<int64_t>(rng() % srcRows);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> src(srcRows * width);
  for (float &v : src)
    v = uniform(rng);
  auto toBf16 = [](float v) { // round to nearest even, as __float2bfloat16_rn
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>(bits >> 16);
  };
  auto fromBf16 = [](uint16_t h) {
    uint32_t bits = static_cast<uint32_t>(h) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  };
  if (srcBf16)
    for (float &v : src)
      v = fromBf16(toBf16(v));
  std::vector<float> want(tokens * width, 0.0f);
  for (size_t t = 0; t < tokens; ++t)
    for (size_t d = 0; d < width; ++d) {
      float sum = 0.0f;
      for (size_t s = 0; s < sources; ++s)
        if (rows[t * sources + s] >= 0)
          sum += src[rows[t * sources + s] * width + d];
      want[t * width + d] = dstBf16 ? fromBf16(toBf16(sum)) : sum;
    }
  size_t element = srcBf16 ? 2 : 4, outElement = dstBf16 ? 2 : 4;
  std::vector<uint8_t> srcBytes(src.size() * element);
  for (size_t i = 0; i < src.size(); ++i)
    if (srcBf16) {
      uint16_t h = toBf16(src[i]);
      std::memcpy(srcBytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(srcBytes.data() + 4 * i, &src[i], 4);
    }
  void *dSrc = nullptr, *dDst = nullptr;
  ASSERT_EQ(cudaMalloc(&dSrc, srcBytes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dDst, want.size() * outElement), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dSrc, srcBytes.data(), srcBytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dDst, 0xFF, want.size() * outElement), cudaSuccess); // NaN poison
  BlockCopier copier(nullptr);
  EXPECT_EQ(copier.sumRows(dDst, dSrc, rows, sources, width, srcBf16, dstBf16), "");
  std::vector<uint8_t> got(want.size() * outElement);
  ASSERT_EQ(cudaMemcpy(got.data(), dDst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  size_t wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    float g;
    if (dstBf16) {
      uint16_t h;
      std::memcpy(&h, got.data() + 2 * i, 2);
      g = fromBf16(h);
    } else {
      std::memcpy(&g, got.data() + 4 * i, 4);
    }
    wrong += !(g == want[i]); // the same additions in the same order: bit for bit
  }
  EXPECT_EQ(wrong, 0u) << "of " << want.size() << " elements";
  cudaFree(dSrc);
  cudaFree(dDst);
}

// convert: f32 to bf16 rounds to nearest even, as the host does; back to f32 is exact.
TEST(Convert, F32ToBf16RoundsToNearestEven) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    GTEST_SKIP() << "no GPU available";
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<float> uniform(-3.0f, 3.0f);
  std::vector<float> src(10007);
  for (float &v : src)
    v = uniform(rng);
  float *dSrc = nullptr, *dBack = nullptr;
  uint16_t *dHalf = nullptr;
  ASSERT_EQ(cudaMalloc(&dSrc, src.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dHalf, src.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dBack, src.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dSrc, src.data(), src.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  BlockCopier copier(nullptr);
  EXPECT_EQ(copier.convert(dHalf, dSrc, src.size(), false, true), "");
  EXPECT_EQ(copier.convert(dBack, dHalf, src.size(), true, false), "");
  std::vector<float> back(src.size());
  ASSERT_EQ(cudaMemcpy(back.data(), dBack, back.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  size_t wrong = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &src[i], 4);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    float want;
    std::memcpy(&want, &bits, 4);
    wrong += !(back[i] == want);
  }
  EXPECT_EQ(wrong, 0u) << "of " << src.size();
  cudaFree(dSrc);
  cudaFree(dHalf);
  cudaFree(dBack);
}

TEST(SumRows, F32RowsAddInSourceOrder) { expectSums(false, false, 5); }
TEST(SumRows, Bf16RowsRoundTheF32SumOnce) { expectSums(true, true, 6); }
TEST(SumRows, F32RowsIntoBf16RoundTheSumOnce) { expectSums(false, true, 7); }

/// localExperts against the rule on the host: experts of rank `rank` of `ranks` (E/ranks each)
/// become local numbers, every other expert -1; a count that is not a multiple of any block
/// size, and the elements past it keep their values.
template <typename Index>
void expectLocalExperts(int64_t rank, int64_t ranks, uint64_t seed) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    GTEST_SKIP() << "no GPU available";
  const int64_t experts = 128, perRank = experts / ranks, count = 3 * 4099 * 8;
  std::mt19937_64 rng(seed);
  std::vector<Index> indices(count + 5), want(indices.size());
  for (Index &e : indices)
    e = static_cast<Index>(rng() % experts);
  for (size_t i = 0; i < indices.size(); ++i) {
    int64_t local = int64_t(indices[i]) - rank * perRank;
    want[i] = i < size_t(count) ? static_cast<Index>(local >= 0 && local < perRank ? local : -1) : indices[i];
  }
  void *d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, indices.size() * sizeof(Index)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, indices.data(), indices.size() * sizeof(Index), cudaMemcpyHostToDevice), cudaSuccess);
  BlockCopier copier(nullptr);
  EXPECT_EQ(copier.localExperts(d, size_t(count), sizeof(Index) == 8, rank * perRank, perRank), "");
  std::vector<Index> got(indices.size());
  ASSERT_EQ(cudaMemcpy(got.data(), d, got.size() * sizeof(Index), cudaMemcpyDeviceToHost), cudaSuccess);
  size_t wrong = 0, local = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    wrong += got[i] != want[i];
    local += i < size_t(count) && got[i] >= 0;
  }
  EXPECT_EQ(wrong, 0u) << "of " << got.size() << " indices";
  EXPECT_GT(local, 0u); // some experts are this rank's, so the test sees both cases
  cudaFree(d);
}

TEST(LocalExperts, I32SecondOfTwoRanks) { expectLocalExperts<int32_t>(1, 2, 8); }
TEST(LocalExperts, I64ThirdOfEightRanks) { expectLocalExperts<int64_t>(2, 8, 9); }

} // namespace
} // namespace moec::runtime::cuda
