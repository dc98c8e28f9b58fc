"""The leasefs fixture's examples (docs/bench.md): a program under test
that retries ENOSPC, one that must notice a lost lock, one that must not
block forever on a hung fsync. Each program runs in its own process."""

import subprocess
import sys

import pytest

from leasefs_pytest import FaultRefused


def run(cwd, program):
    r = subprocess.run([sys.executable, "-c", program], cwd=cwd, capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout.strip()


RETRIES = r"""
import errno, os, time
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
"""


def test_a_program_that_retries_enospc_keeps_every_record(leasefs):
    (leasefs.path / "wal").mkdir()
    leasefs.fault(op="write", path="wal/*", errno="ENOSPC", after=1, count=2)
    assert run(leasefs.path, RETRIES) == (0, "2")
    assert (leasefs.path / "wal" / "log").read_text() == "one\ntwo\nthree\n"
    assert [(e["match"], e["errno"]) for e in leasefs.fault_events()] == [(2, "ENOSPC"), (3, "ENOSPC")]


LOST_LOCK = r"""
import errno, fcntl, os, sys
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
"""


def test_a_program_that_must_notice_its_lost_lock_stops_writing(leasefs):
    (leasefs.path / "job.lease").write_text("")
    leasefs.fault(op="write", path="job.lease", after=1, count=1, lose_lease=True)
    assert run(leasefs.path, LOST_LOCK) == (3, "lost the lock at step 2")
    assert (leasefs.path / "job.lease").read_text() == "step 1\n"
    assert any(e["event"] == "break" and e["reason"] == "fault" for e in leasefs.events())


HUNG_FSYNC = r"""
import os, threading
fd = os.open("data", os.O_CREAT | os.O_WRONLY)
os.write(fd, b"x")
t = threading.Thread(target=os.fsync, args=(fd,), daemon=True)
t.start()
t.join(0.3)
if t.is_alive():
    print("fsync did not return in time")
    os._exit(2)
"""


def test_a_program_must_not_block_forever_on_a_hung_fsync(leasefs):
    leasefs.fault(op="fsync", hang=True)
    assert run(leasefs.path, HUNG_FSYNC) == (2, "fsync did not return in time")
    assert [e["action"] for e in leasefs.fault_events()] == ["hang"]
    assert leasefs.release() == 0


def test_a_bad_rule_is_refused_with_its_reason(leasefs):
    with pytest.raises(FaultRefused, match='unknown errno "ENOPE"'):
        leasefs.fault(op="write", errno="ENOPE")
    assert leasefs.rules() == []
