"""A ``multilane.App`` run two ways against the embedded broker: ``python -m myapp`` (``app.run()``) and
``multilane worker --app myapp:app`` with its settings from the environment. Startup hooks run before
the ready line, shutdown hooks after the engine stopped; the records pass the delivery checkers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from test_engine_harness import committed_offset, ended_in_log, produce, sigterm, wait_for, worker_process

from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.testing.processors import read_event_log

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]

APP = '''
import dataclasses
from pathlib import Path

import multilane
from multilane.testing.processors import logging_async


@dataclasses.dataclass
class Settings:
    marker_dir: str = "."


app = multilane.App(logging_async, name="myapp", settings=Settings, factor=4, commit_interval_ms=300,
                    value_format="str")


@app.on_startup
async def started() -> None:
    Path(app.settings.marker_dir, "startup").write_text("started")


@app.on_shutdown
def stopped() -> None:
    Path(app.settings.marker_dir, "shutdown").write_text("stopped")


if __name__ == "__main__":
    app.run()
'''


@pytest.mark.parametrize("launch", ["python -m", "worker --app"])
def test_app_runs_with_hooks(broker: EmbeddedBroker, topic_name: str, tmp_path: Path, launch: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 200
    produced = produce(broker, topic_name, n, keys=10)
    (tmp_path / "myapp.py").write_text(APP)
    markers = tmp_path / "markers"
    markers.mkdir()
    log_path = tmp_path / "events.log"
    group = f"g-{topic_name}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "MULTILANE_TEST_LOG": str(log_path)}
    if launch == "python -m":
        argv = [sys.executable, "-m", "myapp", "--bootstrap-servers", broker.bootstrap, "--group", group,
                "--assign", f"{topic_name}:0", "--set", f"marker_dir={markers}"]
    else:  # every setting from the environment
        argv = [sys.executable, "-m", "multilane", "worker", "--app", "myapp:app"]
        env.update({"MULTILANE_BOOTSTRAP_SERVERS": broker.bootstrap, "MULTILANE_GROUP": group,
                    "MULTILANE_ASSIGN": f"{topic_name}:0", "MULTILANE_APP_MARKER_DIR": str(markers)})
    with worker_process(argv, env=env, cwd=tmp_path) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("multilane-worker ready"), (line, proc.stderr.read() if proc.stderr else "")
        assert (markers / "startup").read_text() == "started"
        assert not (markers / "shutdown").exists()
        wait_for(ended_in_log(log_path, n), 60, what="every record processed")
        wait_for(lambda: committed_offset(broker, group, topic_name) == n, 30, what="the commit")
        err = sigterm(proc)
    assert proc.returncode == 0, err[-3000:]
    assert (markers / "shutdown").read_text() == "stopped"
    assert_all(check_delivery(produced, read_event_log(log_path), mode="key"))


BAD_VALUES = '''
import multilane


def handle(record, ctx):
    record.json()


app = multilane.App(handle, value_format="json", max_retries=3, retry_backoff_ms=1)
'''


def test_decode_error_is_dead_lettered_without_retries(broker: EmbeddedBroker, topic_name: str,
                                                       tmp_path: Path) -> None:
    from confluent_kafka import Consumer, TopicPartition

    broker.create_topic(topic_name, 1)
    broker.create_topic(f"{topic_name}.dlq", 1)
    produced = produce(broker, topic_name, 3, keys=3)  # values v0, v1, v2: not JSON
    (tmp_path / "badvalues.py").write_text(BAD_VALUES)
    group = f"g-{topic_name}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    argv = [sys.executable, "-m", "multilane", "worker", "--app", "badvalues:app", "--bootstrap-servers",
            broker.bootstrap, "--group", group, "--assign", f"{topic_name}:0"]
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"dlq-{topic_name}"})
    letters: list[dict[str, bytes]] = []
    with worker_process(argv, env=env, cwd=tmp_path) as proc:
        try:
            consumer.assign([TopicPartition(f"{topic_name}.dlq", 0, 0)])
            wait_for(lambda: letters.extend(dict(m.headers() or []) for m in consumer.consume(10, 0.2)
                                            if m.error() is None) or len(letters) >= len(produced),
                     60, what="every record dead-lettered")
            sigterm(proc)
        finally:
            consumer.close()
    assert [h["multilane.error.reason"] for h in letters] == [b"decode-error"] * 3
    assert [h["multilane.attempts"] for h in letters] == [b"1"] * 3
