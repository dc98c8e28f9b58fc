#!/usr/bin/env bash
# Lock-path benchmark, side by side in one run on tmpfs, ext4 (a directory on
# the root disk, for the fsync cycle), leasefs, leasefs --volatile, and a
# minimal fuser filesystem with in-memory locks and none of leasefs's logic
# (scripts/minimalfs.rs), once with a zero entry/attribute TTL ("minimal")
# and once with a 1 s TTL ("minimal1s"). Medians over repeated runs, then
# the FUSE requests one operation of each kind costs on leasefs (and on
# BASELINE when it counts them), from the daemon's per-opcode counters.
#   scripts/lockbench.sh [REPEATS] [N] [SECONDS]   (defaults: 5, 5000, 2)
#   PIN=1 scripts/lockbench.sh                     (everything on CPU 0)
#   BASELINE=/path/to/older/leasefs scripts/lockbench.sh   (adds that build as a column)
#   URING=1 scripts/lockbench.sh   (adds leasefs --transport uring as column "uring")
#   BENCH=1 scripts/lockbench.sh  (adds leasefs --bench, volatile and durable, as "vbench", "dbench")
#   RULES=100 scripts/lockbench.sh (adds leasefs with 100 fault rules that match nothing as "rules")
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
uring = "uring" in cols
rules = "rules" in cols
base = "baseline" in cols
bench = "vbench" in cols
print(f"{'metric':<20}" + "".join(f"{c:>12}" for c in cols) + f"{'lfs/min0':>9}{'lfs/min1s':>10}{'lfs/tmpfs':>11}{'lfs/vol':>9}"
      + (f"{'uring/min0':>11}{'uring/lfs':>10}" if uring else "")
      + (f"{'rules/lfs':>10}" if rules else "") + (f"{'lfs/base':>9}" if base else "")
      + (f"{'vb/vol':>9}{'db/lfs':>9}" if bench else ""))
for metric, by in data.items():
    med = {c: statistics.median(by[c]) if c in by else float("nan") for c in cols}
    print(f"{metric:<20}" + "".join(f"{med[c]:>12.0f}" for c in cols)
          + f"{med['leasefs']/med['minimal']:>8.2f}x{med['leasefs']/med['minimal1s']:>9.2f}x"
          + f"{med['leasefs']/med['tmpfs']:>10.1f}x{med['leasefs']/med['volatile']:>8.2f}x"
          + (f"{med['uring']/med['minimal']:>10.2f}x{med['uring']/med['leasefs']:>9.2f}x" if uring else "")
          + (f"{med['rules']/med['leasefs']:>9.2f}x" if rules else "")
          + (f"{med['leasefs']/med['baseline']:>8.2f}x" if base else "")
          + (f"{med['vbench']/med['volatile']:>8.2f}x{med['dbench']/med['leasefs']:>8.2f}x" if bench else ""))
print("(ns for *_ns, acquisitions/s for *_acq_s, µs for *_worst_us; lower is better except acq_s;")
print(" disk = a directory on the root filesystem; volatile = leasefs --volatile;")
print(" minimal/minimal1s = minimal fuser filesystem with 0 s / 1 s entry and attribute TTL;")
print(" renew_rename = write a temporary file and rename it over a lease another process holds; nan: no rename;")
print(" vbench/dbench = leasefs --volatile --bench / durable --bench (BENCH=1): vb/vol, db/lfs their cost;")
print(" rules = leasefs with RULES=N fault rules that match nothing; base = the older build BASELINE names;")
print(" uring = leasefs --transport uring; parallel1/2 = pairs/s of one process on CPU 0 / two on CPUs 0 and 1, own files)")
PY

# FUSE requests per operation: run each latency metric alone with 1000 and
# with 0 operations and divide the difference of the daemon's counters.
requests() {
    grep '^leasefs_fuse_requests_total' "$1/.leasefs/metrics" | sed 's/.*op="\([a-z_0-9]*\)".* \([0-9]*\)$/\1 \2/' | sort || true
}
echo
echo "# FUSE requests per operation (counted by the daemon; lookups include one per second of an entry's life)"
for fs in leasefs ${BASELINE:+baseline} $([ "${URING:-0}" = 1 ] && echo uring); do
    [ -n "$(requests "$work/$fs")" ] || { echo "$fs: no request counters"; continue; }
    for metric in stat_ns open_close_ns flock_pair_ns fcntl_pair_ns lease_cycle_ns fsync_cycle_ns renew_rename_ns; do
        d="$work/$fs/count-$metric"
        mkdir -p "$d"
        for k in 0 1000; do
            requests "$work/$fs" > "$work/before"
            "${pin[@]}" "$work/lockbench" "$d" "$k" 0 "$metric" > /dev/null
            requests "$work/$fs" > "$work/after.$k"
            join -a 2 -e 0 -o 2.1,1.2,2.2 "$work/before" "$work/after.$k" | awk '{print $1, $3 - $2}' > "$work/delta.$k"
        done
        python3 - "$fs" "$metric" "$work/delta.0" "$work/delta.1000" <<'PY'
import sys
fs, metric, zero, full = sys.argv[1:]
z = dict((l.split()[0], int(l.split()[1])) for l in open(zero))
f = dict((l.split()[0], int(l.split()[1])) for l in open(full))
per = {op: (f[op] - z.get(op, 0)) / 1000 for op in f if f[op] - z.get(op, 0) > 0}
total = sum(per.values())
print(f"{fs:<9} {metric:<15} {total:5.2f}  " + " ".join(f"{op}={v:g}" for op, v in sorted(per.items())))
PY
    done
done
