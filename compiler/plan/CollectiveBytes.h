//===- CollectiveBytes.h - what each collective of a program sends ---*- C++ -*-===//
//
// The bytes one rank sends for each collective step of a sharded program, the
// numbers the plan's report and the mesh simulation both print: a ring all-reduce
// sends 2(n-1)/n of its tensor, an all-gather n-1 times its input, a
// reduce-scatter (n-1)/n of its input, a pipeline exchange what it sends, and the
// expert exchange the token rows uniform routing sends to the other ranks, as the layer's
// expert placement (replicas included) spreads them.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_PLAN_COLLECTIVEBYTES_H_
#define COMPILER_PLAN_COLLECTIVEBYTES_H_

#include <cstdint>
#include <vector>

#include "compiler/plan/Program.h"
#include "dialects/moe/MeshShape.h"
#include "llvm/ADT/StringRef.h"

namespace moec::compiler {

/// Ranks in a group over `axes` ("dp+ep") of `mesh`.
int64_t groupSize(const moe::MeshShape &mesh, llvm::StringRef axes);

/// Per step of `program` (compiled for `mesh`), the bytes this rank sends when it runs; 0 for
/// steps that are not collectives.
std::vector<int64_t> collectiveSentBytes(const Program &program, const moe::MeshShape &mesh);

/// Whether the program's expert exchange sends every token to every rank (all_tokens).
bool sendsEveryToken(const Program &program);

} // namespace moec::compiler

#endif // COMPILER_PLAN_COLLECTIVEBYTES_H_
