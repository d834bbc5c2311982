//===- grouped_gemm_bench.cpp - grouped GEMMs on Qwen3-30B-A3B expert shapes ---===//
//
// Times (CUDA events, median of --iters after warm-up) the three grouped GEMM
// forms of expert_mlp on Qwen3-30B-A3B MoE shapes (4096 tokens x top-8 =
// 32768 rows, 128 experts, hidden 2048, moe_intermediate 768), bf16 operands,
// f32 output, with balanced and Zipf-skewed loads:
//   fwd  Y[rows_e, out] = X[rows_e, in] W_eᵀ      (groupedGemm, W_e [out, in])
//   dx   dX[rows_e, in] = dY[rows_e, out] W_e     (groupedGemm, W_e [out, in])
//   dW   dW_e[out, in]  = dY[rows_e, out]ᵀ X[rows_e, in]   (groupedGemmReduce)
// for (in, out) = (2048, 768) (gate / up) and (768, 2048) (down), against
// cuBLAS per expert (the previous ExpertMlp.cu, counts known on the host) and
// one cuBLAS GEMM of the same FLOPs (the ceiling). Prints TFLOP/s and the
// largest difference between the grouped result and cuBLAS per expert. The
// gated SiLU's fused forms at (2048, 768), timed against the ceiling only
// (expert_mlp_test checks their values): glu (gate and up with the activation),
// glu' (its gradient from dh) and dx2 (dp W_up + dg W_gate in one GEMM).
//
//   bazel build //runtime/kernels/cuda/routing:grouped_gemm_bench
//   bazel-bin/runtime/kernels/cuda/routing/grouped_gemm_bench [--iters N]
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

#include "runtime/kernels/cuda/CudaGemm.h"
#include "runtime/kernels/cuda/routing/GroupedGemm.cuh"
#include "runtime/kernels/testing/CudaBench.h"

namespace {

using moec::runtime::KernelContext;
using moec::runtime::KernelError;
using moec::runtime::cuda::gemm;
using moec::runtime::cuda::routing::ExpertRows;
using moec::runtime::cuda::routing::groupedGemm;
using moec::runtime::cuda::routing::groupedGemmReduce;
namespace plan = moec::plan;
using moec::runtime::bench::check;
using moec::runtime::bench::medianMs;
using moec::runtime::bench::randomBf16;

void *zeros(size_t bytes) {
  void *d = nullptr;
  check(cudaMalloc(&d, bytes), "cudaMalloc");
  check(cudaMemset(d, 0, bytes), "cudaMemset");
  return d;
}

/// max |a - b| / max |b| over n f32 device values.
double relativeDiff(const void *a, const void *b, size_t n) {
  std::vector<float> ha(n), hb(n);
  cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(ha[i] - hb[i])));
    norm = std::max(norm, static_cast<double>(std::abs(hb[i])));
    if (!std::isfinite(ha[i]))
      return INFINITY;
  }
  return norm > 0 ? diff / norm : diff;
}

/// Rows per expert of `tokens` tokens each routed to `topK` distinct experts,
/// the experts drawn with weights 1 / (e + 1)^s (s = 0: balanced in expectation).
std::vector<int64_t> routedCounts(int64_t tokens, int64_t topK, int64_t experts, double s,
                                  uint64_t seed) {
  std::vector<int64_t> counts(experts, 0);
  if (s == 0) { // exactly balanced
    for (int64_t e = 0; e < experts; ++e)
      counts[e] = tokens * topK / experts + (e < tokens * topK % experts ? 1 : 0);
    return counts;
  }
  std::vector<double> weights(experts);
  for (int64_t e = 0; e < experts; ++e)
    weights[e] = 1.0 / std::pow(static_cast<double>(e + 1), s);
  std::mt19937_64 rng(seed);
  std::discrete_distribution<int64_t> pick(weights.begin(), weights.end());
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> chosen;
    while (static_cast<int64_t>(chosen.size()) < topK) {
      int64_t e = pick(rng);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end())
        chosen.push_back(e);
    }
    for (int64_t e : chosen)
      ++counts[e];
  }
  return counts;
}

} // namespace

