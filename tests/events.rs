//! `.leasefs/events` and `leasefs watch` (SPEC 8), read by other processes.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{leasefs_bin, py_ok, sh_ok, Bg, Mount, STEP};

/// A reader in its own process: opens the stream, says `ready`, then
/// prints every event line until it sees a grant of `/END`.
const READER: &str = r#"
import json, os, sys
fd = os.open(".leasefs/events", os.O_RDONLY)
print("ready", flush=True)
buf = b""
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        sys.exit("stream ended")
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        ev = json.loads(line)
        print(line.decode(), flush=True)
        if ev["event"] == "grant" and ev["path"] == "/END":
            sys.exit(0)
"#;

fn events_of(reader: &mut Bg) -> Vec<serde_json::Value> {
    assert!(reader.wait(STEP).success(), "reader failed: {:?}", reader.output());
    reader.output().iter().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `(event, path, epoch)` of every event about `path`.
fn about<'a>(evs: &'a [serde_json::Value], path: &str) -> Vec<(&'a str, u64)> {
    evs.iter()
        .filter(|e| e["path"] == path)
        .map(|e| (e["event"].as_str().unwrap(), e["epoch"].as_u64().unwrap()))
        .collect()
}

/// Wait until the reader has seen a `event` about `path` (a process
/// sleeping is not enough: it may still be in the open before its lock
/// request).
fn await_event(reader: &Bg, event: &str, path: &str) {
    let deadline = Instant::now() + STEP;
    loop {
        let seen = reader.lines.lock().unwrap().iter().any(|l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|e| e["event"] == event && e["path"] == path)
        });
        if seen {
            return;
        }
        assert!(Instant::now() < deadline, "no {event} event about {path}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_reader_sees_grants_waits_releases_cancels_breaks_fences_and_cas_rejections_in_order() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L W T START END && echo '{}' > lease");
    let script = m.dir.path().join("reader.py");
    std::fs::write(&script, READER).unwrap();
    let mut reader = Bg::ready(&m.path, &format!("exec python3 -u {}", script.display()));
    // A close reaches the daemon after the process exited (the kernel
    // sends RELEASE asynchronously): wait for it so the order is fixed.
    let free = |f: &str| sh_ok(&m.path, &format!("{} wait . {f} --free -w 20", leasefs_bin().display()));
    // Uncontended: grant and release.
    sh_ok(&m.path, "flock L true");
    free("L");
    // Contention: a waiter is granted when the holder goes.
    let holder = Bg::ready(&m.path, "exec flock L sh -c 'echo ready; exec sleep 60'");
    let mut waiter = Bg::spawn(&m.path, "exec flock -w 30 L true");
    await_event(&reader, "wait", "/L");
    drop(holder);
    assert!(waiter.wait(STEP).success());
    free("L");
    // A waiter ended by a signal is a cancel.
    let _w_holder = Bg::ready(&m.path, "exec flock W sh -c 'echo ready; exec sleep 60'");
    let mut cancelled = Bg::spawn(&m.path, "exec flock -w 30 W true");
    await_event(&reader, "wait", "/W");
    cancelled.signal(libc::SIGINT);
    assert!(!cancelled.wait(STEP).success());
    // An administrator breaks T; its holder's next write is fenced.
    let fenced = py_ok(
        &m.path,
        &format!(
            r#"
import fcntl, os, subprocess, errno
fd = os.open("T", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
subprocess.run(["{}", "break", ".", "/T"], check=True)
try:
    os.write(fd, b"x")
    print("written")
except OSError as e:
    print(errno.errorcode[e.errno])
"#,
            leasefs_bin().display()
        ),
    );
    assert_eq!(fenced.trim(), "ESTALE");
    // A stale rename over a JSON lease another process replaced.
    let cas = py_ok(
        &m.path,
        r#"
import errno, os
open("lease").read()
if os.fork() == 0:
    open("lease.B", "w").write("{\"b\": 1}")
    os.rename("lease.B", "lease")
    os._exit(0)
os.wait()
open("lease.A", "w").write("{\"a\": 1}")
try:
    os.rename("lease.A", "lease")
    print("renamed")
except OSError as e:
    print(errno.errorcode[e.errno])
"#,
    );
    assert_eq!(cas.trim(), "ESTALE");
    // A TTL lease whose holder does not renew goes to the contender.
    sh_ok(&m.path, "touch X && setfattr -n user.leasefs.ttl -v 300ms X");
    let _x_holder = Bg::ready(&m.path, "exec flock X sh -c 'echo ready; exec sleep 60'");
    sh_ok(&m.path, "flock -w 20 X true");
    free("X");
    sh_ok(&m.path, "flock END true");
    let evs = events_of(&mut reader);
    let x: Vec<(&str, u64)> = about(&evs, "/X");
    assert_eq!(x, [("grant", 1), ("wait", 1), ("break", 1), ("grant", 2), ("release", 2)], "{evs:#?}");
    let ttl_break = evs.iter().find(|e| e["event"] == "break" && e["path"] == "/X").unwrap();
    assert_eq!(ttl_break["reason"], "ttl");
    assert!(!evs.iter().any(|e| e["path"] == "/START"), "nothing from before the reader opened");
    let l = about(&evs, "/L");
    assert_eq!(
        l,
        [("grant", 1), ("release", 1), ("grant", 2), ("wait", 2), ("release", 2), ("grant", 3), ("release", 3)],
        "{evs:#?}"
    );
    let w: Vec<&str> = about(&evs, "/W").iter().map(|(e, _)| *e).collect();
    assert_eq!(w, ["grant", "wait", "cancel"]);
    let t = about(&evs, "/T");
    // The broken holder holds nothing any more: its close releases nothing.
    assert_eq!(t, [("grant", 1), ("break", 1), ("fence", 1)], "{evs:#?}");
    let brk = evs.iter().find(|e| e["event"] == "break").unwrap();
    assert_eq!((brk["reason"].as_str(), brk["comm"].as_str()), (Some("admin"), Some("python3")));
    let grant = evs.iter().find(|e| e["event"] == "grant" && e["path"] == "/L").unwrap();
    assert_eq!(
        (grant["owner"].as_str(), grant["mode"].as_str(), grant["comm"].as_str()),
        (Some("flock"), Some("exclusive"), Some("flock"))
    );
    assert!(grant["pid"].as_u64().unwrap() > 0 && grant["ts_ms"].as_u64().unwrap() > 1_700_000_000_000);
    // (The kernel retries a path operation once after ESTALE: one or two.)
    let cas = evs.iter().find(|e| e["event"] == "cas_reject").unwrap();
    assert_eq!((cas["path"].as_str(), cas["reason"].as_str()), (Some("/lease"), Some("rename over")), "{cas}");
}

