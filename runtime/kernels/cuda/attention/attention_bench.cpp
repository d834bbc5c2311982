//===- attention_bench.cpp - causal attention and mla on model shapes ------===//
//
// Times (CUDA events, median of --iters after --warmup runs) the CUDA
// `attention` / `attention.backward` and `mla` / `mla.backward` kernels as
// the executor launches them (through the registry: output zeroing and
// scratch included) on bf16 tensors, one sequence, causal. Shapes (--shape,
// default all three):
//   qwen3-30b:  4096 tokens, 32 query heads, 4 KV heads, head dim 128;
//   qwen3-next: 4096 tokens, 16 query heads, 2 KV heads, head dim 256;
//   mla:        4096 tokens, 128 heads, DeepSeek-V3 / Kimi K2 mla: nope 128,
//               rope 64 (interleaved RoPE), value 128;
// or one attention shape from --tokens/--heads/--kv-heads/--dim/--value-dim.
// Prints ms and TFLOP/s with causal FLOPs (forward 2·T²·H·(d_qk + d_v) / 2,
// backward 2.5x that), the backward also with only dQ and only dK, dV asked
// for (these three run the statistics pass), attention's also as a training
// step runs it (forward with its logsumexp, backward from the saved result
// and logsumexp, also in one pass: MOEC_ATTENTION_SINGLE_PASS=1), then the
// tuning choices of Flash.cu (tile shapes of the query-tile kernels, heads
// per dK/dV block). First it checks the fast path at full
// size: the relative L2 difference of each output from the general kernels
// (MOEC_ATTENTION_GENERAL=1) on the same inputs, and whether two backward
// runs give the same bits (not with MOEC_ATTENTION_SINGLE_PASS=1).
// --general also times the general kernels.
//
//   bazel build //runtime/kernels/cuda/attention:attention_bench
//   bazel-bin/runtime/kernels/cuda/attention/attention_bench [--shape qwen3-30b|qwen3-next|mla]
//       [--tokens N] [--heads H] [--kv-heads KV] [--dim D] [--value-dim DV] [--window W]
//       [--sinks] [--iters N] [--warmup N] [--general]
//
//===----------------------------------------------------------------------===//

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/testing/CudaBench.h"

