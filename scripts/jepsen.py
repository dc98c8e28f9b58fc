#!/usr/bin/env python3
"""A Jepsen-style check of leasefs across hosts through etcd.

Starts a 3-member etcd cluster on loopback, mounts three leasefs daemons
against it (three "hosts"; host c runs in a network namespace of its own,
joined by a veth pair), and runs workers on every host that loop: flock the
lease `x`, read its epoch, read-modify-write a register file guarded by the
lease (`user.leasefs.guard`), unlock. Meanwhile a nemesis kills the etcd
leader, restarts members, freezes a daemon (SIGSTOP) past its host TTL and
cuts host c's link. Every operation's invocation and completion is logged
(CLOCK_MONOTONIC, one clock for all processes on this machine), and the
checker reads the whole history afterwards:

- grants: no epoch is granted twice, and a grant that completed before
  another was invoked has the lower epoch;
- fencing: no register write was accepted after it was invoked later than
  the completion of a grant with a higher epoch (a holder that lost its
  lease never lands a write after the next holder was granted);
- register: the register is one file of the shared namespace; the
  acknowledged increments of all hosts together are distinct, every value
  1..N was acknowledged or written by a write that failed with EIO (whose
  outcome is unknown: etcd may have committed it while its answer was
  lost), and every host reads N at the end (nothing lost or doubled, no
  stale read); such a write that landed obeys the fencing rule too;
- refusals: a holder's write is refused (ESTALE/ENOLCK) only once a higher
  epoch was granted or its host was frozen or cut off meanwhile;
- epochs on every host: an observer reads the epoch by path on every host
  in turn; no read is below a grant that completed before it began;
- tokens: a holder whose write was refused with ESTALE reads the epoch by
  descriptor and by path, and must get ESTALE (SPEC 5);
- no epoch without a holder: consecutive grants differ by one, unless a
  fault or a holder that could not read its epoch explains the gap.

It prints a tally and the first violation of each kind, and exits 1 when
there is one. Needs root, etcd (etcd-server), iproute2 and util-linux.

    scripts/jepsen.py [--seconds 60] [--leasefs target/release/leasefs] [--lock-delay DUR] [--idle SECONDS]
"""

