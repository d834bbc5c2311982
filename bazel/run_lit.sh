#!/usr/bin/env bash
# Runs one lit test under `bazel test`: puts every tool's folder on PATH, lays the test next to
# tests/lit.cfg.py in a scratch suite (lit looks for its config in the test's parent folders),
# then calls the system lit.
set -euo pipefail
test_file="$1"; lit="$2"; shift 2
for tool in "$@"; do
  PATH="$(cd "$(dirname "$tool")" && pwd):$PATH"
done
export PATH
export MOEC_SRC_ROOT="$PWD"
export MOEC_TEST_SRC_DIR="$PWD/$(dirname "$test_file")"
suite="${TEST_TMPDIR:-$(mktemp -d)}/suite"
mkdir -p "$suite/$(dirname "$test_file")"
ln -sf "$PWD/tests/lit.cfg.py" "$suite/lit.cfg.py"
ln -sf "$PWD/$test_file" "$suite/$test_file"
exec python3 "$lit" -v "$suite/$test_file"
