#!/usr/bin/env bash
# Installs what the tests need (scripts/bootstrap.sh), then runs the default test suite:
# everything except tests marked `slow` (soak and long chaos runs; run them with `-m slow`).
# Then the broker matrix: the tests marked `matrix` again, on Apache Kafka (`--broker=apache`; list
# them with `pytest --co -q -m "matrix and not slow"`). MULTILANE_BROKER_MATRIX=0 skips that pass.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/bootstrap.sh | tail -n 1)
set +e
# The suite mostly waits (brokers, worker processes, timers), so it runs on more pytest-xdist workers
# than cores; MULTILANE_TEST_WORKERS sets how many (0: in this process, serially). Tests marked
# xdist_group share a worker (tests/cluster: one control plane).
"$PY" -m pytest -m "not slow" -p no:cacheprovider -n "${MULTILANE_TEST_WORKERS:-6}" --dist loadgroup \
  --durations=30 "$@"
code=$?
set -e
# pytest exits 5 when it collected no test: that is not a failure of the code under test.
if [ "$code" -eq 5 ]; then echo "pytest collected no tests"; code=0; fi
# The broker matrix, in one process (one Apache Kafka JVM); extra arguments go to it too.
if [ "${MULTILANE_BROKER_MATRIX:-1}" != "0" ]; then
  echo "== broker matrix: the tests marked matrix, on Apache Kafka"
  set +e
  "$PY" -m pytest --broker=apache -m "matrix and not slow" -p no:cacheprovider --durations=30 "$@"
  matrix=$?
  set -e
  if [ "$matrix" -eq 5 ]; then echo "pytest collected no matrix tests"; matrix=0; fi
  if [ "$code" -eq 0 ]; then code=$matrix; fi
fi
exit "$code"
