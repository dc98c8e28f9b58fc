"""Lease churn: N cycles of create (O_EXCL), write 4 KiB, flock, unlock,
close, unlink, each with a name never used before.

usage: churn.py DIR N [PREFIX]
"""
import fcntl
import os
import sys

d, n = sys.argv[1], int(sys.argv[2])
prefix = sys.argv[3] if len(sys.argv) > 3 else "c"
block = b"x" * 4096
for i in range(n):
    p = os.path.join(d, f"{prefix}{i}.lease")
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    os.write(fd, block)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    os.unlink(p)
print("ok", n)
