"""``--output-topic`` (``multilane.worker.output_topics``): declarations parse, from the command line,
the environment and an App, and a bad one is a one-line configuration error."""

from __future__ import annotations

import argparse

import pytest

from multilane.api import Context, Record
from multilane.app import App
from multilane.worker.cli import add_arguments, parse_args
from multilane.worker.config import ConfigError
from multilane.worker.output_topics import OutputTopic, missing_message, parse_output_topics


def handle(record: Record, ctx: Context) -> None: ...


def parse(argv: list[str], app: App | None = None, environ: dict[str, str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parse_args(parser, argv, app=app, environ=environ or {})
    return list(args.output_topic)


def test_declarations_parse() -> None:
    assert parse_output_topics(["a", "b:3", "a:2"]) == (OutputTopic("a", 2), OutputTopic("b", 3))
    for bad in ("", "a:0", "a:x", "a b", ":3", "a:-1"):
        with pytest.raises(ConfigError, match="--output-topic"):
            parse_output_topics([bad])


def test_declared_by_flag_environment_and_app() -> None:
    assert parse(["--output-topic", "a", "--output-topic", "b:2"]) == ["a", "b:2"]
    app = App(handle, output_topic="totals:2")
    assert parse([], app=app) == ["totals:2"]
    assert parse([], app=App(handle, output_topic=["a", "b"])) == ["a", "b"]
    assert parse([], app=app, environ={"MULTILANE_OUTPUT_TOPIC": "x,y:3"}) == ["x", "y:3"]


def test_the_missing_line_names_the_way_out() -> None:
    line = missing_message(["totals", "audit"], "broker:9092")
    assert line == ("output topic(s) totals, audit do not exist on broker:9092: create them first, or give "
                    "a partition count for the worker to create them (--output-topic totals:PARTITIONS, "
                    'App(output_topic="totals:PARTITIONS"))')


class _RefusingAdmin:
    """An admin client whose broker answers, but refuses to list topics (e.g. no Describe right)."""

    def list_topics(self, timeout: float) -> object:
        raise RuntimeError("Broker: Topic authorization failed")


def test_a_check_that_cannot_run_is_one_line_too() -> None:
    import asyncio

    from multilane.worker.cli import build_config
    from multilane.worker.supervision import StartupError, WorkerSupervisor

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parse_args(parser, ["--bootstrap-servers", "127.0.0.1:1", "--group", "g", "--topic", "in",
                               "--processor", "m:f", "--output-topic", "out"], environ={})
    sup = WorkerSupervisor(args, build_config(args, environ={}))
    sup.probe.check = lambda: (True, ())  # type: ignore[method-assign]
    sup._admin = _RefusingAdmin  # type: ignore[assignment]
    with pytest.raises(StartupError) as caught:
        asyncio.run(sup.preflight())
    assert caught.value.code == 1
    assert str(caught.value) == ("output topics out: cannot check or create them on 127.0.0.1:1: "
                                 "Broker: Topic authorization failed")
