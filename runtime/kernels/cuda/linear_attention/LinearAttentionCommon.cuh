//===- LinearAttentionCommon.cuh - pieces of the CUDA linear-attention kernels -*- CUDA -*-===//
//
// The CUDA twin of cpu/linear_attention/DeltaRule.h: launch checks (the same
// messages as the CPU kernels, with "f32 or bf16" storage), stream-ordered
// scratch memory, f32 views of f32-or-bf16 tensors, and the stages shared by
// gated_delta_net and kda, each a kernel launch on ctx.stream:
//
//   causal depthwise conv + SiLU (restarting at each sequence start), its
//   gradients; L2 normalisation (eps 1e-6 inside the root) and its gradient;
//   the gated delta rule, forward and backward (recurrent form, see
//   DeltaRule.cu; chunked form for one decay per head, see ChunkedDeltaRule.h
//   and .cu); the gated RMSNorm and its gradient; deterministic column and
//   row sums.
//
// Every stage works on token-major f32 arrays (rows [b*seqLen, (b+1)*seqLen)
// are sequence b) in global scratch; storage (f32 or bf16) is converted on the
// way in (asF32) and out (storeF32). Reductions accumulate in double in a fixed
// order: results do not depend on scheduling, and there are no atomics.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_LINEARATTENTIONCOMMON_CUH_
#define RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_LINEARATTENTIONCOMMON_CUH_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/checks/linear_attention/LaunchChecks.h"
#include "runtime/kernels/cuda/CudaCommon.cuh"
#include "runtime/kernels/cuda/linear_attention/ChunkedDeltaRule.h"

namespace moec::runtime::cuda::linattn {

/// gated_delta_net and gated_delta_net.backward (GatedDeltaNet.cu).
void registerGatedDeltaNetKernels(KernelRegistry &registry);
/// kda and kda.backward (Kda.cu).
void registerKdaKernels(KernelRegistry &registry);

//===--- launch checks (host) ----------------------------------------------===//

// The launch checks every kernel here shares with its CPU twin.
using checks::linattn::convWidth;
using checks::linattn::expectNumel;
using checks::linattn::positiveAttr;
using checks::linattn::Tokens;
using checks::linattn::tokensOf;

/// Fails unless `t` is f32 or bf16 storage.
void expectFloat(const KernelContext &ctx, const TensorRef &t, const char *what);

/// Where a `.backward` launch keeps its output gradient (Kernel.h's contract).
class BackwardLayout {
public:
  BackwardLayout(const KernelContext &ctx, size_t numOperands, const std::vector<int64_t> &resultShape);
  /// The gradient of the forward result, or null when none flows (all gradients zero).
  const TensorRef *resultGrad() const { return grad; }

private:
  const TensorRef *grad = nullptr;
};

//===--- scratch memory and storage ----------------------------------------===//

/// Device buffers allocated with cudaMallocAsync on ctx.stream and freed with
/// cudaFreeAsync on the same stream when the launch returns (or fails): the
/// frees are stream-ordered after every kernel that uses them.
class Scratch {
public:
  explicit Scratch(const KernelContext &ctx) : ctx(ctx) {}
  ~Scratch();
  Scratch(const Scratch &) = delete;
  Scratch &operator=(const Scratch &) = delete;

  void *bytes(size_t n);
  float *floats(int64_t n) { return static_cast<float *>(bytes(static_cast<size_t>(n) * sizeof(float))); }

private:
  const KernelContext &ctx;
  std::vector<void *> buffers;
};

/// `t` as f32: its own data when f32, else a converted copy in `scratch`.
const float *asF32(const KernelContext &ctx, Scratch &scratch, const TensorRef &t, const char *what);
/// Writes `n = out.numel()` f32 values to `out` (f32: a device copy; bf16: rounded).
void storeF32(const KernelContext &ctx, const float *src, const TensorRef &out);
/// Lets `kernel` take `bytes` of dynamic shared memory (opt-in above 48 KiB), or fails naming `what`.
void allowSharedBytes(const KernelContext &ctx, const void *kernel, size_t bytes, const char *what);

//===--- stages (each enqueues kernels on ctx.stream) ----------------------===//

/// Where conv channel c reads its input: column c (Identity) or, for
/// gated_delta_net, the grouped qkvz column of mixed channel c (q | k | v).
struct ColumnMap {
  bool grouped = false;
  int64_t keyWidth = 0, dk = 0, dv = 0, r = 0; // grouped only

