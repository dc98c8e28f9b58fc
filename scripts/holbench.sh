#!/usr/bin/env bash
# Head-of-line benchmark: flock pairs on one file, alone and while another
# process loops write(4 KiB) + fsync on another file of the same mount.
# Side by side in one run on tmpfs, ext4 (a directory on the root disk),
# leasefs (durable state directory on the root disk), leasefs --volatile,
# an older build (BASELINE=) and the minimal fuser filesystem. Medians over
# repeated runs of each run's p50, p99 and worst case.
#   scripts/holbench.sh [REPEATS] [N]          (defaults: 5, 5000)
#   PIN=1 scripts/holbench.sh                  (everything on CPU 0)
#   BASELINE=/path/to/older/leasefs scripts/holbench.sh
# Needs root and gcc.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-5}
n=${2:-5000}

work=$(mktemp -d /tmp/leasefs-holbench.XXXXXX)
. scripts/benchmounts.sh
bench_mount_all
bench_each_run holbench "$n" > "$work/results"

python3 - "$work/results" "$repeats" "$n" $cols <<'PY'
import statistics, sys
data = {}
for fs, metric, v in (l.split() for l in open(sys.argv[1])):
    data.setdefault(metric, {}).setdefault(fs, []).append(float(v))
cols = tuple(sys.argv[4:])
print(f"# medians of {sys.argv[2]} runs of {sys.argv[3]} flock pairs each (µs; fsyncs_per_s: the other process)")
print(f"{'metric':<16}" + "".join(f"{c:>11}" for c in cols))
for metric, by in data.items():
    print(f"{metric:<16}" + "".join(f"{statistics.median(by[c]):>11.1f}" for c in cols))
for c in cols:
    a, f = statistics.median(data['alone_p50_us'][c]), statistics.median(data['fsync_p50_us'][c])
    print(f"{c}: p50 with fsync load / alone = {f / a:.2f}x")
PY
