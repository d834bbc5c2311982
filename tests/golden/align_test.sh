#!/usr/bin/env bash
# One golden family: moe-align on the directory of the given config.json.
set -euo pipefail
exec "$1" "$(dirname "$2")" --cpu-threads 2
