//===- Rope.h - RoPE attributes and frequencies of the attention kernels -===//
//
// Frequencies as transformers computes them (modeling_rope_utils.py): the
// default θ^(-2i/d), or YaRN's blend of interpolated and extrapolated
// frequencies with its attention factor multiplied into cos and sin. The CPU
// tables (cpu/attention/Rope.h) and the CUDA kernels (cuda/attention) both
// start from these f32 numbers.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CHECKS_ATTENTION_ROPE_H_
#define RUNTIME_KERNELS_CHECKS_ATTENTION_ROPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"

namespace moec::runtime::checks::attention {

struct YarnParams {
  double factor = 1, betaFast = 32, betaSlow = 1, mscale = 1, mscaleAllDim = 0;
  int64_t originalMaxPosition = 0;
  bool truncate = true; // round the ramp's ends to whole dimensions (gpt-oss: false)
};

struct RopeSpec {
  double theta = 10000;
  int64_t dim = 0; // rotated features per head (even)
  bool interleaved = false;
  std::optional<YarnParams> yarn;
};

/// The flattened RoPE attribute `<prefix>.theta/.dim/.style[/.yarn.*]`
/// (`.yarn.truncate`, a flag, is optional: absent = true, as transformers); null
/// when `<prefix>.dim` is absent and `required` is false. Fails on a bad or
/// incomplete attribute, or when dim exceeds `maxDim`.
std::optional<RopeSpec> readRope(const KernelContext &ctx, const std::string &prefix, bool required,
                                 int64_t maxDim);

/// f32 inverse frequencies (dim/2 of them) and the cos/sin scale.
std::vector<float> inverseFrequencies(const RopeSpec &spec);
float attentionFactor(const RopeSpec &spec);

} // namespace moec::runtime::checks::attention

#endif // RUNTIME_KERNELS_CHECKS_ATTENTION_ROPE_H_
