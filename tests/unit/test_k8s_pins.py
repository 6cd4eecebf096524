"""The real-cluster tier's versions agree: scripts/k8s-binaries.sh, deps/k8s/go.mod (every staging
module replaced by the published one of the same release) and multilane.testing.cluster."""

from __future__ import annotations

import re
from pathlib import Path

from multilane.testing.cluster import K8S_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_versions_agree_across_script_module_and_cluster() -> None:
    script = (ROOT / "scripts" / "k8s-binaries.sh").read_text()
    gomod = (ROOT / "deps" / "k8s" / "go.mod").read_text()
    k8s = re.search(r"^K8S_VERSION=(\S+)", script, re.M)
    etcd = re.search(r"^ETCD_VERSION=(\S+)", script, re.M)
    assert k8s and etcd
    assert k8s.group(1) == K8S_VERSION
    assert f"\tk8s.io/kubernetes v{K8S_VERSION}\n" in gomod
    assert f"\tgo.etcd.io/etcd/server/v3 v{etcd.group(1)}\n" in gomod
    staging = "v0." + K8S_VERSION.split(".", 1)[1]
    replaces = re.findall(r"^\t(k8s\.io/\S+) => (k8s\.io/\S+) (\S+)$", gomod, re.M)
    assert len(replaces) >= 30  # every staging module of k8s.io/kubernetes
    assert all(old == new and version == staging for old, new, version in replaces), replaces
    assert (ROOT / "deps" / "k8s" / "go.sum").stat().st_size > 0


def test_helm_pin_agrees_with_its_module_and_the_control_plane_release() -> None:
    """deps/helm pins the Helm CLI of the script's HELM_VERSION, a v3 release built against the
    k8s.io client modules of the control plane's minor release."""
    script = (ROOT / "scripts" / "k8s-binaries.sh").read_text()
    gomod = (ROOT / "deps" / "helm" / "go.mod").read_text()
    helm = re.search(r"^HELM_VERSION=(\S+)", script, re.M)
    assert helm and helm.group(1).startswith("3.")
    assert f"require helm.sh/helm/v3 v{helm.group(1)}\n" in gomod
    client_go = re.search(r"^\tk8s\.io/client-go v0\.(\d+)\.\d+ // indirect$", gomod, re.M)
    assert client_go and client_go.group(1) == K8S_VERSION.split(".")[1], client_go
    assert (ROOT / "deps" / "helm" / "go.sum").stat().st_size > 0
