"""No epoch without a holder (SPEC 5): waiters that give up never take one.

Usage: ghost.py HOLDER_DIR WAITER_DIR NAME ROUNDS

HOLDER_DIR and WAITER_DIR are the same lease directory on two hosts (or one
mount twice). Each round, this process takes NAME exclusively through
HOLDER_DIR and reads its epoch; a waiter queues for it through WAITER_DIR
and gives up, in turn:

- signal:  a Python waiter whose SIGINT handler raises (it keeps its
           descriptor, as a program that goes on after EINTR does);
- timeout: flock(1) -w (SIGALRM, then it exits 1);
- kill:    flock(1) killed with SIGKILL (its descriptor closed by exit);
- race:    as signal, but the holder releases at the moment the signal is
           sent, so the release may hand the lease to the waiter first.

Except in `race`, the holder releases "at once" after the waiter's wait
ended (its EINTR answered, or it exited): a wait that ended must be out of
every queue by then, or the release hands the lease to a waiter that is
gone, and an epoch is taken with no holder.

Prints one line per round: `KIND HOLDER_EPOCH WAITER` where WAITER is the
epoch the waiter was granted, or `-` when it gave up without a grant. The
caller checks that consecutive grants (holders' and waiters') differ by
exactly one.
"""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

holder_dir, waiter_dir, name, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
hpath, wpath = os.path.join(holder_dir, name), os.path.join(waiter_dir, name)
DEADLINE = 20.0

WAITER = r"""
import fcntl, json, os, signal, sys
class Stop(Exception):
    pass
def stop(*_):
    raise Stop()
signal.signal(signal.SIGINT, stop)
fd = os.open(sys.argv[1], os.O_RDWR)
print("open", flush=True)
try:
    fcntl.flock(fd, fcntl.LOCK_EX)
except Stop:
    pass
# The signal may come just after a grant: what counts is whether it holds.
holders = json.loads(os.getxattr(fd, "user.leasefs.holder"))
mine = any(h.get("pid") == os.getpid() for h in holders["holders"])
print(holders["epoch"] if mine else "-", flush=True)
sys.stdin.read()                      # keeps its descriptor until told
"""


def awaited(d):
    with open(os.path.join(d, ".leasefs/status")) as f:
        return json.load(f)["leases"]["awaited"]


def until(what, cond):
    end = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > end:
            sys.exit("timed out: " + what)
        time.sleep(0.002)


def hold():
    fd = os.open(hpath, os.O_RDWR)
    end = time.monotonic() + DEADLINE
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > end:
                sys.exit("the lease stayed held with nobody holding it")
            time.sleep(0.002)
    return fd, int(os.getxattr(fd, "user.leasefs.epoch"))


kinds = ["signal", "timeout", "kill", "race"]
for i in range(rounds):
    kind = kinds[i % len(kinds)]
    fd, epoch = hold()
    granted = "-"
    if kind in ("signal", "race"):
        w = subprocess.Popen([sys.executable, "-c", WAITER, wpath], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert w.stdout.readline().strip() == "open"
        until("the waiter never queued", lambda: awaited(waiter_dir) >= 1)
        w.send_signal(signal.SIGINT)
        if kind == "race":
            os.close(fd)
        granted = w.stdout.readline().strip()
        if kind != "race":
            os.close(fd)
        w.stdin.close()
        w.wait(DEADLINE)
    elif kind == "timeout":
        w = subprocess.Popen(["flock", "-w", "0.3", wpath, "getfattr", "--only-values", "-n",
                              "user.leasefs.epoch", wpath], stdout=subprocess.PIPE, text=True)
        out, _ = w.communicate(timeout=DEADLINE)
        assert w.returncode == 1, (w.returncode, out)
        os.close(fd)
    else:
        w = subprocess.Popen(["flock", wpath, "true"])
        until("the waiter never queued", lambda: awaited(waiter_dir) >= 1)
        w.kill()
        w.wait(DEADLINE)
        os.close(fd)
    print(kind, epoch, granted, flush=True)
fd, epoch = hold()
print("end", epoch, "-", flush=True)
