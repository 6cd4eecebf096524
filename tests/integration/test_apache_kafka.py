"""``ApacheKafka`` itself: a single KRaft node with transactions and share groups, owned by PID.

These run whatever ``--broker`` says (they start their own Apache Kafka); they skip when Java or the
jars are missing (``bash scripts/kafka-jars.sh``), and fail under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from multilane.testing import apache
from multilane.testing.apache import ApacheKafka
from multilane.testing.broker import BrokerError, free_port
from tests.support.apache import require_apache_kafka


@pytest.fixture(autouse=True)
def _needs_apache_kafka() -> None:
    require_apache_kafka()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_transactions_share_groups_and_a_clean_stop() -> None:
    kafka = ApacheKafka()
    with kafka:
        assert kafka.start_seconds is not None
        print(f"ApacheKafka started in {kafka.start_seconds:.1f}s, load average {os.getloadavg()}")
        pid, log_path = kafka.pid, kafka.log_path
        assert pid is not None and log_path is not None and Path(log_path).is_file()
        kafka.create_topic("compacted", 2, config={"cleanup.policy": "compact"})
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        (described,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "compacted")]).values()
        assert described.result(10)["cleanup.policy"].value == "compact"

        # Transactions: a committed and an aborted one; read_committed sees the first only.
        kafka.create_topic("tx", 1)
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "tx-1"})
        producer.init_transactions(30)
        for value, commit in ((b"kept", True), (b"dropped", False)):
            producer.begin_transaction()
            producer.produce("tx", value, key=b"k")
            producer.commit_transaction(10) if commit else producer.abort_transaction(10)
        consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "tx-reader",
                             "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                             "enable.partition.eof": True})
        # from offset 0: no committed-offset lookup, so no wait on the group coordinator, whose
        # __consumer_offsets partitions a new broker may still be loading
        consumer.assign([TopicPartition("tx", 0, 0)])
        values, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF and values:
                    break  # end of partition
                # commit_transaction() returns before the markers reach the partition: until the commit
                # marker lands the last stable offset stays below the record, and the end of partition
                # comes first (seen under load)
                continue  # e.g. NOT_COORDINATOR while the group coordinator loads: retried
            values.append(msg.value())
        consumer.close()
        assert values == [b"kept"]

        # Share groups: on at format time; the group reads from the start once told to.
        kafka.create_topic("queue", 2)
        reset = ConfigEntry("share.auto.offset.reset", "earliest",
                            incremental_operation=AlterConfigOpType.SET)
        for fut in admin.incremental_alter_configs(
                [ConfigResource(ResourceType.GROUP, "sg", incremental_configs=[reset])]).values():
            fut.result(10)
        plain = Producer({"bootstrap.servers": kafka.bootstrap})
        for i in range(20):
            plain.produce("queue", str(i).encode(), key=str(i).encode())
        assert plain.flush(10) == 0
        share = ShareConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": "sg"})
        share.subscribe(["queue"])
        got: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(got) < 20 and time.monotonic() < deadline:
            for msg in share.poll(1.0) or []:
                if not msg.error():
                    got.add(msg.value())
        share.close()
        assert got == {str(i).encode() for i in range(20)}
    assert kafka.pid is None and not _alive(pid)
    assert not Path(log_path).exists(), "the log in the work dir goes with it"
    assert not Path(log_path).parent.exists()


_PARENT = """
import json, sys, threading
from multilane.testing import apache
from multilane.testing.apache import ApacheKafka
from multilane.testing.broker import BrokerError, free_port
main = ApacheKafka().start()
other = []
t = threading.Thread(target=lambda: other.append(ApacheKafka().start()))
t.start(); t.join()  # the thread that forked the second JVM is gone: the watchdog keeps watch
print(json.dumps([main.pid, other[0].pid, main.log_path, other[0].log_path]), flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_the_jvm_dies_with_the_process_that_started_it() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, "the parent did not start its brokers"
        main_pid, thread_pid, *logs = json.loads(line)
        time.sleep(1.0)
        assert _alive(main_pid) and _alive(thread_pid), "a thread's exit must not kill its JVM"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while (_alive(main_pid) or _alive(thread_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(main_pid), "PR_SET_PDEATHSIG did not kill the JVM"
    assert not _alive(thread_pid), "the watchdog did not kill the JVM"
    for log in logs:  # a kill -9 leaves the work dir behind; remove it here
        subprocess.run(["rm", "-rf", str(Path(log).parent)], check=True)


@pytest.mark.slow
def test_a_port_taken_in_the_meantime_is_retried_on_new_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The caller's own port: no retry, a clear error.
        with pytest.raises(BrokerError, match=f"port {port} .* is taken"):
            ApacheKafka(port=port).start()
        # A port chosen as free that someone took since: the next start goes on new ports.
        ports = iter([port])
        monkeypatch.setattr(apache, "free_port", lambda: next(ports, None) or free_port())
        with ApacheKafka() as kafka:
            assert kafka.port != port
            kafka.create_topic("after-retry", 1)
