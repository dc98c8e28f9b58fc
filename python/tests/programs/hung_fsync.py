"""A program under test: gives its fsync 300 ms, then gives up and exits 2
(with the fsync still held: the process must still end)."""
import os
import threading

fd = os.open("data", os.O_CREAT | os.O_WRONLY)
os.write(fd, b"x")
t = threading.Thread(target=os.fsync, args=(fd,), daemon=True)
t.start()
t.join(0.3)
if t.is_alive():
    print("fsync did not return in time")
    os._exit(2)
