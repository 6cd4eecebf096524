#!/usr/bin/env bash
# Installs everything multilane needs on a fresh Debian machine, idempotently:
#   - Debian packages: prometheus (tests start it on 127.0.0.1), a JRE for Spark if java is missing;
#   - a virtualenv in .venv with multilane and all its extras (editable).
# Prints the venv's python path as its last line. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
fi
# The Debian package starts nothing by itself in a container, but stop it if a service manager did.
if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop prometheus >/dev/null 2>&1 || true; fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv" >&2
  "$PY" -m venv .venv >&2
fi
stamp=.venv/.multilane-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "bootstrap: installing multilane[all] into .venv" >&2
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e '.[all]' >&2
  touch "$stamp"
fi
echo "$(pwd)/.venv/bin/python"
