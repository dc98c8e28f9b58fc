//! Compare-and-swap renames and unlinks (SPEC 6), from separate processes.

use std::time::Duration;

use std::path::Path;
use std::process::Command;

use crate::util::{have, py_ok, run_timeout, sh, sh_ok, Bg, Mount, Tmpfs};

/// The failure leasefs exists for: a frozen incumbent renames its stale JSON
/// lease over the standby's newer claim. It must get ESTALE, and the
/// standby's claim (with the higher epoch) must survive.
#[test]
fn frozen_incumbent_cannot_rename_a_stale_lease_over_the_standby() {
    let m = Mount::new();
    let incumbent = r#"
import errno, json, os, signal, sys, time
def write_claim(tmp, doc):
    with open(tmp, "w") as f:
        json.dump(doc, f)
mine = {"holder": "A", "expires_at": time.time() + 0.3, "epoch": 1}
write_claim("lease.tmp.A", mine)
os.rename("lease.tmp.A", "lease")
json.load(open("lease"))                        # renewed and read back
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)           # frozen past expires_at
write_claim("lease.tmp.A", mine)                # renews blindly, no re-read
try:
    os.rename("lease.tmp.A", "lease")
    print("renamed-stale", flush=True)
except OSError as e:
    print("ESTALE" if e.errno == errno.ESTALE else f"errno {e.errno}", flush=True)
seen = json.load(open("lease"))                 # re-read: a fresh observation
print("seen", seen["holder"], seen["epoch"], flush=True)
os.rename("lease.tmp.A", "lease")               # now allowed
print("renamed-after-reread", flush=True)
"#;
    let script = m.dir.path().join("incumbent.py");
    std::fs::write(&script, incumbent).unwrap();
    let mut a = Bg::ready(&m.path, &format!("exec python3 -u {}", script.display()));
    // Wait until it is stopped, then let its lease expire.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while a.state() != 'T' {
        assert!(std::time::Instant::now() < deadline, "incumbent never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(400));
    let standby = py_ok(
        &m.path,
        r#"
import json, os, time
cur = json.load(open("lease"))
assert cur["expires_at"] < time.time(), "not expired yet"
claim = {"holder": "B", "expires_at": time.time() + 30, "epoch": cur["epoch"] + 1}
with open("lease.tmp.B", "w") as f:
    json.dump(claim, f)
os.rename("lease.tmp.B", "lease")
print("took over")
"#,
    );
    assert_eq!(standby.trim(), "took over");
    a.signal(libc::SIGCONT);
    let st = a.wait(Duration::from_secs(20));
    assert!(st.success(), "incumbent: {st:?}");
    let said = a.output();
    assert_eq!(said, ["ESTALE", "seen B 2", "renamed-after-reread"], "incumbent's view");
    let content = sh_ok(&m.path, "cat lease");
    assert!(content.contains("\"holder\": \"A\""), "after its re-read the incumbent may rename again: {content}");
}

/// Same scenario, checking each step's output and the file in between.
#[test]
fn stale_rename_changes_nothing_and_reread_allows_renewal() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import errno, json, os, subprocess, sys
def claim(tmp, holder, epoch):
    with open(tmp, "w") as f:
        json.dump({"holder": holder, "epoch": epoch}, f)
claim("t.A", "A", 1); os.rename("t.A", "lease"); json.load(open("lease"))
# The standby is another process: it reads, then renames its claim over.
subprocess.run([sys.executable, "-c", """
import json, os
cur = json.load(open('lease'))
with open('t.B', 'w') as f: json.dump({'holder': 'B', 'epoch': cur['epoch'] + 1}, f)
os.rename('t.B', 'lease')
"""], check=True)
claim("t.A", "A", 1)
try:
    os.rename("t.A", "lease"); print("clobbered")
except OSError as e:
    print(errno.errorcode[e.errno])
print(json.load(open("lease")), os.path.exists("t.A"))
claim("t.A", "A", 3); os.rename("t.A", "lease")
print(json.load(open("lease")))
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "ESTALE");
    assert_eq!(lines[1], "{'holder': 'B', 'epoch': 2} True", "the stale rename changed nothing");
    assert_eq!(lines[2], "{'holder': 'A', 'epoch': 3}");
}

#[test]
fn one_shot_mv_from_a_process_that_never_looked_succeeds() {
    let m = Mount::new();
    sh_ok(&m.path, "echo one > lease && echo two > lease2");
    // Another process changes the lease; a fresh process moves over it.
    sh_ok(&m.path, "echo changed >> lease");
    sh_ok(&m.path, "echo mine > tmp && mv tmp lease");
    assert_eq!(sh_ok(&m.path, "cat lease"), "mine\n");
}

/// Two processes "break" the same stale dotlock: the second unlink must fail
/// instead of deleting the first one's fresh lock.
#[test]
fn stale_dotlock_race_second_unlink_gets_estale() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import errno, os, sys
open("lock", "w").write("stale")
r1, w1 = os.pipe(); r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    os.stat("lock")                       # B sees the stale lock
    os.write(w1, b"x"); os.read(r2, 1)    # ... and is slow to act
    try:
        os.unlink("lock"); os._exit(0)
    except OSError as e:
        os._exit(10 if e.errno == errno.ESTALE else 11)
os.read(r1, 1)
os.stat("lock")                           # A sees it too, breaks it first
os.unlink("lock")
fd = os.open("lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
os.write(fd, b"fresh A"); os.close(fd)
os.write(w2, b"x")
_, st = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(st), open("lock").read())
"#,
    );
    assert_eq!(out.trim(), "10 fresh A", "B's unlink must fail with ESTALE and A's fresh lock survive");
}

