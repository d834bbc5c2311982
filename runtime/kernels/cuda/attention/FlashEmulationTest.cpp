//===- FlashEmulationTest.cpp - Flash.cu's kernels, emulated on the CPU ---===//
//
// Runs the bf16 fast path of the attention core (flashForward and
// flashBackward: their launches, the kernels, the dK/dV slices) under
// FlashEmulation.h, which gives every CUDA thread a coroutine and
// ldmatrix / mma.sync / cp.async their PTX semantics, against the
// double-precision reference of cpu/attention/Reference.h. No GPU needed, so
// this runs in CI; the GPU comparison tests (attention_test) check the real
// thing. Shapes stay small: every thread of every block is emulated.
//
//===----------------------------------------------------------------------===//

#define MOEC_FLASH_EMULATION
#include "runtime/kernels/cuda/attention/Flash.cu"

#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "runtime/kernels/cpu/attention/Reference.h"

namespace moec::runtime::cuda::attention {

// Common.cu's and Dense.cu's host pieces that the fast path calls, on the CPU.
Scratch::~Scratch() {
  for (void *p : buffers)
    std::free(p);
}
void *Scratch::bytes(size_t n) {
  const size_t size = (std::max<size_t>(n, 16) + 255) / 256 * 256;
  void *p = std::aligned_alloc(256, size);
  std::memset(p, 0xff, size); // NaN: reading what no kernel wrote shows
  buffers.push_back(p);
  return p;
}
size_t maxSharedBytes(const KernelContext &) { return emulation::kSharedBytes; }
void reduceSinks(const KernelContext &, const float *part, int64_t rows, int heads, FloatOut out) {
  for (int h = 0; h < heads; ++h) {
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r)
      sum += part[r * heads + h];
    st(out, h, static_cast<float>(sum));
  }
}

namespace {

namespace ref = cpu::attention::reference;
using emulation::CopyMode;

/// A float tensor stored as bf16 or f32 on the "device" (host memory here).
struct Buffer {
  bool bf16 = true;
  std::vector<__nv_bfloat16> h;
  std::vector<float> f;

  Buffer(int64_t n, bool isBf16) : bf16(isBf16) {
    if (bf16)
      h.assign(static_cast<size_t>(n), __float2bfloat16(NAN));
    else
      f.assign(static_cast<size_t>(n), NAN);
  }
  void *data() { return bf16 ? static_cast<void *>(h.data()) : static_cast<void *>(f.data()); }
  float at(int64_t i) const { return bf16 ? __bfloat162float(h[i]) : f[i]; }
  int64_t size() const { return bf16 ? static_cast<int64_t>(h.size()) : static_cast<int64_t>(f.size()); }
  FloatIn in() { return FloatIn{data(), bf16 ? 1 : 0}; }
  FloatOut out() { return FloatOut{data(), bf16 ? 1 : 0}; }
};

Buffer randomBuffer(int64_t n, uint64_t seed, float scale = 1.0f) {
  Buffer b(n, true);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (auto &x : b.h)
    x = __float2bfloat16(u(rng));
  return b;
}

struct Case {
  int d, heads, kvHeads, len, seqs, window;
  bool sinks;
  int headsPerBlock = 0; // 0: the launch's own choice
  bool f32Out = false;
  CopyMode mode = CopyMode::Eager;
  bool dq = true, dk = true, dv = true;
  const char *tiles = nullptr; // query-tile kernels' shape (MOEC_ATTENTION_*_TILES); null: default
};

std::string nameOf(const Case &c) {
  std::ostringstream os;
  os << "d" << c.d << " H" << c.heads << " KV" << c.kvHeads << " L" << c.len << " x" << c.seqs
     << " window " << c.window << (c.sinks ? " sinks" : "") << " heads/block " << c.headsPerBlock
     << (c.f32Out ? " f32 out" : " bf16 out") << (c.mode == CopyMode::Lazy ? " lazy copies" : "")
     << (c.tiles ? std::string(" tiles ") + c.tiles : "");
  return os.str();
}

void PrintTo(const Case &c, std::ostream *os) { *os << nameOf(c); }

/// Every element finite; ||got - want|| <= tol ||want|| over all, and per block
/// of `block` consecutive elements (one head of one row) against
/// max(||want||_block, the average block norm / 10). Errors up to 1e-5 pass
/// (rounding noise where the exact value is 0: a window of 1 gives dq = 0).
void expectClose(const Buffer &got, const std::vector<double> &want, int64_t block, double tol,
                 const std::string &what) {
  ASSERT_EQ(got.size(), static_cast<int64_t>(want.size())) << what;
  const int64_t n = got.size(), blocks = n / block;
  constexpr double kNoise = 1e-5;
  double diff = 0, norm = 0, worst = 0;
  int64_t nonFinite = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = got.at(i);
    nonFinite += !std::isfinite(g);
    diff += (g - want[i]) * (g - want[i]);
    norm += want[i] * want[i];
    worst = std::max(worst, std::abs(g - want[i]));
  }
  ASSERT_EQ(nonFinite, 0) << what << ": elements never written (NaN poison) or not finite";
  if (worst > kNoise) {
    EXPECT_LE(std::sqrt(diff), tol * std::sqrt(norm))
        << what << ": relative error " << std::sqrt(diff / norm);
  }
  const double floor = std::sqrt(norm / static_cast<double>(blocks)) / 10;
  int reported = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    double bd = 0, bn = 0, bw = 0;
    for (int64_t i = b * block; i < (b + 1) * block; ++i) {
      bd += (got.at(i) - want[i]) * (got.at(i) - want[i]);
      bn += want[i] * want[i];
      bw = std::max(bw, std::abs(got.at(i) - want[i]));
    }
    const double scale = std::max(std::sqrt(bn), floor);
    if (bw > kNoise && std::sqrt(bd) > 2 * tol * scale && reported++ < 5)
      ADD_FAILURE() << what << ": block " << b << " (of " << block << " elements) error "
                    << std::sqrt(bd) << " vs norm " << std::sqrt(bn);
  }
}

