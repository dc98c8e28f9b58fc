"""A process tree for the `leasefs lock` tests.

`tree.py top DIR EXIT MEMBERS` starts the members named in MEMBERS (comma
separated) and prints `started` once every one of them runs:
  bg        a background child
  daemon    a double-forked child in a session of its own (setsid)
  stubborn  a child that ignores SIGTERM
  stopped   a child stopped with SIGSTOP
Then it exits with EXIT, or waits for a signal when EXIT is `stay`.
Every member (top too) writes DIR/NAME.pid once it takes signals and
appends `NAME SIGNAL` to DIR/signals for each SIGTERM, SIGINT or SIGHUP it
gets, one at a time (blocked and waited for, so a SIGTERM that follows a
SIGHUP closely cannot interrupt its recording); all but the stubborn one's
SIGTERM end it with status 0.
"""
import os
import signal
import subprocess
import sys
import time

ME = os.path.abspath(__file__)


SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def record(d, name):
    """Block the recorded signals (they are taken one at a time by
    `signals`, so a second one cannot cut short the recording of the first,
    as it could interrupt a Python handler) and write the pid file."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    tmp = os.path.join(d, f".{name}.pid")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(d, f"{name}.pid"))


def signals(d, name, stubborn):
    """Record each signal as it comes; end on it (but the stubborn one
    outlives SIGTERM)."""
    while True:
        sig = signal.sigwaitinfo(SIGNALS).si_signo
        fd = os.open(os.path.join(d, "signals"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, f"{name} {signal.Signals(sig).name}\n".encode())
        os.close(fd)
        if not (stubborn and sig == signal.SIGTERM):
            os._exit(0)


def wait_for(path):
    deadline = time.monotonic() + 20
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"{path} never appeared")
        time.sleep(0.01)
    return int(open(path).read())


def member(d, name, stubborn):
    record(d, name)
    signals(d, name, stubborn)


def top(d, exit, members):
    record(d, "top")
    for m in members:
        if m == "daemon":
            pid = os.fork()
            if pid == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execv(sys.executable, [sys.executable, ME, "member", d, m])
                os._exit(0)
            os.waitpid(pid, 0)
        else:
            subprocess.Popen([sys.executable, ME, "member", d, m] + (["stubborn"] if m == "stubborn" else []))
    for m in members:
        pid = wait_for(os.path.join(d, f"{m}.pid"))
        if m == "stopped":
            os.kill(pid, signal.SIGSTOP)
            while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
                time.sleep(0.01)
    print("started", flush=True)
    if exit != "stay":
        sys.exit(int(exit))
    signals(d, "top", False)


if __name__ == "__main__":
    if sys.argv[1] == "top":
        top(sys.argv[2], sys.argv[3], [m for m in sys.argv[4].split(",") if m])
    else:
        member(sys.argv[2], sys.argv[3], len(sys.argv) > 4)