import argparse
import errno
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def sh(*args, check=True):
    return subprocess.run(args, check=check, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def now():
    return time.monotonic()


# ---------------------------------------------------------------- the worker


# Longest pause between a worker's holds (`--idle`; passed to the workers
# in the environment).
IDLE = float(os.environ.get("LEASEFS_JEPSEN_IDLE", "0"))


def worker(mount, name, log_path, until, ops):
    """Loop lock / read epoch / increment the guarded register / unlock."""
    log = open(log_path, "a", buffering=1)

    def note(**kv):
        kv["w"] = name
        log.write(json.dumps(kv) + "\n")

    signal.signal(signal.SIGALRM, lambda *_: None)
    lease = os.path.join(mount, "x")
    reg = os.path.join(mount, "reg")
    while now() < until:
        try:
            fd = os.open(lease, os.O_RDWR)
        except OSError as e:
            # An open asks etcd (close-to-open): EIO while it is unreachable.
            note(op="open_failed", inv=now(), ok=now(), err=errno.errorcode.get(e.errno, str(e.errno)))
            time.sleep(0.05)
            continue
        inv = now()
        signal.alarm(5)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            signal.alarm(0)
            note(op="lock_failed", inv=inv, ok=now(), err=errno.errorcode.get(e.errno, str(e.errno)))
            os.close(fd)
            time.sleep(0.05)
            continue
        signal.alarm(0)
        granted = now()
        try:
            epoch = int(os.getxattr(fd, "user.leasefs.epoch"))
        except OSError as e:
            note(op="epoch_failed", inv=inv, ok=now(), err=errno.errorcode.get(e.errno, str(e.errno)))
            os.close(fd)
            continue
        note(op="grant", epoch=epoch, inv=inv, ok=granted)
        g = None
        # Most holds are short; some last seconds, so that faults land in
        # the middle of holds (a holder must then be fenced, not write on).
        pause = random.uniform(0.3, 1.0) if random.random() < 0.25 else random.uniform(0, 0.15)
        for _ in range(ops):
            winv = now()
            value = None
            try:
                if g is None:
                    g = os.open(reg, os.O_RDWR)
                value = int(os.pread(g, 64, 0) or b"0") + 1
                os.pwrite(g, b"%-20d" % value, 0)
                note(op="inc", epoch=epoch, inv=winv, ok=now(), value=value)
                time.sleep(pause)
            except OSError as e:
                note(op="refused", epoch=epoch, inv=winv, ok=now(), err=errno.errorcode.get(e.errno, str(e.errno)),
                     value=value)
                if e.errno == errno.ESTALE:
                    # Its hold was lost: the token is a right, it must
                    # learn no epoch (SPEC 5), by descriptor or by path.
                    for how, target in (("descriptor", fd), ("path", lease)):
                        rinv = now()
                        try:
                            got = str(int(os.getxattr(target, "user.leasefs.epoch")))
                        except OSError as e2:
                            got = errno.errorcode.get(e2.errno, str(e2.errno))
                        note(op="lost_read", epoch=epoch, how=how, inv=rinv, ok=now(), got=got)
                break
        if g is not None:
            os.close(g)
        note(op="release", epoch=epoch, inv=now())
        os.close(fd)
        # --idle: a pause between holds, so that the same host often takes
        # the lease again with nobody in its way (a solo grant).
        time.sleep(random.uniform(0, IDLE))


def observer(mounts, log_path, until):
    """Read the lease's epoch by path on every host, round after round: no
    read may show an epoch below one whose grant completed, anywhere,
    before the read began (fencing facts are linearizable, SPEC 10)."""
    log = open(log_path, "a", buffering=1)
    while now() < until:
        for host, d in mounts.items():
            inv = now()
            try:
                epoch = int(os.getxattr(os.path.join(d, "x"), "user.leasefs.epoch"))
                log.write(json.dumps({"op": "read", "host": host, "epoch": epoch, "inv": inv, "ok": now()}) + "\n")
            except OSError:
                pass            # EIO while etcd cannot be reached: nothing shown
        time.sleep(0.01)


# ---------------------------------------------------------------- the harness


class Harness:
    def __init__(self, leasefs, work, lock_delay=None):
        self.leasefs = leasefs
        self.work = work
        self.lock_delay = lock_delay
        self.members = []
        self.mounts = {}
        self.daemons = {}
        self.events = []
        tag = os.getpid() % 100000
        self.ns = f"lfj{tag}"
        self.host_if, self.ns_if = f"ljh{tag}", f"ljn{tag}"
        # Runs side by side (each its own namespace) use addresses of their own.
        net = 8 + tag % 240
        self.host_ip, self.ns_ip = f"10.214.{net}.1", f"10.214.{net}.2"

    def note(self, what, **kv):
        kv.update(op="nemesis", what=what, at=now())
        self.events.append(kv)

    # network namespace for host c
    def make_netns(self):
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        sh("ip", "link", "set", self.ns_if, "netns", self.ns)
        sh("ip", "addr", "add", self.host_ip + "/30", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        sh("ip", "-n", self.ns, "addr", "add", self.ns_ip + "/30", "dev", self.ns_if)
        sh("ip", "-n", self.ns, "link", "set", self.ns_if, "up")
        sh("ip", "-n", self.ns, "link", "set", "lo", "up")

    def link(self, up):
        sh("ip", "link", "set", self.host_if, "up" if up else "down")

    # etcd
    def start_cluster(self):
        ports = free_ports(6)
        self.ports = [(ports[2 * i], ports[2 * i + 1]) for i in range(3)]
        self.initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(self.ports))
        self.members = [None] * 3
        for i in range(3):
            self.run_member(i)
        self.wait_healthy()

    def run_member(self, i):
        c, p = self.ports[i]
        client = f"http://127.0.0.1:{c}"
        log = open(os.path.join(self.work, f"m{i}.log"), "a")
        self.members[i] = subprocess.Popen(
            ["etcd", "--name", f"m{i}", "--data-dir", os.path.join(self.work, f"m{i}"),
             "--listen-client-urls", f"{client},http://{self.host_ip}:{c}", "--advertise-client-urls", client,
             "--listen-peer-urls", f"http://127.0.0.1:{p}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
             "--initial-cluster", self.initial, "--initial-cluster-token", f"jepsen-{os.getpid()}",
             "--initial-cluster-state", "new", "--heartbeat-interval", "50", "--election-timeout", "500"],
            stdout=subprocess.DEVNULL, stderr=log)

    def endpoints(self, ip="127.0.0.1"):
        return ",".join(f"http://{ip}:{c}" for c, _ in self.ports)

    def status(self, i):
        try:
            out = sh("etcdctl", "--endpoints", f"http://127.0.0.1:{self.ports[i][0]}", "--command-timeout=1s",
                     "endpoint", "status", "-w", "json", check=False).stdout
            s = json.loads(out)[0]["Status"]
            return s["header"]["member_id"], s["leader"]
        except (ValueError, KeyError, IndexError):
            return None

    def wait_healthy(self):
        end = now() + 30
        while now() < end:
            up = [self.status(i) for i in range(3) if self.members[i] is not None]
            if up and all(s and s[1] for s in up):
                return
            time.sleep(0.1)
        raise SystemExit("etcd did not become healthy")

    def leader(self):
        for i in range(3):
            if self.members[i] is not None:
                s = self.status(i)
                if s and s[0] == s[1]:
                    return i
        return None

    def kill_member(self, i):
        if self.members[i] is not None:
            self.members[i].kill()
            self.members[i].wait()
            self.members[i] = None

    # leasefs
    def mount(self, host, in_ns=False):
        d = os.path.join(self.work, host)
        os.makedirs(d)
        ep = self.endpoints(self.host_ip if in_ns else "127.0.0.1")
        cmd = [self.leasefs, "mount", d, "--state-dir", os.path.join(self.work, f"state-{host}"), "--volatile",
               "--etcd", ep, "--etcd-prefix", "jepsen", "--host-ttl", "2s", "--etcd-timeout", "1s",
               "--log-file", os.path.join(self.work, f"{host}.log")]
        if self.lock_delay:
            cmd += ["--lock-delay", self.lock_delay]
        if in_ns:
            cmd = ["nsenter", f"--net=/run/netns/{self.ns}"] + cmd
        subprocess.run(cmd, check=True)
        self.mounts[host] = d
        self.daemons[host] = json.load(open(os.path.join(d, ".leasefs/status")))["pid"]
        # The namespace is shared: the first host creates the lease and the
        # guarded register for all.
        if len(self.mounts) == 1:
            with open(os.path.join(d, "x"), "w"):
                pass
            with open(os.path.join(d, "reg"), "w"):
                pass
            os.setxattr(os.path.join(d, "reg"), "user.leasefs.guard", b"x")

    def cleanup(self):
        for pid in self.daemons.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        try:
            self.link(True)
        except subprocess.CalledProcessError:
            pass
        for d in self.mounts.values():
            if sh("umount", d, check=False).returncode != 0:
                sh("umount", "-l", d, check=False)
        deadline = now() + 10
        for pid in self.daemons.values():
            while now() < deadline:
                try:
                    os.kill(pid, 0)
                    time.sleep(0.05)
                except ProcessLookupError:
                    break
        for i in range(3):
            self.kill_member(i)
        sh("ip", "netns", "del", self.ns, check=False)
        sh("ip", "link", "del", self.host_if, check=False)

    # the nemesis
    def nemesis(self, until, rng):
        faults = ["leader", "member", "freeze", "partition"]
        while now() < until - 6:
            time.sleep(rng.uniform(1.0, 2.5))
            f = rng.choice(faults)
            if f == "leader":
                i = self.leader()
                if i is None:
                    continue
                self.note("kill_leader", member=i)
                self.kill_member(i)
                time.sleep(1.5)
                self.run_member(i)
                self.wait_healthy()
                self.note("member_back", member=i)
            elif f == "member":
                i = rng.randrange(3)
                self.note("restart_member", member=i)
                self.kill_member(i)
                self.run_member(i)
                self.wait_healthy()
                self.note("member_back", member=i)
            elif f == "freeze":
                host = rng.choice(sorted(self.daemons))
                self.note("freeze", host=host)
                os.kill(self.daemons[host], signal.SIGSTOP)
                time.sleep(3.0)  # past the 2 s host TTL
                os.kill(self.daemons[host], signal.SIGCONT)
                self.note("thaw", host=host)
            else:
                self.note("partition", host="c")
                self.link(False)
                time.sleep(3.5)
                self.link(True)
                self.note("heal", host="c")


# ---------------------------------------------------------------- the checker


def check(history, registers):
    grants = sorted((h for h in history if h["op"] == "grant"), key=lambda h: h["ok"])
    incs = [h for h in history if h["op"] == "inc"]
    refusals = [h for h in history if h["op"] == "refused"]
    nemesis = [h for h in history if h["op"] == "nemesis"]
    reads = [h for h in history if h["op"] == "read"]
    lost_reads = [h for h in history if h["op"] == "lost_read"]
    failed = [h for h in history if h["op"] == "epoch_failed"]
    violations = {}

    def violate(kind, text):
        violations.setdefault(kind, text)

    seen = {}
    for g in grants:
        if g["epoch"] in seen:
            violate("epoch granted twice", f"{seen[g['epoch']]} and {g}")
        seen[g["epoch"]] = g
    by_inv = sorted(grants, key=lambda h: h["inv"])
    for g in grants:
        for later in by_inv:
            if later["inv"] > g["ok"] and later["epoch"] <= g["epoch"]:
                violate("epoch went back", f"{g} completed before {later} was invoked")
                break
    # Grants in completion order: the highest epoch completed by each instant.
    done = [(g["ok"], g["epoch"]) for g in grants]

    def highest_granted_before(t):
        best = -1
        for ok, e in done:
            if ok < t:
                best = max(best, e)
        return best

    # Every host shows the current epoch: never one below a grant that
    # completed anywhere before the read began.
    for r in reads:
        newer = highest_granted_before(r["inv"])
        if r["epoch"] < newer:
            violate("stale epoch read", f"host {r['host']} read {r['epoch']} after epoch {newer} was granted: {r}")
    # A lost holder learns no token: ESTALE, by descriptor and by path.
    for r in lost_reads:
        if r["got"] != "ESTALE":
            violate("lost holder read a token", f"{r}")
    # No epoch without a holder: consecutive grants differ by one. An epoch
    # may go unseen only when its grant's holder could not read it (its
    # hold lost at once) or a fault cut a host off meanwhile (a waiter on a
    # frozen or cut-off host may be handed the lease before its session
    # expires).
    gaps = {"seen": 0, "explained": 0}
    by_epoch = sorted(grants, key=lambda g: g["epoch"])
    for g, nxt in zip(by_epoch, by_epoch[1:]):
        if nxt["epoch"] - g["epoch"] <= 1:
            continue
        gaps["seen"] += 1
        lo, hi = min(g["inv"], nxt["inv"]) - 4, max(g["ok"], nxt["ok"])
        if any(lo <= f["ok"] <= hi for f in failed) or any(lo <= n["at"] <= hi for n in nemesis):
            gaps["explained"] += 1
        else:
            violate("gap between grants", f"{g} then {nxt}: no grant of the epochs between, and no fault")
    seen_facts = {"gaps": gaps, "reads": len(reads), "lost_reads": len(lost_reads)}
    # A write that failed with EIO may have landed (its answer lost); the
    # register's history says whether it did: its value is in 1..N without
    # an acknowledged write of it.
    values = sorted(i["value"] for i in incs)
    final = max(list(registers.values()) + values + [0])
    unknown = {}
    for r in refusals:
        if r.get("err") == "EIO" and r.get("value") is not None:
            unknown.setdefault(r["value"], r)
    landed = [unknown[v] for v in range(1, final + 1) if v not in set(values) and v in unknown]
    for i in incs + landed:
        newer = highest_granted_before(i["inv"])
        if newer > i["epoch"]:
            violate("write after takeover",
                    f"{i} was invoked after epoch {newer} was granted, and it was accepted")
    explained = {"taken over": 0, "fault": 0, **seen_facts}
    for r in refusals:
        newer = highest_granted_before(r["ok"])
        grant = max((g for g in grants if g["w"] == r["w"] and g["epoch"] == r["epoch"]), key=lambda g: g["ok"])
        # A host also loses its session (and fences its holders) when etcd
        # cannot renew it in time, e.g. across a leader election.
        fault = any(grant["inv"] - 4 <= n["at"] <= r["ok"] for n in nemesis)
        if newer > r["epoch"]:
            explained["taken over"] += 1
        elif fault:
            explained["fault"] += 1
        else:
            violate("refused while holding", f"{r}: no higher epoch was granted and no fault happened")
    # One register shared by every host (the namespace is shared): the
    # acknowledged increments of all hosts together are 1..N, and every
    # host reads N at the end.
    dup = [v for v in set(values) if values.count(v) > 1][:3]
    lost = [v for v in range(1, final + 1) if v not in set(values) and v not in unknown][:3]
    if dup or lost:
        violate("lost or doubled increment", f"repeated: {dup}; neither acknowledged nor in doubt: {lost}")
    for host, reads in registers.items():
        if reads != final:
            violate("register differs", f"host {host}: register reads {reads}, another {final}")
    return violations, explained


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--leasefs", default="target/release/leasefs")
    ap.add_argument("--workers", type=int, default=2, help="per host")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--lock-delay", default=None, metavar="DUR",
                    help="mount every host with --lock-delay DUR (a lost holder's lease is granted after it)")
    ap.add_argument("--idle", type=float, default=0, metavar="SECONDS",
                    help="each worker pauses up to this long between holds (more holds with nobody in the way)")
    ap.add_argument("--worker", nargs=5, metavar=("MOUNT", "NAME", "LOG", "UNTIL", "OPS"), help=argparse.SUPPRESS)
    ap.add_argument("--observer", nargs=3, metavar=("MOUNTS", "LOG", "UNTIL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.idle:
        os.environ["LEASEFS_JEPSEN_IDLE"] = str(a.idle)
    if a.observer:
        observer(json.loads(a.observer[0]), a.observer[1], float(a.observer[2]))
        return 0
    if a.worker:
        m, n, lp, until, ops = a.worker
        worker(m, n, lp, float(until), int(ops))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("jepsen.py mounts filesystems and makes a network namespace: run it as root")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="leasefs-jepsen.")
    h = Harness(os.path.abspath(a.leasefs), work, a.lock_delay)
    procs = []
    try:
        h.make_netns()
        h.start_cluster()
        h.mount("a")
        h.mount("b")
        h.mount("c", in_ns=True)
        until = now() + a.seconds
        log = os.path.join(work, "history.jsonl")
        for host in "abc":
            for k in range(a.workers):
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--worker", h.mounts[host], f"{host}{k}", log,
                     str(until), "3"]))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--observer", json.dumps(h.mounts), log, str(until)]))
        h.nemesis(until, rng)
        try:
            for p in procs:
                p.wait(timeout=a.seconds + 60)
        except subprocess.TimeoutExpired:
            # A worker never came back: show where the workers wait and
            # where each daemon is.
            for p in procs:
                if p.poll() is None:
                    def proc(name):
                        try:
                            return open(f"/proc/{p.pid}/{name}").read().strip()
                        except OSError as e:
                            return str(e)
                    print(f"--- worker {p.args[3]} (pid {p.pid}): state {proc('stat').split(')')[-1].split()[:1]}, "
                          f"wchan {proc('wchan')}\n{proc('stack')}", file=sys.stderr)
            # What each host and etcd believe about the lease.
            for host, d in h.mounts.items():
                for f in ("leases", "status"):
                    r = subprocess.run(["timeout", "5", "cat", os.path.join(d, ".leasefs", f)],
                                       capture_output=True, text=True)
                    print(f"--- {host} .leasefs/{f} ---\n{r.stdout}{r.stderr}", file=sys.stderr)
                try:
                    tail = open(os.path.join(work, f"{host}.log")).read().splitlines()[-30:]
                except OSError as e:
                    tail = [str(e)]
                print(f"--- {host} log (end) ---\n" + "\n".join(tail), file=sys.stderr)
            eps = ",".join(f"http://127.0.0.1:{c}" for c, _ in h.ports)
            for prefix in ("jepsen/q/", "jepsen/epoch/", "jepsen/hosts/"):
                r = subprocess.run(["etcdctl", "--endpoints", eps, "--command-timeout=2s", "get", "--prefix", prefix],
                                   capture_output=True, text=True, env=dict(os.environ, ETCDCTL_API="3"))
                print(f"--- etcd {prefix} ---\n{r.stdout[:4000]}{r.stderr[:500]}", file=sys.stderr)
            try:
                hist = open(log).read().splitlines()[-25:]
            except OSError as e:
                hist = [str(e)]
            print("--- history (end) ---\n" + "\n".join(hist + [json.dumps(e) for e in h.events[-10:]]),
                  file=sys.stderr)
            if shutil.which("gdb"):
                for host, pid in h.daemons.items():
                    bt = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                                        capture_output=True, text=True, timeout=120)
                    print(f"--- daemon {host} (pid {pid}) ---\n{bt.stdout}", file=sys.stderr)
            raise
        registers = {}
        solo = {"granted": 0, "entries_written": 0}
        for host, d in h.mounts.items():
            registers[host] = int(open(os.path.join(d, "reg"), "rb").read().strip() or b"0")
            try:
                st = json.load(open(os.path.join(d, ".leasefs/status")))["etcd"]["solo"]
                for k in solo:
                    solo[k] += st[k]
            except (OSError, ValueError, KeyError):
                pass
        history = [json.loads(line) for line in open(log)] + h.events
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        h.cleanup()
    violations, explained = check(history, registers)
    count = lambda op: sum(1 for x in history if x["op"] == op)
    refused = {}
    for x in history:
        if x["op"] in ("refused", "lock_failed", "open_failed"):
            refused[f"{x['op']} {x['err']}"] = refused.get(f"{x['op']} {x['err']}", 0) + 1
    faults = {}
    for x in h.events:
        faults[x["what"]] = faults.get(x["what"], 0) + 1
    print(f"seed {seed}; {a.seconds:.0f} s; 3 hosts x {a.workers} workers")
    print(f"grants {count('grant')}, increments acknowledged {count('inc')}, registers {registers}")
    print(f"refusals {refused or 'none'}; refused writes after a takeover {explained['taken over']}, "
          f"during a fault {explained['fault']}")
    print(f"epoch reads on every host {explained['reads']}, lost holders' reads {explained['lost_reads']} "
          f"(all ESTALE unless reported), gaps between consecutive grants {explained['gaps']['seen']} "
          f"(explained by a fault or an unread grant: {explained['gaps']['explained']})")
    print(f"nemesis {faults}")
    print(f"solo grants {solo['granted']}, solo holders' entries written by waiters {solo['entries_written']} "
          f"(as the hosts' status counts them since their last mount)")
    if a.lock_delay:
        held_back = 0
        for host in "abc":
            try:
                held_back += open(os.path.join(work, f"{host}.log"), errors="replace").read().count(
                    "granting after the lock delay")
            except OSError:
                pass
        print(f"requests held back by the lock delay ({a.lock_delay}) {held_back}")
    if violations:
        for kind, text in violations.items():
            print(f"VIOLATION {kind}: {text}")
        print(f"history kept in {work}/history.jsonl")
        return 1
    print("no violation")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
