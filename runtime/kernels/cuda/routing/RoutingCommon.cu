//===- RoutingCommon.cu - registration and shared helpers -----------------===//

#include "runtime/kernels/cuda/routing/RoutingCommon.cuh"

#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <string>

#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/kernels/cuda/routing/RoutingKernels.h"

namespace moec::runtime::cuda {

void registerRoutingKernels(KernelRegistry &registry) {
  registry.add("router", routing::routerForward);
  registry.add("router.backward", routing::routerBackward);
  // These write every row their readers read (Dispatch.cu, ExpertMlp.cu): copies' rows past
  // the copies made (an expert-parallel rank's room) are read by no kernel, and zeroing that
  // room would cost more than the kernels' own writes.
  registry.add("dispatch", routing::dispatchForward, OutputInit::Any);
  registry.add("dispatch.backward", routing::dispatchBackward, OutputInit::Any);
  registry.add("expert_mlp", routing::expertMlpForward, OutputInit::Any);
  registry.add("expert_mlp.backward", routing::expertMlpBackward, OutputInit::Any);
  registry.add("combine", routing::combineForward, OutputInit::Any);
  registry.add("combine.backward", routing::combineBackward, OutputInit::Any);
  registry.add("expert_mlp_combine.backward", routing::expertMlpCombineBackward, OutputInit::Any);
}

namespace routing {

int64_t elementSize(plan::DType dtype) {
  switch (dtype) {
  case plan::F32:
  case plan::I32:
    return 4;
  case plan::BF16:
    return 2;
  case plan::I64:
    return 8;
  default:
    throw KernelError("routing kernels: unsupported dtype");
  }
}

//===--------------------------------------------------------------------===//
// Scratch and conversions
//===--------------------------------------------------------------------===//

DeviceBuffer::DeviceBuffer(const KernelContext &ctx, size_t bytes) : stream(streamOf(ctx)) {
  if (bytes == 0)
    return;
  cudaError_t error = cudaMallocAsync(&ptr, bytes, stream);
  if (error != cudaSuccess) {
    ptr = nullptr;
    ctx.fail("cannot allocate " + std::to_string(bytes) + " bytes of scratch: " +
             cudaGetErrorString(error));
  }
}

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  if (this != &other) {
    release();
    ptr = other.ptr;
    stream = other.stream;
    other.ptr = nullptr;
  }
  return *this;
}

void DeviceBuffer::release() {
  if (ptr)
    cudaFreeAsync(ptr, stream);
  ptr = nullptr;
}

namespace {

__global__ void convertKernel(FloatIn src, FloatOut dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst.store(i, src[i]);
}

} // namespace

void convertFloats(const KernelContext &ctx, const void *src, plan::DType srcType, void *dst,
                   plan::DType dstType, int64_t n) {
  if (n <= 0)
    return;
  unsigned blocks = std::min<unsigned>(blocksFor(n, kThreads), 65535u);
  convertKernel<<<blocks, kThreads, 0, streamOf(ctx)>>>(floatIn(src, srcType),
                                                        floatOut(dst, dstType), n);
  checkLaunch(ctx, "routing: convert");
}

const void *asDtype(const KernelContext &ctx, const TensorRef &t, plan::DType dtype,
                    DeviceBuffer &holder) {
  if (t.dtype == dtype)
    return t.data;
  holder = DeviceBuffer(ctx, dtype, t.numel());
  convertFloats(ctx, t.data, t.dtype, holder.get(), dtype, t.numel());
  return holder.get();
}

GemmTarget::GemmTarget(const KernelContext &ctx, const TensorRef *target, plan::DType abType)
    : out(target) {
  if (!out || out->dtype == plan::F32 || out->dtype == abType)
    return;
  scratch = DeviceBuffer(ctx, plan::F32, out->numel());
  if (out->numel() > 0)
    cudaMemsetAsync(scratch.get(), 0, out->numel() * sizeof(float), streamOf(ctx));
}

void GemmTarget::finish(const KernelContext &ctx) const {
  if (out && scratch.get())
    convertFloats(ctx, scratch.get(), plan::F32, out->data, out->dtype, out->numel());
}

//===--------------------------------------------------------------------===//
// Launch checks
//===--------------------------------------------------------------------===//

std::vector<const TensorRef *>
gradOutputs(const KernelContext &ctx, int64_t numOperands,
            const std::vector<std::pair<int64_t, const char *>> &noGrad) {
  std::vector<const TensorRef *> grads =
      checks::routing::gradOutputs(ctx, numOperands, noGrad, expectFloat);
  for (const TensorRef &out : ctx.outputs)
    if (out.numel() > 0)
      cudaMemsetAsync(out.data, 0, out.numel() * elementSize(out.dtype), streamOf(ctx));
  checkLaunch(ctx, "routing: zero the gradient outputs");
  return grads;
}

void expectFloat(const KernelContext &ctx, const TensorRef &t, const char *what) {
  if (t.dtype != plan::F32 && t.dtype != plan::BF16)
    ctx.fail(std::string(what) + " must be f32 or bf16");
}

//===--------------------------------------------------------------------===//
// Expert-major order: a stable radix sort of the copies by expert
//===--------------------------------------------------------------------===//

namespace {

/// keys[c] = expert of copy c (as unsigned: a negative index sorts last),
/// values[c] = c; counts[e] += 1 for the valid experts (integer atomics: the
/// counts do not depend on the order).
__global__ void sortKeysKernel(IndexIn indices, int64_t copies, uint32_t *keys, int32_t *values,
                               unsigned long long *counts, int64_t numExperts) {
  int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= copies)
    return;
  int64_t e = indices[c];
  keys[c] = e < 0 || e > 0xffffffffLL ? 0xffffffffu : static_cast<uint32_t>(e);
  values[c] = static_cast<int32_t>(c);
  if (counts && e >= 0 && e < numExperts)
    atomicAdd(counts + e, 1ull);
}

/// rows[perm[p]] = p.
__global__ void invertKernel(const int32_t *perm, int64_t copies, int32_t *rows) {
  int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (p < copies)
    rows[perm[p]] = static_cast<int32_t>(p);
}

} // namespace

