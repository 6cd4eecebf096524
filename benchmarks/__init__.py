"""multilane's benchmarks: ``python -m benchmarks.<name> [--quick] [--json]``.

Conventions shared by every benchmark are in :mod:`benchmarks._common`; results and how to read them
are in ``docs/benchmarks.md``.
"""
