#!/usr/bin/env bash
# Side-by-side benchmark: the same operations on tmpfs and on leasefs (and an
# older build with BASELINE=), in one run; medians over repeated runs, with
# ratios against tmpfs.
#   scripts/bench.sh [REPEATS] [N]      (defaults: 7 repeats, 5000 ops each)
#   PIN=1 scripts/bench.sh              (daemons and client on CPU 0)
#   BASELINE=/path/to/older/leasefs scripts/bench.sh   (adds that build as a column)
# Needs root (mounts tmpfs and leasefs) and gcc.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-7}
n=${2:-5000}

cargo build --release --workspace --quiet
work=$(mktemp -d /tmp/leasefs-bench.XXXXXX)
gcc -O2 -o "$work/fsbench" scripts/fsbench.c
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)
mkdir -p "$work/tmpfs" "$work/leasefs"
mount -t tmpfs tmpfs "$work/tmpfs"
"${pin[@]}" ./target/release/leasefs mount "$work/leasefs" --state-dir "$work/state"
cols="tmpfs leasefs"
if [ -n "${BASELINE:-}" ]; then
    mkdir -p "$work/baseline"
    "${pin[@]}" "$BASELINE" mount "$work/baseline" --state-dir "$work/state3"
    cols="$cols baseline"
fi
cleanup() {
    for m in leasefs baseline; do
        [ -d "$work/$m" ] || continue
        ./target/release/leasefs unmount "$work/$m" 2>/dev/null || umount -l "$work/$m" 2>/dev/null || true
    done
    umount "$work/tmpfs" 2>/dev/null || umount -l "$work/tmpfs" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

for r in $(seq "$repeats"); do
    for fs in $cols; do
        mkdir "$work/$fs/run$r"
        "${pin[@]}" "$work/fsbench" "$work/$fs/run$r" "$n" | sed "s/^/$fs /"
        rmdir "$work/$fs/run$r"
    done
done > "$work/results"

python3 - "$work/results" "$repeats" "$n" $cols <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
data = {}
for fs, op, ns in rows:
    data.setdefault(op, {}).setdefault(fs, []).append(float(ns))
print(f"# medians of {sys.argv[2]} runs, {sys.argv[3]} operations each (readdir: 10 000 entries)")
cols = sys.argv[4:]
print(f"{'operation':<12}" + "".join(f"{c:>11} {'ratio':>7}" for c in cols))
unit = lambda v: f"{v/1000:.2f} µs" if v < 1e6 else f"{v/1e6:.2f} ms"
for op, by in data.items():
    t = statistics.median(by["tmpfs"])
    print(f"{op:<12}" + "".join(f"{unit(statistics.median(by[c])):>11} {statistics.median(by[c])/t:>6.1f}x" for c in cols))
PY