class FlashEmulationTest : public ::testing::TestWithParam<Case> {
protected:
  void SetUp() override {
    const Case &c = GetParam();
    tokens = static_cast<int64_t>(c.len) * c.seqs;
    q = randomBuffer(tokens * c.heads * c.d, 1);
    k = randomBuffer(tokens * c.kvHeads * c.d, 2);
    v = randomBuffer(tokens * c.kvHeads * c.d, 3);
    dO = randomBuffer(tokens * c.heads * c.d, 4);
    sinks = randomBuffer(c.heads, 5, 1.5f);
    if (c.headsPerBlock > 0)
      setenv("MOEC_ATTENTION_HEADS_PER_BLOCK", std::to_string(c.headsPerBlock).c_str(), 1);
    else
      unsetenv("MOEC_ATTENTION_HEADS_PER_BLOCK");
    emulation::state().mode = c.mode;
    for (const char *env : {"MOEC_ATTENTION_FORWARD_TILES", "MOEC_ATTENTION_DQ_TILES"})
      if (c.tiles)
        setenv(env, c.tiles, 1);
      else
        unsetenv(env);
  }
  void TearDown() override {
    unsetenv("MOEC_ATTENTION_FORWARD_TILES");
    unsetenv("MOEC_ATTENTION_DQ_TILES");
    unsetenv("MOEC_ATTENTION_HEADS_PER_BLOCK");
    emulation::state().mode = CopyMode::Eager;
  }

  AttnParams params() {
    const Case &c = GetParam();
    AttnParams P;
    P.L = c.len;
    P.B = c.seqs;
    P.H = c.heads;
    P.KV = c.kvHeads;
    P.group = c.heads / c.kvHeads;
    P.dA = c.d;
    P.dv = c.d;
    P.qA = Mat{q.in(), int64_t{c.heads} * c.d, c.d};
    P.kA = Mat{k.in(), int64_t{c.kvHeads} * c.d, c.d};
    P.v = Mat{v.in(), int64_t{c.kvHeads} * c.d, c.d};
    P.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
    P.window = c.window;
    if (c.sinks)
      P.sinks = sinks.in();
    return P;
  }

  /// Rows of sequence b, head `head` of a [tokens, heads * d] buffer, in double.
  ref::Mat slice(const Buffer &x, int heads, int b, int head) {
    const Case &c = GetParam();
    ref::Mat m(c.len, ref::Vec(c.d));
    for (int t = 0; t < c.len; ++t)
      for (int e = 0; e < c.d; ++e)
        m[t][e] = x.at((static_cast<int64_t>(b) * c.len + t) * heads * c.d + head * c.d + e);
    return m;
  }
  void scatter(std::vector<double> &into, const ref::Mat &m, int heads, int b, int head, bool add) {
    const Case &c = GetParam();
    for (int t = 0; t < c.len; ++t)
      for (int e = 0; e < c.d; ++e) {
        double &slot = into[(static_cast<int64_t>(b) * c.len + t) * heads * c.d + head * c.d + e];
        slot = add ? slot + m[t][e] : m[t][e];
      }
  }
  ref::Allowed allowed() {
    const int window = GetParam().window;
    return [window](int64_t t, int64_t s) { return s <= t && (window <= 0 || t - s < window); };
  }

