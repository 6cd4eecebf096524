"""``multilane.testing.apache`` without a JVM: the pinned release, the settings, the missing-piece errors."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from multilane.testing import apache
from multilane.testing.apache import ApacheKafka, ApacheKafkaUnavailableError

ROOT = Path(__file__).resolve().parents[2]


def test_the_module_runs_the_release_the_pom_pins() -> None:
    pom = (ROOT / "deps/kafka/pom.xml").read_text()
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    assert match is not None
    assert match.group(1) == apache.KAFKA_VERSION
    major, minor = (int(x) for x in apache.KAFKA_VERSION.split(".")[:2])
    assert (major, minor) >= (4, 2), "share groups need Apache Kafka 4.2 or later"


def test_missing_jars_name_the_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MULTILANE_KAFKA_JARS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # A directory without the completion stamp (a copy cut short) is not taken either.
    (tmp_path / "multilane/kafka" / apache.KAFKA_VERSION).mkdir(parents=True)
    with pytest.raises(ApacheKafkaUnavailableError, match=r"scripts/kafka-jars\.sh"):
        ApacheKafka().start()
    monkeypatch.setenv("MULTILANE_KAFKA_JARS", str(tmp_path))
    with pytest.raises(ApacheKafkaUnavailableError, match="MULTILANE_KAFKA_JARS"):
        apache.kafka_jars_dir()


def test_missing_java_names_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ApacheKafkaUnavailableError, match=r"java.*scripts/bootstrap\.sh"):
        ApacheKafka().start()


def test_single_node_settings_and_caller_overrides(tmp_path: Path) -> None:
    k = ApacheKafka(port=19092, server_config={"auto.create.topics.enable": "false",
                                               "offsets.topic.num.partitions": "7"})
    k.controller_port = 19093
    lines = k._server_properties(tmp_path / "data").splitlines()
    props = dict(line.split("=", 1) for line in lines)
    assert len(props) == len(lines)
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert props["log.dirs"] == str(tmp_path / "data")
    for topic in ("offsets.topic", "transaction.state.log", "share.coordinator.state.topic"):
        assert props[f"{topic}.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == props["share.coordinator.state.topic.min.isr"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "false"
    assert props["offsets.topic.num.partitions"] == "7"


def test_cluster_ids_are_kafka_uuids() -> None:
    for _ in range(200):
        text = apache.new_cluster_id()
        assert len(text) == 22 and not text.startswith("-")
        assert len(base64.urlsafe_b64decode(text + "==")) == 16