/// Run `dotlockfile` (A) and `lockfile-create` (B) against a stale,
/// mtime-aged dotlock `L` in `dir`, with an LD_PRELOAD shim forcing the
/// losing interleaving: B has judged the lock stale and is about to unlink it
/// when A unlinks it and links its fresh lock; only then does B's unlink run.
/// Returns (A's exit code, B's exit code, the shim's log, L's content).
fn race_two_lock_breakers(dir: &Path, work: &Path) -> (i32, i32, String, String) {
    let shim = work.join("interleave.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helpers/interleave.c");
    let o = run_timeout(
        Command::new("gcc").args(["-shared", "-fPIC", "-O2", "-o"]).arg(&shim).arg(&src).arg("-ldl"),
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "gcc: {}", String::from_utf8_lossy(&o.stderr));
    // A copy without the setgid bit, so the dynamic loader honours LD_PRELOAD.
    std::fs::copy("/usr/bin/dotlockfile", work.join("dotlockfile")).unwrap();
    let w = work.display();
    let script = format!(
        r#"
rm -f {w}/A_linked {w}/B_ready {w}/log
echo stale > L && touch -d '10 min ago' L
export INTERLEAVE_TARGET=L INTERLEAVE_LOG={w}/log LD_PRELOAD={w}/interleave.so
( INTERLEAVE_WAIT_AT_UNLINK={w}/B_ready INTERLEAVE_SIGNAL_AFTER_LINK={w}/A_linked \
    exec {w}/dotlockfile -p -r 2 -l L ) & a=$!
( INTERLEAVE_SIGNAL_AT_UNLINK={w}/B_ready INTERLEAVE_WAIT_AT_UNLINK={w}/A_linked \
    exec lockfile-create --use-pid --retry 2 -l L ) 2>/dev/null & b=$!
wait $a; echo "A $?"; wait $b; echo "B $?"
"#
    );
    let o = sh(dir, &script);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let code = |who: &str| -> i32 {
        let line = out.lines().find(|l| l.starts_with(who)).unwrap_or_else(|| panic!("no exit of {who}: {out}"));
        line[2..].trim().parse().unwrap()
    };
    let log = std::fs::read_to_string(work.join("log")).unwrap_or_default();
    let content = std::fs::read_to_string(dir.join("L")).unwrap_or_default();
    (code("A"), code("B"), log, content)
}

/// The stale-dotlock race with the real tools: `dotlockfile` and
/// `lockfile-create` both judge an mtime-aged lock stale; A breaks it and
/// takes a fresh one, then B's unlink runs. On tmpfs B deletes A's fresh lock
/// and both believe they hold it; on leasefs B's unlink fails with ESTALE,
/// B gives up and A's lock survives.
#[test]
fn dotlockfile_and_lockfile_create_breaking_a_stale_lock_do_not_both_win() {
    if !have("dotlockfile") || !have("lockfile-create") || !have("gcc") {
        return;
    }
    // Baseline: on tmpfs B deletes A's fresh lock and takes the name. (A
    // may still notice before it returns: liblockfile checks its link
    // after making it, and when B's unlink lands first A gives up with
    // L_MAXTRYS, 4; which comes first is the scheduler's.)
    let t = Tmpfs::new();
    let work = tempfile::tempdir().unwrap();
    let (a, b, log, _) = race_two_lock_breakers(&t.path, work.path());
    let unlinks: Vec<&str> = log.lines().filter(|l| l.contains(" unlink ")).collect();
    assert_eq!(unlinks.len(), 2, "on tmpfs both tools break the lock; shim log:\n{log}");
    assert!(unlinks[1].ends_with(" 0"), "on tmpfs B's late unlink deletes A's fresh lock; shim log:\n{log}");
    assert_eq!(b, 0, "on tmpfs B takes the lock; shim log:\n{log}");
    assert!(a == 0 || a == 4, "A holds the lock or saw its link go; exit {a}, shim log:\n{log}");

    let m = Mount::new();
    let work = tempfile::tempdir().unwrap();
    let (a, b, log, content) = race_two_lock_breakers(&m.path, work.path());
    let unlinks: Vec<&str> = log.lines().filter(|l| l.contains(" unlink ")).collect();
    assert_eq!(unlinks.len(), 2, "both tools must have tried to break the lock; shim log:\n{log}");
    assert!(unlinks[0].ends_with(" 0"), "A's break succeeds; shim log:\n{log}");
    assert!(unlinks[1].ends_with(&format!(" {}", libc::ESTALE)), "B's late unlink must get ESTALE; shim log:\n{log}");
    assert_eq!(a, 0, "dotlockfile (A) holds the lock; shim log:\n{log}");
    assert_ne!(b, 0, "lockfile-create (B) must not also believe it holds the lock; shim log:\n{log}");
    let b_pid = unlinks[1].split(' ').next().unwrap();
    let b_linked = log.lines().any(|l| l.starts_with(&format!("{b_pid} link 0")));
    assert!(!b_linked, "B must never have created the lock name; shim log:\n{log}");
    assert!(!content.trim().is_empty() && content.trim() != "stale", "A's fresh lock must survive, found {content:?}");
    assert_eq!(sh_ok(&m.path, "cat L"), content);
}

#[test]
fn appenders_are_not_compare_and_swapped() {
    let m = Mount::new();
    sh_ok(&m.path, "touch log");
    let out = py_ok(
        &m.path,
        r#"
import os, subprocess, sys
fd = os.open("log", os.O_WRONLY | os.O_APPEND)
os.write(fd, b"a\n")
subprocess.run(["sh", "-c", "echo b >> log"], check=True)
os.write(fd, b"c\n")
os.close(fd)
print(open("log").read().split())
"#,
    );
    assert_eq!(out.trim(), "['a', 'b', 'c']");
}