void expertMajorOrder(const KernelContext &ctx, const TensorRef &indices, int32_t *rows,
                      int32_t *perm, int64_t *counts, int64_t numExperts) {
  cudaStream_t stream = streamOf(ctx);
  int64_t copies = indices.numel();
  if (counts && numExperts > 0)
    cudaMemsetAsync(counts, 0, numExperts * sizeof(int64_t), stream);
  if (copies == 0)
    return;
  if (copies > 0x7fffffffLL)
    ctx.fail("too many token copies (" + std::to_string(copies) + ") for 32-bit rows");
  DeviceBuffer keysIn(ctx, copies * sizeof(uint32_t)), keysOut(ctx, copies * sizeof(uint32_t));
  DeviceBuffer valuesIn(ctx, copies * sizeof(int32_t)), permHolder;
  int32_t *sorted = perm;
  if (!sorted) {
    permHolder = DeviceBuffer(ctx, copies * sizeof(int32_t));
    sorted = permHolder.as<int32_t>();
  }
  sortKeysKernel<<<blocksFor(copies, kThreads), kThreads, 0, stream>>>(
      indexIn(indices), copies, keysIn.as<uint32_t>(), valuesIn.as<int32_t>(),
      reinterpret_cast<unsigned long long *>(counts), numExperts);
  checkLaunch(ctx, "dispatch order: keys");
  // LSD radix sort is stable: equal experts keep their (token, slot) order.
  size_t tempBytes = 0;
  cudaError_t error = cub::DeviceRadixSort::SortPairs(
      nullptr, tempBytes, keysIn.as<uint32_t>(), keysOut.as<uint32_t>(), valuesIn.as<int32_t>(),
      sorted, static_cast<int>(copies), 0, 32, stream);
  if (error != cudaSuccess)
    ctx.fail(std::string("dispatch order: radix sort: ") + cudaGetErrorString(error));
  DeviceBuffer temp(ctx, std::max<size_t>(tempBytes, 1));
  error = cub::DeviceRadixSort::SortPairs(temp.get(), tempBytes, keysIn.as<uint32_t>(),
                                          keysOut.as<uint32_t>(), valuesIn.as<int32_t>(), sorted,
                                          static_cast<int>(copies), 0, 32, stream);
  if (error != cudaSuccess)
    ctx.fail(std::string("dispatch order: radix sort: ") + cudaGetErrorString(error));
  if (rows) {
    invertKernel<<<blocksFor(copies, kThreads), kThreads, 0, stream>>>(sorted, copies, rows);
    checkLaunch(ctx, "dispatch order: rows");
  }
}

} // namespace routing
} // namespace moec::runtime::cuda
