"""quixstreams peer row: consume N records with a no-op or a ``time.sleep`` processor.

Standalone on purpose: it runs by path with the ``.venv-quix`` interpreter (quixstreams pins old
confluent-kafka releases, so it never shares the system interpreter), and imports only the standard
library and quixstreams. Driven by :mod:`benchmarks.baselines.quix`.

    .venv-quix/bin/python benchmarks/baselines/quix_runner.py --bootstrap H:P --topic T --group G
        --records N [--sleep-ms 10]

Prints one JSON object as its last stdout line: records, seconds, rate, cpu_s, cpu_us_per_record,
quixstreams and confluent-kafka versions. Timing runs from the first record to the N-th (the group
join before the first record is not counted, as for every other row).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import threading
import time


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="time.sleep per record (0 = no-op)")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)

    import confluent_kafka
    import quixstreams
    from quixstreams import Application

    sleep_s = args.sleep_ms / 1000
    state = {"done": 0, "t0": 0.0, "cpu0": 0.0, "t1": 0.0, "cpu1": 0.0}

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        auto_offset_reset="earliest",
        state_dir=tempfile.mkdtemp(prefix="quix-bench-"),
        loglevel="WARNING",
        use_changelog_topics=False,
        # the same fetch setting as every other row (see benchmarks/baselines/kafka.py); quixstreams
        # subscribes (joins a group), and the embedded broker's first join waits half the session
        # timeout: 2 s keeps that short (not timed either way), with a 500 ms heartbeat
        consumer_extra_config={
            "fetch.queue.backoff.ms": 10,
            "session.timeout.ms": 2000,
            "heartbeat.interval.ms": 500,
        },
    )
    topic = app.topic(args.topic, value_deserializer="bytes", key_deserializer="bytes")
    sdf = app.dataframe(topic)

    def process(value: bytes) -> None:
        if state["done"] == 0:
            state["t0"], state["cpu0"] = time.perf_counter(), _cpu()
        if sleep_s:
            time.sleep(sleep_s)
        state["done"] += 1
        if state["done"] == args.records:
            state["t1"], state["cpu1"] = time.perf_counter(), _cpu()
            app.stop()

    sdf.update(process)
    watchdog = threading.Timer(args.timeout, app.stop)  # give up: the row then reports a shortfall
    watchdog.daemon = True
    watchdog.start()
    app.run()
    watchdog.cancel()
    done = int(state["done"])
    if done < args.records or not state["t1"]:
        print(f"quix runner: only {done}/{args.records} records", file=sys.stderr)
        return 1
    seconds = max(state["t1"] - state["t0"], 1e-9)
    measured = max(done - 1, 1)  # the clock starts when the first record begins
    cpu = state["cpu1"] - state["cpu0"]
    result = {
        "records": done,
        "seconds": seconds,
        "rate": measured / seconds,
        "cpu_s": cpu,
        "cpu_us_per_record": cpu / measured * 1e6,
        "quixstreams": quixstreams.__version__,
        "confluent_kafka": getattr(confluent_kafka, "__version__", str(confluent_kafka.version())),
        "librdkafka": confluent_kafka.libversion()[0],
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
