//! TTL leases, breaking, fencing of stale holders and guarded files
//! (SPEC 7), from separate processes.

use std::time::{Duration, Instant};

use crate::util::{epoch, py_ok, sh, sh_code, sh_ok, Bg, Mount};

fn errno_of(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn leasefs_xattrs_parse_ttls_and_refuse_read_only_ones() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    for (v, want) in [("30s", "30s"), ("500ms", "500ms"), ("2m", "120s"), ("5", "5s"), ("1.5", "1500ms")] {
        sh_ok(&m.path, &format!("setfattr -n user.leasefs.ttl -v {v} L"));
        assert_eq!(sh_ok(&m.path, "getfattr --only-values -n user.leasefs.ttl L"), want, "ttl {v}");
    }
    for off in ["0", "off"] {
        sh_ok(&m.path, &format!("setfattr -n user.leasefs.ttl -v 30s L && setfattr -n user.leasefs.ttl -v {off} L"));
        assert!(errno_of(&sh(&m.path, "getfattr -n user.leasefs.ttl L")).contains("No such attribute"));
    }
    for bad in ["soon", "-1s", "1x", "''"] {
        let o = sh(&m.path, &format!("setfattr -n user.leasefs.ttl -v {bad} L"));
        assert!(errno_of(&o).contains("Invalid argument"), "ttl {bad}: {o:?}");
    }
    for ro in ["epoch", "version", "holder"] {
        let o = sh(&m.path, &format!("setfattr -n user.leasefs.{ro} -v 1 L"));
        assert!(errno_of(&o).contains("Operation not permitted"), "{ro}: {o:?}");
        let o = sh(&m.path, &format!("setfattr -x user.leasefs.{ro} L"));
        assert!(errno_of(&o).contains("Operation not permitted"), "remove {ro}: {o:?}");
    }
    let o = sh(&m.path, "setfattr -n user.leasefs.guard -v /abs L");
    assert!(errno_of(&o).contains("Invalid argument"), "{o:?}");
    let _h = Bg::ready(&m.path, "exec flock L sh -c 'echo ready; exec sleep 60'");
    let holder = sh_ok(&m.path, "getfattr --only-values -n user.leasefs.holder L");
    assert!(holder.contains("\"kind\":\"flock\"") && holder.contains("\"mode\":\"exclusive\""), "{holder}");
    let v1: u64 = sh_ok(&m.path, "getfattr --only-values -n user.leasefs.version L").parse().unwrap();
    sh_ok(&m.path, "echo x >> L");
    let v2: u64 = sh_ok(&m.path, "getfattr --only-values -n user.leasefs.version L").parse().unwrap();
    assert!(v2 > v1, "a write bumps the version");
}

#[test]
fn a_waiter_gets_an_expired_lease_about_one_ttl_after_the_last_renewal() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L && setfattr -n user.leasefs.ttl -v 1s L");
    let _h = Bg::ready(&m.path, "exec flock L sh -c 'echo ready; exec sleep 60'");
    let e = epoch(&m.path, "L");
    let t = Instant::now();
    assert_eq!(sh_code(&m.path, "flock -w 5 L true"), 0, "the waiter must be granted after the TTL");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(700) && waited < Duration::from_millis(4000), "waited {waited:?}");
    assert_eq!(epoch(&m.path, "L"), e + 1);
}

#[test]
fn mount_wide_lease_ttl_applies() {
    let m = Mount::with_args(&["--allow-other", "--lease-ttl", "800ms"]);
    sh_ok(&m.path, "touch L");
    let _h = Bg::ready(&m.path, "exec flock L sh -c 'echo ready; exec sleep 60'");
    assert_eq!(sh_code(&m.path, "flock -w 5 L true"), 0);
}

#[test]
fn without_contention_a_late_renewal_keeps_the_incumbent() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L && setfattr -n user.leasefs.ttl -v 1s L");
    // The holder's shell lets the TTL lapse with nobody contending, then
    // renews late through setfattr (and touch).
    let h = Bg::ready(
        &m.path,
        "exec flock L sh -c 'echo ready; sleep 1.5; setfattr -n user.leasefs.renew -v 1 L && touch L && echo renewed; exec sleep 60'",
    );
    assert_eq!(h.first_line(Duration::from_secs(10), "the holder's renewal"), "renewed");
    assert_eq!(sh_code(&m.path, "flock -n L true"), 1, "the renewed incumbent keeps the lease");
    let o = sh(&m.path, "setfattr -n user.leasefs.renew -v 1 L");
    assert!(errno_of(&o).contains("No locks available"), "a non-holder cannot renew: {o:?}");
}

