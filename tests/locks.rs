//! Locks implemented by the daemon: flock(1), POSIX and OFD locks, cancellable
//! waits, fairness, epochs and lease identity, all driven from separate
//! processes.

use std::time::{Duration, Instant};

use crate::util::{epoch, py_ok, sh, sh_code, sh_ok, Bg, Mount};

const HOLD: &str = "flock L sh -c 'echo ready; exec sleep 60'";

#[test]
fn flock_nonblocking_timeout_and_exit_codes() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let _holder = Bg::ready(&m.path, HOLD);
    assert_eq!(sh_code(&m.path, "flock -n L true"), 1, "-n on a held lease exits 1");
    assert_eq!(sh_code(&m.path, "flock -n -E 42 L true"), 42, "-E sets the conflict exit code");
    let t = Instant::now();
    assert_eq!(sh_code(&m.path, "flock -w 1 L true"), 1, "-w 1 times out");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(10), "waited {waited:?}");
}

#[test]
fn shared_with_shared_and_shared_blocks_exclusive() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let _holder = Bg::ready(&m.path, "flock -s L sh -c 'echo ready; exec sleep 60'");
    assert_eq!(sh_code(&m.path, "flock -s -n L true"), 0, "-s with -s succeeds");
    assert_eq!(sh_code(&m.path, "flock -n L true"), 1, "shared blocks exclusive");
    assert_eq!(epoch(&m.path, "L"), 0, "shared locks do not advance the epoch");
}

#[test]
fn unlock_and_close_before_exec() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    // -u releases the lock held on fd 9 although fd 9 stays open.
    assert_eq!(sh_code(&m.path, "exec 9>L; flock 9; flock -u 9; flock -n L true"), 0);
    assert_eq!(sh_code(&m.path, "exec 9>L; flock 9; flock -n L true"), 1);
    // -o: the command does not inherit the lock; killing flock frees it
    // although the command lives on.
    let mut with_o = Bg::exec(&m.path, "flock", &["-o", "L", "sleep", "60"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh_code(&m.path, "flock -n L true") != 1 {
        assert!(Instant::now() < deadline, "flock -o never took the lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    let command = sh_ok(&m.path, &format!("pgrep -P {}", with_o.pid()));
    with_o.signal(libc::SIGKILL);
    with_o.wait(Duration::from_secs(10));
    let code = sh_code(&m.path, "flock -w 5 L true");
    sh_ok(&m.path, &format!("kill -KILL {}", command.trim()));
    assert_eq!(code, 0, "-o: the command did not keep the lock");
}

#[test]
fn blocked_waiters_end_on_signals_and_are_never_in_d_state() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let _holder = Bg::ready(&m.path, HOLD);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        let mut waiter = Bg::exec(&m.path, "flock", &["L", "true"]);
        waiter.wait_blocked();
        for _ in 0..20 {
            assert_ne!(waiter.state(), 'D', "waiter in uninterruptible sleep");
            std::thread::sleep(Duration::from_millis(5));
        }
        waiter.signal(sig);
        // Bounded: a wait the signal does not end fails here (the holder
        // keeps the lease for a minute).
        let st = waiter.wait(Duration::from_secs(10));
        assert!(!st.success(), "signal {sig}: waiter must not get the lock");
    }
    // The lease is still held and still works for the next contender.
    assert_eq!(sh_code(&m.path, "flock -n L true"), 1);
}

/// A waiter signalled while its lock request is on its way to the daemon
/// (here: the daemon is stopped) is interrupted once the daemon runs: a
/// killed waiter dies, a handled signal's handler runs, while the holder
/// keeps the lease. Through io_uring the kernel sends no FUSE_INTERRUPT for
/// a request signalled after it was given a ring entry and before it was
/// copied there (the copy runs on the stopped queue thread); the daemon
/// finds the signal pending.
#[test]
fn waiters_signalled_before_their_request_reached_the_daemon_are_interrupted() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let _holder = Bg::ready(&m.path, HOLD);
    let go = m.dir.path().join("go");
    for sig in [libc::SIGKILL, libc::SIGALRM] {
        let _ = std::fs::remove_file(&go);
        let mut waiter = Bg::ready(
            &m.path,
            &format!(
                r#"exec python3 -c '
import fcntl, os, signal, time
def alarm(signum, frame): raise TimeoutError
signal.signal(signal.SIGALRM, alarm)
fd = os.open("L", os.O_RDWR)
print("ready", flush=True)
while not os.path.exists("{go}"): time.sleep(0.002)
try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("granted", flush=True)
except TimeoutError:
    print("interrupted", flush=True)
'"#,
                go = go.display()
            ),
        );
        let stopped = m.pause();
        std::fs::write(&go, "").unwrap();
        waiter.wait_for_answer();
        waiter.signal(sig);
        std::thread::sleep(Duration::from_millis(50));
        drop(stopped);
        // Bounded well below the holder's 60 s.
        let st = waiter.wait(Duration::from_secs(10));
        if sig == libc::SIGKILL {
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL));
        } else {
            assert!(st.success(), "{st:?}");
            assert_eq!(waiter.output_to_end(), ["interrupted"], "signal {sig}");
        }
    }
    assert_eq!(sh_code(&m.path, "flock -n L true"), 1, "the holder keeps the lease");
}

