//===- CudaCompare.cpp - a CUDA kernel against its CPU twin ---------------===//

#include "runtime/kernels/testing/CudaCompare.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::testing {

namespace {

uint16_t toBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000)
    return 0x7fc0; // NaN
  bits += 0x7fff + ((bits >> 16) & 1); // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float fromBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool contains(const std::vector<size_t> &list, size_t i) {
  return std::find(list.begin(), list.end(), i) != list.end();
}

/// A device copy of a tensor, freed on scope exit.
struct DeviceTensor {
  TensorRef ref;
  size_t bytes = 0;
  ~DeviceTensor() {
    if (ref.data)
      cudaFree(ref.data);
  }
};

} // namespace

bool cudaDeviceAvailable(std::string *why) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    if (why)
      *why = std::string("no GPU available: ") +
             (error != cudaSuccess ? cudaGetErrorName(error) : "0 devices");
    return false;
  }
  return true;
}

CudaComparison compareCudaWithCpu(const KernelRegistry &cuda, KernelCall &call,
                                  const CudaCompareOptions &options) {
  CudaComparison result;
  if (!cudaDeviceAvailable(&result.why)) {
    result.skipped = true;
    return result;
  }
  bool bf16 = options.storage == plan::BF16;
  double tolerance = options.tolerance > 0 ? options.tolerance : (bf16 ? 2e-2 : 1e-5);
  std::vector<OwnedTensor> &inputs = call.inputsRef();
  // The CPU must see exactly what the GPU stores.
  if (bf16)
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].dtype == plan::F32 && !contains(options.f32Inputs, i)) {
        auto *values = reinterpret_cast<float *>(inputs[i].bytes.data());
        for (int64_t e = 0; e < inputs[i].numel(); ++e)
          values[e] = fromBf16(toBf16(values[e]));
      }
  call.run();

  std::vector<DeviceTensor> deviceInputs(inputs.size()), deviceOutputs(call.numOutputs());
  auto upload = [&](DeviceTensor &d, const OwnedTensor &t, bool toBf16Storage) -> bool {
    d.ref.shape = t.shape;
    d.ref.dtype = toBf16Storage ? plan::BF16 : t.dtype;
    d.bytes = static_cast<size_t>(t.numel() * plan::dtypeSize(d.ref.dtype));
    if (cudaMalloc(&d.ref.data, std::max<size_t>(d.bytes, 1)) != cudaSuccess)
      return false;
    if (!toBf16Storage)
      return cudaMemcpy(d.ref.data, t.bytes.data(), d.bytes, cudaMemcpyHostToDevice) == cudaSuccess;
    std::vector<uint16_t> half(static_cast<size_t>(t.numel()));
    const auto *values = reinterpret_cast<const float *>(t.bytes.data());
    for (size_t e = 0; e < half.size(); ++e)
      half[e] = toBf16(values[e]);
    return cudaMemcpy(d.ref.data, half.data(), d.bytes, cudaMemcpyHostToDevice) == cudaSuccess;
  };
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!upload(deviceInputs[i], inputs[i], bf16 && inputs[i].dtype == plan::F32 && !contains(options.f32Inputs, i))) {
      result.why = "cannot copy input " + std::to_string(i) + " to the GPU";
      return result;
    }
  for (size_t i = 0; i < call.numOutputs(); ++i) {
    const OwnedTensor &expected = call.result(i);
    DeviceTensor &d = deviceOutputs[i];
    bool half = bf16 && expected.dtype == plan::F32 && !contains(options.f32Outputs, i);
    d.ref.shape = expected.shape;
    d.ref.dtype = half ? plan::BF16 : expected.dtype;
    d.bytes = static_cast<size_t>(expected.numel() * plan::dtypeSize(d.ref.dtype));
    if (cudaMalloc(&d.ref.data, std::max<size_t>(d.bytes, 1)) != cudaSuccess) {
      result.why = "cannot allocate output " + std::to_string(i) + " on the GPU";
      return result;
    }
    cudaMemset(d.ref.data, 0xff, d.bytes); // poison: NaN for floats, -1 for integers
  }

  const KernelFn *fn = cuda.find(call.kernelName());
  std::ostringstream report;
  if (!fn) {
    result.report = "the CUDA backend has no kernel '" + call.kernelName() + "'";
    return result;
  }
  KernelContext ctx;
  ctx.kernel = call.kernelName();
  for (DeviceTensor &d : deviceInputs)
    ctx.inputs.push_back(d.ref);
  for (DeviceTensor &d : deviceOutputs)
    ctx.outputs.push_back(d.ref);
  ctx.attrs = &call.attributes();
  ctx.seqLen = call.seqLen() > 0 ? call.seqLen() : (inputs.empty() || inputs[0].shape.empty() ? 1 : inputs[0].shape[0]);
  ctx.microBatch = call.seqLen() > 0 ? call.microBatch() : 1;
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  ctx.stream = stream;
  try {
    (*fn)(ctx);
  } catch (const KernelError &error) {
    cudaStreamDestroy(stream);
    result.report = std::string("the CUDA kernel refused the launch: ") + error.what();
    return result;
  }
  cudaError_t error = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (error != cudaSuccess) {
    result.report = std::string("the CUDA kernel failed: ") + cudaGetErrorString(error);
    return result;
  }

  result.ok = true;
  for (size_t i = 0; i < call.numOutputs(); ++i) {
    const OwnedTensor &expected = call.result(i);
    DeviceTensor &d = deviceOutputs[i];
    std::vector<uint8_t> bytes(d.bytes);
    cudaMemcpy(bytes.data(), d.ref.data, d.bytes, cudaMemcpyDeviceToHost);
    if (expected.dtype != plan::F32) { // indices: exact
      int64_t wrong = 0;
      for (size_t b = 0; b < bytes.size(); ++b)
        wrong += bytes[b] != expected.bytes[b];
      result.errors.push_back(static_cast<double>(wrong));
      result.ok &= wrong == 0;
      report << "output " << i << " (" << plan::dtypeName(expected.dtype) << "): "
             << (wrong ? "MISMATCH" : "exact") << "\n";
      continue;
    }
    std::vector<float> gpu(static_cast<size_t>(expected.numel()));
    if (d.ref.dtype == plan::BF16)
      for (size_t e = 0; e < gpu.size(); ++e)
        gpu[e] = fromBf16(reinterpret_cast<const uint16_t *>(bytes.data())[e]);
    else
      std::memcpy(gpu.data(), bytes.data(), bytes.size());
    std::vector<float> ref = expected.floats();
    double diff = 0, norm = 0, worst = 0;
    bool finite = true;
    for (size_t e = 0; e < gpu.size(); ++e) {
      // An infinity the reference has too matches (a logsumexp over no keys is +inf); any other
      // non-finite value fails (NaN is the poison of an unwritten output).
      if (std::isinf(ref[e]) && gpu[e] == ref[e])
        continue;
      finite &= std::isfinite(gpu[e]);
      double delta = static_cast<double>(gpu[e]) - ref[e];
      diff += delta * delta;
      norm += static_cast<double>(ref[e]) * ref[e];
      worst = std::max(worst, std::abs(delta));
    }
    double rel = norm > 0 ? std::sqrt(diff / norm) : worst;
    bool pass = finite && (rel <= tolerance || worst <= options.absoluteFloor);
    result.errors.push_back(finite ? rel : INFINITY);
    result.ok &= pass;
    report << "output " << i << " (" << (d.ref.dtype == plan::BF16 ? "bf16" : "f32") << ", " << gpu.size()
           << " elements): rel " << rel << ", max abs " << worst << (finite ? "" : ", NOT FINITE (unwritten?)")
           << (pass ? "  ok" : "  FAIL") << " (tolerance " << tolerance << ")\n";
  }
  result.report = report.str();
  return result;
}

} // namespace moec::runtime::testing