  __host__ __device__ int64_t operator()(int64_t c) const {
    if (!grouped)
      return c;
    int64_t group = 2 * dk + 2 * r * dv;
    if (c < keyWidth)
      return (c / dk) * group + c % dk;
    if (c < 2 * keyWidth)
      return ((c - keyWidth) / dk) * group + dk + (c - keyWidth) % dk;
    int64_t h = (c - 2 * keyWidth) / dv, j = (c - 2 * keyWidth) % dv;
    return (h / r) * group + 2 * dk + (h % r) * dv + j;
  }
};

/// A causal depthwise conv over `channels` channels: input x[t * ld + map(c)],
/// weight w[c * width + j] ([C, 1, K] in f32), sequences of seqLen rows.
struct Conv {
  const float *x = nullptr;
  int64_t ld = 0;
  ColumnMap map;
  const float *w = nullptr;
  int64_t width = 0, channels = 0, tokens = 0, seqLen = 0;
};

/// out[t, c] = SiLU(sum_j w[c, j] x[t-K+1+j, c]); out: [T, channels].
void convSiluForward(const KernelContext &ctx, const Conv &conv, float *out);
/// Given dout [T, channels]: dx at dx[t * dxLd + map(c)] (every mapped column
/// written) and dw [channels * K]. Uses `scratch` for the pre-activation gradient.
void convSiluBackward(const KernelContext &ctx, Scratch &scratch, const Conv &conv, const float *dout,
                      float *dx, int64_t dxLd, float *dw);

/// Per row (t, g) of `dim` values x[t * ld + off + g * dim + i], g < groups:
/// y[(t * groups + g) * dim + i] = x * scale / sqrt(sum x^2 + 1e-6).
void l2NormForward(const KernelContext &ctx, const float *x, int64_t ld, int64_t off, int64_t tokens,
                   int64_t groups, int64_t dim, float scale, float *y);
/// Its gradient, where row (t, g)'s output gradient is the sum over the `r`
/// value heads g*r .. g*r+r-1 of dy [T, groups * r, dim] (in head order);
/// dx is written at dx[t * dxLd + dxOff + g * dim + i].
void l2NormBackward(const KernelContext &ctx, const float *x, int64_t ld, int64_t off, int64_t tokens,
                    int64_t groups, int64_t dim, float scale, const float *dy, int64_t r, float *dx,
                    int64_t dxLd, int64_t dxOff);

/// The gated delta rule, per value head h and sequence, S_0 = 0 ([dk, dv]):
///   S = Diag(exp(g_t)) S;  u = beta_t (v_t - S^T k_t);  S = S + k_t u^T;  o_t = S^T q_t
/// Value head h reads key head h / (heads / keyHeads).
struct DeltaRule {
  int64_t tokens = 0, seqLen = 0, heads = 0, keyHeads = 0, dk = 0, dv = 0;
  bool channelDecay = false;
  const float *q = nullptr, *k = nullptr; // [T, keyHeads * dk], normalised (q also scaled)
  const float *v = nullptr;               // v(t, h, j) = v[t * vLd + vOff + h * dv + j]
  int64_t vLd = 0, vOff = 0;
  const float *beta = nullptr;     // [T, heads]
  const float *logDecay = nullptr; // [T, heads] or [T, heads * dk]
};

/// o: [T, heads * dv].
void deltaRuleForward(const KernelContext &ctx, const DeltaRule &rule, float *o);

/// Gradients given dO [T, heads * dv]: dq, dk, dg per value head and key
/// channel ([T, heads * dk]; dg is per channel even for a per-head decay: sum
/// it over the channels), dBeta [T, heads], dv at dv[t * dvLd + dvOff + h * dv + j].
struct DeltaRuleGrads {
  float *q = nullptr, *k = nullptr, *logDecay = nullptr, *beta = nullptr, *v = nullptr;
  int64_t vLd = 0, vOff = 0;
};
void deltaRuleBackward(const KernelContext &ctx, Scratch &scratch, const DeltaRule &rule, const float *dO,
                       const DeltaRuleGrads &grads);

/// The chunked form of the same rule (ChunkedDeltaRule.h has the math, ChunkedDeltaRule.cu
/// the kernels). It applies to one decay per head (not KDA's per-channel decay) and
/// dk <= 256, any dv, f32 and bf16 storage alike (f32 arithmetic; the state in f32).
bool chunkedDeltaRuleApplies(const DeltaRule &rule);
/// What the chunked forward keeps for the backward (buffers in the launch's scratch).
using ChunkedSaved = chunked::Saved<float>;
/// o: [T, heads * dv], every element written; fills `saved`.
void chunkedDeltaRuleForward(const KernelContext &ctx, Scratch &scratch, const DeltaRule &rule, float *o,
                             ChunkedSaved &saved);
/// Gradients given dO, after chunkedDeltaRuleForward filled `saved`; as deltaRuleBackward's,
/// except that grads.logDecay is per head ([T, heads]), already summed over the key channels.
void chunkedDeltaRuleBackward(const KernelContext &ctx, Scratch &scratch, const DeltaRule &rule,
                              const ChunkedSaved &saved, const float *dO, const DeltaRuleGrads &grads);

/// The gate of value head h, channel j: base[t * ld + (h / r) * groupStride + off + (h % r) * dim + j].
struct GateMap {
  int64_t ld = 0, groupStride = 0, off = 0, r = 1;

