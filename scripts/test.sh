#!/usr/bin/env bash
# Installs what the tests need (scripts/bootstrap.sh), then runs the default test suite:
# everything except tests marked `slow` (soak and long chaos runs; run them with `-m slow`).
# Then the broker matrix: the tests marked `matrix` again, on Apache Kafka (`--broker=apache`;
# list them with `pytest --co -q -m "matrix and not slow"`). MULTILANE_BROKER_MATRIX=0 skips that pass.
# Extra arguments go to both pytest passes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/bootstrap.sh | tail -n 1)
# pytest exits 5 when it collected no test: that is not a failure of the code under test.
run() { set +e; "$PY" -m pytest -p no:cacheprovider --durations=30 "$@"; local c=$?; set -e
        if [ "$c" -eq 5 ]; then echo "pytest collected no tests"; c=0; fi; return "$c"; }
code=0
run -m "not slow" "$@" || code=$?
if [ "${MULTILANE_BROKER_MATRIX:-1}" != "0" ]; then
  echo "== broker matrix: the tests marked matrix, on Apache Kafka"
  run --broker=apache -m "matrix and not slow" "$@" || code=$?
fi
exit "$code"
