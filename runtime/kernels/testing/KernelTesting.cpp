//===- KernelTesting.cpp - run one kernel in a test, check its gradients --===//

#include "runtime/kernels/testing/KernelTesting.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "runtime/plan/PlanFormat.h"

namespace moec::runtime::testing {

int64_t OwnedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

TensorRef OwnedTensor::ref() {
  TensorRef r;
  r.dtype = dtype;
  r.shape = shape;
  r.data = bytes.data();
  return r;
}

std::vector<float> OwnedTensor::floats() const {
  if (dtype != plan::F32)
    throw KernelError("floats() of a non-f32 tensor");
  std::vector<float> out(numel());
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::vector<int64_t> OwnedTensor::indices() const {
  std::vector<int64_t> out(numel());
  for (int64_t i = 0; i < numel(); ++i)
    out[i] = dtype == plan::I32 ? reinterpret_cast<const int32_t *>(bytes.data())[i]
                                : reinterpret_cast<const int64_t *>(bytes.data())[i];
  return out;
}

OwnedTensor zeroTensor(plan::DType dtype, std::vector<int64_t> shape) {
  OwnedTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(static_cast<size_t>(t.numel() * plan::dtypeSize(dtype)), 0);
  return t;
}

OwnedTensor floatTensor(std::vector<int64_t> shape, const std::vector<float> &values) {
  OwnedTensor t = zeroTensor(plan::F32, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw KernelError("floatTensor: " + std::to_string(values.size()) + " values for " +
                      std::to_string(t.numel()) + " elements");
  std::memcpy(t.bytes.data(), values.data(), values.size() * sizeof(float));
  return t;
}

OwnedTensor randomTensor(std::vector<int64_t> shape, uint64_t seed, float scale) {
  OwnedTensor t = zeroTensor(plan::F32, std::move(shape));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  auto *data = reinterpret_cast<float *>(t.bytes.data());
  for (int64_t i = 0; i < t.numel(); ++i)
    data[i] = dist(rng);
  return t;
}

OwnedTensor filledTensor(std::vector<int64_t> shape, float value) {
  OwnedTensor t = zeroTensor(plan::F32, std::move(shape));
  std::fill_n(reinterpret_cast<float *>(t.bytes.data()), t.numel(), value);
  return t;
}

OwnedTensor indexTensor(plan::DType dtype, std::vector<int64_t> shape,
                        const std::vector<int64_t> &values) {
  OwnedTensor t = zeroTensor(dtype, std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel())
    throw KernelError("indexTensor: wrong number of values");
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == plan::I32)
      reinterpret_cast<int32_t *>(t.bytes.data())[i] = static_cast<int32_t>(values[i]);
    else
      reinterpret_cast<int64_t *>(t.bytes.data())[i] = values[i];
  }
  return t;
}

KernelCall::KernelCall(const KernelRegistry &registry, std::string kernel)
    : registry(registry), kernel(std::move(kernel)) {}

KernelCall &KernelCall::input(OwnedTensor tensor) {
  inputs.push_back(std::move(tensor));
  return *this;
}

KernelCall &KernelCall::output(plan::DType dtype, std::vector<int64_t> shape) {
  outputs.push_back(zeroTensor(dtype, std::move(shape)));
  return *this;
}

KernelCall &KernelCall::attr(const std::string &name, int64_t value) {
  attrs[name].set_i(value);
  return *this;
}
KernelCall &KernelCall::attr(const std::string &name, double value) {
  attrs[name].set_f(value);
  return *this;
}
KernelCall &KernelCall::attr(const std::string &name, bool value) {
  attrs[name].set_b(value);
  return *this;
}
KernelCall &KernelCall::attr(const std::string &name, const char *value) {
  attrs[name].set_s(value);
  return *this;
}
KernelCall &KernelCall::attr(const std::string &name, const std::string &value) {
  attrs[name].set_s(value);
  return *this;
}
KernelCall &KernelCall::attr(const std::string &name, const std::vector<int64_t> &values) {
  attrs[name].mutable_ints()->clear_values();
  for (int64_t v : values)
    attrs[name].mutable_ints()->add_values(v);
  return *this;
}

KernelCall &KernelCall::sequences(int64_t seqLen, int64_t microBatch) {
  seq = seqLen;
  batch = microBatch;
  return *this;
}

KernelCall &KernelCall::threads(ThreadPool *threadPool) {
  pool = threadPool;
  return *this;
}

void KernelCall::run() {
  const KernelFn *fn = registry.find(kernel);
  if (!fn)
    throw KernelError("no kernel named '" + kernel + "'");
  KernelContext ctx;
  ctx.kernel = kernel;
  for (OwnedTensor &t : inputs)
    ctx.inputs.push_back(t.ref());
  for (OwnedTensor &t : outputs) {
    std::fill(t.bytes.begin(), t.bytes.end(), 0);
    ctx.outputs.push_back(t.ref());
  }
  ctx.attrs = &attrs;
  // Token-major tensors default to one sequence of all their rows.
  ctx.seqLen = seq > 0 ? seq : (inputs.empty() || inputs[0].shape.empty() ? 1 : inputs[0].shape[0]);
  ctx.microBatch = seq > 0 ? batch : 1;
  ctx.pool = pool;
  (*fn)(ctx);
}

namespace {

float *floatsOf(OwnedTensor &t) { return reinterpret_cast<float *>(t.bytes.data()); }

double projected(KernelCall &call, const std::vector<OwnedTensor> &projections,
                 const std::vector<int64_t> &outputs) {
  call.run();
  double sum = 0;
  for (size_t j = 0; j < outputs.size(); ++j) {
    OwnedTensor &y = call.result(outputs[j]);
    const float *r = reinterpret_cast<const float *>(projections[j].bytes.data());
    for (int64_t i = 0; i < y.numel(); ++i)
      sum += static_cast<double>(r[i]) * floatsOf(y)[i];
  }
  return sum;
}

} // namespace

GradientCheck checkGradients(const KernelRegistry &registry, KernelCall &forward,
                             const std::vector<int64_t> &wrt, std::vector<int64_t> outputsWithGrad,
                             bool backwardUsesResults, double epsilon, int directions) {
  GradientCheck check;
  forward.run();
  if (outputsWithGrad.empty())
    for (size_t j = 0; j < 64; ++j) {
      try {
        if (forward.result(j).dtype == plan::F32)
          outputsWithGrad.push_back(static_cast<int64_t>(j));
      } catch (const std::out_of_range &) {
        break;
      }
    }
  std::vector<OwnedTensor> projections;
  for (size_t j = 0; j < outputsWithGrad.size(); ++j)
    projections.push_back(randomTensor(forward.result(outputsWithGrad[j]).shape, 1000 + j));

  KernelCall backward(registry, forward.kernelName() + ".backward");
  backward.attributes() = forward.attributes();
  backward.attr("grad_of_inputs", wrt).attr("grad_of_outputs", outputsWithGrad);
  backward.sequences(forward.seqLen(), forward.microBatch());
  int64_t numOutputs = 0;
  for (OwnedTensor &t : forward.inputsRef())
    backward.input(t);
  if (backwardUsesResults)
    for (size_t j = 0; j < 64; ++j) {
      try {
        backward.input(forward.result(j));
        ++numOutputs;
      } catch (const std::out_of_range &) {
        break;
      }
    }
  for (OwnedTensor &r : projections)
    backward.input(r);
  backward.attr("backward_segments",
                std::vector<int64_t>{static_cast<int64_t>(forward.inputsRef().size()), numOutputs,
                                     static_cast<int64_t>(projections.size())});
  for (int64_t index : wrt)
    backward.output(plan::F32, forward.inputsRef().at(index).shape);
  backward.run();

  std::ostringstream report;
  for (size_t w = 0; w < wrt.size(); ++w) {
    OwnedTensor &x = forward.inputsRef().at(wrt[w]);
    std::vector<float> original = x.floats();
    std::vector<float> grad = backward.result(w).floats();
    double worst = 0;
    for (int d = 0; d < directions; ++d) {
      OwnedTensor v = randomTensor(x.shape, 77 + 13 * d + 101 * w);
      const float *dir = floatsOf(v);
      double analytic = 0;
      for (int64_t i = 0; i < x.numel(); ++i)
        analytic += static_cast<double>(grad[i]) * dir[i];
      for (int64_t i = 0; i < x.numel(); ++i)
        floatsOf(x)[i] = original[i] + static_cast<float>(epsilon) * dir[i];
      double plus = projected(forward, projections, outputsWithGrad);
      for (int64_t i = 0; i < x.numel(); ++i)
        floatsOf(x)[i] = original[i] - static_cast<float>(epsilon) * dir[i];
      double minus = projected(forward, projections, outputsWithGrad);
      std::memcpy(x.bytes.data(), original.data(), original.size() * sizeof(float));
      double numeric = (plus - minus) / (2 * epsilon);
      double error = std::abs(analytic - numeric) / std::max(std::abs(numeric), 1e-2);
      worst = std::max(worst, error);
      report << "input " << wrt[w] << " direction " << d << ": analytic " << analytic
             << ", numeric " << numeric << ", relative error " << error << "\n";
    }
    check.worstRelativeError = std::max(check.worstRelativeError, worst);
  }
  forward.run(); // leave the forward results as they were
  check.report = report.str();
  return check;
}

} // namespace moec::runtime::testing
