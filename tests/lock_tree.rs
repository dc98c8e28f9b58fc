//! `leasefs lock` ends the command's whole process tree: background
//! children, double-forked `setsid` daemons, children that ignore SIGTERM
//! and stopped children, on lease loss, on the command's normal exit and on
//! a signal to `leasefs lock`; with a cgroup and without one.
//!
//! Every run goes through `tests/helpers/reaper.py`, a child subreaper: a
//! process that outlived `leasefs lock` (alive, or a zombie nobody reaped)
//! is re-parented to it and reported, so "nothing is left" is checked
//! exactly, not by looking for process names.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::{leasefs_bin, sh_ok, Bg, Mount, STEP};

/// The two ways `leasefs lock` contains a tree: its own cgroup (where one
/// can be made) and a process group with a subreaper's walk.
const MECHANISMS: [&[&str]; 2] = [&[], &["--no-cgroup"]];

fn helper(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helpers").join(name)
}

/// True when this process could make a cgroup v2 directory of its own (root
/// with the unified hierarchy mounted): then `leasefs lock` must use one.
fn cgroup_expected() -> bool {
    let root = crate::util::is_root();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let v2 = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default().lines().any(|l| l.starts_with("0::"));
    root && v2 && info.lines().any(|l| l.split(" - ").nth(1).is_some_and(|r| r.starts_with("cgroup2 ")))
}

/// A `leasefs lock -v` of `tree.py top` under the reaper, its pid files and
/// signal log in `dir`.
struct Run {
    bg: Bg,
    dir: tempfile::TempDir,
    members: Vec<&'static str>,
}

impl Run {
    fn start(m: &Mount, opts: &[&str], exit: &str, members: &[&'static str]) -> Run {
        let dir = tempfile::tempdir().expect("tempdir");
        let (reaper, tree) = (helper("reaper.py"), helper("tree.py"));
        let mut args: Vec<String> = vec![reaper.display().to_string(), leasefs_bin().display().to_string()];
        args.extend(["lock", "-v"].map(String::from));
        args.extend(opts.iter().map(|s| s.to_string()));
        args.extend(["job", "--", "python3"].map(String::from));
        args.extend([tree.display().to_string(), "top".into(), dir.path().display().to_string(), exit.into()]);
        args.push(members.join(","));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let bg = Bg::capture(&m.path, "python3", &refs);
        let run = Run { bg, dir, members: members.to_vec() };
        let deadline = Instant::now() + STEP;
        while !run.lines().iter().any(|l| l == "started") {
            assert!(Instant::now() < deadline, "the tree never started: {:?}", run.lines());
            std::thread::sleep(Duration::from_millis(10));
        }
        run
    }

    fn lines(&self) -> Vec<String> {
        self.bg.lines.lock().unwrap().clone()
    }

    fn pid(&self, name: &str) -> i32 {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.pid"))).unwrap().trim().parse().unwrap()
    }

    /// Pids of `top` and every member.
    fn pids(&self) -> Vec<(&'static str, i32)> {
        std::iter::once("top").chain(self.members.iter().copied()).map(|n| (n, self.pid(n))).collect()
    }

    fn signals(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("signals")).unwrap_or_default()
    }

    /// How the tree was contained, from `-v`.
    fn containment(&self) -> String {
        self.lines().into_iter().find(|l| l.contains("contained by")).expect("-v says how the tree is contained")
    }

