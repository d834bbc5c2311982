//===- InjectLoRA.h - LoRA injection pass -----------------------*- C++ -*-===//

#ifndef PASSES_INJECT_LORA_INJECTLORA_H_
#define PASSES_INJECT_LORA_INJECTLORA_H_

#include "dialects/moe/MoeOps.h"
#include "mlir/Pass/Pass.h"

namespace moec::passes {

#define GEN_PASS_DECL_INJECTLORAPASS
#define GEN_PASS_REGISTRATION
#include "passes/inject_lora/InjectLoRA.h.inc"

} // namespace moec::passes

#endif // PASSES_INJECT_LORA_INJECTLORA_H_
