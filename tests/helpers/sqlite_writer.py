"""Commit one row per transaction to an SQLite database in WAL mode, and
print each row's id once its COMMIT returned (the promise a power cut must
keep with synchronous=FULL).

usage: sqlite_writer.py DB SYNCHRONOUS FIRST_ID
"""
import sqlite3
import sys

db, sync, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = sqlite3.connect(db, isolation_level=None)
c.execute("PRAGMA journal_mode=WAL")
c.execute(f"PRAGMA synchronous={sync}")
c.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
print("ready", flush=True)
i = first
while True:
    c.execute("BEGIN")
    c.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * (i % 500)))
    c.execute("COMMIT")
    print(i, flush=True)
    i += 1
