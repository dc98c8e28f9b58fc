//! Power cuts on a live mount (SPEC 13): programs in other processes write,
//! sync or not, and the cut leaves exactly what they synced; descriptors
//! from before the cut answer `EIO`; epochs never go back.

use std::process::Command;

use crate::faults::write_faults;
use crate::util::{epoch, leasefs_bin, py_ok, run_timeout, sh_ok, Bg, Mount, STEP};

/// A test mount that tracks what was synced.
fn bench() -> Mount {
    Mount::with_args(&["--allow-other", "--volatile", "--bench"])
}

/// `leasefs crash MOUNT ARGS...`: (exit code, stdout, stderr).
fn crash(m: &Mount, args: &[&str]) -> (i32, String, String) {
    let o = run_timeout(Command::new(leasefs_bin()).arg("crash").arg(&m.path).args(args), STEP);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).trim().to_string(),
        String::from_utf8_lossy(&o.stderr).trim().to_string(),
    )
}

/// Cut the power; the report.
fn cut(m: &Mount) -> serde_json::Value {
    let (code, out, err) = crash(m, &["--report"]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The program that replaces a file by write and rename (shared with the
/// pytest plugin's examples).
fn replace_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests/programs/replace_file.py")
}

fn replace(m: &Mount, text: &str, sync: bool) {
    let mut cmd = Command::new("python3");
    cmd.arg(replace_file()).arg("config").arg(text).current_dir(&m.path);
    if sync {
        cmd.arg("--fsync");
    }
    let o = run_timeout(&mut cmd, STEP);
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn write_then_rename_without_fsync_loses_the_file_and_with_fsyncs_keeps_it() {
    let m = bench();
    // Without a sync the file and its name are gone.
    replace(&m, "v1", false);
    assert_eq!(sh_ok(&m.path, "cat config"), "v1");
    let report = cut(&m);
    assert_eq!(sh_ok(&m.path, "ls -A"), "", "{report}");
    let names = report["names"].as_array().unwrap();
    assert!(names.iter().any(|n| n["name"] == "config" && n["after"].is_null()), "{report}");
    // With fsync of the file and of its directory both survive.
    replace(&m, "v2", true);
    let report = cut(&m);
    assert_eq!(sh_ok(&m.path, "ls -A; cat config"), "config\nv2", "{report}");
    assert_eq!(report["names"], serde_json::json!([]), "{report}");
    // The next unsynced replacement goes back to v2, byte for byte.
    replace(&m, "version three", false);
    let report = cut(&m);
    assert_eq!(sh_ok(&m.path, "ls -A; cat config"), "config\nv2", "{report}");
}

#[test]
fn file_contents_go_back_to_their_last_fsync_or_fdatasync_and_the_report_names_the_ranges() {
    let m = bench();
    py_ok(
        &m.path,
        r#"
import os
fd = os.open("wal", os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"a" * 5000)
os.fdatasync(fd)
d = os.open(".", os.O_RDONLY); os.fsync(d)
os.pwrite(fd, b"b" * 100, 4096)
os.write(fd, b"c" * 3000)
os.fchmod(fd, 0o600)
"#,
    );
    let report = cut(&m);
    assert_eq!(sh_ok(&m.path, "stat -c %s wal; tr -d a < wal | wc -c"), "5000\n0\n");
    let f = &report["files"][0];
    assert_eq!(f["path"], "wal", "{report}");
    assert_eq!(f["size"], serde_json::json!({"before": 8000, "after": 5000}));
    assert_eq!(f["lost"], serde_json::json!([[4096, 3904]]), "{report}");
    // The mode was never synced by an fsync (fdatasync keeps data only).
    assert_eq!(f["attrs"], true);
    assert_eq!(sh_ok(&m.path, "stat -c %a wal"), "644\n");
}

#[test]
fn descriptors_from_before_the_cut_answer_eio_and_kill_ends_their_processes() {
    let m = bench();
    sh_ok(&m.path, "echo data > f && sync f && sync .");
    // A process that keeps a descriptor, and writes through it on demand.
    let holder = || {
        Bg::ready(
            &m.path,
            r#"exec python3 -u -c '
import os, time
fd = os.open("f", os.O_RDWR)
print("ready")
while not os.path.exists("go"):
    time.sleep(0.01)
for call in (lambda: os.pwrite(fd, b"x", 0), lambda: os.pread(fd, 4, 0), lambda: os.fsync(fd)):
    try:
        call(); print("ok")
    except OSError as e:
        print(os.strerror(e.errno))
try:
    os.close(fd); print("closed")
except OSError as e:
    print("close:", os.strerror(e.errno))
'"#,
        )
    };
    let mut h = holder();
    let report = cut(&m);
    assert_eq!(report["descriptors"], 1, "{report}");
    sh_ok(&m.path, "touch go");
    h.wait(STEP);
    let lines = h.output_to_end();
    assert_eq!(lines[..3], ["Input/output error"; 3], "{lines:?}");
    // A descriptor opened after the cut works.
    assert_eq!(sh_ok(&m.path, "cat f"), "data\n");
    sh_ok(&m.path, "rm go");
    // --kill: the holder is SIGKILLed, as the power would.
    let mut h = holder();
    let (code, out, err) = crash(&m, &["--kill"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("power cut:"), "{out}");
    let status = h.wait(STEP);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
}

#[test]
fn epochs_never_go_back_and_holders_are_gone() {
    let m = bench();
    sh_ok(&m.path, "touch lease && sync lease && sync . && flock lease true && flock lease true");
    assert_eq!(epoch(&m.path, "lease"), 2);
    // A holder at the cut loses its lease; the next one gets a higher epoch.
    let holder = Bg::ready(&m.path, "exec flock lease sh -c 'echo ready; sleep 60'");
    assert_eq!(epoch(&m.path, "lease"), 3);
    cut(&m);
    let granted = sh_ok(&m.path, "flock -n lease getfattr --only-values -n user.leasefs.epoch lease");
    assert!(granted.trim().parse::<u64>().unwrap() > 3, "{granted}");
    drop(holder);
    // A lease file that was never synced is gone, and its name gets no
    // epoch back either.
    sh_ok(&m.path, "touch fresh && flock fresh true && flock fresh true");
    cut(&m);
    assert!(!m.path.join("fresh").exists(), "a never-synced file outlived the cut");
    sh_ok(&m.path, "touch fresh && flock fresh true");
    assert!(epoch(&m.path, "fresh") > 2, "a name's epoch came back");
}

#[test]
fn a_crash_rule_cuts_the_power_at_the_second_fsync_of_the_wal_before_it_is_answered() {
    let m = bench();
    sh_ok(&m.path, "mkdir wal && sync .");
    let mut cmd = Command::new(leasefs_bin());
    cmd.args(["fault", "add"]).arg(&m.path).args(["--op", "fsync", "--path", "wal/*", "--after", "1", "--crash"]);
    let o = run_timeout(&mut cmd, STEP);
    assert!(o.status.success(), "{o:?}");
    let out = py_ok(
        &m.path,
        r#"
import os
fd = os.open("wal/log", os.O_CREAT | os.O_RDWR, 0o644)
d = os.open("wal", os.O_RDONLY)
os.write(fd, b"one\n"); os.fsync(fd); os.fsync(d)
os.write(fd, b"two\n")
try:
    os.fsync(fd); print("synced")
except OSError as e:
    print(os.strerror(e.errno))
"#,
    );
    assert_eq!(out.trim(), "Input/output error");
    assert_eq!(sh_ok(&m.path, "cat wal/log"), "one\n");
    // Fired once, at the second match, and counted as a crash.
    let listed = sh_ok(&m.path, "cat .leasefs/faults");
    let rule: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!((rule["matches"].as_u64(), rule["fired"].as_u64()), (Some(2), Some(1)), "{listed}");
}

#[test]
fn a_cut_is_refused_where_nothing_tracks_what_was_synced_and_for_other_users() {
    let m = Mount::with_args(&["--allow-other", "--volatile"]);
    let (code, _, err) = crash(&m, &[]);
    assert_eq!(code, 1);
    assert!(err.starts_with("leasefs crash: this mount does not track what was synced"), "{err}");
    let mut cmd = Command::new(leasefs_bin());
    cmd.args(["fault", "add"]).arg(&m.path).args(["--op", "fsync", "--crash"]);
    let o = run_timeout(&mut cmd, STEP);
    assert!(String::from_utf8_lossy(&o.stderr).contains("mount it with --bench"), "{o:?}");
    // Through the file: EINVAL with the reason read back.
    let out = write_faults(&m.path, r#"{"crash":{}}"#, false);
    assert!(out.starts_with(r#"Invalid argument {"error":"this mount does not track what was synced"#), "{out}");
    // Another user on a shared mount: EPERM, and nothing was cut.
    let m = bench();
    sh_ok(&m.path, "echo kept > unsynced");
    assert_eq!(write_faults(&m.path, r#"{"crash":{"kill":true}}"#, true), "Operation not permitted");
    assert_eq!(sh_ok(&m.path, "cat unsynced"), "kept\n");
}

#[test]
fn the_guard_cuts_the_power_of_its_mount() {
    let m = leasefs::bench::TestMount::new().expect("mount");
    let (code, out) = {
        let o = run_timeout(
            Command::new("python3").arg(replace_file()).args(["config", "v1", "--fsync"]).current_dir(m.path()),
            STEP,
        );
        (o.status.code(), String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    assert_eq!((code, out.as_str()), (Some(0), "replaced"));
    std::fs::write(m.path().join("unsynced"), "gone").unwrap();
    let report = m.crash(false).unwrap();
    assert_eq!(report["names"][0]["name"], "unsynced", "{report}");
    assert_eq!(std::fs::read_to_string(m.path().join("config")).unwrap(), "v1");
    assert!(!m.path().join("unsynced").exists());
}

/// The tree under `dir`: every path with its contents (directories end in `/`).
fn tree(dir: &std::path::Path) -> String {
    sh_ok(dir, "find . -path ./.leasefs -prune -o -print | sort | while read -r p; do if [ -d \"$p\" ]; then echo \"$p/\"; else echo \"$p: $(cat \"$p\")\"; fi; done")
}

#[test]
fn a_durable_mount_holds_the_cut_state_and_a_kill_9_and_restart_right_after_shows_the_same_tree() {
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap();
    let mut m = Mount::with_args(&["--allow-other", "--bench", "--state-dir", sd]);
    py_ok(
        &m.path,
        r#"
import os
def sync(p):
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)
os.mkdir("d")
with open("d/kept", "w") as f:
    f.write("synced"); f.flush(); os.fsync(f.fileno())
sync("d"); sync(".")
# Not synced: all of it goes (an fsync of another file makes the journal
# durable, which a cut does not count).
with open("d/kept", "a") as f:
    f.write(" and more")
with open("d/new", "w") as f:
    f.write("new")
os.rename("d/kept", "kept2")
with open("other", "w") as f:
    f.write("x"); f.flush(); os.fsync(f.fileno())
"#,
    );
    let before = tree(&m.path);
    let report = cut(&m);
    let after = tree(&m.path);
    assert_eq!(after, "./\n./d/\n./d/kept: synced\n", "{report}\nbefore the cut:\n{before}");
    crate::durability::kill_9(&mut m);
    let m = Mount::with_args(&["--allow-other", "--bench", "--state-dir", sd]);
    assert_eq!(tree(&m.path), after, "a restart right after the cut shows another tree");
}

/// One round of an SQLite writer cut at a random moment: the ids it printed
/// as committed, and what a fresh process then finds (`integrity_check`,
/// the ids in the table).
fn sqlite_round(m: &Mount, sync: &str, first: u64, wait_ms: u64) -> (Vec<u64>, String, Vec<u64>) {
    let writer = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helpers/sqlite_writer.py");
    let first_s = first.to_string();
    let mut w = Bg::capture(&m.path, "python3", &[writer.to_str().unwrap(), "db", sync, &first_s]);
    // Until it runs, then a little longer (seeded).
    let deadline = std::time::Instant::now() + STEP;
    while w.lines.lock().unwrap().first().map(String::as_str) != Some("ready") {
        assert!(w.running() && std::time::Instant::now() < deadline, "the writer did not start");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    std::thread::sleep(std::time::Duration::from_millis(wait_ms));
    let (code, _, err) = crash(m, &["--kill"]);
    assert_eq!(code, 0, "{err}");
    w.wait(STEP);
    let committed: Vec<u64> = w.output_to_end().iter().filter_map(|l| l.parse().ok()).collect();
    let found = py_ok(
        &m.path,
        r#"
import sqlite3
c = sqlite3.connect("db")
print(c.execute("PRAGMA integrity_check").fetchone()[0])
print(" ".join(str(r[0]) for r in c.execute("SELECT id FROM t ORDER BY id")))
c.close()
"#,
    );
    let mut lines = found.lines();
    let check = lines.next().unwrap_or_default().to_string();
    let ids = lines.next().unwrap_or_default().split_whitespace().map(|v| v.parse().unwrap()).collect();
    (committed, check, ids)
}

#[test]
fn sqlite_in_wal_mode_with_synchronous_full_loses_no_committed_transaction_across_100_cuts() {
    let m = bench();
    let mut rng = crate::util::Rng(0x5eed_50f7);
    let (mut next, mut total) = (1, 0);
    for round in 0..100 {
        let (committed, check, ids) = sqlite_round(&m, "FULL", next, rng.below(40));
        assert_eq!(check, "ok", "round {round}: integrity_check after the cut");
        let kept: std::collections::HashSet<u64> = ids.iter().copied().collect();
        let lost: Vec<u64> = committed.iter().filter(|i| !kept.contains(i)).copied().collect();
        assert!(lost.is_empty(), "round {round}: committed and lost: {lost:?}");
        total += committed.len();
        next = ids.last().copied().unwrap_or(0) + 1;
    }
    assert!(total > 100, "the writer committed only {total} transactions in 100 rounds");
}

#[test]
fn sqlite_with_synchronous_off_loses_committed_transactions_at_a_cut() {
    let m = bench();
    // The database made durable first (FULL), then written with OFF.
    let (_, check, _) = sqlite_round(&m, "FULL", 1, 20);
    assert_eq!(check, "ok");
    let mut lost_somewhere = Vec::new();
    for round in 0..5 {
        let (committed, check, ids) = sqlite_round(&m, "OFF", 1_000_000 * (round + 1), 30);
        assert_eq!(check, "ok", "round {round}");
        let kept: std::collections::HashSet<u64> = ids.iter().copied().collect();
        lost_somewhere.extend(committed.iter().filter(|i| !kept.contains(i)).copied());
    }
    assert!(!lost_somewhere.is_empty(), "synchronous=OFF lost nothing it committed: the cut kept unsynced data");
}
