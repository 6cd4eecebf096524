"""``multilane worker --loop``: the event loop factory and its one-line error without uvloop."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util

import pytest

from multilane.extras import MissingExtraError
from multilane.worker import cli


def test_asyncio_is_the_default_loop() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--bootstrap-servers", "b:9092", "--group", "g", "--processor", "m:f"])
    assert args.loop == "asyncio"
    assert cli.loop_factory("asyncio") is None


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop not installed")
def test_uvloop_factory_runs_coroutines_on_uvloop() -> None:
    factory = cli.loop_factory("uvloop")
    assert factory is not None

    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(which()).startswith("uvloop")


def test_missing_uvloop_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    with pytest.raises(MissingExtraError) as err:
        cli.loop_factory("uvloop")
    assert "\n" not in str(err.value) and "multilane[uvloop]" in str(err.value)
