#!/usr/bin/env bash
# Installs what multilane needs on a fresh Debian machine, idempotently, for one set of extras:
#
#   bash scripts/bootstrap.sh          # `all`: everything the tests and CI need
#   bash scripts/bootstrap.sh demo     # only what `multilane demo` runs (scripts/demo.sh)
#
# - `all` also installs Debian packages: prometheus and shellcheck (tests), a JRE for Spark and Apache
#   Kafka if `java` is missing, Maven if `mvn` is; then Apache Kafka's jars (scripts/kafka-jars.sh,
#   for the tests' `--broker=apache`). `demo` needs none of these.
# - `all` also builds the real control plane for the cluster tier (tests/cluster, docs/real-cluster.md):
#   etcd, kube-apiserver, kube-controller-manager and kubectl from the pinned Go module deps/k8s, once
#   per version (scripts/k8s-binaries.sh: 766 s of CPU the first time, seconds after). Needs
#   Go; without it this says so and the tier skips (fails under CI=true). MULTILANE_K8S_BUILD=0 skips.
# - A virtualenv in .venv gets multilane (editable) with the extras, at the versions CI tested:
#   constraints.txt (refresh it with scripts/refresh-constraints.sh).
# Prints the venv's python path as its last line. Safe to run again; an `all` install also serves
# the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRAS=${1:-all}
case "$EXTRAS" in
  all|demo) ;;
  *) echo "bootstrap: unknown set of extras '$EXTRAS' (use all or demo)" >&2; exit 2 ;;
esac

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

need_apt=()
if [ "$EXTRAS" = all ]; then
  command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
  command -v shellcheck >/dev/null 2>&1 || need_apt+=(shellcheck)
  command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}" >&2
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >&2
  # The Debian package starts nothing by itself in a container, but stop it if a service manager did.
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop prometheus >/dev/null 2>&1 || true; fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv" >&2
  "$PY" -m venv .venv >&2
fi

# An install is current when its stamp is newer than pyproject.toml and constraints.txt.
current() {
  local stamp=".venv/.multilane-installed-$1"
  [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! constraints.txt -nt "$stamp" ]
}
if ! current "$EXTRAS" && ! current all; then
  echo "bootstrap: installing multilane[$EXTRAS] into .venv (versions from constraints.txt)" >&2
  PIP_DISABLE_PIP_VERSION_CHECK=1 .venv/bin/python -m pip install -q -c constraints.txt -e ".[$EXTRAS]" >&2
  touch ".venv/.multilane-installed-$EXTRAS"
fi
if [ "$EXTRAS" = all ]; then
  bash scripts/kafka-jars.sh >/dev/null
fi
if [ "$EXTRAS" = all ] && [ "${MULTILANE_K8S_BUILD:-1}" != 0 ]; then
  if command -v go >/dev/null 2>&1; then
    k8s_bin=$(bash scripts/k8s-binaries.sh | tail -n 1)  # a failed build fails the bootstrap
    echo "bootstrap: Kubernetes binaries in $k8s_bin" >&2
  else
    echo "bootstrap: no Go toolchain: the real-cluster tier (tests/cluster) cannot run here" >&2
  fi
fi
echo "$(pwd)/.venv/bin/python"
