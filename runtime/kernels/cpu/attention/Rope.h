//===- Rope.h - rotary position embedding tables ----------------*- C++ -*-===//
//
// Frequencies from checks/attention/Rope.h (transformers' default and YaRN,
// the attention factor multiplied into cos and sin). Angles
// are formed in f32 as transformers does (inv_freq and inv_freq·position
// rounded to f32): at long context that rounding moves the angle more than
// any f32/f64 difference elsewhere, so the reference's rounding is the one
// to follow.
//
// Pairing (`rope.style`), for i < d/2 of the rotated slice x -> y:
//   half:        (x[i], x[i + d/2])  -> (y[i], y[i + d/2])   rotate_half
//   interleaved: (x[2i], x[2i + 1])  -> (y[i], y[i + d/2])
// `interleaved` follows transformers' DeepSeek (rope_interleave): the
// adjacent pairs are de-interleaved and then rotated like `half`, so the
// output holds the rotated even features, then the rotated odd ones. Dot
// products between vectors rotated the same way equal those of DeepSeek's
// in-place complex rotation.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_ATTENTION_ROPE_H_
#define RUNTIME_KERNELS_CPU_ATTENTION_ROPE_H_

#include <cstdint>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/checks/attention/Rope.h"

namespace moec::runtime::cpu::attention {

using checks::attention::attentionFactor;
using checks::attention::inverseFrequencies;
using checks::attention::readRope;
using checks::attention::RopeSpec;
using checks::attention::YarnParams;

/// cos/sin of every token's position, ready to rotate slices of `spec.dim`.
class RopeTable {
public:
  /// `positions` must be validated (i32/i64, one per token) by the caller.
  RopeTable(const RopeSpec &spec, const TensorRef &positions);

  int64_t dim() const { return half * 2; }
  /// y = rotation of x at token t; x and y must not overlap.
  void rotate(int64_t t, const float *x, float *y) const;
  /// dx = transpose rotation of dy (the gradient); dy and dx must not overlap.
  void rotateBack(int64_t t, const float *dy, float *dx) const;

private:
  int64_t half = 0;
  bool interleaved = false;
  std::vector<float> cosines, sines; // [tokens, half]
};

} // namespace moec::runtime::cpu::attention

#endif // RUNTIME_KERNELS_CPU_ATTENTION_ROPE_H_
