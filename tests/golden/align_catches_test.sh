#!/usr/bin/env bash
# The bf16 check with transformers' noise floor (--bf16-spread) still fails a wrong model: the
# golden family with its adapter's lora_alpha 10% larger (every LoRA update scaled by 1.1) must
# not pass. Args: moe-align, the family's config.json, then moe-align's flags.
set -euo pipefail
dir="$(dirname "$2")"
copy="${TEST_TMPDIR:-$(mktemp -d)}/wrong_scale"
rm -rf "$copy" && mkdir -p "$copy/adapter"
for f in config.json model.safetensors golden.safetensors adapter/adapter_model.safetensors; do
  ln -s "$(realpath "$dir/$f")" "$copy/$f"
done
alpha=$(sed -n 's/.*"lora_alpha": *\([0-9.]*\).*/\1/p' "$dir/adapter/adapter_config.json")
wrong=$(awk -v a="$alpha" 'BEGIN { print a * 1.1 }')
sed "s/\"lora_alpha\": *$alpha/\"lora_alpha\": $wrong/" "$dir/adapter/adapter_config.json" >"$copy/adapter/adapter_config.json"
grep -q "\"lora_alpha\": $wrong" "$copy/adapter/adapter_config.json"
status=0
"$1" "$copy" --cpu-threads 2 "${@:3}" >"$copy/log" 2>&1 || status=$?
tail -1 "$copy/log"
if [ "$status" -ne 1 ]; then
  echo "FAIL: moe-align exited $status with lora_alpha $wrong instead of $alpha (expected 1: tensors outside tolerance)"
  exit 1
fi
echo "PASS: lora_alpha $wrong instead of $alpha fails the check"
