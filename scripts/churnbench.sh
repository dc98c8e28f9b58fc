#!/usr/bin/env bash
# Churn and shared-mmap benchmark, side by side in one run on tmpfs, leasefs,
# leasefs --volatile (and an older build with BASELINE=). Medians over
# repeated runs. (The minimal fuser filesystem of the other benchmarks has
# no unlink and ignores contents, so it has no column here.)
#   churn:   N cycles of create (O_EXCL) + write 4 KiB + flock + unlock +
#            close + unlink of unique names (tests/helpers/churn.py), µs per
#            cycle; the daemons' RSS and state-dir growth over all runs
#            (REPEATS x N names) after a sync
#   dirty:   dirty 64 MiB through a shared mapping, then msync (s)
#   stress:  stress-ng --mmap 1 --mmap-file --mmap-bytes 16M --mmap-ops 1 (s)
#   scripts/churnbench.sh [REPEATS] [N]      (defaults: 3, 20000)
#   PIN=1 scripts/churnbench.sh              (daemons and clients on CPU 0)
#   BASELINE=/path/to/older/leasefs scripts/churnbench.sh   (adds that build)
# Needs root, python3 and stress-ng.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
n=${2:-20000}

work=$(mktemp -d /tmp/leasefs-churnbench.XXXXXX)
. scripts/benchmounts.sh
bench_mount_all

daemon_of() { sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$1/.leasefs/status" 2>/dev/null; }
rss() { awk '/VmRSS/ { print $2 }' "/proc/$1/status"; }
fsync_dir() { python3 -c "import os, sys; os.fsync(os.open(sys.argv[1], os.O_RDONLY))" "$1"; }
now() { date +%s.%N; }

cat > "$work/dirty.py" <<'PY'
import mmap, os, sys, time
n = 64 << 20
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o644)
os.ftruncate(fd, n)
m = mmap.mmap(fd, n, mmap.MAP_SHARED)
t = time.time()
m[:] = b"\xff" * n
m.flush()
print(f"{time.time() - t:.3f}")
m.close(); os.close(fd)
try:
    os.unlink(sys.argv[1])
except OSError as e:
    # Builds before the writeback fix refused the writer's own unlink.
    sys.stderr.write(f"unlink after msync: {os.strerror(e.errno)}\n")
    os.system(f"rm -f '{sys.argv[1]}'")
PY

declare -A rss0 state0
for fs in $cols; do
    pid=$(daemon_of "$work/$fs")
    [ -n "$pid" ] || continue
    fsync_dir "$work/$fs"
    rss0[$fs]=$(rss "$pid")
    state0[$fs]=$(du -sb "$work/state.$fs" | cut -f1)
done
for r in $(seq "$repeats"); do
    for fs in $cols; do
        d="$work/$fs"
        d="$work/$fs/run$r"
        mkdir "$d"
        t0=$(now)
        "${pin[@]}" python3 tests/helpers/churn.py "$d" "$n" "r$r" >/dev/null
        t1=$(now)
        echo "$fs churn_us $(python3 -c "print(($t1 - $t0) * 1e6 / $n)")"
        echo "$fs dirty64m_msync_s $("${pin[@]}" python3 "$work/dirty.py" "$d/mapped")"
        t0=$(now)
        "${pin[@]}" stress-ng --mmap 1 --mmap-file --mmap-bytes 16M --mmap-ops 1 --temp-path "$d" >/dev/null 2>&1
        t1=$(now)
        echo "$fs stress_mmap16m_s $(python3 -c "print(f'{$t1 - $t0:.3f}')")"
    done
done > "$work/results"
for fs in $cols; do
    pid=$(daemon_of "$work/$fs")
    [ -n "$pid" ] || continue
    fsync_dir "$work/$fs"
    echo "$fs rss_growth_kib $(( $(rss "$pid") - ${rss0[$fs]} ))"
    echo "$fs state_growth_bytes $(( $(du -sb "$work/state.$fs" | cut -f1) - ${state0[$fs]} ))"
done >> "$work/results"

[ -n "${RAW:-}" ] && cat "$work/results" >&2
python3 - "$work/results" "$repeats" "$n" "${PIN:-0}" $cols <<'PY'
import statistics, sys
data = {}
for fs, metric, v in (l.split() for l in open(sys.argv[1])):
    data.setdefault(metric, {}).setdefault(fs, []).append(float(v))
print(f"# medians of {sys.argv[2]} runs; churn of {sys.argv[3]} unique names; pinned={sys.argv[4]}")
cols = tuple(sys.argv[5:])
print(f"{'metric':<20}" + "".join(f"{c:>12}" for c in cols) + f"{'lfs/tmpfs':>11}")
for metric, by in data.items():
    med = {c: statistics.median(by[c]) if c in by else None for c in cols}
    cells = "".join(f"{v:>12.3f}" if v is not None and v < 100 else (f"{v:>12.0f}" if v is not None else f"{'-':>12}") for v in med.values())
    ratio = f"{med['leasefs'] / med['tmpfs']:>10.1f}x" if med.get('tmpfs') else f"{'-':>11}"
    print(f"{metric:<20}{cells}{ratio}")
PY
