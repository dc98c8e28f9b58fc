#!/usr/bin/env bash
# Parked waiters: the latency of other requests on a mount with WAITERS lock
# waits parked (10 files, WAITERS/10 waiters each, held by one process),
# against the same mount idle, and the daemon's memory per parked waiter;
# for leasefs served through /dev/fuse ("dev") and, where the kernel allows
# it, through io_uring ("uring"). Medians of REPEATS runs of N operations.
#   scripts/waitbench.sh [WAITERS] [REPEATS] [N]   (defaults: 10000, 5, 5000)
#   PIN=1 scripts/waitbench.sh                     (daemon and clients on CPU 0)
# Needs root and gcc.
set -euo pipefail
cd "$(dirname "$0")/.."
waiters=${1:-10000}
repeats=${2:-5}
n=${3:-5000}
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)
work=$(mktemp -d /tmp/leasefs-waitbench.XXXXXX)
cargo build --release --workspace --quiet
gcc -O2 -o "$work/lockbench" scripts/lockbench.c
gcc -O2 -pthread -o "$work/waitbench" scripts/waitbench.c
param=/sys/module/fuse/parameters/enable_uring
was=$(cat "$param" 2>/dev/null || true)
kinds=dev
if [ -w "$param" ]; then echo Y > "$param"; kinds="dev uring"; fi
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for k in dev uring; do
        [ -d "$work/$k" ] && { ./target/release/leasefs unmount "$work/$k" 2>/dev/null || umount -l "$work/$k" 2>/dev/null || true; }
    done
    [ -n "$was" ] && echo "$was" > "$param"
    rm -rf "$work"
}
trap cleanup EXIT
status() { python3 -c "import json,sys; d=json.load(open(sys.argv[1] + '/.leasefs/status')); print(eval(sys.argv[2]))" "$1" "$2"; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
measure() { # dir label -> "label metric value" lines
    for r in $(seq "$repeats"); do
        mkdir -p "$1/m$r"
        "${pin[@]}" "$work/lockbench" "$1/m$r" "$n" 0 stat_ns | sed "s/^/$2 /"
        "${pin[@]}" "$work/lockbench" "$1/m$r" "$n" 0 flock_pair_ns | sed "s/^/$2 /"
    done
}
for k in $kinds; do
    d="$work/$k"
    mkdir -p "$d"
    "${pin[@]}" ./target/release/leasefs mount "$d" --volatile --state-dir "$work/state.$k" --transport "$k"
    pid=$(status "$d" "d['pid']")
    for f in $(seq 0 9); do : > "$d/W$f"; done
    "${pin[@]}" python3 -c 'import fcntl, os, sys, time
fds = [os.open(f"{sys.argv[1]}/W{i}", os.O_RDWR) for i in range(10)]
for f in fds:
    fcntl.flock(f, fcntl.LOCK_EX)
time.sleep(3600)' "$d" &
    pids+=($!)
    measure "$d" "$k-idle"
    rss0=$(rss_kib "$pid")
    "${pin[@]}" "$work/waitbench" "$d" 10 $((waiters / 10)) > "$work/parked.$k" &
    pids+=($!)
    for _ in $(seq 600); do
        [ "$(status "$d" "d['limits']['waiters']['used']")" -ge "$waiters" ] 2>/dev/null && break
        sleep 0.1
    done
    parked=$(status "$d" "d['limits']['waiters']['used']")
    rss1=$(rss_kib "$pid")
    echo "$k-parked waiters $parked"
    echo "$k-parked rss_per_waiter_bytes $(( (rss1 - rss0) * 1024 / (parked > 0 ? parked : 1) ))"
    measure "$d" "$k-parked"
    [ "$k" = uring ] && echo "$k-parked ring_entries $(status "$d" "sum(q['entries'] for q in d['transport']['queues'])")"
done > "$work/results"
python3 - "$work/results" "$repeats" "$n" "$waiters" <<'PY'
import statistics, sys
data = {}
for label, metric, v in (l.split() for l in open(sys.argv[1])):
    data.setdefault((label, metric), []).append(float(v))
print(f"# medians of {sys.argv[2]} runs of {sys.argv[3]} operations; {sys.argv[4]} waiters parked")
for kind in ("dev", "uring"):
    if (f"{kind}-idle", "stat_ns") not in data:
        continue
    for m in ("stat_ns", "flock_pair_ns"):
        idle = statistics.median(data[(f"{kind}-idle", m)])
        parked = statistics.median(data[(f"{kind}-parked", m)])
        print(f"{kind:<6} {m:<15} idle {idle:>8.0f}  parked {parked:>8.0f}  ratio {parked / idle:5.2f}")
    for m in ("waiters", "rss_per_waiter_bytes", "ring_entries"):
        if (f"{kind}-parked", m) in data:
            print(f"{kind:<6} {m:<22} {data[(f'{kind}-parked', m)][0]:.0f}")
PY