  int64_t tokens = 0;
  Buffer q{0, true}, k{0, true}, v{0, true}, dO{0, true}, sinks{0, true};
  KernelContext ctx;
};

TEST_P(FlashEmulationTest, ForwardMatchesReference) {
  const Case &c = GetParam();
  AttnParams P = params();
  Buffer out(tokens * c.heads * c.d, !c.f32Out);
  P.out = OutMat{out.out(), int64_t{c.heads} * c.d, c.d};
  ASSERT_TRUE(flashFits(P, false));
  flashForward(ctx, P);

  std::vector<double> want(static_cast<size_t>(out.size()));
  const int group = c.heads / c.kvHeads;
  for (int b = 0; b < c.seqs; ++b)
    for (int h = 0; h < c.heads; ++h) {
      double sink = sinks.at(h);
      ref::Mat o = ref::attend(slice(q, c.heads, b, h), slice(k, c.kvHeads, b, h / group),
                               slice(v, c.kvHeads, b, h / group), P.scale, allowed(),
                               c.sinks ? &sink : nullptr);
      scatter(want, o, c.heads, b, h, false);
    }
  expectClose(out, want, c.d, 1e-2, nameOf(c) + " forward");
}

TEST_P(FlashEmulationTest, BackwardMatchesReference) {
  const Case &c = GetParam();
  AttnParams P = params();
  const int group = c.heads / c.kvHeads;
  P.dO = Mat{dO.in(), int64_t{c.heads} * c.d, c.d};
  Buffer dq(tokens * c.heads * c.d, !c.f32Out), dk(tokens * c.kvHeads * c.d, !c.f32Out),
      dv(tokens * c.kvHeads * c.d, !c.f32Out), dSinks(c.heads, false);
  if (c.dq)
    P.dqA = OutMat{dq.out(), int64_t{c.heads} * c.d, c.d};
  if (c.dk)
    P.dkA = OutMat{dk.out(), int64_t{c.kvHeads} * c.d, c.d};
  if (c.dv)
    P.dV = OutMat{dv.out(), int64_t{c.kvHeads} * c.d, c.d};
  ASSERT_TRUE(flashFits(P, true));
  {
    Scratch scratch(ctx);
    flashBackward(ctx, P, scratch, c.sinks ? dSinks.out() : FloatOut{});
  }

  std::vector<double> wantDq(static_cast<size_t>(dq.size())), wantDk(static_cast<size_t>(dk.size()), 0.0),
      wantDv(static_cast<size_t>(dv.size()), 0.0), wantSinks(static_cast<size_t>(c.heads), 0.0);
  for (int b = 0; b < c.seqs; ++b)
    for (int h = 0; h < c.heads; ++h) {
      const int g = h / group;
      double sink = sinks.at(h);
      ref::AttendGrads r = ref::attendBackward(slice(q, c.heads, b, h), slice(k, c.kvHeads, b, g),
                                               slice(v, c.kvHeads, b, g), P.scale, allowed(),
                                               c.sinks ? &sink : nullptr, slice(dO, c.heads, b, h));
      scatter(wantDq, r.dq, c.heads, b, h, false);
      scatter(wantDk, r.dk, c.kvHeads, b, g, true);
      scatter(wantDv, r.dv, c.kvHeads, b, g, true);
      wantSinks[h] += r.dsink;
    }
  const std::string what = nameOf(c);
  if (c.dq)
    expectClose(dq, wantDq, c.d, 2e-2, what + " dq");
  if (c.dk)
    expectClose(dk, wantDk, c.d, 2e-2, what + " dk");
  if (c.dv)
    expectClose(dv, wantDv, c.d, 2e-2, what + " dv");
  if (c.sinks)
    expectClose(dSinks, wantSinks, c.heads, 2e-2, what + " dsinks");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashEmulationTest,
    ::testing::Values(
        // MHA, one partial tile, two sequences; f32 and bf16 outputs.
        Case{64, 2, 2, 70, 2, 0, false},
        Case{64, 1, 1, 70, 1, 0, false, 0, true},
        // d = 128, sinks, a ragged length; copies landing only at their wait.
        Case{128, 2, 2, 33, 1, 0, true, 0, false, CopyMode::Lazy},
        // GQA 4:1 over several query / key tiles: partial dK/dV slices of 2 heads,
        // then one slice looping over the 4 heads (written directly).
        Case{64, 4, 1, 150, 1, 0, false, 2},
        Case{64, 4, 1, 150, 1, 0, false, 4, false, CopyMode::Lazy},
        // Sliding windows: narrower than a tile, wider than one, longer than the sequence.
        Case{64, 2, 1, 150, 1, 37, true, 1},
        Case{64, 2, 2, 200, 1, 90, false},
        Case{128, 2, 1, 60, 2, 300, true, 0, true},
        // Windows that end exactly at, just before and just after warp and tile edges.
        Case{64, 2, 1, 180, 1, 18, false, 1},
        Case{64, 2, 2, 160, 1, 17, true},
        Case{64, 1, 1, 200, 1, 65, false},
        Case{64, 2, 2, 40, 1, 1, false},
        // Single-token sequences; a subset of the gradients.
        Case{64, 2, 1, 1, 3, 0, true},
        Case{64, 4, 2, 40, 1, 0, false, 1, false, CopyMode::Eager, false, true, false},
        Case{64, 4, 2, 40, 1, 5, true, 2, false, CopyMode::Eager, true, false, true},
        // The other shapes of the query-tile kernels (32 queries per warp; 32 or 64 keys per tile).
        Case{64, 2, 1, 150, 2, 0, true, 0, false, CopyMode::Lazy, true, true, true, "32x32"},
        Case{64, 2, 1, 150, 2, 0, true, 0, false, CopyMode::Eager, true, true, true, "32x64"},
        Case{128, 2, 2, 100, 1, 37, false, 0, true, CopyMode::Eager, true, true, true, "32x32"},
        Case{128, 2, 2, 100, 1, 37, false, 0, true, CopyMode::Lazy, true, true, true, "32x64"},
        Case{64, 2, 2, 180, 1, 18, false, 0, false, CopyMode::Eager, true, true, true, "32x32"},
        Case{64, 2, 2, 40, 2, 1, true, 0, false, CopyMode::Eager, true, true, true, "32x64"}),
    [](const ::testing::TestParamInfo<Case> &info) { return "c" + std::to_string(info.index); });