#[test]
fn killed_holder_frees_the_lease_for_the_waiter_at_once() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let mut holder = Bg::ready(&m.path, "exec flock L sh -c 'echo ready; exec sleep 60'");
    let mut waiter = Bg::ready(&m.path, "echo ready; exec flock L true");
    waiter.wait_blocked();
    // The holder is flock(1) itself (exec), holding the descriptor.
    sh_ok(&m.path, &format!("pkill -KILL -P {} ; kill -KILL {}", holder.pid(), holder.pid()));
    holder.wait(Duration::from_secs(5));
    // Bounded well below the holder's 60 s: the grant follows the kill.
    let st = waiter.wait(Duration::from_secs(10));
    assert!(st.success(), "waiter was not granted: {st:?}");
}

#[test]
fn upgrade_and_downgrade_on_one_descriptor() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let out = py_ok(
        &m.path,
        r#"
import fcntl, os, subprocess
fd = os.open("L", os.O_RDWR)
def other(args):
    return subprocess.run(["flock", "-n"] + args + ["L", "true"]).returncode
fcntl.flock(fd, fcntl.LOCK_SH)
assert other(["-s"]) == 0
fcntl.flock(fd, fcntl.LOCK_EX)           # upgrade
assert other(["-s"]) == 1
e1 = int(os.getxattr("L", "user.leasefs.epoch"))
fcntl.flock(fd, fcntl.LOCK_SH)           # downgrade
assert other(["-s"]) == 0 and other([]) == 1
fcntl.flock(fd, fcntl.LOCK_EX)
fcntl.flock(fd, fcntl.LOCK_EX)           # re-lock by the holder
print(e1, int(os.getxattr(fd, "user.leasefs.epoch")))
"#,
    );
    let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(v[0], 1, "the upgrade made a new exclusive holder");
    assert_eq!(v[1], 2, "re-acquiring after a downgrade is a new exclusive holding; re-lock keeps it");
}

#[test]
fn a_thousand_nonblocking_relocks_never_fail() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let out = sh_ok(&m.path, "for i in $(seq 1000); do flock -n L true || echo FAIL; done");
    assert!(!out.contains("FAIL"), "a spurious EWOULDBLOCK: {} failures", out.lines().count());
    assert_eq!(epoch(&m.path, "L"), 1000, "one epoch per new holder");
}

const PY_LOCKS: &str = r#"
import fcntl, os, struct, sys, time
F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
def lk(fd, cmd, typ, start, length):
    arg = struct.pack("hhqqixxxx", typ, 0, start, length, 0)
    r = fcntl.fcntl(fd, cmd, arg)
    t, _, s, l, pid = struct.unpack("hhqqixxxx", r)
    return t, s, l, pid
"#;

fn py_locks(dir: &std::path::Path, body: &str) -> String {
    py_ok(dir, &format!("{PY_LOCKS}\n{body}"))
}

