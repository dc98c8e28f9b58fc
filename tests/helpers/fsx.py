"""fsx-style randomized I/O check: random writes, reads, truncates, hole
punches, and reads and writes through a shared mapping, on one file, against
an in-memory model; every read is compared with the model.

usage: fsx.py FILE OPS SEED
Prints "ok N ops" or exits 1 naming the first operation that disagreed.
"""
import mmap
import os
import ctypes
import random
import sys

libc = ctypes.CDLL(None, use_errno=True)

path, ops, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
MAX = 256 * 1024
PAGE = 4096
fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o644)
model = bytearray()
log = []


def fail(what):
    sys.stderr.write(f"seed {seed}: op {len(log)} {what}\nlast ops: {log[-10:]}\n")
    sys.exit(1)


def check(off, got):
    want = bytes(model[off:off + len(got)])
    if got != want:
        first = next(i for i in range(len(got)) if i >= len(want) or got[i] != want[i])
        fail(f"read at {off}: byte {off + first} is {got[first]:#x}, model says "
             f"{want[first] if first < len(want) else 'EOF'}")


for _ in range(ops):
    op = rng.choice(["write", "write", "read", "read", "truncate", "punch", "mapread", "mapwrite", "fsync"])
    size = len(model)
    if op == "write":
        off, n = rng.randrange(MAX), rng.randrange(1, 16384)
        data = rng.randbytes(n)
        os.pwrite(fd, data, off)
        if off > size:
            model.extend(b"\0" * (off - size))
        model[off:off + n] = data
    elif op == "read":
        off, n = rng.randrange(MAX), rng.randrange(1, 16384)
        got = os.pread(fd, n, off)
        if len(got) != max(0, min(len(model), off + n) - off):
            fail(f"read of {n} at {off} returned {len(got)} bytes, model size {len(model)}")
        check(off, got)
    elif op == "truncate":
        n = rng.randrange(MAX)
        os.ftruncate(fd, n)
        model = model[:n] + bytearray(max(0, n - len(model)))
    elif op == "punch" and size > 0:
        off = rng.randrange(size)
        n = rng.randrange(1, 3 * PAGE)
        # fallocate(FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE)
        if libc.fallocate(fd, 3, ctypes.c_long(off), ctypes.c_long(n)) != 0:
            fail(f"punch hole: errno {ctypes.get_errno()}")
        end = min(size, off + n)
        model[off:end] = bytes(end - off)
    elif op in ("mapread", "mapwrite") and size > 0:
        m = mmap.mmap(fd, size, mmap.MAP_SHARED)
        off = rng.randrange(size)
        n = min(size - off, rng.randrange(1, 16384))
        if op == "mapread":
            check(off, m[off:off + n])
        else:
            data = rng.randbytes(n)
            m[off:off + n] = data
            model[off:off + n] = data
            m.flush()
        m.close()
    elif op == "fsync":
        os.fsync(fd)
    log.append(op)
    if os.fstat(fd).st_size != len(model):
        fail(f"size {os.fstat(fd).st_size}, model says {len(model)}")

check(0, os.pread(fd, MAX * 2, 0))
os.close(fd)
print(f"ok {ops} ops")
