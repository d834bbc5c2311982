//===- Random.cpp - fill_random on the CPU --------------------------------===//

#include "runtime/kernels/RandomFill.h"
#include "runtime/kernels/cpu/core/CoreCommon.h"

namespace moec::runtime::cpu::core {

namespace {

int kindOf(const KernelContext &ctx) {
  std::string kind = ctx.attrString("kind");
  if (kind == "normal")
    return random::Normal;
  if (kind == "zeros")
    return random::Zeros;
  if (kind == "ones")
    return random::Ones;
  if (kind == "a_log")
    return random::ALog;
  if (kind == "dt_bias")
    return random::DtBias;
  ctx.fail("unknown kind '" + kind + "' (expected normal, zeros, ones, a_log, dt_bias)");
}

void fillRandom(KernelContext &ctx) {
  const TensorRef &out = ctx.out(0);
  float *data = floats(ctx, out, "output");
  int kind = kindOf(ctx);
  double stddev = ctx.attrFloat("std", 0.02);
  uint64_t stream = static_cast<uint64_t>(ctx.attrInt("stream"));
  uint64_t first = static_cast<uint64_t>(ctx.attrInt("first_index", 0));
  int64_t whole = ctx.attrInt("whole_columns", 0), from = ctx.attrInt("first_column", 0);
  int64_t columns = ctx.attrInt("columns", out.rank() > 0 ? out.dim(-1) : 1);
  ctx.parallelFor(out.numel(), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      data[i] = random::value(kind, stddev, stream, random::wholeIndex(first, i, columns, whole, from));
  });
}

} // namespace

void registerRandomKernels(KernelRegistry &registry) { registry.add("fill_random", fillRandom); }

} // namespace moec::runtime::cpu::core
