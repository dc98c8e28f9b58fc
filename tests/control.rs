//! The `.leasefs/` control directory and the `status`, `leases` and `break`
//! commands (SPEC 8).

use std::process::Command;

use crate::util::{epoch, leasefs_bin, py_ok, run_timeout, sh, sh_ok, unlabeled, wait_timeout, Bg, Mount, STEP};

fn leasefs(args: &[&str]) -> (bool, String, String) {
    let o = run_timeout(Command::new(leasefs_bin()).args(args), STEP);
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn control_directory_is_hidden_and_reports_status_leases_and_metrics() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L && setfattr -n user.leasefs.ttl -v 30s L");
    let listing = sh_ok(&m.path, "ls -A");
    assert_eq!(listing, "L\n", ".leasefs is not listed by readdir");
    assert_eq!(sh_ok(&m.path, "ls .leasefs"), "break\nevents\nfaults\nleases\nmetrics\nstatus\n");
    let h = Bg::ready(&m.path, "exec flock L sh -c 'echo ready; exec sleep 60'");
    let _w = Bg::spawn(&m.path, "exec flock L true");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let out = py_ok(
        &m.path,
        r#"
import json
s = json.load(open(".leasefs/status"))
rows = [json.loads(l) for l in open(".leasefs/leases")]
print(json.dumps({"status": s, "rows": rows}))
"#,
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let s = &v["status"];
    assert_eq!(s["pid"].as_i64().unwrap(), m.pid() as i64);
    assert_eq!(s["mount_point"].as_str().unwrap(), m.path.to_str().unwrap());
    assert!(s["version"].is_string() && s["uptime_secs"].as_f64().unwrap() >= 0.0);
    assert_eq!(s["leases"]["held"], 1);
    assert_eq!(s["leases"]["awaited"], 1);
    assert!(s["epoch_ceiling"].as_u64().unwrap() >= 1, "the granted epoch is below the durable ceiling: {s}");
    let row = &v["rows"][0];
    assert_eq!(row["path"], "/L");
    assert_eq!(row["epoch"], 1);
    assert_eq!(row["waiters"], 1);
    assert_eq!(row["ttl_ms"], 30000);
    assert!(row["expires_in_ms"].as_i64().unwrap() > 0);
    let holder = &row["holders"][0];
    assert_eq!(holder["kind"], "flock");
    assert!(holder["since_ms_ago"].is_u64());
    let flock_pid = sh_ok(&m.path, &format!("echo {}", h.pid())).trim().parse::<i64>().unwrap();
    assert_eq!(holder["pid"].as_i64().unwrap(), flock_pid, "the holder is the flock process");
    let labelled = sh_ok(&m.path, "cat .leasefs/metrics");
    let mount_label = format!("mount=\"{}\"", m.path.display());
    assert!(labelled.contains(&format!("leasefs_acquisitions_total{{{mount_label}}} 1")), "{labelled}");
    assert!(labelled.contains("leasefs_build_info{version="), "{labelled}");
    let metrics = unlabeled(&labelled);
    for name in [
        "leasefs_acquisitions_total 1",
        "leasefs_contention_total 1",
        "leasefs_wait_seconds_bucket",
        "leasefs_breaks_total 0",
        "leasefs_fenced_operations_total 0",
        "leasefs_cas_rejections_total 0",
    ] {
        assert!(metrics.contains(name), "metrics lack {name}:\n{metrics}");
    }
}

#[test]
fn control_files_refuse_changes() {
    let m = Mount::new();
    for (cmd, want) in [
        ("echo x > .leasefs/status", "Permission denied"),
        ("touch .leasefs/new", "Operation not permitted"),
        ("rm .leasefs/status", "Operation not permitted"),
        ("mkdir .leasefs", "File exists"),
        ("touch A && mv A .leasefs/x", "Operation not permitted"),
        ("chmod 666 .leasefs/status", "Operation not permitted"),
        ("setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'echo L > .leasefs/break'", "Permission denied"),
    ] {
        let o = sh(&m.path, cmd);
        assert!(!o.status.success(), "`{cmd}` succeeded");
        assert!(String::from_utf8_lossy(&o.stderr).contains(want), "`{cmd}`: {o:?}");
    }
}

#[test]
fn break_fences_the_holder_and_the_next_grant_gets_epoch_plus_one() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let h = Bg::ready(
        &m.path,
        "exec 9<>L; flock 9; echo ready; while [ ! -e go ]; do sleep 0.02; done; \
         if echo more >&9 2>/dev/null; then echo wrote; else echo refused; fi; exec sleep 60",
    );
    let before = epoch(&m.path, "L");
    let (ok, _, err) = leasefs(&["break", m.path.to_str().unwrap(), "L"]);
    assert!(ok, "{err}");
    assert_eq!(sh(&m.path, "flock -n L true").status.code(), Some(0), "broken: the next contender gets it");
    assert_eq!(epoch(&m.path, "L"), before + 1);
    sh_ok(&m.path, "touch go");
    assert_eq!(h.first_line(STEP, "the holder's write"), "refused", "the broken holder's write must be fenced");
    assert_eq!(sh_ok(&m.path, "cat L"), "", "nothing landed");
    let metrics = unlabeled(&sh_ok(&m.path, "cat .leasefs/metrics"));
    assert!(
        metrics.contains("leasefs_breaks_total 1") && metrics.contains("leasefs_fenced_operations_total 1"),
        "{metrics}"
    );
    // Every refusal is counted by its errno: the fenced write is the one ESTALE.
    assert!(metrics.contains("leasefs_refusals_total{errno=\"ESTALE\"} 1\n"), "{metrics}");
    assert!(!sh(&m.path, "mkdir -p e/f && rmdir e").status.success());
    let metrics = unlabeled(&sh_ok(&m.path, "cat .leasefs/metrics"));
    assert!(metrics.contains("leasefs_refusals_total{errno=\"ENOTEMPTY\"} 1\n"), "{metrics}");
}

