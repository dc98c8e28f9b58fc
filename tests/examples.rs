//! The programs in `examples/`, each run against a real mount as its
//! comments say to run it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{epoch, have, leasefs_bin, run_timeout, sh, sh_code, sh_ok, Bg, Mount, STEP};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

/// Start `cmd` in the background; returns once it printed its first line
/// (which is then the first of `Bg::lines`; its exit status follows its
/// output as a line `exit N`).
fn started(dir: &Path, cmd: &str) -> Bg {
    Bg::ready(dir, &format!("{{ {cmd}; echo \"exit $?\"; }} | {{ read first; echo ready; echo \"$first\"; cat; }}"))
}

fn wait_lines(bg: &Bg, n: usize) -> Vec<String> {
    let deadline = Instant::now() + STEP;
    loop {
        let lines = bg.lines.lock().unwrap().clone();
        if lines.len() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "got only {lines:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_cron_singleton_skips_while_the_previous_run_holds_the_lease() {
    let m = Mount::new();
    let script = example("cron-singleton.sh");
    let mp = m.path.display();
    let mut first = started(&m.path, &format!("JOB='sleep 2' {} {mp}", script.display()));
    let run: u64 =
        wait_lines(&first, 1)[0].strip_prefix("run ").unwrap().strip_suffix(" starting").unwrap().parse().unwrap();
    assert_eq!(sh_ok(&m.path, &format!("{} {mp}", script.display())), "previous run still going; skipping\n");
    assert!(first.wait(STEP).success());
    assert_eq!(wait_lines(&first, 2)[1], format!("run {run} done"));
    let next = sh_ok(&m.path, &format!("{} {mp}", script.display()));
    assert_eq!(next, format!("run {} starting\nrun {} done\n", run + 1, run + 1), "runs are numbered by the epoch");
}

#[test]
fn a_paused_holder_that_lost_its_lease_is_refused_by_the_fenced_database() {
    assert!(sh_code(Path::new("/"), "python3 -c 'import filelock'") == 0, "Python's filelock is needed");
    let m = Mount::new();
    let work = tempfile::tempdir().unwrap();
    let db = work.path().join("state.db");
    let script = example("fenced_sqlite.py");
    let run = |name: &str, pause: &str| {
        format!("python3 {} {} {} {name} {pause}", script.display(), m.path.display(), db.display())
    };
    let mut paused = started(&m.path, &run("A", "5"));
    let line = wait_lines(&paused, 1)[0].clone();
    let token: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(token, epoch(&m.path, "service.lock"));
    // The operator (or a TTL) gives the lease to someone else meanwhile.
    let o = run_timeout(Command::new(leasefs_bin()).arg("break").arg(&m.path).arg("service.lock"), STEP);
    assert!(o.status.success(), "{o:?}");
    let b = sh_ok(&m.path, &run("B", "0"));
    assert!(b.contains(&format!("B: write with token {} accepted", token + 1)), "{b}");
    let lines = wait_lines(&paused, 3);
    assert!(lines[1].contains(&format!("A: write with token {token} refused")), "{lines:?}");
    assert_eq!(lines[2], "exit 3", "the stale holder's write is refused");
    assert!(paused.wait(STEP).success());
    let log = sh_ok(work.path(), "python3 -c \"import sqlite3; print(sqlite3.connect('state.db').execute('select token, who from log').fetchall())\"");
    assert_eq!(log.trim(), format!("[({}, 'B')]", token + 1), "only the current holder's write landed");
}

#[test]
fn the_example_service_holds_its_lease_for_its_lifetime() {
    let unit = std::fs::read_to_string(example("leased-service.service")).unwrap();
    assert!(have("systemd-analyze"), "systemd-analyze is needed to check the unit");
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("leased-example.service");
    std::fs::write(&path, &unit).unwrap();
    // The unit it requires, found next to it.
    let template =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/leasefs@.service")).unwrap();
    let template = template.replace("/usr/bin/leasefs", leasefs_bin().to_str().unwrap());
    std::fs::write(work.path().join("leasefs@.service"), template).unwrap();
    let o = run_timeout(Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&path), STEP);
    assert!(o.status.success(), "{o:?}");
    let m = Mount::new();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
    let exec = exec.replace("/run/leases", m.path.to_str().unwrap());
    let mut service = Bg::spawn(&m.path, &format!("exec {exec}"));
    // Watch for the holder without taking the lock (a probing flock could
    // make the service's --nonblock attempt fail).
    let deadline = Instant::now() + STEP;
    let holder = format!("\"pid\":{}", service.pid());
    while !sh(&m.path, "getfattr --only-values -n user.leasefs.holder example.lock 2>/dev/null")
        .stdout
        .windows(holder.len())
        .any(|w| w == holder.as_bytes())
    {
        assert!(service.running(), "the service exited instead of taking its lease");
        assert!(Instant::now() < deadline, "the service never took its lease");
        std::thread::sleep(Duration::from_millis(10));
    }
    let e = epoch(&m.path, "example.lock");
    assert_eq!(sh_code(&m.path, &exec), 1, "a second instance fails at once");
    service.kill_all();
    assert_eq!(sh_code(&m.path, "flock -n example.lock true"), 0, "the lease went with the service");
    assert_eq!(epoch(&m.path, "example.lock"), e + 1);
}

#[test]
fn a_frozen_incumbent_cannot_clobber_the_new_leader() {
    let m = Mount::new();
    let script = example("leader.py");
    let run = |dir: &Path, args: &str| format!("python3 {} {} {args}", script.display(), dir.display());
    // A leads, then pauses 5 s (beyond its 1 s TTL) between reading the
    // lease and renewing it; B takes over meanwhile.
    let mut a = started(&m.path, &run(&m.path, "A 1 3 5"));
    assert_eq!(wait_lines(&a, 1)[0], "A: leader (round 1)");
    assert_eq!(wait_lines(&a, 2)[1], "A: pausing 5.0s before renewing");
    std::thread::sleep(Duration::from_millis(1200));
    let b = sh_ok(&m.path, &run(&m.path, "B 1 1"));
    assert_eq!(b, "B: leader (round 1)\n");
    let lines = wait_lines(&a, 4);
    assert_eq!(lines[2], "A: lost the lease (ESTALE): another process took it while we were paused", "{lines:?}");
    assert_eq!(lines[3], "exit 4");
    assert!(a.wait(STEP).success());
    assert!(sh_ok(&m.path, "cat leader.json").contains("\"leader\": \"B\""), "B stays the leader");
    assert_eq!(sh_ok(&m.path, "ls"), "leader.json\n", "the loser's temporary file is gone");

    // The same on tmpfs: the woken incumbent's rename clobbers B.
    let t = crate::util::Tmpfs::new();
    let mut a = started(&t.path, &run(&t.path, "A 1 3 5"));
    assert_eq!(wait_lines(&a, 2)[1], "A: pausing 5.0s before renewing");
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(sh_ok(&t.path, &run(&t.path, "B 1 1")), "B: leader (round 1)\n");
    assert_eq!(wait_lines(&a, 3)[2], "A: leader (round 2)", "two leaders on tmpfs");
    a.kill_all();
}
