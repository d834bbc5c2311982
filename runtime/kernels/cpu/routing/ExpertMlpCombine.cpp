//===- ExpertMlpCombine.cpp - an expert MLP's and its combine's backward --===//
//
// expert_mlp_combine.backward: the backward of y = combine(expert_mlp(x_rows,
// ...), indices, weights) in one launch (--fused-expert-backward gives a
// layer's expert MLP and combine this one backward, so that the expert
// outputs are not saved for the combine's weight gradient). Inputs: the
// expert MLP's operands (operand_segments: its groups), the combine's indices
// and weights, then d y. Outputs: the gradients grad_of_inputs lists, the
// weights' last (index: the expert operands' count + 1).
//
// The CPU twin is the definition, composed of the three kernels it replaces:
// the expert outputs again (expert_mlp), the combine's backward (d expert
// outputs and d weights = d y . expert output), the expert MLP's backward.
//
//===----------------------------------------------------------------------===//

#include <vector>

#include "runtime/kernels/cpu/routing/Routing.h"

namespace moec::runtime::cpu::routing {

void expertMlpCombineBackward(KernelContext &ctx) {
  checks::routing::ExpertCombineLaunch launch = checks::routing::expertCombineLaunch(ctx);
  const TensorRef &x = ctx.in(0);
  expectF32(ctx, x, "expert rows");
  std::vector<float> outputs(static_cast<size_t>(x.numel())), dOutputs(outputs.size());
  checks::routing::composeExpertCombineBackward(ctx, launch, TensorRef{plan::F32, x.shape, outputs.data()},
                                                TensorRef{plan::F32, x.shape, dOutputs.data()}, expertMlpForward,
                                                combineBackward, expertMlpBackward);
}

} // namespace moec::runtime::cpu::routing