#[test]
fn poll_wakes_on_an_event_nonblock_gives_eagain_and_a_signal_ends_a_blocked_read() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let out = py_ok(
        &m.path,
        r#"
import errno, os, select, signal, subprocess
fd = os.open(".leasefs/events", os.O_RDONLY | os.O_NONBLOCK)
try:
    os.read(fd, 4096)
    print("data")
except OSError as e:
    print(errno.errorcode[e.errno])
p = select.poll()
p.register(fd, select.POLLIN)
print("idle", p.poll(0))
proc = subprocess.Popen(["flock", "L", "true"])
print("woken", [(f == fd, bool(ev & select.POLLIN)) for f, ev in p.poll(10000)])
proc.wait()
# Collect the grant and the release (the close reaches the daemon after exit).
seen = b""
while b"release" not in seen:
    p.poll(10000)
    seen += os.read(fd, 65536)
print("event", b"grant" in seen)
# Blocking read with nothing to come: a signal ends it.
os.set_blocking(fd, True)
class Alarm(Exception): pass
def ring(*_): raise Alarm()
signal.signal(signal.SIGALRM, ring)
signal.setitimer(signal.ITIMER_REAL, 0.3)
try:
    os.read(fd, 4096)
    print("read")
except Alarm:
    print("interrupted")
# The descriptor still works afterwards.
subprocess.run(["flock", "L", "true"], check=True)
print("after", b"release" in os.read(fd, 65536))
"#,
    );
    assert_eq!(out, "EAGAIN\nidle []\nwoken [(True, True)]\nevent True\ninterrupted\nafter True\n");
}

