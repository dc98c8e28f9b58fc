"""Run a command as a child subreaper and report what it left behind.

`reaper.py COMMAND...` runs COMMAND (its stderr merged into stdout), and
when it exits prints one JSON line: its exit code and the pids of every
process of its tree that outlived it, alive or unreaped (they were
re-parented to us); those are then killed and reaped.
"""
import ctypes
import json
import os
import subprocess
import sys

PR_SET_CHILD_SUBREAPER = 36
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
code = subprocess.Popen(sys.argv[1:], stderr=subprocess.STDOUT).wait()
left = set()
while True:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid:
        left.add(pid)
        continue
    for d in os.listdir("/proc"):
        try:
            ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid():
            left.add(int(d))
            os.kill(int(d), 9)
print(json.dumps({"code": code, "left": sorted(left)}), flush=True)
