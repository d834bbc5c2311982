//===- Kernels.cuh - the CUDA attention family's internal interfaces -*- CUDA -*-===//
//
// The softmax-attention core shared by attention, mla and sparse_attention
// (Dense.cu: causal / sliding-window attention in key tiles with an online
// softmax, never forming the [T, T] scores, with Flash.cu's tensor-core
// kernels as its fast path for bf16; Sparse.cu: attention over the keys an
// index list selects), the RoPE launch and the registration pieces.
//
// One query head h of sequence b reads key/value head g = h / group. Query
// and key are split in two parts (A | B) as MLA's [nope | rope] with the
// key's B part shared by every head (head stride 0); attention uses A only.
// Logits are scale * q.k in f32 on the allowed keys (s <= t, t - s < window,
// selected), a sink logit joins the denominator, and O = softmax · V. The
// backward recomputes the probabilities from a per-(query, head) logsumexp:
//   stats:  lse = log Σ exp(z), D = dO · O, sink part = -p_sink · D
//   dQ:     per (query, head): dq = Σ_s dS_s k_s,  dS = scale · p (dO·v - D)
//   dK, dV: per (key, kv head), looping over the heads of the group and the
//           queries that see the key: dk = Σ dS q, dv = Σ p dO
// Every sum has a fixed order, so the results are deterministic.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_ATTENTION_KERNELS_CUH_
#define RUNTIME_KERNELS_CUDA_ATTENTION_KERNELS_CUH_

#include <cstdint>

#include "runtime/kernels/cuda/attention/Common.cuh"

namespace moec::runtime::cuda::attention {

struct AttnParams {
  int64_t L = 0, B = 0; // sequence length, sequences (rows [b*L, (b+1)*L))
  int H = 0, KV = 0, group = 1;
  int dA = 0, dB = 0, dv = 0; // query/key parts A and B, value width
  Mat qA, qB, kA, kB, v;      // q by head h, k and v by kv head g
  float scale = 0;
  int64_t window = 0; // 0 = none
  FloatIn sinks;      // [H]; p null = none
  OutMat out;         // forward result by head h
  float *lseOut = nullptr; // [T, H] (natural log; +inf where nothing is attended to) or null
  // Backward.
  Mat dO;                                                   // result gradient by head h
  float *lse = nullptr, *D = nullptr, *sinkPart = nullptr;  // [T, H] scratch
  OutMat dqA, dqB, dkA, dkB, dV;                            // p null = not wanted
  // The forward's saved result (by head h) and lseOut: the statistics come from them
  // (statisticsFromResult) instead of from the forward's key loop run again. p null = none.
  Mat savedO;
  const float *savedLse = nullptr;
};

/// The keys of each query row for sparse attention, built on the device.
struct SparseSel {
  int64_t K = 0;                  // slots per query row
  const int32_t *sel = nullptr;   // [T, K] selected global key rows, ascending, distinct;
  const int32_t *count = nullptr; // [T] how many; slots past the count hold T
  // For dK/dV: the (key row, query row) pairs sorted by key row, then query row.
  const int32_t *byKey = nullptr, *queries = nullptr;
  int64_t entries = 0;
};

/// Dense (causal, windowed) attention: the result into P.out.
void denseForward(const KernelContext &ctx, const AttnParams &P);
/// Its backward: gradients into the non-null P.dq*/dk*/dV views (and dSinks
/// when not null), using scratch for the statistics.
void denseBackward(const KernelContext &ctx, AttnParams P, Scratch &scratch, FloatOut dSinks);

/// Whether the wgmma forward (FlashWgmma.cu, sm_90a) covers this launch: bf16, head dim and
/// value dim 128, causal without window or sinks, a bf16 result, on a compute capability 9.0 GPU;
/// denseForward tries it first.
bool wgmmaForwardFits(const AttnParams &P);
void wgmmaForward(const KernelContext &ctx, const AttnParams &P);
/// The same for the backward's dQ, and its dK and dV (bf16 result gradient and gradients):
/// Flash.cu's backward sends them there with its statistics (lse and D, base 2, [B * H][Lp]).
bool wgmmaDqFits(const AttnParams &P);
void wgmmaDq(const KernelContext &ctx, const AttnParams &P, const float *lse, const float *dsum, int64_t Lp);
bool wgmmaDkDvFits(const AttnParams &P);
/// headsPerBlock: heads of a group per CTA; below the group, f32 parts per slice of the group
/// into dkPart, dvPart ([group / headsPerBlock][B * L][KV * 128]) for the caller to sum.
/// dqAccum ([B * L][H][128] f32, zeroed) or null: the same pass also adds up dQ there, scaled,
/// with atomic reductions (MOEC_ATTENTION_SINGLE_PASS=1; not bitwise reproducible, the dQ
/// kernel is).
void wgmmaDkDv(const KernelContext &ctx, const AttnParams &P, const float *lse, const float *dsum, int64_t Lp,
               int headsPerBlock, float *dkPart, float *dvPart, float *dqAccum);

/// Whether the tensor-core kernels of Flash.cu cover this launch (Dense.cu
/// says which launches do); denseForward / denseBackward dispatch on it.
bool flashFits(const AttnParams &P, bool backward);
/// Whether they cover these head dims (query/key parts A and B, value): the
/// first of flashFits' conditions, for callers that lay out their operands for it.
bool flashHeadDims(int dA, int dB, int dv);
void flashForward(const KernelContext &ctx, const AttnParams &P);
/// As denseBackward, once it knows some gradient is wanted.
void flashBackward(const KernelContext &ctx, const AttnParams &P, Scratch &scratch, FloatOut dSinks);

/// The selection of sparse attention from indices [T, K] (-1, duplicates,
/// future or out-of-range entries ignored); `transpose` also builds byKey.
SparseSel prepareSparse(const KernelContext &ctx, Scratch &scratch, IndexIn indices, int64_t tokens,
                        int64_t K, int64_t L, bool transpose);
void sparseForward(const KernelContext &ctx, const AttnParams &P, const SparseSel &S);
void sparseBackward(const KernelContext &ctx, AttnParams P, const SparseSel &S, Scratch &scratch);

/// y = rotation (or its transpose) of the first 2*r.half features of every
/// head of x [tokens, features]; the rest copied.
void launchRope(const KernelContext &ctx, FloatIn x, IndexIn positions, FloatOut y,
                int64_t tokens, int64_t features, int64_t headDim, const RopeConsts &r,
                bool backward);

void registerRopeKernels(KernelRegistry &registry);
void registerGqaKernels(KernelRegistry &registry);
void registerMlaKernels(KernelRegistry &registry);
void registerIndexerKernels(KernelRegistry &registry);

} // namespace moec::runtime::cuda::attention

#endif // RUNTIME_KERNELS_CUDA_ATTENTION_KERNELS_CUH_
