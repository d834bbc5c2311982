//===- GroupedGemmTest.cpp - the grouped GEMMs against per-expert host loops --===//
//
// Each form (x W_eᵀ, x W_e, the per-expert reduction A_eᵀ B_e) in f32 and
// bf16 operands, f32 and bf16 outputs, beta = 0 (outputs poisoned with NaN:
// nothing may read them) and beta != 0, against a double-precision loop over
// the experts' rows on the host. Loads are ragged (experts with no rows, one
// expert with most rows, counts just under / at / over the 128-row tile),
// sizes are not multiples of any tile (and some not of the 8-element copy
// chunk, which takes the element-wise path), offsets may start after row 0
// and end before the last row (those rows must stay untouched). Every output
// element is checked against a bound scaled by Σ|a·b|.
//
//===----------------------------------------------------------------------===//

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/kernels/cuda/routing/GroupedGemm.cuh"
#include "runtime/kernels/testing/CudaCompare.h"

namespace moec::runtime::cuda::routing {
namespace {

uint16_t toBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000)
    return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float fromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// A host matrix of values representable in `dtype`, and its device copy.
struct Buffer {
  plan::DType dtype = plan::F32;
  std::vector<float> host;
  void *device = nullptr;

  Buffer(plan::DType type, std::vector<float> values) : dtype(type), host(std::move(values)) {
    if (dtype == plan::BF16)
      for (float &v : host)
        v = fromBf16(toBf16(v));
    size_t bytes = std::max<size_t>(host.size() * size(), 1);
    EXPECT_EQ(cudaMalloc(&device, bytes), cudaSuccess);
    upload();
  }
  Buffer(const Buffer &) = delete;
  ~Buffer() { cudaFree(device); }

  size_t size() const { return dtype == plan::BF16 ? 2 : 4; }
  void upload() {
    if (dtype == plan::F32) {
      cudaMemcpy(device, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
      return;
    }
    std::vector<uint16_t> half(host.size());
    for (size_t i = 0; i < host.size(); ++i)
      half[i] = toBf16(host[i]);
    cudaMemcpy(device, half.data(), half.size() * 2, cudaMemcpyHostToDevice);
  }
  std::vector<float> download() const {
    std::vector<float> out(host.size());
    if (dtype == plan::F32) {
      cudaMemcpy(out.data(), device, out.size() * 4, cudaMemcpyDeviceToHost);
    } else {
      std::vector<uint16_t> half(host.size());
      cudaMemcpy(half.data(), device, half.size() * 2, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < half.size(); ++i)
        out[i] = fromBf16(half[i]);
    }
    return out;
  }
};

std::vector<float> randomFloats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float &x : v)
    x = u(rng);
  return v;
}

enum Form { RowsNT, RowsNN, Reduce };

struct Case {
  Form form = RowsNT;
  plan::DType ab = plan::BF16, c = plan::F32;
  std::vector<int64_t> counts;
  int64_t first = 0, totalRows = 0; // rows of the buffers; expert rows start at `first`
  int64_t m = 0, n = 0, k = 0;      // row forms: n, k (m per expert); Reduce: m, n
  int64_t pad = 0;                  // extra elements per row of every operand
  float alpha = 1, beta = 0;
  uint64_t seed = 1;
};

std::string describe(const Case &c) {
  std::ostringstream s;
  s << (c.form == RowsNT ? "x W_eT" : c.form == RowsNN ? "x W_e" : "A_eT B_e")
    << (c.ab == plan::BF16 ? " bf16" : " f32") << " -> " << (c.c == plan::BF16 ? "bf16" : "f32")
    << " m=" << c.m << " n=" << c.n << " k=" << c.k << " pad=" << c.pad << " alpha=" << c.alpha
    << " beta=" << c.beta << " first=" << c.first << " rows=" << c.totalRows << " counts=[";
  for (size_t e = 0; e < c.counts.size(); ++e)
    s << (e ? "," : "") << c.counts[e];
  return s.str() + "]";
}

