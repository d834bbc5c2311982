//===- CudaDevice.cpp - GPU memory, a stream and the CUDA kernels ---------===//

#include "runtime/backends/cuda/CudaDevice.h"

#include "runtime/backends/cuda/CopyBlocks.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/kernels/cuda/CudaKernels.h"
#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::cuda {

namespace {

absl::Status cudaStatus(cudaError_t error, const std::string &what) {
  if (error == cudaSuccess)
    return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

class CudaDevice : public Device {
public:
  CudaDevice(int ordinal, std::string label, cudaStream_t stream)
      : ordinal(ordinal), label(std::move(label)), streams{stream}, copiers(1) {
    registerCudaKernels(registry);
    size_t total = 0;
    cudaMemGetInfo(&freeAtStart, &total);
  }
  ~CudaDevice() override {
    cudaSetDevice(ordinal);
    copiers.clear(); // before their streams go
    for (cudaEvent_t event : events)
      if (event)
        cudaEventDestroy(event);
    for (cudaEvent_t event : joins)
      cudaEventDestroy(event);
    for (cudaStream_t stream : streams)
      cudaStreamDestroy(stream);
  }
  std::string name() const override { return label; }

  absl::StatusOr<void *> allocate(size_t bytes) override {
    void *memory = nullptr;
    cudaError_t error = cudaMalloc(&memory, bytes ? bytes : 1);
    if (error == cudaErrorMemoryAllocation) {
      cudaGetLastError(); // clear it
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      return absl::ResourceExhaustedError(absl::StrCat("out of GPU memory: ", bytes, " bytes asked, ", free,
                                                       " of ", total, " free"));
    }
    if (absl::Status s = cudaStatus(error, "cudaMalloc"); !s.ok())
      return s;
    if (absl::Status s = cudaStatus(cudaMemset(memory, 0, bytes), "cudaMemset"); !s.ok())
      return s;
    return memory;
  }
  void release(void *memory) override { cudaFree(memory); }
  absl::Status upload(void *dst, const void *host, size_t bytes) override {
    if (absl::Status s = cudaStatus(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, current()),
                                    "copy to the GPU");
        !s.ok())
      return s;
    return synchronizeCurrent(); // the host buffer may go away when we return
  }
  absl::Status download(void *host, const void *src, size_t bytes) override {
    if (absl::Status s = cudaStatus(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, current()),
                                    "copy from the GPU");
        !s.ok())
      return s;
    return synchronizeCurrent(); // this stream's work only (a route's counts: not the compute's)
  }
  absl::Status copy(void *dst, const void *src, size_t bytes) override {
    return cudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current()), "copy on the GPU");
  }
  absl::Status zero(void *dst, size_t bytes) override {
    return cudaStatus(cudaMemsetAsync(dst, 0, bytes, current()), "cudaMemsetAsync");
  }
  absl::Status uploadStaged(void *dst, const void *host, size_t bytes) override {
    std::string error = copier().upload(dst, host, bytes);
    return error.empty() ? absl::OkStatus() : absl::InternalError(error);
  }
  absl::Status convert(void *dst, plan::DType to, const void *src, plan::DType from, size_t count) override {
    for (plan::DType dtype : {from, to})
      if (dtype != plan::F32 && dtype != plan::BF16)
        return absl::InvalidArgumentError(std::string("convert takes f32 or bf16, got ") + plan::dtypeName(dtype));
    std::string error = copier().convert(dst, src, count, from == plan::BF16, to == plan::BF16);
    return error.empty() ? absl::OkStatus() : absl::InternalError(error);
  }
  absl::Status gatherRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t rowBytes) override {
    std::string error = copier().gatherRows(dst, src, rows, rowBytes);
    return error.empty() ? absl::OkStatus() : absl::InternalError(error);
  }
  absl::Status sumRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t perRow, size_t width,
                       plan::DType from, plan::DType to) override {
    for (plan::DType dtype : {from, to})
      if (dtype != plan::F32 && dtype != plan::BF16)
        return absl::InvalidArgumentError(std::string("sumRows takes f32 or bf16 rows, got ") +
                                          plan::dtypeName(dtype));
    std::string error = copier().sumRows(dst, src, rows, perRow, width, from == plan::BF16, to == plan::BF16);
    return error.empty() ? absl::OkStatus() : absl::InternalError(error);
  }
  absl::Status localExperts(void *indices, size_t count, plan::DType dtype, int64_t first,
                            int64_t perRank) override {
    if (dtype != plan::I32 && dtype != plan::I64)
      return absl::InvalidArgumentError(std::string("localExperts takes i32 or i64 indices, got ") +
                                        plan::dtypeName(dtype));
    std::string error = copier().localExperts(indices, count, dtype == plan::I64, first, perRank);
    return error.empty() ? absl::OkStatus() : absl::InternalError(error);
  }
  absl::Status synchronize() override {
    for (cudaStream_t stream : streams)
      if (absl::Status s = cudaStatus(cudaStreamSynchronize(stream), "the GPU"); !s.ok())
        return s;
    return absl::OkStatus();
  }
  void *stream() override { return current(); }
  absl::Status useStream(int index) override {
    if (index < 0 || index > 15)
      return absl::InvalidArgumentError(absl::StrCat("stream ", index, " out of range (0..15)"));
    while (streams.size() <= static_cast<size_t>(index)) { // made on first use
      cudaStream_t stream;
      if (absl::Status s = cudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
          !s.ok())
        return s;
      streams.push_back(stream);
      copiers.emplace_back();
    }
    active = index;
    return absl::OkStatus();
  }
  absl::Status recordEvent(int id) override {
    if (id < 0)
      return absl::InvalidArgumentError(absl::StrCat("event ", id));
    if (events.size() <= static_cast<size_t>(id))
      events.resize(id + 1, nullptr);
    if (!events[id])
      if (absl::Status s = cudaStatus(cudaEventCreateWithFlags(&events[id], cudaEventDisableTiming), "cudaEventCreate");
          !s.ok())
        return s;
    return cudaStatus(cudaEventRecord(events[id], current()), "cudaEventRecord");
  }
  absl::Status waitEvent(int id) override {
    if (id < 0 || static_cast<size_t>(id) >= events.size() || !events[id])
      return absl::FailedPreconditionError(absl::StrCat("event ", id, " is waited for before it is recorded"));
    return cudaStatus(cudaStreamWaitEvent(current(), events[id], 0), "cudaStreamWaitEvent");
  }
  absl::Status joinStreams() override {
    if (streams.size() < 2)
      return absl::OkStatus();
    while (joins.size() < streams.size()) {
      cudaEvent_t event;
      if (absl::Status s = cudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
          !s.ok())
        return s;
      joins.push_back(event);
    }
    for (size_t i = 0; i < streams.size(); ++i)
      if (absl::Status s = cudaStatus(cudaEventRecord(joins[i], streams[i]), "cudaEventRecord"); !s.ok())
        return s;
    for (size_t i = 0; i < streams.size(); ++i)
      for (size_t j = 0; j < streams.size(); ++j)
        if (i != j)
          if (absl::Status s = cudaStatus(cudaStreamWaitEvent(streams[i], joins[j], 0), "cudaStreamWaitEvent");
              !s.ok())
            return s;
    return absl::OkStatus();
  }
  const KernelRegistry &kernels() const override { return registry; }
  std::optional<uint64_t> memoryInUse() override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess || free > freeAtStart)
      return std::nullopt;
    return freeAtStart - free;
  }

