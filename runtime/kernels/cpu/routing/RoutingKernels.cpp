//===- RoutingKernels.cpp - registration and shared helpers ---------------===//

#include <algorithm>
#include <string>

#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/routing/Routing.h"

namespace moec::runtime::cpu {

void registerRoutingKernels(KernelRegistry &registry) {
  registry.add("router", routing::routerForward);
  registry.add("router.backward", routing::routerBackward);
  registry.add("dispatch", routing::dispatchForward);
  registry.add("dispatch.backward", routing::dispatchBackward);
  registry.add("expert_mlp", routing::expertMlpForward);
  registry.add("expert_mlp.backward", routing::expertMlpBackward);
  registry.add("combine", routing::combineForward);
  registry.add("combine.backward", routing::combineBackward);
  registry.add("expert_mlp_combine.backward", routing::expertMlpCombineBackward);
}

namespace routing {

std::vector<float *> gradOutputs(const KernelContext &ctx, int64_t numOperands,
                                 const std::vector<std::pair<int64_t, const char *>> &noGrad) {
  std::vector<const TensorRef *> outs =
      checks::routing::gradOutputs(ctx, numOperands, noGrad, expectF32);
  for (const TensorRef &out : ctx.outputs)
    std::fill_n(out.f32(), out.numel(), 0.0f);
  std::vector<float *> grads(numOperands, nullptr);
  for (int64_t i = 0; i < numOperands; ++i)
    if (outs[i])
      grads[i] = outs[i]->f32();
  return grads;
}

void expectF32(const KernelContext &ctx, const TensorRef &t, const char *what) {
  if (t.dtype != plan::F32)
    ctx.fail(std::string(what) + " must be f32 (the CPU kernels compute in f32)");
}

std::vector<int64_t> expertMajorRows(const KernelContext &ctx, const TensorRef &indices,
                                     int64_t numExperts, std::vector<int64_t> *counts) {
  if (indices.rank() != 2)
    ctx.fail("indices must be [tokens, top_k], got rank " + std::to_string(indices.rank()));
  expectIndices(ctx, indices);
  int64_t copies = indices.numel();
  std::vector<int64_t> offset(numExperts + 1, 0);
  for (int64_t c = 0; c < copies; ++c) {
    int64_t e = indices.index(c);
    if (e >= numExperts)
      ctx.fail("expert index " + std::to_string(e) + " of token " +
               std::to_string(c / indices.dim(1)) + " is outside [0, " +
               std::to_string(numExperts) + ")");
    if (e >= 0) // negative: an expert on another rank, no copy here
      ++offset[e + 1];
  }
  if (counts)
    counts->assign(offset.begin() + 1, offset.end());
  for (int64_t e = 0; e < numExperts; ++e)
    offset[e + 1] += offset[e];
  std::vector<int64_t> rows(copies);
  for (int64_t c = 0; c < copies; ++c)
    rows[c] = indices.index(c) < 0 ? -1 : offset[indices.index(c)]++;
  return rows;
}

} // namespace routing
} // namespace moec::runtime::cpu
