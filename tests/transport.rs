//! The transport between the kernel and the daemon: `/dev/fuse` or
//! FUSE-over-io_uring (one queue per CPU). Every other test runs on
//! whichever transport `LEASEFS_TRANSPORT` names (scripts/test.sh runs the
//! suite on both where the kernel allows io_uring); these check the choice
//! itself, and what io_uring changes: requests from two CPUs served side by
//! side, parked waits holding ring entries.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{leasefs_bin, py_ok, run_timeout, sh_code, sh_ok, Bg, Mount, STEP};

fn status(m: &Mount) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(m.p(".leasefs/status")).unwrap()).unwrap()
}

/// Whether the fuse module lets daemons use io_uring here.
fn uring_allowed() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|s| s.trim() == "Y")
}

fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    s.trim().rsplit(['-', ',']).next().unwrap().parse::<usize>().unwrap() + 1
}

/// Wait (at most 60 s) until `n` lock waits are parked in the daemon.
fn wait_parked(m: &Mount, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(m);
        if s["limits"]["waiters"]["used"].as_u64().unwrap() >= n as u64 {
            return;
        }
        assert!(Instant::now() < deadline, "{n} waiters never reached the daemon: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// End the holder; the waiters' script reports `fails=0` when every one
/// was granted.
fn all_granted(holder: Bg, mut waiters: Bg) {
    drop(holder);
    waiters.wait(Duration::from_secs(60));
    let lines = waiters.output_to_end();
    assert!(lines.iter().any(|l| l == "fails=0"), "every waiter was granted: {lines:?}");
}

#[test]
fn the_mount_is_served_by_the_transport_asked_for() {
    let m = Mount::with_args(&["--transport", "dev"]);
    let s = status(&m);
    assert_eq!(s["transport"]["kind"], "dev", "{s}");
    assert_eq!(s["transport"]["why"], "--transport dev");
    let metrics = std::fs::read_to_string(m.p(".leasefs/metrics")).unwrap();
    assert!(metrics.contains("leasefs_transport{kind=\"dev\"") && !metrics.contains("leasefs_uring_"), "{metrics}");
    assert_eq!(s["transport"]["queues"].as_array().unwrap().len(), 0);
    drop(m);

    if uring_allowed() {
        let m = Mount::with_args(&["--transport", "uring"]);
        sh_ok(&m.path, "echo x > f; cat f; flock f true");
        let s = status(&m);
        assert_eq!(s["transport"]["kind"], "uring", "{s}");
        let queues = s["transport"]["queues"].as_array().unwrap();
        assert_eq!(queues.len(), possible_cpus(), "one queue per possible CPU: {s}");
        let served: u64 = queues.iter().map(|q| q["served"].as_u64().unwrap()).sum();
        assert!(served >= 5, "requests went through the rings: {s}");
        assert!(queues.iter().all(|q| q["entries"].as_u64().unwrap() >= 8), "{s}");
        // The same in /metrics and in `leasefs status`.
        let metrics = std::fs::read_to_string(m.p(".leasefs/metrics")).unwrap();
        assert!(metrics.contains("leasefs_transport{kind=\"uring\""), "{metrics}");
        for q in 0..queues.len() {
            assert!(metrics.contains(&format!("leasefs_uring_requests_total{{queue=\"{q}\"")), "{metrics}");
        }
        let table = run_timeout(Command::new(leasefs_bin()).args(["status", m.path.to_str().unwrap()]), STEP);
        let table = String::from_utf8_lossy(&table.stdout).into_owned();
        assert!(table.contains(&format!("transport    io_uring, {} queues", queues.len())), "{table}");
        // auto takes io_uring when the kernel offers it.
        drop(m);
        let m = Mount::with_args(&["--transport", "auto"]);
        assert_eq!(status(&m)["transport"]["kind"], "uring");
    } else {
        // auto falls back and says why; uring refuses to mount.
        let m = Mount::with_args(&["--transport", "auto"]);
        let s = status(&m);
        assert_eq!(s["transport"]["kind"], "dev", "{s}");
        assert!(s["transport"]["why"].as_str().unwrap().contains("enable_uring"), "{s}");
        drop(m);
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("m");
        std::fs::create_dir(&mnt).unwrap();
        let o = run_timeout(
            Command::new(leasefs_bin())
                .args(["mount", mnt.to_str().unwrap(), "--transport", "uring", "--state-dir"])
                .arg(dir.path().join("s")),
            Duration::from_secs(30),
        );
        assert!(!o.status.success(), "--transport uring mounted without io_uring");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("io_uring") && err.contains("enable_uring"), "{err}");
    }
}

/// A `flock` lock goes with the last close of its file description, a
/// release the kernel sends after `close` returned, on the closing CPU's
/// queue. A process on the other CPU that locks right after must find the
/// lock free, as it does through `/dev/fuse`'s single queue.
#[test]
fn a_lock_released_on_one_cpu_is_free_for_a_process_on_the_other() {
    if possible_cpus() < 2 || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("one CPU: nothing to cross");
        return;
    }
    let m = Mount::new();
    sh_ok(&m.path, "touch L S");
    // Other requests keep both queues busy meanwhile.
    let _load = Bg::ready(&m.path, "echo ready; while :; do flock -n S true; stat S >/dev/null; done");
    let out = py_ok(
        &m.path,
        r#"
import fcntl, os
N = 1500
a2b_r, a2b_w = os.pipe()
b2a_r, b2a_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.sched_setaffinity(0, {1})
    refused = 0
    for _ in range(N):
        os.read(a2b_r, 1)
        fd = os.open("L", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            refused += 1
        os.close(fd)
        os.write(b2a_w, b"x")
    os.write(b2a_w, str(refused).encode())
    os._exit(0)
os.sched_setaffinity(0, {0})
for _ in range(N):
    fd = os.open("L", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.close(fd)
    os.write(a2b_w, b"x")
    os.read(b2a_r, 1)
os.waitpid(pid, 0)
print(os.read(b2a_r, 32).decode())
"#,
    );
    assert_eq!(out.trim(), "0", "locks refused although their last holder had closed");
}

/// Waits parked past the ring entries a queue started with: every waiter is
/// parked, other requests are still served at once, and every waiter is
/// granted once the holder lets go.
#[test]
fn hundreds_of_parked_waiters_leave_the_mount_serving() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L other; echo data > f");
    let holder = Bg::ready(&m.path, "flock L sh -c 'echo ready; exec sleep 60'");
    const WAITERS: usize = 300;
    // In batches of 30, each parked before the next starts: the queues
    // grow step by step (one burst: a_burst_of_waiters_on_one_cpu_parks_every_one).
    let go = m.dir.path().join("go");
    let waiters = Bg::ready(
        &m.path,
        &format!(
            "pids=; echo ready; for b in $(seq 10); do \
               for i in $(seq 30); do flock -w 120 L true & pids=\"$pids $!\"; done; \
               while [ ! -e {go}$b ]; do sleep 0.02; done; done; \
             fails=0; for p in $pids; do wait $p || fails=$((fails+1)); done; echo fails=$fails",
            go = go.display()
        ),
    );
    for batch in 1..=WAITERS / 30 {
        wait_parked(&m, batch * 30);
        std::fs::write(format!("{}{batch}", go.display()), "").unwrap();
    }
    let t = Instant::now();
    assert_eq!(sh_ok(&m.path, "cat f; stat -c %s other; flock -n other echo locked").trim(), "data\n0\nlocked");
    assert!(t.elapsed() < Duration::from_secs(10), "other requests waited {:?}", t.elapsed());
    let s = status(&m);
    if s["transport"]["kind"] == "uring" {
        let queues = s["transport"]["queues"].as_array().unwrap();
        let entries: u64 = queues.iter().map(|q| q["entries"].as_u64().unwrap()).sum();
        let held: u64 = queues.iter().map(|q| q["held"].as_u64().unwrap()).sum();
        assert!(held >= WAITERS as u64, "every parked wait holds its entry: {s}");
        assert!(entries >= held + 4, "entries registered beyond the parked ones: {s}");
    }
    all_granted(holder, waiters);
    assert_eq!(sh_code(&m.path, "flock -n L true"), 0);
}

/// A conflict is decided again only once the file's flushed descriptors
/// were released, but a descriptor closed while a duplicate stays open (a
/// forked child keeps it) is released only at its last close: its flush
/// delays conflicts for a moment after it, not every later one, and never
/// stops a queue from serving. 600 refused `flock -n` from processes on
/// both CPUs, each behind such a close, finish well within the step limit
/// (at 100 ms each they would take a minute), and the lock is still held.
#[test]
fn conflicts_behind_a_descriptor_kept_by_a_child_are_refused_promptly() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let holder = Bg::ready(&m.path, "flock L sh -c 'echo ready; exec sleep 60'");
    let out = py_ok(
        &m.path,
        r#"
import fcntl, os, sys
cpus = sorted(os.sched_getaffinity(0))
# A descriptor of L flushed by its close in this process, kept open (not
# released) by a child until the end.
fd = os.open("L", os.O_RDWR)
keeper = os.fork()
if keeper == 0:
    import time; time.sleep(60)
    os._exit(0)
os.close(fd)
kids = []
for k in range(2):
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {cpus[k % len(cpus)]})
        refused = 0
        for _ in range(300):
            fd = os.open("L", os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                refused += 1
            os.close(fd)
        os._exit(0 if refused == 300 else 1)
    kids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]
os.kill(keeper, 9)
os.waitpid(keeper, 0)
print(codes)
"#,
    );
    assert_eq!(out.trim(), "[0, 0]", "every attempt on the held lock was refused");
    assert_eq!(sh_code(&m.path, "flock -n L true"), 1, "the holder still has it");
    drop(holder);
    assert_eq!(sh_code(&m.path, "flock -w 10 L true"), 0);
}

