#!/usr/bin/env bash
# Where an unpinned lock pair's time goes: for the minimal fuser filesystem
# (scripts/minimalfs.rs, /dev/fuse), leasefs through /dev/fuse and leasefs
# through FUSE-over-io_uring, the client's CPU migrations and context
# switches per flock pair (perf stat on the client), the daemon threads'
# migrations, and how many of the client's wake-ups were placed on another
# CPU than the one it slept on (sched_wakeup/sched_switch trace).
# Medians of REPEATS runs of N pairs, unpinned (the point of the script).
#   scripts/migrations.sh [N] [REPEATS]   (defaults: 20000, 5)
# Needs root, gcc and perf; restores enable_uring.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
repeats=${2:-5}
work=$(mktemp -d /tmp/leasefs-migrations.XXXXXX)
URING=1
. scripts/benchmounts.sh
bench_mount_all
gcc -O2 -o "$work/lockbench" scripts/lockbench.c
tracing=/sys/kernel/tracing
mountpoint -q "$tracing" || mount -t tracefs nodev "$tracing"
daemon_pid() { python3 -c "import json,sys; print(json.load(open(sys.argv[1] + '/.leasefs/status'))['pid'])" "$1"; }
thread_migrations() { # pid -> sum of nr_migrations over its threads
    local s=0 t
    for t in /proc/"$1"/task/*/sched; do
        s=$((s + $(awk '/se.nr_migrations/ {print $3}' "$t")))
    done
    echo "$s"
}
for r in $(seq "$repeats"); do
    for fs in minimal leasefs uring; do
        d="$work/$fs"
        case $fs in minimal) pid=$minimal_pid ;; *) pid=$(daemon_pid "$d"); d="$d/mig$r"; mkdir -p "$d" ;; esac
        m0=$(thread_migrations "$pid")
        out=$(perf stat -x, -e cpu-migrations,context-switches -- "$work/lockbench" "$d" "$n" 0 flock_pair_ns 2>"$work/perf")
        m1=$(thread_migrations "$pid")
        echo "$fs flock_pair_ns ${out#* }"
        awk -F, -v fs="$fs" -v n="$n" '$3 ~ /migrations/ {print fs, "client_migrations_per_1000", $1 * 1000 / n}
            $3 ~ /context-switches/ {print fs, "client_switches_per_pair", $1 / n}' "$work/perf"
        echo "$fs daemon_migrations_per_1000 $(( (m1 - m0) * 1000 / n ))"
        # Wake-up placement: trace one more run's wake-ups of the client.
        echo > "$tracing/trace"
        echo 1 > "$tracing/events/sched/sched_wakeup/enable"
        echo 1 > "$tracing/events/sched/sched_switch/enable"
        "$work/lockbench" "$d" 2000 0 flock_pair_ns > /dev/null &
        cpid=$!
        wait "$cpid"
        echo 0 > "$tracing/events/sched/sched_wakeup/enable"
        echo 0 > "$tracing/events/sched/sched_switch/enable"
        # sched_switch prev_pid=C ... on CPU x (the client sleeps), then
        # sched_wakeup pid=C target_cpu=y: y != x is a wake-up elsewhere.
        python3 - "$tracing/trace" "$cpid" "$fs" <<'PY'
import re, sys
path, pid, fs = sys.argv[1], sys.argv[2], sys.argv[3]
slept_on, moved, wakes = None, 0, 0
for line in open(path, errors="replace"):
    m = re.search(r"\[(\d+)\].*sched_switch: .*prev_pid=%s .*prev_state=(\S+)" % pid, line)
    if m and m.group(2) != "R" and m.group(2) != "R+":
        slept_on = int(m.group(1))
        continue
    m = re.search(r"sched_wakeup: .*pid=%s .*target_cpu=(\d+)" % pid, line)
    if m and slept_on is not None:
        wakes += 1
        moved += int(m.group(1)) != slept_on
        slept_on = None
print(fs, "wakeups_elsewhere_pct", round(100 * moved / wakes, 1) if wakes else "nan")
PY
    done
done > "$work/results"
python3 - "$work/results" "$repeats" "$n" <<'PY'
import statistics, sys
data = {}
for fs, metric, v in (l.split() for l in open(sys.argv[1])):
    if v != "nan":
        data.setdefault((fs, metric), []).append(float(v))
metrics = ["flock_pair_ns", "client_migrations_per_1000", "client_switches_per_pair",
           "daemon_migrations_per_1000", "wakeups_elsewhere_pct"]
print(f"# unpinned flock pairs, medians of {sys.argv[2]} runs of {sys.argv[3]} pairs")
print("| | " + " | ".join(metrics) + " |")
print("|---" * (len(metrics) + 1) + "|")
for fs in ("minimal", "leasefs", "uring"):
    row = [f"{statistics.median(data[(fs, m)]):.1f}" if (fs, m) in data else "-" for m in metrics]
    print(f"| {fs} | " + " | ".join(row) + " |")
PY
