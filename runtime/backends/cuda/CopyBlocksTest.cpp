//===- CopyBlocksTest.cpp - the CUDA device's batched block copy ----------===//
//
// Against memcpy on the host: blocks of 16-byte multiples (the vector path),
// of 4-byte multiples, odd sizes and offsets (bytes), empty blocks, one block
// holding most bytes; the destination starts poisoned and bytes no block
// writes must keep the poison.

#include "runtime/backends/cuda/CopyBlocks.h"

#include <cstring>
#include <random>

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
  // Again with a fresh destination: the second table buffer, then the first one reused.
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

// Staged uploads: the host buffer may change right after the call; each upload lands whole.
TEST(CopyBlocks, StagedUploads) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    GTEST_SKIP() << "no GPU available";
  BlockCopier copier(nullptr);
  std::vector<int64_t> host(1000);
  int64_t *device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 5 * host.size() * sizeof(int64_t)), cudaSuccess);
  for (int k = 0; k < 5; ++k) {
    for (size_t i = 0; i < host.size(); ++i)
      host[i] = k * 100000 + static_cast<int64_t>(i);
    EXPECT_EQ(copier.upload(device + k * host.size(), host.data(), host.size() * sizeof(int64_t)), "");
  }
  std::vector<int64_t> got(5 * host.size());
  ASSERT_EQ(cudaMemcpy(got.data(), device, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], static_cast<int64_t>(i / host.size()) * 100000 + static_cast<int64_t>(i % host.size())) << i;
  cudaFree(device);
}

} // namespace
} // namespace moec::runtime::cuda