private:
  cudaStream_t current() const { return streams[active]; }
  absl::Status synchronizeCurrent() { return cudaStatus(cudaStreamSynchronize(current()), "the GPU"); }
  /// The row kernels' helper of the current stream (pinned staging buffers ordered on it).
  BlockCopier &copier() {
    if (!copiers[active])
      copiers[active] = std::make_unique<BlockCopier>(current());
    return *copiers[active];
  }

  size_t freeAtStart = 0;
  int ordinal;
  std::string label;
  std::vector<cudaStream_t> streams; // the plan's streams, 0 first
  int active = 0;
  std::vector<std::unique_ptr<BlockCopier>> copiers; // per stream, made on first use
  std::vector<cudaEvent_t> events;                   // the plan's events, by id
  std::vector<cudaEvent_t> joins;                    // joinStreams's, one per stream
  KernelRegistry registry;
};

} // namespace

int cudaDeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

absl::StatusOr<std::unique_ptr<Device>> makeCudaDevice(int ordinal) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0)
    return absl::UnavailableError(absl::StrCat("no GPU available (",
                                               error != cudaSuccess ? cudaGetErrorName(error) : "0 devices",
                                               "); use --backend cpu"));
  if (ordinal < 0 || ordinal >= count)
    return absl::InvalidArgumentError(absl::StrCat("GPU ", ordinal, " does not exist (", count, " GPUs)"));
  if (absl::Status s = cudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); !s.ok())
    return s;
  // Kernels take their scratch with cudaMallocAsync. The default pool hands memory back to the
  // driver at every synchronisation (release threshold 0), so each step after a sync would map
  // its scratch again; keep it instead (the plan bounds what the arenas use, scratch is small).
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, ordinal) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  cudaDeviceProp properties;
  cudaGetDeviceProperties(&properties, ordinal);
  cudaStream_t stream;
  if (absl::Status s = cudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      !s.ok())
    return s;
  return std::unique_ptr<Device>(
      new CudaDevice(ordinal, absl::StrCat("cuda:", ordinal, " (", properties.name, ")"), stream));
}

} // namespace moec::runtime::cuda
