//===- Device.h - where a plan's buffers live and its kernels run -*- C++ -*-===//
//
// The executor asks a Device for memory, copies and the kernel registry; the
// CPU device is plain host memory, the CUDA device (runtime/backends/cuda)
// device memory and a stream. Kernels see device pointers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_EXEC_DEVICE_H_
#define RUNTIME_EXEC_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/kernels/Kernel.h"

namespace moec::runtime {

class Device {
public:
  virtual ~Device() = default;
  /// "cpu", "cuda:0 (NVIDIA H200)".
  virtual std::string name() const = 0;
  /// Zeroed memory of `bytes` bytes (the executor allocates one arena per role).
  virtual absl::StatusOr<void *> allocate(size_t bytes) = 0;
  virtual void release(void *memory) = 0;
  virtual absl::Status upload(void *dst, const void *host, size_t bytes) = 0;
  virtual absl::Status download(void *host, const void *src, size_t bytes) = 0;
  /// Copies device memory to device memory, ordered with the kernels.
  virtual absl::Status copy(void *dst, const void *src, size_t bytes) = 0;
  /// Zeroes device memory, ordered with the kernels.
  virtual absl::Status zero(void *dst, size_t bytes) = 0;
  /// A small host-to-device copy that does not wait for the device: the bytes are staged
  /// first (the host buffer may go at once), the copy is ordered with the kernels.
  virtual absl::Status uploadStaged(void *dst, const void *host, size_t bytes) { return upload(dst, host, bytes); }
  /// `count` elements of `src` (`from`) into `dst` (`to`), rounded to nearest even, ordered with
  /// the kernels (an f32 sum over tp rounded once into a bf16 result).
  virtual absl::Status convert(void *dst, plan::DType to, const void *src, plan::DType from, size_t count) = 0;
  /// dst row i = src row rows[i], rows of `rowBytes` bytes, ordered with the kernels (the expert
  /// exchange gathers the tokens bound for each rank).
  virtual absl::Status gatherRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t rowBytes) = 0;
  /// dst row t = the sum of `perRow` rows of `src`, rows[t perRow + s] for s in order (a
  /// negative entry adds nothing), accumulated in f32; `rows.size() / perRow` rows of `width`
  /// elements, `from` (f32 or bf16) in `src`, `to` in `dst` (rounded once), ordered with the
  /// kernels (the expert exchange adds a token's partial sums from the ranks it went to).
  virtual absl::Status sumRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t perRow,
                               size_t width, plan::DType from, plan::DType to) = 0;
  /// In place over `count` expert indices of `dtype` (i32 or i64), ordered with the kernels: an
  /// expert in [first, first + perRank) becomes its number on this rank (e - first), any other
  /// -1 (the expert exchange's received experts, when every token comes to every rank).
  virtual absl::Status localExperts(void *indices, size_t count, plan::DType dtype, int64_t first,
                                    int64_t perRank) = 0;
  /// Waits for every kernel launched so far, on every stream; reports an asynchronous failure.
  virtual absl::Status synchronize() = 0;
  /// What kernels get as ctx.stream / ctx.pool: the stream useStream chose.
  virtual void *stream() { return nullptr; }
  /// Where the launches, copies and collectives issued from now on go: stream `index` of the
  /// plan's (0 at first). A device that runs everything in issue order (the CPU) has one
  /// stream for all of them, which every validated plan allows.
  virtual absl::Status useStream(int index) { return absl::OkStatus(); }
  /// Plan event `id`: record it after the work issued so far on the current stream; make the
  /// current stream wait until it is recorded (the plan records before it waits).
  virtual absl::Status recordEvent(int id) { return absl::OkStatus(); }
  virtual absl::Status waitEvent(int id) { return absl::OkStatus(); }
  /// Orders every stream after everything issued on all of them so far (a step's start and end:
  /// the step's streams do not run into the previous or the next step, nor the host's work).
  virtual absl::Status joinStreams() { return absl::OkStatus(); }
  virtual ThreadPool *pool() { return nullptr; }
  virtual const KernelRegistry &kernels() const = 0;
  /// Device memory taken since the device was opened (arenas, kernel scratch pools, library
  /// workspaces); the pools keep what they took, so after a step this is the step's peak.
  virtual std::optional<uint64_t> memoryInUse() { return std::nullopt; }
  /// Whether the device's kernels compute on f32 storage only (the CPU). The executor
  /// then runs a bf16 plan as f32 buffers rounded to bf16 after every write, so the
  /// CPU stays the reference for bf16 runs too.
  virtual bool emulatesBf16() const { return false; }
  /// Rounds `count` f32 values in place to the nearest bf16 (ties to even).
  virtual absl::Status roundToBf16(float *data, size_t count) {
    return absl::UnimplementedError(name() + " does not emulate bf16");
  }
};

/// The CPU: host memory, the CPU kernels, `threads` threads (0 = all).
std::unique_ptr<Device> makeCpuDevice(int threads = 0);

} // namespace moec::runtime

#endif // RUNTIME_EXEC_DEVICE_H_
