//===- Random.cu - fill_random on the GPU ---------------------------------===//

#include <cuda_bf16.h>

#include "runtime/kernels/RandomFill.h"
#include "runtime/kernels/cuda/CudaCommon.cuh"

namespace moec::runtime::cuda::core {

namespace {

template <typename T>
__global__ void fillKernel(T *out, int64_t n, int kind, double stddev, uint64_t stream, uint64_t first,
                           int64_t columns, int64_t whole, int64_t from) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = fromFloat<T>(random::value(kind, stddev, stream, random::wholeIndex(first, i, columns, whole, from)));
}

void fillRandom(KernelContext &ctx) {
  const TensorRef &out = ctx.out(0);
  std::string name = ctx.attrString("kind");
  int kind = name == "normal" ? random::Normal
             : name == "zeros" ? random::Zeros
             : name == "ones"  ? random::Ones
             : name == "a_log" ? random::ALog
             : name == "dt_bias" ? random::DtBias
                                 : -1;
  if (kind < 0)
    ctx.fail("unknown kind '" + name + "' (expected normal, zeros, ones, a_log, dt_bias)");
  double stddev = ctx.attrFloat("std", 0.02);
  uint64_t stream = static_cast<uint64_t>(ctx.attrInt("stream"));
  uint64_t first = static_cast<uint64_t>(ctx.attrInt("first_index", 0));
  int64_t whole = ctx.attrInt("whole_columns", 0), from = ctx.attrInt("first_column", 0);
  int64_t columns = ctx.attrInt("columns", out.rank() > 0 ? out.dim(-1) : 1);
  int64_t n = out.numel();
  unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  withFloatType(ctx, out, "output", [&](auto tag) {
    using T = decltype(tag);
    if (n > 0)
      fillKernel<T><<<blocks, 256, 0, streamOf(ctx)>>>(static_cast<T *>(out.data), n, kind, stddev, stream,
                                                        first, columns, whole, from);
    checkLaunch(ctx, "fill_random");
  });
}

} // namespace

void registerRandomKernels(KernelRegistry &registry) { registry.add("fill_random", fillRandom); }

} // namespace moec::runtime::cuda::core
