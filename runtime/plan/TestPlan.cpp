//===- TestPlan.cpp - a small valid plan for the plan tests ---------------===//
//
// Each rank (r = 0, 1) holds, with 10 steps (0..9):
//
//   %0  weight     bf16 [32,64]     q_proj rows of rank r, bound with a slice
//   %1  weight     bf16 [4,16,64]   experts 4r..4r+3, bound with {expert}
//   %2  lora_param f32  [4,64]      lora_A          %3 lora_param f32 [32,4] lora_B
//   %4  gradient   f32  [4,64]      grad of %2      %5 gradient   f32 [32,4] grad of %3
//   %6..%9 optimizer_state          adam m/v of lora_A, then of lora_B
//   %10 input      i64  [2,128]     input_ids       %11 input f32 [] loss
//   %12 activation bf16 [256,64]    live 0..1       %13 activation bf16 [256,32] live 1..5
//   %14 workspace  f32  [256,64]    @0 live 5..6    %15 workspace f32 [256,64] @0 live 7..9
//
// Steps: #0 embedding, #1 linear (q_proj with LoRA), #2 record e0 (s0),
// #3 wait e0 (s1), #4 all_reduce g0 %13, #5 expert_mlp, #6 cross_entropy,
// #7 linear.backward, #8 all_reduce g0 %4, #9 accumulate_grad.
//
//===----------------------------------------------------------------------===//

#include "runtime/plan/TestPlan.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "runtime/plan/PlanFormat.h"

