//===- CopyBlocksTest.cpp - the CUDA device's batched block copy ----------===//
//
// Against memcpy on the host: blocks of 16-byte multiples (the vector path),
// of 4-byte multiples, odd sizes and offsets (bytes), empty blocks, one block
// holding most bytes; the destination starts poisoned and bytes no block
// writes must keep the poison. sumRows against a host sum of the same rows.

#include "runtime/backends/cuda/CopyBlocks.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"

namespace moec::runtime::cuda {
namespace {

void expectCopies(size_t granule, int blocks, uint64_t seed) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    GTEST_SKIP() << "no GPU available";
  std::mt19937_64 rng(seed);
  std::vector<CopyBlock> table;
  size_t srcAt = 0, dstAt = 0;
  for (int b = 0; b < blocks; ++b) {
    size_t bytes = granule * (b == 3 ? 20000 : rng() % 300); // one large, some empty
    table.push_back({dstAt + granule * (rng() % 3), srcAt, bytes});
    srcAt += bytes + granule * (rng() % 2);
    dstAt = table.back().to + bytes;
  }
  std::shuffle(table.begin(), table.end(), rng); // any order
  std::vector<uint8_t> src(srcAt + 1), want(dstAt + 1, 0xAB);
  for (uint8_t &v : src)
    v = static_cast<uint8_t>(rng());
  for (const CopyBlock &b : table)
    std::memcpy(want.data() + b.to, src.data() + b.from, b.bytes);
  void *dSrc = nullptr, *dDst = nullptr;
  ASSERT_EQ(cudaMalloc(&dSrc, src.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dDst, want.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dSrc, src.data(), src.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(dDst, 0xAB, want.size()), cudaSuccess);
  BlockCopier copier(nullptr);
  EXPECT_EQ(copier.copy(dDst, dSrc, table), "");
  // Again with a fresh destination: further table buffers of the ring.
  ASSERT_EQ(cudaMemset(dDst, 0xAB, want.size()), cudaSuccess);
  EXPECT_EQ(copier.copy(dDst, dSrc, table), "");
  ASSERT_EQ(cudaMemset(dDst, 0xAB, want.size()), cudaSuccess);
  EXPECT_EQ(copier.copy(dDst, dSrc, table), "");
  std::vector<uint8_t> got(want.size());
  ASSERT_EQ(cudaMemcpy(got.data(), dDst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i)
    wrong += got[i] != want[i];
  EXPECT_EQ(wrong, 0u) << "of " << got.size() << " bytes";
  cudaFree(dSrc);
  cudaFree(dDst);
}

TEST(CopyBlocks, SixteenByteBlocks) { expectCopies(16, 64, 1); }
TEST(CopyBlocks, FourByteBlocks) { expectCopies(4, 130, 2); }
TEST(CopyBlocks, ByteBlocks) { expectCopies(1, 257, 3); }
TEST(CopyBlocks, Nothing) { expectCopies(16, 0, 4); }

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

TEST(SumRows, F32RowsAddInSourceOrder) { expectSums(false, false, 5); }
TEST(SumRows, Bf16RowsRoundTheF32SumOnce) { expectSums(true, true, 6); }
TEST(SumRows, F32RowsIntoBf16RoundTheSumOnce) { expectSums(false, true, 7); }

} // namespace
} // namespace moec::runtime::cuda