    /// The reaper's report, waiting for it at most `timeout`: exit code and
    /// the pids that outlived `leasefs lock`.
    fn report(&mut self, timeout: Duration) -> (i32, Vec<i64>) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines().iter().find(|l| l.starts_with('{')) {
                let v: serde_json::Value = serde_json::from_str(l).expect("reaper's JSON");
                let left = v["left"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap()).collect();
                return (v["code"].as_i64().unwrap() as i32, left);
            }
            assert!(Instant::now() < deadline, "leasefs lock still running after {timeout:?}: {:?}", self.lines());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Run {
    /// A failed test must not leave its tree behind: every member still
    /// running the helper is killed, and the reaper with it.
    fn drop(&mut self) {
        let names = std::iter::once("top").chain(self.members.iter().copied());
        for name in names {
            let Ok(pid) = std::fs::read_to_string(self.dir.path().join(format!("{name}.pid"))) else { continue };
            let Ok(pid) = pid.trim().parse::<i32>() else { continue };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.windows(7).any(|w| w == b"tree.py") {
                // SAFETY: killing a helper process this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn state(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

fn cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
}

/// The tree is what the test claims: every member alive, the daemon in a
/// session of its own, the stopped one stopped; and contained as expected.
fn check_started(run: &Run, opts: &[&str]) {
    for (name, pid) in run.pids() {
        let st = state(pid).unwrap_or_else(|| panic!("{name} ({pid}) is not running"));
        assert_eq!(st == 'T', name == "stopped", "{name} is in state {st}");
    }
    if run.members.contains(&"daemon") {
        // SAFETY: getsid on a pid has no preconditions.
        let (sid, top_sid) = unsafe { (libc::getsid(run.pid("daemon")), libc::getsid(run.pid("top"))) };
        assert_ne!(sid, top_sid, "the daemon left the command's session");
        let ppid = std::fs::read_to_string(format!("/proc/{}/stat", run.pid("daemon"))).unwrap();
        let ppid: i32 = ppid.rsplit_once(')').unwrap().1.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_ne!(ppid, run.pid("top"), "the daemon is not the command's child (double fork)");
    }
    let how = run.containment();
    if opts.is_empty() && cgroup_expected() {
        assert!(how.contains("(cgroup.kill)"), "a cgroup can be made here: {how}");
        for (name, pid) in run.pids() {
            assert!(cgroup_of(pid).contains("/leasefs-lock."), "{name} is in the command's cgroup: {}", cgroup_of(pid));
        }
    } else {
        assert!(how.contains("process group and subreaper"), "{how}");
    }
}

fn assert_all_gone(run: &Run, pids: &[(&str, i32)], left: &[i64]) {
    assert!(left.is_empty(), "processes outlived leasefs lock: {left:?} (of {pids:?})");
    for (name, pid) in pids {
        assert_eq!(state(*pid), None, "{name} ({pid}) is still there");
    }
    let how = run.containment();
    if let Some(dir) = how.split("contained by cgroup ").nth(1).and_then(|r| r.strip_suffix(" (cgroup.kill)")) {
        assert!(!Path::new(dir).exists(), "{dir} was removed");
    }
}

#[test]
fn a_broken_lease_ends_the_whole_tree_within_the_grace_period_and_leaves_no_zombie() {
    let m = Mount::new();
    let grace = Duration::from_secs(1);
    for opts in MECHANISMS {
        let mut o = vec!["--grace", "1s"];
        o.extend(opts);
        let mut run = Run::start(&m, &o, "stay", &["bg", "daemon", "stubborn", "stopped"]);
        check_started(&run, opts);
        let pids = run.pids();
        let t0 = Instant::now();
        sh_ok(&m.path, &format!("{} break . /job", leasefs_bin().display()));
        let (code, left) = run.report(STEP);
        let took = t0.elapsed();
        assert_eq!(code, 75, "lease lost: {:?}", run.lines());
        assert!(took < grace + Duration::from_secs(1), "the tree ended {took:?} after the break (grace {grace:?})");
        assert_all_gone(&run, &pids, &left);
        // SIGTERM first: the polite ones (and the stopped one, continued)
        // ended on it; the stubborn one ignored it and was killed.
        let got = run.signals();
        for name in ["top", "bg", "daemon", "stopped", "stubborn"] {
            assert!(got.contains(&format!("{name} SIGTERM")), "{name} got SIGTERM ({opts:?}): {got}");
        }
        assert!(run.lines().iter().any(|l| l.contains("lease lost (broken")), "{:?}", run.lines());
        sh_ok(&m.path, "flock -n job true");
    }
}

#[test]
fn what_the_command_leaves_running_ends_when_it_exits_unless_kept() {
    let m = Mount::new();
    for opts in MECHANISMS {
        let mut run = Run::start(&m, opts, "3", &["bg", "daemon", "stopped"]);
        let pids = run.pids();
        let (code, left) = run.report(STEP);
        assert_eq!(code, 3, "the command's status: {:?}", run.lines());
        assert_all_gone(&run, &pids, &left);
        let got = run.signals();
        for name in ["bg", "daemon", "stopped"] {
            assert!(got.contains(&format!("{name} SIGTERM")), "{name} was asked to end ({opts:?}): {got}");
        }
    }
    // --keep-children: the command's background processes go on (outside
    // any cgroup of leasefs lock), and the lease is released.
    let mut run = Run::start(&m, &["--keep-children"], "0", &["bg", "daemon"]);
    let (bg, daemon) = (run.pid("bg"), run.pid("daemon"));
    let (code, left) = run.report(STEP);
    assert_eq!(code, 0);
    let mut left = left;
    left.sort();
    let mut kept = vec![i64::from(bg), i64::from(daemon)];
    kept.sort();
    assert_eq!(left, kept, "both were left running (the reaper then killed them)");
    assert_eq!(run.signals(), "", "nobody was signalled");
    sh_ok(&m.path, "flock -n job true");
}

#[test]
fn sigint_sigterm_and_sighup_to_leasefs_lock_reach_the_whole_tree() {
    let m = Mount::new();
    for opts in MECHANISMS {
        for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
            let mut run = Run::start(&m, opts, "stay", &["bg", "daemon"]);
            let lock: i32 = sh_ok(&m.path, &format!("pgrep -P {}", run.bg.pid())).trim().parse().unwrap();
            let pids = run.pids();
            // SAFETY: signalling the leasefs lock this test started.
            unsafe { libc::kill(lock, sig) };
            let (code, left) = run.report(STEP);
            assert_eq!(code, 0, "top ended on {name} with 0: {:?}", run.lines());
            assert_all_gone(&run, &pids, &left);
            let got = run.signals();
            for member in ["top", "bg", "daemon"] {
                assert!(got.contains(&format!("{member} {name}")), "{member} got {name} ({opts:?}): {got}");
            }
        }
    }
}
