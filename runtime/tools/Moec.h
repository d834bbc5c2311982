//===- Moec.h - run the compiler from runtime tools -------------*- C++ -*-===//
//
// The runtime never links MLIR; tools that need a plan they were not given
// (moe-run init, moe-align) run `moec compile` as a process.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_TOOLS_MOEC_H_
#define RUNTIME_TOOLS_MOEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moec::runtime {

/// moec: $MOEC, else beside this binary or in Bazel's layout
/// (bazel-bin/<pkg>/x -> bazel-bin/compiler/tools/moec), else the PATH.
std::string findMoec();

/// Runs `moec compile <args>`; on failure the status carries the command and its output.
absl::Status runMoecCompile(const std::vector<std::string> &args);

} // namespace moec::runtime

#endif // RUNTIME_TOOLS_MOEC_H_
