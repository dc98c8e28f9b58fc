#!/usr/bin/env bash
# Churn and shared-mmap benchmark, side by side in one run on tmpfs, leasefs,
# leasefs --volatile and the minimal fuser filesystem (scripts/minimalfs.rs,
# zero TTL; churn only: it ignores contents). Medians over repeated runs.
#   churn:   N cycles of create (O_EXCL) + write 4 KiB + flock + unlock +
#            close + unlink of unique names (tests/helpers/churn.py), µs per
#            cycle, and the leasefs daemon's RSS and state-dir growth
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

daemon_of() { awk -v m="$1" '$5 == m { print $0 }' /proc/self/mountinfo | sed -n 's/.* - fuse.leasefs leasefs:\([0-9]*\) .*/\1/p'; }
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
m.close(); os.close(fd); os.unlink(sys.argv[1])
PY

for r in $(seq "$repeats"); do
    for fs in $cols minimal; do
        d="$work/$fs"
        [ "$fs" = minimal ] || { d="$work/$fs/run$r"; mkdir "$d"; }
        pid=$(daemon_of "$work/$fs")
        [ -n "$pid" ] && { fsync_dir "$d"; r0=$(rss "$pid"); s0=$(du -sb "$work/state.$fs" | cut -f1); }
        t0=$(now)
        "${pin[@]}" python3 tests/helpers/churn.py "$d" "$n" "r$r" >/dev/null
        t1=$(now)
        echo "$fs churn_us $(python3 -c "print(($t1 - $t0) * 1e6 / $n)")"
        if [ -n "$pid" ]; then
            fsync_dir "$d"
            echo "$fs churn_rss_kib $(( $(rss "$pid") - r0 ))"
            echo "$fs churn_state_bytes $(( $(du -sb "$work/state.$fs" | cut -f1) - s0 ))"
        fi
        [ "$fs" = minimal ] && continue
        echo "$fs dirty64m_msync_s $("${pin[@]}" python3 "$work/dirty.py" "$d/mapped")"
        t0=$(now)
        "${pin[@]}" stress-ng --mmap 1 --mmap-file --mmap-bytes 16M --mmap-ops 1 --temp-path "$d" >/dev/null 2>&1
        t1=$(now)
        echo "$fs stress_mmap16m_s $(python3 -c "print(f'{$t1 - $t0:.3f}')")"
    done
done > "$work/results"

python3 - "$work/results" "$repeats" "$n" "${PIN:-0}" $cols minimal <<'PY'
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
