#!/usr/bin/env bash
# Fails when a committed generated doc differs from what mlir-tblgen produces now.
set -euo pipefail
fresh="$1"; committed="$2"
if ! diff -u "$committed" "$fresh" > /dev/null; then
  diff -u "$committed" "$fresh" | head -40
  echo "docs/generated/$(basename "$committed") is stale: run docs/update_generated_docs.sh" >&2
  exit 1
fi
