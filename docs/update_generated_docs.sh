#!/usr/bin/env bash
# Regenerates docs/generated/ from the dialect's ODS (.td) files.
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build //dialects/moe:docs
install -m 644 bazel-bin/dialects/moe/MoeDialect.md docs/generated/MoeDialect.md
echo "updated docs/generated/MoeDialect.md"
