#!/usr/bin/env bash
# Builds the upstream control plane that the real-cluster tier runs, once per version, and prints
# the directory that holds it (last line of stdout):
#
#   bash scripts/k8s-binaries.sh            # build if needed, print the bin dir
#   bash scripts/k8s-binaries.sh --check    # print the bin dir if it is built, else exit 1
#
# - Binaries: kube-apiserver, kube-controller-manager, kubectl (k8s.io/kubernetes) and etcd
#   (go.etcd.io/etcd/server/v3), from the pinned module deps/k8s (go.mod + go.sum fix every version);
#   helm (helm.sh/helm/v3/cmd/helm) from the pinned module deps/helm, into the same directory. Helm is
#   a module of its own because it requires newer golang.org/x modules than Kubernetes v1.34.4: in
#   deps/k8s it would move the control plane's pins. It has its own stamp (.pins-helm), so adding or
#   moving Helm does not rebuild the control plane.
# - Cache: ${MULTILANE_K8S_CACHE:-${XDG_CACHE_HOME:-~/.cache}/multilane/k8s}/v$K8S_VERSION/bin, with a
#   stamp holding the hash of deps/k8s/go.mod and go.sum: a second run with the same pins only checks
#   the stamp (well under a second). A different pin rebuilds.
# - Built as upstream does (CGO_ENABLED=0, -trimpath, stripped) with the version ldflags, so
#   `/version` and `kubectl version` report v$K8S_VERSION instead of v0.0.0-master.
# - Go parallelism is limited (GOFLAGS=-p=2 by default, MULTILANE_K8S_BUILD_P to change) and each
#   compiler process gets a soft memory limit, for 2-core CI machines shared with tests. The first
#   build's wall time and load average are printed to stderr (docs/real-cluster.md keeps figures).
# - Needs Go >= 1.24 and the Go module proxy. Concurrent runs wait on a lock; the bin dir is filled
#   in a temporary directory and renamed, so it is never half written.
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION=1.34.4   # keep in step with deps/k8s/go.mod (k8s.io/kubernetes v1.34.4, staging v0.34.4)
ETCD_VERSION=3.6.4   # keep in step with deps/k8s/go.mod (go.etcd.io/etcd/server/v3 v3.6.4)
HELM_VERSION=3.19.5  # keep in step with deps/helm/go.mod (helm.sh/helm/v3 v3.19.5)
BINARIES=(kube-apiserver kube-controller-manager kubectl etcd)

MODULE_DIR="$(pwd)/deps/k8s"
HELM_MODULE_DIR="$(pwd)/deps/helm"
CACHE_ROOT=${MULTILANE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/multilane/k8s}
VERSION_DIR="$CACHE_ROOT/v$K8S_VERSION"
BIN_DIR="$VERSION_DIR/bin"
STAMP="$BIN_DIR/.pins"
HELM_STAMP="$BIN_DIR/.pins-helm"
pins="$(cat "$MODULE_DIR/go.mod" "$MODULE_DIR/go.sum" | sha256sum | cut -d' ' -f1)"
helm_pins="$(cat "$HELM_MODULE_DIR/go.mod" "$HELM_MODULE_DIR/go.sum" | sha256sum | cut -d' ' -f1)"

k8s_built() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$pins" ] || return 1
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN_DIR/$b" ] || return 1; done
}
helm_built() {
  [ -f "$HELM_STAMP" ] && [ "$(cat "$HELM_STAMP")" = "$helm_pins" ] && [ -x "$BIN_DIR/helm" ]
}
built() { k8s_built && helm_built; }

if built; then echo "$BIN_DIR"; exit 0; fi
if [ "${1:-}" = "--check" ]; then
  echo "k8s-binaries: not built for v$K8S_VERSION (and helm v$HELM_VERSION) in $BIN_DIR" \
    "(run bash scripts/k8s-binaries.sh)" >&2
  exit 1
fi
if ! command -v go >/dev/null 2>&1; then
  echo "k8s-binaries: the go command is missing (Go >= 1.24 builds the control plane)" >&2
  exit 1
