"""Kafka credentials from the pod environment (``MULTILANE_KAFKA_<key>``, filled from the credentials
Secret by the StatefulSet's ``envFrom``) into every client of the worker."""

from __future__ import annotations

import argparse

import pytest

from multilane.operator.spec import children
from multilane.worker import cli
from multilane.worker.admin import security_config
from multilane.worker.config import KAFKA_ENV_PREFIX, ConfigError, kafka_settings_from_environment

SECRET = "pa55-w0rd-do-not-show"


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(["--bootstrap-servers", "k:9092", "--group", "g", "--processor", "m:f",
                              "--assign", "", *extra])


def test_prefix_is_the_one_the_statefulset_uses() -> None:
    assert KAFKA_ENV_PREFIX == children.KAFKA_ENV_PREFIX
    spec = {"kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "consumerGroup": "g",
                      "credentialsSecretRef": {"name": "creds"}},
            "workload": {"image": "img", "processor": "m:f"}}
    ref = children.ConsumerRef(name="app", namespace="ns", uid="u")
    container = children.stateful_set(ref, spec, 1)["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"prefix": KAFKA_ENV_PREFIX, "secretRef": {"name": "creds"}}]


def test_secret_keys_as_written_and_upper_case_spelling() -> None:
    env = {
        "MULTILANE_KAFKA_sasl.password": SECRET,  # the Secret's key as is (envFrom + prefix)
        "MULTILANE_KAFKA_ssl.key.pem": "-----BEGIN PRIVATE KEY-----",
        "MULTILANE_KAFKA_SASL_USERNAME": "alice",  # shell-friendly spelling
        "MULTILANE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "MULTILANE_KAFKA_": "ignored: no key",
        "MULTILANE_POD_NAME": "app-0",
        "PATH": "/bin",
    }
    assert kafka_settings_from_environment(env) == {
        "sasl.password": SECRET,
        "ssl.key.pem": "-----BEGIN PRIVATE KEY-----",
        "sasl.username": "alice",
        "security.protocol": "SASL_SSL",
    }


def test_owned_keys_and_double_spellings_are_refused_without_showing_values() -> None:
    with pytest.raises(ConfigError, match=r"group\.id") as err:
        kafka_settings_from_environment({"MULTILANE_KAFKA_group.id": SECRET})
    assert SECRET not in str(err.value)
    with pytest.raises(ConfigError, match=r"sasl\.password") as err:
        kafka_settings_from_environment({"MULTILANE_KAFKA_sasl.password": SECRET,
                                         "MULTILANE_KAFKA_SASL_PASSWORD": SECRET + "2"})
    assert SECRET not in str(err.value)
    with pytest.raises(ConfigError, match=r"sasl\.password") as err:
        cli.build_config(_args("--consumer-config", "sasl.password=other"),
                         environ={"MULTILANE_KAFKA_sasl.password": SECRET})
    assert SECRET not in str(err.value) and "other" not in str(err.value)
    with pytest.raises(ConfigError, match=r"bootstrap\.servers"):
        cli.build_config(_args("--consumer-config", "bootstrap.servers=x:1"), environ={})


def test_credentials_reach_consumer_producer_admin_and_state_clients() -> None:
    env = {"MULTILANE_KAFKA_sasl.password": SECRET, "MULTILANE_KAFKA_sasl.username": "alice",
           "MULTILANE_KAFKA_ssl.ca.pem": "CA", "MULTILANE_KAFKA_fetch.min.bytes": "1024"}
    cfg = cli.build_config(_args("--consumer-config", "security.protocol=SASL_SSL",
                                 "--consumer-config", "sasl.mechanism=SCRAM-SHA-512"), environ=env)
    security = {"sasl.password": SECRET, "sasl.username": "alice", "ssl.ca.pem": "CA",
                "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}
    consumer = cfg.consumer_config()
    assert {k: consumer[k] for k in security} == security
    assert consumer["fetch.min.bytes"] == "1024"  # non-security settings: the consumer's own
    assert consumer["group.id"] == "g" and consumer["bootstrap.servers"] == "k:9092"
    producer = cfg.producer_config()
    assert {k: producer.get(k) for k in security} == security
    assert "fetch.min.bytes" not in producer
    assert security_config(cfg.consumer_overrides) == security  # admin, committed-offset reader
    # a logged config never shows a credential
    assert SECRET not in repr(cfg)


def test_without_the_environment_nothing_is_added() -> None:
    cfg = cli.build_config(_args(), environ={"HOME": "/"})
    assert cfg.consumer_overrides == {}
    assert "sasl.password" not in cfg.producer_config()
