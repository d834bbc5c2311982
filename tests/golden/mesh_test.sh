#!/usr/bin/env bash
# One golden family: moe-mesh-check on the directory of the given config.json (more flags after it).
set -euo pipefail
exec "$1" "$(dirname "$2")" "${@:3}"
