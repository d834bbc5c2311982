#!/usr/bin/env bash
# Regenerates docs/generated/ from the dialect's and the passes' ODS (.td) files.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //dialects/moe:docs //passes:docs
mkdir -p docs/generated/passes
install -m 644 bazel-bin/dialects/moe/MoeDialect.md docs/generated/MoeDialect.md
for doc in bazel-bin/passes/*/*.md; do
  install -m 644 "$doc" "docs/generated/passes/$(basename "$doc")"
done
echo "updated docs/generated/"
