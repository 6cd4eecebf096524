"""``multilane cluster up --detach`` / ``down`` as a person runs them: the kubeconfig it prints
reaches a kube-apiserver that reports the pinned version, a node that is Ready, and ``down`` stops
every process by PID and removes the cluster's directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from multilane.testing.cluster import K8S_VERSION


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _multilane(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multilane", *args], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_cluster_up_detach_then_down(tmp_path: Path, k8s_bin_dir: Path) -> None:
    state = tmp_path / "state.json"
    up = _multilane("cluster", "up", "--detach", "--state-file", str(state), "--bin-dir", str(k8s_bin_dir))
    assert up.returncode == 0, up.stderr
    kubeconfig = up.stdout.strip().splitlines()[-1]
    recorded = json.loads(state.read_text())
    assert recorded["kubeconfig"] == kubeconfig
    pids = [recorded["pid"], *recorded["components"].values()]
    assert sorted(recorded["components"]) == ["etcd", "kube-apiserver", "kube-controller-manager"]
    try:
        kubectl = [str(k8s_bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}"]
        version = json.loads(subprocess.run([*kubectl, "get", "--raw", "/version"], capture_output=True,
                                            text=True, check=True, timeout=60).stdout)  # fmt: skip
        assert version["gitVersion"] == f"v{K8S_VERSION}"
        deadline = time.monotonic() + 60
        ready = ""
        while time.monotonic() < deadline and ready != "True":
            got = subprocess.run([*kubectl, "get", "node", "multilane-node-0", "-o",
                                  "jsonpath={.status.conditions[?(@.type=='Ready')].status}"],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            ready = got.stdout.strip()
            time.sleep(0.5)
        assert ready == "True"
        assert _multilane("cluster", "status", "--state-file", str(state)).returncode == 0
    finally:
        down = _multilane("cluster", "down", "--state-file", str(state))
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids if _alive(pid)]
    assert not Path(recorded["dir"]).exists()
    assert not state.exists()
    assert _multilane("cluster", "status", "--state-file", str(state)).returncode == 1
