#!/usr/bin/env bash
# Installs the Debian packages the build needs. Idempotent: does nothing when all are present.
set -euo pipefail
packages=(
  bazel-bootstrap bazel-skylib bazel-rules-java bazel-platforms
  libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools
  libgtest-dev libgmock-dev libabsl-dev libprotobuf-dev protobuf-compiler
  python3 g++ zlib1g-dev libzstd-dev libopenblas-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done" >&2
