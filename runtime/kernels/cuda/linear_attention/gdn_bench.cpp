//===- gdn_bench.cpp - gated_delta_net on Qwen3-Next-80B-A3B shapes ---------===//
//
// Times (CUDA events, median of --iters after --warmup runs) the CUDA
// gated_delta_net forward and its backward (gradients of qkvz and ba, as a
// LoRA step needs; --all-grads: all six operands) on one Qwen3-Next linear
// attention layer: --tokens 4096 (one sequence; --batch for more), 16 key
// heads, 32 value heads, dk = dv = 128, conv kernel 4, bf16 storage (--f32:
// f32), once with the recurrent delta rule and once with the chunked one
// (DeltaRulePath.h). Also prints how far the chunked results are from the
// recurrent ones (||chunked - recurrent|| / ||recurrent|| per output).
//
//   bazel build //runtime/kernels/cuda/linear_attention:gdn_bench
//   bazel-bin/runtime/kernels/cuda/linear_attention/gdn_bench [--iters N] [--tokens T]
//
//===----------------------------------------------------------------------===//

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/cuda/linear_attention/DeltaRulePath.h"
#include "runtime/kernels/testing/CudaBench.h"

namespace {

using moec::runtime::KernelContext;
using moec::runtime::KernelError;
using moec::runtime::KernelRegistry;
using moec::runtime::TensorRef;
using moec::runtime::cuda::linattn::DeltaRulePath;
using moec::runtime::cuda::linattn::setDeltaRulePath;
namespace plan = moec::plan;
using moec::runtime::bench::check;
using moec::runtime::bench::fromBf16;
using moec::runtime::bench::toBf16;

/// A device tensor of `shape`, uniform in [offset - scale, offset + scale).
struct DeviceTensor {
  TensorRef ref;
  size_t bytes = 0;

