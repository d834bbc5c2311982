#!/usr/bin/env bash
# The bf16 mesh check, with its noise floor (a tensor may be up to the tolerance farther from
# the f32 run than one bf16 rank is), still fails a wrong run: none of the mesh's gradients,
# scaled by 1.1, may pass.
# Args: moe-mesh-check, the family's config.json, then moe-mesh-check's flags.
set -euo pipefail
status=0
"$1" "$(dirname "$2")" "${@:3}" --perturb-mesh-grads 1.1 >"${TEST_TMPDIR:-/tmp}/log" 2>&1 || status=$?
tail -1 "${TEST_TMPDIR:-/tmp}/log"
if [ "$status" -ne 1 ]; then
  echo "FAIL: moe-mesh-check exited $status with the mesh's gradients scaled by 1.1 (expected 1: tensors outside tolerance)"
  exit 1
fi
grep -q "against f32" "${TEST_TMPDIR:-/tmp}/log" || { echo "FAIL: no tensor was judged against the f32 run"; exit 1; }
if grep -E '^grad\..*PASS' "${TEST_TMPDIR:-/tmp}/log"; then
  echo "FAIL: the gradients above passed although scaled by 1.1"
  exit 1
fi
echo "PASS: every scaled gradient fails the check"
