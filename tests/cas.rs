//! Compare-and-swap renames and unlinks (SPEC 6), from separate processes.

use std::time::Duration;

use crate::util::{py_ok, sh_ok, Bg, Mount};

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