TEST(FlashDispatchTest, FastPathOnlyForWhatItCovers) {
  std::vector<__nv_bfloat16> storage(4096);
  std::vector<float> f32(4096);
  auto base = [&] {
    AttnParams P;
    P.L = 8;
    P.B = 1;
    P.H = 4;
    P.KV = 2;
    P.group = 2;
    P.dA = P.dv = 64;
    P.qA = Mat{FloatIn{storage.data(), 1}, 256, 64};
    P.kA = Mat{FloatIn{storage.data(), 1}, 128, 64};
    P.v = Mat{FloatIn{storage.data(), 1}, 128, 64};
    P.dO = Mat{FloatIn{storage.data(), 1}, 256, 64};
    P.out = OutMat{FloatOut{f32.data(), 0}, 256, 64};
    P.scale = 0.125f;
    return P;
  };
  EXPECT_TRUE(flashFits(base(), false));
  EXPECT_TRUE(flashFits(base(), true));
  AttnParams P = base();
  P.qA.t = FloatIn{f32.data(), 0}; // f32 storage: the general kernels
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dA = P.dv = 96; // other head dims
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dv = 128; // value dim != head dim
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dB = 64; // MLA's second part
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.kA.t.p = storage.data() + 1; // rows not 16-byte aligned
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.v.ld = 132;
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dO.t = FloatIn{f32.data(), 0};
  EXPECT_TRUE(flashFits(P, false));
  EXPECT_FALSE(flashFits(P, true));
  P = base();
  P.scale = -0.125f;
  EXPECT_FALSE(flashFits(P, false));
  setenv("MOEC_ATTENTION_GENERAL", "1", 1);
  EXPECT_FALSE(flashFits(base(), false));
  unsetenv("MOEC_ATTENTION_GENERAL");
}

} // namespace
} // namespace moec::runtime::cuda::attention
