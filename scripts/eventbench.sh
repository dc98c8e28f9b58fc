#!/usr/bin/env bash
# Does the event stream slow the lock path? lockbench on one leasefs mount,
# side by side in one run: with nobody reading .leasefs/events, with 4
# readers that keep reading it, and with 1 reader that opened it and never
# reads (its buffer fills, then drops the oldest). Medians over repeated
# runs, configurations interleaved within each repeat.
#   scripts/eventbench.sh [REPEATS] [N] [SECONDS]   (defaults: 5, 5000, 2)
#   PIN=1 scripts/eventbench.sh                     (daemon, clients, readers on CPU 0)
# Needs root, gcc and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-5}
n=${2:-5000}
secs=${3:-2}
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)

work=$(mktemp -d /tmp/leasefs-eventbench.XXXXXX)
readers=()
cleanup() {
    for p in "${readers[@]}"; do kill "$p" 2>/dev/null || true; done
    ./target/release/leasefs unmount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
cargo build --release --workspace --quiet
gcc -O2 -o "$work/lockbench" scripts/lockbench.c
mkdir -p "$work/mnt"
"${pin[@]}" ./target/release/leasefs mount "$work/mnt" --state-dir "$work/state"

start_readers() { # COUNT PROGRAM
    for _ in $(seq "$1"); do
        "${pin[@]}" python3 -c "$2" "$work/mnt/.leasefs/events" &
        readers+=($!)
    done
    # Attached once the last one holds the stream open.
    for _ in $(seq 500); do
        ls -l /proc/"${readers[-1]}"/fd 2>/dev/null | grep -q 'leasefs/events' && break
        sleep 0.01
    done
}
stop_readers() {
    for p in "${readers[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    readers=()
}
reading='import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
while os.read(fd, 1 << 20): pass'
idle='import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
time.sleep(3600)'

for r in $(seq "$repeats"); do
    for cfg in none readers4 nonreader; do
        d="$work/mnt/$cfg.$r"
        mkdir "$d"
        case $cfg in
            readers4) start_readers 4 "$reading" ;;
            nonreader) start_readers 1 "$idle" ;;
        esac
        "${pin[@]}" "$work/lockbench" "$d" "$n" "$secs" | sed "s/^/$cfg /"
        stop_readers
    done
done > "$work/results"

python3 - "$work/results" "$repeats" "$n" <<'PY'
import statistics, sys
data = {}
for cfg, metric, v in (l.split() for l in open(sys.argv[1])):
    data.setdefault(metric, {}).setdefault(cfg, []).append(float(v))
print(f"# medians of {sys.argv[2]} runs; {sys.argv[3]} ops per latency metric")
cols = ("none", "readers4", "nonreader")
print(f"{'metric':<20}" + "".join(f"{c:>12}" for c in cols) + f"{'4rd/none':>10}{'stuck/none':>12}")
for metric, by in data.items():
    med = {c: statistics.median(by[c]) for c in cols}
    print(f"{metric:<20}" + "".join(f"{med[c]:>12.0f}" for c in cols)
          + f"{med['readers4']/med['none']:>9.2f}x{med['nonreader']/med['none']:>11.2f}x")
print("(none: nobody reads .leasefs/events; readers4: 4 processes keep reading it;")
print(" nonreader: 1 process opened it and never reads; ns for *_ns, acquisitions/s for *_acq_s)")
PY
