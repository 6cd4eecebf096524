"""Restore before handoff with real worker processes: worker B learns a partition worker A processes
(``/v1/learn``), A releases it, B is assigned it (promotion) while load keeps arriving; B's pause is
short and the state of every partition equals the reference counts of the input."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_state_crash import PARTITIONS, Committed, ends_of, produce, start_worker, wait_until

from multilane.testing.broker import EmbeddedBroker, free_port
from multilane.worker.state.examples import decode_count, reference_counts
from multilane.worker.state.store import PartitionStore, partition_dir

pytestmark = [pytest.mark.broker, pytest.mark.timeout(600)]


def _http(port: int, token: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _args(broker: EmbeddedBroker, group: str, assign: str, state_dir: Path, port: int) -> list[str]:
    return [
        "--bootstrap-servers", broker.bootstrap, "--group", group,
        "--processor", "multilane.worker.state.examples:count_per_key", "--assign", assign,
        "--state-dir", str(state_dir), "--commit-interval-ms", "200", "--factor", "4",
        "--control-port", str(port), "--consumer-config", "fetch.queue.backoff.ms=10",
    ]  # fmt: skip


def test_learner_takes_over_a_partition_with_a_short_pause(
    broker: EmbeddedBroker, topic_name: str, tmp_path: Path
) -> None:
    broker.create_topic(topic_name, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    committed = Committed(broker, group, topic_name)
    token = uuid.uuid4().hex
    env = {"MULTILANE_CONTROL_TOKEN": token}
    records = produce(broker, topic_name, 30_000)
    pa, pb = free_port(), free_port()
    dir_a, dir_b = tmp_path / "a", tmp_path / "b"
    all_parts = ",".join(f"{topic_name}:{p}" for p in range(PARTITIONS))
    a = start_worker(_args(broker, group, all_parts, dir_a, pa), tmp_path / "a.log", env)
    b = start_worker(_args(broker, group, "", dir_b, pb), tmp_path / "b.log", env)
    moved = {"topic": topic_name, "partition": 0}
    try:
        assert a.ready.wait(120) and b.ready.wait(120), a.log()[-2000:] + b.log()[-2000:]
        wait_until(lambda: sum(committed.offsets()) >= 10_000, 120, "A makes progress", interval=0.2)

        # 1. B learns partition 0 while A keeps processing it.
        assert _http(pb, token, "POST", "/v1/learn", {"partitions": [moved]}) == {"learn": [moved]}

        def learning() -> bool:
            learners = _http(pb, token, "GET", "/v1/status").get("learners", [])
            return any(x["partition"] == 0 and x["phase"] == "learning" for x in learners)

        wait_until(learning, 120, "B caught up as a learner", interval=0.2)
        records += produce(broker, topic_name, 10_000, start=30_000)
        _http(pb, token, "POST", "/v1/promote", {"partitions": [moved]})  # checks: healthy, caught up

        # 2. Handoff: A releases partition 0 (final commit), B is assigned it (promotion).
        released = _http(pa, token, "POST", "/v1/release", {"partitions": [moved], "deadline_s": 10})
        assert released["released"][0]["partition"] == 0
        _http(pb, token, "POST", "/v1/assignment", {"generation": 1, "partitions": [moved]})
        records += produce(broker, topic_name, 10_000, start=40_000)
        ends = ends_of(records)
        wait_until(lambda: committed.offsets() == ends, 240, "all records committed", interval=0.5)
    finally:
        code_a, code_b = a.terminate(), b.terminate()
        committed.close()
    assert code_a == 0 and code_b == 0, a.log()[-3000:] + b.log()[-3000:]
    log_b = b.log()
    match = re.search(rf"promoted {re.escape(topic_name)}\[0\] in ([0-9.]+)s", log_b)
    assert match, log_b[-3000:]
    assert float(match.group(1)) < 5.0  # typically 0.2-0.4 s; generous on the shared machine
    assert "slow promotion" not in log_b

    for p, directory in ((0, dir_b), (1, dir_a)):
        store = PartitionStore(partition_dir(directory, topic_name, p)).open()
        try:
            local = {k: decode_count(v) for k, v in store.items()}
        finally:
            store.close()
        assert local == reference_counts(k for q, _, k in records if q == p), f"partition {p}"
