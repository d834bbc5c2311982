//===- PlanMemory.td - memory planning pass ----------------*- tablegen -*-===//

#ifndef PASSES_PLAN_MEMORY_PLANMEMORY_TD_
#define PASSES_PLAN_MEMORY_PLANMEMORY_TD_

include "mlir/Pass/PassBase.td"

def PlanMemoryPass : Pass<"moe-plan-memory", "::moec::moe::ModelOp"> {
  let summary = "Plans the training step's memory: liveness, arena offsets, peak per role.";
  let description = [{
    Flattens `@train_step` (on a pipeline each stage's `@train_step_stage<s>`,
    recording the largest stage's plan) for `seq-len x micro-batch` tokens (every layer
    instance, every value a buffer with a concrete shape and a live range
    over the ordered kernel launches), assigns arena offsets per role and
    records the arena sizes in the model's `memory_plan` attribute:
    weights, LoRA parameters, optimizer state (AdamW moments, f32),
    gradients, activations (values that cross layers: hidden states and
    what backward templates read), workspace (temporaries inside one layer,
    shared by all layers of a template) and inputs. Activations and
    workspace reuse memory whose live ranges do not overlap. Kernels that
    take scratch memory of their own (the fused LM head and loss of
    `--moe-fuse`, one chunk of logits) add `scratch`, the largest of them,
    to the peak.

    With `memory-cap` (bytes, or a number with KB/MB/GB/TB or KiB/MiB/GiB/TiB),
    a plan above the cap first lets every MoE layer gather its experts' token
    copies and run its norms and RoPE again in the backward instead of saving
    their results (the `regather`
    pair of `--moe-build-training-step`; `regather_layers` lists the layers);
    if that is not enough, it switches layers to per-layer recomputation,
    first layers first (their saved values live longest), until it fits; the
    `recompute_layers` attribute lists them. If even full recomputation
    does not fit, the pass fails and says how many bytes are missing.

    Before: a model after `--moe-build-training-step`. After:
    ```mlir
    moe.model @m attributes {memory_plan = {activations = 201326592 : i64,
        gradients = 6815744 : i64, inputs = 98560 : i64, lora_params = 6815744 : i64,
        micro_batch = 1 : i64, optimizer_state = 13631488 : i64, peak = ... : i64,
        seq_len = 4096 : i64, weights = ... : i64, workspace = ... : i64}, ...}
    ```
  }];
  let options = [
    Option<"seqLen", "seq-len", "int64_t", "4096", "Tokens per sequence">,
    Option<"microBatch", "micro-batch", "int64_t", "1", "Sequences per step">,
    Option<"memoryCap", "memory-cap", "std::string", "\"\"",
           "Most bytes one rank may use (80GiB, 141GB, 1000000); empty = no cap">,
  ];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_PLAN_MEMORY_PLANMEMORY_TD_
