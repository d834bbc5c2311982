#!/usr/bin/env bash
# One golden family: moe-align on the directory of the given config.json (more flags after it).
set -euo pipefail
exec "$1" "$(dirname "$2")" --cpu-threads 2 "${@:3}"
