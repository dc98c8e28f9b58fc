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

cargo build --release --workspace --quiet
cargo build --release --quiet --example minimalfs
work=$(mktemp -d /tmp/leasefs-lockbench.XXXXXX)
gcc -O2 -o "$work/lockbench" scripts/lockbench.c
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)
mkdir -p "$work/tmpfs" "$work/leasefs" "$work/volatile" "$work/minimal" "$work/disk"
mount -t tmpfs tmpfs "$work/tmpfs"
"${pin[@]}" ./target/release/leasefs mount "$work/leasefs" --state-dir "$work/state"
"${pin[@]}" ./target/release/leasefs mount "$work/volatile" --state-dir "$work/state2" --volatile
cols="tmpfs disk leasefs volatile minimal"
if [ -n "${BASELINE:-}" ]; then
    mkdir -p "$work/baseline"
    "${pin[@]}" "$BASELINE" mount "$work/baseline" --state-dir "$work/state3"
    cols="$cols baseline"
fi
"${pin[@]}" ./target/release/examples/minimalfs "$work/minimal" &
minimal_pid=$!
cleanup() {
    for m in leasefs volatile baseline; do
        [ -d "$work/$m" ] || continue
        ./target/release/leasefs unmount "$work/$m" 2>/dev/null || umount -l "$work/$m" 2>/dev/null || true
    done
    umount "$work/minimal" 2>/dev/null || umount -l "$work/minimal" 2>/dev/null || true
    kill "$minimal_pid" 2>/dev/null || true
    wait "$minimal_pid" 2>/dev/null || true
    umount "$work/tmpfs" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 100); do mountpoint -q "$work/minimal" && break; sleep 0.05; done
mountpoint -q "$work/minimal" || { echo "minimalfs did not mount" >&2; exit 1; }

for r in $(seq "$repeats"); do
    for fs in $cols; do
        d="$work/$fs"
        [ "$fs" = minimal ] || { d="$work/$fs/run$r"; mkdir "$d"; }
        "${pin[@]}" "$work/lockbench" "$d" "$n" "$secs" | sed "s/^/$fs /"
    done
done > "$work/results"

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