void run(Case c) {
  std::string why;
  if (!testing::cudaDeviceAvailable(&why))
    GTEST_SKIP() << why;
  SCOPED_TRACE(describe(c));
  int64_t experts = static_cast<int64_t>(c.counts.size());
  std::vector<int64_t> offsets(experts + 1, c.first);
  for (int64_t e = 0; e < experts; ++e)
    offsets[e + 1] = offsets[e] + c.counts[e];
  int64_t used = offsets[experts] - c.first;
  if (c.totalRows < offsets[experts])
    c.totalRows = offsets[experts];

  // Operand shapes (row-major, each row padded by `pad`).
  bool rows = c.form != Reduce;
  int64_t aCols = rows ? c.k : c.m;
  int64_t bRows = rows ? (c.form == RowsNT ? c.n : c.k) : c.totalRows;
  int64_t bCols = rows ? (c.form == RowsNT ? c.k : c.n) : c.n;
  int64_t bStride = rows ? bRows * (bCols + c.pad) : 0;
  int64_t cRows = rows ? c.totalRows : c.m, cCols = c.n;
  int64_t cStride = rows ? 0 : cRows * (cCols + c.pad);
  int64_t lda = aCols + c.pad, ldb = bCols + c.pad, ldc = cCols + c.pad;
  int64_t bCount = rows ? experts : 1, cCount = rows ? 1 : experts;

  // Rows no expert owns and the rows' padding hold NaN: kernels may read them (TMA copies
  // whole 128-row boxes) but nothing they hold may reach an output.
  auto poisonUnowned = [&](std::vector<float> values, int64_t cols, int64_t ld) {
    for (int64_t r = 0; r < static_cast<int64_t>(values.size()) / ld; ++r)
      for (int64_t q = 0; q < ld; ++q)
        if (r < offsets[0] || r >= offsets[experts] || q >= cols)
          values[r * ld + q] = NAN;
    return values;
  };
  Buffer a(c.ab, poisonUnowned(randomFloats(c.totalRows * lda, c.seed), aCols, lda));
  Buffer b(c.ab, rows ? randomFloats(bCount * bRows * ldb, c.seed + 1)
                      : poisonUnowned(randomFloats(bCount * bRows * ldb, c.seed + 1), bCols, ldb));
  std::vector<float> cInit = c.beta == 0 ? std::vector<float>(cCount * cRows * ldc, NAN)
                                         : randomFloats(cCount * cRows * ldc, c.seed + 2);
  Buffer out(c.c, cInit);
  // What the output held: untouched elements (padding, rows of no expert) must keep it.
  std::vector<float> before = out.host;

  int64_t *dOffsets = nullptr;
  ASSERT_EQ(cudaMalloc(&dOffsets, offsets.size() * sizeof(int64_t)), cudaSuccess);
  cudaMemcpy(dOffsets, offsets.data(), offsets.size() * sizeof(int64_t), cudaMemcpyHostToDevice);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  KernelContext ctx;
  ctx.kernel = "grouped_gemm_test";
  ctx.stream = stream;
  // The row bound may exceed the rows the experts own (it only sizes the grid).
  ExpertRows g{dOffsets, experts, c.totalRows};
  if (rows)
    groupedGemm(ctx, g, c.n, c.k, c.alpha, a.device, lda, b.device, ldb, bStride,
                c.form == RowsNT, c.ab, c.beta, out.device, ldc, c.c);
  else
    groupedGemmReduce(ctx, g, c.m, c.n, c.alpha, a.device, lda, b.device, ldb, c.ab, c.beta,
                      out.device, ldc, cStride, c.c);
  cudaError_t error = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cudaFree(dOffsets);
  ASSERT_EQ(error, cudaSuccess) << cudaGetErrorString(error);
  std::vector<float> got = out.download();

  // Expected values and a per-element bound: f32 accumulation over K terms,
  // plus the output's rounding when it is bf16.
  std::vector<double> want(before.begin(), before.end());
  std::vector<double> scale(before.size(), 0.0);
  std::vector<bool> written(before.size(), false);
  auto product = [&](int64_t e, int64_t i, int64_t j, double &sum, double &abs) {
    sum = abs = 0;
    if (rows) { // i: absolute row, j: column of the output
      int64_t kk = c.k;
      for (int64_t q = 0; q < kk; ++q) {
        double x = a.host[i * lda + q];
        double w = c.form == RowsNT ? b.host[e * bStride + j * ldb + q]
                                    : b.host[e * bStride + q * ldb + j];
        sum += x * w;
        abs += std::abs(x * w);
      }
    } else { // i: row of C_e, j: column
      for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) {
        double x = a.host[r * lda + i], y = b.host[r * ldb + j];
        sum += x * y;
        abs += std::abs(x * y);
      }
    }
  };
  for (int64_t e = 0; e < experts; ++e) {
    int64_t iBegin = rows ? offsets[e] : 0, iEnd = rows ? offsets[e + 1] : c.m;
    for (int64_t i = iBegin; i < iEnd; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        size_t at = static_cast<size_t>(rows ? i * ldc + j : e * cStride + i * ldc + j);
        double sum, abs;
        product(e, i, j, sum, abs);
        double old = c.beta == 0 ? 0.0 : before[at];
        want[at] = c.alpha * sum + c.beta * old;
        scale[at] = std::abs(c.alpha) * abs + std::abs(c.beta * old);
        written[at] = true;
      }
  }
  double outRounding = c.c == plan::BF16 ? 1.0 / 256 : 0.0;
  int64_t bad = 0;
  std::ostringstream firstBad;
  for (size_t at = 0; at < got.size(); ++at) {
    bool ok;
    if (!written[at]) {
      ok = std::isnan(before[at]) ? std::isnan(got[at]) : got[at] == before[at];
    } else {
      double bound = 2e-6 * scale[at] + outRounding * std::abs(want[at]) + 1e-30;
      ok = std::isfinite(got[at]) && std::abs(got[at] - want[at]) <= bound;
    }
    if (!ok && bad++ == 0)
      firstBad << "element " << at << (written[at] ? " (written)" : " (must stay untouched)")
               << ": got " << got[at] << ", want " << want[at] << ", scale " << scale[at];
  }
  EXPECT_EQ(bad, 0) << bad << " of " << got.size() << " elements wrong; first: " << firstBad.str()
                    << " (rows owned: " << used << ")";
}

