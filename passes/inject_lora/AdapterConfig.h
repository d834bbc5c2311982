//===- AdapterConfig.h - the LoRA settings of a PEFT adapter_config.json -*- C++ -*-===//
//
// Lets `--moe-inject-lora` train exactly the adapter a PEFT config describes. Only the
// fields that shape the adapters are read; a config that asks for something the compiler
// does not build (DoRA, per-module ranks, a subset of layers, ...) is rejected rather than
// silently trained as a different adapter.
//
//===----------------------------------------------------------------------===//

#ifndef PASSES_INJECT_LORA_ADAPTERCONFIG_H_
#define PASSES_INJECT_LORA_ADAPTERCONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

namespace moec::passes {

struct AdapterConfig {
  int64_t rank = 0;
  double alpha = 0;
  double dropout = 0;
  std::vector<std::string> targets; // module names, or the single "all-linear"
  bool rslora = false;              // scale alpha / sqrt(r) instead of alpha / r
};

/// Reads `path`, an adapter_config.json or a directory holding one. Errors name the file
/// and the key: unreadable file, malformed JSON, a missing or mistyped field, or a PEFT
/// feature that is not supported (with what is).
llvm::Expected<AdapterConfig> readAdapterConfig(llvm::StringRef path);

} // namespace moec::passes

#endif // PASSES_INJECT_LORA_ADAPTERCONFIG_H_
