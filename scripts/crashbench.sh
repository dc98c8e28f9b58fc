#!/usr/bin/env bash
# How long a power cut takes (SPEC 13): a leasefs --volatile --bench mount
# holding FILES files (each written and synced, the directory synced),
# DIRTY of them then changed without a sync (an append, and every tenth
# renamed), then `leasefs crash MOUNT --report`, timed from the command's
# start to its exit; medians over ROUNDS rounds (each dirties the files
# again). Also the tree after the cut is checked: every file back to its
# synced contents and name.
#   scripts/crashbench.sh [ROUNDS] [FILES] [DIRTY]   (defaults: 7, 10000, 1000)
#   PIN=1 scripts/crashbench.sh                     (daemon and client on CPU 0)
# Metrics: crash_ms (the command, end to end), report_kib (its JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-7}
files=${2:-10000}
dirty=${3:-1000}
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)
cargo build --release --workspace --quiet
work=$(mktemp -d /tmp/leasefs-crashbench.XXXXXX)
m="$work/mnt"
mkdir -p "$m"
"${pin[@]}" ./target/release/leasefs mount "$m" --volatile --bench --state-dir "$work/state"
trap './target/release/leasefs unmount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; rm -rf "$work"' EXIT
"${pin[@]}" python3 - "$m" "$files" <<'PY'
import os, sys
m, n = sys.argv[1], int(sys.argv[2])
os.mkdir(f"{m}/d")
for i in range(n):
    fd = os.open(f"{m}/d/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"synced %d\n" % i)
    os.fsync(fd)
    os.close(fd)
for d in (f"{m}/d", m):
    fd = os.open(d, os.O_RDONLY); os.fsync(fd); os.close(fd)
PY
for r in $(seq "$rounds"); do
    "${pin[@]}" python3 - "$m" "$files" "$dirty" <<'PY'
import os, sys
m, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(0, n, n // k):
    with open(f"{m}/d/f{i}", "ab") as f:
        f.write(b"lost\n")
    if i % (10 * (n // k)) == 0:
        os.rename(f"{m}/d/f{i}", f"{m}/d/moved{i}")
PY
    t0=$(date +%s%N)
    "${pin[@]}" ./target/release/leasefs crash "$m" --report > "$work/report"
    t1=$(date +%s%N)
    echo "crash_ms $(python3 -c "print(($t1 - $t0) / 1e6)")"
    echo "report_kib $(( $(stat -c %s "$work/report") / 1024 ))"
    python3 - "$m" "$files" "$work/report" <<'PY'
import json, os, sys
m, n = sys.argv[1], int(sys.argv[2])
names = sorted(os.listdir(f"{m}/d"))
assert len(names) == n and all(x.startswith("f") for x in names), "names not back"
for i in range(0, n, 97):
    assert open(f"{m}/d/f{i}", "rb").read() == b"synced %d\n" % i, f"f{i} not back"
r = json.load(open(sys.argv[3]))
assert len(r["files"]) > 0 and len(r["names"]) > 0
PY
done > "$work/results"
python3 - "$work/results" "$rounds" "$files" "$dirty" <<'PY'
import statistics, sys
data = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    data.setdefault(k, []).append(float(v))
print(f"# medians of {sys.argv[2]} rounds: {sys.argv[3]} files, {sys.argv[4]} changed since their sync")
for k, v in data.items():
    print(f"{k:12s} {statistics.median(v):10.1f}   (min {min(v):.1f}, max {max(v):.1f})")
PY