#[test]
fn posix_ranges_getlk_reports_holder_and_close_releases() {
    let m = Mount::new();
    let out = py_locks(
        &m.path,
        r#"
import subprocess
open("R", "w").write("x" * 200)
fd = os.open("R", os.O_RDWR)
lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 0, 100)
lk(fd, fcntl.F_SETLK, fcntl.F_UNLCK, 40, 20)
probe = '''
import fcntl, os, struct, sys
fd = os.open("R", os.O_RDWR)
def get(start):
    r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqixxxx", fcntl.F_WRLCK, 0, start, 1, 0))
    t, _, s, l, pid = struct.unpack("hhqqixxxx", r)
    return (t, s, l, pid) if t != fcntl.F_UNLCK else "free"
print(get(50), get(60), get(10), sep="|")
'''
out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip().split("|")
assert out[0] == "free", out
assert out[1] == f"(1, 60, 40, {os.getpid()})", out   # F_WRLCK, split remainder 60..99
assert out[2] == f"(1, 0, 40, {os.getpid()})", out
# Closing ANY descriptor of the file releases the process's POSIX locks.
fd2 = os.open("R", os.O_RDONLY); os.close(fd2)
out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
assert out.strip() == "free|free|free", out
print("ok")
"#,
    );
    assert_eq!(out.trim(), "ok");
}

#[test]
fn posix_locks_survive_other_processes_closes_and_are_not_inherited() {
    let m = Mount::new();
    let out = py_locks(
        &m.path,
        r#"
open("R", "w").write("x")
fd = os.open("R", os.O_RDWR)
lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 0, 0)
pid = os.fork()
if pid == 0:
    # Not inherited: the child is another owner and conflicts.
    try:
        lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 0, 0); os._exit(3)
    except BlockingIOError:
        pass
    os.close(fd)           # the child's close must not release the parent's lock
    os._exit(0)
_, st = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(st) == 0, st
import subprocess, sys
r = subprocess.run(["flock", "-n", "R", "true"]).returncode
assert r == 1, "the parent's whole-file write lock must still hold"
print("ok")
"#,
    );
    assert_eq!(out.trim(), "ok");
}

#[test]
fn deadlock_cycle_gets_edeadlk() {
    let m = Mount::new();
    let out = py_locks(
        &m.path,
        r#"
import errno, json, signal
open("R", "w").write("xx")
r, w = os.pipe()
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    fd = os.open("R", os.O_RDWR)
    lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 1, 1)
    os.write(w, b"1")
    os.read(r2, 1)   # the parent holds byte 0
    signal.alarm(20)
    lk(fd, fcntl.F_SETLKW, fcntl.F_WRLCK, 0, 1)   # waits for the parent
    os._exit(0)
fd = os.open("R", os.O_RDWR)
os.read(r, 1)   # the child holds byte 1
lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 0, 1)
os.write(w2, b"1")
# Until the child's wait is parked in the daemon.
deadline = time.time() + 20
while json.load(open(".leasefs/status"))["leases"]["awaited"] < 1:
    assert time.time() < deadline, "the child's wait never parked"
    time.sleep(0.01)
try:
    lk(fd, fcntl.F_SETLKW, fcntl.F_WRLCK, 1, 1)
    print("no deadlock detected")
except OSError as e:
    assert e.errno == errno.EDEADLK, e
    print("EDEADLK")
os.close(fd)
os.waitpid(pid, 0)
"#,
    );
    assert_eq!(out.trim(), "EDEADLK");
}

#[test]
fn ofd_locks_are_released_at_last_close() {
    let m = Mount::new();
    let out = py_locks(
        &m.path,
        r#"
import subprocess
open("R", "w").write("x")
fd = os.open("R", os.O_RDWR)
lk(fd, F_OFD_SETLK, fcntl.F_WRLCK, 0, 0)
dup = os.dup(fd)
os.close(fd)
held = subprocess.run(["flock", "-n", "R", "true"]).returncode
os.close(dup)
free = subprocess.run(["flock", "-n", "R", "true"]).returncode
print(held, free)
"#,
    );
    assert_eq!(out.trim(), "1 0");
}

