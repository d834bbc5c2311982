//===- FlashEmulationTest.cpp - Flash.cu's kernels, emulated on the CPU ---===//
//
// Runs the bf16 fast path of the attention core (flashForward and
// flashBackward: their launches, the kernels, the dK/dV slices) under
// FlashEmulation.h, which gives every CUDA thread a coroutine and
// ldmatrix / mma.sync / cp.async their PTX semantics, against the
// double-precision reference of cpu/attention/Reference.h. No GPU needed, so
// this runs in CI; the GPU comparison tests (attention_test, mla_test) check
// the real thing. Every head-dim pair the fast path covers (64, 128, 256,
// 192 with value 128, that one also in mla's two-part layout), with ragged
// lengths, GQA, windows, sinks, dK/dV slices and forced tile shapes. Shapes
// stay small: every thread of every block is emulated.
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
// The emulation covers the mma.sync kernels: FlashWgmma.cu's are never chosen here.
bool wgmmaDqFits(const AttnParams &) { return false; }
bool wgmmaDkDvFits(const AttnParams &) { return false; }
void wgmmaDq(const KernelContext &ctx, const AttnParams &, const float *, const float *, int64_t) {
  ctx.fail("flash_emulation_test: the wgmma dQ is not emulated");
}
void wgmmaDkDv(const KernelContext &ctx, const AttnParams &, const float *, const float *, int64_t, int, float *,
               float *, float *) {
  ctx.fail("flash_emulation_test: the wgmma dK/dV is not emulated");
}
// Only the single-pass wgmma backward zeroes its dQ sum.
void zeroFill(const KernelContext &ctx, FloatOut, int64_t) {
  ctx.fail("flash_emulation_test: zeroFill is only for the wgmma backward, not emulated");
}
// The cases here leave P.savedLse null: the backward runs the statistics variant of the forward.
void statisticsFromResult(const KernelContext &ctx, const AttnParams &, float *, float *, float *, bool,
                          int64_t, float) {
  ctx.fail("flash_emulation_test: statistics from a saved result are not emulated");
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
  int valueDim = 0;            // 0: d
  // > 0: query and key in two parts as mla lays them out: part A (the first
  // partA features) in the query / in key_value (whose value follows it),
  // part B in their own tensors, the key's shared by every kv head (head
  // stride 0); the gradients of the B parts in f32, as mla's scratch.
  int partA = 0;
};

int valueDimOf(const Case &c) { return c.valueDim > 0 ? c.valueDim : c.d; }

/// c with value dim dv and, when partA > 0, query and key in two parts.
Case shaped(Case c, int dv, int partA = 0) {
  c.valueDim = dv;
  c.partA = partA;
  return c;
}

std::string nameOf(const Case &c) {
  std::ostringstream os;
  os << "d" << c.d << " dv" << valueDimOf(c) << " H" << c.heads << " KV" << c.kvHeads << " L" << c.len
     << " x" << c.seqs << " window " << c.window << (c.sinks ? " sinks" : "") << " heads/block "
     << c.headsPerBlock << (c.f32Out ? " f32 out" : " bf16 out")
     << (c.mode == CopyMode::Lazy ? " lazy copies" : "") << (c.tiles ? std::string(" tiles ") + c.tiles : "")
     << (c.partA ? " parts " + std::to_string(c.partA) + "+" + std::to_string(c.d - c.partA) : "")
     << (c.dq ? "" : " no dq") << (c.dk ? "" : " no dk") << (c.dv ? "" : " no dv");
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

/// Columns [c0, c0 + n) of each head of a [rows, heads * width] buffer, as floats.
std::vector<float> columns(const Buffer &x, int64_t rows, int heads, int width, int c0, int n) {
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h)
      for (int e = 0; e < n; ++e)
        out.push_back(x.at((r * heads + h) * width + c0 + e));
  return out;
}

