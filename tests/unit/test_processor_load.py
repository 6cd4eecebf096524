"""Loading a processor: its signature is checked, ``@needs_state`` is honoured, and a bad deploy stops
before it consumes (``multilane worker`` exits 2 with one line); ``import multilane`` stays light."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from multilane.api import (
    Context,
    ProcessorSignatureError,
    Record,
    check_processor,
    load_processor,
    needs_state,
    processor_needs_state,
)

ROOT = Path(__file__).resolve().parents[2]


def good_sync(record: Record, ctx: Context) -> None: ...


async def good_async(record: Record, ctx: Context) -> None: ...


def good_defaults(record: Record, ctx: Context, extra: int = 1, *, flag: bool = False) -> None: ...


def good_star(*args: Any) -> None: ...


def bad_one(record: Record) -> None: ...


async def bad_one_async(record: Record) -> None: ...


def bad_three(record: Record, ctx: Context, extra: int) -> None: ...


def bad_kwonly(record: Record, ctx: Context, *, flag: bool) -> None: ...


def bad_gen(record: Record, ctx: Context) -> Any:
    yield 1


class GoodCallable:
    def __call__(self, record: Record, ctx: Context) -> None: ...


class BadCallable:
    async def __call__(self, record: Record) -> None: ...


@pytest.mark.parametrize("fn", [good_sync, good_async, good_defaults, good_star, GoodCallable(),
                                functools.partial(bad_three, extra=2), lambda r, c: None])
def test_valid_signatures_pass(fn: Any) -> None:
    check_processor(fn)


@pytest.mark.parametrize(("fn", "words"), [
    (bad_one, "def bad_one(record"),
    (bad_one_async, "async def bad_one_async"),
    (bad_three, "two arguments"),
    (bad_kwonly, "flag need a default"),
    (bad_gen, "generator"),
    (BadCallable(), "two arguments"),
    (42, "not a function"),
])
def test_wrong_signatures_fail_in_one_line(fn: Any, words: str) -> None:
    with pytest.raises(ProcessorSignatureError) as info:
        check_processor(fn)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_load_processor_checks_the_signature() -> None:
    assert load_processor(f"{__name__}:good_async") is good_async
    with pytest.raises(ProcessorSignatureError, match="bad_one_async"):
        load_processor(f"{__name__}:bad_one_async")


def test_needs_state_marks_the_processor() -> None:
    @needs_state
    def handle(record: Record, ctx: Context) -> None: ...

    assert processor_needs_state(handle)
    assert not processor_needs_state(good_sync)


def test_import_multilane_reaches_the_api_without_the_worker() -> None:
    code = textwrap.dedent("""
        import sys
        import multilane
        assert multilane.api.Record("t", 0, 1, None, b'{"a": 1}').json() == {"a": 1}
        assert multilane.App.__name__ == "App"
        heavy = sorted(m for m in ("confluent_kafka", "aiohttp", "rocksdict", "multilane.worker.engine")
                       if m in sys.modules)
        print(heavy)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


APP = '''
import multilane.api

async def one_arg(record):
    pass

@multilane.api.needs_state
def totals(record, ctx):
    ctx.state.put(b"1")
'''


@pytest.mark.parametrize(("processor", "expected"), [
    ("badapp:one_arg", "must take two arguments (record, ctx)"),
    ("badapp:totals", "needs state (marked @needs_state or App(state=True)): start the worker with "
                      "--state-dir DIR"),
    ("nosuchmodule:handle", "is its directory on PYTHONPATH?"),
])
def test_worker_refuses_a_bad_deploy_before_consuming(tmp_path: Path, processor: str, expected: str) -> None:
    (tmp_path / "badapp.py").write_text(APP)
    # an unreachable broker: the worker must exit on the processor before it tries to connect
    out = subprocess.run(
        [sys.executable, "-m", "multilane", "worker", "--bootstrap-servers", "127.0.0.1:9",
         "--group", "g", "--topic", "t", "--processor", processor],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}, cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert expected in lines[0]
    assert out.stdout == ""
