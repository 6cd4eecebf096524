"""``multilane.App``: processor checks, settings layers (App < file < environment < command line), typed
app settings, lifespan hooks, and ``multilane worker --app`` refusing a bad app in one line."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multilane.api import Context, ProcessorSignatureError, Record, processor_needs_state
from multilane.app import App, AppConfigError
from multilane.worker.cli import add_arguments, parse_args

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Settings:
    api_url: str = "http://localhost"
    timeout_s: float = 1.0
    retries: int = 2
    dry_run: bool = False
    limit: int | None = None


def handle(record: Record, ctx: Context) -> None: ...


def make_app(**kw: object) -> App:
    return App(handle, name="totals", settings=Settings, **kw)  # type: ignore[arg-type]


def parse(app: App, argv: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parse_args(parser, argv, app=app, environ=environ or {})


def test_processor_is_checked_and_state_marks_it() -> None:
    wrong = App(lambda record: None, name="wrong")  # checked when a worker (or a test) takes it
    with pytest.raises(ProcessorSignatureError, match=r"wrong's processor .* two arguments"):
        wrong.get_processor()
    app = App(state=True)
    with pytest.raises(AppConfigError, match="no processor"):
        app.get_processor()

    @app.processor
    async def totals(record: Record, ctx: Context) -> None: ...

    assert app.get_processor() is totals and processor_needs_state(totals)


def test_settings_layers(tmp_path: Path) -> None:
    app = make_app(topic="orders", group="from-app", factor=4, value_format="json")
    args = parse(app, ["--bootstrap-servers", "b:1"])
    assert (args.topic, args.group, args.factor, args.value_format) == (["orders"], "from-app", 4, "json")
    assert args.app_object is app

    conf = tmp_path / "app.toml"
    conf.write_text('group = "from-file"\nfactor = 16\nmax-retries = 5\n'
                    '[settings]\napi_url = "http://file"\nretries = 7\n')
    env = {"MULTILANE_FACTOR": "32", "MULTILANE_TOPIC": "a, b", "MULTILANE_APP_RETRIES": "9",
           "MULTILANE_APP_DRY_RUN": "yes"}
    args = parse(app, ["--bootstrap-servers", "b:1", "--config", str(conf), "--max-retries", "1",
                       "--set", "timeout_s=2.5"], env)
    # file over App, environment over file, command line over all
    assert (args.group, args.factor, args.topic, args.max_retries) == ("from-file", 32, ["a", "b"], 1)
    assert app.settings == Settings(api_url="http://file", timeout_s=2.5, retries=9, dry_run=True)


def test_json_settings_file_and_optional_fields(tmp_path: Path) -> None:
    conf = tmp_path / "app.json"
    conf.write_text('{"topic": ["x", "y"], "settings": {"limit": 10, "timeout_s": 3}}')
    app = make_app()
    args = parse(app, ["--config", str(conf), "--set", "limit=none"])
    assert args.topic == ["x", "y"]
    assert app.settings == Settings(timeout_s=3.0, limit=None)


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--set", "retries=many"], {}, "--set retries: 'many' is not a int"),
    (["--set", "colour=red"], {}, "no setting 'colour'"),
    ([], {"MULTILANE_APP_DRY_RUN": "maybe"}, "MULTILANE_APP_DRY_RUN: 'maybe' is not a bool"),
    (["--config", "/nonexistent/app.toml"], {}, "settings file /nonexistent/app.toml"),
])
def test_bad_settings_exit_2_in_one_line(argv: list[str], env: dict[str, str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(make_app(), argv, env)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_unknown_worker_setting_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(App(handle, topics="orders"), [])
    assert "'topics' is not a multilane worker setting" in capsys.readouterr().err


def test_settings_without_resolution_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULTILANE_APP_API_URL", "http://env")
    assert make_app().settings.api_url == "http://env"


def test_lifespan_runs_hooks_in_order_and_cleans_up_on_failure() -> None:
    app = App(handle)
    calls: list[str] = []

    @app.on_startup
    async def open_session() -> None:
        calls.append("startup-1")

    @app.on_startup
    def warm_cache() -> None:
        calls.append("startup-2")

    @app.context
    async def pool():  # type: ignore[no-untyped-def]
        calls.append("enter")
        try:
            yield
        finally:
            calls.append("exit")

    @app.on_shutdown
    async def close_session() -> None:
        calls.append("shutdown-1")

    @app.on_shutdown
    def flush() -> None:
        calls.append("shutdown-2")

    async def main() -> None:
        async with app.lifespan():
            calls.append("run")
            raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        asyncio.run(main())
    assert calls == ["startup-1", "startup-2", "enter", "run", "exit", "shutdown-2", "shutdown-1"]
    with pytest.raises(TypeError, match="async generator"):
        app.context(handle)  # type: ignore[arg-type]


APP = '''
import dataclasses
import multilane

async def totals(record, ctx):
    pass

app = multilane.App(totals, state=True, topic="orders")
not_an_app = 3


def one_arg(record):
    pass


wrong = multilane.App(one_arg, name="myapp")
'''


@pytest.mark.parametrize(("argv", "expected"), [
    (["--app", "myapp:app"], "app 'myapp:app' needs state (marked @needs_state or App(state=True)): "
                                "start the worker with --state-dir DIR"),
    (["--app", "myapp:not_an_app"], "app 'myapp:not_an_app' names a int, not a multilane.App"),
    (["--app", "myapp:app", "--processor", "myapp:totals"], "use either --processor or --app"),
    (["--topic", "t"], "the following settings are required: --processor (or --app)"),
    (["--app", "myapp:wrong", "--topic", "t"], "myapp's processor def one_arg(record) must take two "
                                               "arguments (record, ctx)"),
])
def test_worker_app_refused_in_one_line(tmp_path: Path, argv: list[str], expected: str) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    out = subprocess.run(
        [sys.executable, "-m", "multilane", "worker", "--bootstrap-servers", "127.0.0.1:9", "--group", "g",
         *argv], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}, cwd=tmp_path)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"multilane worker: {expected}")


def test_run_finds_the_worker_runner_through_its_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """``App.run`` imports no CLI (the CLI imports the App): it loads the runner the package registers
    (entry point ``worker`` of ``multilane.runners``) and exits with its code."""
    from multilane import app as app_module
    from multilane.worker import cli

    assert app_module._runner() is cli.run_app
    seen: list[tuple[object, list[str]]] = []

    def fake_run_app(app: object, argv: list[str]) -> int:
        seen.append((app, argv))
        return 7

    monkeypatch.setattr(cli, "run_app", fake_run_app)
    app = App(lambda record, ctx: None, name="x")
    with pytest.raises(SystemExit) as exited:
        app.run(["--topic", "t"])
    assert exited.value.code == 7 and seen == [(app, ["--topic", "t"])]
