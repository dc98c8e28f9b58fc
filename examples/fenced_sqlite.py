#!/usr/bin/env python3
"""A service that takes its lease with Python's filelock and passes the
lease's epoch to SQLite as a fencing token.

    fenced_sqlite.py LEASE_DIR DB NAME [PAUSE_SECONDS]

The database keeps the highest token it has accepted and refuses a write
that carries a lower one. A process that was paused (GC, SIGSTOP, a slow
disk) while holding the lease, and lost it meanwhile, comes back with the
old token: its write is refused even if it still believes it holds the
lease. PAUSE_SECONDS makes this process stop that long between taking the
lease and writing (to show that).
"""
import os
import sqlite3
import sys
import time

import filelock

lease_dir, db_path, name = sys.argv[1:4]
pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
lease = os.path.join(lease_dir, "service.lock")

db = sqlite3.connect(db_path, isolation_level=None, timeout=30)
db.execute("CREATE TABLE IF NOT EXISTS fence (id INTEGER PRIMARY KEY CHECK (id = 0), token INTEGER NOT NULL)")
db.execute("INSERT OR IGNORE INTO fence VALUES (0, 0)")
db.execute("CREATE TABLE IF NOT EXISTS log (token INTEGER NOT NULL, who TEXT NOT NULL)")


def fenced_write(token, who):
    """Write only if no higher token was seen; atomically raise the fence."""
    db.execute("BEGIN IMMEDIATE")
    raised = db.execute("UPDATE fence SET token = ? WHERE id = 0 AND token <= ?", (token, token)).rowcount
    if raised == 0:
        db.execute("ROLLBACK")
        return False
    db.execute("INSERT INTO log VALUES (?, ?)", (token, who))
    db.execute("COMMIT")
    return True


lock = filelock.FileLock(lease, timeout=30)
with lock:
    token = int(os.getxattr(lease, "user.leasefs.epoch"))
    print(f"{name}: holding the lease with token {token}", flush=True)
    time.sleep(pause)
    ok = fenced_write(token, name)
    print(f"{name}: write with token {token} {'accepted' if ok else 'refused (a newer holder wrote)'}", flush=True)
sys.exit(0 if ok else 3)