#[test]
fn exclusive_waiters_are_served_in_arrival_order_and_not_starved_by_shared() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let holder = Bg::ready(&m.path, "exec flock -s L sh -c 'echo ready; exec sleep 60'");
    let mut waiters = Vec::new();
    for i in 1..=4 {
        let mut w = Bg::spawn(&m.path, &format!("exec flock L sh -c 'echo {i} >> order'"));
        // Make sure each waiter is parked before the next one arrives.
        std::thread::sleep(Duration::from_millis(50));
        w.wait_blocked();
        waiters.push(w);
    }
    // A stream of shared requests cannot overtake the waiting exclusive ones.
    for _ in 0..20 {
        assert_eq!(sh_code(&m.path, "flock -s -n L true"), 1, "shared overtook a waiting exclusive");
    }
    // The child of flock(1) inherits the locked descriptor: kill both.
    sh_ok(&m.path, &format!("pkill -KILL -P {} || true", holder.pid()));
    holder.signal(libc::SIGKILL);
    for w in &mut waiters {
        assert!(w.wait(Duration::from_secs(10)).success());
    }
    assert_eq!(sh_ok(&m.path, "cat order"), "1\n2\n3\n4\n");
}

#[test]
fn epochs_rise_by_one_per_new_exclusive_holder() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    assert_eq!(epoch(&m.path, "L"), 0);
    sh_ok(&m.path, "flock L true; flock L true");
    assert_eq!(epoch(&m.path, "L"), 2, "exclusive flock");
    sh_ok(&m.path, "flock -s L true");
    assert_eq!(epoch(&m.path, "L"), 2, "shared flock");
    py_locks(&m.path, "fd = os.open('L', os.O_RDWR); lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 0, 0); lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 0, 0)");
    assert_eq!(epoch(&m.path, "L"), 3, "whole-file POSIX write lock, re-lock keeps it");
    py_locks(&m.path, "fd = os.open('L', os.O_RDWR); lk(fd, fcntl.F_SETLK, fcntl.F_WRLCK, 0, 10)");
    assert_eq!(epoch(&m.path, "L"), 3, "byte ranges do not count");
    // Never decreases across unlink and re-create.
    sh_ok(&m.path, "rm L && touch L");
    assert_eq!(epoch(&m.path, "L"), 3);
    sh_ok(&m.path, "flock L true");
    assert_eq!(epoch(&m.path, "L"), 4);
    // O_CREAT|O_EXCL creating the file, and link() creating the name.
    py_ok(&m.path, "import os; os.close(os.open('X', os.O_CREAT | os.O_EXCL | os.O_WRONLY))");
    assert_eq!(epoch(&m.path, "X"), 1);
    sh_ok(&m.path, "rm X && touch tmp && ln tmp X");
    assert_eq!(epoch(&m.path, "X"), 2, "link() past the remembered epoch of the path");
    // The dotlock idiom: O_EXCL temp file, link() to the lock name, unlink temp.
    for want in [3, 4] {
        sh_ok(&m.path, "rm X && python3 -c \"import os; os.close(os.open('t2', os.O_CREAT|os.O_EXCL|os.O_WRONLY))\" && ln t2 X && rm t2");
        assert_eq!(epoch(&m.path, "X"), want, "one epoch per dotlock holder");
    }
    // Read-only.
    let o = sh(&m.path, "setfattr -n user.leasefs.epoch -v 99 L");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Operation not permitted"), "{o:?}");
    assert_eq!(epoch(&m.path, "L"), 4);
}

/// No epoch without a holder (SPEC 5), on one host: 200 waiters give up
/// (a signal with the descriptor kept, flock -w's timeout, SIGKILL, and a
/// signal racing the holder's release) while the holder releases at once;
/// every grant is one above the one before.
#[test]
fn a_wait_that_ends_without_a_grant_never_takes_an_epoch() {
    let m = Mount::new();
    sh_ok(&m.path, "touch lk4");
    crate::util::no_epoch_without_a_holder(&m.path, &m.path, "lk4", 200);
}

#[test]
fn holder_reads_its_epoch_from_its_descriptor() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L && flock L true && flock L true");
    let out = py_ok(
        &m.path,
        "import fcntl, os\nfd = os.open('L', os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint(os.getxattr(fd, 'user.leasefs.epoch').decode())",
    );
    assert_eq!(out.trim(), "3");
}

