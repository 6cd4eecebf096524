"""Where the worker's control and metrics endpoints listen (``multilane worker --bind-host``): the pod
IP on Kubernetes (``$MULTILANE_POD_IP``, set by the operator), loopback elsewhere; never every
interface unless asked."""

from __future__ import annotations

import argparse

from multilane.worker import cli


def test_loopback_by_default() -> None:
    assert cli.bind_host(None, {}) == "127.0.0.1"


def test_the_pod_ip_on_kubernetes() -> None:
    assert cli.bind_host(None, {cli.POD_IP_ENV: "10.1.2.3"}) == "10.1.2.3"


def test_explicit_wins() -> None:
    assert cli.bind_host("0.0.0.0", {cli.POD_IP_ENV: "10.1.2.3"}) == "0.0.0.0"


def test_the_flag_parses() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--bind-host", "10.0.0.9", "--bootstrap-servers", "b:9092", "--group", "g", "--processor", "m:f"]
    )
    assert args.bind_host == "10.0.0.9"
