#!/usr/bin/env python3
"""Leader election by a JSON lease renewed with rename (the pattern of
services that keep `{"leader": ..., "until": ...}` in a file and replace it
atomically).

    leader.py LEASE_DIR NAME [TTL_SECONDS] [ROUNDS] [PAUSE_IN_ROUND_2]

Each round reads the lease; if it is free, expired or ours, writes a new one
to a temporary file and renames it over the lease. On leasefs the rename is
a compare-and-swap: if the lease changed since this process read it (a
standby took over while we were paused), the rename fails with ESTALE and
changes nothing, so a frozen incumbent that wakes up cannot clobber the new
leader. On an ordinary filesystem the same rename silently succeeds and
there are two leaders. PAUSE_IN_ROUND_2 stops this process that long
between reading and renaming in its second round (a GC pause, SIGSTOP).
Exits 4 when it lost the lease that way.
"""
import errno
import json
import os
import sys
import time

lease_dir, name = sys.argv[1:3]
ttl = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
pause = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
lease = os.path.join(lease_dir, "leader.json")

for n in range(1, rounds + 1):
    try:
        with open(lease) as f:
            current = json.load(f)
    except FileNotFoundError:
        current = None
    now = time.time()
    if current and current["leader"] != name and current["until"] > now:
        print(f"{name}: following {current['leader']}", flush=True)
        time.sleep(ttl / 2)
        continue
    if n == 2 and pause:
        print(f"{name}: pausing {pause}s before renewing", flush=True)
        time.sleep(pause)
    tmp = f"{lease}.{name}.tmp"
    with open(tmp, "w") as f:
        json.dump({"leader": name, "until": time.time() + ttl}, f)
    try:
        os.rename(tmp, lease)
    except OSError as e:
        os.unlink(tmp)
        if e.errno != errno.ESTALE:
            raise
        print(f"{name}: lost the lease (ESTALE): another process took it while we were paused", flush=True)
        sys.exit(4)
    print(f"{name}: leader (round {n})", flush=True)
    time.sleep(ttl / 3)
