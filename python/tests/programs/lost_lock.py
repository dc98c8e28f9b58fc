"""A program under test: holds job.lease and writes three steps through it;
when a write says the lease is lost (ESTALE) it stops and exits 3."""
import errno
import fcntl
import os
import sys

fd = os.open("job.lease", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
for step in range(1, 4):
    try:
        os.write(fd, b"step %d\n" % step)
    except OSError as e:
        if e.errno == errno.ESTALE:
            print("lost the lock at step", step)
            sys.exit(3)
        raise
