//===- attention_bench.cpp - causal GQA attention on Qwen3-30B-A3B shapes --===//
//
// Times (CUDA events, median of --iters after --warmup runs) the CUDA
// `attention` and `attention.backward` kernels as the executor launches them
// (through the registry: output zeroing and scratch included) on bf16
// tensors: 4096 tokens, one sequence, 32 query heads, 4 KV heads, head dim
// 128, causal, scale 1/sqrt(d). Prints ms and TFLOP/s with causal FLOPs
// (forward 2·2·T²·d·H / 2, backward 2.5x that), the backward also with only
// dQ and only dK, dV asked for, then the tuning choices of Flash.cu (tile
// shapes of the query-tile kernels, heads per dK/dV block). First it checks
// the fast path at full size: the relative L2 difference of each output from
// the general kernels (MOEC_ATTENTION_GENERAL=1) on the same inputs, and
// whether two backward runs give the same bits. --general also times the
// general kernels.
//
//   bazel build //runtime/kernels/cuda/attention:attention_bench
//   bazel-bin/runtime/kernels/cuda/attention/attention_bench [--tokens N] [--heads H]
//       [--kv-heads KV] [--dim D] [--window W] [--sinks] [--iters N] [--warmup N] [--general]
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

namespace {

using moec::runtime::KernelContext;
using moec::runtime::KernelError;
using moec::runtime::KernelRegistry;
using moec::runtime::TensorRef;
namespace plan = moec::plan;

void check(cudaError_t error, const char *what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(error));
    std::exit(1);
  }
}

uint16_t toBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float fromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

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

/// Median milliseconds of `iters` runs of fn after `warmup` runs.
double timeMs(cudaStream_t stream, int warmup, int iters, const std::function<void()> &fn) {
  for (int i = 0; i < warmup; ++i)
    fn();
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(start, stream);
    fn();
    cudaEventRecord(stop, stream);
    check(cudaEventSynchronize(stop), "timed run");
    cudaEventElapsedTime(&ms[static_cast<size_t>(i)], start, stop);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[static_cast<size_t>(iters / 2)];
}

void setInt(google::protobuf::Map<std::string, plan::Attr> &attrs, const char *name, int64_t v) {
  attrs[name].set_i(v);
}
void setInts(google::protobuf::Map<std::string, plan::Attr> &attrs, const char *name,
             const std::vector<int64_t> &values) {
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

} // namespace

