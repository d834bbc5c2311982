//===- CoreCompare.h - helpers for the core CUDA kernel tests ---*- C++ -*-===//
//
// Each test builds a launch exactly as the CPU tests do (cpu/core's
// CoreTestUtil: its registry() is the CPU oracle, backwardOf() builds the
// `.backward` launch), then compares the CUDA kernel with it in F32 storage
// and in BF16 storage.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CUDA_CORE_CORECOMPARE_H_
#define RUNTIME_KERNELS_CUDA_CORE_CORECOMPARE_H_

#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/kernels/cpu/core/CoreTestUtil.h"
#include "runtime/kernels/testing/CudaCompare.h"

namespace moec::runtime::cuda::core::testing {

using namespace moec::runtime::testing;
using moec::runtime::cpu::core::testing::backwardOf;
using moec::runtime::cpu::core::testing::registry; // the CPU kernels

/// "[2,3]".
inline std::string shapeText(const std::vector<int64_t> &shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

/// A registry holding the core CUDA kernels.
const KernelRegistry &cudaRegistry();

/// Skips the test (with the harness's reason) on a machine without a GPU.
#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    std::string why_;                                                                              \
    if (!::moec::runtime::testing::cudaDeviceAvailable(&why_))                                     \
      GTEST_SKIP() << why_;                                                                        \
  } while (0)

/// Compares the CUDA kernel with the CPU one on make()'s launch, once with F32
/// storage and once with BF16 storage (a fresh launch each: the comparison
/// rounds the launch's inputs to bf16 in place). `options.storage` is ignored.
void expectMatchesCpu(const std::function<KernelCall()> &make, const std::string &what,
                      CudaCompareOptions options = {});

/// The same for one storage type only.
void expectMatchesCpuIn(plan::DType storage, const std::function<KernelCall()> &make,
                        const std::string &what, CudaCompareOptions options = {});

/// The message of the KernelError the CUDA kernel throws on `call`'s launch
/// (host pointers: only for launches the host-side checks must refuse), or "".
std::string cudaFailureOf(KernelCall &call);

} // namespace moec::runtime::cuda::core::testing

#endif // RUNTIME_KERNELS_CUDA_CORE_CORECOMPARE_H_
