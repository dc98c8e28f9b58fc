#!/usr/bin/env bash
# Scale: for each N, create N leases (open O_CREAT|O_EXCL, flock, write a
# 14-byte JSON body, unlock, close; scripts/scale.c) on a fresh durable mount,
# in one directory and spread over 1 000 directories, and report per N:
# create time per lease (against the minimal fuser filesystem,
# scripts/minimalfs.rs, creating the same N in its one directory), RSS (after
# one fsync, once a compaction it started has finished) and state-directory
# bytes per lease, the latency of a lookup, stat, open+close, flock pair and
# lease cycle on random existing leases (the same requests at every N), again
# on other leases after a clean restart, the clean-unmount time (and the minimal
# filesystem's with as many cached inodes) and the restart time after
# kill -9 and after a clean unmount. While the fsync after the creates runs,
# and during the compaction it starts, another process times flock pairs on
# a lease of its own: the slowest pair in each window is how long requests
# were held up, and how much CPU time the host took from the guest (steal)
# meanwhile and around the slowest pairs. A churn of unique names (create, lock, write, unlock, close,
# unlink) then shows what it leaves behind.
# Latency ratios are measured side by side: a reference mount holding the
# smallest N stays mounted throughout, and each latency is measured on it
# and on the mount under test alternately, three rounds, medians of each
# (the smallest N's own row then shows how far two equal mounts differ).
#   scripts/scalebench.sh [N...]          (default: 1000 10000 100000)
#   CHURN=N (default 100000) OPS=N (default 2000) PIN=1 (pin to CPU 0)
#   LEASEFS=/path/to/leasefs (another build, e.g. to compare two builds)
# Needs root, gcc, python3.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${*:-1000 10000 100000}
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)
cargo build --release --quiet -p leasefs-mountd
cargo build --release --quiet --example minimalfs
bin=${LEASEFS:-$PWD/target/release/leasefs}
work=$(mktemp -d /tmp/leasefs-scalebench.XXXXXX)
gcc -O2 -o "$work/scale" scripts/scale.c
minimal_pid=
cleanup() {
    for m in "$work"/mnt "$work"/minimal "$work"/ref-*; do
        grep -q " $m " /proc/self/mountinfo || continue
        if [ "$m" = "$work/minimal" ]; then
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        else
            "$bin" unmount "$m" >/dev/null 2>&1 || umount -l "$m" 2>/dev/null || true
        fi
    done
    [ -n "$minimal_pid" ] && { kill "$minimal_pid" 2>/dev/null || true; wait "$minimal_pid" 2>/dev/null || true; }
    rm -rf "$work"
}
trap cleanup EXIT

python3 - "$bin" "$work" "${OPS:-2000}" "${CHURN:-100000}" "${PIN:-0}" $sizes <<'PY'
import json, os, shutil, subprocess, sys, threading, time
bin, work, ops, churn, pin = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
sizes = [int(n) for n in sys.argv[6:]]
pinned = ["taskset", "-c", "0"] if pin else []
mnt, state, scale = f"{work}/mnt", f"{work}/state", f"{work}/scale"
os.makedirs(mnt, exist_ok=True)

def run(*args, env=None):
    r = subprocess.run(pinned + [scale, *map(str, args)], capture_output=True, text=True,
                       env=None if env is None else {**os.environ, **env})
    if r.returncode:
        sys.exit(f"{' '.join(map(str, args))}: {r.stderr.strip()}")
    out = r.stdout
    return {k: float(v) for k, v in (l.split() for l in out.splitlines())}

def mount(m=mnt, st=state):
    t = time.monotonic()
    # The size limit counts a page per file, as tmpfs does (a million
    # 14-byte leases are 4 GB of it): give the mount half of memory.
    subprocess.run(pinned + [bin, "mount", m, "--state-dir", st, "--size", "50%"], check=True)
    return time.monotonic() - t

def pid():
    return json.load(open(f"{mnt}/.leasefs/status"))["pid"]