/// Ragged loads: empty experts, one over a tile, ones at 127 / 128 / 129 rows.
const std::vector<int64_t> kRagged = {0, 300, 0, 5, 1, 0, 129, 128, 127, 0, 2};
/// One expert holding most rows, the others nearly empty.
const std::vector<int64_t> kSkewed = {3, 0, 0, 517, 1, 0, 0, 0};

std::vector<int64_t> zipfCounts(int64_t experts, int64_t rows, uint64_t seed) {
  std::vector<double> weights(experts);
  for (int64_t e = 0; e < experts; ++e)
    weights[e] = 1.0 / std::pow(static_cast<double>(e + 1), 1.3);
  std::mt19937_64 rng(seed);
  std::discrete_distribution<int64_t> pick(weights.begin(), weights.end());
  std::vector<int64_t> counts(experts, 0);
  for (int64_t r = 0; r < rows; ++r)
    ++counts[pick(rng)];
  return counts;
}

/// (n, k): copy-chunk multiples (the cp.async path) with partial tiles,
/// sizes not multiples of 8 (the element-wise path), tiny ones. Reduce uses
/// k as its m (C_e [k, n]).
struct Shape {
  int64_t n, k;
};
const std::vector<Shape> kShapes = {{100, 72}, {72, 100}, {136, 264}, {5, 3}, {264, 40}, {8, 16}};

void runAll(Form form, plan::DType ab, plan::DType cType) {
  uint64_t seed = 1;
  for (const Shape &s : kShapes)
    for (const auto &counts : {kRagged, kSkewed}) {
      Case c;
      c.form = form;
      c.ab = ab;
      c.c = cType;
      c.counts = counts;
      c.n = s.n;
      if (form == Reduce)
        c.m = s.k; // C_e [k, n]: a weight gradient [out, in] or [in, out]
      else
        c.k = s.k;
      c.seed = seed++;
      run(c);
      if (::testing::Test::HasFatalFailure() || ::testing::Test::IsSkipped())
        return;
      // Accumulating, with a scale.
      c.alpha = 0.5f;
      c.beta = 1.0f;
      c.seed = seed++;
      run(c);
      c.alpha = 2.0f;
      c.beta = -0.75f;
      c.seed = seed++;
      run(c);
    }
}

