//===- Mamba2Checks.h - moe.mamba2's launch checks, CPU and CUDA -*- C++ -*-===//
//
// The shape of a moe.mamba2 launch and the checks that read it, shared by the
// CPU kernel and its CUDA twin. The two differ only in the float storage they
// take (f32; f32 or bf16) and in whether a short input list fails up front.
// Mamba2Shape is also a CUDA kernel argument, hence MOEC_HOST_DEVICE.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_MAMBA_MAMBA2CHECKS_H_
#define RUNTIME_KERNELS_CHECKS_MAMBA_MAMBA2CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"

#ifndef MOEC_HOST_DEVICE
#ifdef __CUDACC__
#define MOEC_HOST_DEVICE __host__ __device__
#else
#define MOEC_HOST_DEVICE
#endif
#endif

namespace moec::runtime::checks::mamba2 {

/// Operand groups of moe.mamba2 (conv_bias is the only optional one).
enum Operand { Zxbcdt, ConvWeight, ConvBias, DtBias, ALog, DSkip, NormWeight, NumOperands };

struct Mamba2Shape {
  int64_t tokens = 0, seqLen = 0, batch = 0;
  int64_t heads = 0, headDim = 0, state = 0, groups = 0, kernel = 0, chunk = 0;
  int64_t inner = 0, channels = 0, width = 0; // H*p, H*p + 2*G*N, 2*H*p + 2*G*N + H
  int64_t headsPerGroup = 0, normGroup = 0;   // H/G, H*p/G
  double eps = 0, dtMin = 0;
  bool convBias = false;

  MOEC_HOST_DEVICE int64_t bColumn(int64_t g) const { return inner + g * state; }
  MOEC_HOST_DEVICE int64_t cColumn(int64_t g) const { return inner + (groups + g) * state; }
  /// The backward's checkpoint spacing and count per sequence.
  MOEC_HOST_DEVICE int64_t chunkLen() const { return chunk < seqLen ? chunk : seqLen; }
  MOEC_HOST_DEVICE int64_t numChunks() const { return (seqLen + chunkLen() - 1) / chunkLen(); }
};

/// What a backend's kernels take.
struct Rules {
  bool bf16 = false;        // float tensors may be bf16 as well as f32
  bool countInputs = false; // fail when there are fewer inputs than operands, before reading any
};

/// Fails with "<what> must be f32" (or "f32 or bf16") unless `t` is so stored.
void expectFloat(const KernelContext &ctx, const TensorRef &t, const std::string &what, const Rules &rules);

/// Validates the launch and reads its shape; `present` maps operand groups to
/// input indices (-1 = absent) for the first `numOperands` inputs.
Mamba2Shape readShape(const KernelContext &ctx, size_t numOperands, std::vector<int64_t> &present,
                      const Rules &rules);

/// The backward's launch: the forward operands (`backward_segments`[0] of them,
/// else all inputs but the last), then the result's gradient, the last input;
/// one gradient output per grad_of_inputs entry, stored like its operand's size.
Mamba2Shape readBackwardShape(const KernelContext &ctx, std::vector<int64_t> &present, const Rules &rules);

} // namespace moec::runtime::checks::mamba2

#endif // RUNTIME_KERNELS_CHECKS_MAMBA_MAMBA2CHECKS_H_
