//! The test bench (SPEC 13): fault rules on a live mount, driven from
//! other processes, each asserting what the program saw and the event
//! recorded.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{leasefs_bin, py_ok, run_timeout, sh_ok, Bg, Mount, STEP};

/// Run `leasefs fault ARGS...` on the mount; (exit code, stdout, stderr).
fn fault(m: &Mount, args: &[&str]) -> (i32, String, String) {
    let mut cmd = Command::new(leasefs_bin());
    cmd.arg("fault").arg(args[0]).arg(&m.path).args(&args[1..]);
    let o = run_timeout(&mut cmd, STEP);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).trim().to_string(),
        String::from_utf8_lossy(&o.stderr).trim().to_string(),
    )
}

/// Write one command line to `.leasefs/faults` from a process of its own
/// (as user 65534 with `nobody`); what it saw: `ok` or the errno's text,
/// then the answer read back from the same descriptor.
pub(crate) fn write_faults(dir: &std::path::Path, line: &str, nobody: bool) -> String {
    let script = r#"
import os, sys
fd = os.open(".leasefs/faults", os.O_RDWR)
try:
    os.write(fd, sys.argv[1].encode() + b"\n")
    seen = "ok"
except OSError as e:
    seen = os.strerror(e.errno)
print(seen, os.pread(fd, 65536, 0).decode().strip())
"#;
    let mut cmd = if nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3"]);
        c
    } else {
        Command::new("python3")
    };
    let o = run_timeout(cmd.arg("-c").arg(script).arg(line).current_dir(dir), STEP);
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Add a rule; its id.
fn add(m: &Mount, args: &[&str]) -> u64 {
    let mut all = vec!["add"];
    all.extend_from_slice(args);
    let (code, out, err) = fault(m, &all);
    assert_eq!(code, 0, "fault add {args:?}: {err}");
    out.parse().unwrap_or_else(|_| panic!("fault add printed {out:?}"))
}

