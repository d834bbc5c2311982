//===- DsaIndexer.cu - DeepSeek Sparse Attention's lightning indexer on the GPU ===//
//
// dsa_indexer: query [T, H*D], key [T, D], head_weights [T, H], positions
// [T] -> indices [T, topk] (i32 or i64), as cpu/attention/DsaIndexer.cpp.
//
// The leading rope.dim features of each query head and of the key rotate
// into f32 scratch (Rope.cu's kernel: the CPU's rounding). Then one block per
// query row: the row's rotated query goes to shared memory, each thread
// scores keys with the CPU's arithmetic (double dot products of the f32
// features, then f32 products and sums in head order, no FMA contraction),
// so the scores are the CPU's bit for bit. Thread 0 then selects the top k
// with StlSelect.h, a port of the libstdc++ nth_element / sort /
// partial_sort the CPU calls: tied scores (frequent: ReLU zeros) resolve
// exactly as on the CPU. The row of (score, key) candidates lives in shared
// memory when it fits, else in a global scratch buffer (rows in chunks).
//
// The selection is one thread per row: correct, not fast, for long rows.
//
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/kernels/cuda/attention/Kernels.cuh"
#include "runtime/kernels/cuda/attention/StlSelect.h"

namespace moec::runtime::cuda::attention {
namespace {

constexpr int kThreads = 256;
using stl::Candidate;

struct IndexerParams {
  const float *q = nullptr, *k = nullptr; // rotated copies: [T, H*D], [T, D]
  FloatIn weights;                        // [T, H]
  int heads = 0, dim = 0;
  int64_t L = 0, topk = 0, keep = 0;
  float dotScale = 0, headScale = 0;
  IndexOut out;
};

__global__ void __launch_bounds__(kThreads)
    selectKernel(IndexerParams P, int64_t rowBase, Candidate *globalRows, int rowsInShared) {
  extern __shared__ float smem[];
  float *qs = smem; // [H*D]
  const int64_t width = static_cast<int64_t>(P.heads) * P.dim;
  Candidate *row;
  if (rowsInShared) {
    size_t offset = ((static_cast<size_t>(width) * sizeof(float) + 15) / 16) * 16;
    row = reinterpret_cast<Candidate *>(reinterpret_cast<char *>(smem) + offset);
  } else {
    row = globalRows + static_cast<int64_t>(blockIdx.x) * P.L;
  }
  const int64_t t = rowBase + blockIdx.x;
  const int64_t first = t - t % P.L, last = t - first; // the sequence's row 0, t's position in it
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    qs[i] = P.q[t * width + i];
  __syncthreads();
  for (int64_t s = threadIdx.x; s < P.L; s += blockDim.x) {
    float score = -INFINITY;
    if (s <= last) {
      const float *ks = P.k + (first + s) * P.dim;
      score = 0.0f;
      for (int h = 0; h < P.heads; ++h) {
        const float *qh = qs + static_cast<int64_t>(h) * P.dim;
        double dot = 0;
        for (int e = 0; e < P.dim; ++e)
          dot += static_cast<double>(qh[e]) * static_cast<double>(ks[e]); // exact products
        float scaled = __fmul_rn(static_cast<float>(dot), P.dotScale);
        float logit = scaled < 0.0f ? 0.0f : scaled; // std::max(scaled, 0.0f)
        float w = ld(P.weights, t * P.heads + h);
        score = __fadd_rn(score, __fmul_rn(__fmul_rn(w, P.headScale), logit));
      }
    }
    row[s] = Candidate{score, static_cast<int32_t>(s)};
  }
  __syncthreads();
  if (threadIdx.x == 0)
    stl::selectTopK(row, P.L, P.keep);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < P.topk; j += blockDim.x) {
    int64_t s = j < P.keep && row[j].key <= last ? row[j].key : -1;
    stIndex(P.out, t * P.topk + j, s);
  }
}

void dsaIndexer(KernelContext &ctx) {
  if (ctx.inputs.size() != 4)
    ctx.fail("expected 4 inputs (query, key, head_weights, positions), got " +
             std::to_string(ctx.inputs.size()));
  int64_t heads = positiveAttr(ctx, "num_heads"), dim = positiveAttr(ctx, "head_dim"),
          topk = positiveAttr(ctx, "topk");
  FloatIn query = floatIn(ctx, ctx.in(0), "query", {-1, heads * dim});
  int64_t tokens = ctx.in(0).dim(0);
  FloatIn key = floatIn(ctx, ctx.in(1), "key", {tokens, dim});
  FloatIn weights = floatIn(ctx, ctx.in(2), "head_weights", {tokens, heads});
  IndexIn positions = indexIn(ctx, ctx.in(3), "positions", {tokens});
  RopeSpec spec = *readRope(ctx, "rope", /*required=*/true, dim);
  Sequences seqs = sequencesOf(ctx, tokens);
  if (ctx.outputs.size() != 1)
    ctx.fail("expected 1 output, got " + std::to_string(ctx.outputs.size()));
  IndexOut out = indexOut(ctx, ctx.out(0), "indices", {tokens, topk});
  if (seqs.length >= (int64_t{1} << 31))
    ctx.fail("dsa_indexer on CUDA supports sequences shorter than 2^31 tokens");

  Scratch scratch(ctx);
  RopeConsts consts = ropeConsts(ctx, spec);
  float *q = scratch.floats(tokens * heads * dim), *k = scratch.floats(tokens * dim);
  launchRope(ctx, query, positions, f32Out(q), tokens, heads * dim, dim, consts, false);
  launchRope(ctx, key, positions, f32Out(k), tokens, dim, dim, consts, false);

  IndexerParams P;
  P.q = q;
  P.k = k;
  P.weights = weights;
  P.heads = static_cast<int>(heads);
  P.dim = static_cast<int>(dim);
  P.L = seqs.length;
  P.topk = topk;
  P.keep = std::min(topk, seqs.length);
  P.dotScale = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  P.headScale = static_cast<float>(std::pow(static_cast<double>(heads), -0.5));
  P.out = out;

  const size_t qBytes = ((static_cast<size_t>(heads * dim) * sizeof(float) + 15) / 16) * 16;
  const size_t rowBytes = static_cast<size_t>(seqs.length) * sizeof(Candidate);
  const size_t limit = maxSharedBytes(ctx);
  if (qBytes > limit)
    ctx.fail("dsa_indexer: a query row (" + std::to_string(heads * dim) +
             " features) does not fit in shared memory");
  const bool rowsInShared = qBytes + rowBytes <= limit;
  const size_t shared = rowsInShared ? qBytes + rowBytes : qBytes;
  allowSharedMemory(ctx, selectKernel, shared, "dsa_indexer");
  if (rowsInShared) {
    selectKernel<<<static_cast<unsigned>(tokens), kThreads, shared, streamOf(ctx)>>>(P, 0, nullptr,
                                                                                     1);
    checkLaunch(ctx, "dsa_indexer");
    return;
  }
  // Long rows: candidates in global memory, at most ~256 MiB of them at a time.
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>(tokens, (int64_t{256} << 20) / static_cast<int64_t>(rowBytes)));
  Candidate *rows = static_cast<Candidate *>(scratch.bytes(static_cast<size_t>(chunk) * rowBytes));
  for (int64_t base = 0; base < tokens; base += chunk) {
    int64_t n = std::min(chunk, tokens - base);
    selectKernel<<<static_cast<unsigned>(n), kThreads, shared, streamOf(ctx)>>>(P, base, rows, 0);
    checkLaunch(ctx, "dsa_indexer");
  }
}

} // namespace

void registerIndexerKernels(KernelRegistry &registry) { registry.add("dsa_indexer", dsaIndexer); }

} // namespace moec::runtime::cuda::attention