  DeviceTensor(plan::DType dtype, std::vector<int64_t> shape) {
    ref.dtype = dtype;
    ref.shape = std::move(shape);
    bytes = static_cast<size_t>(ref.numel()) * (dtype == plan::BF16 ? 2 : 4);
    check(cudaMalloc(&ref.data, std::max<size_t>(bytes, 16)), "cudaMalloc");
  }
  void fill(uint64_t seed, float scale, float offset = 0.0f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(offset - scale, offset + scale);
    size_t n = static_cast<size_t>(ref.numel());
    if (ref.dtype == plan::BF16) {
      std::vector<uint16_t> host(n);
      for (uint16_t &h : host)
        h = toBf16(u(rng));
      check(cudaMemcpy(ref.data, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    } else {
      std::vector<float> host(n);
      for (float &f : host)
        f = u(rng);
      check(cudaMemcpy(ref.data, host.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
  }
  std::vector<float> read() const {
    size_t n = static_cast<size_t>(ref.numel());
    std::vector<float> out(n);
    if (ref.dtype == plan::BF16) {
      std::vector<uint16_t> host(n);
      check(cudaMemcpy(host.data(), ref.data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      for (size_t i = 0; i < n; ++i)
        out[i] = fromBf16(host[i]);
    } else {
      check(cudaMemcpy(out.data(), ref.data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    }
    return out;
  }
};

double relativeDifference(const std::vector<float> &a, const std::vector<float> &b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

struct Options {
  int iters = 10, warmup = 3;
  int64_t tokens = 4096, batch = 1;
  bool f32 = false, allGrads = false;
};

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::atoll(argv[++i]);
    };
    if (a == "--iters")
      o.iters = static_cast<int>(next());
    else if (a == "--warmup")
      o.warmup = static_cast<int>(next());
    else if (a == "--tokens")
      o.tokens = next();
    else if (a == "--batch")
      o.batch = next();
    else if (a == "--f32")
      o.f32 = true;
    else if (a == "--all-grads")
      o.allGrads = true;
    else {
      std::fprintf(stderr, "usage: gdn_bench [--iters N] [--warmup N] [--tokens T] [--batch B] [--f32] "
                           "[--all-grads]\n");
      std::exit(2);
    }
  }
  return o;
}

} // namespace

int main(int argc, char **argv) {
  Options o = parse(argc, argv);
  if (!moec::runtime::bench::gpuAvailable("gdn_bench"))
    return 0;
  const int64_t hk = 16, hv = 32, dk = 128, dv = 128, width = 4;
  const int64_t T = o.tokens * o.batch, qkvzWidth = 2 * hk * dk + 2 * hv * dv,
                channels = 2 * hk * dk + hv * dv;
  const plan::DType storage = o.f32 ? plan::F32 : plan::BF16;

  moec::runtime::bench::keepPoolMemory(); // as the CUDA device does
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");

  KernelRegistry registry;
  moec::runtime::cuda::registerLinearAttentionKernels(registry);
  const moec::runtime::KernelFn *fwd = registry.find("gated_delta_net");
  const moec::runtime::KernelFn *bwd = registry.find("gated_delta_net.backward");
  if (!fwd || !bwd) {
    std::fprintf(stderr, "gated_delta_net is not registered\n");
    return 1;
  }

  std::vector<DeviceTensor> in;
  in.emplace_back(storage, std::vector<int64_t>{T, qkvzWidth});
  in.emplace_back(storage, std::vector<int64_t>{T, 2 * hv});
  in.emplace_back(storage, std::vector<int64_t>{channels, 1, width});
  in.emplace_back(storage, std::vector<int64_t>{hv});
  in.emplace_back(storage, std::vector<int64_t>{hv});
  in.emplace_back(storage, std::vector<int64_t>{dv});
  in[0].fill(1, 1.0f);
  in[1].fill(2, 1.5f);
  in[2].fill(3, 0.6f);
  in[3].fill(4, 0.5f, 1.0f); // A_log around 1: exp(A_log) ~ 2.7, g ~ -2 per token
  in[4].fill(5, 0.5f);
  in[5].fill(6, 0.3f, 1.0f);
  DeviceTensor dy(storage, {T, hv * dv});
  dy.fill(7, 1.0f);
  DeviceTensor y(storage, {T, hv * dv});

  std::vector<int64_t> wrt = o.allGrads ? std::vector<int64_t>{0, 1, 2, 3, 4, 5} : std::vector<int64_t>{0, 1};
  std::vector<DeviceTensor> grads;
  for (int64_t i : wrt)
    grads.emplace_back(storage, in[static_cast<size_t>(i)].ref.shape);

  google::protobuf::Map<std::string, plan::Attr> attrs;
  attrs["num_key_heads"].set_i(hk);
  attrs["num_value_heads"].set_i(hv);
  attrs["key_head_dim"].set_i(dk);
  attrs["value_head_dim"].set_i(dv);
  attrs["eps"].set_f(1e-6);
  google::protobuf::Map<std::string, plan::Attr> backwardAttrs = attrs;
  for (int64_t i : wrt)
    backwardAttrs["grad_of_inputs"].mutable_ints()->add_values(i);
  backwardAttrs["grad_of_outputs"].mutable_ints()->add_values(0);
  for (int64_t v : {6, 0, 1})
    backwardAttrs["backward_segments"].mutable_ints()->add_values(v);

  KernelContext forwardCtx;
  forwardCtx.kernel = "gated_delta_net";
  for (DeviceTensor &t : in)
    forwardCtx.inputs.push_back(t.ref);
  forwardCtx.outputs.push_back(y.ref);
  forwardCtx.attrs = &attrs;
  forwardCtx.seqLen = o.tokens;
  forwardCtx.microBatch = o.batch;
  forwardCtx.stream = stream;
  KernelContext backwardCtx = forwardCtx;
  backwardCtx.kernel = "gated_delta_net.backward";
  backwardCtx.inputs.push_back(dy.ref);
  backwardCtx.outputs.clear();
  for (DeviceTensor &g : grads)
    backwardCtx.outputs.push_back(g.ref);
  backwardCtx.attrs = &backwardAttrs;

  std::printf("gated_delta_net, %lld tokens x %lld, Hk %lld, Hv %lld, dk %lld, dv %lld, %s storage, "
              "backward grads of %s; median of %d after %d warm-up\n",
              static_cast<long long>(o.tokens), static_cast<long long>(o.batch), static_cast<long long>(hk),
              static_cast<long long>(hv), static_cast<long long>(dk), static_cast<long long>(dv),
              o.f32 ? "f32" : "bf16", o.allGrads ? "all six operands" : "qkvz and ba", o.iters, o.warmup);

  struct Run {
    const char *name;
    DeltaRulePath path;
    double forwardMs = 0, backwardMs = 0;
    std::vector<std::vector<float>> results; // y, then each gradient
  };
  std::vector<Run> runs = {{"recurrent", DeltaRulePath::Recurrent}, {"chunked", DeltaRulePath::Chunked}};
  try {
    for (Run &run : runs) {
      setDeltaRulePath(run.path);
      run.forwardMs = moec::runtime::bench::medianMs(stream, o.warmup, o.iters, [&] { (*fwd)(forwardCtx); });
      run.backwardMs = moec::runtime::bench::medianMs(stream, o.warmup, o.iters, [&] { (*bwd)(backwardCtx); });
      check(cudaStreamSynchronize(stream), run.name);
      run.results.push_back(y.read());
      for (DeviceTensor &g : grads)
        run.results.push_back(g.read());
      std::printf("  %-9s  forward %9.3f ms   backward %9.3f ms\n", run.name, run.forwardMs, run.backwardMs);
    }
  } catch (const KernelError &e) {
    std::fprintf(stderr, "launch failed: %s\n", e.what());
    return 1;
  }
  setDeltaRulePath(DeltaRulePath::Auto);

  const char *names[] = {"qkvz", "ba", "conv_weight", "a_log", "dt_bias", "norm_weight"};
  std::printf("  chunked vs recurrent, ||chunked - recurrent|| / ||recurrent||: result %.3g",
              relativeDifference(runs[1].results[0], runs[0].results[0]));
  for (size_t i = 0; i < wrt.size(); ++i)
    std::printf(", d %s %.3g", names[wrt[i]],
                relativeDifference(runs[1].results[i + 1], runs[0].results[i + 1]));
  std::printf("\n  speed-up: forward %.1fx, backward %.1fx\n", runs[0].forwardMs / runs[1].forwardMs,
              runs[0].backwardMs / runs[1].backwardMs);
  for (DeviceTensor &t : in)
    cudaFree(t.ref.data);
  for (DeviceTensor &g : grads)
    cudaFree(g.ref.data);
  cudaFree(dy.ref.data);
  cudaFree(y.ref.data);
  cudaStreamDestroy(stream);
  return 0;
}