int main(int argc, char **argv) {
  int iters = 20, warmup = 3;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--iters" && i + 1 < argc)
      iters = std::max(1, std::atoi(argv[++i]));
  if (!moec::runtime::bench::gpuAvailable("grouped_gemm_bench"))
    return 0;
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("grouped_gemm_bench on %s (%d SMs), median of %d runs after %d warm-up\n", prop.name,
              prop.multiProcessorCount, iters, warmup);

  const int64_t tokens = 4096, topK = 8, experts = 128, rows = tokens * topK;
  const int64_t hidden = 2048, inter = 768;
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  KernelContext ctx;
  ctx.kernel = "grouped_gemm_bench";
  ctx.stream = stream;

  // Operands sized for the larger of the two shapes.
  size_t big = static_cast<size_t>(rows) * hidden, weights = static_cast<size_t>(experts) * hidden * inter;
  void *x = randomBf16(big, 1, 1.0f);
  void *dy = randomBf16(big, 2, 1.0f);
  void *w = randomBf16(weights, 3, 0.03f);
  void *w2 = randomBf16(weights, 4, 0.03f);
  void *dhBf16 = randomBf16(static_cast<size_t>(rows) * inter, 5, 1.0f);
  void *outA = zeros(std::max(big, weights) * 4), *outB = zeros(std::max(big, weights) * 4);
  int64_t *dOffsets = nullptr;
  check(cudaMalloc(&dOffsets, (experts + 1) * sizeof(int64_t)), "cudaMalloc");

  std::printf("\n%-9s %-10s %-4s %9s %9s %9s %8s %9s  %s\n", "load", "in x out", "form",
              "grouped", "cublas/e", "one GEMM", "ratio", "max diff",
              "(TFLOP/s; ratio = grouped / one GEMM)");
  struct Load {
    const char *name;
    double s;
  };
  for (Load load : {Load{"balanced", 0.0}, Load{"zipf1.2", 1.2}}) {
    std::vector<int64_t> counts = routedCounts(tokens, topK, experts, load.s, 42);
    std::vector<int64_t> offsets(experts + 1, 0);
    for (int64_t e = 0; e < experts; ++e)
      offsets[e + 1] = offsets[e] + counts[e];
    check(cudaMemcpy(dOffsets, offsets.data(), offsets.size() * sizeof(int64_t),
                     cudaMemcpyHostToDevice),
          "cudaMemcpy");
    std::printf("# %s: largest expert %lld rows, empty experts %lld\n", load.name,
                static_cast<long long>(*std::max_element(counts.begin(), counts.end())),
                static_cast<long long>(std::count(counts.begin(), counts.end(), 0)));
    ExpertRows g{dOffsets, experts, rows};
    for (auto shape : {std::pair<int64_t, int64_t>{hidden, inter}, {inter, hidden}}) {
      int64_t in = shape.first, out = shape.second;
      double flops = 2.0 * rows * in * out;
      char dims[32];
      std::snprintf(dims, sizeof dims, "%lldx%lld", static_cast<long long>(in),
                    static_cast<long long>(out));
      auto wAt = [&](int64_t e) { return static_cast<const char *>(w) + e * in * out * 2; };
      auto rowAt = [&](const void *p, int64_t row, int64_t width) {
        return static_cast<const char *>(p) + row * width * 2;
      };
      struct Run {
        const char *form;
        std::function<void(void *)> grouped, perExpert;
        std::function<void()> ceiling;
        size_t outElems;
      };
      std::vector<Run> fused; // the gated SiLU's forms (gate / up shape only)
      if (in == hidden) {
        fused = {
            {"glu",
             [&](void *h) {
               groupedGluGemm(ctx, g, out, in, x, in, w, w2, in, in * out, plan::BF16, nullptr, h,
                              nullptr, out);
             },
             nullptr,
             [&] {
               gemm(ctx, false, true, rows, 2 * out, in, 1.0f, x, in, w, in, plan::BF16, 0.0f, outA,
                    2 * out, plan::F32);
             },
             0},
            {"glu'",
             [&](void *d) {
               groupedGluGemm(ctx, g, out, in, x, in, w, w2, in, in * out, plan::BF16,
                              static_cast<const float *>(outB), d,
                              static_cast<char *>(d) + rows * out * 2, out);
             },
             nullptr,
             [&] {
               gemm(ctx, false, true, rows, 2 * out, in, 1.0f, x, in, w, in, plan::BF16, 0.0f, outA,
                    2 * out, plan::F32);
             },
             0},
            {"dx2",
             [&](void *dx) {
               groupedGemmSum(ctx, g, in, out, dhBf16, dhBf16, out, w, w2, in, in * out, false,
                              plan::BF16, dx, in, plan::BF16);
             },
             nullptr,
             [&] {
               gemm(ctx, false, false, rows, in, 2 * out, 1.0f, dy, 2 * out, w, in, plan::BF16,
                    0.0f, outA, in, plan::F32);
             },
             0},
        };
      }
      std::vector<Run> runs = {
          {"fwd",
           [&](void *y) {
             groupedGemm(ctx, g, out, in, 1.0f, x, in, w, in, in * out, true, plan::BF16, 0.0f, y,
                         out, plan::F32);
           },
           [&](void *y) {
             for (int64_t e = 0; e < experts; ++e)
               if (counts[e] > 0)
                 gemm(ctx, false, true, counts[e], out, in, 1.0f, rowAt(x, offsets[e], in), in,
                      wAt(e), in, plan::BF16, 0.0f, static_cast<float *>(y) + offsets[e] * out,
                      out, plan::F32);
           },
           [&] {
             gemm(ctx, false, true, rows, out, in, 1.0f, x, in, w, in, plan::BF16, 0.0f, outA, out,
                  plan::F32);
           },
           static_cast<size_t>(rows * out)},
          {"dx",
           [&](void *dx) {
             groupedGemm(ctx, g, in, out, 1.0f, dy, out, w, in, in * out, false, plan::BF16, 0.0f,
                         dx, in, plan::F32);
           },
           [&](void *dx) {
             for (int64_t e = 0; e < experts; ++e)
               if (counts[e] > 0)
                 gemm(ctx, false, false, counts[e], in, out, 1.0f, rowAt(dy, offsets[e], out), out,
                      wAt(e), in, plan::BF16, 0.0f, static_cast<float *>(dx) + offsets[e] * in, in,
                      plan::F32);
           },
           [&] {
             gemm(ctx, false, false, rows, in, out, 1.0f, dy, out, w, in, plan::BF16, 0.0f, outA,
                  in, plan::F32);
           },
           static_cast<size_t>(rows * in)},
          {"dW",
           [&](void *dw) {
             groupedGemmReduce(ctx, g, out, in, 1.0f, dy, out, x, in, plan::BF16, 0.0f, dw, in,
                               in * out, plan::F32);
           },
           [&](void *dw) {
             for (int64_t e = 0; e < experts; ++e)
               if (counts[e] > 0)
                 gemm(ctx, true, false, out, in, counts[e], 1.0f, rowAt(dy, offsets[e], out), out,
                      rowAt(x, offsets[e], in), in, plan::BF16, 0.0f,
                      static_cast<float *>(dw) + e * in * out, in, plan::F32);
           },
           [&] {
             gemm(ctx, true, false, out, in, rows, 1.0f, dy, out, x, in, plan::BF16, 0.0f, outA,
                  in, plan::F32);
           },
           static_cast<size_t>(experts * in * out)},
      };
      for (Run &r : fused) {
        try {
          // glu' reads dh (f32) from outB: widened random values.
          std::vector<uint16_t> bits(static_cast<size_t>(rows) * out);
          check(cudaMemcpy(bits.data(), dhBf16, bits.size() * 2, cudaMemcpyDeviceToHost), "dh");
          std::vector<float> dh(bits.size());
          for (size_t i = 0; i < bits.size(); ++i)
            dh[i] = moec::runtime::bench::fromBf16(bits[i]);
          check(cudaMemcpy(outB, dh.data(), dh.size() * 4, cudaMemcpyHostToDevice), "dh");
          double tGrouped = medianMs(stream, warmup, iters, [&] { r.grouped(outA); });
          double tOne = medianMs(stream, warmup, iters, r.ceiling);
          auto tflops = [&](double ms) { return 2 * flops / (ms * 1e-3) / 1e12; };
          std::printf("%-9s %-10s %-4s %9.1f %9s %9.1f %8.2f %9s   (%.3f / - / %.3f ms)\n",
                      load.name, dims, r.form, tflops(tGrouped), "-", tflops(tOne), tOne / tGrouped,
                      "-", tGrouped, tOne);
        } catch (const KernelError &e) {
          std::printf("%-9s %-10s %-4s failed: %s\n", load.name, dims, r.form, e.what());
        }
      }
      for (Run &r : runs) {
        try {
          // Correctness first: both into zeroed outputs (experts without rows stay zero).
          check(cudaMemset(outA, 0, r.outElems * 4), "cudaMemset");
          check(cudaMemset(outB, 0, r.outElems * 4), "cudaMemset");
          r.grouped(outA);
          r.perExpert(outB);
          check(cudaStreamSynchronize(stream), "correctness run");
          double diff = relativeDiff(outA, outB, r.outElems);
          double tGrouped = medianMs(stream, warmup, iters, [&] { r.grouped(outA); });
          double tLoop = medianMs(stream, warmup, iters, [&] { r.perExpert(outB); });
          double tOne = medianMs(stream, warmup, iters, r.ceiling);
          auto tflops = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
          std::printf("%-9s %-10s %-4s %9.1f %9.1f %9.1f %8.2f %9.2e   (%.3f / %.3f / %.3f ms)\n",
                      load.name, dims, r.form, tflops(tGrouped), tflops(tLoop), tflops(tOne),
                      tGrouped > 0 ? tOne / tGrouped : 0.0, diff, tGrouped, tLoop, tOne);
        } catch (const KernelError &e) {
          std::printf("%-9s %-10s %-4s failed: %s\n", load.name, dims, r.form, e.what());
        }
      }
    }
  }
  check(cudaDeviceSynchronize(), "final synchronisation");
  cudaFree(x);
  cudaFree(dy);
  cudaFree(w);
  cudaFree(w2);
  cudaFree(dhBf16);
  cudaFree(outA);
  cudaFree(outB);
  cudaFree(dOffsets);
  cudaStreamDestroy(stream);
  return 0;
}