class FlashEmulationTest : public ::testing::TestWithParam<Case> {
protected:
  void SetUp() override {
    const Case &c = GetParam();
    tokens = static_cast<int64_t>(c.len) * c.seqs;
    dv = valueDimOf(c);
    q = randomBuffer(tokens * c.heads * c.d, 1);
    k = randomBuffer(tokens * c.kvHeads * c.d, 2);
    v = randomBuffer(tokens * c.kvHeads * dv, 3);
    dO = randomBuffer(tokens * c.heads * dv, 4);
    sinks = randomBuffer(c.heads, 5, 1.5f);
    if (c.partA > 0) {
      // The key's part B is one for all kv heads; q and k stay the reference's full view.
      const int a = c.partA, b = c.d - a;
      for (int64_t t = 0; t < tokens; ++t)
        for (int g = 1; g < c.kvHeads; ++g)
          for (int e = a; e < c.d; ++e)
            k.h[(t * c.kvHeads + g) * c.d + e] = k.h[t * c.kvHeads * c.d + e];
      qB = Buffer(tokens * c.heads * b, true);
      kB = Buffer(tokens * b, true);
      kv = Buffer(tokens * c.kvHeads * (a + dv), true);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int h = 0; h < c.heads; ++h)
          for (int e = 0; e < b; ++e)
            qB.h[(t * c.heads + h) * b + e] = q.h[(t * c.heads + h) * c.d + a + e];
        for (int e = 0; e < b; ++e)
          kB.h[t * b + e] = k.h[t * c.kvHeads * c.d + a + e];
        for (int g = 0; g < c.kvHeads; ++g) {
          for (int e = 0; e < a; ++e)
            kv.h[(t * c.kvHeads + g) * (a + dv) + e] = k.h[(t * c.kvHeads + g) * c.d + e];
          for (int e = 0; e < dv; ++e)
            kv.h[(t * c.kvHeads + g) * (a + dv) + a + e] = v.h[(t * c.kvHeads + g) * dv + e];
        }
      }
    }
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
    P.dv = dv;
    P.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
    P.window = c.window;
    if (c.sinks)
      P.sinks = sinks.in();
    if (c.partA == 0) {
      P.dA = c.d;
      P.qA = Mat{q.in(), int64_t{c.heads} * c.d, c.d};
      P.kA = Mat{k.in(), int64_t{c.kvHeads} * c.d, c.d};
      P.v = Mat{v.in(), int64_t{c.kvHeads} * dv, dv};
      return P;
    }
    const int a = c.partA, b = c.d - a;
    P.dA = a;
    P.dB = b;
    P.qA = Mat{q.in(), int64_t{c.heads} * c.d, c.d};
    P.qB = Mat{qB.in(), int64_t{c.heads} * b, b};
    P.kA = Mat{kv.in(), int64_t{c.kvHeads} * (a + dv), a + dv};
    P.kB = Mat{kB.in(), b, 0};
    P.v = Mat{FloatIn{kv.h.data() + a, 1}, int64_t{c.kvHeads} * (a + dv), a + dv};
    return P;
  }

  /// Rows of sequence b, head `head` of a [tokens, heads * width] buffer, in double.
  ref::Mat slice(const Buffer &x, int heads, int b, int head, int width) {
    const Case &c = GetParam();
    ref::Mat m(c.len, ref::Vec(width));
    for (int t = 0; t < c.len; ++t)
      for (int e = 0; e < width; ++e)
        m[t][e] = x.at((static_cast<int64_t>(b) * c.len + t) * heads * width + head * width + e);
    return m;
  }
  void scatter(std::vector<double> &into, const ref::Mat &m, int heads, int b, int head, int width,
               bool add) {
    const Case &c = GetParam();
    for (int t = 0; t < c.len; ++t)
      for (int e = 0; e < width; ++e) {
        double &slot = into[(static_cast<int64_t>(b) * c.len + t) * heads * width + head * width + e];
        slot = add ? slot + m[t][e] : m[t][e];
      }
  }
  ref::Allowed allowed() {
    const int window = GetParam().window;
    return [window](int64_t t, int64_t s) { return s <= t && (window <= 0 || t - s < window); };
  }

  int64_t tokens = 0;
  int dv = 0;
  Buffer q{0, true}, k{0, true}, v{0, true}, dO{0, true}, sinks{0, true};
  Buffer qB{0, true}, kB{0, true}, kv{0, true}; // the two-part layout (partA > 0)
  KernelContext ctx;
};