/// The rules as JSON.
fn rules(m: &Mount) -> Vec<serde_json::Value> {
    let (code, out, err) = fault(m, &["list", "--json"]);
    assert_eq!(code, 0, "{err}");
    out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Wait until rule `id` has matched `n` requests.
fn await_matches(m: &Mount, id: u64, n: u64) {
    let deadline = Instant::now() + STEP;
    loop {
        let r = rules(m).into_iter().find(|r| r["id"] == id).expect("rule listed");
        if r["matches"].as_u64() >= Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "rule {id} matched {} of {n}", r["matches"]);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A reader of the event stream in its own process: prints every line.
fn reader(m: &Mount) -> Bg {
    let script = r#"exec python3 -u -c '
import os
fd = os.open(".leasefs/events", os.O_RDONLY)
print("ready", flush=True)
while True:
    os.write(1, os.read(fd, 65536))
'"#;
    Bg::ready(&m.path, script)
}

/// Whether the reader printed nothing new for 300 ms.
fn quiet(r: &Bg) -> bool {
    let before = r.lines.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(300));
    r.lines.lock().unwrap().len() == before
}

/// Fault events the reader printed, waiting (at most `STEP`) for `n`
/// (`usize::MAX`: until the stream is quiet).
fn fault_events(r: &Bg, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + STEP;
    loop {
        let evs: Vec<serde_json::Value> = r
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == "fault")
            .collect();
        if evs.len() >= n
            || Instant::now() > deadline
            || n == usize::MAX && !r.lines.lock().unwrap().is_empty() && quiet(r)
        {
            return evs;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_errno_rule_fails_the_matching_calls_after_its_first_matches_and_clear_restores_them() {
    let m = Mount::with_args(&["--allow-other", "--volatile"]);
    let r = reader(&m);
    sh_ok(&m.path, "mkdir wal data");
    let id = add(&m, &["--op", "write", "--path", "wal/*", "--errno", "ENOSPC", "--after", "1", "--count", "2"]);
    let out = py_ok(
        &m.path,
        r#"
import os
def w(path):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND)
    try:
        return str(os.write(fd, b"x"))
    except OSError as e:
        return os.strerror(e.errno)
    finally:
        os.close(fd)
print(w("wal/1"), w("data/1"), w("wal/1"), w("wal/2"), w("wal/2"), os.stat("wal/1").st_size)
"#,
    );
    // The first match passes, the next two fire, the count is then spent;
    // another path never matches.
    assert_eq!(out.trim(), "1 1 No space left on device No space left on device 1 1");
    let evs = fault_events(&r, 2);
    assert_eq!(evs.len(), 2, "{evs:?}");
    for (e, path) in evs.iter().zip(["/wal/1", "/wal/2"]) {
        assert_eq!((e["rule"].as_u64(), e["op"].as_str(), e["path"].as_str()), (Some(id), Some("write"), Some(path)));
        assert_eq!((e["action"].as_str(), e["errno"].as_str()), (Some("errno"), Some("ENOSPC")));
        assert_eq!(e["comm"], "python3", "{e}");
        assert!(e["pid"].as_u64().is_some_and(|p| p > 0), "{e}");
    }
    let metrics = crate::util::unlabeled(&sh_ok(&m.path, "cat .leasefs/metrics"));
    for line in ["leasefs_faults_total{action=\"errno\"} 2", "leasefs_fault_rules 1", "leasefs_fault_requests_held 0"] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in:\n{metrics}");
    }
    let listed = &rules(&m)[0];
    assert_eq!((listed["matches"].as_u64(), listed["fired"].as_u64()), (Some(4), Some(2)), "{listed}");
    // Cleared: a rule that would fire every write is gone.
    add(&m, &["--op", "write", "--errno", "EIO"]);
    assert_eq!(fault(&m, &["clear"]).0, 0);
    assert!(rules(&m).is_empty());
    assert_eq!(sh_ok(&m.path, "echo y >> wal/1 && cat wal/1"), "xy\n");
}

#[test]
fn a_hang_is_held_without_d_state_until_released_or_its_caller_is_signalled() {
    // --bench: a volatile mount that still forwards every fsync.
    let m = Mount::with_args(&["--allow-other", "--volatile", "--bench"]);
    sh_ok(&m.path, "echo data > f && echo other > g");
    let id = add(&m, &["--op", "fsync", "--path", "f", "--hang"]);
    // fsync through ctypes: Python would retry a call that failed with
    // EINTR (PEP 475); this shows the errno the system call returned.
    let prog = r#"
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGUSR1, lambda *a: None)
fd = os.open("f", os.O_WRONLY)
print("ready", flush=True)
if libc.fsync(fd) == 0:
    print("synced", flush=True)
else:
    print(errno.errorcode[ctypes.get_errno()], flush=True)
"#;
    let mut held = Bg::ready(&m.path, &format!("exec python3 -u -c '{prog}'"));
    await_matches(&m, id, 1);
    held.wait_for_answer();
    assert_eq!(held.state(), 'S', "a held request sleeps interruptibly");
    // Other requests go on meanwhile: one hang holds no daemon thread.
    assert_eq!(
        sh_ok(&m.path, "cat g && python3 -c 'import os; os.fsync(os.open(\"g\", os.O_RDONLY))' && echo ok"),
        "other\nok\n"
    );
    assert!(held.running());
    let (code, out, _) = fault(&m, &["release"]);
    assert_eq!((code, out.as_str()), (0, "1"));
    assert!(held.wait(STEP).success());
    assert_eq!(held.output_to_end(), ["synced"]);

    // A signal ends a hang with EINTR.
    let mut held = Bg::ready(&m.path, &format!("exec python3 -u -c '{prog}'"));
    await_matches(&m, id, 2);
    held.wait_for_answer();
    held.signal(libc::SIGUSR1);
    assert!(held.wait(STEP).success());
    assert_eq!(held.output_to_end(), ["EINTR"]);
    // SIGKILL too: the process dies, never stuck in D state.
    let mut held = Bg::ready(&m.path, &format!("exec python3 -u -c '{prog}'"));
    await_matches(&m, id, 3);
    held.wait_for_answer();
    held.signal(libc::SIGKILL);
    held.wait(STEP);
    assert_eq!(fault(&m, &["release"]).1, "0", "nothing left held");
}

#[test]
fn a_delay_holds_only_the_matching_request_and_removing_its_rule_lets_it_go() {
    let m = Mount::with_args(&["--allow-other", "--volatile"]);
    sh_ok(&m.path, "echo slow > slow && echo fast > fast");
    let id = add(&m, &["--op", "read", "--path", "slow", "--delay", "60s"]);
    let mut slow = Bg::ready(
        &m.path,
        "exec python3 -u -c 'import os; fd = os.open(\"slow\", os.O_RDONLY); print(\"ready\", flush=True); print(os.read(fd, 100).decode().strip(), flush=True)'",
    );
    await_matches(&m, id, 1);
    // Another file's read is not held behind it.
    assert_eq!(sh_ok(&m.path, "cat fast"), "fast\n");
    assert!(slow.running(), "the delayed read is still held");
    assert_eq!(fault(&m, &["del", &id.to_string()]).0, 0);
    assert!(slow.wait(STEP).success());
    assert_eq!(slow.output_to_end(), ["slow"]);
    // An errno after a delay: the call fails once the delay is over.
    add(&m, &["--op", "unlink", "--errno", "EBUSY", "--delay", "50ms"]);
    let unlink = "import os\ntry:\n os.unlink(\"fast\")\nexcept OSError as e: print(e.strerror)";
    assert_eq!(py_ok(&m.path, unlink).trim(), "Device or resource busy", "unlink fails after its delay");
    assert!(m.p("fast").exists());
}

