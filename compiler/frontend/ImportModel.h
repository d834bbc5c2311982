//===- ImportModel.h - build moe IR from a model's features -----*- C++ -*-===//

#ifndef COMPILER_FRONTEND_IMPORTMODEL_H_
#define COMPILER_FRONTEND_IMPORTMODEL_H_

#include "compiler/frontend/ModelSpec.h"
#include "llvm/Support/Error.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace moec::frontend {

/// Builds a module holding one `moe.model`: one `moe.layer` template per
/// distinct layer structure, applied once per layer by `func.func @forward`.
/// The IR is verified; a failure means the spec was inconsistent.
llvm::Expected<mlir::OwningOpRef<mlir::ModuleOp>> importModel(const ModelSpec &spec,
                                                             mlir::MLIRContext &context);

/// Reads `configPath` and imports it. `unusedKeys` receives the keys the
/// importer did not use (the caller warns, or fails under --strict). A
/// non-empty `dtype` ("float32", "bfloat16", "float16") replaces the config's.
llvm::Expected<mlir::OwningOpRef<mlir::ModuleOp>>
importConfigFile(llvm::StringRef configPath, mlir::MLIRContext &context,
                 std::vector<std::string> *unusedKeys = nullptr, llvm::StringRef dtype = "");

} // namespace moec::frontend

#endif // COMPILER_FRONTEND_IMPORTMODEL_H_
