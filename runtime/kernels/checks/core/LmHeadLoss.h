//===- LmHeadLoss.h - chunking of the fused LM head and loss ----*- C++ -*-===//
//
// How `lm_head_cross_entropy` and its backward split the tokens into chunks
// and how much scratch memory they take, written once for both backends'
// kernels and for the compiler's memory plan (compiler/plan/Program.cpp),
// which counts the largest kernel scratch in the peak. Plain C++, no deps.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_CORE_LMHEADLOSS_H_
#define RUNTIME_KERNELS_CHECKS_CORE_LMHEADLOSS_H_

#include <algorithm>
#include <cstdint>

namespace moec::runtime::lm_head_loss {

/// The op's default `chunk_tokens` (dialects/moe/MoeOps.td), for launches without it.
constexpr int64_t kDefaultChunkTokens = 1024;

/// Rows of logits held at a time: `chunkTokens`, or every row when there are fewer.
inline int64_t chunkRows(int64_t tokens, int64_t chunkTokens) {
  return std::max<int64_t>(1, std::min(tokens, chunkTokens));
}

/// Bytes of scratch of one launch on the device: one chunk of logits in the storage type
/// (`storageBytes` per element), a float per row (losses), and in the backward, when the
/// weight's gradient is wanted in bf16 storage, its f32 accumulator over the chunks.
inline int64_t scratchBytes(int64_t tokens, int64_t vocab, int64_t hidden, int64_t chunkTokens,
                            int64_t storageBytes, bool backward, bool weightGradBf16) {
  int64_t bytes = chunkRows(tokens, chunkTokens) * vocab * storageBytes + tokens * 4;
  if (backward && weightGradBf16)
    bytes += vocab * hidden * 4;
  return bytes;
}

} // namespace moec::runtime::lm_head_loss

#endif // RUNTIME_KERNELS_CHECKS_CORE_LMHEADLOSS_H_
