//===- CpuDevice.cpp - host memory and the CPU kernels --------------------===//

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/exec/Device.h"
#include "runtime/kernels/cpu/CpuKernels.h"
#include "runtime/kernels/cpu/Gemm.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/weights/DType.h"

namespace moec::runtime {

namespace {

class CpuDevice : public Device {
public:
  explicit CpuDevice(int threads) : threadPool(threads) {
    cpu::registerCpuKernels(registry);
    cpu::setGemmThreads(1); // the pool parallelises around the GEMMs
  }
  std::string name() const override { return "cpu (" + std::to_string(threadPool.size()) + " threads)"; }
  absl::StatusOr<void *> allocate(size_t bytes) override {
    // 64-byte aligned, as vector loads like.
    void *memory = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!memory)
      return absl::ResourceExhaustedError("out of host memory allocating " + std::to_string(bytes) + " bytes");
    std::memset(memory, 0, bytes);
    return memory;
  }
  void release(void *memory) override { std::free(memory); }
  absl::Status upload(void *dst, const void *host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
    return absl::OkStatus();
  }
  absl::Status download(void *host, const void *src, size_t bytes) override {
    std::memcpy(host, src, bytes);
    return absl::OkStatus();
  }
  absl::Status copy(void *dst, const void *src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status zero(void *dst, size_t bytes) override {
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
  absl::Status convert(void *dst, plan::DType to, const void *src, plan::DType from, size_t count) override {
    if (from != plan::F32 || to != plan::F32) // bf16 plans run as f32 here (emulatesBf16)
      return absl::InvalidArgumentError(std::string("convert on the CPU takes f32, got ") + plan::dtypeName(from) +
                                        " to " + plan::dtypeName(to));
    std::memmove(dst, src, count * sizeof(float));
    return absl::OkStatus();
  }
  absl::Status gatherRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t rowBytes) override {
    for (size_t i = 0; i < rows.size(); ++i)
      std::memcpy(static_cast<char *>(dst) + i * rowBytes,
                  static_cast<const char *>(src) + static_cast<size_t>(rows[i]) * rowBytes, rowBytes);
    return absl::OkStatus();
  }
  absl::Status sumRows(void *dst, const void *src, const std::vector<int64_t> &rows, size_t perRow, size_t width,
                       plan::DType from, plan::DType to) override {
    if (from != plan::F32 || to != plan::F32) // bf16 plans run as f32 here (emulatesBf16)
      return absl::InvalidArgumentError(std::string("sumRows on the CPU takes f32 rows, got ") +
                                        plan::dtypeName(from) + " to " + plan::dtypeName(to));
    auto *out = static_cast<float *>(dst);
    const auto *in = static_cast<const float *>(src);
    for (size_t t = 0; t < rows.size() / perRow; ++t) {
      float *y = out + t * width;
      std::fill_n(y, width, 0.0f);
      for (size_t s = 0; s < perRow; ++s)
        if (int64_t row = rows[t * perRow + s]; row >= 0)
          for (size_t d = 0; d < width; ++d)
            y[d] += in[static_cast<size_t>(row) * width + d];
    }
    return absl::OkStatus();
  }
  absl::Status localExperts(void *indices, size_t count, plan::DType dtype, int64_t first,
                            int64_t perRank) override {
    auto renumber = [&](auto *e) {
      for (size_t i = 0; i < count; ++i)
        e[i] = e[i] >= first && e[i] - first < perRank ? e[i] - first : -1;
    };
    if (dtype == plan::I64)
      renumber(static_cast<int64_t *>(indices));
    else if (dtype == plan::I32)
      renumber(static_cast<int32_t *>(indices));
    else
      return absl::InvalidArgumentError(std::string("localExperts takes i32 or i64 indices, got ") +
                                        plan::dtypeName(dtype));
    return absl::OkStatus();
  }
  absl::Status synchronize() override { return absl::OkStatus(); }
  ThreadPool *pool() override { return &threadPool; }
  const KernelRegistry &kernels() const override { return registry; }
  bool emulatesBf16() const override { return true; }
  absl::Status roundToBf16(float *data, size_t count) override {
    for (size_t i = 0; i < count; ++i)
      data[i] = weights::bf16ToF32(weights::f32ToBf16(data[i]));
    return absl::OkStatus();
  }

private:
  ThreadPool threadPool;
  KernelRegistry registry;
};

} // namespace

std::unique_ptr<Device> makeCpuDevice(int threads) { return std::make_unique<CpuDevice>(threads); }

} // namespace moec::runtime
