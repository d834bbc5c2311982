//===- FuseLoRA.h - projection and adapter fusion pass ----------*- C++ -*-===//

#ifndef PASSES_FUSE_LORA_FUSELORA_H_
#define PASSES_FUSE_LORA_FUSELORA_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_FUSELORAPASS
#define GEN_PASS_REGISTRATION
#include "passes/fuse_lora/FuseLoRA.h.inc"

/// Fuses every adapted projection under `root` (the pass's rewrite); returns how many. Memory
/// planning calls it on the layers it rebuilds from a template under a memory cap.
int fuseAdaptedProjections(mlir::Operation *root);

} // namespace moec::passes

#endif // PASSES_FUSE_LORA_FUSELORA_H_