#[test]
fn a_short_read_and_a_short_write_move_at_most_n_bytes_never_zero_filled() {
    let m = Mount::with_args(&["--allow-other", "--volatile"]);
    sh_ok(&m.path, "printf abcdefgh > f");
    add(&m, &["--op", "read,write", "--path", "f", "--short", "3"]);
    let out = py_ok(
        &m.path,
        r#"
import os
fd = os.open("f", os.O_RDWR)
a = os.pread(fd, 100, 0)
b = os.pread(fd, 100, 3)
n = os.pwrite(fd, b"XYZWV", 0)
print(a.decode(), b.decode(), n)
"#,
    );
    assert_eq!(out.trim(), "abc def 3");
    assert_eq!(fault(&m, &["clear"]).0, 0);
    assert_eq!(std::fs::read_to_string(m.p("f")).unwrap(), "XYZdefgh");
}

#[test]
fn lose_lease_fences_the_holder_at_its_matching_write_and_grants_the_waiter_epoch_plus_one() {
    let m = Mount::new();
    let r = reader(&m);
    sh_ok(&m.path, "touch job.lease");
    // The holder takes the lease, then (at SIGUSR1) writes three times.
    let holder_prog = r#"
import fcntl, os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
fd = os.open("job.lease", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
signal.sigwait([signal.SIGUSR1])
out = []
for i in range(3):
    try:
        out.append(str(os.write(fd, b"w")))
    except OSError as e:
        out.append(os.strerror(e.errno))
print(" ".join(out), flush=True)
"#;
    let waiter_prog = r#"
import fcntl, os
fd = os.open("job.lease", os.O_RDWR)
print("ready", flush=True)
fcntl.flock(fd, fcntl.LOCK_EX)
print(os.getxattr(fd, "user.leasefs.epoch").decode(), flush=True)
"#;
    let rule = add(&m, &["--op", "write", "--path", "job.lease", "--lose-lease", "--after", "1", "--count", "1"]);
    let mut holder = Bg::ready(&m.path, &format!("exec python3 -u -c '{holder_prog}'"));
    assert_eq!(crate::util::epoch(&m.path, "job.lease"), 1);
    let mut waiter = Bg::ready(&m.path, &format!("exec python3 -u -c '{waiter_prog}'"));
    waiter.wait_blocked();
    holder.signal(libc::SIGUSR1);
    assert!(holder.wait(STEP).success());
    // The second write matched: the lease was broken before it was carried
    // out, so it and every later write of the holder are fenced.
    assert_eq!(holder.output_to_end(), ["1 Stale file handle Stale file handle"]);
    assert!(waiter.wait(STEP).success());
    assert_eq!(waiter.output_to_end(), ["2"], "the waiter is granted the next epoch");
    let evs = fault_events(&r, 1);
    assert_eq!((evs[0]["rule"].as_u64(), evs[0]["action"].as_str()), (Some(rule), Some("lose_lease")));
    assert_eq!(evs[0]["path"], "/job.lease");
    let reasons: Vec<serde_json::Value> = r
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "break")
        .map(|e| e["reason"].clone())
        .collect();
    assert_eq!(reasons, ["fault"]);
}

