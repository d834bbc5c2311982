//===- DeltaRulePath.h - which form of the delta rule gated_delta_net runs -*- C++ -*-===//
//
// gated_delta_net (forward and backward) runs the gated delta rule in chunks
// (ChunkedDeltaRule.cu) whenever that form applies (key_head_dim <= 256; f32
// and bf16 storage alike), else the recurrent form (DeltaRule.cu). Tests and
// the benchmark pin a form with this process-wide switch; kernels only read it.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_DELTARULEPATH_H_
#define RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_DELTARULEPATH_H_

namespace moec::runtime::cuda::linattn {

enum class DeltaRulePath {
  Auto,      // chunked where it applies, else recurrent (the default)
  Recurrent, // always the recurrent form
  Chunked,   // always the chunked form; a launch it does not apply to fails
};

void setDeltaRulePath(DeltaRulePath path);
DeltaRulePath deltaRulePath();

} // namespace moec::runtime::cuda::linattn

#endif // RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_DELTARULEPATH_H_
