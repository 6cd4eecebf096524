"""Runtime control: HTTP auth, factor/pause/resume, generation fencing, release + handoff with progress,
back-pressure."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_engine_harness import committed_offset, config, ended, produce, recorder, running, wait_for

from multilane.formats.keyranges import KeyRangeMap, key_hash
from multilane.formats.progress import ProgressCodec
from multilane.testing.broker import EmbeddedBroker
from multilane.testing.checkers import assert_all, check_delivery
from multilane.worker.control import ControlServer
from multilane.worker.metrics import MetricsServer
from multilane.worker.ownership import decode_progress_hint

pytestmark = pytest.mark.broker

TOKEN = "s3cret-token"


def _http(port: int, method: str, path: str, body: Any = None, token: str | None = TOKEN) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_http_control_auth_factor_pause_fencing(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 2)
    n = 400
    produced = produce(broker, topic_name, n, keys=20) + produce(broker, topic_name, n, keys=20, partition=1)
    rec = recorder(sleep_ms=1.0)
    cfg = config(broker, topic_name, f"g-{topic_name}", partitions=[0])
    with running(cfg, rec.async_processor) as (engine, runner):
        server = ControlServer(engine, TOKEN, host="127.0.0.1", port=0)
        port = runner.call(server.start)
        try:
            # authentication
            assert _http(port, "GET", "/healthz", token=None) == (200, {"ok": True})
            assert _http(port, "GET", "/readyz", token=None) == (200, {"ready": True, "reasons": []})
            assert _http(port, "GET", "/v1/status", token=None)[0] == 401
            assert _http(port, "GET", "/v1/status", token="wrong")[0] == 401
            assert _http(port, "POST", "/v1/factor", {"factor": 3}, token="s3cret-tokeN")[0] == 401
            code, status = _http(port, "GET", "/v1/status")
            assert code == 200 and status["worker_id"] == cfg.worker_id and status["mode"] == "key"
            assert {"topic", "partition", "phase", "committed", "position", "high_watermark", "lag",
                    "in_flight", "restore_lag"} <= set(status["partitions"][0])
            # bad input
            assert _http(port, "POST", "/v1/factor", {"factor": "many"})[0] == 400
            assert _http(port, "POST", "/v1/factor", {"factor": 0})[0] == 400
            bad = {"generation": 1, "partitions": [{"topic": 5}]}
            assert _http(port, "POST", "/v1/assignment", bad)[0] == 400
            # factor, pause, resume
            assert _http(port, "POST", "/v1/factor", {"factor": 3}) == (200, {"factor": 3})
            assert _http(port, "POST", "/v1/pause") == (200, {"paused": True})
            assert _http(port, "GET", "/v1/status")[1]["paused"] is True
            assert _http(port, "POST", "/v1/resume") == (200, {"paused": False})
            # assignment with generations: add partition 1 at generation 5
            body = {"generation": 5, "partitions": [{"topic": topic_name, "partition": 0},
                                                     {"topic": topic_name, "partition": 1}]}
            code, ans = _http(port, "POST", "/v1/assignment", body)
            assert code == 200 and ans == {"generation": 5, "released": []}
            wait_for(lambda: len({(e.partition, e.offset) for e in rec.snapshot()
                                  if e.kind == "end"}) >= 2 * n, 60, what="both partitions processed")
            # a lower generation is fenced
            code, ans = _http(port, "POST", "/v1/assignment", {**body, "generation": 4, "partitions": []})
            assert code == 409 and ans["generation"] == 5
            assert len(_http(port, "GET", "/v1/status")[1]["partitions"]) == 2
            # same generation, partition 1 dropped: released with its committed offset
            code, ans = _http(port, "POST", "/v1/assignment", {**body, "partitions": body["partitions"][:1]})
            assert code == 200
            released = ans["released"]
            # the progress record of the final commit (base64), for the next owner (issue 22)
            progress = ProgressCodec.decode(decode_progress_hint(released[0].pop("progress")))
            assert released == [{"topic": topic_name, "partition": 1, "committed_offset": n}]
            assert (progress.topic, progress.partition, progress.base_offset) == (topic_name, 1, n)
            # metrics endpoint: every documented metric name is exported
            metrics = MetricsServer(engine.metrics, host="127.0.0.1", port=0)
            mport = runner.call(metrics.start)
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=30) as resp:
                text = resp.read().decode()
            runner.call(metrics.stop)
            for name in ("multilane_records_processed_total", "multilane_records_failed_total",
                         "multilane_records_retried_total", "multilane_records_dead_lettered_total",
                         "multilane_in_flight_records", "multilane_committed_offset",
                         "multilane_consumer_lag", "multilane_partition_paused",
                         "multilane_lane_utilisation_ratio", "multilane_processing_seconds_bucket",
                         "multilane_progress_record_bytes", "multilane_stalled_records", "multilane_factor"):
                assert name in text, name
            assert f'multilane_records_processed_total{{partition="0",topic="{topic_name}"}} {n}.0' in text
            assert f'multilane_consumer_lag{{partition="0",topic="{topic_name}"}} 0.0' in text
            assert "multilane_factor 3.0" in text
        finally:
            runner.call(server.stop)
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))


def test_release_then_new_owner_replays_only_unfinished(broker: EmbeddedBroker, topic_name: str,
                                                        tmp_path: Path) -> None:
    """A key hangs; release reports the committed offset (= the hung record); a new owner resumes
    there and, thanks to progress, replays only the hung key's lane -- not the other lanes' records."""
    broker.create_topic(topic_name, 1)
    n = 600
    produced = produce(broker, topic_name, n, keys=30)
    group = f"g-{topic_name}"
    release_file = tmp_path / "release"
    first = recorder(hang=frozenset({b"k7"}), hang_release_file=str(release_file))
    cfg = config(broker, topic_name, group, factor=4)
    hung_offset = next(r.offset for r in produced if r.key == b"k7")
    layout = KeyRangeMap.even(4)
    hung_lane = layout.lane_of(key_hash(b"k7"))
    other = [r for r in produced if layout.lane_of(key_hash(r.key or b"")) != hung_lane]
    with running(cfg, first.async_processor) as (engine, runner):
        wait_for(lambda: ended(first.snapshot()) >= {r.offset for r in other}, 60,
                 what="every record outside the hung lane done")
        released = runner.call(engine.release, [(topic_name, 0)], 0.5)
    assert [(r.topic, r.partition, r.committed_offset) for r in released] == [(topic_name, 0, hung_offset)]
    assert committed_offset(broker, group, topic_name) == hung_offset
    done_first = ended(first.snapshot())
    first.mark_incarnation_end()  # the hung attempt was cancelled by the release: it ends here
    # the new owner
    release_file.write_text("go")
    second = recorder()
    cfg2 = config(broker, topic_name, group, factor=4)
    with running(cfg2, second.async_processor) as (engine2, runner2):
        expected = {r.offset for r in produced if r.offset >= hung_offset and r.offset not in done_first}
        wait_for(lambda: ended(second.snapshot()) >= expected, 60, what="unfinished records replayed")
        wait_for(lambda: committed_offset(broker, group, topic_name) == n, 30, what="commit to the end")
        skipped = runner2.sync(engine2.status)["partitions"][0]["skipped"]
    replayed = ended(second.snapshot())
    assert replayed == expected, (
        f"replayed {len(replayed)} records, expected {len(expected)}: "
        f"extra {sorted(replayed - expected)[:10]}")
    assert skipped > 0
    assert_all(check_delivery(produced, first.snapshot() + second.snapshot(), mode="key"))


def test_back_pressure_pauses_partition_and_bounds_memory(broker: EmbeddedBroker, topic_name: str) -> None:
    broker.create_topic(topic_name, 1)
    n = 1500
    produced = produce(broker, topic_name, n, keys=50)
    rec = recorder(sleep_ms=3.0)
    bound = 40
    byte_bound = 40 * 200
    cfg = config(broker, topic_name, f"g-{topic_name}", factor=4, max_in_flight=bound,
                 max_in_flight_bytes=byte_bound)
    seen_paused = False
    with running(cfg, rec.async_processor) as (engine, runner):
        def check() -> bool:
            nonlocal seen_paused
            st = runner.sync(engine.status)
            assert st["in_flight"] <= bound and st["in_flight_bytes"] <= byte_bound
            seen_paused = seen_paused or st["partitions"][0]["paused"]
            return len(ended(rec.snapshot())) >= n
        wait_for(check, 90, interval=0.02, what="all processed")
        st = runner.sync(engine.status)
        metrics = engine.metrics.render().decode()
    assert seen_paused, "the partition should have been paused by back-pressure"
    assert st["back_pressure_pauses"] > 0
    assert 0 < st["peak_in_flight"] <= bound
    assert 0 < st["peak_in_flight_bytes"] <= byte_bound
    assert "multilane_partition_paused" in metrics and "multilane_in_flight_records" in metrics
    assert_all(check_delivery(produced, rec.snapshot(), mode="key"))


def test_release_waits_for_running_records_only(broker: EmbeddedBroker, topic_name: str) -> None:
    """A release under a deep queue answers once the records *running* finished: it completes at most
    one record per lane, and the queued records go to the next owner through the committed offset and
    the progress record -- none lost, none that completed run again."""
    broker.create_topic(topic_name, 1)
    n = 2000
    produced = produce(broker, topic_name, n, keys=40)
    group = f"g-{topic_name}"
    factor = 2
    first = recorder(sleep_ms=20.0)
    cfg = config(broker, topic_name, group, factor=factor)
    with running(cfg, first.async_processor) as (engine, runner):
        wait_for(lambda: len(ended(first.snapshot())) >= 40, 60, what="processing under way")
        queued_before = runner.sync(engine.status)["partitions"][0]["in_flight"]
        before = len(ended(first.snapshot()))
        released = runner.call(engine.release, [(topic_name, 0)], 10.0)
        during = len(ended(first.snapshot())) - before
    assert queued_before > 10 * factor, "the queue should be deep when the release starts"
    assert during <= factor, f"{during} records completed during the release (at most one per lane)"
    done_first = ended(first.snapshot())
    assert len(done_first) < n
    [rel] = released
    assert rel.committed_offset < n
    second = recorder()
    with running(config(broker, topic_name, group, factor=factor), second.async_processor) as (_e2, _r2):
        expected = {r.offset for r in produced if r.offset not in done_first}
        wait_for(lambda: ended(second.snapshot()) >= expected, 90, what="queued records, next owner")
        wait_for(lambda: committed_offset(broker, group, topic_name) == n, 30, what="commit to the end")
    assert ended(second.snapshot()) == expected  # nothing that completed ran again
    assert_all(check_delivery(produced, first.snapshot() + second.snapshot(), mode="key"))
