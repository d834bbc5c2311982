#!/usr/bin/env bash
# The main job, as far as it exists: compile the default model (Qwen3-30B-A3B, LoRA r=32 on
# q/k/v/o, 4096 tokens) to a training plan and print its report; then compile every bundled
# config (and the golden tiny models when ../shared/golden is there) to a plan under out/plans/.
# Running plans (the runtime) is not there yet. Run through `bazel run //compiler/tools:demo`.
set -euo pipefail
moec="$PWD/$1"
root="${BUILD_WORKSPACE_DIRECTORY:-$PWD}"
out="$root/out/plans"
mkdir -p "$out"

echo "=== default: models/qwen3-30b-a3b, LoRA r=32 alpha=64 on q/k/v/o, 4096 tokens"
"$moec" compile "$root/models/qwen3-30b-a3b/config.json" --lora-rank 32 --lora-alpha 64 \
  --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 --emit=report
"$moec" compile "$root/models/qwen3-30b-a3b/config.json" --lora-rank 32 --lora-alpha 64 \
  --lora-targets q_proj,k_proj,v_proj,o_proj --seq-len 4096 -o "$out/qwen3-30b-a3b.moeplan"
echo

configs=("$root"/models/*/config.json)
[ -d "$root/../shared/golden" ] && configs+=("$root"/../shared/golden/*/config.json)
echo "=== every bundled model: all-linear LoRA r=8, 4096 tokens"
for config in "${configs[@]}"; do
  name="$(basename "$(dirname "$config")")"
  printf '%-28s ' "$name"
  "$moec" compile "$config" -o "$out/$name.moeplan" 2>&1
done
echo "plans for ${#configs[@]} models written to $out/ (inspect one with: moec compile CONFIG --emit=plan-text)"
