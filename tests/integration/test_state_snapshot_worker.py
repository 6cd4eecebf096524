"""``multilane worker --snapshot-uri``: a worker process with an empty state directory restores from a
snapshot (built by the snapshot job's code, bounded by the group's committed offsets) plus the
changelog tail, and its counts equal the reference; the state flags reach the ``StateManager``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from multilane.formats.keyranges import KeyRangeMap
from multilane.pipeline.job import SnapshotJob, SnapshotJobConfig
from multilane.testing.broker import EmbeddedBroker
from multilane.worker.cli import _state_hooks, add_arguments, build_config, check_state_args
from multilane.worker.config import ConfigError
from tests.integration.test_state_crash import (
    PARTITIONS,
    Committed,
    assert_state_matches,
    committed,  # noqa: F401 - fixture
    ends_of,
    group,  # noqa: F401 - fixture
    produce,
    run_to_completion,
    worker_cmd,
)

MISSING_SNAPSHOTS = r"needs the 'snapshots' extra .*pip install 'multilane\[snapshots\]'"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(
        ["--bootstrap-servers", "127.0.0.1:1", "--group", "g", "--processor", "m:f", "--topic", "t", *argv]
    )


def test_state_flags_reach_the_state_manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(
        "--state-dir", str(tmp_path / "s"), "--snapshot-uri", str(tmp_path / "snap"),
        "--state-on-corrupt", "skip", "--changelog-config", "retention.ms=-1",
    )  # fmt: skip
    check_state_args(args)
    sm = _state_hooks(args, build_config(args))
    assert sm is not None
    try:
        assert sm.on_corrupt == "skip" and sm.snapshot_uri == str(tmp_path / "snap")
        assert sm._admin._topic_config["retention.ms"] == "-1"  # the changelog topic's creation config
    finally:
        sm.close()
    with pytest.raises(ConfigError, match="--snapshot-uri need"):
        check_state_args(_args("--snapshot-uri", "/x"))
    with pytest.raises(ConfigError, match="--changelog-config 'nokey' must look like key=value"):
        check_state_args(_args("--state-dir", str(tmp_path / "s"), "--changelog-config", "nokey"))
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigError, match=MISSING_SNAPSHOTS):
        check_state_args(_args("--state-dir", str(tmp_path / "s"), "--snapshot-uri", "/x"))


@pytest.mark.broker
@pytest.mark.timeout(600)
def test_worker_restores_from_snapshot_and_tail(
    broker: EmbeddedBroker,
    topic_name: str,
    group: str,  # noqa: F811
    committed: Committed,  # noqa: F811
    tmp_path: Path,
) -> None:
    broker.create_topic(topic_name, PARTITIONS)
    first = produce(broker, topic_name, 6_000)
    run_to_completion(
        worker_cmd(broker, group, topic_name, tmp_path / "a"), tmp_path / "a.log", committed, ends_of(first)
    )
    # The job bounds each partition by the group's committed offset (everything, here).
    result = SnapshotJob(
        SnapshotJobConfig(
            bootstrap=broker.bootstrap, group=group, topics=(topic_name,), uri=str(tmp_path / "snap"),
            layout=KeyRangeMap.even(2), idle_timeout_s=30,
        )
    ).run_in_process()  # fmt: skip
    assert [e.source_bound for e in result.manifest.partitions] == ends_of(first)
    assert all(e.rows > 0 for e in result.manifest.partitions)
    records = first + produce(broker, topic_name, 2_000, start=6_000)
    args = worker_cmd(
        broker, group, topic_name, tmp_path / "b",
        "--snapshot-uri", str(tmp_path / "snap"), "--state-on-corrupt", "fail",
    )  # fmt: skip
    run_to_completion(args, tmp_path / "b.log", committed, ends_of(records))
    log = (tmp_path / "b.log").read_text()
    for p in range(PARTITIONS):
        assert f"loaded snapshot {result.manifest.snapshot_id} of {topic_name}[{p}]" in log
    assert_state_matches(broker, group, topic_name, tmp_path / "b", records, tmp_path)
