//! `leasefs top` in a real pseudo-terminal (tmux, 80x24), its plain-text
//! mode on a pipe, and the Grafana dashboard against the daemon's metrics.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{have, leasefs_bin, run_timeout, sh_ok, Bg, Mount, STEP};

/// A tmux server of its own with one 80x24 session running `sh`; killed
/// on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Tmux {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = Tmux { socket: format!("leasefs-test-{}-{n}", std::process::id()) };
        t.run(&["-f", "/dev/null", "new-session", "-d", "-x", "80", "-y", "24", "sh"]);
        // Keys typed before the shell reads them would be echoed ahead of
        // its prompt.
        t.wait_for(STEP, "the shell's prompt", |s| !s.trim().is_empty());
        t
    }

    fn run(&self, args: &[&str]) -> String {
        let o = run_timeout(Command::new("tmux").arg("-L").arg(&self.socket).args(args), STEP);
        assert!(o.status.success(), "tmux {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend(keys);
        self.run(&args);
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "0"])
    }

    /// The screen once `ok` holds for it, waiting at most `timeout`.
    fn wait_for(&self, timeout: Duration, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "{what}: not on screen within {timeout:?}:\n{s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-L").arg(&self.socket).arg("kill-server").status();
    }
}

/// The cells of the row of `path` on a screen: PATH HOLDER MODE EPOCH HELD WAITERS TTL.
fn row<'a>(screen: &'a str, path: &str) -> Option<Vec<&'a str>> {
    screen.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|c| c.first() == Some(&path))
}

#[test]
fn top_shows_holders_and_waiters_follows_a_break_within_a_second_filters_and_restores_the_terminal() {
    assert!(have("tmux"), "tmux is needed");
    let m = Mount::new();
    let holder = Bg::ready(&m.path, "exec flock lease sh -c 'echo ready; exec sleep 60'");
    let mut waiter = Bg::spawn(&m.path, "exec flock lease sleep 60");
    waiter.wait_blocked();
    let work = tempfile::tempdir().unwrap();
    let (before, after) = (work.path().join("before"), work.path().join("after"));
    let t = Tmux::new();
    t.keys(&[
        &format!(
            "stty -g > {}; {} top {}; stty -g > {}; echo top-ended",
            before.display(),
            leasefs_bin().display(),
            m.path.display(),
            after.display()
        ),
        "Enter",
    ]);
    let who = format!("{}/flock", holder.pid());
    let s = t.wait_for(STEP, "the held lease with its waiter", |s| {
        row(s, "/lease").is_some_and(|c| c[1] == who && c[5] == "1")
    });
    assert!(s.lines().nth(1).is_some_and(|l| l.contains("held 1") && l.contains("awaited 1")), "{s}");
    let c = row(&s, "/lease").unwrap();
    assert_eq!((c[2], c[6]), ("exclusive", "-"), "{s}");
    let epoch: u64 = c[3].parse().unwrap();
    assert!(s.lines().all(|l| l.chars().count() <= 80) && s.lines().count() <= 24);

    // The break: the waiter holds it at the next epoch, on screen within a second.
    let o = run_timeout(Command::new(leasefs_bin()).arg("break").arg(&m.path).arg("/lease"), STEP);
    assert!(o.status.success(), "{o:?}");
    let next = format!("{}/flock", waiter.pid());
    let s = t.wait_for(Duration::from_secs(1), "the break", |s| {
        row(s, "/lease").is_some_and(|c| c[1] == next && c[3] == (epoch + 1).to_string() && c[5] == "0")
    });
    assert!(s.lines().nth(1).is_some_and(|l| l.contains("breaks ") && !l.contains("breaks 0.0/s")), "{s}");

    // `/` filters by path; an empty filter shows everything again.
    t.keys(&["/", "zzz"]);
    t.wait_for(STEP, "the filter being typed", |s| s.contains("filter by path: zzz_"));
    t.keys(&["Enter"]);
    t.wait_for(STEP, "the filtered view", |s| s.contains("(filter: zzz)") && row(s, "/lease").is_none());
    t.keys(&["/", "Enter"]);
    t.wait_for(STEP, "the view without a filter", |s| row(s, "/lease").is_some() && !s.contains("filter:"));

    // `q` quits and gives the terminal back as it was.
    t.keys(&["q"]);
    let s = t.wait_for(STEP, "the shell after q", |s| {
        s.lines().any(|l| l.trim_end().ends_with("top-ended") && !l.contains("echo"))
    });
    assert!(!s.contains("grants"), "the view's screen is gone: {s}");
    assert!(s.contains("stty -g >"), "the shell's screen is back: {s}");
    let (b, a) = (std::fs::read_to_string(&before).unwrap(), std::fs::read_to_string(&after).unwrap());
    assert_eq!(a, b, "the terminal modes are restored");
}

#[test]
fn top_on_a_pipe_prints_each_refresh_as_plain_text() {
    let m = Mount::new();
    let holder = Bg::ready(&m.path, "exec flock jobs sh -c 'echo ready; exec sleep 60'");
    let o = run_timeout(Command::new(leasefs_bin()).arg("top").arg(&m.path).args(["-n", "2", "-d", "0.2"]), STEP);
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains('\x1b'), "no escape sequences on a pipe: {out:?}");
    let blocks: Vec<&str> = out.split("\n\n").filter(|b| !b.trim().is_empty()).collect();
    assert_eq!(blocks.len(), 2, "two refreshes: {out}");
    for b in blocks {
        let lines: Vec<&str> = b.lines().collect();
        assert!(lines[0].contains("held 1") && lines[0].contains("grants "), "{b}");
        assert!(lines[1].starts_with("PATH ") && lines[1].contains("WAITERS"), "{b}");
        let c: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!((c[0], c[1].to_string()), ("/jobs", format!("{}/flock", holder.pid())), "{b}");
    }
    // Not a leasefs mount: one line, exit 1.
    let o = run_timeout(Command::new(leasefs_bin()).args(["top", "/tmp"]), STEP);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a leasefs mount"), "{o:?}");
}

/// Every metric the shipped Grafana dashboard queries is one the daemon
/// exports, and it covers what operators watch.
#[test]
fn the_grafana_dashboard_queries_only_metrics_the_daemon_exports() {
    let m = Mount::new();
    sh_ok(&m.path, "flock a true && printf x > f && sync f && setfattr -n user.leasefs.ttl -v 30s a");
    let metrics = std::fs::read_to_string(m.p(".leasefs/metrics")).unwrap();
    let exported =
        |name: &str| metrics.lines().any(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])));
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/grafana-leasefs.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queried = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("leasefs_") {
                let name: String = rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                rest = &rest[i + name.len()..];
                queried.push(name);
            }
        }
    }
    assert!(!queried.is_empty());
    for name in &queried {
        assert!(exported(name), "the dashboard queries {name}, which the daemon does not export:\n{metrics}");
    }
    for wanted in [
        "leasefs_leases",
        "leasefs_acquisitions_total",
        "leasefs_breaks_total",
        "leasefs_fenced_operations_total",
        "leasefs_limit_used",
        "leasefs_state_bytes",
    ] {
        assert!(queried.iter().any(|q| q == wanted), "the dashboard shows {wanted}");
    }
    for state in ["held", "awaited", "with_ttl"] {
        assert!(metrics.contains(&format!("leasefs_leases{{state=\"{state}\"")), "{metrics}");
    }
    assert!(
        metrics.contains("leasefs_leases{state=\"with_ttl\",")
            && metrics.contains("leasefs_state_bytes{file=\"snapshot\"")
    );
}