def rss(p):
    for line in open(f"/proc/{p}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

def settled_rss(p):
    """RSS once it stopped falling (a compaction's image freed), at most 120 s."""
    last, since, t0 = rss(p), time.monotonic(), time.monotonic()
    while time.monotonic() - since < 3 and time.monotonic() - t0 < 120:
        time.sleep(0.5)
        now = rss(p)
        if now < last * 0.99:
            last, since = now, time.monotonic()
    return rss(p)

def unmount(m=mnt):
    t = time.monotonic()
    subprocess.run([bin, "unmount", m], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t

# The reference mounts, one per directory layout: the smallest N, kept
# mounted while every N is measured.
n0 = min(sizes)
refs = {}
def reference(dirs):
    if dirs not in refs:
        m, st = f"{work}/ref-{dirs}", f"{work}/refstate-{dirs}"
        os.makedirs(m, exist_ok=True)
        mount(m, st)
        run("create", m, n0, dirs)
        refs[dirs] = (m, st)
    return refs[dirs]

def ops_side_by_side(n, dirs, restarted):
    """Each latency on the reference mount and on the mount under test,
    alternately, three rounds: the medians of each (µs). After a restart,
    the reference is restarted too (its kernel holds no file either)."""
    m, st = reference(dirs)
    if restarted:
        unmount(m)
        mount(m, st)
    env = {"SCALE_SEED": "1"} if restarted else None
    ref, own = [], []
    for _ in range(3):
        ref.append(run("ops", m, n0, dirs, ops, env=env))
        own.append(run("ops", mnt, n, dirs, ops, env=env))
    med = lambda rs, k: sorted(r[k] for r in rs)[len(rs) // 2] / 1000
    return {k: med(own, k) for k in own[0]}, {k: med(ref, k) for k in ref[0]}

def kill9():
    p = pid()
    os.kill(p, 9)
    while True:
        try:
            st = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
            if st == "Z" and len(os.listdir(f"/proc/{p}/task")) <= 1:
                break
        except FileNotFoundError:
            break
        time.sleep(0.005)
    subprocess.run([bin, "unmount", mnt], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

def fsync_mount():
    fd = os.open(mnt, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)

def status():
    return json.load(open(f"{mnt}/.leasefs/status"))

def probed_fsync():
    """The fsync after the creates, and the compaction it starts, with
    flock pairs timed on another lease meanwhile: seconds each took and the
    slowest pair (ms) in each (None: no compaction)."""
    out = f"{work}/probe.txt"
    pr = subprocess.Popen(pinned + [scale, "probe", f"{mnt}/probe.lock", "0", out], stdout=subprocess.PIPE, text=True)
    assert pr.stdout.readline().startswith("ready")
    gen = status()["snapshot"]["generation"]
    t0 = time.monotonic_ns()
    fsync_mount()
    t1 = time.monotonic_ns()
    deadline = time.monotonic() + 600
    while status()["snapshot"]["compaction"] and time.monotonic() < deadline:
        time.sleep(0.01)
    t2 = time.monotonic_ns()
    time.sleep(0.05)
    pr.terminate()
    pr.wait()
    pairs = [tuple(map(int, l.split())) for l in open(out)]
    # The fsync's window holds every pair it overlaps; the compaction's,
    # the pairs started after the fsync returned.
    worst = lambda a, b: max((d for s, d in pairs if s < b and s + d > a), default=0) / 1e6
    started = lambda a, b: max((d for s, d in pairs if a <= s < b), default=0) / 1e6
    compacted = status()["snapshot"]["generation"] > gen
    return {"fsync_s": (t1 - t0) / 1e9, "fsync_worst_ms": worst(t0, t1),
            "compaction_s": (t2 - t1) / 1e9 if compacted else None,
            "compaction_worst_ms": started(t1, t2) if compacted else None,
            "idle_worst_ms": started(t2, t2 + 10**12)}

def probed_create(n, dirs):
    """The creates, with flock pairs timed on another lease meanwhile and
    `status` polled every 50 ms for compactions: the compactions that ran,
    the slowest pair started during one, and the slowest started outside
    them (what sharing the CPU with the creates costs a pair anyway)."""
    out = f"{work}/probe-create.txt"
    # A pair every millisecond: a pause of more than that shows, and the
    # creates lose little of the CPU to it.
    pr = subprocess.Popen(pinned + [scale, "probe", f"{mnt}/probe.lock", "1000", out], stdout=subprocess.PIPE, text=True)
    assert pr.stdout.readline().startswith("ready")
    windows, stop = [], threading.Event()
    gen0 = status()["snapshot"]["generation"]
    def poll():
        start = None
        while not stop.is_set():
            t, busy = time.monotonic_ns(), status()["snapshot"]["compaction"]
            if busy and start is None:
                start = t
            elif not busy and start is not None:
                windows.append((start, t))
                start = None
            time.sleep(0.05)
        if start is not None:
            windows.append((start, time.monotonic_ns()))
    # CPU time the host took from the guest (steal, in clock ticks),
    # sampled every 5 ms: a pair held up while the vCPU did not run is the
    # host's doing, not the daemon's.
    stolen = []
    def sample_steal():
        while not stop.is_set():
            stolen.append((time.monotonic_ns(), steal_ticks()))
            time.sleep(0.005)
    poller = threading.Thread(target=poll)
    stealer = threading.Thread(target=sample_steal)
    poller.start()
    stealer.start()
    try:
        r = run("create", mnt, n, dirs)
    finally:
        stop.set()
        poller.join()
        stealer.join()
        pr.terminate()
        pr.wait()
    pairs = [tuple(map(int, l.split())) for l in open(out)]
    inside = lambda s: any(a - 50_000_000 <= s < b for a, b in windows)
    slowest = lambda pick: max(((d, s) for s, d in pairs if pick(s)), default=(0, 0))
    def steal_ms(a, b):
        """Steal between the samples just before a and just after b."""
        before = [v for t, v in stolen if t <= a] or [stolen[0][1]]
        after = [v for t, v in stolen if t >= b] or [stolen[-1][1]]
        return (after[0] - before[-1]) * 1000 / os.sysconf("SC_CLK_TCK")
    (din, sin), (dout, sout) = slowest(inside), slowest(lambda s: not inside(s))
    return r, {"create_compactions": status()["snapshot"]["generation"] - gen0,
               "create_compaction_s": sum(b - a for a, b in windows) / 1e9,
               "create_worst_in_ms": din / 1e6 if windows else None,
               "create_worst_out_ms": dout / 1e6,
               "create_stolen_ms": steal_ms(stolen[0][0], stolen[-1][0]),
               "create_worst_in_stolen_ms": steal_ms(sin, sin + din) if windows else None,
               "create_worst_out_stolen_ms": steal_ms(sout, sout + dout)}

def steal_ticks():
    """Steal time of CPU 0 when pinned there, else of all CPUs."""
    want = "cpu0" if pin else "cpu"
    for line in open("/proc/stat"):
        f = line.split()
        if f[0] == want:
            return int(f[8])

def state_bytes():
    return sum(os.path.getsize(f"{state}/{f}") for f in os.listdir(state))

def minimal_create(n):
    d = f"{work}/minimal"
    os.makedirs(d, exist_ok=True)
    m = subprocess.Popen(pinned + [f"{os.getcwd()}/target/release/examples/minimalfs", d])
    for _ in range(200):
        if os.path.ismount(d):
            break
        time.sleep(0.05)
    try:
        return run("create", d, n, 1)["create_ns"]
    finally:
        # The kernel evicts every cached inode at unmount, whatever the
        # daemon does: the baseline for leasefs's unmount time.
        t = time.monotonic()
        subprocess.run(["umount", d])
        m.wait()
        minimal_unmount.append(time.monotonic() - t)

rows = []
minimal_unmount = []
for n in sizes:
    for dirs in (1, 1000):
        if dirs > n:
            continue
        shutil.rmtree(state, ignore_errors=True)
        mount()
        p = pid()
        base = rss(p)
        r, during = probed_create(n, dirs)
        probed = probed_fsync()
        # The fsync may have started a compaction: its thread holds an
        # image as large as the state until the snapshot is written.
        grown = settled_rss(p) - base
        row = {"n": n, "dirs": dirs, "create_us": r["create_ns"] / 1000, "rss_per": grown / n,
               "state_per": state_bytes() / n, **probed, **during}
        own, ref = ops_side_by_side(n, dirs, False)
        row.update(own)
        row.update({f"ref_{k}": v for k, v in ref.items()})
        row["unmount_s"] = unmount()
        row["restart_clean_s"] = mount()
        # The same operations on other random leases after the restart:
        # the kernel holds no file yet, so none is evicted to make room.
        own, ref = ops_side_by_side(n, dirs, True)
        row.update({f"restarted_{k}": v for k, v in own.items()})
        row.update({f"ref_restarted_{k}": v for k, v in ref.items()})
        kill9()
        row["restart_kill_s"] = mount()
        unmount()
        if dirs == 1:
            row["minimal_create_us"] = minimal_create(n) / 1000
            row["minimal_unmount_s"] = minimal_unmount[-1]
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)

print(f"# {'pinned to CPU 0' if pin else 'unpinned'}; {ops} random picks per latency, median of 5 batches, median of 3 rounds")
print("| leases | dirs | create µs | minimal create µs | ratio | RSS B/lease | state B/lease | lookup µs | stat µs | open+close µs | flock pair µs | lease cycle µs | unmount s | minimal unmount s | restart (clean) s | restart (kill -9) s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    mc = r.get("minimal_create_us")
    mcs, ratio = (f"{mc:.1f}", f"{r['create_us'] / mc:.2f}×") if mc else ("—", "—")
    mu = f"{r['minimal_unmount_s']:.2f}" if "minimal_unmount_s" in r else "—"
    print(f"| {r['n']} | {r['dirs']} | {r['create_us']:.1f} | {mcs} | {ratio} "
          f"| {r['rss_per']:.0f} | {r['state_per']:.0f} | {r['lookup_ns']:.1f} | {r['stat_ns']:.1f} | {r['open_close_ns']:.1f} | {r['lock_pair_ns']:.1f} "
          f"| {r['lease_cycle_ns']:.1f} | {r['unmount_s']:.2f} | {mu} | {r['restart_clean_s']:.2f} | {r['restart_kill_s']:.2f} |")

latencies = [("lookup_ns", "lookup"), ("stat_ns", "stat"), ("open_close_ns", "open+close"),
             ("lock_pair_ns", "flock pair"), ("lease_cycle_ns", "lease cycle")]
print(f"\n# latency against a mount of {n0} leases in as many directories, measured side by side (alternate rounds):")
print("# after the creates (the kernel holds --kernel-inodes files of the mount under test), and after a restart")
print("# of both (the kernel holds none yet)")
print("| leases | dirs | against | " + " | ".join(l for _, l in latencies) + " | after a restart: " + " | ".join(l for _, l in latencies) + " |")
print("|---|---|---|" + "---|" * (2 * len(latencies)))
for r in rows:
    cells = [f"{r[k] / r['ref_' + k]:.2f}×" for k, _ in latencies]
    cells += [f"{r['restarted_' + k]:.1f} µs ({r['restarted_' + k] / r['ref_restarted_' + k]:.2f}×)" for k, _ in latencies]
    print(f"| {r['n']} | {r['dirs']} | {n0} | " + " | ".join(cells) + " |")

print("\n# compactions during the creates, the fsync after them and the compaction it started; slowest flock pair on another lease in each;")
print(f"# CPU time the host took from the guest ({'CPU 0' if pin else 'all CPUs'}, steal, 10 ms ticks) during the creates and around each slowest pair")
print("| leases | dirs | compactions during the creates | their time s | slowest pair in them ms | slowest pair outside them ms | stolen during the creates ms | around the slowest pairs ms (in / out) | fsync s | slowest pair during fsync ms | compaction after s | slowest pair during it ms | slowest pair after ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    cs = f"{r['compaction_s']:.2f}" if r["compaction_s"] is not None else "none"
    cw = f"{r['compaction_worst_ms']:.2f}" if r["compaction_worst_ms"] is not None else "—"
    ci = f"{r['create_worst_in_ms']:.2f}" if r["create_worst_in_ms"] is not None else "—"
    si = f"{r['create_worst_in_stolen_ms']:.0f}" if r["create_worst_in_stolen_ms"] is not None else "—"
    print(f"| {r['n']} | {r['dirs']} | {r['create_compactions']} | {r['create_compaction_s']:.2f} | {ci} | {r['create_worst_out_ms']:.2f} "
          f"| {r['create_stolen_ms']:.0f} | {si} / {r['create_worst_out_stolen_ms']:.0f} "
          f"| {r['fsync_s']:.2f} | {r['fsync_worst_ms']:.2f} | {cs} | {cw} | {r['idle_worst_ms']:.2f} |")

# Churn of unique names: what is left after it (RSS, state directory).
shutil.rmtree(state, ignore_errors=True)
mount()
p = pid()
fsync_mount()
r0, s0 = rss(p), state_bytes()
c = run("churn", mnt, churn)
fsync_mount()
r1, s1 = rss(p), state_bytes()
unmount()
for m, _ in refs.values():
    unmount(m)
print(f"\nchurn of {churn} unique names: {c['churn_ns'] / 1000:.1f} µs per cycle; RSS {(r1 - r0) / 1e6:+.1f} MB, state directory {(s1 - s0) / 1e6:+.2f} MB")
PY