namespace moec::plan::testing {

uint32_t addTestBuffer(Rank &rank, const std::string &name, Role role, DType dtype,
                       std::initializer_list<int64_t> shape, int64_t offset, int32_t first, int32_t last) {
  Buffer *buffer = rank.add_buffers();
  buffer->set_id(rank.buffers_size() - 1);
  buffer->set_name(name);
  buffer->set_role(role);
  buffer->set_dtype(dtype);
  int64_t elements = 1;
  for (int64_t dim : shape) {
    buffer->add_shape(dim);
    elements *= dim;
  }
  buffer->set_offset(offset);
  buffer->set_size_bytes(elements * (dtype == BF16 ? 2 : dtype == I64 ? 8 : 4));
  buffer->set_first_step(first);
  buffer->set_last_step(last);
  return buffer->id();
}

namespace {

constexpr int kSteps = 10;

void addBuffer(Rank &rank, const std::string &name, Role role, DType dtype, std::initializer_list<int64_t> shape,
               int64_t offset, int32_t first = 0, int32_t last = kSteps - 1) {
  addTestBuffer(rank, name, role, dtype, shape, offset, first, last);
}

Step *addStep(Rank &rank, Phase phase, int32_t layer, uint32_t stream, const std::string &origin = "") {
  Step *step = rank.add_steps();
  step->set_phase(phase);
  step->set_layer(layer);
  step->set_stream(stream);
  step->set_origin(origin);
  return step;
}

Launch *addLaunch(Rank &rank, Phase phase, int32_t layer, const std::string &kernel,
                  std::initializer_list<uint32_t> inputs, std::initializer_list<uint32_t> outputs,
                  uint32_t stream = 0, const std::string &origin = "") {
  Launch *launch = addStep(rank, phase, layer, stream, origin)->mutable_launch();
  launch->set_kernel(kernel);
  for (uint32_t id : inputs)
    launch->add_inputs(id);
  for (uint32_t id : outputs)
    launch->add_outputs(id);
  return launch;
}

void addAllReduce(Rank &rank, Phase phase, int32_t layer, uint32_t buffer) {
  Collective *collective = addStep(rank, phase, layer, 1)->mutable_collective();
  collective->set_kind(Collective::ALL_REDUCE);
  collective->set_group(0);
  collective->add_inputs(buffer);
  collective->add_outputs(buffer);
}

void addArena(Rank &rank, Role role, int64_t size) {
  Arena *arena = rank.add_arenas();
  arena->set_role(role);
  arena->set_size_bytes(size);
}

void buildRank(Plan &plan, int r) {
  Rank &rank = *plan.add_ranks();
  rank.set_rank(r);
  rank.set_num_streams(2);
  rank.set_num_events(1);

  addArena(rank, WEIGHT, 12288);
  addArena(rank, LORA_PARAM, 1536);
  addArena(rank, GRADIENT, 1536);
  addArena(rank, OPTIMIZER_STATE, 3072);
  addArena(rank, INPUT, 2056);
  addArena(rank, ACTIVATION, 49152);
  addArena(rank, WORKSPACE, 65536);

  Group *tp = rank.add_groups();
  tp->set_axis("tp");
  tp->add_ranks(0);
  tp->add_ranks(1);

  addBuffer(rank, "model.layers.0.self_attn.q_proj.weight", WEIGHT, BF16, {32, 64}, 0);
  addBuffer(rank, "model.layers.0.mlp.experts.gate_proj", WEIGHT, BF16, {4, 16, 64}, 4096);
  addBuffer(rank, "q_proj.lora_A", LORA_PARAM, F32, {4, 64}, 0);
  addBuffer(rank, "q_proj.lora_B", LORA_PARAM, F32, {32, 4}, 1024);
  addBuffer(rank, "q_proj.lora_A.grad", GRADIENT, F32, {4, 64}, 0);
  addBuffer(rank, "q_proj.lora_B.grad", GRADIENT, F32, {32, 4}, 1024);
  addBuffer(rank, "q_proj.lora_A.adam_m", OPTIMIZER_STATE, F32, {4, 64}, 0);
  addBuffer(rank, "q_proj.lora_A.adam_v", OPTIMIZER_STATE, F32, {4, 64}, 1024);
  addBuffer(rank, "q_proj.lora_B.adam_m", OPTIMIZER_STATE, F32, {32, 4}, 2048);
  addBuffer(rank, "q_proj.lora_B.adam_v", OPTIMIZER_STATE, F32, {32, 4}, 2560);
  addBuffer(rank, "input_ids", INPUT, I64, {2, 128}, 0);
  addBuffer(rank, "loss", INPUT, F32, {}, 2048);
  addBuffer(rank, "layer0.x", ACTIVATION, BF16, {256, 64}, 0, 0, 1);
  addBuffer(rank, "layer0.q", ACTIVATION, BF16, {256, 32}, 32768, 1, 5);
  addBuffer(rank, "layer0.mlp_out", WORKSPACE, F32, {256, 64}, 0, 5, 6);
  addBuffer(rank, "layer0.dq", WORKSPACE, F32, {256, 64}, 0, 7, 9);

  WeightBinding *q = rank.add_weights();
  q->set_buffer(0);
  q->set_tensor("model.layers.0.self_attn.q_proj.weight");
  Slice::Range *rows = q->mutable_slice()->add_dims();
  rows->set_start(32 * r);
  rows->set_size(32);
  Slice::Range *cols = q->mutable_slice()->add_dims();
  cols->set_start(0);
  cols->set_size(64);

  WeightBinding *experts = rank.add_weights();
  experts->set_buffer(1);
  experts->set_tensor("model.layers.0.mlp.experts.{expert}.gate_proj.weight");
  experts->set_first_expert(4 * r);

  WeightBinding *loraA = rank.add_weights();
  loraA->set_buffer(2);
  loraA->set_tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");

  Launch *embedding = addLaunch(rank, FORWARD, -1, "embedding", {10}, {12});
  (*embedding->mutable_attrs())["vocab_size"].set_i(1000);

  Launch *linear = addLaunch(rank, FORWARD, 0, "linear", {12, 0, 2, 3}, {13}, 0, "model.layers.0.self_attn.q_proj");
  linear->set_variant("tile128");
  linear->set_flops(2097152);
  (*linear->mutable_attrs())["transpose_b"].set_b(true);
  (*linear->mutable_attrs())["lora_scale"].set_f(2.0);
  (*linear->mutable_attrs())["act"].set_s("none");
  Attr::Ints *perm = (*linear->mutable_attrs())["perm"].mutable_ints();
  perm->add_values(1);
  perm->add_values(0);

  addStep(rank, FORWARD, 0, 0)->mutable_record()->set_id(0);
  addStep(rank, FORWARD, 0, 1)->mutable_wait()->set_id(0);
  addAllReduce(rank, FORWARD, 0, 13);
  addLaunch(rank, FORWARD, 0, "expert_mlp", {13, 1}, {14}, 1)->set_flops(4194304);
  addLaunch(rank, FORWARD, -1, "cross_entropy", {14, 10}, {11}, 1);
  addLaunch(rank, BACKWARD, 0, "linear.backward", {11, 2, 3}, {15, 4, 5}, 1);
  addAllReduce(rank, BACKWARD, 0, 4);
  addLaunch(rank, BACKWARD, 0, "accumulate_grad", {15}, {5}, 1);
}

} // namespace

Plan makeValidPlan() {
  Plan plan;
  plan.set_version(kPlanVersion);
  plan.set_model("Qwen3MoeForCausalLM");
  plan.set_model_type("qwen3_moe");
  plan.set_seq_len(128);
  plan.set_micro_batch(2);
  plan.mutable_mesh()->set_tp(2);
  plan.set_recompute("per-layer");

  Optimizer *opt = plan.mutable_optimizer();
  opt->set_kind("adamw");
  opt->set_lr(1e-4);
  opt->set_beta1(0.9);
  opt->set_beta2(0.999);
  opt->set_eps(1e-8);
  opt->set_weight_decay(0);
  opt->set_warmup_steps(10);
  opt->set_total_steps(100);
  opt->set_schedule("cosine");
  opt->set_min_lr_ratio(0.1);
  opt->set_max_grad_norm(1.0);

  LoraLayout *lora = plan.mutable_lora();
  lora->set_r(4);
  lora->set_alpha(8);
  lora->add_target_modules("q_proj");
  const char *prefix = "base_model.model.model.layers.0.self_attn.q_proj.";
  const std::pair<const char *, uint32_t> tensors[] = {{"lora_A.weight", 2}, {"lora_B.weight", 3}};
  for (int t = 0; t < 2; ++t) {
    LoraTensor *tensor = lora->add_tensors();
    tensor->set_peft_name(std::string(prefix) + tensors[t].first);
    tensor->set_rank(0);
    tensor->set_param(tensors[t].second);
    tensor->set_grad(tensors[t].second + 2);
    tensor->set_adam_m(6 + 2 * t);
    tensor->set_adam_v(7 + 2 * t);
  }

  for (int r = 0; r < 2; ++r)
    buildRank(plan, r);
  return plan;
}

} // namespace moec::plan::testing