#[test]
fn break_all_fences_every_holder_at_once_and_waiters_get_the_leases() {
    let m = Mount::new();
    let mp = m.path.to_str().unwrap();
    sh_ok(&m.path, "mkdir d && touch A d/B free");
    let holder = |f: &str| {
        Bg::ready(
            &m.path,
            &format!(
                "exec 9<>{f}; flock 9; echo ready; while [ ! -e go ]; do sleep 0.02; done; \
                 if echo more >&9 2>/dev/null; then echo wrote; else echo refused; fi; exec sleep 60"
            ),
        )
    };
    let (a, b) = (holder("A"), holder("d/B"));
    let mut waiter = Bg::spawn(&m.path, "exec flock A sh -c 'echo got > got'");
    waiter.wait_blocked();
    let (ea, eb) = (epoch(&m.path, "A"), epoch(&m.path, "d/B"));
    let (ok, _, err) = leasefs(&["break", mp]);
    assert!(!ok && err.contains("--all"), "a path or --all is required: {err}");
    let o = sh(&m.path, "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c 'printf \"\\0\" > .leasefs/break'");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"), "{o:?}");
    let (ok, _, err) = leasefs(&["break", "--all", mp]);
    assert!(ok, "{err}");
    assert!(waiter.wait(STEP).success(), "the waiter on A is granted");
    assert_eq!(sh_ok(&m.path, "cat got"), "got\n");
    assert_eq!(epoch(&m.path, "A"), ea + 1, "the waiter's grant is the next epoch");
    assert_eq!(sh(&m.path, "flock -n d/B true").status.code(), Some(0), "B is free");
    assert_eq!(epoch(&m.path, "d/B"), eb + 1);
    sh_ok(&m.path, "touch go");
    for (h, f) in [(&a, "A"), (&b, "d/B")] {
        assert_eq!(h.first_line(STEP, &format!("the holder of {f}")), "refused", "the holder of {f} must be fenced");
    }
    let metrics = unlabeled(&sh_ok(&m.path, "cat .leasefs/metrics"));
    assert!(metrics.contains("leasefs_breaks_total 2"), "{metrics}");
    // Nothing held: breaking everything again is a no-op that succeeds.
    sh_ok(&m.path, "rm got");
    let (ok, _, err) = leasefs(&["break", "--all", mp]);
    assert!(ok, "{err}");
    assert!(unlabeled(&sh_ok(&m.path, "cat .leasefs/metrics")).contains("leasefs_breaks_total 2"));
    assert_eq!(sh_ok(&m.path, "cat free"), "");
}