#[test]
fn bad_rules_and_other_users_on_a_shared_mount_are_refused_and_change_nothing() {
    let m = Mount::new();
    for (args, why) in [
        (&["--op", "wirte", "--errno", "EIO"][..], "unknown operation \"wirte\""),
        (&["--errno", "ENOPE"][..], "unknown errno \"ENOPE\""),
        (&["--path", "a[b", "--errno", "EIO"][..], "never closed"),
        (&["--probability", "1.5", "--errno", "EIO"][..], "outside [0, 1]"),
        (&["--op", "fsync", "--errno", "ENOSYS"][..], "stop sending fsync"),
        (&["--op", "fsync", "--short", "1"][..], "--short applies"),
    ] {
        let mut all = vec!["add"];
        all.extend_from_slice(args);
        let (code, _, err) = fault(&m, &all);
        assert_eq!(code, 1, "{args:?}");
        assert!(err.contains(why) && err.lines().count() == 1, "{args:?}: {err}");
    }
    // Written to the control file directly: EINVAL, and the reason read back.
    let out = write_faults(&m.path, r#"{"op":["write"],"errno":"EIO","probability":2}"#, false);
    assert_eq!(out, r#"Invalid argument {"error":"probability 2 is outside [0, 1]"}"#);
    // A rule that is not there: ENOENT, through the CLI and the file.
    for cmd in ["del", "release"] {
        let (code, _, err) = fault(&m, &[cmd, "99"]);
        assert_eq!((code, err.as_str()), (1, "leasefs fault: no rule 99"), "{cmd}");
    }
    let out = write_faults(&m.path, r#"{"del":99}"#, false);
    assert_eq!(out, r#"No such file or directory {"error":"no rule 99"}"#);
    // Another user on a shared (--allow-other) mount: EPERM.
    assert_eq!(write_faults(&m.path, r#"{"errno":"EIO"}"#, true), "Operation not permitted");
    assert!(rules(&m).is_empty(), "nothing was added");
    assert_eq!(sh_ok(&m.path, "echo ok > f && cat f"), "ok\n");
}

#[test]
fn the_same_seed_and_requests_give_the_same_firings() {
    let m = Mount::with_args(&["--allow-other", "--volatile"]);
    let r = reader(&m);
    sh_ok(&m.path, "touch f");
    // What the program saw, and the record: which matches fired.
    let run = |seed: &str| -> (String, Vec<u64>) {
        let id = add(&m, &["--op", "write", "--path", "f", "--errno", "EIO", "--probability", "0.3", "--seed", seed]);
        let out = py_ok(
            &m.path,
            r#"
import os
fd = os.open("f", os.O_WRONLY)
out = []
for i in range(1000):
    try:
        os.write(fd, b"x")
        out.append(".")
    except OSError:
        out.append("E")
print("".join(out))
"#,
        );
        let seen = out.trim().to_string();
        let fired = seen.matches('E').count();
        let evs = fault_events(&r, usize::MAX).into_iter().filter(|e| e["rule"] == id).collect::<Vec<_>>();
        let record: Vec<u64> = evs.iter().map(|e| e["match"].as_u64().unwrap()).collect();
        assert_eq!(record.len(), fired, "one event per fault the program saw");
        let expected: Vec<u64> = seen.char_indices().filter(|(_, c)| *c == 'E').map(|(i, _)| i as u64 + 1).collect();
        assert_eq!(record, expected, "the record names the matches that failed");
        assert_eq!(fault(&m, &["del", &id.to_string()]).0, 0);
        (seen, record)
    };
    let a = run("7");
    let fired = a.1.len();
    assert!((230..370).contains(&fired), "probability 0.3 fired {fired} of 1000");
    assert_eq!(run("7"), a, "the same seed and requests: the same faults and the same record");
    assert_ne!(run("8").0, a.0, "another seed");
}

#[test]
fn fsync_rules_need_a_mount_that_still_forwards_fsync() {
    // A volatile mount whose kernel was told fsync needs no request.
    let m = Mount::with_args(&["--allow-other", "--volatile"]);
    sh_ok(&m.path, "echo x > f && python3 -c 'import os; os.fsync(os.open(\"f\", os.O_RDONLY))'");
    let (code, _, err) = fault(&m, &["add", "--op", "fsync", "--errno", "EIO"]);
    assert_eq!(code, 1);
    assert!(err.contains("--bench"), "{err}");
    // A rule added before the first fsync keeps fsync coming.
    let m = Mount::with_args(&["--allow-other", "--volatile"]);
    sh_ok(&m.path, "echo x > f");
    add(&m, &["--op", "fsync", "--errno", "EIO", "--count", "1"]);
    let fsync = "python3 -c 'import os\ntry:\n os.fsync(os.open(\"f\", os.O_RDONLY)); print(\"ok\")\nexcept OSError as e: print(e.strerror)'";
    assert_eq!(sh_ok(&m.path, fsync), "Input/output error\n");
    assert_eq!(sh_ok(&m.path, fsync), "ok\n");
}

// The Rust guard (`leasefs::bench::TestMount`), as a test suite uses it:
// one mount per test, rules added, the program under test run against the
// mount, the fault events read back. These three are the examples of
// docs/bench.md.

use leasefs::bench::{RuleSpec, TestMount};

/// Run one of the example programs under test (python/tests/programs/,
/// shared with the pytest plugin's examples) in `dir`; (exit code, stdout).
fn program(dir: &std::path::Path, name: &str) -> (i32, String) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests/programs").join(name);
    let o = run_timeout(Command::new("python3").arg(path).current_dir(dir), STEP);
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stdout).trim().to_string())
}

#[test]
fn guard_example_a_program_that_retries_enospc_keeps_every_record() {
    let m = TestMount::new().expect("mount");
    std::fs::create_dir(m.path().join("wal")).unwrap();
    m.add(RuleSpec::on(&["write"]).path("wal/*").errno("ENOSPC").after(1).count(2)).unwrap();
    let (code, out) = program(m.path(), "retry_enospc.py");
    assert_eq!((code, out.as_str()), (0, "2"));
    assert_eq!(std::fs::read_to_string(m.path().join("wal/log")).unwrap(), "one\ntwo\nthree\n");
    let faults = m.fault_events();
    assert_eq!(faults.iter().map(|e| e["match"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 3]);
    assert!(faults.iter().all(|e| e["errno"] == "ENOSPC" && e["path"] == "/wal/log"));
}

#[test]
fn guard_example_a_program_that_must_notice_its_lost_lock_stops_writing() {
    let m = TestMount::new().expect("mount");
    std::fs::write(m.path().join("job.lease"), "").unwrap();
    // The job's second write finds its lock gone.
    m.add(RuleSpec::on(&["write"]).path("job.lease").after(1).count(1).lose_lease()).unwrap();
    let (code, out) = program(m.path(), "lost_lock.py");
    assert_eq!((code, out.as_str()), (3, "lost the lock at step 2"));
    assert_eq!(std::fs::read_to_string(m.path().join("job.lease")).unwrap(), "step 1\n");
    assert_eq!(m.fault_events()[0]["action"], "lose_lease");
    assert!(m.events().iter().any(|e| e["event"] == "break" && e["reason"] == "fault"));
}

#[test]
fn guard_example_a_program_must_not_block_forever_on_a_hung_fsync() {
    let m = TestMount::new().expect("mount");
    m.add(RuleSpec::on(&["fsync"]).hang()).unwrap();
    let (code, out) = program(m.path(), "hung_fsync.py");
    assert_eq!((code, out.as_str()), (2, "fsync did not return in time"));
    assert_eq!(m.fault_events()[0]["action"], "hang");
    assert_eq!(m.release(None), Ok(0), "the exit ended the held fsync");
}

#[test]
fn the_pytest_plugin_passes_its_examples() {
    // The plugin from the repository (python/), not an installed copy.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = run_timeout(
        Command::new("python3")
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:leasefs", "-p", "leasefs_pytest"])
            .arg(root.join("python/tests"))
            .env("PYTHONPATH", root.join("python"))
            .env("LEASEFS_BIN", leasefs_bin())
            .current_dir(root),
        STEP * 4,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("5 passed"), "pytest: {out}\n{}", String::from_utf8_lossy(&o.stderr));
}

/// The kernel forwards `syncfs` (`FUSE_SYNCFS`) only to servers that ask
/// for it in their own way (virtio-fs), and `sync(2)` writes back dirty
/// pages without an `FSYNC`: what a `sync` makes durable on leasefs is what
/// reached the daemon before it, and nothing is synced by it (docs/bench.md).
/// Should a kernel start forwarding either, this fails and the docs change.
#[test]
fn sync_and_syncfs_send_the_daemon_no_request_on_this_kernel() {
    let m = TestMount::new().expect("mount");
    let count = |op: &str| -> u64 {
        let metrics = crate::util::unlabeled(&std::fs::read_to_string(m.path().join(".leasefs/metrics")).unwrap());
        let key = format!("leasefs_fuse_requests_total{{op=\"{op}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(key.as_str())).map_or(0, |v| v.parse().unwrap())
    };
    std::fs::write(m.path().join("f"), b"x").unwrap();
    let before: Vec<u64> = ["fsync", "fsyncdir", "syncfs"].iter().map(|op| count(op)).collect();
    sh_ok(m.path(), "sync -f f && sync");
    let after: Vec<u64> = ["fsync", "fsyncdir", "syncfs"].iter().map(|op| count(op)).collect();
    assert_eq!(after, before, "fsync, fsyncdir, syncfs requests before and after sync -f and sync");
    // An fsync does reach it (the mount forwards them: --bench).
    sh_ok(m.path(), "python3 -c 'import os; os.fsync(os.open(\"f\", os.O_RDONLY))'");
    assert_eq!(count("fsync"), before[0] + 1);
}
