//===- Fuse.h - fusion pass -------------------------------------*- C++ -*-===//

#ifndef PASSES_FUSE_FUSE_H_
#define PASSES_FUSE_FUSE_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_FUSEPASS
#define GEN_PASS_REGISTRATION
#include "passes/fuse/Fuse.h.inc"

} // namespace moec::passes

#endif // PASSES_FUSE_FUSE_H_
