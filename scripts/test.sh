#!/usr/bin/env bash
# Installs what the tests need (scripts/bootstrap.sh), then runs the default test suite:
# everything except tests marked `slow` (soak and long chaos runs; run them with `-m slow`).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash scripts/bootstrap.sh | tail -n 1)
set +e
# The suite mostly waits (brokers, worker processes, timers), so it runs on more pytest-xdist workers
# than cores; MULTILANE_TEST_WORKERS sets how many (0: in this process, serially).
"$PY" -m pytest -m "not slow" -p no:cacheprovider -n "${MULTILANE_TEST_WORKERS:-6}" --durations=30 "$@"
code=$?
set -e
# pytest exits 5 when it collected no test: that is not a failure of the code under test.
if [ "$code" -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi
exit "$code"
