//===- CollectiveBytes.cpp - what each collective of a program sends ------===//

#include "compiler/plan/CollectiveBytes.h"

#include <algorithm>
#include <cmath>
#include <map>

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
  // the route's otherRanksPerToken (uniform routing; every other rank: all_tokens). Per route,
  // by its layout buffer (its sends and returns read it).
  std::map<int, double> ranksPerTokenOf;
  for (const ProgramStep &step : program.steps)
    if (step.collective == "expert_route" && step.outputs.size() > 1)
      ranksPerTokenOf[step.outputs[1]] = program.buffers[step.outputs[0]].otherRanksPerToken;
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
      auto known = ranksPerTokenOf.find(layout);
      double ranks = known == ranksPerTokenOf.end() ? double(n - 1) : known->second;
      bytes = static_cast<int64_t>(std::llround(tokenSide * ranks));
    }
    sent[index] = bytes;
  }
  return sent;
}

} // namespace moec::compiler
