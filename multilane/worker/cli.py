"""``multilane worker``: run one worker process (engine + control endpoint + metrics). Does I/O.

Contract (others rely on it): prints exactly one line
``multilane-worker ready worker_id=... control_port=... metrics_port=...`` to stdout once it is
consuming; logs to stderr; on SIGTERM/SIGINT drains in-flight records, commits synchronously and exits 0.
Exit codes: 0 clean stop, 2 bad arguments or configuration, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from multilane.api import (
    OrderingMode,
    Processor,
    ProcessorLoadError,
    load_processor,
    processor_needs_state,
)
from multilane.codecs import CodecError, RecordDecoder, decoding_processor
from multilane.extras import MissingExtraError, require
from multilane.worker import supervision
from multilane.worker.cli_args import LOOPS, POD_IP_ENV, add_arguments, load_app, parse_args, parse_retry_on
from multilane.worker.config import (
    OWNED_CLIENT_KEYS,
    ConfigError,
    EngineConfig,
    kafka_settings_from_environment,
    security_settings,
)
from multilane.worker.lease import LeaseKeeper, LeaseSettings
from multilane.worker.output_topics import parse_output_topics

if TYPE_CHECKING:
    from multilane.app import App
    from multilane.worker.control_tls import ControlTlsServer
    from multilane.worker.state.manager import StateManager

__all__ = ["LOOPS", "POD_IP_ENV", "add_arguments", "build_config", "check_processor_state",
           "check_state_args", "client_settings", "lease_settings", "load_app", "load_decoding_processor",
           "parse_args", "parse_retry_on", "run", "run_app", "start_lease_keeper"]

log = logging.getLogger("multilane.worker")


def control_tls(args: argparse.Namespace) -> ControlTlsServer | None:
    """The control port's TLS from ``--control-tls-*`` (all three, or none: ValueError otherwise)."""
    from multilane.worker.control_tls import ControlTlsFiles, ControlTlsServer

    given = [args.control_tls_cert, args.control_tls_key, args.control_tls_client_ca]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("--control-tls-cert, --control-tls-key and --control-tls-client-ca go together")
    return ControlTlsServer(ControlTlsFiles(*given))


def bind_host(explicit: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """Where the endpoints listen: ``--bind-host``, else the pod IP (``$MULTILANE_POD_IP``, from
    ``status.podIP`` in the operator's StatefulSet), else loopback. Never every interface by default."""
    return explicit or environ.get(POD_IP_ENV) or "127.0.0.1"


def run_app(app: App, argv: list[str]) -> int:
    """``App.run``'s runner (entry point ``worker`` of ``multilane.runners``, pyproject.toml): parse
    ``argv`` (``multilane worker`` flags) for ``app`` and run the worker."""
    parser = argparse.ArgumentParser(prog=os.path.basename(sys.argv[0]) or app.name,
                                     description=f"{app.name}: a multilane worker",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser)
    return run(parse_args(parser, argv, app=app))


def load_decoding_processor(args: argparse.Namespace, app: App | None = None) -> Processor:
    """The processor of ``--processor`` (or the app's), checked, decoding per ``--key-format`` /
    ``--value-format``."""
    processor = app.get_processor() if app is not None else load_processor(args.processor)
    try:
        decoder = RecordDecoder.from_formats(args.key_format, args.value_format)
    except CodecError as exc:
        raise ConfigError(str(exc)) from exc
    return decoding_processor(processor, decoder)


def _parse_assign(text: str) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        topic, sep, part = item.rpartition(":")
        if not sep or not topic:
            raise ConfigError(f"--assign entry {item!r} must look like TOPIC:PARTITION")
        try:
            p = int(part)
        except ValueError as exc:
            raise ConfigError(f"--assign entry {item!r}: partition {part!r} is not an int") from exc
        if p < 0:
            raise ConfigError(f"--assign entry {item!r}: partition must be >= 0")
        out.append((topic, p))
    return tuple(out)


def _parse_kv(items: list[str], flag: str = "--consumer-config") -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"{flag} {item!r} must look like key=value")
        out[k.strip()] = v
    return out


