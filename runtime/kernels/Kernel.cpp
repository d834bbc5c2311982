//===- Kernel.cpp - kernel context helpers and the registry ---------------===//

#include "runtime/kernels/Kernel.h"

#include "runtime/plan/PlanFormat.h"

namespace moec::runtime {

namespace {
[[noreturn]] void typeError(const TensorRef &t, const char *want) {
  throw KernelError(std::string("expected a ") + want + " tensor, got " + plan::dtypeName(t.dtype));
}
} // namespace

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

float *TensorRef::f32() const {
  if (dtype != plan::F32)
    typeError(*this, "f32");
  return static_cast<float *>(data);
}

int32_t *TensorRef::i32() const {
  if (dtype != plan::I32)
    typeError(*this, "i32");
  return static_cast<int32_t *>(data);
}

int64_t *TensorRef::i64() const {
  if (dtype != plan::I64)
    typeError(*this, "i64");
  return static_cast<int64_t *>(data);
}

int64_t TensorRef::index(int64_t i) const {
  if (dtype == plan::I32)
    return static_cast<const int32_t *>(data)[i];
  if (dtype == plan::I64)
    return static_cast<const int64_t *>(data)[i];
  typeError(*this, "i32 or i64");
}

const TensorRef &KernelContext::in(size_t i) const {
  if (i >= inputs.size())
    fail("expected at least " + std::to_string(i + 1) + " inputs, got " +
         std::to_string(inputs.size()));
  return inputs[i];
}

const TensorRef &KernelContext::out(size_t i) const {
  if (i >= outputs.size())
    fail("expected at least " + std::to_string(i + 1) + " outputs, got " +
         std::to_string(outputs.size()));
  return outputs[i];
}

bool KernelContext::has(const std::string &name) const { return attrs && attrs->count(name); }

namespace {
const plan::Attr &lookup(const KernelContext &ctx, const std::string &name) {
  if (!ctx.has(name))
    ctx.fail("missing attribute '" + name + "'");
  return ctx.attrs->at(name);
}
} // namespace

int64_t KernelContext::attrInt(const std::string &name) const {
  const plan::Attr &attr = lookup(*this, name);
  if (attr.value_case() != plan::Attr::kI)
    fail("attribute '" + name + "' is not an integer");
  return attr.i();
}

int64_t KernelContext::attrInt(const std::string &name, int64_t otherwise) const {
  return has(name) ? attrInt(name) : otherwise;
}

double KernelContext::attrFloat(const std::string &name) const {
  const plan::Attr &attr = lookup(*this, name);
  if (attr.value_case() == plan::Attr::kI)
    return static_cast<double>(attr.i());
  if (attr.value_case() != plan::Attr::kF)
    fail("attribute '" + name + "' is not a number");
  return attr.f();
}

double KernelContext::attrFloat(const std::string &name, double otherwise) const {
  return has(name) ? attrFloat(name) : otherwise;
}

bool KernelContext::attrBool(const std::string &name) const {
  if (!has(name))
    return false;
  const plan::Attr &attr = attrs->at(name);
  if (attr.value_case() != plan::Attr::kB)
    fail("attribute '" + name + "' is not a flag");
  return attr.b();
}

std::string KernelContext::attrString(const std::string &name) const {
  const plan::Attr &attr = lookup(*this, name);
  if (attr.value_case() != plan::Attr::kS)
    fail("attribute '" + name + "' is not a string");
  return attr.s();
}

std::vector<int64_t> KernelContext::attrInts(const std::string &name) const {
  const plan::Attr &attr = lookup(*this, name);
  if (attr.value_case() != plan::Attr::kInts)
    fail("attribute '" + name + "' is not an integer list");
  return {attr.ints().values().begin(), attr.ints().values().end()};
}

bool KernelContext::hasOperand(size_t group) const {
  if (!has("operand_segments"))
    return true;
  std::vector<int64_t> segments = attrInts("operand_segments");
  return group < segments.size() && segments[group] > 0;
}

size_t KernelContext::operandIndex(size_t group) const {
  if (!has("operand_segments"))
    return group;
  std::vector<int64_t> segments = attrInts("operand_segments");
  size_t index = 0;
  for (size_t g = 0; g < group && g < segments.size(); ++g)
    index += static_cast<size_t>(segments[g]);
  return index;
}

int64_t KernelContext::gradOutputFor(int64_t operand) const {
  std::vector<int64_t> of = gradOfInputs();
  for (size_t i = 0; i < of.size(); ++i)
    if (of[i] == operand)
      return static_cast<int64_t>(i);
  return -1;
}

void KernelContext::parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &fn) const {
  if (pool)
    pool->parallelFor(n, fn);
  else
    fn(0, n);
}

void KernelContext::fail(const std::string &message) const {
  throw KernelError(kernel + ": " + message);
}

void KernelContext::expectShape(const TensorRef &t, const char *what,
                                std::vector<int64_t> dims) const {
  bool ok = t.rank() == static_cast<int64_t>(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i)
    ok = dims[i] < 0 || dims[i] == t.shape[i];
  if (ok)
    return;
  auto show = [](const std::vector<int64_t> &s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i)
      out += (i ? "," : "") + (s[i] < 0 ? std::string("?") : std::to_string(s[i]));
    return out + "]";
  };
  fail(std::string(what) + " has shape " + show(t.shape) + ", expected " + show(dims));
}

void KernelRegistry::add(const std::string &name, KernelFn fn, OutputInit init) {
  kernels[name] = std::move(fn);
  inits[name] = init;
}

bool KernelRegistry::needsZeroedOutputs(const std::string &name) const {
  auto it = inits.find(name);
  return it == inits.end() || it->second == OutputInit::Zeroed;
}

const KernelFn *KernelRegistry::find(const std::string &name) const {
  auto it = kernels.find(name);
  return it == kernels.end() ? nullptr : &it->second;
}

std::vector<std::string> KernelRegistry::names() const {
  std::vector<std::string> out;
  for (const auto &entry : kernels)
    out.push_back(entry.first);
  return out;
}

} // namespace moec::runtime
