#!/usr/bin/env bash
# Data-path benchmark, side by side in one run: leasefs (durable, state
# directory on the root disk), leasefs --volatile, the minimal fuser
# filesystem keeping its data in memory with a zero TTL ("minimal",
# scripts/minimalfs.rs), the same answering fallocate ("minpunch": the
# stress-ng mmap stressor punches a hole in every page it wrote, work the
# plain minimal filesystem refuses with ENOSYS and so skips), ext4 (a directory on the root disk, "disk") and
# tmpfs. Rounds alternate the columns; medians over the rounds.
#   scripts/databench.sh [ROUNDS] [MIB] [MMAP_SECONDS]   (defaults: 3, 256, 5)
#   PIN=1 scripts/databench.sh                          (everything on CPU 0)
#   BASELINE=/path/to/older/leasefs scripts/databench.sh (adds that build)
#   RAW=FILE scripts/databench.sh                       (keeps every round's figures)
#   BENCH=1 scripts/databench.sh                        (adds leasefs --bench, volatile
#       and durable: what tracking for a power cut costs)
#   WRITEBACK=1 scripts/databench.sh                    (adds "minwb": the minimal
#       filesystem with the kernel's write-back cache, which leasefs does not use)
# Metrics, per column:
#   write_fsync_s  dd of MIB MiB in 1 MiB blocks, conv=fsync (a fresh file)
#   read_cold_s    dd it back in 1 MiB blocks after dropping the page cache
#   read_warm_s    dd it back again at once (the page cache, where kept)
#   mmap4m_ops     stress-ng --mmap 1 --mmap-file --mmap-bytes 4M, ops/s
#   mmap256m_ops   the same with 256M
#   disk_per_byte  (durable leasefs only) bytes the daemon wrote to the
#                  state directory's disk per byte of file data, over the
#                  write and 6 s of idling after it (/proc/PID/io)
# Needs root, dd and stress-ng.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
mib=${2:-256}
msecs=${3:-5}
command -v stress-ng >/dev/null || { echo "databench: needs stress-ng (apt-get install stress-ng)" >&2; exit 1; }

work=$(mktemp -d /tmp/leasefs-databench.XXXXXX)
. scripts/benchmounts.sh
bench_mount_all
mkdir -p "$work/disk" "$work/minpunch"
"${pin[@]}" ./target/release/examples/minimalfs "$work/minpunch" 0 punch &
minpunch_pid=$!
unmount_minpunch() {
    umount "$work/minpunch" 2>/dev/null || umount -l "$work/minpunch" 2>/dev/null || true
    kill "$minpunch_pid" 2>/dev/null || true
    wait "$minpunch_pid" 2>/dev/null || true
    if [ -n "${minwb_pid:-}" ]; then
        umount "$work/minwb" 2>/dev/null || umount -l "$work/minwb" 2>/dev/null || true
        kill "$minwb_pid" 2>/dev/null || true
        wait "$minwb_pid" 2>/dev/null || true
    fi
    bench_unmount_all
}
trap unmount_minpunch EXIT
for _ in $(seq 100); do mountpoint -q "$work/minpunch" && break; sleep 0.05; done
mountpoint -q "$work/minpunch" || { echo "minimalfs did not mount on minpunch" >&2; exit 1; }
cols="${cols} minimal minpunch disk"
minwb_pid=
if [ -n "${WRITEBACK:-}" ]; then
    mkdir -p "$work/minwb"
    "${pin[@]}" ./target/release/examples/minimalfs "$work/minwb" 0 writeback &
    minwb_pid=$!
    for _ in $(seq 100); do mountpoint -q "$work/minwb" && break; sleep 0.05; done
    mountpoint -q "$work/minwb" || { echo "minimalfs did not mount on minwb" >&2; exit 1; }
    cols="${cols} minwb"