def client_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The extra librdkafka settings (steps 1-3); ConfigError naming keys, never values.

    1. ``MULTILANE_KAFKA_<key>`` variables (the credentials Secret, by ``envFrom``):
       :func:`~multilane.worker.config.kafka_settings_from_environment`.
    2. ``--consumer-config KEY=VALUE`` (the CR's non-secret ``spec.kafka.config``).
    3. Neither may set an owned setting, nor may both set the same key (a credential is never
       silently replaced). The security settings among them reach every client (consumer, producer,
       admin, state store); the others only the consumer.
    """
    # 1. environment
    from_env = kafka_settings_from_environment(os.environ if environ is None else environ)
    # 2. command line
    from_args = _parse_kv(args.consumer_config)
    # 3. owned keys, conflicts
    owned = sorted(k for k in from_args if k in OWNED_CLIENT_KEYS)
    if owned:
        raise ConfigError(f"--consumer-config may not set {', '.join(owned)} (set by multilane)")
    both = sorted(set(from_env) & set(from_args))
    if both:
        raise ConfigError(f"{', '.join(both)} set both by --consumer-config and by a MULTILANE_KAFKA_ "
                          "variable")
    return {**from_env, **from_args}


def build_config(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> EngineConfig:
    """The engine configuration named by the command line and the ``MULTILANE_KAFKA_*`` environment
    (``environ``, default ``os.environ``); ConfigError on bad values."""
    operator_mode = args.assign is not None
    if operator_mode and args.topic:
        raise ConfigError("use either --topic (standalone) or --assign (operator mode), not both")
    if not operator_mode and not args.topic:
        raise ConfigError("give --topic (standalone mode) or --assign (operator mode)")
    extra: dict[str, Any] = {}
    if args.worker_id:
        extra["worker_id"] = args.worker_id
    return EngineConfig(
        bootstrap_servers=args.bootstrap_servers,
        group=args.group,
        topics=tuple(args.topic),
        assign=_parse_assign(args.assign) if operator_mode else (),
        operator_mode=operator_mode,
        ordering=OrderingMode(args.ordering),
        factor=args.factor,
        max_in_flight=args.max_in_flight,
        max_in_flight_bytes=args.max_in_flight_bytes,
        max_retries=args.max_retries,
        retry_backoff_ms=args.retry_backoff_ms,
        retry_on=parse_retry_on(args.retry_on),
        dead_letter_topic=args.dead_letter_topic,
        commit_interval_ms=args.commit_interval_ms,
        progress_interval_ms=args.progress_interval_ms,
        stall_threshold_s=args.stall_threshold_s,
        drain_timeout_s=args.drain_timeout_s,
        release_drain=args.release_drain,
        consumer_overrides=client_settings(args, environ),
        **extra,
    )


def check_state_args(args: argparse.Namespace) -> None:
    """The state flags are consistent, and a snapshot URI can be read (pyarrow); ConfigError if not."""
    if not args.state_dir:
        flags = (("--snapshot-uri", args.snapshot_uri), ("--changelog-config", args.changelog_config),
                 ("--state-on-corrupt", args.state_on_corrupt != "fail"),
                 ("--state-owner", getattr(args, "state_owner", None)))
        given = [f for f, v in flags if v]
        if given:
            raise ConfigError(f"{', '.join(given)} need(s) --state-dir")
        return
    _parse_kv(args.changelog_config, "--changelog-config")
    try:
        require("state", for_what="--state-dir")
    except MissingExtraError as exc:
        raise ConfigError(str(exc)) from exc
    if args.snapshot_uri:
        from multilane.worker.state.snapshot import SnapshotSupportError, require_snapshot_support

        try:
            require_snapshot_support()
        except SnapshotSupportError as exc:
            raise ConfigError(str(exc)) from exc


def check_processor_state(processor: Any, args: argparse.Namespace) -> None:
    """A processor marked ``@needs_state`` (or an ``App(state=True)``) needs ``--state-dir``."""
    if processor_needs_state(processor) and not args.state_dir:
        app = getattr(args, "app_object", None)
        what = (f"app {args.app!r}" if args.app else f"app {app.name!r}" if app is not None
                else f"processor {args.processor!r}")
        raise ConfigError(f"{what} needs state (marked @needs_state or App(state=True)): "
                          "start the worker with --state-dir DIR")


def check_required(args: argparse.Namespace) -> None:
    """``--bootstrap-servers``, ``--group`` and one of ``--processor`` / ``--app``; ConfigError if not."""
    has_app = bool(args.app or getattr(args, "app_object", None))
    if args.processor and has_app:
        raise ConfigError("use either --processor or --app, not both")
    missing = [flag for flag, value in (("--bootstrap-servers", args.bootstrap_servers),
                                        ("--group", args.group),
                                        ("--processor (or --app)", args.processor or has_app)) if not value]
    if missing:
        raise ConfigError(f"the following settings are required: {', '.join(missing)}")


LEASE_ENV = ("KUBERNETES_SERVICE_HOST", "MULTILANE_POD_NAME", "MULTILANE_POD_NAMESPACE")


def lease_settings(args: argparse.Namespace,
                   environ: Mapping[str, str] | None = None) -> LeaseSettings | None:
    """The Lease this worker must renew (``--lease``), or None; ConfigError when it cannot be.

    ``auto``: in operator mode when every variable of :data:`LEASE_ENV` is set (the StatefulSet sets
    them); ``on``: required (operator mode and the variables); ``off``: never.
    """
    env = os.environ if environ is None else environ
    if args.lease == "off":
        return None
    missing = [k for k in LEASE_ENV if not env.get(k)]
    if args.lease == "auto" and (args.assign is None or missing):
        return None
    if args.assign is None:
        raise ConfigError("--lease on needs operator mode (--assign)")
    if missing:
        raise ConfigError(f"--lease on: {', '.join(missing)} not set (the operator's StatefulSet sets them)")
    try:
        return LeaseSettings.from_environment()
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"lease settings: {exc}") from exc


def start_lease_keeper(engine: Any, settings: LeaseSettings) -> LeaseKeeper:
    """Renew the Lease on the running loop; fence the engine when it cannot (steps 1-3).

    1. ``on_lost`` (no renewal for ``lease_duration - stop_margin`` seconds) calls ``engine.fence()``:
       processing and committing stop at once, before the operator may consider the worker dead.
    2. ``on_renewed`` calls ``engine.lease_renewed()``: the engine stays fenced until the operator
       pushes an assignment with a higher generation (its partitions may have moved meanwhile), and
       accepts none before the renewal.
    3. The keeper keeps trying to renew until stopped (``await keeper.stop()``).
    """
    def renewed() -> None:
        # 2. stay fenced, but accept a higher generation from now on
        engine.lease_renewed()
        log.warning("lease %s renewed again; waiting for an assignment with a higher generation",
                    settings.name)

    # 1. fence on loss
    keeper = LeaseKeeper(settings, on_lost=engine.fence, on_renewed=renewed)
    # 3. renew
    keeper.start()
    log.info("renewing lease %s/%s every %.1fs (stop after %.1fs without renewal)", settings.namespace,
             settings.name, settings.renew_interval_s, settings.lease_duration_s - settings.stop_margin_s)
    return keeper


def _state_hooks(args: argparse.Namespace, cfg: EngineConfig) -> StateManager | None:
    """The state store (``StateManager``) named by --state-dir and the other state flags, or None."""
    if not args.state_dir:
        return None
    from multilane.worker.state.manager import StateManager
    from multilane.worker.state.owner import OWNER_ENV, claim_state_dir

    owner = getattr(args, "state_owner", None) or os.environ.get(OWNER_ENV)
    if owner:  # before any store opens: another owner's stores are wiped, never used
        claim_state_dir(args.state_dir, owner)
    security = security_settings(cfg.consumer_overrides)
    return StateManager(args.state_dir, cfg.bootstrap_servers, cfg.group,
                        producer_config=security, consumer_config=security, admin_config=security,
                        changelog_topic_config=_parse_kv(args.changelog_config, "--changelog-config"),
                        on_corrupt=args.state_on_corrupt, snapshot_uri=args.snapshot_uri or None,
                        transactional=getattr(args, "outputs", "on") == "exactly-once")


async def _serve(args: argparse.Namespace, cfg: EngineConfig, processor: Any, token: str | None,
                 lease: LeaseSettings | None = None, app: App | None = None) -> int:
    """Run the app's startup hooks, the worker until a signal, then the app's shutdown hooks
    (:meth:`multilane.App.lifespan`; the hooks run on this loop, around the engine's whole life)."""
    if app is None:
        return await _serve_engine(args, cfg, processor, token, lease)
    async with app.lifespan():
        log.info("%s: startup hooks done", app.name)
        return await _serve_engine(args, cfg, processor, token, lease)


def transactional_outputs(args: argparse.Namespace, cfg: EngineConfig) -> Any | None:
    """The worker's :class:`~multilane.worker.transactions.TransactionalOutputs`
    (``--outputs exactly-once``), or None."""
    if getattr(args, "outputs", "on") != "exactly-once":
        return None
    from multilane.worker.health import kafka_logger
    from multilane.worker.transactions import TransactionalOutputs, transactional_producer_config

    conf = transactional_producer_config(cfg.bootstrap_servers, f"multilane-{cfg.worker_id}-txn", "",
                                         security=security_settings(cfg.consumer_overrides),
                                         extra=_parse_kv(args.output_config, "--output-config"))
    conf.setdefault("logger", kafka_logger())
    return TransactionalOutputs.from_config(conf, cfg.group, max_records=args.transaction_max_records)


async def check_transactions_or_refuse(args: argparse.Namespace, cfg: EngineConfig) -> str | None:
    """``--outputs exactly-once``: one line when the broker does not run transactions, else None."""
    if getattr(args, "outputs", "on") != "exactly-once":
        return None
    from multilane.worker.transactions import (
        TransactionsUnavailableError,
        check_transactions,
        transactional_producer_config,
    )

    conf = transactional_producer_config(cfg.bootstrap_servers, f"multilane-{cfg.worker_id}-probe",
                                         f"multilane.{cfg.group}.probe.{cfg.worker_id}",
                                         security=security_settings(cfg.consumer_overrides))
    try:
        await asyncio.to_thread(check_transactions, conf, float(getattr(args, "transaction_probe_s", 15.0)))
    except TransactionsUnavailableError as exc:
        return str(exc)
    return None


def check_exactly_once_args(args: argparse.Namespace) -> None:
    """ConfigError (one line) for settings ``--outputs exactly-once`` cannot honour."""
    if getattr(args, "outputs", "on") != "exactly-once":
        return
    if getattr(args, "transaction_max_records", 1) < 1:
        raise ConfigError("--transaction-max-records must be at least 1")


def output_producer(args: argparse.Namespace, cfg: EngineConfig) -> Any | None:
    """The worker's :class:`~multilane.worker.outputs.OutputProducer` (``--outputs on``), or None."""
    if getattr(args, "outputs", "on") != "on":
        return None
    from multilane.worker.health import kafka_logger
    from multilane.worker.outputs import OutputProducer, output_producer_config

    conf = output_producer_config(cfg.bootstrap_servers, f"multilane-{cfg.worker_id}-outputs",
                                  args.output_linger_ms, security_settings(cfg.consumer_overrides),
                                  _parse_kv(args.output_config, "--output-config"),
                                  idempotent=getattr(args, "output_idempotence", "on") == "on")
    conf.setdefault("logger", kafka_logger())
    return OutputProducer.from_config(conf)


async def _serve_engine(args: argparse.Namespace, cfg: EngineConfig, processor: Any, token: str | None,
                        lease: LeaseSettings | None = None) -> int:
    """Run until a signal (steps 1-5).

    1. Build the output producer (``ctx.produce``; the processor waits for its outputs' acknowledgements,
       :mod:`multilane.worker.outputs`), the engine (and the state hooks with --state-dir).
    2. Start the control and metrics endpoints (they answer /healthz and status while starting).
    3. Start the engine (initial assignment or subscription); then, with a Lease, the keeper that
       fences the engine when the Lease cannot be renewed (:func:`start_lease_keeper`).
    4. Print the ready line; wait for SIGTERM/SIGINT.
    5. Stop the lease keeper, the engine (drain, final commit unless fenced), then the endpoints,
       then the output producer (flush), then close the state store (checkpoints learners, closes
       its Kafka clients).
    """
    from multilane.worker.control import ControlServer
    from multilane.worker.engine import Engine
    from multilane.worker.metrics import MetricsServer

    loop = asyncio.get_running_loop()
    # 1. outputs, guard, engine
    supervisor = supervision.WorkerSupervisor(args, cfg)
    outputs = output_producer(args, cfg)
    if outputs is not None:
        outputs.start(loop)
    txns = transactional_outputs(args, cfg)
    processor = supervisor.wrap(processor, txns if txns is not None else outputs)
    hooks = _state_hooks(args, cfg)
    engine = Engine(cfg, processor, hooks, transactions=txns)

    def stop_requested() -> None:
        supervisor.request_stop()
        engine.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested)
    # 2. endpoints
    control = metrics = None
    keeper: LeaseKeeper | None = None
    background: list[asyncio.Task[None]] = []
    control_port = metrics_port = 0
    if args.control_port:
        assert token is not None
        tls = control_tls(args)
        control = ControlServer(
            engine, token, host=bind_host(args.bind_host), port=args.control_port,
            ssl_context=tls.context if tls else None, supervisor=supervisor,
        )  # fmt: skip
        if tls is not None:
            reloader = asyncio.create_task(
                tls.run_reloader(args.control_tls_reload_s), name="control-tls-reloader"
            )
            reloader.add_done_callback(lambda _: None)  # lives until the loop ends (rotation)
            background.append(reloader)
        control_port = await control.start()
    if args.metrics_port:
        metrics = MetricsServer(
            engine.metrics, host=bind_host(args.bind_host), port=args.metrics_port,
            probes=control.probes() if control is not None else None,
        )  # fmt: skip
        metrics_port = await metrics.start()
    try:
        # 3. broker and topics, engine, lease
        try:
            await supervisor.preflight()
        except supervision.StartupError as exc:
            log.error("%s", exc)
            print(f"multilane worker: {exc}", file=sys.stderr, flush=True)
            supervisor.exit_code = exc.code
            return exc.code
        refusal = await check_transactions_or_refuse(args, cfg)
        if refusal is not None:
            log.error("%s", refusal)
            print(f"multilane worker: {refusal}", file=sys.stderr, flush=True)
            supervisor.exit_code = 2
            return 2
        await engine.start()
        supervisor.start(engine)
        if lease is not None:
            keeper = start_lease_keeper(engine, lease)
        # 4. ready
        print(f"multilane-worker ready worker_id={cfg.worker_id} control_port={control_port} "
              f"metrics_port={metrics_port}", flush=True)
        await engine.wait_stop_requested()
        log.info("stop requested: draining")
    finally:
        # 5. stop
        try:
            if keeper is not None:
                await keeper.stop()
            await engine.stop()
            if control is not None:
                await control.stop()
            for task in background:
                task.cancel()
            if metrics is not None:
                await metrics.stop()
        finally:
            await supervisor.stop()
            if outputs is not None:
                await asyncio.to_thread(outputs.close)
            if hooks is not None:
                await asyncio.to_thread(hooks.close)
    return supervisor.exit_code


def _configure_logging(args: argparse.Namespace) -> None:
    """stderr logging at ``--log-level``, as text or JSON lines (``--log-format``)."""
    handler = logging.StreamHandler(sys.stderr)
    if getattr(args, "log_format", "text") == "json":
        handler.setFormatter(supervision.JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for ``--loop`` (None: asyncio's default loop).

    Raises :class:`~multilane.extras.MissingExtraError` (one line) when uvloop is not installed.
    """
    if name != "uvloop":
        return None
    require("uvloop", for_what="multilane worker --loop uvloop")
    import uvloop

    return uvloop.new_event_loop


def run(args: argparse.Namespace) -> int:
    _configure_logging(args)
    try:
        check_required(args)
        app = getattr(args, "app_object", None)
        if app is None and args.app:
            app = load_app(args.app)
        cfg = build_config(args)
        cfg = dataclasses.replace(cfg, consumer_overrides=supervision.client_overrides(
            args, dict(cfg.consumer_overrides)))
        check_state_args(args)
        check_exactly_once_args(args)
        _parse_kv(getattr(args, "output_config", []), "--output-config")
        parse_output_topics(getattr(args, "output_topic", []))
        lease = lease_settings(args)
        processor = load_decoding_processor(args, app)
        check_processor_state(processor, args)
        token: str | None = None
        if args.control_port:
            from multilane.worker.control import TokenError, load_token

            try:
                token = load_token(args.control_token_file)
            except TokenError as exc:
                raise ConfigError(str(exc)) from exc
            control_tls(args)  # the TLS files load (ValueError: one line here, not a traceback later)
        factory = loop_factory(args.loop)
    except (ConfigError, ProcessorLoadError, ValueError, MissingExtraError) as exc:
        print(f"multilane worker: {exc}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(_serve(args, cfg, processor, token, lease, app))
    except KeyboardInterrupt:
        return 0
    except Exception:
        log.exception("worker failed")
        return 1
