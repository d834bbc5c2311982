//===- DeltaRule.h - pieces shared by the Gated DeltaNet and KDA kernels -*- C++ -*-===//
//
// Both mixers are: short causal depthwise conv + SiLU, L2-normalised q and k,
// the gated delta rule per head, a gated RMSNorm per head. The pieces here
// work on token-major double arrays ([T, width], rows [b*seqLen, (b+1)*seqLen)
// are sequence b) and restart the conv and the recurrent state at each
// sequence start. Every reduction runs in a fixed order, so results do not
// depend on the thread count.
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_DELTARULE_H_
#define RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_DELTARULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/Kernel.h"
#include "runtime/kernels/checks/linear_attention/LaunchChecks.h"

namespace moec::runtime::cpu::linattn {

using Doubles = std::vector<double>;

double sigmoid(double x);
/// torch.nn.functional.softplus (beta 1, threshold 20: x itself above 20).
double softplus(double x);
/// Its derivative, with the same threshold.
double softplusGrad(double x);

// The launch checks every kernel here shares with its CUDA twin.
using checks::linattn::convWidth;
using checks::linattn::expectNumel;
using checks::linattn::positiveAttr;
using checks::linattn::Tokens;
using checks::linattn::tokensOf;

/// The f32 data of `t`, or a failure naming `what`.
float *floatsOf(const KernelContext &ctx, const TensorRef &t, const char *what);

/// Where a `.backward` launch keeps its output gradient and writes each operand's gradient.
class BackwardLayout {
public:
  /// Checks the launch against Kernel.h's contract; `resultShape` is the forward result's shape.
  BackwardLayout(const KernelContext &ctx, size_t numOperands,
                 const std::vector<int64_t> &resultShape);
  /// The gradient of the forward result, or null when none flows (all gradients zero).
  const float *resultGrad() const { return grad; }
  /// Copies `values` into the gradient output of forward operand `operand`, if asked for.
  void write(int64_t operand, const Doubles &values) const;

private:
  const KernelContext &ctx;
  const float *grad = nullptr;
};

/// out[t,c] = SiLU(sum_j w[c,j] * x[t-K+1+j, c]), taps before the sequence start are zero.
/// x, out: [T, channels]; w: [channels, 1, K].
void convSiluForward(const KernelContext &ctx, const Tokens &tokens, const Doubles &x,
                     int64_t channels, const float *w, int64_t width, Doubles &out);
/// Gradients of convSiluForward: dx [T, channels] and dw [channels * K].
void convSiluBackward(const KernelContext &ctx, const Tokens &tokens, const Doubles &x,
                      int64_t channels, const float *w, int64_t width, const Doubles &dout,
                      Doubles &dx, Doubles &dw);

/// Per row of `dim` values: y = x * scale / sqrt(sum x^2 + 1e-6) (FLA's and
/// transformers' l2norm, eps inside the root); `inv` keeps 1 / sqrt(...) per row.
void l2NormForward(const Doubles &x, int64_t dim, double scale, Doubles &y, Doubles &inv);
void l2NormBackward(const Doubles &x, int64_t dim, double scale, const Doubles &inv,
                    const Doubles &dy, Doubles &dx);

/// The gated delta rule, per value head h and sequence, S_0 = 0 ([dk, dv]):
///   S = Diag(exp(g_t)) S;  u = beta_t (v_t - S^T k_t);  S = S + k_t u^T;  o_t = S^T q_t
/// Value head h reads key head h / (heads / keyHeads) (transformers' repeat_interleave).
/// g is one log-decay per head (Gated DeltaNet) or per head and key channel (KDA).
struct DeltaRule {
  int64_t heads = 0, keyHeads = 0, keyDim = 0, valueDim = 0;
  bool channelDecay = false;
  const double *q = nullptr, *k = nullptr; // [T, keyHeads * keyDim], normalised (q also scaled)
  const double *v = nullptr;               // [T, heads * valueDim]
  const double *beta = nullptr;            // [T, heads]
  const double *logDecay = nullptr;        // [T, heads] or [T, heads * keyDim]

  int64_t decayWidth() const { return channelDecay ? heads * keyDim : heads; }
};

/// o: [T, heads * valueDim].
void deltaRuleForward(const KernelContext &ctx, const Tokens &tokens, const DeltaRule &rule,
                      Doubles &o);

/// Gradients of deltaRuleForward given dO. dq, dk are per value head
/// ([T, heads * keyDim]; the caller sums the heads sharing a key head).
struct DeltaRuleGrads {
  Doubles q, k, v, beta, logDecay;
};
void deltaRuleBackward(const KernelContext &ctx, const Tokens &tokens, const DeltaRule &rule,
                       const Doubles &dO, DeltaRuleGrads &grads);

/// The output gate's activation: SiLU (Qwen3NextRMSNormGated), sigmoid (Kimi-Linear's o_norm).
enum class GateActivation { Silu, Sigmoid };

/// Per head of `dim` values: y = o / sqrt(mean(o^2) + eps) * w * act(gate), all in f32-or-wider
/// (norm before gate). o, gate: [T, heads * dim]; y: f32 [T, heads * dim].
void gatedNormForward(const KernelContext &ctx, const Doubles &o, const Doubles &gate,
                      const float *w, int64_t dim, double eps, GateActivation act, float *y);
/// Gradients given dy (f32 [T, heads * dim]): dO, dGate like o, dW [dim].
void gatedNormBackward(const KernelContext &ctx, const Doubles &o, const Doubles &gate,
                       const float *w, int64_t dim, double eps, GateActivation act, const float *dy,
                       Doubles &dO, Doubles &dGate, Doubles &dW);

} // namespace moec::runtime::cpu::linattn

#endif // RUNTIME_KERNELS_CPU_LINEAR_ATTENTION_DELTARULE_H_
