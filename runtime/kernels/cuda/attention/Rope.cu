//===- Rope.cu - rotary position embedding on the GPU ---------------------===//
//
// rope: x [T, H*head_dim], positions [T] -> the first rope.dim features of
// every head rotated, the rest copied (partial RoPE); the backward applies
// the transposed rotation to the result's gradient. One block per token:
// the row's cos/sin (rope.dim/2 of them) go to shared memory, then every
// thread writes output features independently. bf16 heads rotated whole in
// the half style (Qwen3's q and k) take a vectorised kernel instead: a thread
// per 8 pairs of features, 16-byte loads and stores (the general kernel's
// 2-byte accesses ran at a fifth of the memory bandwidth: 0.19 ms for q at
// 16384 tokens of 32 heads). The arithmetic rounds as
// the CPU's RopeTable does, so the results are bit-identical up to the
// last-place difference of the device's double sin/cos.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cstdint>
#include <string>

#include "runtime/kernels/cuda/attention/Common.cuh"
#include "runtime/kernels/cuda/attention/Kernels.cuh"

namespace moec::runtime::cuda::attention {
namespace {

constexpr int kRopeThreads = 128;

__global__ void __launch_bounds__(kRopeThreads)
    ropeRows(FloatIn x, IndexIn positions, FloatOut y, int64_t features, int64_t headDim,
             RopeConsts r, int backward) {
  __shared__ float cs[kMaxRopeHalf], sn[kMaxRopeHalf];
  const int64_t t = blockIdx.x;
  const float position = static_cast<float>(ldIndex(positions, t));
  for (int i = threadIdx.x; i < r.half; i += blockDim.x)
    ropeCosSin(r, i, position, cs[i], sn[i]);
  __syncthreads();
  const int dim = 2 * r.half;
  const int64_t heads = features / headDim;
  // Head by head: a feature's place e in its head needs no 64-bit division.
  for (int64_t head = 0; head < heads; ++head) {
    const int64_t h0 = t * features + head * headDim; // the head's first feature
    for (int e = threadIdx.x; e < headDim; e += blockDim.x) {
      float value;
      if (e >= dim) {
        value = ld(x, h0 + e);
      } else if (!backward) { // RopeTable::rotate: y[i], y[i + half] from the pair of slot i
        int i = e < r.half ? e : e - r.half;
        float a = ld(x, h0 + (r.interleaved ? 2 * i : i));
        float b = ld(x, h0 + (r.interleaved ? 2 * i + 1 : i + r.half));
        value = e < r.half ? __fsub_rn(__fmul_rn(a, cs[i]), __fmul_rn(b, sn[i]))
                           : __fadd_rn(__fmul_rn(b, cs[i]), __fmul_rn(a, sn[i]));
      } else { // RopeTable::rotateBack: dx[a slot], dx[b slot] from dy[i], dy[i + half]
        int i = r.interleaved ? e / 2 : (e < r.half ? e : e - r.half);
        bool first = r.interleaved ? (e % 2) == 0 : e < r.half;
        float g0 = ld(x, h0 + i), g1 = ld(x, h0 + i + r.half);
        value = first ? __fadd_rn(__fmul_rn(g0, cs[i]), __fmul_rn(g1, sn[i]))
                      : __fsub_rn(__fmul_rn(g1, cs[i]), __fmul_rn(g0, sn[i]));
      }
      st(y, h0 + e, value);
    }
  }
}

constexpr int kPairThreads = 256;
constexpr int kPairTable = 2048; // cos/sin entries a block holds: tokens per block x half

/// The half style's rotation (or its transpose) of bf16 heads that rope.dim covers whole
/// (features i and i + half of each head form pair i). Each thread takes 8 consecutive pairs of
/// one head of one token; a block takes `tokensPerBlock` tokens, whose cos/sin it computes once
/// into shared memory. Same operations in the same order as ropeRows: identical results.
__global__ void __launch_bounds__(kPairThreads)
    ropePairsBf16(const __nv_bfloat16 *x, IndexIn positions, __nv_bfloat16 *y, int64_t tokens,
                  int64_t features, int headDim, int tokensPerBlock, RopeConsts r, int backward) {
  __shared__ float cs[kPairTable], sn[kPairTable];
  const int half = r.half, chunks = half / 8;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tokensPerBlock;
  const int count = static_cast<int>(tokens - t0 < tokensPerBlock ? tokens - t0 : tokensPerBlock);
  for (int e = threadIdx.x; e < count * half; e += blockDim.x)
    ropeCosSin(r, e % half, static_cast<float>(ldIndex(positions, t0 + e / half)), cs[e], sn[e]);
  __syncthreads();
  const int heads = static_cast<int>(features / headDim), items = heads * chunks;
  for (int w = threadIdx.x; w < count * items; w += blockDim.x) {
    const int token = w / items, head = (w % items) / chunks, i0 = (w % chunks) * 8;
    const int64_t base = (t0 + token) * features + static_cast<int64_t>(head) * headDim + i0;
    uint4 ra = *reinterpret_cast<const uint4 *>(x + base);
    uint4 rb = *reinterpret_cast<const uint4 *>(x + base + half);
    const __nv_bfloat16 *va = reinterpret_cast<const __nv_bfloat16 *>(&ra);
    const __nv_bfloat16 *vb = reinterpret_cast<const __nv_bfloat16 *>(&rb);
    __align__(16) __nv_bfloat16 oa[8], ob[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float a = __bfloat162float(va[k]), b = __bfloat162float(vb[k]);
      float c = cs[token * half + i0 + k], s = sn[token * half + i0 + k];
      float first, second;
      if (!backward) { // RopeTable::rotate
        first = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        second = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
      } else { // RopeTable::rotateBack
        first = __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        second = __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s));
      }
      oa[k] = __float2bfloat16(first);
      ob[k] = __float2bfloat16(second);
    }
    *reinterpret_cast<uint4 *>(y + base) = *reinterpret_cast<const uint4 *>(oa);
    *reinterpret_cast<uint4 *>(y + base + half) = *reinterpret_cast<const uint4 *>(ob);
  }
}