#[test]
fn unlinked_lease_keeps_its_identity_and_holder() {
    let m = Mount::new();
    sh_ok(&m.path, "touch db.backend-lease");
    let ino_before = sh_ok(&m.path, "stat -c %i db.backend-lease");
    let mut a = Bg::ready(&m.path, "flock db.backend-lease sh -c 'echo ready; exec sleep 60'");
    let epoch_a = epoch(&m.path, "db.backend-lease");
    sh_ok(&m.path, "rm db.backend-lease");
    assert!(sh(&m.path, "stat db.backend-lease").status.code() != Some(0), "the name is gone (POSIX)");
    let out = py_ok(
        &m.path,
        r#"
import errno, fcntl, os
fd = os.open("db.backend-lease", os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print("B got the lease")
except BlockingIOError as e:
    assert e.errno == errno.EWOULDBLOCK
print(os.fstat(fd).st_ino, os.getxattr("db.backend-lease", "user.leasefs.epoch").decode())
"#,
    );
    let mut parts = out.split_whitespace();
    assert_eq!(parts.next().unwrap(), ino_before.trim(), "re-created path has the same inode: {out}");
    assert_eq!(parts.next().unwrap().parse::<u64>().unwrap(), epoch_a);
    assert_eq!(sh_code(&m.path, "flock -n db.backend-lease true"), 1, "third contender refused");
    a.kill_all();
    assert_eq!(sh_code(&m.path, "flock -w 10 db.backend-lease true"), 0, "after A releases, B can lock");
}

#[test]
fn rename_over_a_lease_in_use_keeps_inode_lock_and_replaces_content() {
    let m = Mount::new();
    sh_ok(&m.path, "echo old > lease");
    let ino = sh_ok(&m.path, "stat -c %i lease");
    let holder = Bg::ready(&m.path, "exec 9<>lease; flock 9; echo ready; exec sleep 60");
    let reader = py_ok(
        &m.path,
        r#"
import os, subprocess
fd = os.open("lease", os.O_RDONLY)
assert os.pread(fd, 100, 0) == b"old\n"
subprocess.run(["sh", "-c", "echo new-content > tmp && mv tmp lease"], check=True)
print(os.pread(fd, 100, 0).decode().strip())
"#,
    );
    assert_eq!(reader.trim(), "new-content", "open descriptors see the new content");
    assert_eq!(sh_ok(&m.path, "stat -c %i lease"), ino, "rename over kept the inode");
    assert_eq!(sh_ok(&m.path, "cat lease"), "new-content\n");
    assert!(!m.p("tmp").exists());
    assert_eq!(sh_code(&m.path, "flock -n lease true"), 1, "the lock stays");
    drop(holder);
    // A file never used as a lease keeps POSIX semantics.
    sh_ok(&m.path, "echo a > plain");
    let plain = sh_ok(&m.path, "stat -c %i plain");
    sh_ok(&m.path, "echo b > t2 && mv t2 plain");
    assert_ne!(sh_ok(&m.path, "stat -c %i plain"), plain);
}

#[test]
fn moving_a_live_lease_or_its_directory_fails_with_ebusy() {
    let m = Mount::new();
    sh_ok(&m.path, "mkdir -p d/e && touch d/e/L other");
    let _h = Bg::ready(&m.path, "flock d/e/L sh -c 'echo ready; exec sleep 60'");
    for (cmd, what) in [
        ("mv d/e/L d/e/M", "rename(lease, other)"),
        ("mv d e2", "directory containing a lease"),
        ("mv d/e d/f", "parent directory"),
        ("mv other d/e/L", "rename over... is allowed, so check exchange below"),
    ] {
        if what.starts_with("rename over") {
            continue;
        }
        let o = sh(&m.path, cmd);
        assert!(!o.status.success(), "{what}: `{cmd}` succeeded");
        assert!(String::from_utf8_lossy(&o.stderr).contains("busy"), "{what}: {o:?}");
    }
    let out = py_ok(
        &m.path,
        r#"
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
r = libc.renameat2(-100, b"other", -100, b"d/e/L", 2)
print(ctypes.get_errno() if r else 0)
"#,
    );
    assert_eq!(out.trim(), libc::EBUSY.to_string(), "RENAME_EXCHANGE with a live lease");
    assert!(m.p("d/e/L").exists());
}

#[test]
fn corrupting_a_held_lease_lets_nobody_in() {
    let m = Mount::new();
    sh_ok(&m.path, "echo '{\"holder\": 1}' > L");
    let _h = Bg::ready(&m.path, HOLD);
    sh_ok(&m.path, "printf 'garbage' > L; : > L");
    assert_eq!(sh_code(&m.path, "flock -n L true"), 1);
}
