//===- CollectiveBytes.cpp - what each collective of a program sends ------===//

#include "compiler/plan/CollectiveBytes.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "compiler/analysis/ModelSummary.h"
#include "llvm/ADT/SmallVector.h"
#include "mlir/IR/BuiltinAttributes.h"

namespace moec::compiler {

int64_t groupSize(const moe::MeshShape &mesh, llvm::StringRef axes) {
  int64_t n = 1;
  llvm::SmallVector<llvm::StringRef> parts;
  axes.split(parts, '+');
  for (llvm::StringRef axis : parts)
    n *= mesh.axisSize(axis.str());
  return n;
}

bool sendsEveryToken(const Program &program) {
  for (const ProgramStep &step : program.steps)
    if (step.collective == "expert_route" && step.attrs && step.attrs.get("all_tokens"))
      return true;
  return false;
}

std::vector<int64_t> collectiveSentBytes(const Program &program, const moe::MeshShape &mesh) {
  // The expert exchange sends a token's row to each other rank that holds one of its experts:
  // tokenShareOfRank of them under uniform routing, or all of them (all_tokens). Per route,
  // by its layout buffer (its sends and returns read it).
  std::map<int, double> shareOf;
  for (const ProgramStep &step : program.steps)
    if (step.collective == "expert_route" && step.outputs.size() > 1) {
      double share = 1.0;
      if (auto experts = step.attrs ? step.attrs.getAs<mlir::IntegerAttr>("num_experts") : nullptr;
          experts && !step.attrs.get("all_tokens"))
        share = analysis::tokenShareOfRank(experts.getInt(), program.buffers[step.inputs[0]].shape.at(1),
                                           groupSize(mesh, step.axis));
      shareOf[step.outputs[1]] = share;
    }
  std::vector<int64_t> sent(program.steps.size(), 0);
  for (auto [index, step] : llvm::enumerate(program.steps)) {
    if (step.collective.empty())
      continue;
    int64_t n = groupSize(mesh, step.axis), bytes = 0;
    for (int id : step.inputs)
      bytes += program.buffers[id].bytes;
    if (step.collective == "all_reduce") {
      bytes = bytes * 2 * (n - 1) / std::max<int64_t>(n, 1);
    } else if (step.collective == "all_gather") { // passes this rank's rows on n - 1 times
      bytes = bytes * (n - 1);
    } else if (step.collective == "reduce_scatter") { // (n - 1) / n of the whole input
      bytes = bytes * (n - 1) / std::max<int64_t>(n, 1);
    } else if (step.collective != "send_recv") {
      // The token-side rows: what a route or send reads; a return's in its messages' dtype (its
      // input: room for the received tokens, f32 partial sums on a bf16 model, per token a
      // row from each of n ranks at most).
      double tokenSide = step.collective == "expert_return"
                             ? double(program.buffers[step.inputs[0]].bytes) /
                                   double(program.buffers[step.inputs[0]].shape.at(0)) *
                                   double(program.buffers[step.outputs[0]].shape.at(0))
                             : double(program.buffers[step.inputs[0]].bytes);
      int layout = step.collective == "expert_route" ? step.outputs.back() : step.inputs.back();
      auto known = shareOf.find(layout);
      double share = known == shareOf.end() ? 1.0 : known->second;
      bytes = static_cast<int64_t>(std::llround(tokenSide * share * double(n - 1)));
    }
    sent[index] = bytes;
  }
  return sent;
}

} // namespace moec::compiler