/// Whether ropePairsBf16 can take the launch: bf16 in and out, the half style over whole heads
/// of a multiple of 16 features, 16-byte aligned rows.
bool pairsApply(FloatIn x, FloatOut y, int64_t features, int64_t headDim, const RopeConsts &r) {
  auto aligned = [](const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return x.bf16 && y.bf16 && !r.interleaved && 2 * r.half == headDim && r.half % 8 == 0 &&
         r.half <= kPairTable && features % 8 == 0 && aligned(x.p) && aligned(y.p);
}

struct RopeLaunch {
  int64_t tokens = 0, features = 0, headDim = 0;
  RopeSpec spec;
  FloatIn x;
  IndexIn positions;
};

RopeLaunch readRopeLaunch(const KernelContext &ctx) {
  RopeLaunch l;
  const TensorRef &x = ctx.in(0);
  l.x = floatIn(ctx, x, "input", {-1, -1});
  l.tokens = x.dim(0);
  l.features = x.dim(1);
  l.headDim = positiveAttr(ctx, "head_dim");
  if (l.features % l.headDim != 0)
    ctx.fail("input features (" + std::to_string(l.features) +
             ") must be a multiple of head_dim (" + std::to_string(l.headDim) + ")");
  l.positions = indexIn(ctx, ctx.in(1), "positions", {l.tokens});
  l.spec = *readRope(ctx, "rope", /*required=*/true, l.headDim);
  return l;
}

void ropeForward(KernelContext &ctx) {
  if (ctx.inputs.size() != 2)
    ctx.fail("expected 2 inputs (input, positions), got " + std::to_string(ctx.inputs.size()));
  RopeLaunch l = readRopeLaunch(ctx);
  if (ctx.outputs.size() != 1)
    ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
  FloatOut out = floatOut(ctx, ctx.out(0), "result", {l.tokens, l.features});
  launchRope(ctx, l.x, l.positions, out, l.tokens, l.features, l.headDim,
             ropeConsts(ctx, l.spec), /*backward=*/false);
}

void ropeBackward(KernelContext &ctx) {
  size_t operands = backwardOperands(ctx, 2, 2);
  RopeLaunch l = readRopeLaunch(ctx);
  FloatIn gradOut = checkBackward(ctx, operands, {0}, l.tokens, l.features);
  FloatOut gradIn = gradFor(ctx, 0);
  if (!gradIn.p || !gradOut.p)
    return;
  launchRope(ctx, gradOut, l.positions, gradIn, l.tokens, l.features, l.headDim,
             ropeConsts(ctx, l.spec), /*backward=*/true);
}

} // namespace

void launchRope(const KernelContext &ctx, FloatIn x, IndexIn positions, FloatOut y,
                int64_t tokens, int64_t features, int64_t headDim, const RopeConsts &r,
                bool backward) {
  if (tokens == 0 || features == 0)
    return;
  if (pairsApply(x, y, features, headDim, r)) {
    int64_t itemsPerToken = features / headDim * (r.half / 8);
    int64_t perBlock = std::max<int64_t>(1, std::min<int64_t>(kPairThreads / itemsPerToken, kPairTable / r.half));
    int64_t blocks = (tokens + perBlock - 1) / perBlock;
    if (blocks <= 0x7fffffff) {
      ropePairsBf16<<<static_cast<unsigned>(blocks), kPairThreads, 0, streamOf(ctx)>>>(
          static_cast<const __nv_bfloat16 *>(x.p), positions, static_cast<__nv_bfloat16 *>(y.p), tokens,
          features, static_cast<int>(headDim), static_cast<int>(perBlock), r, backward ? 1 : 0);
      checkLaunch(ctx, backward ? "rope.backward" : "rope");
      return;
    }
  }
  ropeRows<<<static_cast<unsigned>(tokens), kRopeThreads, 0, streamOf(ctx)>>>(
      x, positions, y, features, headDim, r, backward ? 1 : 0);
  checkLaunch(ctx, backward ? "rope.backward" : "rope");
}

void registerRopeKernels(KernelRegistry &registry) {
  registry.add("rope", ropeForward);
  registry.add("rope.backward", ropeBackward);
}

} // namespace moec::runtime::cuda::attention