fi

mkdir -p "$VERSION_DIR"
exec 9>"$VERSION_DIR/.lock"
flock 9
if built; then echo "$BIN_DIR"; exit 0; fi   # another run built it while this one waited

if ! k8s_built; then
  work="$(mktemp -d "$VERSION_DIR/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT

  export CGO_ENABLED=0
  export GOFLAGS="-p=${MULTILANE_K8S_BUILD_P:-2} -mod=readonly -trimpath -buildvcs=false"
  export GOMEMLIMIT=${GOMEMLIMIT:-3GiB}
  build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  major="${K8S_VERSION%%.*}"; rest="${K8S_VERSION#*.}"; minor="${rest%%.*}"
  kv=k8s.io/component-base/version
  k8s_ldflags="-s -w -X $kv.gitVersion=v$K8S_VERSION -X $kv.gitMajor=$major -X $kv.gitMinor=$minor"
  k8s_ldflags+=" -X $kv.gitTreeState=clean -X $kv.gitCommit= -X $kv.buildDate=$build_date"
  # client-go's copy of the version variables (clients' user agent) carries the same values.
  cv=k8s.io/client-go/pkg/version
  k8s_ldflags+=" -X $cv.gitVersion=v$K8S_VERSION -X $cv.gitMajor=$major -X $cv.gitMinor=$minor"
  k8s_ldflags+=" -X $cv.gitTreeState=clean -X $cv.gitCommit= -X $cv.buildDate=$build_date"

  echo "k8s-binaries: building Kubernetes v$K8S_VERSION and etcd v$ETCD_VERSION into $BIN_DIR" \
    "(GOFLAGS=$GOFLAGS; load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  start=$(date +%s)
  (
    cd "$MODULE_DIR"
    nice go build -o "$work/" -ldflags "$k8s_ldflags" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kubectl
    nice go build -o "$work/etcd" -ldflags "-s -w" go.etcd.io/etcd/server/v3
  )
  for b in "${BINARIES[@]}"; do [ -x "$work/$b" ] || { echo "k8s-binaries: $b was not built" >&2; exit 1; }; done
  echo "$pins" >"$work/.pins"
  chmod 0755 "$work"   # mktemp made it 0700
  rm -rf "$BIN_DIR.old"
  [ -d "$BIN_DIR" ] && mv "$BIN_DIR" "$BIN_DIR.old"
  mv "$work" "$BIN_DIR"
  rm -rf "$BIN_DIR.old"
  trap - EXIT
  echo "k8s-binaries: built in $(( $(date +%s) - start )) s wall on $(nproc) cores" \
    "(load average at the end $(cut -d' ' -f1-3 /proc/loadavg))" >&2
fi

if ! helm_built; then
  # Helm: its own module and stamp; the binary is renamed into the bin dir (never half written).
  export CGO_ENABLED=0
  export GOFLAGS="-p=${MULTILANE_K8S_BUILD_P:-2} -mod=readonly -trimpath -buildvcs=false"
  export GOMEMLIMIT=${GOMEMLIMIT:-3GiB}
  hv=helm.sh/helm/v3/internal/version
  echo "k8s-binaries: building helm v$HELM_VERSION into $BIN_DIR (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  start=$(date +%s)
  hwork="$(mktemp -d "$VERSION_DIR/.helm.XXXXXX")"
  trap 'rm -rf "$hwork"' EXIT
  (cd "$HELM_MODULE_DIR" && nice go build -o "$hwork/helm" \
    -ldflags "-s -w -X $hv.version=v$HELM_VERSION -X $hv.gitTreeState=clean" helm.sh/helm/v3/cmd/helm)
  mv "$hwork/helm" "$BIN_DIR/helm"
  echo "$helm_pins" >"$HELM_STAMP"
  rm -rf "$hwork"
  trap - EXIT
  echo "k8s-binaries: helm built in $(( $(date +%s) - start )) s wall" \
    "(load average at the end $(cut -d' ' -f1-3 /proc/loadavg))" >&2
fi
echo "$BIN_DIR"
