#!/usr/bin/env bash
# Fails when a committed generated doc differs from what mlir-tblgen produces now.
# Arguments: pairs of (fresh, committed) files.
set -euo pipefail
status=0
while [ $# -ge 2 ]; do
  fresh="$1"; committed="$2"; shift 2
  if ! diff -u "$committed" "$fresh" > /dev/null; then
    diff -u "$committed" "$fresh" | head -40
    echo "$committed is stale: run docs/update_generated_docs.sh" >&2
    status=1
  fi
done
exit $status
