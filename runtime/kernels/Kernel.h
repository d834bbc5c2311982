//===- Kernel.h - what a kernel sees: tensors, attributes, sequences -*- C++ -*-===//
//
// Every kernel a plan names is a function `void(KernelContext &)`. The plan's
// launch gives its inputs and outputs (buffers, in the moe op's operand
// order) and attributes (the op's attributes, see EmitPlan.cpp); the context
// adds the step's shape facts (tokens = micro_batch sequences of seq_len
// rows each) and a thread pool.
//
// Contract for `<op>.backward` kernels (the default differentiation rule):
// inputs are the forward op's operands, then its results when the op's rule
// asks for them (`backward_segments` = [#operands, #results, #output grads]),
// then the gradients of the forward results listed in `grad_of_outputs`
// (the other results' gradients are zero); outputs are the gradients of the
// forward operands listed in `grad_of_inputs`, in that order. Optional
// operands of the forward op are present iff their `operand_segments` entry is 1.
// Gradients are written, not accumulated: the executor adds them up.
//
// Kernels signal bad launches (a wrong shape, a missing attribute) by
// throwing KernelError through ctx.fail(); the executor turns it into an
// error naming the step.
//
// CUDA kernels get the same context with device pointers in the tensors and
// the stream to launch on; they check shapes and attributes on the host,
// enqueue their work on `stream` and return without synchronising. Float
// tensors are F32 or BF16 (storage; arithmetic in f32) as the plan says.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_KERNEL_H_
#define RUNTIME_KERNELS_KERNEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/kernels/Parallel.h"
#include "runtime/plan/plan.pb.h"

namespace moec::runtime {

/// A view of one buffer: dtype, shape and the bytes (owned by the executor).
struct TensorRef {
  plan::DType dtype = plan::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  void *data = nullptr;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t dim(int64_t i) const { return shape.at(i < 0 ? i + rank() : i); }
  int64_t numel() const;
  float *f32() const;   // fails unless dtype is F32
  int32_t *i32() const; // fails unless dtype is I32
  int64_t *i64() const; // fails unless dtype is I64
  /// Index values of an I32 or I64 tensor, as int64.
  int64_t index(int64_t i) const;
};

class KernelError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct KernelContext {
  std::string kernel;
  std::vector<TensorRef> inputs, outputs;
  const google::protobuf::Map<std::string, plan::Attr> *attrs = nullptr;
  int64_t seqLen = 0, microBatch = 0; // rows [b*seqLen, (b+1)*seqLen) are sequence b
  ThreadPool *pool = nullptr;
  void *stream = nullptr; // cudaStream_t for CUDA kernels; unused on the CPU

  const TensorRef &in(size_t i) const;
  const TensorRef &out(size_t i) const;

  bool has(const std::string &name) const;
  int64_t attrInt(const std::string &name) const;
  int64_t attrInt(const std::string &name, int64_t otherwise) const;
  double attrFloat(const std::string &name) const;
  double attrFloat(const std::string &name, double otherwise) const;
  bool attrBool(const std::string &name) const; // absent = false (unit attributes)
  std::string attrString(const std::string &name) const;
  std::vector<int64_t> attrInts(const std::string &name) const;

  /// Whether forward operand group `group` is present (operand_segments), for
  /// optional operands; true when the op has no optional operands.
  bool hasOperand(size_t group) const;
  /// Index into `inputs` of the first operand of forward operand group `group`.
  size_t operandIndex(size_t group) const;

  /// For `.backward` kernels: which forward operands get gradients, in output order.
  std::vector<int64_t> gradOfInputs() const { return attrInts("grad_of_inputs"); }
  /// The output index holding the gradient of forward operand `operand`, or -1.
  int64_t gradOutputFor(int64_t operand) const;

  /// Runs fn(begin, end) over [0, n) split across the pool, deterministically.
  void parallelFor(int64_t n, const std::function<void(int64_t, int64_t)> &fn) const;

  [[noreturn]] void fail(const std::string &message) const;
  /// Fails unless `t` has this rank / these dims (-1 = any).
  void expectShape(const TensorRef &t, const char *what, std::vector<int64_t> dims) const;
};

using KernelFn = std::function<void(KernelContext &)>;

/// Kernels by name ("linear", "linear.backward"); one registry per backend.
/// What a kernel needs of its outputs before it runs. The executor zeroes them by default
/// (kernels may write only what they compute); a kernel registered with `Any` writes every
/// element a later kernel reads, so the executor skips that extra pass over its outputs.
enum class OutputInit { Zeroed, Any };

class KernelRegistry {
public:
  void add(const std::string &name, KernelFn fn, OutputInit init = OutputInit::Zeroed);
  const KernelFn *find(const std::string &name) const;
  /// Whether the executor must zero the kernel's outputs first (true for unknown names).
  bool needsZeroedOutputs(const std::string &name) const;
  std::vector<std::string> names() const;

private:
  std::map<std::string, KernelFn> kernels;
  std::map<std::string, OutputInit> inits;
};

} // namespace moec::runtime

#endif // RUNTIME_KERNELS_KERNEL_H_