/// A reader killed while its blocking read is on its way to the daemon
/// (the daemon stopped) dies once the daemon runs, with no event to come
/// (through io_uring the kernel sends no FUSE_INTERRUPT for it).
#[test]
fn a_reader_killed_before_its_read_reached_the_daemon_dies() {
    let m = Mount::new();
    let go = m.dir.path().join("go");
    let mut reader = Bg::ready(
        &m.path,
        &format!(
            r#"exec python3 -c '
import os, time
fd = os.open(".leasefs/events", os.O_RDONLY)
print("ready", flush=True)
while not os.path.exists("{go}"): time.sleep(0.002)
print(os.read(fd, 4096), flush=True)
'"#,
            go = go.display()
        ),
    );
    let stopped = m.pause();
    std::fs::write(&go, "").unwrap();
    reader.wait_for_answer();
    reader.signal(libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(50));
    drop(stopped);
    let st = reader.wait(Duration::from_secs(10));
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL), "{st:?}");
}

#[test]
fn a_reader_that_falls_behind_loses_the_oldest_and_is_told_and_the_lock_path_goes_on() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let out = py_ok(
        &m.path,
        r#"
import fcntl, json, os
ev = os.open(".leasefs/events", os.O_RDONLY)
fd = os.open("L", os.O_RDWR)
for _ in range(3000):
    fcntl.flock(fd, fcntl.LOCK_EX)
    fcntl.flock(fd, fcntl.LOCK_UN)
first = json.loads(os.read(ev, 65536).split(b"\n")[0])
print(first["event"], first["count"])
"#,
    );
    // 6000 events into a 4096-line buffer: 1904 lost, reported first.
    assert_eq!(out.trim(), "lost 1904");
}

