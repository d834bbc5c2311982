//===- moec.cpp - the MoEC compiler driver ---------------------------------===//
//
//   moec import CONFIG.json [-o model.mlir] [--emit=mlir|summary] [--strict]
//   moec compile CONFIG.json|model.mlir [--lora-rank R --lora-alpha A --lora-targets ...]
//        [--expert-lora] [--rslora] [--adapter DIR]
//        [--seq-len N --micro-batch B] [--no-fuse] [--fuse-lora] [--emit=plan|plan-text|mlir|report] -o OUT
//
// Each command declares its own options (so both can have -o and --emit)
// and parses the arguments after its name. `compile` also takes MLIR's pass
// manager options, e.g. --mlir-print-ir-after-all.
//
//===----------------------------------------------------------------------===//

#include <cstdio>

#include "compiler/analysis/ExpertPlacement.h"
#include "compiler/analysis/ModelSummary.h"
#include "compiler/frontend/ImportModel.h"
#include "compiler/pipelines/Pipelines.h"
#include "compiler/plan/EmitPlan.h"
#include "compiler/plan/MeshReport.h"
#include "compiler/plan/Report.h"
#include "dialects/moe/MeshShape.h"
#include "dialects/moe/MoeOps.h"
#include "runtime/plan/PlanIO.h"
#include "runtime/plan/PlanText.h"
#include "runtime/plan/PlanValidator.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"

#include <map>
#include <set>
#include <string>

using namespace llvm;