/// A burst of blocking lock requests from one CPU, far more than its queue
/// has free ring entries (400 processes, opened and released at once):
/// every one of them reaches the daemon and parks (none is left waiting in
/// the kernel for an entry), other requests from that CPU are answered
/// meanwhile, and all are granted in the end.
#[test]
fn a_burst_of_waiters_on_one_cpu_parks_every_one() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L; echo data > f");
    let holder = Bg::ready(&m.path, "flock L sh -c 'echo ready; exec sleep 120'");
    const WAITERS: usize = 400;
    let waiters = Bg::ready(
        &m.path,
        &format!(
            "echo ready; exec taskset -c 0 python3 -c '
import fcntl, os
r, w = os.pipe()
kids = []
for _ in range({WAITERS}):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        fd = os.open(\"L\", os.O_RDWR)
        os.read(r, 1)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os._exit(0)
    kids.append(pid)
# All at once: every child wakes on the end of the pipe.
os.close(w)
fails = sum(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) != 0 for p in kids)
print(\"fails=%d\" % fails, flush=True)
'"
        ),
    );
    // Watch from another CPU: requests from CPU 0 would let the kernel hand
    // queued requests to the entries they free.
    let cpus = possible_cpus().min(std::thread::available_parallelism().map_or(1, |n| n.get()));
    if cpus > 1 {
        // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(1, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
        }
    }
    wait_parked(&m, WAITERS);
    let o = run_timeout(
        Command::new("taskset").args(["-c", "0", "sh", "-c", "cat f; stat -c %s L"]).current_dir(&m.path),
        STEP,
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "data\n0\n", "{o:?}");
    all_granted(holder, waiters);
}