#[test]
fn a_broken_holder_is_fenced_and_may_contend_again() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L && setfattr -n user.leasefs.ttl -v 500ms L");
    let out = py_ok(
        &m.path,
        r#"
import errno, fcntl, os, subprocess, time
fd = os.open("L", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b"mine\n")
e1 = int(os.getxattr(fd, "user.leasefs.epoch"))
time.sleep(0.8)                                    # no renewal: expired
taker = subprocess.Popen(["flock", "-w", "5", "L", "sh", "-c", "echo taken; sleep 1"], stdout=subprocess.PIPE, text=True)
assert taker.stdout.readline().strip() == "taken"  # the contender broke the lease
def code(f):
    try:
        f(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print("write", code(lambda: os.write(fd, b"stale\n")))
print("truncate", code(lambda: os.ftruncate(fd, 0)))
print("xattr", code(lambda: os.setxattr("L", "user.note", b"x")))
print("rename", code(lambda: os.rename("L", "L2")))
print("unlink", code(lambda: os.unlink("L")))
print("unlock", code(lambda: fcntl.flock(fd, fcntl.LOCK_UN)))
print("epoch", int(os.getxattr("L", "user.leasefs.epoch")) - e1)
taker.wait()
fcntl.flock(fd, fcntl.LOCK_EX)                     # contends again like anyone
print("again", code(lambda: os.write(fd, b"back\n")))
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "write ESTALE",
            "truncate ESTALE",
            "xattr ESTALE",
            "rename ESTALE",
            "unlink ESTALE",
            "unlock ok",
            "epoch 1",
            "again ok"
        ],
    );
    assert_eq!(sh_ok(&m.path, "cat L"), "mine\nback\n", "no fenced write landed");
}

/// A broken holder's writes through a shared mapping of the lease are
/// refused like its `write`s: its `msync` fails with `ESTALE` and the
/// content keeps the new holder's bytes, also while other processes (one
/// that opened the file for writing before the holder, and the new holder)
/// have it open for writing, whose descriptors the kernel could otherwise
/// have written the pages back through.
#[test]
fn a_broken_holders_writes_through_a_shared_mapping_are_refused() {
    let m = Mount::new();
    sh_ok(&m.path, "head -c 4096 /dev/zero | tr '\\0' 0 > L && setfattr -n user.leasefs.ttl -v 500ms L");
    let out = py_ok(
        &m.path,
        r#"
import errno, fcntl, mmap, os, subprocess, time
other = subprocess.Popen(["python3", "-c", "import os, time; f = os.open('L', os.O_RDWR); print('open', flush=True); time.sleep(5)"], stdout=subprocess.PIPE, text=True)
assert other.stdout.readline().strip() == "open"
fd = os.open("L", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
mm = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
mm[0:4] = b"mine"
mm.flush()                                         # while it holds the lease
time.sleep(0.8)                                    # no renewal: expired
taker = subprocess.Popen(["flock", "-w", "5", "L", "python3", "-c",
    "import os, time; f = os.open('L', os.O_RDWR); print('taken', flush=True); time.sleep(1); os.pwrite(f, b'TAKE', 8)"],
    stdout=subprocess.PIPE, text=True)
assert taker.stdout.readline().strip() == "taken"
mm[0:5] = b"stale"
try:
    mm.flush()
    print("msync ok")
except OSError as e:
    print("msync", errno.errorcode[e.errno])
taker.wait()
other.kill()
"#,
    );
    assert_eq!(out.trim(), "msync ESTALE");
    assert_eq!(sh_ok(&m.path, "head -c 16 L"), "mine0000TAKE0000", "no fenced write landed");
}

/// The returning primary: it holds a 1 s lease and appends to a guarded
/// file, is frozen for 1.5 s, the standby takes over and appends; the
/// primary's next append fails and the file holds exactly both first appends.
#[test]
fn guarded_file_rejects_the_returning_primary() {
    let m = Mount::new();
    sh_ok(&m.path, "touch lease state.json && setfattr -n user.leasefs.ttl -v 1s lease && setfattr -n user.leasefs.guard -v lease state.json");
    assert_eq!(sh_ok(&m.path, "getfattr --only-values -n user.leasefs.guard state.json"), "lease");
    let o = sh(&m.path, "echo intruder >> state.json");
    assert!(errno_of(&o).contains("No locks available"), "writing without the lease: {o:?}");
    let primary = r#"
import errno, fcntl, os, signal
lease = os.open("lease", os.O_RDWR)
fcntl.flock(lease, fcntl.LOCK_EX)
state = os.open("state.json", os.O_WRONLY | os.O_APPEND)
os.write(state, b'{"by": "primary", "n": 1}\n')
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
try:
    os.write(state, b'{"by": "primary", "n": 2}\n'); print("appended", flush=True)
except OSError as e:
    print(errno.errorcode[e.errno], flush=True)
"#;
    let script = m.dir.path().join("primary.py");
    std::fs::write(&script, primary).unwrap();
    let mut p = Bg::ready(&m.path, &format!("exec python3 -u {}", script.display()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.state() != 'T' {
        assert!(Instant::now() < deadline, "primary never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(1500));
    sh_ok(&m.path, "flock -w 5 lease sh -c 'echo \"{\\\"by\\\": \\\"standby\\\", \\\"n\\\": 1}\" >> state.json'");
    p.signal(libc::SIGCONT);
    assert!(p.wait(Duration::from_secs(10)).success());
    assert_eq!(p.output(), ["ESTALE"]);
    assert_eq!(sh_ok(&m.path, "cat state.json"), "{\"by\": \"primary\", \"n\": 1}\n{\"by\": \"standby\", \"n\": 1}\n");
}
