#!/usr/bin/env bash
# The main job, as far as it exists: import every bundled model config (and the golden tiny
# models when ../shared/golden is there), write its moe IR, and print its summary.
# Run through `bazel run //compiler/tools:demo`; writes to out/ in the source tree.
set -euo pipefail
moec="$PWD/$1"
root="${BUILD_WORKSPACE_DIRECTORY:-$PWD}"
out="$root/out/models"
mkdir -p "$out"
configs=("$root"/models/*/config.json)
[ -d "$root/../shared/golden" ] && configs+=("$root"/../shared/golden/*/config.json)
for config in "${configs[@]}"; do
  name="$(basename "$(dirname "$config")")"
  echo "=== $name ($config)"
  "$moec" import "$config" -o "$out/$name.mlir"
  "$moec" import "$config" --emit=summary 2>/dev/null
  echo
done
echo "moe IR for ${#configs[@]} models written to $out/"
