//===- Core.cuh - device helpers of the attention core (Dense.cu, Sparse.cu) -*- CUDA -*-===//

#ifndef RUNTIME_KERNELS_CUDA_ATTENTION_CORE_CUH_
#define RUNTIME_KERNELS_CUDA_ATTENTION_CORE_CUH_

#include <string>
#include <type_traits>

#include "runtime/kernels/cuda/attention/Kernels.cuh"

namespace moec::runtime::cuda::attention {

/// Feature e of query head h at row `row`: part A, then part B.
__device__ __forceinline__ float loadQ(const AttnParams &P, int64_t row, int h, int e) {
  return e < P.dA ? ld(P.qA, row, h, e) : ld(P.qB, row, h, e - P.dA);
}
/// Feature e of key head g at row `row`.
__device__ __forceinline__ float loadK(const AttnParams &P, int64_t row, int g, int e) {
  return e < P.dA ? ld(P.kA, row, g, e) : ld(P.kB, row, g, e - P.dA);
}
/// Writes feature e of a query- or key-shaped gradient (part A or B), if wanted.
__device__ __forceinline__ void storeParts(const OutMat &a, const OutMat &b, int dA, int64_t row,
                                           int head, int e, float value) {
  if (e < dA) {
    if (a.t.p)
      st(a, row, head, e, value);
  } else if (b.t.p)
    st(b, row, head, e - dA, value);
}

/// Calls f(std::integral_constant<int, N>) with N the registers per lane (a
/// power of two) that hold max(d, dv) features spread over a warp's lanes.
template <typename F> void withLanes(const KernelContext &ctx, int d, int dv, F &&f) {
  int need = ((d > dv ? d : dv) + 31) / 32;
  if (need <= 1)
    f(std::integral_constant<int, 1>{});
  else if (need <= 2)
    f(std::integral_constant<int, 2>{});
  else if (need <= 4)
    f(std::integral_constant<int, 4>{});
  else if (need <= 8)
    f(std::integral_constant<int, 8>{});
  else if (need <= 16)
    f(std::integral_constant<int, 16>{});
  else
    ctx.fail("attention head dimensions up to 512 are supported on CUDA, got query/key " +
             std::to_string(d) + " and value " + std::to_string(dv));
}

/// dSinks[h] = Σ_rows part[row, h], in a fixed order (one block per head).
void reduceSinks(const KernelContext &ctx, const float *part, int64_t rows, int heads,
                 FloatOut dSinks);

/// The backward's statistics from the saved result and logsumexp (P.savedO, P.savedLse):
/// D = dO . O, the logsumexp times lseScale, and the sink part -p_sink D (sinkPart not null), for
/// rows t < L of each (sequence, head) at lse[at(b, h, t)], D[...], with at = (b * L + t) * H + h
/// (headMajor false, the general kernels' layout), or (b * H + h) * Lp + t (Flash.cu's; rows
/// [L, Lp) get lse = +inf, D = 0).
void statisticsFromResult(const KernelContext &ctx, const AttnParams &P, float *lse, float *D,
                          float *sinkPart, bool headMajor, int64_t Lp, float lseScale);

} // namespace moec::runtime::cuda::attention

#endif // RUNTIME_KERNELS_CUDA_ATTENTION_CORE_CUH_
