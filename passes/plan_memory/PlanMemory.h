//===- PlanMemory.h - memory planning pass ----------------------*- C++ -*-===//

#ifndef PASSES_PLAN_MEMORY_PLANMEMORY_H_
#define PASSES_PLAN_MEMORY_PLANMEMORY_H_

#include <cstdint>
#include <optional>

#include "dialects/moe/MoeOps.h"
#include "llvm/ADT/StringRef.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_PLANMEMORYPASS
#define GEN_PASS_REGISTRATION
#include "passes/plan_memory/PlanMemory.h.inc"

/// Bytes from "80GiB", "141GB", "1.5TiB" or "1000000"; nullopt when malformed.
std::optional<int64_t> parseBytes(llvm::StringRef text);

} // namespace moec::passes

#endif // PASSES_PLAN_MEMORY_PLANMEMORY_H_