TEST_P(FlashEmulationTest, ForwardMatchesReference) {
  const Case &c = GetParam();
  AttnParams P = params();
  Buffer out(tokens * c.heads * dv, !c.f32Out);
  P.out = OutMat{out.out(), int64_t{c.heads} * dv, dv};
  ASSERT_TRUE(flashFits(P, false));
  flashForward(ctx, P);

  std::vector<double> want(static_cast<size_t>(out.size()));
  const int group = c.heads / c.kvHeads;
  for (int b = 0; b < c.seqs; ++b)
    for (int h = 0; h < c.heads; ++h) {
      double sink = sinks.at(h);
      ref::Mat o = ref::attend(slice(q, c.heads, b, h, c.d), slice(k, c.kvHeads, b, h / group, c.d),
                               slice(v, c.kvHeads, b, h / group, dv), P.scale, allowed(),
                               c.sinks ? &sink : nullptr);
      scatter(want, o, c.heads, b, h, dv, false);
    }
  expectClose(out, want, dv, 1e-2, nameOf(c) + " forward");
}

TEST_P(FlashEmulationTest, BackwardMatchesReference) {
  const Case &c = GetParam();
  AttnParams P = params();
  const int group = c.heads / c.kvHeads, a = c.partA, b = c.d - c.partA;
  P.dO = Mat{dO.in(), int64_t{c.heads} * dv, dv};
  Buffer dq(tokens * c.heads * c.d, !c.f32Out), dk(tokens * c.kvHeads * c.d, !c.f32Out),
      dvb(tokens * c.kvHeads * dv, !c.f32Out), dSinks(c.heads, false);
  // The two-part layout: dq's part A in a [T, H * d] tensor (its B columns stay
  // unwritten), part B in f32 [T, H * b]; dk's part A and dv in [T, KV * (a + dv)], dk's part
  // B in f32 [T, KV * b].
  Buffer dqB(a ? tokens * c.heads * b : 0, false), dkv(a ? tokens * c.kvHeads * (a + dv) : 0, !c.f32Out),
      dkB(a ? tokens * c.kvHeads * b : 0, false);
  if (a == 0) {
    if (c.dq)
      P.dqA = OutMat{dq.out(), int64_t{c.heads} * c.d, c.d};
    if (c.dk)
      P.dkA = OutMat{dk.out(), int64_t{c.kvHeads} * c.d, c.d};
    if (c.dv)
      P.dV = OutMat{dvb.out(), int64_t{c.kvHeads} * dv, dv};
  } else {
    const int64_t ldkv = int64_t{c.kvHeads} * (a + dv);
    if (c.dq) {
      P.dqA = OutMat{dq.out(), int64_t{c.heads} * c.d, c.d};
      P.dqB = OutMat{dqB.out(), int64_t{c.heads} * b, b};
    }
    if (c.dk) {
      P.dkA = OutMat{dkv.out(), ldkv, a + dv};
      P.dkB = OutMat{dkB.out(), int64_t{c.kvHeads} * b, b};
    }
    if (c.dv)
      P.dV = OutMat{FloatOut{c.f32Out ? static_cast<void *>(dkv.f.data() + a)
                                      : static_cast<void *>(dkv.h.data() + a),
                             c.f32Out ? 0 : 1},
                    ldkv, a + dv};
  }
  ASSERT_TRUE(flashFits(P, true));
  {
    Scratch scratch(ctx);
    flashBackward(ctx, P, scratch, c.sinks ? dSinks.out() : FloatOut{});
  }

  std::vector<double> wantDq(static_cast<size_t>(dq.size())), wantDk(static_cast<size_t>(dk.size()), 0.0),
      wantDv(static_cast<size_t>(dvb.size()), 0.0), wantSinks(static_cast<size_t>(c.heads), 0.0);
  for (int s = 0; s < c.seqs; ++s)
    for (int h = 0; h < c.heads; ++h) {
      const int g = h / group;
      double sink = sinks.at(h);
      ref::AttendGrads r = ref::attendBackward(
          slice(q, c.heads, s, h, c.d), slice(k, c.kvHeads, s, g, c.d), slice(v, c.kvHeads, s, g, dv),
          P.scale, allowed(), c.sinks ? &sink : nullptr, slice(dO, c.heads, s, h, dv));
      scatter(wantDq, r.dq, c.heads, s, h, c.d, false);
      scatter(wantDk, r.dk, c.kvHeads, s, g, c.d, true);
      scatter(wantDv, r.dv, c.kvHeads, s, g, dv, true);
      wantSinks[h] += r.dsink;
    }
  if (a > 0) {
    // Reassemble the parts as [T, heads * d] (and [T, KV * dv]) floats.
    auto join = [&](const Buffer &partA, int widthA, const Buffer &partB, int heads) {
      Buffer full(tokens * heads * c.d, false);
      const std::vector<float> lo = columns(partA, tokens, heads, widthA, 0, a),
                               hi = columns(partB, tokens, heads, b, 0, b);
      for (int64_t i = 0; i < tokens * heads; ++i) {
        std::copy_n(lo.begin() + i * a, a, full.f.begin() + i * c.d);
        std::copy_n(hi.begin() + i * b, b, full.f.begin() + i * c.d + a);
      }
      return full;
    };
    if (c.dq) {
      // The kernels write part A of dq and nothing of its B columns (mla's q_pe slots).
      const std::vector<float> untouched = columns(dq, tokens, c.heads, c.d, a, b);
      EXPECT_TRUE(std::all_of(untouched.begin(), untouched.end(), [](float x) { return std::isnan(x); }))
          << nameOf(c) << ": dq written past its part A";
      dq = join(dq, c.d, dqB, c.heads);
    }
    if (c.dk)
      dk = join(dkv, a + dv, dkB, c.kvHeads);
    if (c.dv) {
      dvb = Buffer(tokens * c.kvHeads * dv, false);
      dvb.f = columns(dkv, tokens, c.kvHeads, a + dv, a, dv);
    }
  }
  const std::string what = nameOf(c);
  if (c.dq)
    expectClose(dq, wantDq, c.d, 2e-2, what + " dq");
  if (c.dk)
    expectClose(dk, wantDk, c.d, 2e-2, what + " dk");
  if (c.dv)
    expectClose(dvb, wantDv, dv, 2e-2, what + " dv");
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
        Case{64, 2, 2, 40, 2, 1, true, 0, false, CopyMode::Eager, true, true, true, "32x64"},
        // Head dim 256 (Qwen3-Next): 32-key tiles in the forward and dQ, warp pairs of 64-key
        // blocks in dK/dV. Ragged lengths over several tiles of each; sinks; lazy copies.
        Case{256, 2, 1, 100, 1, 0, true, 0, false, CopyMode::Lazy},
        Case{256, 2, 2, 257, 1, 0, false, 0, true},
        // GQA 8:1: dK/dV partials per head (the launch's choice here), then all 8 heads in one block.
        Case{256, 8, 1, 70, 1, 0, false},
        Case{256, 8, 1, 70, 1, 0, true, 8, false, CopyMode::Lazy},
        // Single tokens; windows inside, at and across the 64-key blocks, with slices of 2 heads.
        Case{256, 2, 1, 1, 3, 0, true},
        Case{256, 4, 2, 150, 1, 37, true, 2},
        Case{256, 2, 2, 130, 1, 64, false, 0, true},
        Case{256, 4, 1, 90, 2, 1, true, 2},
        // Subsets of the gradients (with dK/dV slices); the forward's spilling 16x64 shape, and
        // shapes that do not fit d = 256 (32 queries per warp), which fall back to the defaults.
        Case{256, 4, 2, 70, 1, 0, true, 1, false, CopyMode::Eager, false, true, false},
        Case{256, 4, 2, 70, 1, 20, false, 1, false, CopyMode::Lazy, true, false, true},
        Case{256, 2, 1, 100, 1, 0, false, 0, false, CopyMode::Lazy, true, true, true, "16x64"},
        Case{256, 2, 2, 80, 1, 0, true, 0, true, CopyMode::Eager, true, true, true, "32x64"},
        // Head dim 192, value dim 128 (MLA's shapes) in one part ...
        shaped(Case{192, 4, 2, 100, 1, 0, true, 0, false, CopyMode::Lazy}, 128),
        shaped(Case{192, 2, 1, 257, 1, 50, false, 0, true}, 128),
        shaped(Case{192, 4, 1, 70, 2, 0, false, 2, false, CopyMode::Eager, true, true, true, "16x64"}, 128),
        // ... and as mla lays it out: 128 + 64 features, the key's rope part shared by every head.
        shaped(Case{192, 4, 4, 100, 2, 0, false, 0, false, CopyMode::Lazy}, 128, 128),
        shaped(Case{192, 2, 2, 257, 1, 0, false, 0, true}, 128, 128),
        shaped(Case{192, 4, 2, 70, 1, 30, true, 1, false, CopyMode::Lazy}, 128, 128),
        shaped(Case{192, 2, 2, 1, 2, 0, false}, 128, 128),
        shaped(Case{192, 2, 2, 60, 1, 0, false, 0, false, CopyMode::Eager, false, true, false, "32x32"}, 128,
               128),
        shaped(Case{192, 2, 2, 60, 1, 0, false, 0, true, CopyMode::Eager, true, false, true}, 128, 128),
        // Parts split elsewhere (64 + 128).
        shaped(Case{192, 2, 2, 40, 1, 0, true}, 128, 64)),
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
  for (int d : {128, 256}) { // the other head dims of the fast path
    P = base();
    P.dA = P.dv = d;
    EXPECT_TRUE(flashFits(P, false)) << d;
  }
  P = base();
  P.dA = P.dv = 96; // other head dims
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dv = 128; // value dim != head dim, except 192 / 128
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dA = 192, P.dv = 128;
  EXPECT_TRUE(flashFits(P, true));
  P.dv = 192;
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dA = 256, P.dv = 128;
  EXPECT_FALSE(flashFits(P, false));
  P = base();
  P.dB = 64; // a second part: only for MLA's 128 + 64 (or another split of 192) with value 128
  EXPECT_FALSE(flashFits(P, false));
  P.qB = Mat{FloatIn{storage.data(), 1}, 256, 64};
  P.kB = Mat{FloatIn{storage.data(), 1}, 64, 0};
  EXPECT_FALSE(flashFits(P, false));
  P.dA = 128, P.dv = 128;
  EXPECT_TRUE(flashFits(P, false));
  P.dA = 124, P.dB = 68; // parts of multiples of 8 features only
  EXPECT_FALSE(flashFits(P, false));
  P.dA = 128, P.dB = 64;
  P.kB.t = FloatIn{f32.data(), 0}; // an f32 (rotated) part
  EXPECT_FALSE(flashFits(P, false));
  P.kB.t = FloatIn{storage.data(), 1};
  P.dqB = OutMat{FloatOut{f32.data() + 1, 0}, 256, 64}; // a misaligned part of a gradient
  EXPECT_TRUE(flashFits(P, false));
  EXPECT_FALSE(flashFits(P, true));
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
