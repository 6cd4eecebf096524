#!/usr/bin/env bash
# Measures README's "Footprint" row of the demo: a fresh clone of this checkout's HEAD, an empty pip
# cache, then `bash scripts/demo.sh`, every output line stamped with the seconds since the clone
# started.
#
#   bash scripts/footprint.sh [WORKDIR]     (default: a new temporary directory; it is left behind)
#
# 1. Clones HEAD into WORKDIR/clone and points PIP_CACHE_DIR at the empty WORKDIR/pip-cache.
# 2. Runs `bash scripts/demo.sh` there, stamping each line (WORKDIR/demo.txt).
# 3. Prints the install time, the time to the first live line (`t=` lines), the whole time, the
#    venv's size and the demo's result. Run it on a quiet machine and quote the load average it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-$(mktemp -d)}
mkdir -p "$work"
rm -rf "$work/clone" "$work/pip-cache"
mkdir -p "$work/pip-cache"
echo "footprint: load average $(cut -d' ' -f1-3 /proc/loadavg); output in $work" >&2

# 1. fresh clone, empty cache
t0=$(date +%s.%N)
git clone -q "$(pwd)" "$work/clone"

# 2. the demo, each line stamped
(cd "$work/clone" && PIP_CACHE_DIR="$work/pip-cache" bash scripts/demo.sh 2>&1) | python3 -u -c '
import sys, time
t0 = float(sys.argv[1])
for line in sys.stdin:
    print(f"{time.time() - t0:7.1f} {line}", end="", flush=True)
' "$t0" > "$work/demo.txt"

# 3. the figures
python3 - "$work" <<'PY'
import re, subprocess, sys
work = sys.argv[1]
lines = open(f"{work}/demo.txt", encoding="utf-8").read().splitlines()
def first(pattern):
    return next((float(l.split()[0]) for l in lines if re.search(pattern, l)), None)
installing, started = first(r"bootstrap: installing"), first(r"multilane demo: broker")
live = first(r"^ *[0-9.]+ t= ")
size = subprocess.run(["du", "-sm", f"{work}/clone/.venv"], capture_output=True, text=True).stdout.split()[0]
result = next((l.split()[-1] for l in lines if " result " in l), "none")
print(f"install (bootstrap -> demo start): {started - installing:.1f} s" if installing and started else "install: n/a")
print(f"first live line after git clone:   {live:.1f} s" if live is not None else "first live line: none")
print(f"whole command:                     {float(lines[-1].split()[0]):.1f} s")
print(f"venv size:                         {size} MB")
print(f"demo result:                       {result}")
PY
