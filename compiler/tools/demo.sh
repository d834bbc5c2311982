#!/usr/bin/env bash
# The main job on bundled data: compile the bundled tiny MoE (models/tiny-qwen3-moe), give it
# random weights, fine-tune LoRA adapters on its synthetic task (train.jsonl: a fixed cycle
# through 32 tokens, which the adapters learn), write the PEFT adapter, and compare the loss
# before and after; then compile every bundled config to a plan. Runs on the GPU when there is
# one (moe-run --backend auto), else on the CPU.
# Run through `bazel run //compiler/tools:demo`; writes to out/ in the source tree.
set -euo pipefail
moec="$PWD/$1"
moe_run="$PWD/$2"
root="${BUILD_WORKSPACE_DIRECTORY:-$PWD}"
out="$root/out/demo"
rm -rf "$out" && mkdir -p "$out"
tiny="$root/models/tiny-qwen3-moe"
threads="$(nproc)"

echo "=== 1. compile models/tiny-qwen3-moe: LoRA r=16 on every projection, 4 x 64 tokens per step"
"$moec" compile "$tiny/config.json" --lora-targets all-linear --lora-rank 16 --lora-alpha 32 \
  --seq-len 64 --micro-batch 4 --lr 3e-3 --warmup-steps 20 --total-steps 300 --emit=report
"$moec" compile "$tiny/config.json" --lora-targets all-linear --lora-rank 16 --lora-alpha 32 \
  --seq-len 64 --micro-batch 4 --lr 3e-3 --warmup-steps 20 --total-steps 300 -o "$out/plan.moeplan"

echo; echo "=== 2. a random base model"
"$moe_run" init "$tiny/config.json" --seed 0 -o "$out/model" --plan "$out/plan.moeplan"

echo; echo "=== 3. fine-tune 300 steps on $tiny/train.jsonl"
"$moe_run" forward --plan "$out/plan.moeplan" --model "$out/model" --data "$tiny/train.jsonl" \
  --batches 8 --threads "$threads" --backend auto | sed 's/^/before: /'
"$moe_run" train --plan "$out/plan.moeplan" --model "$out/model" --data "$tiny/train.jsonl" \
  --out "$out/run" --steps 300 --log-every 50 --threads "$threads" --backend auto
"$moe_run" forward --plan "$out/plan.moeplan" --model "$out/model" --data "$tiny/train.jsonl" \
  --adapter "$out/run/adapter" --batches 8 --threads "$threads" --backend auto | sed 's/^/after (adapter reloaded): /'

echo; echo "=== 4. every bundled model compiles to a plan (all-linear LoRA r=8, 4096 tokens)"
mkdir -p "$out/plans"
for config in "$root"/models/*/config.json; do
  name="$(basename "$(dirname "$config")")"
  printf '%-28s ' "$name"
  "$moec" compile "$config" -o "$out/plans/$name.moeplan" 2>&1
done
echo
echo "everything is in $out: plan.moeplan, model/ (random weights), run/adapter (PEFT),"
echo "run/checkpoint.safetensors (resume with moe-run train ... --resume), run/metrics.jsonl, plans/"