namespace {

using moec::runtime::KernelContext;
using moec::runtime::KernelError;
using moec::runtime::KernelFn;
using moec::runtime::KernelRegistry;
using moec::runtime::TensorRef;
namespace plan = moec::plan;
using Attrs = google::protobuf::Map<std::string, plan::Attr>;
using moec::runtime::bench::check;
using moec::runtime::bench::fromBf16;
using moec::runtime::bench::medianMs;
using moec::runtime::bench::toBf16;

/// A bf16 device tensor [rows, cols], uniform in [-scale, scale) (or zero).
TensorRef bf16Tensor(int64_t rows, int64_t cols, uint64_t seed, float scale) {
  TensorRef t;
  t.dtype = plan::BF16;
  t.shape = {rows, cols};
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<uint16_t> host(n, 0);
  if (scale > 0) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-scale, scale);
    for (uint16_t &h : host)
      h = toBf16(u(rng));
  }
  check(cudaMalloc(&t.data, n * 2), "cudaMalloc");
  check(cudaMemcpy(t.data, host.data(), n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  return t;
}

/// Positions 0, 1, ... as an i64 device tensor [n].
/// An f32 [rows, cols] device buffer (uninitialised: a kernel output).
TensorRef f32Output(int64_t rows, int64_t cols) {
  TensorRef t;
  t.dtype = plan::F32;
  t.shape = {rows, cols};
  check(cudaMalloc(&t.data, static_cast<size_t>(rows * cols) * 4), "cudaMalloc");
  return t;
}

TensorRef positionTensor(int64_t n) {
  TensorRef t;
  t.dtype = plan::I64;
  t.shape = {n};
  std::vector<int64_t> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    host[static_cast<size_t>(i)] = i;
  check(cudaMalloc(&t.data, host.size() * 8), "cudaMalloc");
  check(cudaMemcpy(t.data, host.data(), host.size() * 8, cudaMemcpyHostToDevice), "cudaMemcpy");
  return t;
}

std::vector<float> download(const TensorRef &t) {
  std::vector<uint16_t> host(static_cast<size_t>(t.numel()));
  check(cudaMemcpy(host.data(), t.data, host.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::vector<float> out(host.size());
  for (size_t i = 0; i < host.size(); ++i)
    out[i] = fromBf16(host[i]);
  return out;
}

/// ||a - b|| / ||b||, or infinity when a has a non-finite value.
double relativeDiff(const std::vector<float> &a, const std::vector<float> &b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]))
      return INFINITY;
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

void setInt(Attrs &attrs, const char *name, int64_t v) { attrs[name].set_i(v); }
void setInts(Attrs &attrs, const char *name, const std::vector<int64_t> &values) {
  plan::Attr &a = attrs[name];
  a.mutable_ints()->clear_values();
  for (int64_t v : values)
    a.mutable_ints()->add_values(v);
}

void setGeneral(bool on) {
  if (on)
    setenv("MOEC_ATTENTION_GENERAL", "1", 1);
  else
    unsetenv("MOEC_ATTENTION_GENERAL");
}

struct Options {
  int iters = 20, warmup = 3;
  bool general = false;
};

/// One kernel family on one shape: its launches (forward; backward with every
/// gradient, with the query's only and with the keys' / values' only), built
/// by the caller, then checked and timed here.
struct Bench {
  const char *kernel; // "attention" or "mla"
  std::vector<TensorRef> inputs, gradOutputs[3];
  TensorRef out, dO;
  Attrs attrs, backAttrs[3];
  std::vector<int64_t> wrt[3]; // every gradient, the query's, the keys' and values'
  std::vector<const char *> gradNames;
  int64_t tokens = 0, group = 1; // group: query heads per kv head (for the heads/block sweep)
  double fwdFlops = 0;
};

void run(const KernelFn *fn, KernelContext &ctx) {
  try {
    (*fn)(ctx);
  } catch (const KernelError &e) {
    std::fprintf(stderr, "launch refused: %s\n", e.what());
    std::exit(1);
  }
}

void runBench(Bench &b, const Options &o, cudaStream_t stream) {
  KernelRegistry registry;
  moec::runtime::cuda::registerAttentionKernels(registry);
  const std::string name = b.kernel;
  const KernelFn *forward = registry.find(name), *backward = registry.find(name + ".backward");
  auto context = [&](const std::string &kernel, const Attrs &a) {
    KernelContext ctx;
    ctx.kernel = kernel;
    ctx.attrs = &a;
    ctx.seqLen = b.tokens;
    ctx.microBatch = 1;
    ctx.stream = stream;
    ctx.inputs = b.inputs;
    return ctx;
  };
  KernelContext fwd = context(name, b.attrs);
  fwd.outputs = {b.out};
  KernelContext bwd[3];
  for (int i = 0; i < 3; ++i) {
    setInts(b.backAttrs[i], "grad_of_inputs", b.wrt[i]);
    bwd[i] = context(name + ".backward", b.backAttrs[i]);
    bwd[i].inputs.push_back(b.dO);
    bwd[i].outputs = b.gradOutputs[i];
  }
  const double bwdFlops = 2.5 * b.fwdFlops;
  auto report = [&](const std::string &what, double ms, double flops) {
    if (flops > 0)
      std::printf("  %-40s %9.3f ms  %7.1f TFLOP/s\n", what.c_str(), ms, flops / (ms * 1e-3) / 1e12);
    else
      std::printf("  %-40s %9.3f ms\n", what.c_str(), ms);
  };

  // Correctness at full size: the fast path against the general kernels.
  std::vector<TensorRef> checked = {b.out};
  for (const TensorRef &t : b.gradOutputs[0])
    checked.push_back(t);
  setGeneral(true);
  run(forward, fwd);
  run(backward, bwd[0]);
  check(cudaStreamSynchronize(stream), "general run");
  std::vector<std::vector<float>> ref;
  for (const TensorRef &t : checked)
    ref.push_back(download(t));
  setGeneral(false);
  run(forward, fwd);
  run(backward, bwd[0]);
  check(cudaStreamSynchronize(stream), "fast run");
  std::printf("fast path vs general kernels (relative L2): out %.2e",
              relativeDiff(download(b.out), ref[0]));
  for (size_t i = 1; i < checked.size(); ++i)
    std::printf(" %s %.2e", b.gradNames[i - 1], relativeDiff(download(checked[i]), ref[i]));
  std::printf("\n");
  // Whether a second backward gives the same bits (not with MOEC_ATTENTION_SINGLE_PASS=1, whose
  // dQ is added up by atomics).
  std::vector<std::vector<float>> first;
  for (const TensorRef &t : b.gradOutputs[0])
    first.push_back(download(t));
  run(backward, bwd[0]);
  check(cudaStreamSynchronize(stream), "fast run");
  bool same = true;
  for (size_t i = 0; i < first.size(); ++i)
    same &= download(b.gradOutputs[0][i]) == first[i];
  std::printf("backward run twice: %s\n", same ? "bitwise identical" : "DIFFERENT (not deterministic)");

  std::printf("fast path (bf16 tensor cores), median of %d after %d warm-up:\n", o.iters, o.warmup);
  auto time = [&](KernelContext &ctx, bool isForward) {
    return medianMs(stream, o.warmup, o.iters, [&] { run(isForward ? forward : backward, ctx); });
  };
  report("forward", time(fwd, true), b.fwdFlops);
  report("backward (every gradient)", time(bwd[0], false), bwdFlops);
  report("backward (dq only)", time(bwd[1], false), 0.0);
  report("backward (dk, dv only)", time(bwd[2], false), 0.0);
  if (name == "attention") {
    // As a training step runs it: the forward also writes its logsumexp, and the backward takes
    // its statistics from the saved result and logsumexp (no statistics pass).
    Attrs savedAttrs = b.backAttrs[0];
    const int64_t operands = static_cast<int64_t>(b.inputs.size()), heads = b.attrs.at("num_heads").i();
    setInts(savedAttrs, "backward_segments", {operands, 2, 1});
    KernelContext fwdSaving = context(name, b.attrs), bwdSaved = context(name + ".backward", savedAttrs);
    TensorRef lse = f32Output(b.tokens, heads);
    fwdSaving.outputs = {b.out, lse};
    bwdSaved.inputs.push_back(b.out);
    bwdSaved.inputs.push_back(lse);
    bwdSaved.inputs.push_back(b.dO);
    bwdSaved.outputs = b.gradOutputs[0];
    report("forward with logsumexp", time(fwdSaving, true), b.fwdFlops);
    run(forward, fwdSaving);
    report("backward from saved statistics", time(bwdSaved, false), bwdFlops);
    setenv("MOEC_ATTENTION_SINGLE_PASS", "1", 1); // where FlashWgmma.cu's backward runs
    report("backward from saved statistics, single pass", time(bwdSaved, false), bwdFlops);
    unsetenv("MOEC_ATTENTION_SINGLE_PASS");
    cudaFree(lse.data);
  }
  // The tile shapes of the query-tile kernels (Flash.cu: queries per warp x keys per tile;
  // a shape that does not fit the head dims runs the default).
  std::printf("tile shapes (MOEC_ATTENTION_FORWARD_TILES, MOEC_ATTENTION_DQ_TILES):\n");
  for (const char *shape : {"16x64", "16x32", "32x32", "32x64"}) {
    setenv("MOEC_ATTENTION_FORWARD_TILES", shape, 1);
    report(std::string("forward ") + shape, time(fwd, true), b.fwdFlops);
    unsetenv("MOEC_ATTENTION_FORWARD_TILES");
  }
  // Heads of a GQA group per dK/dV block (fewer: more blocks, f32 partial sums to add up).
  for (int64_t perBlock : {1, 2, 4, 8}) {
    if (b.group % perBlock != 0)
      continue;
    setenv("MOEC_ATTENTION_HEADS_PER_BLOCK", std::to_string(perBlock).c_str(), 1);
    report("backward (dk, dv only), heads/block " + std::to_string(perBlock), time(bwd[2], false), 0.0);
    unsetenv("MOEC_ATTENTION_HEADS_PER_BLOCK");
  }
  for (const char *shape : {"16x64", "16x32", "32x32", "32x64"}) {
    setenv("MOEC_ATTENTION_DQ_TILES", shape, 1);
    report(std::string("backward (dq only), dq ") + shape, time(bwd[1], false), 0.0);
    unsetenv("MOEC_ATTENTION_DQ_TILES");
  }
  if (o.general) {
    setGeneral(true);
    std::printf("general kernels (MOEC_ATTENTION_GENERAL=1), median of 3 after 1:\n");
    report("forward", medianMs(stream, 1, 3, [&] { run(forward, fwd); }), b.fwdFlops);
    report("backward (every gradient)", medianMs(stream, 1, 3, [&] { run(backward, bwd[0]); }), bwdFlops);
    setGeneral(false);
  }
  check(cudaStreamSynchronize(stream), "bench");
}

void freeAll(const Bench &b) {
  std::vector<void *> seen;
  auto free = [&](const TensorRef &t) {
    if (t.data && std::find(seen.begin(), seen.end(), t.data) == seen.end()) {
      seen.push_back(t.data);
      cudaFree(t.data);
    }
  };
  for (const TensorRef &t : b.inputs)
    free(t);
  for (const auto &outputs : b.gradOutputs)
    for (const TensorRef &t : outputs)
      free(t);
  free(b.out);
  free(b.dO);
}

struct AttentionShape {
  int64_t tokens, heads, kvHeads, dim, valueDim, window;
  bool sinks;
};

void benchAttention(const AttentionShape &s, const Options &o, cudaStream_t stream) {
  std::printf("\nattention: T=%lld H=%lld KV=%lld d=%lld dv=%lld causal%s%s, bf16\n",
              static_cast<long long>(s.tokens), static_cast<long long>(s.heads),
              static_cast<long long>(s.kvHeads), static_cast<long long>(s.dim),
              static_cast<long long>(s.valueDim),
              s.window > 0 ? (", window " + std::to_string(s.window)).c_str() : "", s.sinks ? ", sinks" : "");
  Bench b;
  b.kernel = "attention";
  b.tokens = s.tokens;
  b.group = s.heads / s.kvHeads;
  setInt(b.attrs, "num_heads", s.heads);
  setInt(b.attrs, "num_kv_heads", s.kvHeads);
  setInt(b.attrs, "head_dim", s.dim);
  b.attrs["scale"].set_f(1.0 / std::sqrt(static_cast<double>(s.dim)));
  if (s.window > 0)
    setInt(b.attrs, "sliding_window", s.window);
  const int64_t T = s.tokens, H = s.heads, KV = s.kvHeads, d = s.dim, dv = s.valueDim;
  b.inputs = {bf16Tensor(T, H * d, 1, 1.0f), bf16Tensor(T, KV * d, 2, 1.0f), bf16Tensor(T, KV * dv, 3, 1.0f)};
  TensorRef sinks = bf16Tensor(1, H, 5, 1.0f), dSinks = bf16Tensor(1, H, 0, 0);
  sinks.shape = dSinks.shape = {H};
  if (s.sinks)
    b.inputs.push_back(sinks);
  b.dO = bf16Tensor(T, H * dv, 4, 1.0f);
  b.out = bf16Tensor(T, H * dv, 0, 0);
  const TensorRef dq = bf16Tensor(T, H * d, 0, 0), dk = bf16Tensor(T, KV * d, 0, 0),
                  dV = bf16Tensor(T, KV * dv, 0, 0);
  const int64_t operands = s.sinks ? 4 : 3;
  for (Attrs &a : b.backAttrs) {
    a = b.attrs;
    setInts(a, "grad_of_outputs", {0});
    setInts(a, "backward_segments", {operands, 0, 1});
  }
  b.wrt[0] = {0, 1, 2};
  b.gradOutputs[0] = {dq, dk, dV};
  b.gradNames = {"dq", "dk", "dv"};
  if (s.sinks) {
    b.wrt[0].push_back(3);
    b.gradOutputs[0].push_back(dSinks);
    b.gradNames.push_back("dsinks");
  }
  b.wrt[1] = {0};
  b.gradOutputs[1] = {dq};
  b.wrt[2] = {1, 2};
  b.gradOutputs[2] = {dk, dV};
  b.fwdFlops = 2.0 * T * T * (d + dv) * H / 2;
  runBench(b, o, stream);
  if (!s.sinks) {
    cudaFree(sinks.data);
    cudaFree(dSinks.data);
  }
  freeAll(b);
}

struct MlaShape {
  int64_t tokens, heads, nope, rope, valueDim;
};

void benchMla(const MlaShape &s, const Options &o, cudaStream_t stream) {
  std::printf("\nmla: T=%lld H=%lld nope=%lld rope=%lld (interleaved RoPE) v=%lld causal, bf16\n",
              static_cast<long long>(s.tokens), static_cast<long long>(s.heads),
              static_cast<long long>(s.nope), static_cast<long long>(s.rope),
              static_cast<long long>(s.valueDim));
  Bench b;
  b.kernel = "mla";
  b.tokens = s.tokens;
  const int64_t T = s.tokens, H = s.heads, qk = s.nope + s.rope, kvw = s.nope + s.valueDim;
  setInt(b.attrs, "num_heads", H);
  setInt(b.attrs, "qk_nope_head_dim", s.nope);
  setInt(b.attrs, "qk_rope_head_dim", s.rope);
  setInt(b.attrs, "v_head_dim", s.valueDim);
  b.attrs["scale"].set_f(1.0 / std::sqrt(static_cast<double>(qk)));
  b.attrs["rope.theta"].set_f(10000.0);
  setInt(b.attrs, "rope.dim", s.rope);
  b.attrs["rope.style"].set_s("interleaved");
  b.inputs = {bf16Tensor(T, H * qk, 1, 1.0f), bf16Tensor(T, s.rope, 2, 1.0f), bf16Tensor(T, H * kvw, 3, 1.0f),
              positionTensor(T)};
  b.dO = bf16Tensor(T, H * s.valueDim, 4, 1.0f);
  b.out = bf16Tensor(T, H * s.valueDim, 0, 0);
  const TensorRef dq = bf16Tensor(T, H * qk, 0, 0), dkr = bf16Tensor(T, s.rope, 0, 0),
                  dkv = bf16Tensor(T, H * kvw, 0, 0);
  for (Attrs &a : b.backAttrs) {
    a = b.attrs;
    setInts(a, "grad_of_outputs", {0});
    setInts(a, "backward_segments", {4, 0, 1});
  }
  b.wrt[0] = {0, 1, 2};
  b.gradOutputs[0] = {dq, dkr, dkv};
  b.gradNames = {"dq", "dk_rope", "dkv"};
  b.wrt[1] = {0};
  b.gradOutputs[1] = {dq};
  b.wrt[2] = {1, 2};
  b.gradOutputs[2] = {dkr, dkv};
  b.fwdFlops = 2.0 * T * T * (qk + s.valueDim) * H / 2;
  runBench(b, o, stream);
  freeAll(b);
}

} // namespace