#[test]
fn status_leases_and_break_commands() {
    let m = Mount::new();
    let mp = m.path.to_str().unwrap();
    sh_ok(&m.path, "mkdir d && touch d/L");
    let _h = Bg::ready(&m.path, "exec flock d/L sh -c 'echo ready; exec sleep 60'");
    let (ok, out, err) = leasefs(&["status", mp]);
    assert!(ok, "{err}");
    assert!(out.contains("daemon pid") && out.contains("1 held"), "{out}");
    let row = |name: &str| out.lines().find(|l| l.starts_with(name)).map(|l| l[name.len()..].trim().to_string());
    assert!(row("inodes").is_some_and(|r| r.starts_with("3 of ")), "root, d, d/L (.leasefs is not counted): {out}");
    assert!(row("space").is_some_and(|r| r.starts_with("0 B of ")), "{out}");
    assert!(row("state dir").is_some_and(|s| s.ends_with("(durable)") || s.ends_with("(volatile)")), "{out}");
    assert!(row("epochs").is_some_and(|s| s.starts_with("ceiling ")), "{out}");
    assert_eq!(row("metrics"), Some(format!("{mp}/.leasefs/metrics")), "{out}");
    let (ok, out, _) = leasefs(&["status", mp, "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["leases"]["held"], 1);
    let (ok, out, _) = leasefs(&["leases", mp]);
    assert!(ok, "{out}");
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["PATH", "HOLDER", "MODE", "API", "EPOCH", "HELD", "WAITERS", "EXPIRES"], "{out}");
    let row = &lines[1];
    assert_eq!((row[0], row[2], row[3], row[6], row[7]), ("/d/L", "exclusive", "flock", "0", "-"), "{out}");
    assert!(row[1].ends_with("/flock"), "the holder is shown as pid/comm: {out}");
    assert!(row[5].ends_with("ms") || row[5].ends_with('s'), "held for a human age: {out}");
    let (ok, out, _) = leasefs(&["leases", mp, "--wide"]);
    assert!(ok && out.lines().next().unwrap().ends_with("INODE  VERSION  TTL"), "{out}");
    let (ok, out, _) = leasefs(&["leases", mp, "--json"]);
    assert!(ok && serde_json::from_str::<serde_json::Value>(out.lines().next().unwrap()).is_ok(), "{out}");
    let abs = m.p("d/L");
    let (ok, _, err) = leasefs(&["break", mp, abs.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, _, err) = leasefs(&["break", mp, "d/missing"]);
    assert!(!ok && err.contains("No such file"), "{err}");
    let plain = tempfile::tempdir().unwrap();
    let (ok, _, err) = leasefs(&["status", plain.path().to_str().unwrap()]);
    assert!(!ok && err.contains("not a leasefs mount"), "{err}");
}

#[test]
fn commands_explain_a_dead_daemon() {
    let mut m = Mount::new();
    // SAFETY: killing our own child.
    unsafe { libc::kill(m.pid(), libc::SIGKILL) };
    let mut child = m.child.take().unwrap();
    wait_timeout(&mut child, STEP, "killed daemon");
    let (ok, _, err) = leasefs(&["leases", m.path.to_str().unwrap()]);
    assert!(!ok && err.contains("Transport endpoint is not connected"), "{err}");
    let (ok, _, _) = leasefs(&["unmount", m.path.to_str().unwrap()]);
    assert!(ok);
}

#[test]
fn grants_breaks_fences_and_cas_rejections_are_logged_with_path_epoch_and_pid() {
    let logdir = tempfile::tempdir().unwrap();
    let log = logdir.path().join("daemon.log");
    let m = crate::util::Mount::with_args_env(
        &["--allow-other", "--log-file", log.to_str().unwrap()],
        &[("RUST_LOG", "debug")],
    );
    sh_ok(&m.path, "mkdir d && touch d/L && flock d/L true");
    let h = Bg::ready(
        &m.path,
        "exec 9<>d/L; flock 9; echo ready; while [ ! -e go ]; do sleep 0.02; done; echo x >&9; exec sleep 60",
    );
    let (ok, _, err) = leasefs(&["break", m.path.to_str().unwrap(), "d/L"]);
    assert!(ok, "{err}");
    sh_ok(&m.path, "touch go");
    let deadline = std::time::Instant::now() + STEP;
    py_ok(
        &m.path,
        r#"
import os, subprocess, sys
open("j", "w").write("a"); os.stat("j")
subprocess.run([sys.executable, "-c", "open('j', 'a').write('b')"], check=True)
open("t", "w").write("c")
try:
    os.rename("t", "j")
except OSError:
    pass
"#,
    );
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let done =
            ["lock granted", "lease broken", "fenced", "compare-and-swap rejected"].iter().all(|k| text.contains(k));
        if done || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(h);
    for (what, path) in
        [("lock granted", "/d/L"), ("lease broken", "/d/L"), ("fenced", "/d/L"), ("compare-and-swap rejected", "/j")]
    {
        let ok = text.lines().any(|l| {
            l.contains(what) && l.contains(&format!("path={path}")) && l.contains("pid=") && l.contains("epoch")
        });
        assert!(ok, "no {what:?} line with path {path}, pid and epoch in:\n{text}");
    }
}

/// `.leasefs/leases` is rendered as it is read (tiny reads see the same
/// rows as one large read; reads may skip ahead or start over), a path
/// prefix written to the descriptor narrows it to that subtree (whole path
/// components: `/a/1` is not `/a/10`), and `leasefs leases` passes a
/// prefix and stops reading at `--limit`.
#[test]
fn the_leases_listing_is_streamed_filtered_by_prefix_and_limited() {
    let m = Mount::new();
    let mp = m.path.to_str().unwrap();
    sh_ok(&m.path, "mkdir a b ab && touch b/x ab/y && for i in $(seq 1 300); do : > a/$i; done");
    let _h = Bg::ready(
        &m.path,
        "exec python3 -c '
import fcntl, os, time
fds = [os.open(p, os.O_RDWR) for p in [\"a/%d\" % i for i in range(1, 301)] + [\"b/x\", \"ab/y\"]]
for fd in fds: fcntl.flock(fd, fcntl.LOCK_EX)
print(\"ready\", flush=True)
time.sleep(120)
'",
    );
    let out = py_ok(
        &m.path,
        r#"
import errno, json, os
whole = open(".leasefs/leases", "rb").read()
fd = os.open(".leasefs/leases", os.O_RDONLY)
small = b""
while True:
    b = os.read(fd, 37)
    if not b: break
    small += b
again = os.pread(fd, 1000, 0).split(b"\n")[0]
os.close(fd)
fd = os.open(".leasefs/leases", os.O_RDONLY)
ahead, past = os.pread(fd, 100, 5000), os.pread(fd, 100, len(whole) + 10000)
os.close(fd)
def rows(text):
    return [(r["path"], r["epoch"], [h["pid"] for h in r["holders"]]) for r in map(json.loads, text.splitlines())]
def listed(prefix):
    fd = os.open(".leasefs/leases", os.O_RDWR)
    assert os.write(fd, prefix.encode()) == len(prefix)
    out = b""
    while True:
        b = os.read(fd, 4096)
        if not b: break
        out += b
    os.close(fd)
    return [json.loads(l)["path"] for l in out.splitlines()]
fd = os.open(".leasefs/leases", os.O_RDWR)
try:
    os.write(fd, b"relative")
    bad = 0
except OSError as e:
    bad = e.errno
print(json.dumps({
    "paths": [json.loads(l)["path"] for l in whole.splitlines()],
    # Rows are rendered when read: only their ages may differ.
    "same": rows(small) == rows(whole), "again": json.loads(again)["path"] == "/a/1",
    "ahead": len(ahead) == 100 and past == b"",
    "a": listed("/a"), "a1": listed("/a/1\n"), "b": listed("/b/"), "root": len(listed("/")),
    "bad": bad == errno.EINVAL,
}))
"#,
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let paths: Vec<&str> = v["paths"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(paths.len(), 302, "{paths:?}");
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted, "rows come in path order");
    assert_eq!(paths[0], "/a/1");
    assert!(paths.contains(&"/ab/y") && paths.contains(&"/b/x"));
    for k in ["same", "again", "ahead", "bad"] {
        assert_eq!(v[k], true, "{k}: {v}");
    }
    assert_eq!(v["a"].as_array().unwrap().len(), 300, "/a holds 300, /ab is not under it: {v}");
    assert_eq!(v["a1"], serde_json::json!(["/a/1"]), "{v}");
    assert_eq!(v["b"], serde_json::json!(["/b/x"]), "{v}");
    assert_eq!(v["root"], 302);

    let (ok, out, err) = leasefs(&["leases", mp, "b"]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 2, "header and /b/x: {out}");
    assert!(rows[1].starts_with("/b/x "), "{out}");
    let (ok, out, err) = leasefs(&["leases", mp, "--limit", "5", "--json"]);
    assert!(ok, "{err}");
    let got: Vec<String> =
        out.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["path"].to_string()).collect();
    assert_eq!(got, ["\"/a/1\"", "\"/a/10\"", "\"/a/100\"", "\"/a/101\"", "\"/a/102\""], "{out}");
    let (ok, out, _) = leasefs(&["leases", mp, "/a", "-n", "3"]);
    assert!(ok && out.lines().count() == 4, "header and three rows: {out}");
}