  __host__ __device__ int64_t at(int64_t t, int64_t h, int64_t j, int64_t dim) const {
    return t * ld + (h / r) * groupStride + off + (h % r) * dim + j;
  }
};

enum class GateActivation { Silu, Sigmoid };

/// Per (t, h): y = o / sqrt(mean(o^2) + eps) * w * act(gate); o, y: [T, heads * dim].
void gatedNormForward(const KernelContext &ctx, const float *o, const float *gate, const GateMap &gateMap,
                      const float *w, int64_t tokens, int64_t heads, int64_t dim, double eps,
                      GateActivation act, const TensorRef &y);
/// Its gradients given dy [T, heads * dim]: dO like o, dGate written through
/// gateMap into dGate, dW [dim] (a deterministic sum; uses scratch).
void gatedNormBackward(const KernelContext &ctx, Scratch &scratch, const float *o, const float *gate,
                       const GateMap &gateMap, const float *w, int64_t tokens, int64_t heads, int64_t dim,
                       double eps, GateActivation act, const float *dy, float *dO, float *dGate, float *dW);

/// out[c] = sum over rows of m[row * cols + c], in a fixed order (double accumulation).
void columnSum(const KernelContext &ctx, Scratch &scratch, const float *m, int64_t rows, int64_t cols,
               float *out);
/// out[row] = sum over c of m[row * cols + c], in a fixed order.
void rowSum(const KernelContext &ctx, const float *m, int64_t rows, int64_t cols, float *out);

//===--- device helpers -----------------------------------------------------===//

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
/// torch.nn.functional.softplus (beta 1, threshold 20: x itself above 20).
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float softplusGradf(float x) { return x > 20.0f ? 1.0f : sigmoidf(x); }

inline unsigned gridFor(int64_t n, int threads) { return blocksFor(n, threads); }

} // namespace moec::runtime::cuda::linattn

#endif // RUNTIME_KERNELS_CUDA_LINEAR_ATTENTION_LINEARATTENTIONCOMMON_CUH_
