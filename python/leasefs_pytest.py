"""A pytest plugin for the leasefs test bench.

The ``leasefs`` fixture mounts a volatile leasefs (``--volatile --bench``)
in the test's ``tmp_path``, lets the test add fault rules and read the
fault events, and always unmounts it afterwards::

    def test_retries_a_full_disk(leasefs):
        (leasefs.path / "wal").mkdir()
        leasefs.fault(op="write", path="wal/*", errno="ENOSPC", after=1, count=2)
        run_my_program(leasefs.path)
        assert [e["errno"] for e in leasefs.fault_events()] == ["ENOSPC", "ENOSPC"]

The fixture drives the ``leasefs`` command line: ``$LEASEFS_BIN``, else
``leasefs`` on ``PATH``. Install with ``pip install ./python`` from the
leasefs repository (or put this directory on ``PYTHONPATH`` and run
``pytest -p leasefs_pytest``).
"""

import json
import os
import shutil
import subprocess

import pytest

TIMEOUT = 30


class FaultRefused(Exception):
    """A rule the mount refused; the message says why."""


class LeaseFS:
    """A mounted leasefs: its path, its fault rules, its events."""

    def __init__(self, binary, path, state):
        self.binary = binary
        self.path = path
        subprocess.run(
            [binary, "mount", str(path), "--volatile", "--bench", "--state-dir", str(state)],
            check=True,
            timeout=TIMEOUT,
            capture_output=True,
        )
        # Opened as the mount went live: every event from then on.
        self._events = os.open(os.path.join(path, ".leasefs", "events"), os.O_RDONLY | os.O_NONBLOCK)
        self._seen = []
        self._partial = b""

    def _cli(self, *args, command="fault"):
        r = subprocess.run(
            [self.binary, command, *args[:1], str(self.path), *args[1:]] if command == "fault"
            else [self.binary, command, str(self.path), *args],
            timeout=TIMEOUT,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise FaultRefused(r.stderr.strip().removeprefix(f"leasefs {command}: "))
        return r.stdout.strip()

    def fault(self, *, op=None, path=None, pid=None, uid=None, comm=None, cgroup=None,
              probability=None, seed=None, after=None, count=None,
              errno=None, delay=None, hang=False, short=None, lose_lease=False, crash=False):
        """Add a rule (the options of ``leasefs fault add``); its id.

        ``op`` is a name or a list of names; ``delay`` a duration such as
        ``"2s"`` or a number of seconds."""
        args = []
        for o in [op] if isinstance(op, str) else (op or []):
            args += ["--op", o]
        for flag, value in [("--path", path), ("--pid", pid), ("--uid", uid), ("--comm", comm),
                            ("--cgroup", cgroup), ("--probability", probability), ("--seed", seed),
                            ("--after", after), ("--count", count), ("--errno", errno),
                            ("--short", short)]:
            if value is not None:
                args += [flag, str(value)]
        if delay is not None:
            args += ["--delay", delay if isinstance(delay, str) else f"{int(delay * 1000)}ms"]
        if hang:
            args.append("--hang")
        if lose_lease:
            args.append("--lose-lease")
        if crash:
            args.append("--crash")
        return int(self._cli("add", *args))

    def crash(self, kill=False):
        """Cut the power: the mount keeps only what was synced; descriptors
        opened before answer EIO (``kill``: their processes are SIGKILLed,
        this one too if it holds any). Returns the report: ``files`` (path,
        size before and after, lost byte ranges), ``names`` (dir, name,
        inode before and after), ``gone``, ``descriptors``, ``killed``."""
        out = self._cli("--report", *(["--kill"] if kill else []), command="crash")
        return json.loads(out)

    def remove(self, rule):
        """Remove a rule (what it holds goes on)."""
        self._cli("del", str(rule))

    def clear(self):
        """Remove every rule."""
        self._cli("clear")

    def release(self, rule=None):
        """Let hung requests (of one rule, or all) go on; how many there were."""
        return int(self._cli("release", *([] if rule is None else [str(rule)])))

    def rules(self):
        """The rules in force with their ``matches`` and ``fired`` counts."""
        return [json.loads(l) for l in self._cli("list", "--json").splitlines() if l]

    def events(self):
        """Every event since the mount went live, as dicts."""
        while True:
            try:
                chunk = os.read(self._events, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        self._seen += [json.loads(l) for l in lines if l]
        return list(self._seen)

    def fault_events(self):
        """The ``fault`` events since the mount went live."""
        return [e for e in self.events() if e["event"] == "fault"]

    def unmount(self):
        if self._events is not None:
            os.close(self._events)
            self._events = None
            subprocess.run([self.binary, "unmount", str(self.path)], timeout=TIMEOUT, capture_output=True)


@pytest.fixture
def leasefs(tmp_path):
    """A volatile leasefs mounted for this test, unmounted afterwards."""
    binary = os.environ.get("LEASEFS_BIN") or shutil.which("leasefs")
    if binary is None:
        pytest.fail("the leasefs binary is neither $LEASEFS_BIN nor on PATH")
    mount = tmp_path / "mnt"
    mount.mkdir()
    fs = LeaseFS(binary, mount, tmp_path / "state")
    try:
        yield fs
    finally:
        fs.unmount()
