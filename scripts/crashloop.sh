#!/usr/bin/env bash
# Crash loop: workers take leases (long-lived names, and names created with
# O_EXCL, removed while held and re-created) and append+fsync records while
# the daemon is killed with SIGKILL at a random moment; after each restart on
# the same state directory, verify that no path's epoch went back, that the next grant is
# strictly higher than any epoch handed out, and that every acknowledged
# (fsync returned) record is present — of this and of all earlier iterations.
#   scripts/crashloop.sh [ITERATIONS] [WORKERS]     (defaults: 200, 4)
#   LEASEFS_BIN=target/debug/leasefs scripts/crashloop.sh 5   (short run)
# Needs root and python3. Exits 1 on any regression or loss.
set -euo pipefail
cd "$(dirname "$0")/.."
iterations=${1:-200}
workers=${2:-4}
if [ -z "${LEASEFS_BIN:-}" ]; then
    cargo build --release --quiet -p leasefs-mountd
    LEASEFS_BIN=$PWD/target/release/leasefs
fi
bin=$LEASEFS_BIN
work=$(mktemp -d /tmp/leasefs-crashloop.XXXXXX)
mnt=$work/mnt
state=$work/state
logs=$work/logs
mkdir -p "$mnt" "$state" "$logs"
worker_pids=()

cleanup() {
    for p in "${worker_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    if mountpoint -q "$mnt" 2>/dev/null || grep -q " $mnt " /proc/self/mountinfo; then
        "$bin" unmount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/worker.py" <<'PY'
import fcntl, os, random, sys
mnt, log, wid, it = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
out = open(log, "a", buffering=1)
rng = random.Random()
try:
    os.makedirs(f"{mnt}/leases", exist_ok=True)
    os.makedirs(f"{mnt}/data", exist_ok=True)
    n = 0
    while True:
        # Long-lived names, and names that are created (O_EXCL when new),
        # removed and re-created around the crashes: each new inode of a
        # path must resume above every epoch the path had.
        churn = rng.random() < 0.5
        path = f"names/N{rng.randrange(16)}" if churn else f"leases/L{rng.randrange(4)}"
        os.makedirs(f"{mnt}/names", exist_ok=True)
        try:
            fd = os.open(f"{mnt}/{path}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            fd = os.open(f"{mnt}/{path}", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        e = int(os.getxattr(fd, "user.leasefs.epoch"))
        out.write(f"epoch {path} {e}\n")
        rec = f"w{wid}-i{it}-n{n}"
        d = os.open(f"{mnt}/data/w{wid}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(d, (rec + "\n").encode())
        os.fsync(d)
        out.write(f"ack {wid} {rec}\n")
        os.close(d)
        if churn and rng.random() < 0.7:
            try:
                os.unlink(f"{mnt}/{path}")
            except FileNotFoundError:
                pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        n += 1
except OSError:
    pass  # the daemon is gone
PY

cat > "$work/verify.py" <<'PY'
import fcntl, glob, os, sys
mnt, logs = sys.argv[1], sys.argv[2]
highest, acked = {}, {}
for f in glob.glob(f"{logs}/*.log"):
    for line in open(f):
        p = line.split()
        if len(p) != 3:
            continue  # a line torn by the kill of its worker
        if p[0] == "epoch":
            highest[p[1]] = max(highest.get(p[1], 0), int(p[2]))
        elif p[0] == "ack":
            acked.setdefault(p[1], set()).add(p[2])
regressions = losses = 0
for path, e in sorted(highest.items()):
    os.makedirs(os.path.dirname(f"{mnt}/{path}"), exist_ok=True)
    fd = os.open(f"{mnt}/{path}", os.O_RDWR | os.O_CREAT, 0o644)
    now = int(os.getxattr(fd, "user.leasefs.epoch"))
    fcntl.flock(fd, fcntl.LOCK_EX)
    nxt = int(os.getxattr(fd, "user.leasefs.epoch"))
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    if now < e or nxt <= e:
        regressions += 1
        print(f"REGRESSION {path}: handed out {e}, now {now}, next grant {nxt}", file=sys.stderr)
for wid, recs in acked.items():
    try:
        present = set(open(f"{mnt}/data/w{wid}").read().split())
    except FileNotFoundError:
        present = set()
    for r in sorted(recs - present):
        losses += 1
        print(f"LOSS worker {wid}: acknowledged record {r} missing", file=sys.stderr)
print(len(highest), sum(len(v) for v in acked.values()), regressions, losses)
PY

mount_fs() { "$bin" mount "$mnt" --state-dir "$state" --allow-other; }
daemon_pid() { sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$mnt/.leasefs/status"; }

mount_fs
total_grants=0 total_acks=0 total_reg=0 total_loss=0
for it in $(seq "$iterations"); do
    worker_pids=()
    for w in $(seq "$workers"); do
        python3 "$work/worker.py" "$mnt" "$logs/w$w.$it.log" "$w" "$it" &
        worker_pids+=($!)
    done
    sleep "$(python3 -c 'import random; print(round(random.uniform(0.2, 1.5), 3))')"
    pid=$(daemon_pid)
    kill -9 "$pid"
    # Gone, or a zombie whose other threads have exited too: its descriptors
    # (the FUSE connection, the state-dir lock) are closed either way,
    # whenever init reaps it.
    while [ -e "/proc/$pid" ] && { [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] ||
        [ "$(ls "/proc/$pid/task" 2>/dev/null | wc -l)" -gt 1 ]; }; do sleep 0.01; done
    for p in "${worker_pids[@]}"; do
        timeout 10 tail --pid="$p" -f /dev/null || { echo "worker $p stuck after the crash" >&2; exit 1; }
    done
    worker_pids=()
    "$bin" unmount "$mnt" >/dev/null 2>&1
    mount_fs
    read -r paths checked reg loss < <(python3 "$work/verify.py" "$mnt" "$logs")
    grants=$(cat "$logs"/*."$it".log | grep -c '^epoch ' || true)
    acks=$(cat "$logs"/*."$it".log | grep -c '^ack ' || true)
    total_grants=$((total_grants + grants)) total_acks=$((total_acks + acks))
    total_reg=$((total_reg + reg)) total_loss=$((total_loss + loss))
    echo "iteration $it: grants $grants acked $acks (checked so far: $checked) paths $paths regressions $reg losses $loss"
done
"$bin" unmount "$mnt"
echo "crash loop: iterations $iterations grants $total_grants acked $total_acks regressions $total_reg losses $total_loss"
[ "$total_reg" = 0 ] && [ "$total_loss" = 0 ]