/// Waiters that keep arriving on both CPUs while the queues grow (8 000
/// threads of four processes, each blocking in `flock` on its own
/// descriptor of one of 10 held files): every one reaches the daemon and
/// parks, and all are granted in the end. (Python threads arrive too
/// slowly to strand a kick in the kernel's queue; the retry for that is
/// exercised by `scripts/waitbench.sh`, not here.)
#[test]
fn thousands_of_waiters_arriving_on_both_cpus_all_park() {
    let m = Mount::new();
    sh_ok(&m.path, "for i in 0 1 2 3 4 5 6 7 8 9; do touch W$i; done");
    let holder = Bg::ready(
        &m.path,
        "exec python3 -c 'import fcntl, os, time
fds = [os.open(\"W%d\" % i, os.O_RDWR) for i in range(10)]
for f in fds: fcntl.flock(f, fcntl.LOCK_EX)
print(\"ready\", flush=True)
time.sleep(120)'",
    );
    const WAITERS: usize = 8000;
    // Four processes of 2 000 threads, starting their threads together.
    let waiters = Bg::ready(
        &m.path,
        "echo ready; exec python3 -c '
import fcntl, os, threading
threading.stack_size(64 * 1024)
r, w = os.pipe()
kids = []
for p in range(4):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        fails = []
        def wait(k):
            try:
                fd = os.open(\"W%d\" % (k % 10), os.O_RDWR)
                fcntl.flock(fd, fcntl.LOCK_EX)
                os.close(fd)
            except OSError as e:
                fails.append(e)
        os.read(r, 1)
        ts = [threading.Thread(target=wait, args=(k,)) for k in range(2000)]
        for t in ts: t.start()
        for t in ts: t.join()
        os._exit(1 if fails else 0)
    kids.append(pid)
os.close(w)
fails = sum(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) != 0 for p in kids)
print(\"fails=%d\" % fails, flush=True)
'",
    );
    wait_parked(&m, WAITERS);
    assert_eq!(sh_ok(&m.path, "stat -c %s W0").trim(), "0");
    all_granted(holder, waiters);
}

/// Answers to clients that may run on either CPU are committed as an
/// idle-policy thread (so the client is woken on its own CPU); answers to
/// clients pinned to one CPU are not, and the queue threads are back to the
/// normal policy between rounds.
#[test]
fn answers_to_movable_clients_are_committed_as_an_idle_thread_and_pinned_ones_are_not() {
    let m = Mount::new();
    let s0 = status(&m);
    if s0["transport"]["kind"] != "uring" || possible_cpus() < 2 {
        return;
    }
    sh_ok(&m.path, "touch L");
    // Every request of a step comes from processes bound to CPU 0, the
    // status reads included; they enter the mount only once bound (a
    // `current_dir` would be entered before `taskset` binds).
    let status = m.p(".leasefs/status");
    let woken = || -> u64 {
        let o = run_timeout(Command::new("taskset").args(["-c", "0", "cat"]).arg(&status), STEP);
        let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        s["transport"]["queues"].as_array().unwrap().iter().map(|q| q["woken_here"].as_u64().unwrap()).sum()
    };
    let before = woken();
    let lock = |cpus: &str| {
        let script = format!("cd '{}' && for i in $(seq 50); do flock L true; done", m.path.display());
        let o = run_timeout(Command::new("taskset").args(["-c", cpus, "sh", "-c", &script]), STEP);
        assert!(o.status.success(), "{o:?}");
    };
    lock("0");
    let pinned = woken();
    assert_eq!(pinned, before, "answers to pinned clients were committed as an idle thread");
    lock("0,1");
    let movable = woken();
    assert!(movable >= pinned + 50, "answers to movable clients: {pinned} -> {movable}");
    // Back to SCHED_OTHER (policy 0) once the rounds are done.
    let task = format!("/proc/{}/task", m.pid());
    for t in std::fs::read_dir(&task).unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.starts_with("fuse-ring-") {
            let sched = std::fs::read_to_string(t.path().join("sched")).unwrap_or_default();
            let policy = sched.lines().find(|l| l.starts_with("policy")).unwrap_or_default().to_string();
            assert!(
                policy.ends_with(": 0") || policy.ends_with(":0") || policy.trim_end().ends_with(" 0"),
                "{comm}: {policy}"
            );
        }
    }
}
