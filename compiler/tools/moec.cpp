//===- moec.cpp - the MoEC compiler driver ---------------------------------===//
//
//   moec import CONFIG.json [-o model.mlir] [--summary] [--strict]
//
// Built like mlir/examples/toy's driver: cl::opt options and an `--emit=`
// action per subcommand. `compile` arrives with the training compiler.
//
//===----------------------------------------------------------------------===//

#include "compiler/analysis/ModelSummary.h"
#include "compiler/frontend/ImportModel.h"
#include "dialects/moe/MoeOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/FileUtilities.h"

using namespace llvm;

namespace {

cl::SubCommand importCommand("import", "Import a Hugging Face config.json into moe IR");

cl::opt<std::string> inputPath(cl::Positional, cl::desc("<config.json>"), cl::Required,
                               cl::sub(importCommand));
cl::opt<std::string> outputPath("o", cl::desc("Output file (default: stdout)"),
                                cl::value_desc("file"), cl::init("-"), cl::sub(importCommand));

enum class Action { MLIR, Summary };
cl::opt<Action> emitAction(
    "emit", cl::desc("What to write"), cl::init(Action::MLIR),
    cl::values(clEnumValN(Action::MLIR, "mlir", "the moe IR (default)"),
               clEnumValN(Action::Summary, "summary",
                          "parameters per layer type, totals, active parameters, bf16 bytes")),
    cl::sub(importCommand));
cl::opt<bool> summaryFlag("summary", cl::desc("Same as --emit=summary"), cl::sub(importCommand));
cl::opt<bool> strict("strict", cl::desc("Fail on config keys the importer does not use"),
                     cl::sub(importCommand));

int fail(const Twine &message) {
  WithColor::error(errs(), "moec") << message << "\n";
  return 1;
}

int runImport() {
  mlir::MLIRContext context;
  std::vector<std::string> unused;
  auto module = moec::frontend::importConfigFile(inputPath, context, &unused);
  if (!module)
    return fail(toString(module.takeError()));
  if (!unused.empty()) {
    std::string message = inputPath + ": keys not used by the importer: " + join(unused, ", ");
    if (strict)
      return fail(message + " (--strict)");
    WithColor::warning(errs(), "moec") << message << "\n";
  }
  std::string error;
  auto output = mlir::openOutputFile(outputPath, &error);
  if (!output)
    return fail(error);
  if (summaryFlag || emitAction == Action::Summary) {
    auto model = *(*module)->getOps<moec::moe::ModelOp>().begin();
    moec::analysis::printSummary(moec::analysis::summarizeModel(model), output->os());
  } else {
    (*module)->print(output->os());
    output->os() << "\n";
  }
  output->keep();
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(argc, argv, "MoEC: compile MoE models for LoRA fine-tuning\n");
  if (importCommand)
    return runImport();
  return fail("expected a subcommand: import (see moec --help)");
}
