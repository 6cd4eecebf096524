"""Baselines the benchmarks compare multilane with, each runnable as a measurement child process.

- :mod:`benchmarks.baselines.raw_loop`: a raw confluent-kafka ``consume()`` loop doing nothing (ceiling).
- :mod:`benchmarks.baselines.naive_batch`: "consume a batch, gather, commit" with asyncio.
- :mod:`benchmarks.baselines.bare_asyncio`: the same sleeps at the same concurrency, no Kafka at all.
- ``quix_runner.py``: quixstreams, run by path with the interpreter of the ``.venv-quix`` venv
  (:mod:`benchmarks.baselines.quix`), because quixstreams pins old confluent-kafka releases.
- :mod:`benchmarks.baselines.workload`: the per-record latency model every row shares.

Each child prints one JSON object as its last stdout line (see :func:`benchmarks._common.run_json_child`)
with at least ``records``, ``seconds``, ``rate`` (records/s) and ``cpu_us_per_record``.
"""