int main(int argc, char **argv) {
  int64_t tokens = 4096, heads = 32, kvHeads = 4, dim = 128, window = 0;
  int iters = 20, warmup = 3;
  bool general = false, sinks = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> int64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--tokens")
      tokens = next();
    else if (a == "--heads")
      heads = next();
    else if (a == "--kv-heads")
      kvHeads = next();
    else if (a == "--dim")
      dim = next();
    else if (a == "--window")
      window = next();
    else if (a == "--iters")
      iters = static_cast<int>(next());
    else if (a == "--warmup")
      warmup = static_cast<int>(next());
    else if (a == "--general")
      general = true;
    else if (a == "--sinks")
      sinks = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  std::printf("attention_bench on %s: T=%lld H=%lld KV=%lld d=%lld causal%s%s, bf16\n", prop.name,
              static_cast<long long>(tokens), static_cast<long long>(heads),
              static_cast<long long>(kvHeads), static_cast<long long>(dim),
              window > 0 ? (", window " + std::to_string(window)).c_str() : "", sinks ? ", sinks" : "");

  KernelRegistry registry;
  moec::runtime::cuda::registerAttentionKernels(registry);
  google::protobuf::Map<std::string, plan::Attr> attrs;
  setInt(attrs, "num_heads", heads);
  setInt(attrs, "num_kv_heads", kvHeads);
  setInt(attrs, "head_dim", dim);
  attrs["scale"].set_f(1.0 / std::sqrt(static_cast<double>(dim)));
  if (window > 0)
    setInt(attrs, "sliding_window", window);
  google::protobuf::Map<std::string, plan::Attr> backAttrs = attrs;
  const int64_t operands = sinks ? 4 : 3;
  setInts(backAttrs, "grad_of_outputs", {0});
  setInts(backAttrs, "backward_segments", {operands, 0, 1});

  TensorRef q = bf16Tensor(tokens, heads * dim, 1, 1.0f), k = bf16Tensor(tokens, kvHeads * dim, 2, 1.0f),
            v = bf16Tensor(tokens, kvHeads * dim, 3, 1.0f), dO = bf16Tensor(tokens, heads * dim, 4, 1.0f),
            s = bf16Tensor(1, heads, 5, 1.0f);
  s.shape = {heads};
  TensorRef out = bf16Tensor(tokens, heads * dim, 0, 0), dq = bf16Tensor(tokens, heads * dim, 0, 0),
            dk = bf16Tensor(tokens, kvHeads * dim, 0, 0), dv = bf16Tensor(tokens, kvHeads * dim, 0, 0),
            ds = bf16Tensor(1, heads, 0, 0);
  ds.shape = {heads};

  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  auto context = [&](const char *kernel, const google::protobuf::Map<std::string, plan::Attr> &a) {
    KernelContext ctx;
    ctx.kernel = kernel;
    ctx.attrs = &a;
    ctx.seqLen = tokens;
    ctx.microBatch = 1;
    ctx.stream = stream;
    ctx.inputs = {q, k, v};
    if (sinks)
      ctx.inputs.push_back(s);
    return ctx;
  };
  KernelContext fwd = context("attention", attrs);
  fwd.outputs = {out};
  // Backward variants: every gradient, dQ only, dK and dV only.
  google::protobuf::Map<std::string, plan::Attr> allAttrs = backAttrs, dqAttrs = backAttrs,
                                                  kvAttrs = backAttrs;
  std::vector<int64_t> all = {0, 1, 2};
  if (sinks)
    all.push_back(3);
  setInts(allAttrs, "grad_of_inputs", all);
  setInts(dqAttrs, "grad_of_inputs", {0});
  setInts(kvAttrs, "grad_of_inputs", {1, 2});
  KernelContext bwd = context("attention.backward", allAttrs), bwdDq = context("attention.backward", dqAttrs),
                bwdKv = context("attention.backward", kvAttrs);
  for (KernelContext *c : {&bwd, &bwdDq, &bwdKv})
    c->inputs.push_back(dO);
  bwd.outputs = {dq, dk, dv};
  if (sinks)
    bwd.outputs.push_back(ds);
  bwdDq.outputs = {dq};
  bwdKv.outputs = {dk, dv};

  const moec::runtime::KernelFn *forward = registry.find("attention"),
                                *backward = registry.find("attention.backward");
  auto run = [&](const moec::runtime::KernelFn *fn, KernelContext &ctx) {
    try {
      (*fn)(ctx);
    } catch (const KernelError &e) {
      std::fprintf(stderr, "launch refused: %s\n", e.what());
      std::exit(1);
    }
  };

  const double fwdFlops = 4.0 * tokens * tokens * dim * heads / 2, bwdFlops = 2.5 * fwdFlops;
  auto report = [&](const char *what, double ms, double flops) {
    if (flops > 0)
      std::printf("  %-38s %9.3f ms  %7.1f TFLOP/s\n", what, ms, flops / (ms * 1e-3) / 1e12);
    else
      std::printf("  %-38s %9.3f ms\n", what, ms);
  };

  // Correctness at full size: the fast path against the general kernels.
  setGeneral(true);
  run(forward, fwd);
  run(backward, bwd);
  check(cudaStreamSynchronize(stream), "general run");
  std::vector<std::vector<float>> ref;
  for (const TensorRef &t : {out, dq, dk, dv})
    ref.push_back(download(t));
  setGeneral(false);
  run(forward, fwd);
  run(backward, bwd);
  check(cudaStreamSynchronize(stream), "fast run");
  const char *names[] = {"out", "dq", "dk", "dv"};
  std::printf("fast path vs general kernels (relative L2):");
  int i = 0;
  for (const TensorRef &t : {out, dq, dk, dv}) {
    std::printf(" %s %.2e", names[i], relativeDiff(download(t), ref[static_cast<size_t>(i)]));
    ++i;
  }
  std::printf("\n");
  // Deterministic: a second backward gives the same bits.
  std::vector<std::vector<float>> first;
  for (const TensorRef &t : {dq, dk, dv})
    first.push_back(download(t));
  run(backward, bwd);
  check(cudaStreamSynchronize(stream), "fast run");
  bool same = true;
  i = 0;
  for (const TensorRef &t : {dq, dk, dv})
    same &= download(t) == first[static_cast<size_t>(i++)];
  std::printf("backward run twice: %s\n", same ? "bitwise identical" : "DIFFERENT (not deterministic)");

  std::printf("fast path (bf16 tensor cores), median of %d after %d warm-up:\n", iters, warmup);
  report("forward", timeMs(stream, warmup, iters, [&] { run(forward, fwd); }), fwdFlops);
  report("backward (dq, dk, dv)", timeMs(stream, warmup, iters, [&] { run(backward, bwd); }), bwdFlops);
  report("backward (dq only)", timeMs(stream, warmup, iters, [&] { run(backward, bwdDq); }), 0.0);
  report("backward (dk, dv only)", timeMs(stream, warmup, iters, [&] { run(backward, bwdKv); }), 0.0);
  // The tile shapes of the query-tile kernels (Flash.cu: queries per warp x keys per tile).
  std::printf("tile shapes (MOEC_ATTENTION_FORWARD_TILES, MOEC_ATTENTION_DQ_TILES):\n");
  for (const char *shape : {"16x64", "32x32", "32x64"}) {
    setenv("MOEC_ATTENTION_FORWARD_TILES", shape, 1);
    report((std::string("forward ") + shape).c_str(),
           timeMs(stream, warmup, iters, [&] { run(forward, fwd); }), fwdFlops);
    unsetenv("MOEC_ATTENTION_FORWARD_TILES");
  }
  // Heads of a GQA group per dK/dV block (fewer: more blocks, f32 partial sums to add up).
  for (const char *perBlock : {"1", "2", "4", "8"}) {
    if ((heads / kvHeads) % std::atoll(perBlock) != 0)
      continue;
    setenv("MOEC_ATTENTION_HEADS_PER_BLOCK", perBlock, 1);
    report((std::string("backward (dk, dv only), heads/block ") + perBlock).c_str(),
           timeMs(stream, warmup, iters, [&] { run(backward, bwdKv); }), 0.0);
    unsetenv("MOEC_ATTENTION_HEADS_PER_BLOCK");
  }
  for (const char *shape : {"16x64", "32x32", "32x64"}) {
    setenv("MOEC_ATTENTION_DQ_TILES", shape, 1);
    report((std::string("backward (dq only), dq ") + shape).c_str(),
           timeMs(stream, warmup, iters, [&] { run(backward, bwdDq); }), 0.0);
    unsetenv("MOEC_ATTENTION_DQ_TILES");
  }
  if (general) {
    setGeneral(true);
    std::printf("general kernels (MOEC_ATTENTION_GENERAL=1), median of 3 after 1:\n");
    report("forward", timeMs(stream, 1, 3, [&] { run(forward, fwd); }), fwdFlops);
    report("backward (dq, dk, dv)", timeMs(stream, 1, 3, [&] { run(backward, bwd); }), bwdFlops);
    setGeneral(false);
  }
  check(cudaStreamSynchronize(stream), "bench");
  for (const TensorRef &t : {q, k, v, dO, s, out, dq, dk, dv, ds})
    cudaFree(t.data);
  cudaStreamDestroy(stream);
  return 0;
}
