#!/usr/bin/env bash
# Installs only what the demo needs (`scripts/bootstrap.sh demo`: multilane[demo], no Debian
# packages), then runs `multilane demo`: the embedded broker, the local control plane, a stateful
# IO-bound processor, and a burst of load. Extra arguments go to `multilane demo` (see
# `multilane demo --help`: longer runs, an outside broker).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/bootstrap.sh demo | tail -n 1)
exec "$PY" -m multilane demo "$@"
