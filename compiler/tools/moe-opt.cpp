//===- moe-opt.cpp - mlir-opt with the moe dialect ------------------------===//
//
// Registries plus MlirOptMain, nothing else: passes come from passes/Passes.h,
// named pipelines from compiler/pipelines/Pipelines.h.
//
//===----------------------------------------------------------------------===//

#include "compiler/pipelines/Pipelines.h"
#include "dialects/moe/MoeDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "passes/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<moec::moe::MoeDialect, mlir::func::FuncDialect>();
  moec::passes::registerAllPasses();
  moec::pipelines::registerPipelines();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "MoEC optimizer driver\n", registry));
}