namespace {

int fail(const Twine &message) {
  WithColor::error(errs(), "moec") << message << "\n";
  return 1;
}

/// fail() where a bool says whether things went well.
bool refuse(const Twine &message) {
  fail(message);
  return false;
}

/// --expert-placement / --expert-load: the model's `expert_placement` attribute (checked by
/// --moe-propagate-sharding). From a measured load, says how much the busiest ep rank's share
/// of the tokens drops.
bool placeExperts(moec::moe::ModelOp model, int64_t ep, const std::string &placementPath,
                  const std::string &loadPath, int64_t spare) {
  if (!placementPath.empty() && !loadPath.empty())
    return refuse("--expert-placement and --expert-load both place the experts: give one");
  if (ep < 2)
    return refuse("--expert-placement and --expert-load place experts over ep ranks: give --mesh with ep > 1");
  if (spare < 0 || (spare > 0 && loadPath.empty()))
    return refuse("--replicate-experts N (N >= 0 spare experts per rank) goes with --expert-load");
  moec::analysis::ExpertPlacement placement;
  std::string error;
  if (!placementPath.empty() && !moec::analysis::readExpertPlacement(placementPath, ep, placement, error))
    return refuse(error);
  if (!loadPath.empty()) {
    std::map<int64_t, std::vector<int64_t>> load;
    if (!moec::analysis::readExpertLoad(loadPath, load, error))
      return refuse(error);
    double worstBefore = 0, worstAfter = 0;
    for (const auto &[layer, tokens] : load) {
      if (tokens.size() % static_cast<size_t>(ep) != 0)
        return refuse(loadPath + ": layer " + std::to_string(layer) + " has " + std::to_string(tokens.size()) +
                    " experts, which do not split over ep = " + std::to_string(ep));
      int64_t perRank = static_cast<int64_t>(tokens.size()) / ep + spare;
      placement[layer] = moec::analysis::balancedPlacement(tokens, ep, perRank);
      if (placement[layer].empty())
        return refuse(loadPath + ": layer " + std::to_string(layer) + ": cannot spread copies of its " +
                      std::to_string(tokens.size()) + " experts over " + std::to_string(ep) + " ranks of " +
                      std::to_string(perRank) + " (at most one copy of an expert per rank)");
      worstBefore = std::max(worstBefore, moec::analysis::rankImbalance(tokens, {}, ep));
      worstAfter = std::max(worstAfter, moec::analysis::rankImbalance(tokens, placement[layer], ep));
    }
    errs() << formatv("moec: experts placed by the load in {0}: {1} MoE layers{4}; the busiest ep rank's tokens "
                      "over the mean, worst layer: {2:F3} with consecutive experts, {3:F3} placed (over the "
                      "run; a step's can be more: --ep-capacity-factor needs at least that)\n",
                      loadPath, load.size(), worstBefore, worstAfter,
                      spare ? formatv(", {0} spare experts per rank for copies of the busiest", spare).str()
                            : std::string());
  }
  mlir::Builder b(model.getContext());
  SmallVector<mlir::NamedAttribute> entries;
  for (const auto &[layer, experts] : placement)
    entries.push_back(b.getNamedAttr(std::to_string(layer), b.getDenseI64ArrayAttr(experts)));
  model->setAttr("expert_placement", b.getDictionaryAttr(entries));
  return true;
}

/// Imports a config, printing the unused-key warning (an error under --strict).
mlir::OwningOpRef<mlir::ModuleOp> importConfig(StringRef path, mlir::MLIRContext &context,
                                               bool strict, StringRef dtype = "") {
  std::vector<std::string> unused;
  auto module = moec::frontend::importConfigFile(path, context, &unused, dtype);
  if (!module) {
    fail(toString(module.takeError()));
    return nullptr;
  }
  if (!unused.empty()) {
    std::string message = path.str() + ": keys not used by the importer: " + join(unused, ", ");
    if (strict) {
      fail(message + " (--strict)");
      return nullptr;
    }
    WithColor::warning(errs(), "moec") << message << "\n";
  }
  return std::move(*module);
}

/// The names of the options registered so far (the linked LLVM libraries register hundreds of
/// code-generation options before main).
std::set<std::string> registeredOptions() {
  std::set<std::string> names;
  for (auto &entry : cl::getRegisteredOptions())
    names.insert(entry.first.str());
  return names;
}

/// Puts the options registered since `before` (the command's own, and MLIR's when it registered
/// them) in `category` and hides the rest from --help (they still parse; --help-hidden lists
/// them).
void showOnlyOptionsSince(const std::set<std::string> &before, cl::OptionCategory &category) {
  for (auto &entry : cl::getRegisteredOptions())
    if (!before.count(entry.first.str()))
      entry.second->addCategory(category);
  cl::HideUnrelatedOptions(category);
}

moec::moe::ModelOp theModel(mlir::ModuleOp module) {
  auto models = module.getOps<moec::moe::ModelOp>();
  return models.empty() ? moec::moe::ModelOp() : *models.begin();
}

int runImport(int argc, char **argv) {
  const std::set<std::string> linked = registeredOptions();
  cl::opt<std::string> inputPath(cl::Positional, cl::desc("<config.json>"), cl::Required);
  cl::opt<std::string> outputPath("o", cl::desc("Output file (default: stdout)"),
                                  cl::value_desc("file"), cl::init("-"));
  enum class Action { MLIR, Summary };
  cl::opt<Action> emit(
      "emit", cl::desc("What to write"), cl::init(Action::MLIR),
      cl::values(clEnumValN(Action::MLIR, "mlir", "the moe IR (default)"),
                 clEnumValN(Action::Summary, "summary",
                            "parameters per layer type, totals, active parameters, bf16 bytes")));
  cl::opt<bool> summary("summary", cl::desc("Same as --emit=summary"));
  cl::opt<bool> strict("strict", cl::desc("Fail on config keys the importer does not use"));
  cl::OptionCategory importOptions("moec import options");
  showOnlyOptionsSince(linked, importOptions);
  cl::ParseCommandLineOptions(argc, argv, "moec import: a Hugging Face config.json to moe IR\n");

  mlir::MLIRContext context;
  auto module = importConfig(inputPath, context, strict);
  if (!module)
    return 1;
  std::string error;
  auto output = mlir::openOutputFile(outputPath, &error);
  if (!output)
    return fail(error);
  if (summary || emit == Action::Summary)
    moec::analysis::printSummary(moec::analysis::summarizeModel(theModel(*module)), output->os());
  else {
    module->print(output->os());
    output->os() << "\n"; // as moe-opt ends its output
  }
  output->keep();
  return 0;
}

int runCompile(int argc, char **argv) {
  const std::set<std::string> linked = registeredOptions();
  cl::opt<std::string> inputPath(cl::Positional, cl::desc("<config.json | model.mlir>"),
                                 cl::Required);
  cl::opt<std::string> outputPath(
      "o", cl::desc("Output file (default: plan.moeplan for --emit=plan, else stdout)"),
      cl::value_desc("file"));
  enum class Action { Plan, PlanText, MLIR, Report };
  cl::opt<Action> emit(
      "emit", cl::desc("What to write"), cl::init(Action::Plan),
      cl::values(clEnumValN(Action::Plan, "plan", "the executable plan, binary protobuf (default)"),
                 clEnumValN(Action::PlanText, "plan-text", "the plan as text, for people and tests"),
                 clEnumValN(Action::MLIR, "mlir", "the moe IR after the pipeline"),
                 clEnumValN(Action::Report, "report",
                            "parameters, FLOPs per step by kernel and phase, memory per role")));
  cl::list<std::string> loraTargets(
      "lora-targets", cl::CommaSeparated,
      cl::desc("Modules to adapt: q_proj,k_proj,... or all-linear (default: all-linear; "
               "a model.mlir that already has trainable parameters keeps them)"));
  cl::opt<bool> expertLora("expert-lora",
                           cl::desc("Also adapt routed experts' gate/up/down projections (one "
                                    "adapter per expert)"));
  cl::opt<bool> rslora("rslora", cl::desc("Scale updates by alpha/sqrt(r) (rsLoRA)"));
  cl::opt<std::string> adapter(
      "adapter", cl::value_desc("DIR"),
      cl::desc("A PEFT adapter directory (or adapter_config.json): its r, lora_alpha, "
               "lora_dropout, target_modules and use_rslora replace the --lora-* flags"));
  cl::opt<int64_t> loraRank("lora-rank", cl::desc("Adapter rank r"), cl::init(8));
  cl::opt<double> loraAlpha("lora-alpha", cl::desc("Adapter alpha (updates scale by alpha/r)"),
                            cl::init(16.0));
  cl::opt<double> loraDropout("lora-dropout", cl::desc("Adapter input dropout"), cl::init(0.0));
  cl::opt<int64_t> seqLen("seq-len", cl::desc("Tokens per sequence"), cl::init(4096));
  cl::opt<int64_t> microBatch("micro-batch", cl::desc("Sequences per step"), cl::init(1));
  cl::opt<std::string> recompute(
      "recompute",
      cl::desc("none, regather (MoE layers gather their tokens' expert copies again in the "
               "backward instead of saving them) or per-layer"),
      cl::init("none"));
  cl::opt<std::string> memoryCap("memory-cap",
                                 cl::desc("Most bytes per GPU, e.g. 80GiB; layers recompute "
                                          "until the plan fits"));
  cl::opt<std::string> meshText(
      "mesh", cl::value_desc("dp=N,tp=N,pp=N,ep=N"),
      cl::desc("Device mesh: the plan holds one program per rank (dp, tp, pp, ep; --micro-batch "
               "is per rank); --emit=report lists its collectives, and for a mesh with tp or pp "
               "estimates per-GPU memory and communication by simulation (then, up to 64 ranks, "
               "each pipeline stage's planned collectives)"));
  cl::opt<std::string> rankOrder(
      "rank-order", cl::value_desc("AXES"),
      cl::desc("With --mesh: how ranks are numbered, the fastest-varying axis first, e.g. tp,ep (axes left out "
               "follow in the default order tp, ep, dp, pp). Ranks 0-7 share a node of 8 GPUs, so the axes "
               "listed first keep their collectives on NVLink; --emit=report says where another order "
               "communicates faster"));
  cl::opt<int64_t> pipelineMicroBatches(
      "pipeline-micro-batches",
      cl::desc("With pp > 1: micro-batches (of --micro-batch sequences) per step on each pipeline, "
               "run in 1F1B order (0: 2 x pp)"),
      cl::init(0));
  cl::opt<std::string> epExchange(
      "ep-exchange", cl::value_desc("auto|routed|all"),
      cl::desc("With ep > 1: routed sends each token to the ranks holding its experts (sizes "
               "decided on the host), all sends every token to every rank (fixed sizes, no wait), "
               "auto picks all where nearly every token has an expert on every rank"),
      cl::init("auto"));
  cl::opt<double> epCapacityFactor(
      "ep-capacity-factor", cl::value_desc("F"),
      cl::desc("With ep > 1: the routed exchange keeps room for F (>= 1) times the tokens and expert copies "
               "uniform routing sends a rank, instead of room for every token of every rank (ep times more "
               "expert rows); a step whose routing needs more fails, naming the route (0: no bound)"),
      cl::init(0.0));
  cl::opt<int64_t> tokenBlocks(
      "token-blocks", cl::value_desc("N"),
      cl::desc("With ep > 1: run each MoE block's expert exchange on N blocks of its tokens, so that "
               "one block's exchange can overlap another's experts (1: the whole batch at once)"),
      cl::init(1));
  cl::list<std::string> tpReplicate(
      "tp-replicate", cl::CommaSeparated, cl::value_desc("attention,latent-attention,linear-attention,mlp,experts"),
      cl::desc("With tp > 1 in --mesh: keep these regions whole on every tp rank instead of splitting them (with "
               "--sequence-parallel, routed experts kept whole run on each rank's rows: no collective in the MoE "
               "block, whole expert weights on every rank)"));
  cl::opt<bool> sequenceParallel(
      "sequence-parallel",
      cl::desc("With tp > 1 in --mesh: between the split attention and MLP regions each tp rank holds only its "
               "rows of the hidden states (norms, residual adds and routers on T / tp rows; a region gathers "
               "its input's rows and leaves through a reduce-scatter instead of an all-reduce). Default: on "
               "where tp and ep combine and the step's tokens split over tp (without it every tp rank "
               "routes and computes every token); =false never"));
  cl::opt<bool> overlap(
      "overlap",
      cl::desc("On a mesh: issue the expert exchange and the per-layer gradient sums on a second stream, "
               "so that they run while other work computes (--moe-schedule-overlap); with ep > 1 it "
               "implies --token-blocks 2 unless that is given"));
  cl::opt<std::string> expertPlacement(
      "expert-placement", cl::value_desc("FILE"),
      cl::desc("With ep > 1: which experts each ep rank holds, per MoE layer: "
               "{\"layers\": {\"3\": [[experts of rank 0], [rank 1], ...]}} (default: consecutive ranges)"));
  cl::opt<std::string> expertLoad(
      "expert-load", cl::value_desc("METRICS.jsonl"),
      cl::desc("With ep > 1: place the experts so that each ep rank gets about the same tokens, from the "
               "tokens per expert a moe-run measured (its metrics.jsonl)"));
  cl::opt<int64_t> replicateExperts(
      "replicate-experts", cl::value_desc("N"),
      cl::desc("With --expert-load: N more experts on each ep rank than its share, filled with copies of the "
               "experts with the most tokens (a replicated expert's tokens split over its copies)"),
      cl::init(0));
  cl::opt<cl::boolOrDefault> fusedExpertBackward(
      "fused-expert-backward",
      cl::desc("One backward for each expert MLP and the combine of its outputs, which forms the router "
               "weights' gradient: the expert outputs are not saved (less memory, fewer recomputed layers). "
               "Default: where the CUDA kernel has its one-pass form (bf16, gated SiLU, no bias or LoRA); "
               "=false never, =true always (elsewhere its kernels compute the expert outputs again)"));
  cl::opt<bool> noFuse("no-fuse", cl::desc("Keep the LM head and the loss apart (--moe-fuse off: the "
                                           "plan then has the [tokens, vocab] logits)"));
  cl::opt<bool> fuseLora("fuse-lora", cl::desc("Each adapted projection's forward as one launch with its LoRA "
                                               "update (--moe-fuse-lora; off by default until its bf16 "
                                               "alignment on the GPU is settled: docs/alignment.md)"));
  cl::opt<int64_t> fuseChunkTokens("fuse-chunk-tokens",
                                   cl::desc("Rows of logits the fused LM head and loss hold at a time"),
                                   cl::init(1024));
  cl::opt<double> lr("lr", cl::desc("Peak learning rate"), cl::init(1e-4));
  cl::opt<int64_t> warmupSteps("warmup-steps", cl::desc("Linear warmup steps"), cl::init(10));
  cl::opt<int64_t> totalSteps("total-steps", cl::desc("Steps of the cosine schedule"),
                              cl::init(1000));
  cl::opt<std::string> schedule("schedule", cl::desc("Learning-rate schedule: cosine or constant"),
                                cl::init("cosine"));
  cl::opt<double> weightDecay("weight-decay", cl::desc("AdamW decoupled weight decay"), cl::init(0.0));
  cl::opt<double> maxGradNorm("max-grad-norm", cl::desc("Clip the global gradient norm (0 = off)"),
                              cl::init(1.0));
  cl::opt<bool> strict("strict", cl::desc("Fail on config keys the importer does not use"));
  cl::opt<std::string> dtype("dtype",
                             cl::desc("Storage dtype instead of the config's: float32 (the CPU "
                                      "backend's), bfloat16 or float16"));
  mlir::registerPassManagerCLOptions();
  mlir::registerMLIRContextCLOptions();
  mlir::registerAsmPrinterCLOptions();
  cl::OptionCategory compileOptions("moec compile options (and MLIR's, e.g. --mlir-print-ir-after-all)");
  showOnlyOptionsSince(linked, compileOptions);
  cl::ParseCommandLineOptions(argc, argv,
                              "moec compile: a model to a LoRA training plan\n");

  moec::moe::MeshShape mesh;
  if (std::string error; !moec::moe::MeshShape::parse(meshText, mesh, error))
    return fail("--mesh '" + meshText + "': " + error);
  if (std::string error; !rankOrder.empty() && !moec::moe::MeshShape::parseOrder(rankOrder, mesh.order, error))
    return fail("--rank-order '" + rankOrder + "': " + error);
  if (!rankOrder.empty() && mesh.single())
    errs() << "moec: warning: --rank-order has no effect without a --mesh\n";
  if (epExchange != "auto" && epExchange != "routed" && epExchange != "all")
    return fail("--ep-exchange must be auto, routed or all, got '" + epExchange + "'");
  char factorText[32];
  std::snprintf(factorText, sizeof factorText, "%g", epCapacityFactor.getValue());
  if (epCapacityFactor != 0 && (mesh.ep < 2 || !(epCapacityFactor >= 1.0)))
    return fail("--ep-capacity-factor bounds the expert exchange's room: it needs ep > 1 in --mesh and a factor of "
                "at least 1 (0: no bound), got " + std::string(factorText) + " with --mesh '" +
                meshText + "'");
  if (epCapacityFactor != 0 && epExchange == "all")
    return fail("--ep-capacity-factor bounds the routed exchange; --ep-exchange all sends every token to every rank");
  if ((sequenceParallel || !tpReplicate.empty()) && mesh.tp < 2)
    return fail(std::string(sequenceParallel ? "--sequence-parallel" : "--tp-replicate") +
                " works on tensor-parallel regions: it needs tp > 1 in --mesh (got '" + meshText + "')");

  mlir::MLIRContext context;
  context.loadDialect<moec::moe::MoeDialect, mlir::func::FuncDialect>();
  // The passes' warnings and remarks (a region tensor parallel keeps whole, and why) reach the
  // user; MLIR's default handler prints errors only, which go on to it unchanged.
  mlir::ScopedDiagnosticHandler passNotes(&context, [](mlir::Diagnostic &diag) {
    if (diag.getSeverity() == mlir::DiagnosticSeverity::Error)
      return mlir::failure();
    errs() << "moec: " << (diag.getSeverity() == mlir::DiagnosticSeverity::Warning ? "warning: " : "note: ")
           << diag.str() << "\n";
    return mlir::success();
  });
  mlir::OwningOpRef<mlir::ModuleOp> module;
  if (StringRef(inputPath).ends_with(".mlir")) {
    // A model.mlir's tensors have their element types already; --dtype picks them at import.
    if (!dtype.empty())
      return fail("--dtype " + dtype + " applies when importing a config.json; " + inputPath +
                  " keeps the element types it has (moec import, then edit them, or compile the config)");
    module = mlir::parseSourceFile<mlir::ModuleOp>(inputPath, &context);
    if (!module)
      return fail(inputPath + ": not a valid moe IR file (see the diagnostics above)");
  } else {
    module = importConfig(inputPath, context, strict, dtype);
    if (!module)
      return 1;
  }
  moec::moe::ModelOp model = theModel(*module);
  if (!model)
    return fail(inputPath + ": no moe.model in the module");

  if (!expertPlacement.empty() || !expertLoad.empty() || replicateExperts.getNumOccurrences())
    if (!placeExperts(model, mesh.ep, expertPlacement, expertLoad, replicateExperts))
      return 1;

  moec::pipelines::LoRATrainingOptions options;
  // A model.mlir that holds adapters already (an earlier --emit=mlir) gets no default targets;
  // checkpoint weights marked trainable train next to the default adapters.
  bool hasAdapters = false;
  std::string narrowTrained;
  model.walk([&](moec::moe::ParamOp param) {
    hasAdapters |= param.getTrainable() && moec::moe::isAdapterTensorName(param.getTensorName());
    if (param.getTrainable() && !moec::moe::isAdapterTensorName(param.getTensorName()) &&
        !param.getTensorType().getElementType().isF32() && narrowTrained.empty())
      narrowTrained = param.getSymName().str();
  });
  // Adapters are f32 whatever the model's dtype; a weight trained in full keeps its own, with no
  // f32 master copy (as PEFT keeps a module to save).
  if (!narrowTrained.empty())
    errs() << "moec: warning: @" << narrowTrained << " (and any other trainable checkpoint weight not in f32) "
           << "trains in its own dtype with no f32 master copy: AdamW steps below its resolution round away\n";
  if (!loraTargets.empty())
    options.loraTargets = loraTargets;
  else if (!hasAdapters && adapter.empty())
    options.loraTargets = {"all-linear"};
  options.adapterConfig = adapter;
  options.expertLora = expertLora;
  options.rslora = rslora;
  options.loraRank = loraRank;
  options.loraAlpha = loraAlpha;
  options.loraDropout = loraDropout;
  options.recompute = recompute;
  options.expertBackward = fusedExpertBackward == cl::BOU_TRUE    ? "fused"
                           : fusedExpertBackward == cl::BOU_FALSE ? "separate"
                                                                  : "auto";
  options.lr = lr;
  options.warmupSteps = warmupSteps;
  options.totalSteps = totalSteps;
  options.schedule = schedule;
  options.weightDecay = weightDecay;
  options.maxGradNorm = maxGradNorm;
  options.seqLen = seqLen;
  options.microBatch = microBatch;
  options.memoryCap = memoryCap;
  options.pipelineMicroBatches = pipelineMicroBatches;
  options.epExchange = epExchange;
  options.overlap = overlap;
  // The mesh options of a plan for `on` (the command's mesh, or a mesh report's slice of one;
  // the flags were checked against the command's mesh above): --overlap splits the exchange in
  // two token blocks unless --token-blocks says otherwise.
  auto meshOptions = [&](const moec::moe::MeshShape &on, double capacity, bool rows) {
    options.mesh = on.single() ? "" : on.spec();
    options.sequenceParallel = rows && on.tp > 1;
    options.tpReplicate.clear();
    if (on.tp > 1)
      options.tpReplicate = tpReplicate;
    options.epCapacityFactor = on.ep > 1 ? capacity : 0;
    options.tokenBlocks = tokenBlocks.getNumOccurrences() ? tokenBlocks : overlap && on.ep > 1 ? 2 : 1;
  };
  // Experts split over ep are whole on every tp rank: without sequence parallel each tp rank
  // holds every token, so each routes and computes all of them (tp times the expert work, the
  // exchange's bytes and its room). So it is on by default there, where the tokens split.
  bool tpAndEp = mesh.tp > 1 && mesh.ep > 1;
  bool rowsSplit = seqLen * microBatch % std::max<int64_t>(1, mesh.tp) == 0;
  bool sequenceRows = sequenceParallel.getNumOccurrences() ? sequenceParallel.getValue() : tpAndEp && rowsSplit;
  meshOptions(mesh, epCapacityFactor, sequenceRows);
  if (overlap && mesh.single())
    errs() << "moec: warning: --overlap has no effect without a --mesh\n";
  if (tpAndEp && !sequenceRows)
    errs() << "moec: warning: without sequence parallel ("
           << (sequenceParallel.getNumOccurrences() ? std::string("--sequence-parallel=false")
                                                    : "the " + std::to_string(seqLen * microBatch) +
                                                          " tokens of a step do not split over tp = " +
                                                          std::to_string(mesh.tp))
           << ") every tp rank routes every token to the experts (tp = " << mesh.tp
           << " times the expert work, the exchange's bytes and its room)\n";
  if (pipelineMicroBatches.getNumOccurrences() && mesh.pp == 1)
    errs() << "moec: warning: --pipeline-micro-batches has no effect without pp > 1 in --mesh\n";
  options.fuse = !noFuse;
  options.fuseLora = fuseLora;
  options.fuseChunkTokens = fuseChunkTokens;
  // A report on a mesh with only dp and ep is the plan's own, its collectives included; with
  // tp or pp it follows the single-rank report with the mesh's estimate (the passes plan the
  // mesh without pp; the stages are simulated: it scales to any mesh), and, for a mesh small
  // enough to plan here, the collectives of each pipeline stage's plan.
  bool meshReport = emit == Action::Report && !mesh.single() && (mesh.tp > 1 || mesh.pp > 1);
  constexpr int64_t kPlannedReportRanks = 64;
  mlir::OwningOpRef<mlir::ModuleOp> planned, source;
  if (meshReport && mesh.size() <= kPlannedReportRanks)
    planned = module->clone();
  if (meshReport)
    source = module->clone();
  mlir::PassManager pm(&context);
  if (failed(mlir::applyPassManagerCLOptions(pm)))
    return fail("bad pass manager options");
  // A mesh report starts with the single-rank program (the slice and the stages' plans below
  // take the mesh), without the memory cap, which caps a rank of the planned mesh, not this
  // program or the slice (the estimate says whether the mesh fits).
  if (meshReport) {
    meshOptions(moec::moe::MeshShape{}, 0, false);
    options.memoryCap = "";
  }
  moec::pipelines::buildLoRATrainingPipeline(pm, options);
  if (failed(pm.run(*module)))
    return fail("compiling " + inputPath + " failed (see the diagnostics above)");

  bool binary = emit == Action::Plan;
  std::string path = outputPath.empty() ? std::string(binary ? "plan.moeplan" : "-") : outputPath.getValue();
  if (emit == Action::MLIR) {
    std::string error;
    auto output = mlir::openOutputFile(path, &error);
    if (!output)
      return fail(error);
    module->print(output->os());
    output->os() << "\n"; // as moe-opt ends its output
    output->keep();
    return 0;
  }
  mlir::FailureOr<std::vector<moec::compiler::Program>> programs =
      moec::compiler::buildStagePrograms(model, seqLen, microBatch);
  if (failed(programs))
    return fail("cannot flatten the training step of " + inputPath);
  const moec::compiler::Program *program = &programs->front();
  mlir::FailureOr<moec::plan::Plan> plan = moec::compiler::emitPlan(model, *programs);
  if (failed(plan))
    return fail("cannot emit the plan of " + inputPath);
  // The compiler checks its own output with the runtime's validator.
  if (absl::Status valid = moec::plan::validatePlan(*plan); !valid.ok())
    return fail("internal error: the emitted plan is invalid: " + std::string(valid.message()));
  if (binary) {
    if (absl::Status saved = moec::plan::savePlan(*plan, path); !saved.ok())
      return fail(std::string(saved.message()));
    errs() << "moec: wrote " << path << " (" << plan->ranks(0).steps_size() << " steps, "
           << plan->ranks(0).buffers_size() << " buffers";
    if (plan->ranks_size() > 1)
      errs() << " per rank, " << plan->ranks_size() << " ranks";
    errs() << ")\n";
    return 0;
  }
  std::string error;
  auto output = mlir::openOutputFile(path, &error);
  if (!output)
    return fail(error);
  if (emit == Action::PlanText)
    output->os() << moec::plan::planToText(*plan);
  else
    moec::compiler::printReport(model, *program, output->os());
  if (meshReport) {
    // The mesh without pp (the slice), planned as the plan would be, each in a module of its
    // own; the report's suggestions plan other meshes the same way.
    std::vector<mlir::OwningOpRef<mlir::ModuleOp>> sliceModules;
    auto planSlice = [&](const moec::compiler::SliceChoice &choice) -> mlir::FailureOr<moec::compiler::Program> {
      moec::moe::MeshShape slice = choice.mesh;
      slice.pp = 1;
      meshOptions(slice, choice.epCapacityFactor, choice.sequenceParallel);
      options.recompute = choice.recomputeLayers ? "per-layer" : recompute.getValue();
      sliceModules.push_back(source->clone());
      // A placement is for the command's ep: another ep places experts consecutively.
      if (slice.ep != mesh.ep)
        theModel(*sliceModules.back())->removeAttr("expert_placement");
      mlir::PassManager slicePm(&context);
      moec::pipelines::buildLoRATrainingPipeline(slicePm, options);
      if (failed(slicePm.run(*sliceModules.back())))
        return mlir::failure();
      mlir::FailureOr<std::vector<moec::compiler::Program>> programs =
          moec::compiler::buildStagePrograms(theModel(*sliceModules.back()), seqLen, microBatch);
      if (failed(programs))
        return mlir::failure();
      return std::move(programs->front());
    };
    mlir::FailureOr<moec::compiler::Program> slice = planSlice({mesh, epCapacityFactor, sequenceRows});
    if (failed(slice))
      return fail("planning " + inputPath + " on --mesh " + mesh.str() +
                  " without pp, for the report, failed (see the diagnostics above)");
    output->os() << "\n";
    moec::compiler::MeshOptions estimate;
    if (mesh.pp > 1)
      estimate.microBatches = pipelineMicroBatches; // the plan's, when given
    estimate.epCapacityFactor = epCapacityFactor;
    moec::compiler::printMeshReport(model, *slice, mesh, estimate, planSlice, output->os());
  }
  if (planned) {
    meshOptions(mesh, epCapacityFactor, sequenceRows);
    options.recompute = recompute; // a suggestion's slice may have planned another
    options.memoryCap = memoryCap;
    mlir::PassManager meshPm(&context);
    moec::pipelines::buildLoRATrainingPipeline(meshPm, options);
    moec::moe::ModelOp meshModel = theModel(*planned);
    if (failed(meshPm.run(*planned)))
      return fail("planning " + inputPath + " on --mesh " + mesh.str() + " failed (see the diagnostics above)");
    mlir::FailureOr<std::vector<moec::compiler::Program>> stages =
        moec::compiler::buildStagePrograms(meshModel, seqLen, microBatch);
    if (failed(stages))
      return fail("cannot flatten the training step of " + inputPath + " on --mesh " + mesh.str());
    for (auto [s, stage] : llvm::enumerate(*stages)) {
      output->os() << "\nthe plan's own collectives, pipeline stage " << s << " of " << stages->size() << ":";
      moec::compiler::printCollectives(meshModel, stage, output->os());
    }
  }
  output->keep();
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  StringRef command = argc > 1 ? argv[1] : "";
  // The command's own parser sees "moec <command>" as its program name.
  std::string name = std::string(argv[0]) + " " + command.str();
  argv[1] = name.data();
  if (command == "import")
    return runImport(argc - 1, argv + 1);
  if (command == "compile")
    return runCompile(argc - 1, argv + 1);
  errs() << "usage: moec <command> [options]\n"
            "  import   CONFIG.json                 a Hugging Face config.json to moe IR\n"
            "  compile  CONFIG.json|model.mlir      a model to a LoRA training plan\n"
            "run 'moec <command> --help' for its options\n";
  if (command.empty() || command == "--help" || command == "-h" || command == "help")
    return command.empty() ? 1 : 0;
  return fail("unknown command '" + command + "'");
}
