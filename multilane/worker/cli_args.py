"""The ``multilane worker`` flags, ``--retry-on`` and the App's settings layers. Does I/O.

It reads the environment (defaults) and imports the app named by ``--app``.

Split out of :mod:`multilane.worker.cli` (which re-exports every name here); the run and its
preflight checks stay there.
"""

from __future__ import annotations

import argparse
import builtins
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from multilane.api import OrderingMode, ProcessorLoadError, load_object
from multilane.worker import supervision
from multilane.worker.config import ConfigError

if TYPE_CHECKING:
    from multilane.app import App

__all__ = ["LOOPS", "POD_IP_ENV", "add_arguments", "load_app", "parse_args", "parse_retry_on"]


POD_IP_ENV = "MULTILANE_POD_IP"


LOOPS = ("asyncio", "uvloop")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Every flag has a help text, so that ``--help`` shows every default (ArgumentDefaultsHelpFormatter
    # in multilane/cli.py adds "(default: ...)").
    a = parser.add_argument
    a("--bootstrap-servers", default=None, help="Kafka bootstrap servers, HOST:PORT[,...] (required)")
    a("--group", default=None, help="consumer group id (commits and progress live under it; required)")
    a("--processor", default=None, help="the processing function, 'package.module:function' (its "
      "directory must be on PYTHONPATH); called as f(record, ctx), checked at start (or --app)")
    a("--app", default=None, help="run a multilane.App, 'package.module:app' (processor, settings, hooks); "
      "its settings also come from --config, MULTILANE_<FLAG> and MULTILANE_APP_<FIELD> variables")
    a("--config", default=None, metavar="FILE",
      help="with --app: a TOML or JSON settings file (worker flags at the top level, [settings] table)")
    a("--set", action="append", default=[], metavar="FIELD=VALUE",
      help="with --app: one of the app's own settings (repeatable)")
    a("--topic", action="append", default=[], help="standalone mode: subscribe to this topic (repeatable)")
    a("--assign", default=None, help="operator mode: static assignment T:P[,T:P...] (no group join)")
    a("--ordering", choices=[m.value for m in OrderingMode], default="key",
      help="key: one record per key at a time, in order; partition: one per partition; unordered: any")
    a("--factor", type=int, default=8, help="lanes per partition")
    a("--max-in-flight", type=int, default=10_000, help="records in flight per process")
    a("--max-in-flight-bytes", type=int, default=64 * 1024 * 1024, help="bytes in flight per process")
    a("--key-format", default="bytes", metavar="FORMAT",
      help="decode keys before the processor: bytes, str, json or 'package.module:callable'; a key that "
           "does not decode goes to the dead-letter topic at once (reason decode-error)")
    a("--value-format", default="bytes", metavar="FORMAT",
      help="decode values before the processor (record.decoded_value, record.json()): as --key-format")
    a("--max-retries", type=int, default=3, help="retries of a failed record before its dead letter")
    a("--retry-backoff-ms", type=int, default=100, help="first retry delay (doubles per retry, jittered)")
    a("--retry-on", action="append", default=[], metavar="EXCEPTION",
      help="retry only these exception types (builtin name like TimeoutError, or 'package.module:Class'; "
           "repeatable; none given = every Exception); others and multilane.api.NonRetryable go to the "
           "dead-letter topic at once")
    a("--dead-letter-topic", default=None, help='dead-letter topic (None: "<topic>.dlq")')
    a("--commit-interval-ms", type=int, default=1000, help="offset commit cycle")
    a("--progress-interval-ms", type=int, default=50,
      help="write progress records (completed work above the committed offset) this often, between "
           "commits; a kill -9 replays at most the records in flight plus those completed in the last "
           "interval (0 = only with commits)")
    a("--loop", choices=LOOPS, default="asyncio",
      help="event loop: asyncio or uvloop (needs the 'uvloop' extra)")
    a("--metrics-port", type=int, default=0, help="Prometheus port (0 = off)")
    a("--control-port", type=int, default=0, help="control API port (0 = off)")
    a("--control-token-file", default=None, help="file with the control token (or $MULTILANE_CONTROL_TOKEN)")
    a("--control-tls-cert", default=None, help="PEM serving certificate of the control port (enables TLS)")
    a("--control-tls-key", default=None, help="PEM key of --control-tls-cert")
    a("--control-tls-client-ca", default=None,
      help="PEM CA of the client certificates the control port accepts (mutual TLS; needed with TLS)")
    a("--control-tls-reload-s", type=float,
      default=float(os.environ.get("MULTILANE_CONTROL_TLS_RELOAD_S", "30")),
      help="check the TLS files for a rotation this often (or $MULTILANE_CONTROL_TLS_RELOAD_S; default 30)")
    a("--bind-host", default=None,
      help=f"address of the control and metrics endpoints (default: ${POD_IP_ENV}, which the operator sets"
           " from the pod's IP, else 127.0.0.1)")
    a("--worker-id", default=None, help="this worker's id (None: worker-<random>)")
    a("--state-dir", default=None, help="directory of the per-partition state stores (enables state)")
    a("--snapshot-uri", default=None,
      help="state snapshots (`multilane snapshot --uri`): full restores and learners start from the newest "
           "usable one plus the changelog tail (needs --state-dir and pyarrow)")
    a("--state-owner", default=None,
      help="owner of --state-dir (default $MULTILANE_STATE_OWNER; the operator sets the ParallelConsumer's "
           "uid): a directory stamped with another owner is wiped and restored, never used")
    a("--state-on-corrupt", choices=["fail", "skip"], default="fail",
      help="a changelog record that does not decode fails the restore or is logged and skipped")
    a("--changelog-config", action="append", default=[], metavar="KEY=VALUE",
      help="extra topic config of changelog topics created by the worker (repeatable)")
    a("--stall-threshold-s", type=float, default=60.0, help="warn about a record running longer than this")
    a("--drain-timeout-s", type=float, default=30.0,
      help="shutdown: wait this long for the records running (queued ones are left to the next owner)")
    a("--release-drain", choices=("running", "queued"), default="running",
      help="a release waits for the records running (queued ones go to the next owner) or for "
           "every fetched record (queued: the older, slower behaviour, for comparisons)")
    a("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
      help="extra librdkafka setting (repeatable)")
    a("--lease", choices=["auto", "on", "off"], default="auto",
      help="renew this pod's Lease and stop processing when it cannot (operator mode): 'auto' "
           "when the pod environment the operator's StatefulSet sets is present, 'on' requires it")
    a("--outputs", choices=("on", "off", "exactly-once"), default="on",
      help="ctx.produce: 'on': one idempotent producer per worker; a record completes (and may be "
           "committed) only once every output it produced is acknowledged (at-least-once); "
           "'exactly-once': outputs, offsets and progress in one transaction per input partition "
           "(read_committed readers see each input's outputs once; docs/outputs.md)")
    a("--transaction-max-records", type=int, default=10_000,
      help="exactly-once: a partition's transaction commits at --commit-interval-ms or once this many "
           "records (with or without outputs) are in it, whichever comes first")
    a("--output-linger-ms", type=float, default=1.0,
      help="the output producer's linger.ms (a record waits for its outputs, so this adds to latency)")
    a("--output-idempotence", choices=("on", "off"), default="on",
      help="the output producer is idempotent (on), or sends one request at a time per broker (off: "
           "order kept, a client retry may duplicate; the embedded test broker's benchmark runs faster "
           "with off: docs/outputs.md)")
    a("--output-topic", action="append", default=[], metavar="NAME[:PARTITIONS]",
      help="a topic ctx.produce writes to, checked before the worker consumes (repeatable): NAME must "
           "exist (else the worker stops with one line, exit 2); NAME:PARTITIONS is created with that "
           "many partitions when missing. Brokers create unknown topics on the first produce by default")
    a("--output-config", action="append", default=[], metavar="KEY=VALUE",
      help="extra librdkafka setting of the output producer (repeatable; security settings come from "
           "the consumer's)")
    a("--log-level", default=os.environ.get("MULTILANE_LOG_LEVEL", "INFO"),
      help="DEBUG, INFO, WARNING or ERROR (or $MULTILANE_LOG_LEVEL)")
    supervision.add_arguments(parser)


def parse_retry_on(names: list[str]) -> tuple[type[BaseException], ...]:
    """``--retry-on`` values as exception types (none = every Exception); ConfigError naming a bad one."""
    if not names:
        return (Exception,)
    out: list[type[BaseException]] = []
    for name in names:
        if ":" in name:
            try:
                obj = load_object(name, "--retry-on")
            except ProcessorLoadError as exc:
                raise ConfigError(str(exc)) from exc
        else:
            obj = getattr(builtins, name, None)
        if not (isinstance(obj, type) and issubclass(obj, BaseException)):
            raise ConfigError(f"--retry-on {name!r} is not an exception type (a builtin name such as "
                              "TimeoutError, or 'package.module:Class')")
        out.append(obj)
    return tuple(out)


def parse_args(parser: argparse.ArgumentParser, argv: list[str], app: App | None = None,
               environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """The command line, with an App's settings layered under it (steps 1-4; ``multilane.app``).

    1. Find ``--app`` / ``--config`` (``app`` given: ``App.run``).
    2. Without an app, the command line alone.
    3. With one, the worker defaults from the App's arguments, the settings file and the environment
       become the parser's defaults.
    4. The command line on top; the app's own settings are resolved (file, environment, ``--set``).
    A bad app or setting prints one line and exits 2.
    """
    env = os.environ if environ is None else environ
    try:
        # 1. --app, --config
        pre, _ = parser.parse_known_args(argv)
        if app is None and pre.app:
            app = load_app(pre.app)
        # 2. no app
        if app is None:
            return parser.parse_args(argv)
        # 3. layered defaults
        dests = {a.dest: a.default for a in parser._actions if a.dest != "help"}
        defaults, settings_table = app.resolve(dests, pre.config, env)
        parser.set_defaults(**defaults)
        # 4. command line, app settings
        args = parser.parse_args(argv)
        app.settings = app.build_settings(settings_table, env, args.set)
    except (ProcessorLoadError, ValueError) as exc:
        print(f"multilane worker: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    args.app_object = app
    return args


def load_app(spec: str) -> App:
    """The :class:`multilane.App` named ``package.module:app``; ProcessorLoadError if it is not one."""
    from multilane.app import App

    obj = load_object(spec, "app")
    if not isinstance(obj, App):
        raise ProcessorLoadError(f"app {spec!r} names a {type(obj).__name__}, not a multilane.App")
    return obj
