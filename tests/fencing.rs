//! TTL leases, breaking, fencing of stale holders and guarded files
//! (SPEC 7), from separate processes.

use std::time::{Duration, Instant};

use crate::util::{epoch, py_ok, sh, sh_code, sh_ok, Bg, Mount, STEP};

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
print("epoch", code(lambda: os.getxattr("L", "user.leasefs.epoch")))
taker.wait()
fcntl.flock(fd, fcntl.LOCK_EX)                     # contends again like anyone
print("again", code(lambda: os.write(fd, b"back\n")))
print("epoch", int(os.getxattr(fd, "user.leasefs.epoch")) - e1)
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
            "epoch ESTALE",
            "again ok",
            "epoch 2"
        ],
    );
    assert_eq!(sh_ok(&m.path, "cat L"), "mine\nback\n", "no fenced write landed");
}

/// The epoch is a fact, the token a right (SPEC 5): after a break and a
/// new grant, the lost holder reads `ESTALE` for the epoch and the holders,
/// by descriptor and by path, and so does a command it runs (it acts for
/// the holder); every other process reads the new holder's epoch, and the
/// new holder reads its own from its descriptor. Once the lost holder
/// acquires the lease again it reads its new token. Red (the old holder
/// reads epoch + 1, its successor's token) without the check in
/// `getxattr`.
#[test]
fn a_lost_holder_reads_estale_for_the_token_and_everyone_else_the_current_epoch() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L && setfattr -n user.note -v n L");
    let script = m.dir.path().join("holder.py");
    std::fs::write(
        &script,
        r#"
import errno, fcntl, os, subprocess, time
fd = os.open("L", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
print(int(os.getxattr(fd, "user.leasefs.epoch")), flush=True)
while not os.path.exists("go"):
    time.sleep(0.02)
def code(f):
    try:
        f(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
for name in ("epoch", "holder"):
    print("fd", name, code(lambda: os.getxattr(fd, "user.leasefs." + name)), flush=True)
    print("path", name, code(lambda: os.getxattr("L", "user.leasefs." + name)), flush=True)
child = subprocess.run(["getfattr", "-n", "user.leasefs.epoch", "L"], capture_output=True, text=True)
print("child", child.returncode, "Stale file handle" in child.stderr, flush=True)
print("other xattr", code(lambda: os.getxattr("L", "user.note")), flush=True)
fcntl.flock(fd, fcntl.LOCK_EX)                     # acquires again: a token of its own
print("again", int(os.getxattr(fd, "user.leasefs.epoch")), int(os.getxattr("L", "user.leasefs.epoch")), flush=True)
"#,
    )
    .unwrap();
    let mut holder = Bg::ready(&m.path, &format!("exec python3 -u {}", script.display()));
    let e1: u64 = holder.first_line(STEP, "the holder's epoch").parse().unwrap();
    let broke = std::process::Command::new(crate::util::leasefs_bin())
        .args(["break", m.path.to_str().unwrap(), "L"])
        .output()
        .unwrap();
    assert!(broke.status.success(), "{broke:?}");
    let next = Bg::ready(
        &m.path,
        "exec 8<>L; flock -w 10 8; echo ready; getfattr --absolute-names --only-values -n user.leasefs.epoch /proc/self/fd/8; echo; \
         while [ ! -e done ]; do sleep 0.02; done",
    );
    assert_eq!(next.first_line(STEP, "the new holder's epoch"), (e1 + 1).to_string(), "the new holder's token");
    assert_eq!(epoch(&m.path, "L"), e1 + 1, "anyone else reads the current epoch");
    sh_ok(&m.path, "touch go");
    let deadline = Instant::now() + STEP;
    while holder.output().len() < 7 {
        assert!(Instant::now() < deadline, "the lost holder: {:?}", holder.output());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        &holder.output()[1..7],
        [
            "fd epoch ESTALE",
            "path epoch ESTALE",
            "fd holder ESTALE",
            "path holder ESTALE",
            "child 1 True",
            "other xattr ok"
        ],
        "what the lost holder reads"
    );
    sh_ok(&m.path, "touch done");
    assert!(holder.wait(STEP).success());
    let again = format!("again {} {}", e1 + 2, e1 + 2);
    assert_eq!(holder.output_to_end().last().unwrap(), &again, "the holder's own token once it acquired again");
    drop(next);
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
