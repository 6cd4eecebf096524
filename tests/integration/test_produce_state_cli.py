"""``multilane produce`` (JSON lines keyed by a field, from stdin) and ``multilane state dump|get
--changelog`` against the embedded broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from multilane.formats.changelog import ChangelogCodec
from multilane.formats.keyranges import key_hash
from multilane.testing.broker import EmbeddedBroker

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "multilane", *argv], input=stdin, capture_output=True,
                          text=True, timeout=120, env=ENV)


def read_all(broker: EmbeddedBroker, topic: str, partitions: int, n: int) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"read-{topic}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[int, bytes, bytes]] = []
    try:
        for _ in range(200):
            for m in consumer.consume(100, 0.2):
                if m.error() is None:
                    out.append((m.partition(), m.key(), m.value()))
            if len(out) >= n:
                break
    finally:
        consumer.close()
    return out


def test_produce_json_lines_keyed_by_field(broker: EmbeddedBroker, topic_name: str) -> None:
    orders = [{"customer": f"c{i % 3}", "amount": i} for i in range(30)]
    stdin = "".join(json.dumps(o) + "\n" for o in orders) + "\n"
    done = cli("produce", "--bootstrap-servers", broker.bootstrap, "--topic", topic_name,
               "--key-field", "customer", "--create-partitions", "3", stdin=stdin)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"topic": topic_name, "produced": 30}
    got = read_all(broker, topic_name, 3, 30)
    assert sorted(json.loads(v)["amount"] for _p, _k, v in got) == list(range(30))
    for _p, k, v in got:
        assert k == json.loads(v)["customer"].encode()
    # one key, one partition (the producer's key partitioner), in the order of the file
    by_key: dict[bytes, list[int]] = {}
    for p, k, v in got:
        assert by_key.setdefault(k, [p])[0] == p
        by_key[k].append(json.loads(v)["amount"])
    assert all(amounts[1:] == sorted(amounts[1:]) for amounts in by_key.values())


def test_state_dump_from_a_changelog(broker: EmbeddedBroker, topic_name: str) -> None:
    changelog = f"g.{topic_name}.changelog"
    broker.create_topic(changelog, 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    # partition 0: alice 1 -> 3, bob 2 then deleted (envelope + tombstone); partition 1: carol {"n": 1}
    changes = [(0, b"alice", ChangelogCodec.encode_put(b"1", 0, key_hash(b"alice"))),
               (0, b"bob", ChangelogCodec.encode_put(b"2", 1, key_hash(b"bob"))),
               (0, b"alice", ChangelogCodec.encode_put(b"3", 2, key_hash(b"alice"))),
               (0, b"bob", ChangelogCodec.encode_delete(3, key_hash(b"bob"))),
               (0, b"bob", None),
               (1, b"carol", ChangelogCodec.encode_put(b'{"n": 1}', 0, key_hash(b"carol")))]
    for partition, key, value in changes:
        producer.produce(changelog, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0
    done = cli("state", "dump", "--changelog", changelog, "--bootstrap-servers", broker.bootstrap)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        {"partition": 0, "key": "alice", "value": 3}, {"partition": 1, "key": "carol", "value": {"n": 1}}]
    got = cli("state", "get", "carol", "--changelog", changelog, "--bootstrap-servers", broker.bootstrap)
    assert got.returncode == 0 and json.loads(got.stdout)["value"] == {"n": 1}
    gone = cli("state", "get", "bob", "--changelog", changelog, "--bootstrap-servers", broker.bootstrap)
    assert gone.returncode == 1 and gone.stderr.strip() == "multilane state: key 'bob' not found"
    missing = cli("state", "dump", "--changelog", f"{changelog}-missing", "--bootstrap-servers",
                  broker.bootstrap, "--timeout-s", "5")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"multilane state: changelog topic {changelog}-missing does not exist on {broker.bootstrap}"]