#[test]
fn leasefs_watch_prints_lines_filters_by_path_and_ends_cleanly_on_ctrl_c() {
    let m = Mount::new();
    sh_ok(&m.path, "mkdir jobs && touch jobs/a other");
    let mp = m.path.to_str().unwrap();
    let mut human = Bg::capture(&m.path, leasefs_bin().to_str().unwrap(), &["watch", mp, "jobs"]);
    let jobs = format!("{mp}/jobs");
    let mut json = Bg::capture(&m.path, leasefs_bin().to_str().unwrap(), &["watch", mp, "--json", "other", &jobs]);
    // The watchers are open once a probe event reaches them.
    let deadline = std::time::Instant::now() + STEP;
    while !(human.output().iter().any(|l| l.contains("/jobs/a")) && json.output().iter().any(|l| l.contains("/jobs/a")))
    {
        assert!(std::time::Instant::now() < deadline, "watchers never saw an event");
        sh_ok(&m.path, "flock jobs/a true");
        std::thread::sleep(Duration::from_millis(100));
    }
    sh_ok(&m.path, "flock other true");
    std::thread::sleep(Duration::from_millis(300));
    human.signal(libc::SIGINT);
    json.signal(libc::SIGINT);
    assert!(human.wait(STEP).success(), "Ctrl-C ends watch with 0");
    assert!(json.wait(STEP).success());
    let h = human.output();
    assert!(h.iter().all(|l| !l.contains("/other")), "filtered to jobs: {h:?}");
    let line = h.iter().find(|l| l.contains("grant")).unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((cols[1], cols[2], cols[3]), ("grant", "/jobs/a", "epoch"), "{line}");
    assert!(cols[5].ends_with("/flock") && line.contains("exclusive"), "{line}");
    let j = json.output();
    assert!(j.iter().any(|l| l.contains("\"/other\"")) && j.iter().any(|l| l.contains("\"/jobs/a\"")), "{j:?}");
    assert!(j.iter().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{j:?}");
    // Not a leasefs mount: one line, exit 1.
    let o = crate::util::run_timeout(Command::new(leasefs_bin()).args(["watch", "/tmp"]), STEP);
    assert_eq!(o.status.code(), Some(1));
}

fn lock_cmd(m: &Mount, args: &[&str]) -> std::process::Output {
    crate::util::run_timeout(Command::new(leasefs_bin()).args(["lock"]).args(args).current_dir(&m.path), STEP)
}

#[test]
fn leasefs_lock_runs_the_command_with_its_epoch_and_follows_flock_exit_codes() {
    let m = Mount::new();
    let o = lock_cmd(&m, &["job", "--", "sh", "-c", "echo $LEASEFS_EPOCH $LEASEFS_PATH; exit 7"]);
    assert_eq!(o.status.code(), Some(7), "the command's status: {o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), format!("1 {}", m.p("job").display()));
    let abs = m.p("job");
    let o = lock_cmd(&m, &[abs.to_str().unwrap(), "--", "sh", "-c", "echo $LEASEFS_EPOCH"]);
    assert_eq!(
        (o.status.code(), String::from_utf8_lossy(&o.stdout).trim()),
        (Some(0), "2"),
        "absolute path, next epoch"
    );
    // Taken: -n and -w fail with 1, or the -E code; the command never runs.
    let _holder = Bg::ready(&m.path, "exec flock job sh -c 'echo ready; exec sleep 60'");
    let o = lock_cmd(&m, &["-n", "job", "--", "touch", "ran"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(lock_cmd(&m, &["-n", "-E", "9", "job", "--", "touch", "ran"]).status.code(), Some(9));
    assert_eq!(lock_cmd(&m, &["-w", "0.3", "job", "--", "touch", "ran"]).status.code(), Some(1));
    assert!(!m.p("ran").exists());
    // Shared leases coexist with shared holders.
    drop(_holder);
    let _reader = Bg::ready(&m.path, "exec flock -s job sh -c 'echo ready; exec sleep 60'");
    assert_eq!(lock_cmd(&m, &["-s", "-n", "job", "--", "true"]).status.code(), Some(0));
    // Not on a leasefs mount: one line, exit 1.
    let o = crate::util::run_timeout(Command::new(leasefs_bin()).args(["lock", "/tmp/x", "--", "true"]), STEP);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not on a leasefs mount"));
}

#[test]
fn leasefs_lock_terminates_the_command_when_its_lease_is_broken_and_exits_75() {
    let m = Mount::new();
    let bin = leasefs_bin();
    // A command that ends on SIGTERM.
    let mut polite = Bg::capture(
        &m.path,
        bin.to_str().unwrap(),
        &[
            "lock",
            "job",
            "--",
            "sh",
            "-c",
            "trap 'echo terminated; exit 0' TERM; echo started; while :; do sleep 0.05; done",
        ],
    );
    let deadline = std::time::Instant::now() + STEP;
    while !polite.output().contains(&"started".to_string()) {
        assert!(std::time::Instant::now() < deadline, "the command never started");
    }
    sh_ok(&m.path, &format!("{} break . /job", bin.display()));
    assert_eq!(polite.wait(STEP).code(), Some(75), "lease lost");
    assert!(polite.output().contains(&"terminated".to_string()), "{:?}", polite.output());
    // A command that ignores SIGTERM is killed after --grace.
    let mut stubborn = Bg::capture(
        &m.path,
        bin.to_str().unwrap(),
        &["lock", "--grace", "300ms", "job", "--", "sh", "-c", "trap '' TERM; echo started; exec sleep 60"],
    );
    while !stubborn.output().contains(&"started".to_string()) {
        assert!(std::time::Instant::now() < deadline, "the command never started");
    }
    let sleeper = sh_ok(&m.path, &format!("pgrep -P {}", stubborn.pid()));
    sh_ok(&m.path, &format!("{} break . /job", bin.display()));
    assert_eq!(stubborn.wait(STEP).code(), Some(75));
    let pid: i32 = sleeper.trim().parse().unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z"),
        "the command was killed"
    );
}

#[test]
fn leasefs_lock_renews_a_ttl_lease_while_the_command_runs_and_wait_follows_it() {
    let m = Mount::new();
    let bin = leasefs_bin();
    sh_ok(&m.path, "touch t");
    // --held times out on a free lease; --free returns at once.
    let w = |args: &[&str]| {
        crate::util::run_timeout(Command::new(&bin).arg("wait").arg(&m.path).args(args), STEP).status.code()
    };
    assert_eq!(w(&["t", "--held", "-w", "0.3"]), Some(1));
    assert_eq!(w(&["t", "--free"]), Some(0));
    let mut lock = Bg::capture(
        &m.path,
        bin.to_str().unwrap(),
        &["lock", "--ttl", "600ms", "t", "--", "sh", "-c", "echo started; sleep 2.5"],
    );
    let deadline = std::time::Instant::now() + STEP;
    while !lock.output().contains(&"started".to_string()) {
        assert!(std::time::Instant::now() < deadline);
    }
    assert_eq!(w(&["t", "--held", "-w", "5"]), Some(0));
    // A contender waits; without renewal the 600 ms TTL would hand it over.
    let mut contender = Bg::spawn(&m.path, "exec flock -w 20 t true");
    contender.wait_blocked();
    assert_eq!(w(&[&m.p("t").to_string_lossy(), "--free", "-w", "20"]), Some(0), "wait sees the lease go");
    assert_eq!(lock.wait(STEP).code(), Some(0), "the lease was renewed, never lost");
    assert!(contender.wait(STEP).success());
}

#[test]
fn a_frozen_command_lets_its_ttl_lease_go_to_a_contender_and_is_terminated() {
    let m = Mount::new();
    let bin = leasefs_bin();
    let mut lock = Bg::capture(
        &m.path,
        bin.to_str().unwrap(),
        &["lock", "--ttl", "1s", "--grace", "1s", "job", "--", "sh", "-c", "echo epoch $LEASEFS_EPOCH; exec sleep 60"],
    );
    let deadline = std::time::Instant::now() + STEP;
    let epoch: u64 = loop {
        if let Some(l) = lock.output().iter().find(|l| l.starts_with("epoch ")) {
            break l[6..].parse().unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "the command never started");
    };
    assert_eq!(crate::util::epoch(&m.path, "job"), epoch, "LEASEFS_EPOCH is the epoch granted");
    // Freeze the command: renewals stop, the TTL runs out, a contender breaks it.
    let sleeper: i32 = sh_ok(&m.path, &format!("pgrep -P {}", lock.pid())).trim().parse().unwrap();
    // SAFETY: stopping a process this test started.
    unsafe { libc::kill(sleeper, libc::SIGSTOP) };
    let contender = py_ok(
        &m.path,
        "import fcntl, os\nfd = os.open('job', os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint(os.getxattr('job', 'user.leasefs.epoch').decode())",
    );
    let theirs: u64 = contender.trim().parse().unwrap();
    assert!(theirs > epoch, "the contender's epoch {theirs} is above the frozen holder's {epoch}");
    assert_eq!(lock.wait(STEP).code(), Some(75), "the command was terminated for losing its lease");
    let gone = !std::path::Path::new(&format!("/proc/{sleeper}")).exists()
        || std::fs::read_to_string(format!("/proc/{sleeper}/stat")).unwrap_or_default().contains(") Z");
    assert!(gone, "the frozen command is gone");
}

#[test]
fn lock_exit_codes_match_flock_1_on_the_same_cases() {
    let m = Mount::new();
    let _holder = Bg::ready(&m.path, "exec flock job sh -c 'echo ready; exec sleep 60'");
    for args in [&["-n"][..], &["-w", "0.2"], &["-n", "-E", "9"], &["-w", "0.2", "-E", "3"]] {
        let flock = crate::util::sh(&m.path, &format!("flock {} job true", args.join(" "))).status.code();
        let mut ours = args.to_vec();
        ours.extend(["job", "--", "true"]);
        assert_eq!(lock_cmd(&m, &ours).status.code(), flock, "leasefs lock {args:?} vs flock(1)");
    }
    drop(_holder);
    let flock = crate::util::sh(&m.path, "flock -n job sh -c 'exit 5'").status.code();
    assert_eq!(lock_cmd(&m, &["-n", "job", "--", "sh", "-c", "exit 5"]).status.code(), flock);
}

#[test]
fn an_uncontended_ttl_lease_reports_its_expiry_once_and_keeps_its_holder() {
    let m = Mount::new();
    sh_ok(&m.path, "touch E && setfattr -n user.leasefs.ttl -v 200ms E");
    let out = py_ok(
        &m.path,
        r#"
import json, os, select, subprocess
ev = os.open(".leasefs/events", os.O_RDONLY)
holder = subprocess.Popen(["python3", "-c", "import fcntl, os, time\nfd = os.open('E', os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\ntime.sleep(60)"])
p = select.poll()
p.register(ev, select.POLLIN)
seen = []
while not any(e["event"] == "expire" for e in seen):
    if not p.poll(10000):
        break
    seen += [json.loads(l) for l in os.read(ev, 65536).splitlines()]
exp = [e for e in seen if e["event"] == "expire"]
print(len(exp), exp[0]["path"], exp[0]["epoch"], exp[0]["pid"] == holder.pid)
# Reported once: nothing more comes while the holder keeps it.
print("quiet", p.poll(500) == [])
print("held", json.loads(os.getxattr("E", "user.leasefs.holder"))["holders"][0]["pid"] == holder.pid)
holder.kill()
holder.wait()
"#,
    );
    assert_eq!(out, "1 /E 1 True\nquiet True\nheld True\n");
}
