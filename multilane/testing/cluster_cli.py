"""``multilane cluster up|down|status``: a real Kubernetes control plane on loopback
(:class:`multilane.testing.cluster.LocalCluster`) for trying the chart and the operator. Does I/O.

- ``up`` starts the cluster and a process kubelet (node ``multilane-node-0``; ``--no-kubelet``
  leaves it out; ``--image REPO``, repeatable, names the image repositories whose entrypoint is this
  machine's ``multilane``, the chart's ``ghcr.io/multilane/multilane`` always among them), writes
  a state file (JSON: the ``up`` process's PID, the kubeconfig, the directory, the components'
  PIDs) and stays in the foreground until SIGINT/SIGTERM, then stops everything and removes the
  state file and the directory. ``up --detach`` runs the same in the
  background (its log beside the state file) and returns once the cluster is ready.
- ``down`` reads the state file and stops that ``up`` process by its PID (SIGTERM; SIGKILL for any
  component still alive after ``--timeout``). The components also die with the ``up`` process
  (``PR_SET_PDEATHSIG``).
- ``status`` prints the state file and exits 0 if the ``up`` process is alive, 1 if not.

The last line ``up`` prints is the kubeconfig path: ``export KUBECONFIG=$(multilane cluster up
--detach | tail -n 1)``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from multilane.testing.cluster import ClusterError, LocalCluster
from multilane.testing.kubelet_pods import shadowed_python, unreachable_python
from multilane.testing.process_kubelet import ProcessKubelet


def default_state_file() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "multilane" / "cluster" / "state.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--state-file",
        type=Path,
        default=default_state_file(),
        help="where `up` records the cluster and `down` finds it",
    )
    parser.add_argument(
        "--bin-dir",
        default=None,
        help="etcd, kube-apiserver, kube-controller-manager and kubectl "
        "(default: $MULTILANE_K8S_BIN, else scripts/k8s-binaries.sh's cache)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the cluster's directory (default: a new temporary one, removed on down)",
    )
    parser.add_argument("--detach", action="store_true", help="up: run in the background, return when ready")
    parser.add_argument(
        "--no-kubelet", action="store_true", help="up: no process kubelet (no node: pods stay Pending)"
    )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="REPO",
        help="up: an image repository the process kubelet runs as this machine's `multilane` (the "
        f"image's ENTRYPOINT), besides {CHART_IMAGE}; repeatable (e.g. the chart's image.repository)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for start or stop")


CHART_IMAGE = "ghcr.io/multilane/multilane"
# What a pod on the process kubelet shares with the host: its network namespace (one loopback IP per
# pod), so two operator replicas binding 0.0.0.0 on one port collide without these values.
KUBELET_VALUES = "tests/cluster/values-process-kubelet.yaml"


def entrypoints(images: list[str]) -> dict[str, list[str]]:
    """Image repository -> the argv standing in for its ``ENTRYPOINT ["multilane"]`` (Dockerfile)."""
    return {repo: [sys.executable, "-m", "multilane"] for repo in dict.fromkeys([CHART_IMAGE, *images])}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_state(path: Path) -> dict[str, object] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def run(args: argparse.Namespace) -> int:
    state_file: Path = args.state_file
    state = _read_state(state_file)
    if args.action == "status":
        if state is None:
            print(f"no cluster recorded in {state_file}", file=sys.stderr)
            return 1
        print(json.dumps(state, indent=2))
        return 0 if _alive(int(str(state["pid"]))) else 1
    if args.action == "down":
        return _down(state_file, state, args.timeout)
    if state is not None and _alive(int(str(state["pid"]))):
        print(
            f"a cluster is already up (pid {state['pid']}, kubeconfig {state['kubeconfig']}); "
            f"`multilane cluster down --state-file {state_file}` first",
            file=sys.stderr,
        )
        return 1
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.unlink(missing_ok=True)
    if args.detach:
        return _detach(args, state_file)
    return _up(args, state_file)


def _up(args: argparse.Namespace, state_file: Path) -> int:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    kubelet: ProcessKubelet | None = None
    try:
        cluster = LocalCluster(args.bin_dir, args.dir, start_timeout_s=args.timeout)
        cluster.start()
    except ClusterError as exc:
        print(f"multilane cluster up: {exc}", file=sys.stderr)
        return 1
    try:
        if not args.no_kubelet:
            kubelet = ProcessKubelet(cluster, entrypoints=entrypoints(args.image)).start()
        state = {
            "pid": os.getpid(),
            "kubeconfig": str(cluster.kubeconfig),
            "server": cluster.server,
            "dir": str(cluster.dir),
            "components": cluster.pids,
        }
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_file)  # written whole: `--detach` waits for it
        print(
            f"cluster up: {cluster.server} (pids {cluster.pids}); stop with `multilane cluster down`",
            file=sys.stderr,
        )
        closed = unreachable_python() if os.geteuid() == 0 else None
        if kubelet is not None and closed is not None:
            print(
                f"multilane cluster up: warning: {closed[0]} is not readable by the pods' users "
                f"({closed[1]} is closed to others): their containers cannot start; chmod o+x {closed[1]}",
                file=sys.stderr,
            )
        shadowed = shadowed_python(["/tmp"])
        if kubelet is not None and shadowed is not None:
            print(
                f"multilane cluster up: warning: {shadowed[0]} is under /tmp, which the chart's pods "
                "mount an emptyDir over: their containers cannot start (CreateContainerConfigError); "
                "use a checkout outside /tmp",
                file=sys.stderr,
            )
        if kubelet is not None:
            print(
                f"node multilane-node-0: pods are local processes; images {', '.join(kubelet.entrypoints)} "
                f"run as `multilane`; pods share the host's network: install the chart with "
                f"--values {KUBELET_VALUES}",
                file=sys.stderr,
            )
        print(cluster.kubeconfig, flush=True)
        while not stop.wait(1.0):
            dead = [name for name, ok in cluster.alive().items() if not ok]
            if dead:
                print(
                    f"multilane cluster up: {', '.join(dead)} exited:\n{cluster.log_tail(dead[0])}",
                    file=sys.stderr,
                )
                return 1
        return 0
    finally:
        if kubelet is not None:
            kubelet.stop()
        cluster.stop()
        with contextlib.suppress(OSError):
            if (_read_state(state_file) or {}).get("pid") == os.getpid():
                state_file.unlink()


def _detach(args: argparse.Namespace, state_file: Path) -> int:
    log = state_file.with_name("up.log")
    argv = [
        sys.executable,
        "-m",
        "multilane",
        "cluster",
        "up",
        "--state-file",
        str(state_file),
        "--timeout",
        str(args.timeout),
    ]
    if args.bin_dir:
        argv += ["--bin-dir", str(args.bin_dir)]
    if args.dir:
        argv += ["--dir", str(args.dir)]
    if args.no_kubelet:
        argv.append("--no-kubelet")
    for image in args.image:
        argv += ["--image", image]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + args.timeout + 10
    while time.monotonic() < deadline:
        state = _read_state(state_file)
        if state is not None and state.get("pid") == proc.pid:
            print(f"cluster up in the background (pid {proc.pid}, log {log})", file=sys.stderr)
            print(state["kubeconfig"], flush=True)
            return 0
        if proc.poll() is not None:
            print(
                f"multilane cluster up failed (exit {proc.returncode}); log {log}:\n"
                + "\n".join(log.read_text(errors="replace").splitlines()[-20:]),
                file=sys.stderr,
            )
            return 1
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGTERM)
    print(f"multilane cluster up: not ready within {args.timeout:.0f} s; log {log}", file=sys.stderr)
    return 1


def _down(state_file: Path, state: dict[str, object] | None, timeout: float) -> int:
    if state is None:
        print(f"no cluster recorded in {state_file}", file=sys.stderr)
        return 1
    pid = int(str(state["pid"]))
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    components = dict(state.get("components") or {})  # type: ignore[call-overload]
    for name, cpid in components.items():  # normally gone with `up`; SIGKILL what is left
        if _alive(int(cpid)):
            print(f"multilane cluster down: {name} (pid {cpid}) still alive, SIGKILL", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(cpid), signal.SIGKILL)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    state_file.unlink(missing_ok=True)
    print(f"cluster down (pid {pid})", file=sys.stderr)
    return 0
