"""A program under test: appends three records to wal/log, retrying a full
disk (ENOSPC) up to five times; prints how many retries it made."""
import errno
import os
import time

fd = os.open("wal/log", os.O_CREAT | os.O_WRONLY | os.O_APPEND)
retries = 0
for rec in [b"one\n", b"two\n", b"three\n"]:
    while True:
        try:
            os.write(fd, rec)
            break
        except OSError as e:
            if e.errno != errno.ENOSPC or retries == 5:
                raise
            retries += 1
            time.sleep(0.01)
print(retries)
