//===- Pipelines.h - named pass pipelines -----------------------*- C++ -*-===//
//
// `moec compile` runs these; `moe-opt --moe-lora-training='...'` runs the
// same pipeline for pass authors and lit tests.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_PIPELINES_PIPELINES_H_
#define COMPILER_PIPELINES_PIPELINES_H_

#include <string>

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace moec::pipelines {

struct LoRATrainingOptions : public mlir::PassPipelineOptions<LoRATrainingOptions> {
  ListOption<std::string> loraTargets{
      *this, "lora-targets",
      llvm::cl::desc("Modules to adapt (q_proj, ..., all-linear, kda:o_proj); with neither "
                     "targets nor adapter-config the model keeps the trainable parameters it has")};
  Option<int64_t> loraRank{*this, "lora-rank", llvm::cl::desc("Adapter rank r"),
                           llvm::cl::init(8)};
  Option<double> loraAlpha{*this, "lora-alpha", llvm::cl::desc("Adapter alpha (scale alpha/r)"),
                           llvm::cl::init(16.0)};
  Option<double> loraDropout{*this, "lora-dropout", llvm::cl::desc("Adapter dropout"),
                             llvm::cl::init(0.0)};
  Option<bool> expertLora{*this, "expert-lora",
                          llvm::cl::desc("Also adapt routed experts' gate/up/down, one adapter per expert"),
                          llvm::cl::init(false)};
  Option<bool> rslora{*this, "rslora", llvm::cl::desc("Scale updates by alpha/sqrt(r) (rsLoRA)"),
                      llvm::cl::init(false)};
  Option<std::string> adapterConfig{
      *this, "adapter-config",
      llvm::cl::desc("A PEFT adapter_config.json (or its directory) whose r, lora_alpha, "
                     "lora_dropout, target_modules and use_rslora replace the lora options"),
      llvm::cl::init("")};
  Option<std::string> recompute{*this, "recompute",
                                llvm::cl::desc("none, regather or per-layer (see --moe-build-training-step)"),
                                llvm::cl::init("none")};
  Option<std::string> expertBackward{
      *this, "expert-backward",
      llvm::cl::desc("auto, fused or separate: one backward for an expert MLP and its combine, the "
                     "expert outputs not saved (see --moe-build-training-step)"),
      llvm::cl::init("auto")};
  Option<double> lr{*this, "lr", llvm::cl::desc("Peak learning rate"), llvm::cl::init(1e-4)};
  Option<int64_t> warmupSteps{*this, "warmup-steps", llvm::cl::desc("Linear warmup steps"),
                              llvm::cl::init(10)};
  Option<int64_t> totalSteps{*this, "total-steps", llvm::cl::desc("Steps of the schedule"),
                             llvm::cl::init(1000)};
  Option<std::string> schedule{*this, "schedule", llvm::cl::desc("cosine or constant"),
                               llvm::cl::init("cosine")};
  Option<double> weightDecay{*this, "weight-decay", llvm::cl::desc("AdamW decoupled weight decay"),
                             llvm::cl::init(0.0)};
  Option<double> maxGradNorm{*this, "max-grad-norm",
                             llvm::cl::desc("Clip the global gradient norm (0 = off)"),
                             llvm::cl::init(1.0)};
  Option<int64_t> seqLen{*this, "seq-len", llvm::cl::desc("Tokens per sequence"),
                         llvm::cl::init(4096)};
  Option<int64_t> microBatch{*this, "micro-batch", llvm::cl::desc("Sequences per step"),
                             llvm::cl::init(1)};
  Option<bool> fuse{*this, "fuse",
                    llvm::cl::desc("Fuse the LM head with the loss (--moe-fuse) after the training step"),
                    llvm::cl::init(true)};
  Option<bool> fuseLora{*this, "fuse-lora",
                        llvm::cl::desc("After the training step, each adapted projection's forward as one "
                                       "moe.lora_linear (--moe-fuse-lora)"),
                        llvm::cl::init(false)};
  Option<int64_t> fuseChunkTokens{*this, "fuse-chunk-tokens",
                                  llvm::cl::desc("Rows of logits the fused LM head and loss hold at a time"),
                                  llvm::cl::init(1024)};
  Option<std::string> mesh{*this, "mesh",
                           llvm::cl::desc("Device mesh, e.g. dp=2 (--moe-propagate-sharding); empty = one rank"),
                           llvm::cl::init("")};
  Option<std::string> epExchange{*this, "ep-exchange",
                                 llvm::cl::desc("How expert parallel moves tokens: routed, all or auto"),
                                 llvm::cl::init("auto")};
  Option<double> epCapacityFactor{
      *this, "ep-capacity-factor",
      llvm::cl::desc("With ep > 1: room for this many times what uniform routing sends a rank (>= 1; "
                     "0: room for every token of every rank)"),
      llvm::cl::init(0.0)};
  Option<int64_t> tokenBlocks{*this, "token-blocks",
                              llvm::cl::desc("With ep > 1: each MoE block's expert exchange on this many "
                                             "blocks of its tokens (1: whole)"),
                              llvm::cl::init(1)};
  ListOption<std::string> tpReplicate{
      *this, "tp-replicate",
      llvm::cl::desc("With tp > 1: region kinds kept whole on every tp rank (attention, latent-attention, "
                     "linear-attention, mlp, experts)")};
  Option<bool> sequenceParallel{*this, "sequence-parallel",
                                llvm::cl::desc("With tp > 1: the hidden states between split regions in "
                                               "rows over tp (reduce-scatter / all-gather)"),
                                llvm::cl::init(false)};
  Option<bool> overlap{*this, "overlap",
                       llvm::cl::desc("On a mesh: the expert exchange and the gradient sums on a second "
                                      "stream (--moe-schedule-overlap)"),
                       llvm::cl::init(false)};
  Option<int64_t> pipelineMicroBatches{
      *this, "pipeline-micro-batches",
      llvm::cl::desc("Micro-batches per step on a pipeline (mesh pp > 1; 0: 2 x pp)"), llvm::cl::init(0)};
  Option<std::string> memoryCap{*this, "memory-cap",
                                llvm::cl::desc("Most bytes per rank (80GiB); empty = no cap"),
                                llvm::cl::init("")};
};

/// LoRA injection (when targets are given), the training step, sharding (when a mesh is
/// given), fusion (unless `fuse` is off),
/// memory planning.
void buildLoRATrainingPipeline(mlir::OpPassManager &pm, const LoRATrainingOptions &options);

/// Registers `moe-lora-training` with the global pipeline registry.
void registerPipelines();

} // namespace moec::pipelines

#endif // COMPILER_PIPELINES_PIPELINES_H_