TEST(GroupedGemm, XWeightTransposedBf16F32Out) { runAll(RowsNT, plan::BF16, plan::F32); }
TEST(GroupedGemm, XWeightTransposedBf16Bf16Out) { runAll(RowsNT, plan::BF16, plan::BF16); }
TEST(GroupedGemm, XWeightTransposedF32) { runAll(RowsNT, plan::F32, plan::F32); }
TEST(GroupedGemm, XWeightBf16F32Out) { runAll(RowsNN, plan::BF16, plan::F32); }
TEST(GroupedGemm, XWeightBf16Bf16Out) { runAll(RowsNN, plan::BF16, plan::BF16); }
TEST(GroupedGemm, XWeightF32) { runAll(RowsNN, plan::F32, plan::F32); }
TEST(GroupedGemm, ReduceBf16F32Out) { runAll(Reduce, plan::BF16, plan::F32); }
TEST(GroupedGemm, ReduceBf16Bf16Out) { runAll(Reduce, plan::BF16, plan::BF16); }
TEST(GroupedGemm, ReduceF32) { runAll(Reduce, plan::F32, plan::F32); }

/// Hundreds of experts (the wgmma kernel's tile search scans the offsets 32 experts at a time),
/// Zipf loads: a few experts with most rows, many with none.
TEST(GroupedGemm, ManyExperts) {
  uint64_t seed = 700;
  for (int64_t experts : {512, 600})
    for (Form form : {RowsNT, RowsNN}) {
      Case c;
      c.form = form;
      c.ab = plan::BF16;
      c.c = plan::BF16;
      c.counts = zipfCounts(experts, 4000, seed);
      c.n = 136;
      c.k = 264;
      c.seed = seed++;
      run(c);
      if (HasFatalFailure() || IsSkipped())
        return;
    }
}

/// Offsets starting after row 0 and ending before the last row, row strides
/// wider than the rows (padding that must stay untouched), and a grid bound
/// above the rows the experts own.
TEST(GroupedGemm, OffsetsInsideTheBuffersAndPaddedRows) {
  for (Form form : {RowsNT, RowsNN, Reduce})
    for (plan::DType ab : {plan::BF16, plan::F32})
      for (int64_t pad : {8, 3}) {
        Case c;
        c.form = form;
        c.ab = ab;
        c.counts = {40, 0, 200, 7};
        c.first = 13;
        c.totalRows = 13 + 247 + 30;
        c.n = 136;
        c.k = form == Reduce ? 0 : 96;
        c.m = form == Reduce ? 96 : 0;
        c.pad = pad;
        c.beta = pad == 8 ? 0.0f : 1.0f;
        c.seed = 500 + pad;
        run(c);
        if (HasFatalFailure() || IsSkipped())
          return;
      }
}

/// Many experts with Zipf-skewed loads (most get a few rows, some none).
TEST(GroupedGemm, ZipfLoadsOver64Experts) {
  for (Form form : {RowsNT, RowsNN, Reduce})
    for (plan::DType ab : {plan::BF16, plan::F32}) {
      Case c;
      c.form = form;
      c.ab = ab;
      c.counts = zipfCounts(64, 1500, 7);
      c.n = 72;
      c.k = form == Reduce ? 0 : 200;
      c.m = form == Reduce ? 200 : 0;
      c.seed = 900;
      run(c);
      if (HasFatalFailure() || IsSkipped())
        return;
    }
}

/// Every expert empty but the last; no rows at all (nothing to write).
TEST(GroupedGemm, EmptyExperts) {
  for (Form form : {RowsNT, Reduce})
    for (std::vector<int64_t> counts :
         {std::vector<int64_t>{0, 0, 0, 0, 9}, std::vector<int64_t>{0, 0, 0}}) {
      Case c;
      c.form = form;
      c.ab = plan::BF16;
      c.counts = counts;
      c.totalRows = 9;
      c.n = 24;
      c.k = form == Reduce ? 0 : 32;
      c.m = form == Reduce ? 32 : 0;
      c.seed = 1200;
      run(c);
      if (HasFatalFailure() || IsSkipped())
        return;
    }
}

} // namespace
} // namespace moec::runtime::cuda::routing
