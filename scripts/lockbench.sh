#!/usr/bin/env bash
# Lock-path benchmark, side by side in one run on tmpfs, ext4 (a directory on
# the root disk, for the fsync cycle), leasefs, leasefs --volatile, and a
# minimal fuser filesystem with in-memory locks and none of leasefs's logic
# (scripts/minimalfs.rs). Medians over repeated runs.
#   scripts/lockbench.sh [REPEATS] [N] [SECONDS]   (defaults: 5, 5000, 2)
#   PIN=1 scripts/lockbench.sh                     (everything on CPU 0)
#   BASELINE=/path/to/older/leasefs scripts/lockbench.sh   (adds that build as a column)
# Needs root and gcc.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-5}
n=${2:-5000}
secs=${3:-2}

work=$(mktemp -d /tmp/leasefs-lockbench.XXXXXX)
. scripts/benchmounts.sh
bench_mount_all
bench_each_run lockbench "$n" "$secs" > "$work/results"

python3 - "$work/results" "$repeats" "$n" "$secs" $cols <<'PY'
import statistics, sys
data = {}
for fs, metric, v in (l.split() for l in open(sys.argv[1])):
    data.setdefault(metric, {}).setdefault(fs, []).append(float(v))
print(f"# medians of {sys.argv[2]} runs; {sys.argv[3]} ops per latency metric; {sys.argv[4]} s per contention run")
cols = tuple(sys.argv[5:])
print(f"{'metric':<20}" + "".join(f"{c:>12}" for c in cols) + f"{'lfs/min':>9}{'lfs/tmpfs':>11}{'lfs/vol':>9}")
for metric, by in data.items():
    med = {c: statistics.median(by[c]) for c in cols}
    print(f"{metric:<20}" + "".join(f"{med[c]:>12.0f}" for c in cols)
          + f"{med['leasefs']/med['minimal']:>8.2f}x{med['leasefs']/med['tmpfs']:>10.1f}x{med['leasefs']/med['volatile']:>8.2f}x")
print("(ns for *_ns, acquisitions/s for *_acq_s, µs for *_worst_us; lower is better except acq_s;")
print(" disk = a directory on the root filesystem; volatile = leasefs --volatile)")
PY