int main(int argc, char **argv) {
  AttentionShape custom{4096, 32, 4, 128, 0, 0, false};
  bool customShape = false;
  std::string shape = "all";
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto next = [&]() -> int64_t { return std::atoll(value().c_str()); };
    if (a == "--shape")
      shape = value();
    else if (a == "--tokens")
      custom.tokens = next(), customShape = true;
    else if (a == "--heads")
      custom.heads = next(), customShape = true;
    else if (a == "--kv-heads")
      custom.kvHeads = next(), customShape = true;
    else if (a == "--dim")
      custom.dim = next(), customShape = true;
    else if (a == "--value-dim")
      custom.valueDim = next(), customShape = true;
    else if (a == "--window")
      custom.window = next(), customShape = true;
    else if (a == "--sinks")
      custom.sinks = true, customShape = true;
    else if (a == "--iters")
      o.iters = static_cast<int>(next());
    else if (a == "--warmup")
      o.warmup = static_cast<int>(next());
    else if (a == "--general")
      o.general = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (shape != "all" && shape != "qwen3-30b" && shape != "qwen3-next" && shape != "mla") {
    std::fprintf(stderr, "unknown shape %s (qwen3-30b, qwen3-next, mla)\n", shape.c_str());
    return 2;
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("attention_bench on %s\n", prop.name);
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  if (customShape) {
    if (custom.valueDim <= 0)
      custom.valueDim = custom.dim;
    benchAttention(custom, o, stream);
  } else {
    if (shape == "all" || shape == "qwen3-30b")
      benchAttention({4096, 32, 4, 128, 128, 0, false}, o, stream);
    if (shape == "all" || shape == "qwen3-next")
      benchAttention({4096, 16, 2, 256, 256, 0, false}, o, stream);
    if (shape == "all" || shape == "mla")
      benchMla({4096, 128, 128, 64, 128}, o, stream);
  }
  cudaStreamDestroy(stream);
  return 0;
}
