//===- Report.cpp - what one training step costs --------------------------===//

#include "compiler/plan/Report.h"

#include <cmath>
#include <map>
#include <tuple>

#include "compiler/analysis/ModelSummary.h"
#include "compiler/plan/CollectiveBytes.h"
#include "compiler/plan/OverlapReport.h"
#include "dialects/moe/MeshShape.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;

namespace moec::compiler {

namespace {

std::string gib(int64_t bytes) {
  return llvm::formatv("{0:F2} GiB", static_cast<double>(bytes) / (1ull << 30)).str();
}

std::string tflops(int64_t flops) { return llvm::formatv("{0:F3}", flops / 1e12).str(); }

} // namespace

void printReport(moe::ModelOp model, const Program &program, llvm::raw_ostream &os) {
  using analysis::humanCount;
  using analysis::withCommas;
  int64_t total = 0, trainable = 0;
  for (const ProgramBuffer &buffer : program.buffers) {
    int64_t elements = 1;
    for (int64_t dim : buffer.shape)
      elements *= dim;
    if (buffer.role == plan::WEIGHT)
      total += elements;
    else if (buffer.role == plan::LORA_PARAM)
      trainable += elements;
  }
  total += trainable;
  os << "model: " << model.getSymName();
  if (auto type = model->getAttrOfType<StringAttr>("model_type"))
    os << " (" << type.getValue() << ")";
  os << "\ntokens per step: " << program.tokens() << " (seq-len " << program.seqLen
     << " x micro-batch " << program.microBatch << ")\n";
  os << "parameters: total " << withCommas(total) << " (" << humanCount(total) << "), trainable "
     << withCommas(trainable) << " (" << humanCount(trainable) << ", "
     << llvm::format("%.4f", 100.0 * trainable / std::max<int64_t>(1, total)) << "%)\n";
  if (auto lora = model->getAttrOfType<DictionaryAttr>("lora")) {
    os << "lora:";
    for (NamedAttribute entry : lora) {
      os << " " << entry.getName().getValue() << "=";
      if (auto list = dyn_cast<ArrayAttr>(entry.getValue()))
        os << llvm::join(list.getAsValueRange<StringAttr>(), ",");
      else if (auto f = dyn_cast<FloatAttr>(entry.getValue()))
        os << llvm::format("%g", f.getValueAsDouble());
      else if (auto i = dyn_cast<IntegerAttr>(entry.getValue()))
        os << i.getInt();
      else
        os << entry.getValue();
    }
    os << "\n";
  }
  auto recompute = model->getAttrOfType<StringAttr>("recompute");
  os << "recompute: " << (recompute ? recompute.getValue() : "none");
  auto recomputed = model->getAttrOfType<DenseI64ArrayAttr>("recompute_layers");
  auto regathered = model->getAttrOfType<DenseI64ArrayAttr>("regather_layers");
  if (recomputed)
    os << " (" << recomputed.size() << " layer(s) recomputed";
  if (regathered)
    os << (recomputed ? ", " : " (") << regathered.size()
       << " gather their experts' token copies again in the backward";
  if (recomputed || regathered)
    os << ")";
  os << "\n";
  // How each expert MLP and its combine are differentiated (--fused-expert-backward).
  int64_t fused = 0, separate = 0;
  for (const ProgramStep &step : program.steps) {
    fused += step.kernel == "expert_mlp_combine.backward";
    separate += step.kernel == "combine.backward";
  }
  if (fused || separate)
    os << "expert backward: " << fused << " expert MLP(s) differentiated with their combine (the expert outputs "
       << "not saved), " << separate << " apart\n";
  os << "\n";

  // FLOPs: rows are kernels (a backward under its forward's name), columns phases.
  std::map<std::string, std::array<int64_t, 3>> flops;
  std::array<int64_t, 3> totals = {0, 0, 0};
  for (const ProgramStep &step : program.steps) {
    if (!step.flops)
      continue;
    StringRef kernel = StringRef(step.kernel).split(".backward").first;
    int column = step.phase == plan::FORWARD ? 0 : step.phase == plan::BACKWARD ? 1 : 2;
    flops[kernel.str()][column] += step.flops;
    totals[column] += step.flops;
  }
  os << "FLOPs per step (TFLOP; matrix products and attention):\n";
  os << llvm::format("  %-21s %12s %12s %12s\n", "kernel", "forward", "backward", "recompute");
  for (auto &[kernel, row] : flops)
    os << llvm::format("  %-21s %12s %12s %12s\n", kernel.c_str(), tflops(row[0]).c_str(),
                       tflops(row[1]).c_str(), tflops(row[2]).c_str());
  os << llvm::format("  %-21s %12s %12s %12s\n", "total", tflops(totals[0]).c_str(),
                     tflops(totals[1]).c_str(), tflops(totals[2]).c_str());
  os << "  per step: " << tflops(totals[0] + totals[1] + totals[2]) << " TFLOP\n\n";

  os << "memory per rank (arena sizes):\n";
  for (auto [role, bytes] : program.arenaBytes())
    os << llvm::format("  %-18s %14s  %s\n", plan::roleName(role), gib(bytes).c_str(),
                       withCommas(bytes).c_str());
  if (int64_t scratch = program.scratchBytes())
    os << llvm::format("  %-18s %14s  %s  (largest kernel scratch, outside the arenas)\n", "scratch",
                       gib(scratch).c_str(), withCommas(scratch).c_str());
  os << llvm::format("  %-18s %14s  %s\n", "peak", gib(program.peakBytes()).c_str(),
                     withCommas(program.peakBytes()).c_str());
  int64_t collectives = 0;
  for (const ProgramStep &step : program.steps)
    collectives += !step.collective.empty();
  os << "steps: " << program.steps.size() - collectives << " kernel launches, " << collectives
     << " collectives, " << program.buffers.size() << " buffers\n";
  if (collectives)
    printCollectives(model, program, os);
}

void printCollectives(moe::ModelOp model, const Program &program, llvm::raw_ostream &os) {
  moe::MeshShape mesh;
  std::string error;
  if (auto text = model->getAttrOfType<StringAttr>("mesh"))
    (void)moe::MeshShape::parse(text.str(), mesh, error);
  // Per (collective, axis, phase): how many, and the bytes this rank sends per step.
  struct Row {
    int64_t count = 0, bytes = 0;
  };
  bool allTokens = sendsEveryToken(program);
  std::vector<int64_t> sentBytes = collectiveSentBytes(program, mesh); // per step, for the overlap's replay
  std::map<std::tuple<std::string, std::string, int>, Row> rows;
  for (auto [index, step] : llvm::enumerate(program.steps)) {
    if (step.collective.empty())
      continue;
    Row &row = rows[{step.collective, step.axis, static_cast<int>(step.phase)}];
    ++row.count;
    row.bytes += sentBytes[index];
  }
  os << "\ncollectives per step (mesh " << mesh.str() << "; bytes this rank sends, uniform routing):\n";
  os << llvm::format("  %-16s %-8s %-9s %6s %14s  %s\n", "collective", "axis", "phase", "count", "bytes", "why");
  int64_t total = 0;
  for (auto &[key, row] : rows) {
    auto &[kind, axis, phase] = key;
    const char *why = kind == "all_reduce" && axis == "tp"
                          ? "the partial sums of split heads and expert features (moe.tp_exit) and the sums of "
                            "squares of norms over split heads (moe.tp_sum); in the backward, an input's "
                            "gradient from every tp rank"
                      : kind == "all_reduce"
                          ? "LoRA gradients of a layer, summed over the ranks that train the same tensor on "
                            "other tokens (--moe-sync-gradients)"
                      : kind == "all_gather"
                          ? "sequence parallel: a tp rank's rows gathered where a split region (or a mixer "
                            "kept whole) reads every row; in the backward, a reduce-scatter's gradient"
                      : kind == "reduce_scatter"
                          ? "sequence parallel: the partial sums of a split region, each tp rank keeping its "
                            "rows (moe.tp_exit with rows); in the backward, an input's gradient from every tp rank"
                      : kind == "send_recv"
                          ? "a micro-batch's hidden state to the next pipeline stage; in the backward, its "
                            "gradient to the previous one"
                      : kind == "expert_route"
                          ? (allTokens ? "every token's experts to every rank (ep, --ep-exchange all: fixed sizes)"
                                       : "each token's experts to the ranks that hold them (ep)")
                      : kind == "expert_send"
                          ? (allTokens ? "hidden states and router weights of every token to every rank; in the "
                                         "backward, the gradients of a return"
                                       : "hidden states and router weights to their experts' ranks, once per rank; "
                                         "in the backward, the gradients of a return")
                          : "each rank's partial expert sums back to the tokens' ranks; in the backward, the "
                            "gradients of a send";
    const char *phaseName = phase == plan::FORWARD ? "forward" : phase == plan::BACKWARD ? "backward" : "recompute";
    os << llvm::format("  %-16s %-8s %-9s %6lld %14s  %s\n", kind.c_str(), axis.c_str(), phaseName,
                       static_cast<long long>(row.count), analysis::withCommas(row.bytes).c_str(), why);
    total += row.bytes;
  }
  os << "  total " << analysis::withCommas(total) << " bytes (" << gib(total) << ") per step per rank\n";
  printOverlap(program, sentBytes, os);
  // Where the resharding collectives come from: the sharding decision that inserted each (their
  // backward counterparts included), in the order the step first meets them.
  std::vector<std::string> reasons;
  std::map<std::string, std::map<std::string, int64_t>> kindsOf;
  for (const ProgramStep &step : program.steps) {
    if (step.collective.empty() || step.because.empty())
      continue;
    if (!kindsOf.count(step.because))
      reasons.push_back(step.because);
    ++kindsOf[step.because][step.collective];
  }
  if (reasons.empty())
    return;
  os << "where they come from (--moe-propagate-sharding):\n";
  for (const std::string &reason : reasons) {
    std::string kinds;
    for (const auto &[kind, count] : kindsOf[reason])
      kinds += (kinds.empty() ? "" : ", ") + kind + " x" + std::to_string(count);
    os << "  " << reason << ": " << kinds << "\n";
  }
}

} // namespace moec::compiler
