#!/usr/bin/env bash
# Installs what the tests need (scripts/bootstrap.sh), then runs the default test suite:
# everything except tests marked `slow` (soak and long chaos runs; run them with `-m slow`), in parallel,
# then the tests marked `serial` (bounds in wall time) alone.
# Then the broker matrix: the tests marked `matrix` again, on Apache Kafka (`--broker=apache`; list
# them with `pytest --co -q -m "matrix and not slow"`). MULTILANE_BROKER_MATRIX=0 skips that pass.
# Extra arguments go to pytest in every pass, except a marker expression (`-m EXPR`, the last one wins;
# default `not slow`): it selects the tests, and each pass takes its own part of that selection, so a
# test runs in exactly one of the first two passes:
#   parallel: (EXPR) and not serial     serial: (EXPR) and serial
#   matrix:   (EXPR) and matrix and not slow   (the same tests again, on the other broker; slow tests
#             run once, on the embedded broker)
set -euo pipefail
cd "$(dirname "$0")/.."
# The marker expression out of the arguments; the rest go to every pass as they are.
select="not slow"
args=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    -m)
      if [ "$#" -lt 2 ]; then echo "scripts/test.sh: -m needs a marker expression" >&2; exit 2; fi
      select=$2
      shift 2
      ;;
    -m?*) select=${1#-m}; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
parallel_pass="($select) and not serial"
serial_pass="($select) and serial"
matrix_pass="($select) and matrix and not slow"
PY=$(bash scripts/bootstrap.sh | tail -n 1)
set +e
# The suite mostly waits (brokers, worker processes, timers), so it runs on more pytest-xdist workers
# than cores; MULTILANE_TEST_WORKERS sets how many (0: in this process, serially). Tests marked
# xdist_group share a worker (tests/cluster: one control plane).
echo "== parallel: -m \"$parallel_pass\""
"$PY" -m pytest -m "$parallel_pass" -p no:cacheprovider -n "${MULTILANE_TEST_WORKERS:-6}" \
  --dist loadgroup --durations=30 "${args[@]}"
code=$?
set -e
# pytest exits 5 when it collected no test: that is not a failure of the code under test.
if [ "$code" -eq 5 ]; then echo "pytest collected no tests"; code=0; fi
# Tests marked serial hold a bound in wall time (a recovery, a replay window): they run alone.
echo "== serial: the tests marked serial, one at a time: -m \"$serial_pass\""
set +e
"$PY" -m pytest -m "$serial_pass" -p no:cacheprovider --durations=10 "${args[@]}"
serial=$?
set -e
if [ "$serial" -eq 5 ]; then serial=0; fi
if [ "$code" -eq 0 ]; then code=$serial; fi
# The broker matrix, in one process (one Apache Kafka JVM); extra arguments go to it too.
if [ "${MULTILANE_BROKER_MATRIX:-1}" != "0" ]; then
  echo "== broker matrix: the tests marked matrix, on Apache Kafka: -m \"$matrix_pass\""
  set +e
  "$PY" -m pytest --broker=apache -m "$matrix_pass" -p no:cacheprovider --durations=30 "${args[@]}"
  matrix=$?
  set -e
  if [ "$matrix" -eq 5 ]; then echo "pytest collected no matrix tests"; matrix=0; fi
  if [ "$code" -eq 0 ]; then code=$matrix; fi
fi
exit "$code"