fi
head -c $((mib << 20)) /dev/urandom > "$work/tmpfs/source"
daemon_pid() { python3 -c "import json,sys; print(json.load(open(sys.argv[1] + '/.leasefs/status'))['pid'])" "$1"; }
written() { awk '/^write_bytes/ {print $2}' "/proc/$1/io"; }
settle() { # leasefs mount -> wait (at most 60 s) until no compaction runs
    python3 - "$1" <<'PY'
import json, sys, time
for _ in range(600):
    if (json.load(open(sys.argv[1] + "/.leasefs/status")).get("snapshot") or {}).get("compaction") is None:
        break
    time.sleep(0.1)
PY
}
secs() { # command... -> seconds it took
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.4f}')"
}
mmap_ops() { # dir bytes -> bogo ops/s (real time)
    (cd "$1" && "${pin[@]}" stress-ng --mmap 1 --mmap-file --mmap-bytes "$2" -t "$msecs" --temp-path "$1" --metrics-brief 2>&1) |
        awk '$2 == "metrc:" && $4 == "mmap" { print $9 }'
}

for r in $(seq "$rounds"); do
    for fs in $cols; do
        d="$work/$fs"
        case $fs in minimal|minpunch|minwb) f="$d/data$r" ;; *) mkdir -p "$d/run$r"; f="$d/run$r/data" ;; esac
        pid=
        # A timed write starts with no compaction of the last round's
        # leftovers running.
        [ -e "$d/.leasefs/status" ] && settle "$d"
        [ "$fs" = leasefs ] && pid=$(daemon_pid "$d") && w0=$(written "$pid")
        echo "$fs write_fsync_s $(secs "${pin[@]}" dd if="$work/tmpfs/source" of="$f" bs=1M conv=fsync)"
        if [ -n "$pid" ]; then
            sleep 6
            echo "$fs disk_per_byte $(python3 -c "print(f'{($(written "$pid") - $w0) / ($mib << 20):.3f}')")"
        fi
        sync
        echo 3 > /proc/sys/vm/drop_caches
        echo "$fs read_cold_s $(secs "${pin[@]}" dd if="$f" of=/dev/null bs=1M)"
        echo "$fs read_warm_s $(secs "${pin[@]}" dd if="$f" of=/dev/null bs=1M)"
        cmp -s "$f" "$work/tmpfs/source" || { echo "databench: $fs returned other bytes than were written" >&2; exit 1; }
        rm -f "$f"
        case $fs in minimal|minpunch|minwb) md="$d" ;; *) md="$d/run$r" ;; esac
        echo "$fs mmap4m_ops $(mmap_ops "$md" 4M)"
        echo "$fs mmap256m_ops $(mmap_ops "$md" 256M)"
    done
done > "$work/results"
[ -n "${RAW:-}" ] && cp "$work/results" "$RAW"

python3 - "$work/results" "$rounds" "$mib" $cols <<'PY'
import statistics, sys
data = {}
for fs, metric, v in (l.split() for l in open(sys.argv[1])):
    try:
        data.setdefault(metric, {}).setdefault(fs, []).append(float(v))
    except ValueError:
        pass
cols = sys.argv[4:]
print(f"# medians of {sys.argv[2]} rounds, {sys.argv[3]} MiB; ratio = leasefs / minimal (and / minpunch)")
print("%-14s" % "metric" + "".join("%12s" % c for c in cols) + "%16s%16s%16s%16s" % ("leasefs/min", "volatile/min", "leasefs/punch", "volatile/punch"))
for m in ("write_fsync_s", "read_cold_s", "read_warm_s", "mmap4m_ops", "mmap256m_ops", "disk_per_byte"):
    row = data.get(m, {})
    med = {c: statistics.median(row[c]) for c in cols if row.get(c)}
    line = "%-14s" % m + "".join("%12s" % (f"{med[c]:.3f}" if c in med else "-") for c in cols)
    for base in ("minimal", "minpunch"):
        for c in ("leasefs", "volatile"):
            ok = c in med and med.get(base)
            line += "%16s" % (f"{med[c] / med[base]:.2f}" if ok else "-")
    print(line)
if "vbench" in cols:
    # BENCH=1: what tracking for a power cut costs (time ratios: >1 slower;
    # ops ratios: <1 slower).
    print("%-14s%16s%16s" % ("--bench cost", "vbench/volatile", "dbench/leasefs"))
    for m in ("write_fsync_s", "read_cold_s", "read_warm_s", "mmap4m_ops", "mmap256m_ops"):
        row = data.get(m, {})
        med = {c: statistics.median(row[c]) for c in cols if row.get(c)}
        r = lambda a, b: f"{med[a] / med[b]:.2f}" if med.get(a) and med.get(b) else "-"
        print("%-14s%16s%16s" % (m, r("vbench", "volatile"), r("dbench", "leasefs")))
PY
