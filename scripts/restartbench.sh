#!/usr/bin/env bash
# Restart time against state size: create N leases (O_CREAT|O_EXCL, so each
# path has an epoch), fsync once, then time `leasefs mount` until the mount is
# ready — after kill -9 (journal replay) and after a clean unmount (snapshot).
# Medians of REPEATS restarts.
#   scripts/restartbench.sh [REPEATS] [N...]      (defaults: 3, 1000 10000 100000)
# Needs root and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-3}
shift || true
sizes=${*:-1000 10000 100000}
cargo build --release --quiet -p leasefs-mountd
bin=$PWD/target/release/leasefs
work=$(mktemp -d /tmp/leasefs-restartbench.XXXXXX)
cleanup() {
    if grep -q " $work/mnt " /proc/self/mountinfo; then
        "$bin" unmount "$work/mnt" >/dev/null 2>&1 || umount -l "$work/mnt" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

python3 - "$bin" "$work" "$repeats" $sizes <<'PY'
import json, os, shutil, statistics, subprocess, sys, time
bin, work, repeats, sizes = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(n) for n in sys.argv[4:]]
mnt, state = f"{work}/mnt", f"{work}/state"

def mount():
    t = time.monotonic()
    subprocess.run([bin, "mount", mnt, "--state-dir", state], check=True)
    return (time.monotonic() - t) * 1000

def daemon_pid():
    return json.load(open(os.path.join(mnt, ".leasefs/status")))["pid"]

def kill9():
    pid = daemon_pid()
    os.kill(pid, 9)
    def alive():
        # A zombie leader still has live threads (holding its descriptors)
        # until every thread has exited.
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            return state != "Z" or len(os.listdir(f"/proc/{pid}/task")) > 1
        except FileNotFoundError:
            return False
    while alive():
        time.sleep(0.005)
    subprocess.run([bin, "unmount", mnt], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

def size(name):
    try:
        return os.path.getsize(f"{state}/{name}")
    except FileNotFoundError:
        return 0

print(f"# medians of {repeats} restarts; time of `leasefs mount` until the mount is ready")
print(f"{'leases':>8} {'create s':>9} {'journal MB':>11} {'after kill -9 ms':>17} {'snapshot MB':>12} {'after unmount ms':>17}")
for n in sizes:
    shutil.rmtree(work + "/state", ignore_errors=True)
    os.makedirs(mnt, exist_ok=True)
    mount()
    t = time.monotonic()
    for i in range(n):
        d = f"{mnt}/l{i // 1000}"
        if i % 1000 == 0:
            os.mkdir(d)
        os.close(os.open(f"{d}/L{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    fd = os.open(mnt, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    create = time.monotonic() - t
    journal = size("namespace.journal") / 1e6
    replay = []
    for _ in range(repeats):
        kill9()
        replay.append(mount())
    # The leases came back with their epochs.
    assert int(os.getxattr(f"{mnt}/l0/L0", "user.leasefs.epoch")) >= 1
    assert len(os.listdir(f"{mnt}/l{(n - 1) // 1000}")) == (n - 1) % 1000 + 1
    snap = []
    for _ in range(repeats):
        subprocess.run([bin, "unmount", mnt], check=True)
        snap.append(mount())
    snapshot = size("namespace.snapshot") / 1e6
    subprocess.run([bin, "unmount", mnt], check=True)
    print(f"{n:>8} {create:>9.1f} {journal:>11.2f} {statistics.median(replay):>17.0f} {snapshot:>12.2f} {statistics.median(snap):>17.0f}", flush=True)
PY
