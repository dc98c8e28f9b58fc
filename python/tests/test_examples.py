"""The leasefs fixture's examples (docs/bench.md): a program under test
that retries ENOSPC, one that must notice a lost lock, one that must not
block forever on a hung fsync, one that replaces a file with or without
the syncs a power cut needs. Each program (programs/, shared with the
Rust guard's examples in tests/faults.rs) runs in its own process."""

import os
import subprocess
import sys

import pytest

from leasefs_pytest import FaultRefused

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")


def run(cwd, program, *args):
    r = subprocess.run([sys.executable, os.path.join(PROGRAMS, program), *args], cwd=cwd,
                       capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout.strip()


def test_a_program_that_retries_enospc_keeps_every_record(leasefs):
    (leasefs.path / "wal").mkdir()
    leasefs.fault(op="write", path="wal/*", errno="ENOSPC", after=1, count=2)
    assert run(leasefs.path, "retry_enospc.py") == (0, "2")
    assert (leasefs.path / "wal" / "log").read_text() == "one\ntwo\nthree\n"
    assert [(e["match"], e["errno"]) for e in leasefs.fault_events()] == [(2, "ENOSPC"), (3, "ENOSPC")]


def test_a_program_that_must_notice_its_lost_lock_stops_writing(leasefs):
    (leasefs.path / "job.lease").write_text("")
    leasefs.fault(op="write", path="job.lease", after=1, count=1, lose_lease=True)
    assert run(leasefs.path, "lost_lock.py") == (3, "lost the lock at step 2")
    assert (leasefs.path / "job.lease").read_text() == "step 1\n"
    assert any(e["event"] == "break" and e["reason"] == "fault" for e in leasefs.events())


def test_a_program_must_not_block_forever_on_a_hung_fsync(leasefs):
    leasefs.fault(op="fsync", hang=True)
    assert run(leasefs.path, "hung_fsync.py") == (2, "fsync did not return in time")
    assert [e["action"] for e in leasefs.fault_events()] == ["hang"]
    assert leasefs.release() == 0


def test_a_bad_rule_is_refused_with_its_reason(leasefs):
    with pytest.raises(FaultRefused, match='unknown errno "ENOPE"'):
        leasefs.fault(op="write", errno="ENOPE")
    assert leasefs.rules() == []


def test_a_file_replaced_without_fsync_is_lost_at_a_power_cut_and_with_them_kept(leasefs):
    assert run(leasefs.path, "replace_file.py", "config", "v1") == (0, "replaced")
    report = leasefs.crash()
    assert not (leasefs.path / "config").exists()
    assert [n["name"] for n in report["names"]] == ["config"]
    assert run(leasefs.path, "replace_file.py", "config", "v2", "--fsync") == (0, "replaced")
    assert leasefs.crash()["names"] == []
    assert (leasefs.path / "config").read_text() == "v2"
    # The cut as a rule: at the first fsync of the temporary file.
    leasefs.fault(op="fsync", path="config.tmp", crash=True)
    code, _ = run(leasefs.path, "replace_file.py", "config", "v3", "--fsync")
    assert code != 0
    assert (leasefs.path / "config").read_text() == "v2"
    assert [e["action"] for e in leasefs.fault_events()] == ["crash"]
