//! Several hosts through etcd (SPEC 10): each test starts a real 3-member
//! etcd cluster on loopback and mounts two daemons against it (two
//! "hosts" sharing one lease namespace), and drives them from separate
//! processes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use leasefs::cluster::client::{prefix_end, Client};
use leasefs::cluster::feed::Feed;

use crate::etcd::Cluster;
use crate::util::*;

/// Each test's own key prefix, so a test can never see another's keys.
fn prefix(test: &str) -> String {
    format!("t-{test}-{}", std::process::id())
}

/// A daemon of the namespace `prefix` on `cluster`, with extra arguments.
fn host(cluster: &Cluster, prefix: &str, extra: &[&str]) -> Mount {
    host_env(cluster, prefix, extra, &[])
}

/// [`host`], its daemon started with `env` added.
fn host_env(cluster: &Cluster, prefix: &str, extra: &[&str], env: &[(&str, &str)]) -> Mount {
    let eps = cluster.endpoints().join(",");
    let mut args = vec!["--allow-other", "--volatile", "--etcd", &eps, "--etcd-prefix", prefix];
    args.extend_from_slice(extra);
    Mount::with_args_env(&args, env)
}

/// Holders and waiters of lease `name` in etcd: the entries of its queue,
/// and a solo holder its counter records (while its session lives).
fn entries(cluster: &Cluster, prefix: &str, name: &str) -> usize {
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    let q = format!("{prefix}/q/{name}/").into_bytes();
    let queued = c.range(&q, &prefix_end(&q)).expect("read the queue").0.len();
    let counter = c.get(format!("{prefix}/epoch/{name}").as_bytes()).expect("read the counter").0;
    let solo = counter.and_then(|kv| leasefs::cluster::arbiter::solo_of(&kv.value)).is_some_and(|s| {
        c.get(format!("{prefix}/s/{:016x}", s.lease).as_bytes()).expect("read the session key").0.is_some()
    });
    queued + usize::from(solo)
}

/// Wait until the queue of `name` has `n` entries.
fn await_entries(cluster: &Cluster, prefix: &str, name: &str, n: usize) {
    let deadline = Instant::now() + STEP;
    loop {
        let now = entries(cluster, prefix, name);
        if now == n {
            return;
        }
        assert!(Instant::now() < deadline, "the queue of {name} has {now} entries, not {n}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A stopped daemon, continued on drop (a stopped daemon cannot unmount).
struct Frozen(i32);

impl Frozen {
    fn stop(pid: i32) -> Frozen {
        // SAFETY: signalling a daemon this test started.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

fn status(m: &Mount) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(m.p(".leasefs/status")).unwrap()).unwrap()
}

/// Run the Python `program` from a file in `m`'s scratch directory, in
/// `m`, until it prints `ready` (the lines after that are its output).
fn py_ready(m: &Mount, program: &str) -> Bg {
    let file =
        tempfile::Builder::new().suffix(".py").tempfile_in(m.dir.path()).unwrap().into_temp_path().keep().unwrap();
    std::fs::write(&file, program).unwrap();
    Bg::ready(&m.path, &format!("exec python3 -u {}", file.display()))
}

/// Wait until `script` succeeds on `m` (a host coming back after a
/// fault); `what` names the failure, with the host's status.
fn await_success(m: &Mount, script: &str, what: &str) {
    let deadline = Instant::now() + STEP;
    while sh_code(&m.path, script) != 0 {
        assert!(Instant::now() < deadline, "{what}: {}", status(m));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until `bg` printed `n` lines after `ready`.
fn await_lines(bg: &Bg, n: usize, what: &str) {
    let deadline = Instant::now() + STEP;
    while bg.output().len() < n {
        assert!(Instant::now() < deadline, "{what}: {:?}", bg.output());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The errno name a Python snippet prints for a lock attempt on `file`.
fn py_lock(dir: &Path, file: &str, how: &str) -> String {
    py_ok(
        dir,
        &format!(
            r#"
import errno, fcntl, os, struct
fd = os.open("{file}", os.O_RDWR)
try:
    {how}
    print("ok")
except OSError as e:
    print(errno.errorcode[e.errno])
"#
        ),
    )
    .trim()
    .to_string()
}

#[test]
fn a_mount_whose_etcd_cannot_be_reached_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let o = run_timeout(
        std::process::Command::new(leasefs_bin())
            .arg("mount")
            .arg(&mnt)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(["--volatile", "--etcd", &format!("http://127.0.0.1:{port}"), "--etcd-timeout", "500ms"]),
        STEP,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "mounted without etcd: {o:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("etcd at http://127.0.0.1:") && err.contains("unreachable"), "{err:?}");
    assert!(!is_mounted(&mnt));
}

/// Two hosts sharing a file `x`, and a holder of it on the first that
/// prints the epoch it was granted after `ready`.
fn hosts_with_an_epoch_holder(cluster: &Cluster, p: &str) -> (Mount, Mount, Bg) {
    let (a, b) = (host(cluster, p, &[]), host(cluster, p, &[]));
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let holder = Bg::ready(
        &a.path,
        "exec flock x sh -c 'echo ready; getfattr --only-values -n user.leasefs.epoch x; echo; sleep 60'",
    );
    (a, b, holder)
}

#[test]
fn locks_conflict_across_hosts_and_epochs_rise_by_one_per_holder_on_any_host() {
    let cluster = Cluster::start();
    let p = prefix("conflict");
    let (a, b, mut holder) = hosts_with_an_epoch_holder(&cluster, &p);
    await_entries(&cluster, &p, "x", 1);
    // Every kind of lease-level lock on the other host conflicts.
    assert_eq!(sh_code(&b.path, "flock -n x true"), 1, "exclusive flock");
    assert_eq!(sh_code(&b.path, "flock -s -n x true"), 1, "shared flock");
    assert_eq!(py_lock(&b.path, "x", "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"), "EAGAIN", "POSIX");
    let ofd = "fcntl.fcntl(fd, 37, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))"; // F_OFD_SETLK
    assert_eq!(py_lock(&b.path, "x", ofd), "EAGAIN", "OFD");
    await_entries(&cluster, &p, "x", 1);
    // F_GETLK names the other host's holder (pid 0: its pid is another host's).
    let getlk = "import fcntl, os, struct\nfd = os.open('x', os.O_RDWR)\nask = struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0)\nt, _, _, _, pid = struct.unpack('hhqqi', fcntl.fcntl(fd, fcntl.F_GETLK, ask))\nprint(t, pid)";
    assert_eq!(py_ok(&b.path, getlk).trim(), format!("{} 0", libc::F_WRLCK));
    // Other hosts' holders are listed on this host.
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(b.p(".leasefs/leases"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let theirs: Vec<&serde_json::Value> = rows.iter().filter(|r| r["hosts"] == "other").collect();
    assert_eq!(theirs.len(), 1, "{rows:?}");
    assert_eq!(theirs[0]["path"], "/x");
    assert_eq!(theirs[0]["holders"][0]["comm"], "flock");
    assert_eq!(theirs[0]["holders"][0]["mode"], "exclusive");
    assert!(theirs[0]["holders"][0]["host"].as_str().unwrap().ends_with(&*a.path.to_string_lossy()));
    let table = sh_ok(&b.path, &format!("{} leases .", leasefs_bin().display()));
    assert!(table.contains("/flock@"), "{table}");
    // ... and the holder's own host is no different.
    assert_eq!(sh_code(&a.path, "flock -n x true"), 1);
    holder.kill_all();
    let e1: u64 = holder.output()[0].trim().parse().unwrap();
    let e2: u64 =
        sh_ok(&b.path, "flock -w 20 x getfattr --only-values -n user.leasefs.epoch x").trim().parse().unwrap();
    let e3: u64 =
        sh_ok(&a.path, "flock -w 20 x getfattr --only-values -n user.leasefs.epoch x").trim().parse().unwrap();
    assert_eq!((e2, e3), (e1 + 1, e1 + 2), "one epoch per new exclusive holder, whichever host");
    // Shared holders on both hosts at once; a POSIX write lock then waits for both.
    let shared = sh_ok(&a.path, &format!("flock -s x sh -c 'cd {} && flock -s -n x echo both'", b.path.display()));
    assert_eq!(shared.trim(), "both");
    assert_eq!(py_lock(&b.path, "x", "fcntl.lockf(fd, fcntl.LOCK_EX)"), "ok");
    assert_eq!(epoch(&b.path, "x"), e1 + 3, "a whole-file POSIX write lock is a new holder too");
    // O_EXCL creation takes the epoch from etcd as well; a re-created path never goes back.
    sh_ok(&a.path, "rm x");
    let created = py_ok(
        &a.path,
        "import os\nfd = os.open('x', os.O_CREAT | os.O_EXCL | os.O_RDWR)\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))",
    );
    assert_eq!(created.trim().parse::<u64>().unwrap(), e1 + 4);
    await_entries(&cluster, &p, "x", 0);
}

/// A release hands the lease to the waiter on the other host in its own
/// transaction: that host grants it from its watch without asking etcd,
/// with the next epoch, and a chain of waiters on both hosts gets one
/// epoch each, in order.
#[test]
fn a_release_hands_the_lease_to_a_waiter_on_another_host_which_grants_it_without_asking_etcd() {
    let cluster = Cluster::start();
    let p = prefix("handoff");
    let (a, b, mut holder) = hosts_with_an_epoch_holder(&cluster, &p);
    await_lines(&holder, 1, "the holder's epoch");
    let e1: u64 = holder.output()[0].trim().parse().unwrap();
    let go = b.dir.path().join("go");
    let waiter = format!(
        r#"
import fcntl, os, time
fd = os.open("x", os.O_RDWR)
print("ready", flush=True)
fcntl.flock(fd, fcntl.LOCK_EX)
print(int(os.getxattr(fd, "user.leasefs.epoch")), flush=True)
while not os.path.exists("{go}"):
    time.sleep(0.02)
"#,
        go = go.display()
    );
    let mut w = py_ready(&b, &waiter);
    await_entries(&cluster, &p, "x", 2);
    let txns = |m: &Mount| status(m)["etcd"]["requests"]["txn"].as_u64().unwrap();
    let before = txns(&b);
    holder.kill_all();
    await_lines(&w, 1, "the waiter's grant");
    assert_eq!(w.output()[0].trim().parse::<u64>().unwrap(), e1 + 1);
    assert_eq!(status(&a)["etcd"]["handoffs"]["given"], 1);
    assert_eq!(status(&b)["etcd"]["handoffs"]["received"], 1);
    assert_eq!(txns(&b), before, "the waiter's host sent no transaction for its grant");
    std::fs::write(&go, "").unwrap();
    assert!(w.wait(STEP).success());
    await_entries(&cluster, &p, "x", 0);
    // Four waiters alternating between the hosts, each handed the lease
    // by the one before: epochs e1+2.., in arrival order.
    let first = Bg::ready(&a.path, "exec flock x sh -c 'echo ready; sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    let log = a.dir.path().join("chain.log");
    let mut chain = Vec::new();
    for (i, m) in [&b, &a, &b, &a].into_iter().enumerate() {
        let script = format!(
            "flock -w 30 x sh -c 'echo w{i} $(getfattr --only-values -n user.leasefs.epoch x) >> {}'",
            log.display()
        );
        chain.push(Bg::spawn(&m.path, &script));
        await_entries(&cluster, &p, "x", i + 2);
    }
    let mut first = first;
    first.kill_all();
    for w in &mut chain {
        assert!(w.wait(STEP).success());
    }
    let want: String = (0..4).map(|i| format!("w{i} {}\n", e1 + 3 + i as u64)).collect();
    assert_eq!(std::fs::read_to_string(&log).unwrap(), want);
    let given = |m: &Mount| status(m)["etcd"]["handoffs"]["given"].as_u64().unwrap();
    assert_eq!(given(&a) + given(&b), 1 + 4, "every release with a waiter behind it handed over");
    await_entries(&cluster, &p, "x", 0);
}

#[test]
fn waiters_are_served_in_arrival_order_across_hosts() {
    let cluster = Cluster::start();
    let p = prefix("fifo");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    let log = a.dir.path().join("order.log");
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let mut holder = Bg::ready(&a.path, "exec flock x sh -c 'echo ready; sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    let mut waiters = Vec::new();
    for (i, m) in [&b, &a, &b, &a].into_iter().enumerate() {
        let script = format!("flock -w 30 x sh -c 'echo w{i} >> {}; sleep 0.1'", log.display());
        waiters.push(Bg::spawn(&m.path, &script));
        await_entries(&cluster, &p, "x", i + 2);
    }
    holder.kill_all();
    for w in &mut waiters {
        assert!(w.wait(STEP).success());
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "w0\nw1\nw2\nw3\n");
    await_entries(&cluster, &p, "x", 0);
}

#[test]
fn a_signal_ends_a_cross_host_wait_and_takes_its_entry_out_of_the_queue() {
    let cluster = Cluster::start();
    let p = prefix("signal");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let _holder = Bg::ready(&a.path, "exec flock x sh -c 'echo ready; sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    // flock -w 1: SIGALRM interrupts the wait (EINTR), flock exits 1.
    assert_eq!(sh_code(&b.path, "flock -w 1 x true"), 1);
    await_entries(&cluster, &p, "x", 1);
    // SIGKILL of a waiter, too.
    let mut w = Bg::exec(&b.path, "flock", &["x", "true"]);
    await_entries(&cluster, &p, "x", 2);
    w.kill_all();
    await_entries(&cluster, &p, "x", 1);
    let s = status(&b);
    assert_eq!(s["backend"], "etcd");
    assert_eq!(s["etcd"]["entries"]["waiting"], 0);
    assert_eq!(s["etcd"]["session"]["alive"], true);
    assert_eq!(s["etcd"]["prefix"], p.as_str());
}

/// No epoch without a holder (SPEC 5): 200 waiters on host b give up
/// (a signal with the descriptor kept, flock -w's timeout, SIGKILL, and a
/// signal racing the holder's release) while host a's holder releases at
/// once; every grant is one above the one before. Red before the wait
/// left etcd's queue ahead of its `EINTR`: a's release handed the lease to
/// the entry of a waiter that was gone, and the next grant skipped one.
#[test]
fn a_wait_that_ends_without_a_grant_never_takes_an_epoch_across_hosts() {
    let cluster = Cluster::start();
    let p = prefix("ghost");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch lk4");
    let raced = no_epoch_without_a_holder(&a.path, &b.path, "lk4", 200);
    eprintln!("{raced} of 50 racing waiters were granted before their signal");
    assert_eq!(status(&b)["etcd"]["entries"]["waiting"], 0);
}

/// A daemon frozen past its host TTL: the other host's waiter gets the
/// next epoch once etcd expires the frozen host's session; resumed, the
/// frozen host's holder can write neither the lease nor the file it guards.
#[test]
fn a_host_frozen_past_its_ttl_loses_its_leases_and_its_holders_are_fenced() {
    let cluster = Cluster::start();
    let p = prefix("frozen");
    let a = host(&cluster, &p, &["--host-ttl", "2s"]);
    let b = host(&cluster, &p, &[]);
    sh_ok(&a.path, "touch x g && setfattr -n user.leasefs.guard -v x g");
    sh_ok(&b.path, "touch x");
    let (go, end) = (a.dir.path().join("go"), a.dir.path().join("end"));
    let holder = format!(
        r#"
import errno, fcntl, os, time
fd = os.open("x", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
g = os.open("g", os.O_WRONLY | os.O_APPEND)
os.write(fd, b"a\n"); os.write(g, b"a\n")
print("ready", flush=True)
print(int(os.getxattr(fd, "user.leasefs.epoch")), flush=True)
while not os.path.exists("{go}"):
    time.sleep(0.02)
for f, what in ((fd, "lease"), (g, "guarded")):
    try:
        os.write(f, b"late\n"); print(what, "ok", flush=True)
    except OSError as e:
        print(what, errno.errorcode[e.errno], flush=True)
for f, what in ((fd, "epoch by descriptor"), ("x", "epoch by path")):
    try:
        print(what, int(os.getxattr(f, "user.leasefs.epoch")), flush=True)
    except OSError as e:
        print(what, errno.errorcode[e.errno], flush=True)
try:
    print("holders", os.getxattr(fd, "user.leasefs.holder").decode(), flush=True)
except OSError as e:
    print("holders", errno.errorcode[e.errno], flush=True)
while not os.path.exists("{end}"):              # keeps its descriptor meanwhile
    time.sleep(0.02)
"#,
        go = go.display(),
        end = end.display()
    );
    let mut h = py_ready(&a, &holder);
    await_entries(&cluster, &p, "x", 1);
    // A command run under `leasefs lock` on the frozen host, on another lease.
    let lock = format!("exec {} lock y -- sleep 60", leasefs_bin().display());
    let mut locked = Bg::spawn(&a.path, &lock);
    await_entries(&cluster, &p, "y", 1);
    let out = b.dir.path().join("epoch");
    let mut waiter = Bg::spawn(
        &b.path,
        &format!("flock -w 30 x getfattr --only-values -n user.leasefs.epoch x > {}", out.display()),
    );
    await_entries(&cluster, &p, "x", 2);
    let frozen = Frozen::stop(a.pid());
    assert!(waiter.wait(STEP).success(), "the waiter on the other host was never granted");
    drop(frozen);
    std::fs::write(&go, "").unwrap();
    await_lines(&h, 6, "the resumed holder");
    let lines = h.output();
    let e1: u64 = lines[0].trim().parse().unwrap();
    assert_eq!(
        &lines[1..],
        ["lease ESTALE", "guarded ESTALE", "epoch by descriptor ESTALE", "epoch by path ESTALE", "holders ESTALE"],
        "the resumed host's holder was not fenced, or learnt a token"
    );
    let e2: u64 = std::fs::read_to_string(&out).unwrap().trim().parse().unwrap();
    assert_eq!(e2, e1 + 1);
    // Everyone else, on the resumed host too, reads the current epoch:
    // never the lost holder's token, which a resource would take for valid.
    let by_fd = "import os\nprint(int(os.getxattr(os.open('x', os.O_RDONLY), 'user.leasefs.epoch')))";
    for m in [&a, &b] {
        assert_eq!(epoch(&m.path, "x"), e2, "by path on {}", m.path.display());
        assert_eq!(py_ok(&m.path, by_fd).trim(), e2.to_string(), "by descriptor on {}", m.path.display());
    }
    std::fs::write(&end, "").unwrap();
    assert!(h.wait(STEP).success());
    assert_eq!(sh_ok(&a.path, "cat x g"), "a\na\n", "no write of the fenced holder landed");
    assert_eq!(locked.wait(STEP).code(), Some(75), "leasefs lock did not stop its command when the host was cut off");
    // The resumed host registered a new session and grants again.
    let deadline = Instant::now() + STEP;
    while status(&a)["etcd"]["session"]["alive"] != true {
        assert!(Instant::now() < deadline, "no new session: {}", status(&a));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(status(&a)["etcd"]["session"]["lost"].as_u64().unwrap() >= 1);
    let e3: u64 =
        sh_ok(&a.path, "flock -w 20 x getfattr --only-values -n user.leasefs.epoch x").trim().parse().unwrap();
    assert_eq!(e3, e2 + 1);
}

/// A daemon stopped and continued again and again (`SIGSTOP`/`SIGCONT`,
/// as a debugger, `strace -p` or a job-control stop does) while its
/// requests to etcd are in flight: a read on a socket with a timeout ends
/// with `EINTR` then (signal(7)), and that must not be taken for a lost
/// answer (a write's `EIO`) or a broken watch.
#[test]
fn a_daemon_stopped_and_continued_mid_request_loses_no_answer_and_keeps_its_watches() {
    let cluster = Cluster::start();
    let p = prefix("stopcont");
    let a = host(&cluster, &p, &[]);
    sh_ok(&a.path, "touch f");
    let watches = || status(&a)["etcd"]["requests"]["watch"].as_u64().unwrap();
    let before = watches();
    let mut w = Bg::capture(
        &a.path,
        "python3",
        &[
            "-c",
            "import errno, os\nfd = os.open('f', os.O_WRONLY)\nbad = {}\n\
             for i in range(200):\n    try: os.pwrite(fd, b'%06d' % i, 0)\n    \
             except OSError as e: bad[errno.errorcode[e.errno]] = bad.get(errno.errorcode[e.errno], 0) + 1\n\
             print(bad)",
        ],
    );
    let deadline = Instant::now() + STEP * 4;
    let mut stops = 0;
    while w.running() && Instant::now() < deadline {
        let frozen = Frozen::stop(a.pid());
        std::thread::sleep(Duration::from_millis(2));
        drop(frozen);
        stops += 1;
        std::thread::sleep(Duration::from_millis(3));
    }
    assert!(w.wait(STEP).success());
    assert!(stops > 20, "the daemon was stopped {stops} times only");
    assert_eq!(w.output_to_end(), ["{}"], "writes failed while the daemon was stopped and continued {stops} times");
    assert_eq!(sh_ok(&a.path, "cat f"), "000199");
    assert_eq!(watches(), before, "its watches were opened again");
}

/// A keep-alive answered after the session's deadline does not revive
/// the session: here every answer of host a is held back 1.5 s, past the
/// deadline of its 2 s lease renewed every 0.67 s. From the deadline on a
/// fences its holder and lets its entry go with the lease, so a waiter on
/// host b is granted once the lease expires. Red (b's waiter never
/// granted: a's entry stays held under a lease the late answers keep
/// alive) when a late answer extends the deadline.
#[test]
fn a_keep_alive_answered_after_the_deadline_leaves_no_entry_in_the_way() {
    let cluster = Cluster::start();
    let p = prefix("late-keep-alive");
    let b = host(&cluster, &p, &[]);
    sh_ok(&b.path, "touch x");
    let a = host_env(&cluster, &p, &["--host-ttl", "2s"], &[("LEASEFS_PAUSE", "keep-alive-answer:1500")]);
    // a's sessions are alive about 2 s at a time: take the lock in one.
    let holder = r#"
import fcntl, os, time
fd = os.open("x", os.O_RDWR)
for _ in range(200):
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        break
    except OSError:
        time.sleep(0.05)
print("ready", flush=True)
time.sleep(60)
"#;
    let _h = py_ready(&a, holder);
    let waited = Instant::now();
    let waiter = sh(&b.path, "flock -w 20 x true");
    assert!(
        waiter.status.success(),
        "the waiter on the other host was never granted ({:?}): {}",
        waited.elapsed(),
        status(&a)["etcd"]["session"]
    );
    assert!(status(&a)["etcd"]["session"]["lost"].as_u64().unwrap() >= 1, "a's late answers lost its session");
}

/// `--lock-delay`: a lease whose holder's host was lost is granted only
/// once the delay has passed after the loss was noticed.
#[test]
fn the_lock_delay_holds_back_a_lease_whose_holders_host_was_lost() {
    let cluster = Cluster::start();
    let p = prefix("delay");
    let a = host(&cluster, &p, &["--host-ttl", "2s"]);
    let b = host(&cluster, &p, &["--lock-delay", "3s"]);
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let _holder = Bg::ready(&a.path, "exec flock x sh -c 'echo ready; sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    let mut waiter = Bg::spawn(&b.path, "flock -w 30 x true");
    await_entries(&cluster, &p, "x", 2);
    let frozen = Frozen::stop(a.pid());
    let stopped = Instant::now();
    // The frozen host's entry goes when etcd expires its session (at most
    // its TTL after the last renewal, which came at most a third of it
    // before the stop); the grant then waits the full delay.
    assert!(waiter.wait(STEP).success());
    let waited = stopped.elapsed();
    assert!(waited >= Duration::from_millis(2000 - 667 + 3000), "granted after {waited:?}");
    drop(frozen);
    // A clean release leaves no lost holder: no delay for the next one.
    let e = sh_ok(&b.path, "flock -n x getfattr --only-values -n user.leasefs.epoch x");
    assert!(!e.trim().is_empty());
}

/// Python's filelock (the pinned release's own suite, as on one host in
/// `clients`) on a shared mount: every test passes, as on tmpfs in the
/// same run. Left out: the four `threaded` tests, which take and release
/// the lock up to 10 000 times from 100 threads and outlast pytest's 60 s
/// timeout here (each lock step and each open of the lock file is an etcd
/// transaction or read; docs/hosts.md "Third-party suites").
#[test]
fn python_filelock_suite_passes_on_a_shared_mount_as_on_tmpfs() {
    let Some(dir) = crate::clients::pysuites() else { return };
    let suite = dir.join("filelock");
    let args = ["-k", "not threaded", "tests/test_filelock.py", "tests/test_error.py", "tests/test_async_filelock.py"];
    let t = Tmpfs::new();
    let base = crate::clients::pytest_outcomes(&suite, &t.path.join("pytest"), &args);
    let cluster = Cluster::start();
    let a = host(&cluster, &prefix("filelock"), &[]);
    let ours = crate::clients::pytest_outcomes(&suite, &a.p("pytest"), &args);
    eprintln!("filelock: tmpfs {} passed, failed {:?}; shared mount {} passed", base.passed, base.failed, ours.passed);
    assert!(base.failed.is_empty() && base.passed >= 100, "the suite does not pass on tmpfs:\n{}", base.out);
    assert!(ours.failed.is_empty(), "fails on a shared mount: {:?}\n{}", ours.failed, ours.out);
    assert_eq!(ours.passed, base.passed, "{}", ours.out);
}

/// SPEC 5, no epoch without a holder, under `--lock-delay`: a wait held
/// back by the delay that a signal ends (`flock -w`'s alarm) and the
/// non-blocking requests refused during the delay take no epoch; the
/// first exclusive grant after the delay is the lost holder's epoch + 1,
/// and the delay runs once, from when this host first found the holder
/// lost (a shared grant after it does not start it again). Red when the
/// delay holds back a grant etcd already made (a `flock -n` is granted
/// during the delay once the waiter went), and when any grant forgets the
/// loss (the last `flock -n` refused).
#[test]
fn a_wait_that_ends_during_the_lock_delay_takes_no_epoch() {
    let cluster = Cluster::start();
    let p = prefix("delay-gone");
    let a = host(&cluster, &p, &["--host-ttl", "2s"]);
    let b = host(&cluster, &p, &["--lock-delay", "8s"]);
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let _holder = Bg::ready(&a.path, "exec flock x sh -c 'echo ready; sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    assert_eq!(sh_ok(&b.path, "getfattr --only-values -n user.leasefs.epoch x").trim(), "1", "the holder's epoch");
    // Gives up after 5 s: after a's session expired (at most 2 s), within
    // the delay (8 s from then). flock(1) exits with `-E`'s code only for
    // a conflict: EWOULDBLOCK, or the EINTR of its timeout's alarm.
    let mut waiter = Bg::spawn(&b.path, "exec flock -w 5 -E 43 x true");
    await_entries(&cluster, &p, "x", 2);
    let frozen = Frozen::stop(a.pid());
    // b's waiter finds the holder's host lost and is held back.
    let deadline = Instant::now() + STEP;
    while status(&b)["etcd"]["entries"]["delayed"] != 1 {
        assert!(Instant::now() < deadline, "b never held its waiter back: {}", status(&b)["etcd"]);
        std::thread::sleep(Duration::from_millis(20));
    }
    let noticed = Instant::now();
    // A non-blocking request meanwhile is refused with EWOULDBLOCK...
    let o = sh(&b.path, "flock -n -E 42 x true");
    assert_eq!(o.status.code(), Some(42), "not refused with EWOULDBLOCK during the lock delay: {o:?}");
    // ...and so is one after the held-back wait ended with its timeout.
    assert_eq!(waiter.wait(STEP).code(), Some(43), "the wait did not end by its timeout (EINTR)");
    let o = sh(&b.path, "flock -n -E 42 x true");
    assert_eq!(o.status.code(), Some(42), "not refused with EWOULDBLOCK after the waiter went: {o:?}");
    assert!(noticed.elapsed() < Duration::from_secs(7), "the steps above outlasted the delay: no test");
    assert_eq!(status(&b)["etcd"]["entries"]["delayed"], 0, "the timed-out wait is still held back");
    // Once the delay is over a shared holder is granted (no epoch), and
    // the delay is not run again for the next exclusive one, whose grant
    // is the lost holder's + 1.
    sh_ok(&b.path, "flock -s -w 30 x true");
    let e = sh_ok(&b.path, "flock -n x getfattr --only-values -n user.leasefs.epoch x");
    assert_eq!(e.trim(), "2", "an epoch was taken by a wait that ended without a grant");
    drop(frozen);
}

/// `--lock-delay` with non-blocking requests only: each is refused
/// without an epoch while the delay runs, and the delay runs once, from
/// the first refusal, so a `flock -n` retried in a loop is granted (the
/// lost holder's epoch + 1) once it has passed. Red (never granted) when
/// each refusal starts the delay again.
#[test]
fn non_blocking_retries_are_granted_once_the_lock_delay_has_passed() {
    let cluster = Cluster::start();
    let p = prefix("delay-retry");
    let a = host(&cluster, &p, &["--host-ttl", "2s"]);
    let b = host(&cluster, &p, &["--lock-delay", "2s"]);
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let _holder = Bg::ready(&a.path, "exec flock x sh -c 'echo ready; sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    let frozen = Frozen::stop(a.pid());
    // etcd expires a's session and its entry with it.
    let deadline = Instant::now() + STEP;
    while entries(&cluster, &p, "x") != 0 {
        assert!(Instant::now() < deadline, "a's entry never went");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut refused, deadline) = (0, Instant::now() + STEP * 2);
    let epoch = loop {
        // `-E 42`: refused with EWOULDBLOCK (any other errno exits otherwise).
        let o = sh(&b.path, "flock -n -E 42 x getfattr --only-values -n user.leasefs.epoch x");
        if o.status.success() {
            break String::from_utf8_lossy(&o.stdout).trim().to_string();
        }
        assert_eq!(o.status.code(), Some(42), "refused with another errno than EWOULDBLOCK: {o:?}");
        refused += 1;
        assert!(Instant::now() < deadline, "flock -n refused {refused} times, never granted after the delay");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(refused > 0, "granted at once: no delay");
    assert_eq!(epoch, "2", "refused requests took epochs ({refused} refusals)");
    drop(frozen);
}

/// A mount forced off while a holder keeps its descriptor (`umount -f`:
/// the kernel aborts the FUSE connection) deletes the host's entries as
/// its daemon ends: another host is granted the next epoch at once, with
/// no wait for the host's session to expire and no lost-holder delay.
#[test]
fn a_mount_forced_off_under_a_holder_leaves_the_queue_at_once() {
    let cluster = Cluster::start();
    let p = prefix("forced");
    let mut a = host(&cluster, &p, &["--host-ttl", "60s"]);
    let b = host(&cluster, &p, &["--lock-delay", "60s"]);
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let _holder = Bg::ready(&a.path, "exec flock x sh -c 'echo ready; exec sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    assert_eq!(sh_code(&b.path, "flock -n -E 42 x true"), 42, "granted while held on a");
    let st = a.force_off();
    assert!(st.success(), "the daemon of the mount forced off exited with {st:?}");
    // Gone as the daemon ended, not when its session (60 s) expires.
    assert_eq!(entries(&cluster, &p, "x"), 0, "the host's entry outlived its daemon");
    // A clean release, not a lost holder: no delay, and the next epoch.
    let e = sh(&b.path, "flock -n -E 42 x getfattr --only-values -n user.leasefs.epoch x");
    assert!(e.status.success(), "refused after the host left: {e:?}");
    assert_eq!(String::from_utf8_lossy(&e.stdout), "2");
}

#[test]
fn without_etcd_lock_requests_fail_with_eio_in_bounded_time_and_work_again_when_it_returns() {
    let mut cluster = Cluster::start();
    let p = prefix("outage");
    let a = host(&cluster, &p, &["--etcd-timeout", "1s"]);
    sh_ok(&a.path, "touch y");
    sh_ok(&a.path, "echo cached > z");
    let leader = cluster.leader();
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    cluster.kill(others[0]);
    cluster.kill(others[1]);
    let started = Instant::now();
    let o = run_timeout(std::process::Command::new("flock").args(["-n", "y", "true"]).current_dir(&a.path), STEP);
    let took = started.elapsed();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("Input/output error"), "{o:?} after {took:?}");
    eprintln!("flock -n refused with EIO after {took:?} (--etcd-timeout 1s, quorum lost)");
    // An open asks etcd too (close-to-open): refused, not answered stale.
    let o = crate::util::sh(&a.path, "cat z");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Input/output error"), "an open without etcd: {o:?}");
    // An epoch it cannot check with etcd is refused, not shown stale.
    let started = Instant::now();
    let o = crate::util::sh(&a.path, "getfattr --only-values -n user.leasefs.epoch y");
    let took = started.elapsed();
    assert!(!o.status.success(), "an unchecked epoch was shown: {o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Input/output error"), "{o:?} after {took:?}");
    eprintln!("epoch read refused with EIO after {took:?} (--etcd-timeout 1s, quorum lost)");
    // Nor holders it cannot check.
    let o = crate::util::sh(&a.path, "getfattr --only-values -n user.leasefs.holder y");
    assert!(!o.status.success(), "unchecked holders were shown: {o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Input/output error"), "{o:?}");
    cluster.restart(others[0]);
    cluster.restart(others[1]);
    await_success(&a, "flock -n y true", "locks never worked again");
}

/// Workers on two hosts loop flock, read the epoch, log start and end
/// around a short critical section, while the etcd leader is killed and
/// restarted: no two holders overlap and epochs of successive holders
/// strictly increase.
#[test]
fn a_leader_kill_under_contention_grants_nothing_twice() {
    let mut cluster = Cluster::start();
    let p = prefix("leader");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let log = a.dir.path().join("history.log");
    let worker = |m: &Mount, who: &str| {
        let program = format!(
            r#"
import fcntl, os, time
log = os.open("{log}", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
end = time.time() + 6
n = 0
while time.time() < end:
    fd = os.open("x", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd); time.sleep(0.05); continue   # EIO while etcd elects
    e = int(os.getxattr(fd, "user.leasefs.epoch"))
    os.write(log, f"start {{e}} {who}\n".encode())
    time.sleep(0.002)
    os.write(log, f"end {{e}} {who}\n".encode())
    os.close(fd)
    n += 1
print(n)
"#,
            log = log.display()
        );
        Bg::capture(&m.path, "python3", &["-c", &program])
    };
    let mut workers = vec![worker(&a, "a1"), worker(&a, "a2"), worker(&b, "b1"), worker(&b, "b2")];
    std::thread::sleep(Duration::from_millis(1500));
    let leader = cluster.leader();
    cluster.kill(leader);
    std::thread::sleep(Duration::from_millis(1500));
    cluster.restart(leader);
    let mut total = 0;
    for w in &mut workers {
        assert!(w.wait(STEP).success());
        total += w.output()[0].trim().parse::<u64>().unwrap();
    }
    let history = std::fs::read_to_string(&log).unwrap();
    eprintln!("{total} holds by four workers on two hosts through a leader kill");
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len() as u64, 2 * total, "every acknowledged hold is in the history");
    assert!(total >= 10, "only {total} holds in 6 s");
    let mut last = 0;
    for pair in lines.chunks(2) {
        let s: Vec<&str> = pair[0].split(' ').collect();
        let e: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!((s[0], e[0]), ("start", "end"), "two holders overlap: {pair:?}\n{history}");
        assert_eq!((s[1], s[2]), (e[1], e[2]), "two holders overlap: {pair:?}\n{history}");
        let epoch: u64 = s[1].parse().unwrap();
        assert!(epoch > last, "epoch {epoch} after {last}\n{history}");
        last = epoch;
    }
}

/// A network namespace joined to this one by a veth pair, made by the
/// test and removed on drop (which also removes the pair).
struct Netns {
    name: String,
    host_if: String,
    /// This side's address; the namespace's is the next one.
    host_ip: String,
}

fn ip(args: &[&str]) {
    let o = run_timeout(std::process::Command::new("ip").args(args), STEP);
    assert!(o.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

impl Netns {
    fn new(tag: u8) -> Netns {
        let id = std::process::id() % 100_000;
        let n = Netns {
            name: format!("lfs{id}-{tag}"),
            host_if: format!("lfh{id}{tag}"),
            host_ip: format!("10.213.{tag}.1"),
        };
        let ns_if = format!("lfn{id}{tag}");
        let ns_ip = format!("10.213.{tag}.2/30");
        ip(&["netns", "add", &n.name]);
        ip(&["link", "add", &n.host_if, "type", "veth", "peer", "name", &ns_if]);
        ip(&["link", "set", &ns_if, "netns", &n.name]);
        ip(&["addr", "add", &format!("{}/30", n.host_ip), "dev", &n.host_if]);
        ip(&["link", "set", &n.host_if, "up"]);
        ip(&["-n", &n.name, "addr", "add", &ns_ip, "dev", &ns_if]);
        ip(&["-n", &n.name, "link", "set", &ns_if, "up"]);
        ip(&["-n", &n.name, "link", "set", "lo", "up"]);
        n
    }

    fn path(&self) -> std::path::PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Cut (false) or restore (true) the namespace's only link.
    fn link(&self, up: bool) {
        ip(&["link", "set", &self.host_if, if up { "up" } else { "down" }]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.name]).status();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// A host partitioned from etcd (its link cut, the daemon still running)
/// stops accepting its holder's writes before the other host is granted
/// the lease (jeopardy: its deadline is before etcd can expire its
/// session), the other host gets the next epoch, and once the link is back
/// the partitioned host registers again and takes part as before.
#[test]
fn a_partitioned_host_fences_its_holder_before_another_host_is_granted() {
    let net = Netns::new(1);
    let cluster = Cluster::start_also_on(Some(&net.host_ip));
    let p = prefix("partition");
    let eps = cluster.endpoints_on(&net.host_ip).join(",");
    let a = Mount::in_netns(
        &[
            "--allow-other",
            "--volatile",
            "--etcd",
            &eps,
            "--etcd-prefix",
            &p,
            "--host-ttl",
            "3s",
            "--etcd-timeout",
            "1s",
        ],
        &[],
        Some(&net.path()),
    );
    let b = host(&cluster, &p, &[]);
    sh_ok(&a.path, "touch x");
    sh_ok(&b.path, "touch x");
    let holder = r#"
import errno, fcntl, os, time
fd = os.open("x", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
print(int(os.getxattr(fd, "user.leasefs.epoch")), flush=True)
last = None
while True:
    invoked = time.monotonic()
    try:
        os.pwrite(fd, b"a", 0)
        last = invoked
    except OSError as e:
        # Cut off from etcd, the host cannot store a change (EIO) before
        # it fences its holder (ESTALE); neither is an accepted write.
        if e.errno == errno.EIO:
            continue
        print(errno.errorcode[e.errno], flush=True)
        print(repr(last), flush=True)
        break
    time.sleep(0.005)
"#;
    let mut h = py_ready(&a, holder);
    await_entries(&cluster, &p, "x", 1);
    let mut events = Bg::capture(&a.path, "cat", &[".leasefs/events"]);
    let waiter = "import fcntl, os, time\nfd = os.open('x', os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint(repr(time.monotonic()))\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))";
    let mut w = Bg::capture(&b.path, "python3", &["-c", waiter]);
    await_entries(&cluster, &p, "x", 2);
    net.link(false);
    assert!(w.wait(STEP).success(), "the other host was never granted");
    assert!(h.wait(STEP).success());
    let (held, granted) = (h.output(), w.output());
    let e1: u64 = held[0].parse().unwrap();
    assert_eq!(held[1], "ESTALE", "{held:?}");
    let last_write: f64 = held[2].parse().unwrap();
    let grant: f64 = granted[0].parse().unwrap();
    let e2: u64 = granted[1].parse().unwrap();
    assert_eq!(e2, e1 + 1);
    // Invocation times: a write started after the grant had completed
    // must not have been accepted (never a false alarm from scheduling).
    assert!(last_write < grant, "the cut-off holder's write started at {last_write}, after the grant at {grant}");
    eprintln!("last accepted write started {:.0} ms before the other host's grant", (grant - last_write) * 1000.0);
    // The cut-off host's event stream says why its holder was fenced.
    let deadline = Instant::now() + STEP;
    let broken = loop {
        let lines = events.lines.lock().unwrap().clone();
        if let Some(l) = lines.iter().find(|l| l.contains("\"break\"")) {
            break serde_json::from_str::<serde_json::Value>(l).unwrap();
        }
        assert!(Instant::now() < deadline, "no break event: {lines:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!((broken["path"].as_str(), broken["reason"].as_str()), (Some("/x"), Some("host_lost")));
    assert_eq!(broken["epoch"], e1);
    events.kill_all();
    net.link(true);
    await_success(&a, "flock -n x true", "the partitioned host never took part again");
    assert!(status(&a)["etcd"]["session"]["lost"].as_u64().unwrap() >= 1);
    assert_eq!(epoch(&a.path, "x"), e2 + 1);
}

/// The short form of `scripts/jepsen.py`: workers on three hosts (one in a
/// network namespace) increment guarded registers under the lease while
/// the nemesis kills the leader, restarts members, freezes daemons and
/// cuts a link; the checker finds no violation in the history.
#[test]
fn the_jepsen_style_history_check_finds_no_violation() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/jepsen.py");
    let bin = leasefs_bin();
    let o = run_timeout(
        std::process::Command::new("python3").arg(&script).args(["--seconds", "20", "--leasefs"]).arg(&bin),
        Duration::from_secs(240),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    eprintln!("{out}");
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("no violation"));
    let grants: u64 = out.split("grants ").nth(1).and_then(|r| r.split(',').next()).unwrap().parse().unwrap();
    assert!(grants >= 5, "only {grants} grants in 20 s:\n{out}");
}

// ------------------------------------------------------ the shared namespace

/// `stat -c FORMAT` of `file` in `dir`.
fn stat(dir: &Path, format: &str, file: &str) -> String {
    sh_ok(dir, &format!("stat -c '{format}' {file}")).trim().to_string()
}

#[test]
fn names_attributes_xattrs_settings_and_contents_are_the_same_on_every_host_at_once() {
    let cluster = Cluster::start();
    let p = prefix("names");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    // Each step is one process on one host, checked by a process on the
    // other right after it returned: no waiting in between.
    sh_ok(&a.path, "printf hello > f");
    assert_eq!(sh_ok(&b.path, "cat f"), "hello");
    sh_ok(&b.path, "printf ', world' >> f");
    assert_eq!(sh_ok(&a.path, "cat f"), "hello, world");
    sh_ok(&b.path, "mkdir -m 750 d");
    assert_eq!(stat(&a.path, "%F %a", "d"), "directory 750");
    sh_ok(&a.path, "echo inner > d/g");
    assert_eq!(sh_ok(&b.path, "ls d"), "g\n");
    sh_ok(&b.path, "mv d/g h");
    assert_eq!(sh_ok(&a.path, "ls; ls d"), "d\nf\nh\n");
    assert_eq!(sh_ok(&a.path, "cat h"), "inner\n");
    sh_ok(&a.path, "chmod 604 h && chown 1234:5678 h && touch -m -d @1000000000 h");
    assert_eq!(stat(&b.path, "%a %u %g %Y %s", "h"), "604 1234 5678 1000000000 6");
    sh_ok(&b.path, "setfattr -n user.color -v blue h");
    assert_eq!(sh_ok(&a.path, "getfattr --only-values -n user.color h"), "blue");
    sh_ok(&a.path, "setfattr -x user.color h");
    assert_eq!(sh_code(&b.path, "getfattr -n user.color h 2>/dev/null"), 1);
    // Lease settings are part of the file.
    sh_ok(&a.path, "setfattr -n user.leasefs.ttl -v 7s f && touch reg && setfattr -n user.leasefs.guard -v f reg");
    assert_eq!(sh_ok(&b.path, "getfattr --only-values -n user.leasefs.ttl f"), "7s");
    assert_eq!(sh_ok(&b.path, "getfattr --only-values -n user.leasefs.guard reg"), "f");
    // Links, symlinks, removal, overwrite by rename.
    sh_ok(&b.path, "ln h h2 && ln -s h sym");
    assert_eq!(stat(&a.path, "%h", "h"), "2");
    assert_eq!(sh_ok(&a.path, "readlink sym; cat sym"), "h\ninner\n");
    sh_ok(&a.path, "echo new > tmp && mv tmp h2");
    assert_eq!(sh_ok(&b.path, "cat h2; stat -c %h h"), "new\n1\n");
    sh_ok(&a.path, "rm h sym && rmdir d");
    assert_eq!(sh_ok(&b.path, "ls"), "f\nh2\nreg\n");
    assert_eq!(sh_code(&b.path, "stat h 2>/dev/null"), 1);
    // A name that did not exist a moment ago on the other host (no cached
    // "no such file" survives a remote create).
    assert_eq!(sh_code(&b.path, "test -e late"), 1);
    sh_ok(&a.path, "mkdir late");
    assert_eq!(sh_code(&b.path, "test -d late"), 0);
    let ns = &status(&b)["etcd"]["namespace"];
    assert_eq!(ns["stale"], false, "{ns}");
    assert!(ns["replayed"].as_u64().unwrap() > 0, "changes reached b by replay: {ns}");
}

/// Run `script` with `sh` in `dir` as the user nobody; its exit code and
/// standard error.
fn as_nobody(dir: &Path, script: &str) -> (i32, String) {
    let o = sh(dir, &format!("setpriv --reuid=65534 --regid=65534 --clear-groups sh -c '{script}'"));
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// Linearizable reads (`range`) host `m` sent to etcd so far.
fn ranges(m: &Mount) -> u64 {
    status(m)["etcd"]["requests"]["range"].as_u64().expect("etcd.requests.range in status")
}

#[test]
fn on_a_shared_namespace_the_daemon_checks_permissions_and_a_stat_costs_two_reads() {
    let cluster = Cluster::start();
    let p = prefix("perms");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    // Made on b, checked on a: the daemon decides on the shared state.
    sh_ok(
        &b.path,
        "mkdir -m 700 private && echo s > private/f && echo s > secret && chmod 600 secret \
         && echo p > public && chmod 644 public && mkdir -m 1777 tmp && mkdir -m 755 ro",
    );
    let denied = |script: &str, what: &str| {
        let (code, err) = as_nobody(&a.path, script);
        assert_ne!(code, 0, "{script} succeeded");
        assert!(err.contains(what), "{script}: {err}");
    };
    denied("cat private/f", "Permission denied");
    denied("ls private", "Permission denied");
    denied("cat secret", "Permission denied");
    denied("echo x >> public", "Permission denied");
    denied("touch ro/new", "Permission denied");
    denied("mkdir ro/new", "Permission denied");
    denied("rm public", "Permission denied");
    denied("chmod 777 public", "Operation not permitted");
    denied("python3 -c \"import os; os.utime(\\\"public\\\", (1, 1))\"", "Operation not permitted");
    denied("truncate -s 0 public", "Permission denied");
    denied("setfattr -n user.a -v 1 public", "Permission denied");
    denied("cd private", "can't cd");
    assert_eq!(as_nobody(&a.path, "test -r secret").0, 1, "access(2) says no");
    assert_eq!(as_nobody(&a.path, "test -r public && cat public").0, 0);
    // The sticky directory: nobody's own file is nobody's to remove, root's is not.
    sh_ok(&b.path, "touch tmp/roots");
    assert_eq!(as_nobody(&a.path, "echo n > tmp/mine && mv tmp/mine tmp/moved && rm tmp/moved").0, 0);
    denied("rm -f tmp/roots", "Operation not permitted");
    // A permission change on b applies on a at once.
    sh_ok(&b.path, "chmod 755 private");
    assert_eq!(as_nobody(&a.path, "cat private/f").0, 0);
    sh_ok(&b.path, "chmod 700 private");
    denied("cat private/f", "Permission denied");
    // No directory attributes asked on the way: a stat is a lookup and an
    // attribute read, one etcd read each.
    // (Reading `status` costs reads of its own: counted once and taken off.)
    let (r0, r1) = (ranges(&a), ranges(&a));
    sh_ok(Path::new("/"), &format!("for i in $(seq 30); do stat {}/public >/dev/null; done", a.path.display()));
    let reads = ranges(&a) - r1 - (r1 - r0);
    assert!(reads <= 60, "{reads} etcd reads for 30 stats");
}

#[test]
fn a_file_of_one_mib_is_shared_and_a_larger_one_is_refused_with_efbig() {
    let cluster = Cluster::start();
    let p = prefix("efbig");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    let out = py_ok(
        &a.path,
        r#"
import errno, hashlib, os
data = bytes(range(256)) * 4096
with open("big", "wb") as f:
    f.write(data)
print(hashlib.sha256(data).hexdigest())
fd = os.open("big", os.O_WRONLY)
for what, call in [("write", lambda: os.pwrite(fd, b"x", 1 << 20)),
                   ("truncate", lambda: os.ftruncate(fd, (1 << 20) + 1))]:
    try:
        call()
        print(what, "ok")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(&lines[1..], ["write EFBIG", "truncate EFBIG"], "{out}");
    let there = sh_ok(&b.path, "sha256sum big | cut -d' ' -f1; stat -c %s big");
    assert_eq!(there, format!("{}\n1048576\n", lines[0]));
}

/// On a shared mount, removed files the kernel still holds (here through
/// `O_PATH` descriptors) keep their room until the kernel lets go of them:
/// a write past `--size` meanwhile is refused with `ENOSPC`, not `EIO`
/// (letting 200 such files go would put 200 more keys in the change's
/// transaction, past etcd's 128 operations), and succeeds once they go.
#[test]
fn removed_files_held_by_the_kernel_keep_their_room_on_a_shared_mount_and_a_write_past_it_is_enospc() {
    let cluster = Cluster::start();
    let p = prefix("removed-room");
    let a = host(&cluster, &p, &["--size", "2m"]);
    let out = py_ok(
        &a.path,
        r#"
import errno, os, time
os.mkdir("d")
for i in range(200):
    with open(f"d/s{i}", "wb") as f: f.write(b"x" * 100)
with open("g", "wb") as f: f.write(b"g" * 1000 * 1024)
held = [os.open(f"d/s{i}", os.O_PATH) for i in range(200)]
for i in range(200): os.unlink(f"d/s{i}")
def big():
    fd = os.open("k", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"k" * 1000 * 1024)
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
    finally:
        os.close(fd)
print(big())
for fd in held: os.close(fd)
deadline = time.time() + 10
r = big()
while r != "ok" and time.time() < deadline:
    time.sleep(0.1); r = big()
print(r)
"#,
    );
    assert_eq!(out, "ENOSPC\nok\n");
}

/// Python that waits for the common start [`open_gate`] sets.
const GATE: &str =
    "import os, time\nstart = float(open('../go').read())\nwhile time.time() < start:\n    time.sleep(0.001)\n";

/// Let the processes of every mount in `ms` start together, a second from now.
fn open_gate(ms: &[&Mount]) {
    for m in ms {
        std::fs::write(m.path.join("../go"), format!("{}", unix_now() + 1.0)).unwrap();
    }
}

/// Host `a` of a pair that pauses every change for `ms` after deciding it
/// and before storing it (writing `mark` when it starts pausing).
fn pausing_host(cluster: &Cluster, p: &str, ms: u32, mark: &Path) -> Mount {
    pausing_host_at(cluster, p, "publish", ms, mark)
}

/// A host that stalls `ms` each time it passes the pause point `point`,
/// writing `mark` as it does.
fn pausing_host_at(cluster: &Cluster, p: &str, point: &str, ms: u32, mark: &Path) -> Mount {
    let pause = format!("{point}:{ms}");
    host_env(cluster, p, &[], &[("LEASEFS_PAUSE", &pause), ("LEASEFS_PAUSE_MARK", mark.to_str().unwrap())])
}

/// Host b, prepared by `setup` (a shell command run on it), then host a,
/// whose first attempt at each change stalls `ms` before its transaction;
/// the directory holding a's pause mark, and the mark's path.
fn paused_and_plain(cluster: &Cluster, p: &str, ms: u32, setup: &str) -> (tempfile::TempDir, PathBuf, Mount, Mount) {
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("paused");
    let b = host(cluster, p, &[]);
    sh_ok(&b.path, setup);
    let a = pausing_host(cluster, p, ms, &mark);
    (marks, mark, a, b)
}

/// Wait until the daemon writes `mark` (a change of it is paused).
fn await_mark(mark: &Path) {
    let deadline = Instant::now() + STEP;
    while !mark.exists() {
        assert!(Instant::now() < deadline, "the change never reached its pause");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn conflicts(m: &Mount) -> u64 {
    status(m)["etcd"]["namespace"]["conflicts"].as_u64().unwrap()
}

/// A rename over a name whose lease the host's watch showed free is
/// stored on that condition: when another host locks the lease before the
/// rename's transaction, the compare fails, the rename is decided again
/// on etcd's answer and goes over the live lease (its inode kept), as it
/// would have had the lock come first. Red without the compare (the name
/// moves to the other file) and when undoing the lost attempt counted as
/// re-pointing the name (the retry answered ESTALE).
#[test]
fn a_rename_over_a_lease_another_host_locks_meanwhile_keeps_its_inode() {
    let cluster = Cluster::start();
    let p = prefix("renamerace");
    let (_marks, mark, a, b) = paused_and_plain(&cluster, &p, 1500, "echo v1 > lease.json");
    let (lock, go) = (b.dir.path().join("lock"), b.dir.path().join("go"));
    // The holder opens the file first: only its lock falls between the
    // rename's decision and its transaction (nothing of the namespace).
    let holder = format!(
        r#"
import fcntl, os, time
fd = os.open("lease.json", os.O_RDWR)
print("ready", flush=True)
while not os.path.exists("{lock}"):
    time.sleep(0.01)
fcntl.flock(fd, fcntl.LOCK_EX)
print(os.fstat(fd).st_ino, flush=True)
while not os.path.exists("{go}"):
    time.sleep(0.01)
print(os.pread(fd, 64, 0).decode().strip(), os.stat("lease.json").st_ino == os.fstat(fd).st_ino, flush=True)
"#,
        lock = lock.display(),
        go = go.display()
    );
    let mut h = py_ready(&b, &holder);
    sh_ok(&a.path, "echo v2 > tmp");
    // a's copy has whatever b's open changed: only the lock is news.
    assert_eq!(sh_ok(&a.path, "cat lease.json"), "v1\n");
    let before = conflicts(&a);
    let _ = std::fs::remove_file(&mark);
    let renamer = "import errno, os\ntry:\n    os.rename('tmp', 'lease.json')\n    print('renamed')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
    let mut r = Bg::capture(&a.path, "python3", &["-c", renamer]);
    await_mark(&mark);
    std::fs::write(&lock, "").unwrap();
    await_lines(&h, 1, "the holder's inode");
    assert!(r.wait(STEP).success());
    assert!(conflicts(&a) > before, "the rename's first attempt must have lost the compare");
    // The process never observed the lease: not checked (SPEC 6), also on
    // the second attempt.
    assert_eq!(r.output(), ["renamed"]);
    // The name still leads to the inode the holder locked, with the new
    // content: never to another file while the lease is held.
    std::fs::write(&go, "").unwrap();
    await_lines(&h, 2, "the holder's view");
    assert_eq!(h.output()[1], "v2 True", "{:?}", r.output());
    h.kill_all();
}

/// A lease held *solo* on another host (its counter records the holder;
/// no queue entry: written here as such a host would) is held for this
/// host too: a rename over it keeps its inode, even though the host never
/// read that counter before (the rename's first attempt finds it), a
/// `flock -n` is refused, and once that host's session is gone the next
/// holder is granted epoch 2. A rename over a file nobody holds takes the
/// new inode, as on tmpfs. Red (the name moved to the renamed file)
/// without the rename's condition on the counter.
#[test]
fn a_lease_held_solo_on_another_host_is_held_for_this_one() {
    let cluster = Cluster::start();
    let p = prefix("solo");
    let a = host(&cluster, &p, &[]);
    sh_ok(&a.path, "echo v1 > lease.json; echo v2 > tmp; echo f1 > free.json; echo f2 > tmp2");
    let ino = |f: &str| sh_ok(&a.path, &format!("stat -c %i {f}"));
    let free = ino("free.json");
    py_ok(&a.path, "import os; os.rename('tmp2', 'free.json')");
    assert_ne!(ino("free.json"), free, "a rename over a free file keeps its inode");
    let held = ino("lease.json");
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    let (lease, _) = c.grant(60).unwrap();
    c.put(format!("{p}/s/{lease:016x}").as_bytes(), b"c", lease).unwrap();
    let key = format!("{p}/q/lease.json/{lease:016x}/0000000000000000");
    let entry = serde_json::json!({"mode": "x", "state": "held", "epoch": 1, "host": "c", "pid": 7, "comm": "c", "owner": "flock:7"});
    let value = leasefs::cluster::arbiter::solo_value(1, key.as_bytes(), lease, &entry);
    c.put(format!("{p}/epoch/lease.json").as_bytes(), value.as_bytes(), 0).unwrap();
    // A process that never observed the lease renames over it (SPEC 6).
    py_ok(&a.path, "import os; os.rename('tmp', 'lease.json')");
    assert_eq!(ino("lease.json"), held, "the name left the lease another host holds");
    assert_eq!(sh_ok(&a.path, "cat lease.json"), "v2\n");
    assert_eq!(sh_code(&a.path, "flock -n -E 42 lease.json true"), 42, "granted while held on c");
    c.revoke(lease).unwrap();
    let e = sh_ok(&a.path, "flock -n -E 42 lease.json getfattr --only-values -n user.leasefs.epoch lease.json");
    assert_eq!(e, "2");
}

/// A change whose transaction loses its compare is decided again on
/// etcd's answer, and putting the host's copy back leaves every file's
/// version (SPEC 6) as it was, so a process that observed a file can
/// still rename over it. The compare lost here is the rename's check that
/// no solo holder holds the name: on the counter another host made (its
/// `ln` took the name's first epoch), which this host never read. Red
/// (`mv` refused ESTALE, `other`'s version moved) when undoing counted
/// every file as changed.
#[test]
fn a_change_decided_again_leaves_the_versions_of_files_as_they_were() {
    let cluster = Cluster::start();
    let p = prefix("undo");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "echo 1 > other; echo 2 > h; echo 3 > tmp");
    sh_ok(&b.path, "ln h h2");
    let version = || sh_ok(&a.path, "getfattr --only-values -n user.leasefs.version other");
    let before = version();
    let conflicts_before = conflicts(&a);
    // `mv` looks at h2 before it renames: an observation.
    sh_ok(&a.path, "mv tmp h2");
    assert!(conflicts(&a) > conflicts_before, "the rename's first attempt must have lost the compare");
    assert_eq!(version(), before, "undoing the lost attempt changed another file's version");
    assert_eq!(sh_ok(&b.path, "cat h2; cat h"), "3\n2\n");
}

/// Two hosts race for one name; the one whose change reaches etcd second
/// finds its compare failed, decides again on the fresh copy, and gets
/// what the single-host code answers after the other's change: `EEXIST`
/// for the loser of an exclusive create, `ENOENT` for an unlink of a name
/// the other host removed first. Nothing of the lost attempt is left.
#[test]
fn a_change_that_loses_a_race_is_decided_again_with_the_single_host_errno() {
    let cluster = Cluster::start();
    let p = prefix("race");
    let (_marks, mark, a, b) = paused_and_plain(&cluster, &p, 1500, "echo old > gone");
    // An exclusive create on a, paused before it is stored; b creates the
    // same name meanwhile.
    let creator = "import errno, os\ntry:\n    os.close(os.open('l', os.O_CREAT | os.O_EXCL | os.O_WRONLY))\n    print('created')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
    let before = conflicts(&a);
    let _ = std::fs::remove_file(&mark);
    let mut c = Bg::capture(&a.path, "python3", &["-c", creator]);
    await_mark(&mark);
    sh_ok(&b.path, "echo b > l");
    assert!(c.wait(STEP).success());
    assert_eq!(c.output(), ["EEXIST"]);
    assert!(conflicts(&a) > before, "a's first attempt must have lost the compare");
    assert_eq!(sh_ok(&a.path, "cat l; ls"), "b\ngone\nl\n");
    // Nothing of the lost attempt stays (its inode, its open file).
    assert_eq!(status(&a)["inodes"], status(&b)["inodes"]);
    // An unlink on a, paused; b removes the name first.
    let before = conflicts(&a);
    let _ = std::fs::remove_file(&mark);
    let mut u = Bg::capture(&a.path, "sh", &["-c", "rm gone 2>&1 || true"]);
    await_mark(&mark);
    sh_ok(&b.path, "rm gone");
    assert!(u.wait(STEP).success());
    assert!(u.output().concat().contains("No such file or directory"), "{:?}", u.output());
    assert!(conflicts(&a) > before);
    assert_eq!(sh_ok(&a.path, "ls"), "l\n");
    assert_eq!(sh_ok(&b.path, "ls; cat l"), "l\nb\n");
}

/// Writes to different files from two hosts at once compare different
/// keys: none of them has to be decided again.
#[test]
fn two_hosts_changing_disjoint_files_at_once_never_conflict() {
    let cluster = Cluster::start();
    let p = prefix("disjoint");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "mkdir d && touch d/fa d/fb");
    let writer = |f: &str| {
        format!(
            "{GATE}fd = os.open('d/{f}', os.O_WRONLY)\nfor i in range(150):\n    os.pwrite(fd, b'%06d' % i, 0)\nprint('done')"
        )
    };
    open_gate(&[&a, &b]);
    let (before_a, before_b) = (conflicts(&a), conflicts(&b));
    let mut wa = Bg::capture(&a.path, "python3", &["-c", &writer("fa")]);
    let mut wb = Bg::capture(&b.path, "python3", &["-c", &writer("fb")]);
    assert!(wa.wait(STEP * 4).success() && wb.wait(STEP * 4).success());
    assert_eq!(sh_ok(&a.path, "cat d/fa; echo; cat d/fb"), "000149\n000149");
    assert_eq!(sh_ok(&b.path, "cat d/fa; echo; cat d/fb"), "000149\n000149");
    assert_eq!((conflicts(&a) - before_a, conflicts(&b) - before_b), (0, 0));
}

/// Two hosts making, writing and renewing (by `rename`) files of one
/// directory at once: a change of the directory's names writes only its
/// times, never compared, so none has to be decided again; both hosts
/// then list the same names and show the same modification time. Red
/// (dozens of conflicts) when the directory's value is written and
/// compared by every change of its names.
#[test]
fn two_hosts_making_names_in_one_directory_at_once_never_conflict() {
    let cluster = Cluster::start();
    let p = prefix("onedir");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "mkdir d");
    let maker = |tag: &str| {
        format!(
            r#"{GATE}for i in range(40):
    fd = os.open("d/{tag}%d" % i, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, b"x")
    os.close(fd)
    with open("d/{tag}.tmp", "w") as f:
        f.write(str(i))
    os.rename("d/{tag}.tmp", "d/{tag}.json")
print("done")"#
        )
    };
    open_gate(&[&a, &b]);
    let (before_a, before_b) = (conflicts(&a), conflicts(&b));
    let mut ma = Bg::capture(&a.path, "python3", &["-c", &maker("a")]);
    let mut mb = Bg::capture(&b.path, "python3", &["-c", &maker("b")]);
    assert!(ma.wait(STEP * 4).success() && mb.wait(STEP * 4).success(), "{:?} {:?}", ma.output(), mb.output());
    assert_eq!((conflicts(&a) - before_a, conflicts(&b) - before_b), (0, 0));
    // Each host opens the other's last file (close-to-open: its copy has
    // caught up), then lists the directory and reads its times.
    let view = |m: &Mount| sh_ok(&m.path, "cat d/a.json d/b.json >/dev/null; ls d | wc -l; stat -c '%y %z' d");
    let (va, vb) = (view(&a), view(&b));
    assert_eq!(va, vb);
    assert!(va.starts_with("82\n"), "{va}");
    // The directory's times are those of its last change of names, later
    // than any of its files' births.
    let newest_birth = sh_ok(&a.path, "stat -c %Y d/a39 d/b39 | sort -n | tail -1");
    let dir_mtime = sh_ok(&b.path, "stat -c %Y d");
    assert!(dir_mtime.trim().parse::<u64>().unwrap() >= newest_birth.trim().parse::<u64>().unwrap());
    // Times set back on the directory reach the other host as set (red
    // when they went the way of a change of names: the later times stood).
    sh_ok(&a.path, "touch -m -d @981173106 d");
    assert_eq!(sh_ok(&b.path, "cat d/a.json >/dev/null; stat -c %Y d"), "981173106\n");
    sh_ok(&b.path, "touch d/c");
    let made = sh_ok(&a.path, "cat d/c; stat -c %Y d").trim().parse::<u64>().unwrap();
    assert!(made > 981173106, "a name made after it moves the time again");
}

/// A directory removed on one host while another host makes a name in it
/// (which writes only the directory's times): the removal is compared to
/// find the directory empty, loses, and is decided again: `ENOTEMPTY`, and
/// the new name stays readable on both hosts. Red (the removal succeeded,
/// leaving a name under a directory that is gone) without that compare.
#[test]
fn a_directory_removed_while_another_host_makes_a_name_in_it_is_not_empty() {
    let cluster = Cluster::start();
    let p = prefix("rmdirrace");
    let (_marks, mark, a, b) = paused_and_plain(&cluster, &p, 1500, "mkdir d");
    let before = conflicts(&a);
    let _ = std::fs::remove_file(&mark);
    let remover =
        "import errno, os\ntry:\n    os.rmdir('d')\n    print('removed')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
    let mut r = Bg::capture(&a.path, "python3", &["-c", remover]);
    await_mark(&mark);
    sh_ok(&b.path, "echo new > d/x");
    assert!(r.wait(STEP).success());
    assert_eq!(r.output(), ["ENOTEMPTY"]);
    assert!(conflicts(&a) > before, "the removal's first attempt must have lost the compare");
    assert_eq!(sh_ok(&a.path, "cat d/x"), "new\n");
    assert_eq!(sh_ok(&b.path, "ls d; cat d/x"), "x\nnew\n");
}

/// Two hosts moving two directories each into the other at once: the
/// first move to reach etcd wins, the other compares the ancestors of
/// its new parent, loses, and is decided again: `EINVAL` (a directory
/// cannot move into itself), so no cycle is ever stored. Red (both moves
/// stored, a cycle no walk from the root reaches) when a directory move
/// writes only its parents' times.
#[test]
fn crossing_moves_of_two_directories_on_two_hosts_never_make_a_cycle() {
    let cluster = Cluster::start();
    let p = prefix("crossing");
    let (_marks, mark, a, b) = paused_and_plain(&cluster, &p, 1500, "mkdir d1 d2");
    let _ = std::fs::remove_file(&mark);
    let mover = "import errno, os\ntry:\n    os.rename('d1', 'd2/d1')\n    print('moved')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])";
    let mut m = Bg::capture(&a.path, "python3", &["-c", mover]);
    await_mark(&mark);
    sh_ok(&b.path, "mv d2 d1/d2");
    assert!(m.wait(STEP).success());
    assert_eq!(m.output(), ["EINVAL"]);
    assert_eq!(sh_ok(&a.path, "find . | sort"), ".\n./d1\n./d1/d2\n");
    assert_eq!(sh_ok(&b.path, "find . | sort"), ".\n./d1\n./d1/d2\n");
}

#[test]
fn exclusive_creates_of_one_name_on_two_hosts_at_once_succeed_exactly_once() {
    let cluster = Cluster::start();
    let p = prefix("excl");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    // Each process creates lock0..lock19 with O_EXCL after a common start.
    let racer = |tag: &str| {
        format!(
            r#"
{GATE}won = []
for i in range(20):
    try:
        os.close(os.open("lock%d" % i, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        won.append(i)
        open("lock%d" % i, "w").write("{tag}")
    except FileExistsError:
        pass
print(" ".join(map(str, won)))
"#
        )
    };
    open_gate(&[&a, &b]);
    let (ra, rb) =
        (Bg::capture(&a.path, "python3", &["-c", &racer("a")]), Bg::capture(&b.path, "python3", &["-c", &racer("b")]));
    let (mut ra, mut rb) = (ra, rb);
    assert!(ra.wait(STEP).success() && rb.wait(STEP).success());
    let parse = |bg: &Bg| -> Vec<u32> {
        bg.output().first().map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect()).unwrap_or_default()
    };
    let (wa, wb) = (parse(&ra), parse(&rb));
    let mut all: Vec<u32> = wa.iter().chain(wb.iter()).copied().collect();
    all.sort();
    assert_eq!(all, (0..20).collect::<Vec<_>>(), "a won {wa:?}, b won {wb:?}");
    // Each name holds its winner's mark on both hosts.
    for i in 0..20 {
        let who = if wa.contains(&i) { "a" } else { "b" };
        for m in [&a, &b] {
            assert_eq!(std::fs::read_to_string(m.p(&format!("lock{i}"))).unwrap(), who);
        }
    }
    eprintln!("O_EXCL race: a won {} names, b won {}", wa.len(), wb.len());
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn a_host_follows_hundreds_of_changes_through_its_one_watch_and_a_new_host_starts_from_them() {
    let cluster = Cluster::start();
    let p = prefix("behind");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&b.path, "echo start > s");
    let before = status(&b)["etcd"]["namespace"]["reloads"].as_u64().unwrap();
    // Hundreds of changes, among them a name b knows re-pointed by a
    // rename: b applies them from its watch, in order, without a re-read.
    sh_ok(
        &a.path,
        "mkdir many && for i in $(seq 300); do echo $i > many/$i; done; rm many/1; echo renewed > t && mv t s",
    );
    assert_eq!(sh_ok(&b.path, "ls many | wc -l; cat many/300 s"), "299\n300\nrenewed\n");
    let after = status(&b)["etcd"]["namespace"]["reloads"].as_u64().unwrap();
    assert_eq!(after, before, "b followed through its watch");
    assert!(status(&b)["etcd"]["namespace"]["replayed"].as_u64().unwrap() >= 300);
    // A host that mounts later (or again) starts from the shared namespace.
    drop(a);
    let c = host(&cluster, &p, &[]);
    assert_eq!(sh_ok(&c.path, "ls many | wc -l; cat many/2 s"), "299\n2\nrenewed\n");
}

/// Without etcd (quorum lost), changes and opens fail with `EIO` in
/// bounded time; both work again once etcd is back, and reads ask etcd
/// again (the copy is no longer taken as current).
#[test]
fn without_etcd_changes_and_opens_fail_with_eio_and_recover() {
    let mut cluster = Cluster::start();
    let p = prefix("nsoutage");
    let a = host(&cluster, &p, &["--etcd-timeout", "1s"]);
    sh_ok(&a.path, "echo cached > z");
    let leader = cluster.leader();
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    cluster.kill(others[0]);
    cluster.kill(others[1]);
    let started = Instant::now();
    let o = sh(&a.path, "echo new > z2");
    let took = started.elapsed();
    assert!(String::from_utf8_lossy(&o.stderr).contains("Input/output error"), "{o:?} after {took:?}");
    assert!(took < Duration::from_secs(10), "a change waited {took:?}");
    eprintln!("a change failed with EIO after {took:?} (--etcd-timeout 1s, quorum lost)");
    let o = sh(&a.path, "cat z");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Input/output error"), "an open without etcd: {o:?}");
    assert_eq!(status(&a)["etcd"]["namespace"]["stale"], true);
    cluster.restart(others[0]);
    cluster.restart(others[1]);
    await_success(&a, "echo again > z2 2>/dev/null", "changes never worked again");
    let b = host(&cluster, &p, &[]);
    assert_eq!(sh_ok(&b.path, "cat z z2"), "cached\nagain\n");
    let deadline = Instant::now() + STEP;
    loop {
        assert_eq!(sh_ok(&a.path, "cat z2"), "again\n");
        if status(&a)["etcd"]["namespace"]["stale"] == false {
            break;
        }
        assert!(Instant::now() < deadline, "reads on a never left the copy: {}", status(&a));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Close-to-open (SPEC 10), the copy's side: while etcd is frozen (every
/// member stopped), `stat`, `ls` and xattr reads answer from the host's
/// copy as long as it is known to be at most `--etcd-copy-lag` behind
/// (10 s here) with no round trip; past that they ask etcd and fail with
/// `EIO` after the bounded time, never showing a copy that could not be
/// checked; an `open` asks etcd at once. All works again once etcd
/// resumes. Red with the lag check removed (reads answer from the copy
/// for ever) and with reads always asking etcd (the first `stat` fails).
#[test]
fn reads_answer_from_the_copy_within_its_lag_and_fail_with_eio_past_it() {
    let cluster = Cluster::start();
    let p = prefix("copylag");
    let a = host(&cluster, &p, &["--etcd-timeout", "1s", "--etcd-copy-lag", "10s"]);
    sh_ok(&a.path, "echo v > z && setfattr -n user.k -v 1 z");
    // Within the lag: the reads answer from the copy. (Tried again, etcd
    // running meanwhile, on a machine so loaded that the reads did not
    // even start within the lag.)
    let mut tries = 0;
    let (confirmed, frozen) = loop {
        tries += 1;
        assert_eq!(sh_ok(&a.path, "cat z"), "v\n", "an open confirms the copy");
        let confirmed = Instant::now();
        let frozen: Vec<Frozen> = cluster.pids().into_iter().map(Frozen::stop).collect();
        let reads = status(&a)["etcd"]["namespace"]["copy"]["reads"].as_u64().unwrap();
        let o = sh(&a.path, "stat -c %s z; ls; getfattr --only-values -n user.k z; echo");
        if confirmed.elapsed() >= Duration::from_secs(5) && tries < 3 {
            drop(frozen);
            continue;
        }
        assert_eq!(String::from_utf8_lossy(&o.stdout), "2\nz\n1\n", "reads within the lag: {o:?}");
        let copy = status(&a)["etcd"]["namespace"]["copy"].clone();
        assert!(copy["reads"].as_u64().unwrap() > reads, "{copy}");
        break (confirmed, frozen);
    };
    let o = sh(&a.path, "cat z");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Input/output error"), "an open on a frozen etcd: {o:?}");
    // An O_EXCL create of a name the copy has is not refused `EEXIST`
    // unchecked (another host may have removed it): `EIO`, as the open.
    let excl = "import errno, os\ntry:\n os.open('z', os.O_CREAT|os.O_EXCL|os.O_WRONLY)\n print('made')\nexcept OSError as e:\n print(errno.errorcode[e.errno])";
    assert_eq!(py_ok(&a.path, excl).trim(), "EIO", "an O_EXCL create of a name the copy has, etcd frozen");
    // Past the lag the copy stops answering.
    let deadline = Instant::now() + STEP;
    let failed = loop {
        let o = sh(&a.path, "stat -c %s z");
        if !o.status.success() {
            break o;
        }
        assert!(Instant::now() < deadline, "the copy answered for {:?} with etcd frozen", confirmed.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(String::from_utf8_lossy(&failed.stderr).contains("Input/output error"), "{failed:?}");
    assert!(confirmed.elapsed() >= Duration::from_secs(10), "refused before the lag ran out");
    assert!(status(&a)["etcd"]["namespace"]["copy"]["refused"].as_u64().unwrap() >= 1);
    drop(frozen);
    await_success(&a, "stat z >/dev/null 2>&1 && cat z >/dev/null 2>&1", "reads never worked again");
}

/// `--etcd-copy-lag off`: every read asks etcd (linearizable reads): no
/// read is answered from the copy, and a `stat` right after another
/// host's write returned shows it. Red when the option is not passed on
/// (the default lag answers from the copy).
#[test]
fn with_the_copy_lag_off_every_read_asks_etcd() {
    let cluster = Cluster::start();
    let p = prefix("lagoff");
    let a = host(&cluster, &p, &[]);
    let b = host(&cluster, &p, &["--etcd-copy-lag", "off"]);
    sh_ok(&a.path, "echo 1 > f");
    let sent = |m: &Mount| status(m)["etcd"]["namespace"]["barriers"]["sent"].as_u64().unwrap();
    let before = sent(&b);
    for i in 0..20 {
        sh_ok(&a.path, &format!("echo {i}-long > f"));
        assert_eq!(
            sh_ok(&b.path, "stat -c %s f"),
            format!("{}\n", i.to_string().len() + 6),
            "b's stat after a's write"
        );
    }
    let copy = status(&b)["etcd"]["namespace"]["copy"].clone();
    assert_eq!((copy["reads"].as_u64(), copy["max_lag_ms"].as_u64()), (Some(0), Some(0)), "{copy}");
    assert!(sent(&b) - before >= 20, "every stat asked etcd: {}", status(&b)["etcd"]["namespace"]);
}

/// Close-to-open (SPEC 10), across hosts: what one host wrote and closed,
/// another host's `open` reads; a name another host made is never
/// refused to an `O_EXCL` create or an `open` that comes after it (a name
/// the copy lacks is confirmed before `ENOENT`); a file another host
/// replaced by `rename` is opened as the new one even when the lookup was
/// answered from a copy that had not seen it (the open answers `ESTALE`
/// and the kernel looks the name up again); `stat` catches up within the
/// lag. A lookup for an `O_CREAT` open is not confirmed (the create
/// compares): the file another host made meanwhile is opened as any open
/// would (truncated, a symlink followed; a directory of the same name on
/// the way is confirmed). Host b's watch is held back 400 ms, so its copy
/// lags visibly.
#[test]
fn names_and_contents_are_close_to_open_across_hosts() {
    let cluster = Cluster::start();
    let p = prefix("cto");
    let a = host(&cluster, &p, &[]);
    let eps = cluster.endpoints().join(",");
    let b = Mount::with_args_env(
        &["--allow-other", "--volatile", "--etcd", &eps, "--etcd-prefix", &p],
        &[("LEASEFS_PAUSE", "feed:400")],
    );
    for round in 0..20 {
        let f = format!("f{round}");
        // Written and closed on a, opened on b.
        sh_ok(&a.path, &format!("echo v{round} > {f}"));
        assert_eq!(sh_ok(&b.path, &format!("cat {f}")), format!("v{round}\n"), "b's open after a's close");
        // Made on a, then an exclusive create on b: EEXIST.
        sh_ok(&a.path, &format!("touch x{round}"));
        let excl = format!("import os\ntry:\n os.open('x{round}', os.O_CREAT|os.O_EXCL|os.O_WRONLY)\n print('made')\nexcept FileExistsError:\n print('EEXIST')");
        assert_eq!(py_ok(&b.path, &excl).trim(), "EEXIST", "b's O_EXCL create after a's create");
        // Looked up on b (from its copy), replaced on a, opened on b.
        assert_eq!(sh_ok(&b.path, &format!("stat -c %s {f}")), format!("{}\n", 2 + round.to_string().len()));
        sh_ok(&a.path, &format!("echo new{round} > n && mv n {f}"));
        assert_eq!(sh_ok(&b.path, &format!("cat {f}")), format!("new{round}\n"), "b's open after a's rename");
        // An O_CREAT open on b of a name a made, which b's copy lacks (its
        // lookup for the create is not confirmed): b writes the file a
        // made, truncated (`>`), through a symlink a made, and into a
        // directory a made whose name is also the file's.
        if round % 4 != 0 {
            continue;
        }
        // (Each made on a right before b's create: b's first change
        // catches its copy up.)
        sh_ok(&a.path, &format!("echo made-on-a > c{round}"));
        sh_ok(&b.path, &format!("echo b > c{round}"));
        sh_ok(&a.path, &format!("ln -s t{round} s{round}"));
        sh_ok(&b.path, &format!("echo via > s{round}"));
        sh_ok(&a.path, &format!("mkdir q{round}"));
        sh_ok(&b.path, &format!("echo in > q{round}/q{round}"));
        assert_eq!(sh_ok(&a.path, &format!("cat c{round}")), "b\n", "b's `>` truncates the file a made");
        assert_eq!(sh_ok(&a.path, &format!("cat t{round}")), "via\n", "b's `>` follows a's symlink");
        assert_eq!(sh_ok(&a.path, &format!("cat q{round}/q{round}")), "in\n", "b's `>` into a's new directory");
        // b's mkdir (with a trailing `/`) and symlink of names a made:
        // EEXIST. (Whether their lookups were confirmed depends on how far
        // behind the held-back watch is: past the lag every lookup reads
        // etcd; `making_a_name_asks_etcd_nothing` counts them.)
        sh_ok(&a.path, &format!("mkdir m{round} && echo a > k{round}"));
        for step in [format!("mkdir m{round}/"), format!("ln -sT elsewhere k{round}")] {
            let out = sh(&b.path, &step);
            assert!(String::from_utf8_lossy(&out.stderr).contains("File exists"), "b's {step}: {out:?}");
        }
        assert_eq!(sh_ok(&b.path, &format!("cat k{round}")), "a\n");
    }
    let copy = &status(&b)["etcd"]["namespace"]["copy"];
    assert!(copy["reads"].as_u64().unwrap() > 0);
    assert!(copy["unconfirmed_creates"].as_u64().unwrap() >= 15, "b's creates were looked up without a read: {copy}");
    // A change on a shows in b's stat within the lag (and the watch's delay).
    sh_ok(&a.path, "echo longer-content > f0");
    let changed = Instant::now();
    while sh_ok(&b.path, "stat -c %s f0") != "15\n" {
        assert!(changed.elapsed() < STEP, "b's stat never caught up: {}", status(&b));
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("b's stat caught up after {:?} (watch held back 400 ms, lag 1 s)", changed.elapsed());
}

/// The lookup before a call that makes a name (an `O_CREAT` open,
/// `O_EXCL` or not, `mkdir` with a trailing `/`, `mknod`, `symlink`) asks
/// etcd nothing: the call's own transaction compares that the name is
/// absent. A plain open's lookup of a missing name is confirmed, and
/// answered `ENOENT`.
#[test]
fn making_a_name_asks_etcd_nothing() {
    let cluster = Cluster::start();
    let p = prefix("make");
    let b = host(&cluster, &p, &[]);
    let unconfirmed = || status(&b)["etcd"]["namespace"]["copy"]["unconfirmed_creates"].as_u64().unwrap();
    sh_ok(&b.path, "touch warm && ls >/dev/null");
    // (`set -C`: the shell's `>` opens with O_EXCL. dash stats the name
    // first, as noclobber asks: that lookup of a missing name is a plain
    // one, confirmed with one read; the open's own lookup is not.)
    for step in ["touch f", "set -C && echo x > x", "mkdir d/", "mknod fifo p", "ln -sT elsewhere s", "echo in > d/f"] {
        let (u0, r0) = (unconfirmed(), ranges(&b));
        sh_ok(&b.path, step);
        assert_eq!(unconfirmed() - u0, 1, "{step}: its lookup was not confirmed");
        let reads = if step.starts_with("set -C") { 1 } else { 0 };
        assert_eq!(ranges(&b) - r0, reads, "{step}: reads of etcd");
    }
    assert_eq!(sh_ok(&b.path, "ls -F | tr '\\n' ' '"), "d/ f fifo| s@ warm x ");
    let (u0, r0) = (unconfirmed(), ranges(&b));
    let out = sh(&b.path, "cat nosuch");
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file"), "{out:?}");
    assert_eq!(unconfirmed(), u0, "a plain open's lookup is confirmed");
    assert!(ranges(&b) > r0, "with a read of etcd");
}

/// FUSE requests of opcode `op` host `m` received so far.
fn fuse_requests(m: &Mount, op: &str) -> u64 {
    let text = std::fs::read_to_string(m.path.join(".leasefs/metrics")).expect("metrics");
    let key = format!("leasefs_fuse_requests_total{{op=\"{op}\",");
    text.lines().find(|l| l.starts_with(&key)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0)
}

/// The kernel keeps names it looked up on a shared mount (for what is left
/// of the copy's lag), and an open through a kept name checks it: a name
/// another host pointed at a new file while the old one lives on opens the
/// new one, a name under a directory another host moved is gone, and a
/// directory another host made unsearchable is closed to others at once.
/// Each round has b's kernel keep the names, makes one change on a, and
/// opens on b before anything else could make b's kernel drop them.
#[test]
fn names_the_kernel_keeps_are_checked_when_opened_across_hosts() {
    let cluster = Cluster::start();
    let p = prefix("kept");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(
        &a.path,
        "mkdir -m 755 d1 open && mkdir -m 700 private && echo in > d1/h && echo pub > open/f \
         && echo s > private/f && echo v0 > g && touch x",
    );
    // Names younger than a second are not kept by the kernel.
    std::thread::sleep(Duration::from_millis(1100));
    // An open asks the store, so the copy is fresh and the names looked up
    // right after it may be kept for almost the whole lag; the second walk
    // of each name costs no lookup.
    let keep = |walk: &str, nobody: bool| {
        let script = format!("cat x; for f in {walk}; do stat $f >/dev/null; done");
        let run = |m: &Mount| {
            if nobody {
                assert_eq!(as_nobody(&m.path, &script).0, 0)
            } else {
                sh_ok(&m.path, &script);
            }
        };
        run(&b);
        let l0 = fuse_requests(&b, "lookup");
        run(&b);
        let looked = fuse_requests(&b, "lookup") - l0;
        // `cat x` and reading the metrics may look names up.
        assert!(looked <= 3, "b's kernel kept the names of {walk}: {looked} lookups");
    };
    let stale = || status(&b)["etcd"]["namespace"]["copy"]["stale_lookups"].as_u64().unwrap();
    let s0 = stale();
    keep("g", false);
    sh_ok(&a.path, "mv g g.old && echo new > g");
    let copy = || status(&b)["etcd"]["namespace"].clone();
    let before = copy();
    assert_eq!(sh_ok(&b.path, "cat g"), "new\n", "b's open of a name a pointed elsewhere");
    // One read of etcd for the whole call: the open of the kernel's second
    // walk is answered from the read that refused the first. (A machine
    // slow enough for the kept name to expire first looks it up afresh:
    // no second walk, and still one read.)
    let after = copy();
    let delta = |k: &[&str]| {
        let at = |v: &serde_json::Value| k.iter().fold(v.clone(), |v, k| v[k].clone()).as_u64().unwrap();
        at(&after) - at(&before)
    };
    assert_eq!(delta(&["barriers", "sent"]), 1, "the open walked again read etcd again: {before} -> {after}");
    assert_eq!(
        delta(&["copy", "stale_lookups_reopened_without_read"]),
        delta(&["copy", "stale_lookups"]),
        "{before} -> {after}"
    );
    keep("d1/h", false);
    sh_ok(&a.path, "mv d1 d2");
    let out = sh(&b.path, "cat d1/h");
    assert_ne!(out.status.code(), Some(0), "a name under a directory a moved is gone on b");
    assert!(String::from_utf8_lossy(&out.stderr).contains("No such file or directory"), "{out:?}");
    keep("open/f", true);
    sh_ok(&a.path, "chmod 700 open");
    let (code, err) = as_nobody(&b.path, "cat open/f");
    assert_ne!(code, 0, "a directory made unsearchable on a is closed on b");
    assert!(err.contains("Permission denied"), "{err}");
    // The same when the chmod is made on b itself (the kernel does not
    // drop the names it kept in a directory whose mode it changed).
    sh_ok(&a.path, "chmod 755 open");
    keep("open/f", true);
    sh_ok(&b.path, "chmod 700 open");
    let (code, err) = as_nobody(&b.path, "cat open/f");
    assert_ne!(code, 0, "a directory made unsearchable on b is closed on b");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(stale() - s0 >= 3, "each open through a kept name was walked again");
    // Names in a directory not everyone may search are not kept: root's
    // walk leaves nothing the kernel would let nobody through.
    sh_ok(&b.path, "cat x; stat private/f >/dev/null; stat private/f >/dev/null");
    let (code, err) = as_nobody(&b.path, "stat private/f");
    assert_ne!(code, 0, "nobody walked through a directory it may not search");
    assert!(err.contains("Permission denied"), "{err}");
    assert_eq!(sh_ok(&b.path, "cat d2/h g.old"), "in\nv0\n");
}

/// A name the kernel keeps expires with the copy's lag: with
/// `--etcd-copy-lag 200ms`, a `stat` on b 400 ms after b's kernel was given
/// a name shows the file another host renamed over it since (kept for the
/// usual 1 s, it would show the old one).
#[test]
fn a_name_the_kernel_keeps_expires_with_the_copys_lag() {
    let cluster = Cluster::start();
    let p = prefix("keptlag");
    let a = host(&cluster, &p, &[]);
    let b = host(&cluster, &p, &["--etcd-copy-lag", "200ms"]);
    sh_ok(&a.path, "echo v0 > g && touch x");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(sh_ok(&b.path, "cat x; stat -c %s g"), "3\n");
    sh_ok(&a.path, "echo new-content > n && mv n g");
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(sh_ok(&b.path, "stat -c %s g"), "12\n", "b's stat 400 ms later still showed the replaced file");
}

/// A Python holder of `x` that opens `reg` (guarded by `x`), prints
/// `ready` and its epoch, waits for the file `go`, then writes `text` and a
/// newline to `reg` and prints `written` or the errno; then stays 60 s if
/// `stay`.
fn guarded_holder(go: &Path, text: &str, stay: bool) -> String {
    format!(
        r#"
import errno, fcntl, os, time
fd = os.open("x", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
g = os.open("reg", os.O_RDWR)
print("ready", flush=True)
print(int(os.getxattr(fd, "user.leasefs.epoch")), flush=True)
while not os.path.exists("{go}"):
    time.sleep(0.01)
try:
    os.pwrite(g, b"{text}\n", 0)
    print("written", flush=True)
except OSError as e:
    print(errno.errorcode[e.errno], flush=True)
{stay}"#,
        go = go.display(),
        stay = if stay { "time.sleep(60)\n" } else { "" }
    )
}

/// A holder granted solo (no queue entry) whose entry another host's
/// waiter wrote when it queued behind it still holds: its write through a
/// file its lease guards lands (the first attempt finds the counter
/// changed and the entry there, and compares that entry from then on),
/// and the waiter is granted the next epoch when it releases. Red
/// (`ESTALE`) when a changed counter counts as the hold lost.
#[test]
fn a_solo_holder_keeps_writing_after_a_waiter_queued_behind_it() {
    let cluster = Cluster::start();
    let p = prefix("solowrite");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x && echo original > reg && setfattr -n user.leasefs.guard -v x reg");
    let go = a.dir.path().join("go");
    let holder = guarded_holder(&go, "written ", false);
    let mut h = py_ready(&a, &holder);
    await_lines(&h, 1, "the holder's epoch");
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    let q = format!("{p}/q/x/").into_bytes();
    assert_eq!(c.range(&q, &prefix_end(&q)).unwrap().0.len(), 0, "the holder was not granted solo");
    assert_eq!(entries(&cluster, &p, "x"), 1);
    let waiter = "import fcntl, os\nfd = os.open('x', os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))";
    let mut w = Bg::capture(&b.path, "python3", &["-c", waiter]);
    // The waiter wrote the holder's entry and its own.
    let deadline = Instant::now() + STEP;
    while c.range(&q, &prefix_end(&q)).unwrap().0.len() != 2 {
        assert!(Instant::now() < deadline, "the waiter never queued behind the solo holder");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(&go, "").unwrap();
    await_lines(&h, 2, "the write never returned");
    assert_eq!(h.output()[1], "written", "the holder's write was refused");
    assert!(h.wait(STEP).success());
    assert!(w.wait(STEP).success(), "b was never granted");
    let e1: u64 = h.output()[0].parse().unwrap();
    assert_eq!(w.output(), [format!("{}", e1 + 1)]);
    assert_eq!(sh_ok(&b.path, "cat reg"), "written \n");
    assert_eq!(status(&a)["etcd"]["solo"]["granted"], 1, "{}", status(&a));
    assert_eq!(status(&b)["etcd"]["solo"]["entries_written"], 1, "{}", status(&b));
}

/// Names host b has seen, removed on host a: b's `O_EXCL` create,
/// `mkdir`, `link` and `renameat2(RENAME_NOREPLACE)` right after make them
/// (b's copy, its watch held back 400 ms, still has the name: the kernel
/// asks again before such calls, and that lookup is confirmed with etcd).
/// Red (`EEXIST` every time) when the copy answers it.
#[test]
fn an_exclusive_create_after_another_hosts_unlink_makes_the_name() {
    let cluster = Cluster::start();
    let p = prefix("reexcl");
    let a = host(&cluster, &p, &[]);
    let b = host_env(&cluster, &p, &[], &[("LEASEFS_PAUSE", "feed:400")]);
    let script = format!(
        r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
a, b = "{a}", "{b}"
refused = []
def made(name, call):
    try:
        call()
    except FileExistsError:
        refused.append(name)
def noreplace(old, new):
    if libc.renameat2(-100, old.encode(), -100, new.encode(), 1) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
# Each call right after a's removal, before anything else catches b's
# copy up.
calls = {{
    "g": lambda n: os.close(os.open(f"{{b}}/{{n}}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
    "d": lambda n: os.mkdir(f"{{b}}/{{n}}"),
    "l": lambda n: os.link(f"{{b}}/src", f"{{b}}/{{n}}"),
    "r": lambda n: noreplace(f"{{b}}/src", f"{{b}}/{{n}}"),
}}
for i in range(3):
    for kind, call in calls.items():
        n = f"{{kind}}{{i}}"
        open(f"{{b}}/src", "w").close()
        (os.mkdir if kind == "d" else lambda p: open(p, "w").close())(f"{{a}}/{{n}}")
        os.stat(f"{{b}}/{{n}}")
        (os.rmdir if kind == "d" else os.unlink)(f"{{a}}/{{n}}")
        made(n, lambda: call(n))
print(" ".join(refused) or "none")
"#,
        a = a.path.display(),
        b = b.path.display()
    );
    assert_eq!(py_ok(a.dir.path(), &script).trim(), "none", "b's exclusive calls refused with EEXIST");
    let copy = &status(&b)["etcd"]["namespace"]["copy"];
    assert!(copy["confirmed_existing"].as_u64().unwrap() > 0, "no lookup of a removed name was confirmed: {copy}");
}

/// An `O_EXCL` create on host b of the name of a lease a holder on host
/// a holds (its file unlinked there) re-attaches the lease (SPEC 4): the
/// epoch stays on both hosts and the holder keeps writing through a file
/// its lease guards, whether it was granted solo or with an entry. Once
/// the holder is gone from etcd (its entry deleted), the same create is
/// an acquisition: epoch + 1. Red without the re-attach: epoch 2 on both
/// hosts, and the solo holder's guarded write `ESTALE`.
#[test]
fn an_exclusive_create_of_a_lease_held_on_another_host_reattaches_it() {
    let cluster = Cluster::start();
    let p = prefix("reattach");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x && echo original > reg && setfattr -n user.leasefs.guard -v x reg");
    let excl = |f: &str| {
        format!("import os\nfd = os.open('{f}', os.O_CREAT|os.O_EXCL|os.O_RDWR)\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))")
    };
    // Granted solo.
    let go = a.dir.path().join("go");
    let mut h = py_ready(&a, &guarded_holder(&go, "still held", true));
    await_lines(&h, 1, "the holder's epoch");
    let e1: u64 = h.output()[0].parse().unwrap();
    assert_eq!(status(&a)["etcd"]["solo"]["granted"], 1, "x was not granted solo");
    sh_ok(&a.path, "rm x");
    assert_eq!(py_ok(&b.path, &excl("x")).trim(), format!("{e1}"), "b's O_EXCL create of x");
    for m in [&a, &b] {
        assert_eq!(epoch(&m.path, "x"), e1, "x's epoch on {}", m.path.display());
    }
    std::fs::write(&go, "").unwrap();
    await_lines(&h, 2, "the write never returned");
    assert_eq!(h.output()[1], "written", "the holder's guarded write");
    assert_eq!(sh_ok(&b.path, "cat reg"), "still held\n");
    h.kill_all();
    // Granted with an entry (an events reader keeps solo grants off).
    let mut events = Bg::capture(&a.path, "cat", &[".leasefs/events"]);
    sh_ok(&a.path, "touch y");
    let mut hy = Bg::ready(
        &a.path,
        "exec flock y sh -c 'echo ready; getfattr --only-values -n user.leasefs.epoch y; echo; sleep 60'",
    );
    await_lines(&hy, 1, "the holder of y never printed its epoch");
    let ey: u64 = hy.output()[0].parse().unwrap();
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    let q = format!("{p}/q/y/").into_bytes();
    let held = c.range(&q, &prefix_end(&q)).unwrap().0;
    assert_eq!(held.len(), 1, "y's holder has no entry");
    sh_ok(&a.path, "rm y");
    assert_eq!(py_ok(&b.path, &excl("y")).trim(), format!("{ey}"), "b's O_EXCL create of y");
    assert_eq!(epoch(&a.path, "y"), ey);
    // Its entry gone (as when its host's session expired): the next
    // create of the name acquires the lease.
    c.delete(&held[0].key, &[]).unwrap();
    sh_ok(&b.path, "rm y");
    assert_eq!(py_ok(&b.path, &excl("y")).trim(), format!("{}", ey + 1), "b's O_EXCL create once the holder was gone");
    hy.kill_all();
    events.kill_all();
}

#[test]
fn a_guarded_write_is_stored_only_while_its_lease_is_held_in_etcd() {
    guarded_write_after_the_hold_went(true);
}

/// The same without another holder: the hold's session key goes (as when
/// etcd expired the session) while nothing else changes, and a holder
/// granted solo (whose counter still names it) cannot land its write.
/// Red (the write stored) without the session-key compare of a solo
/// holder's writes.
#[test]
fn a_solo_holders_write_is_refused_once_its_session_is_gone_in_etcd() {
    guarded_write_after_the_hold_went(false);
}

fn guarded_write_after_the_hold_went(next_holder: bool) {
    let cluster = Cluster::start();
    let p = prefix("guardtxn");
    let eps = cluster.endpoints().join(",");
    // Host a stalls each guarded write just before storing it, so the
    // lease can be lost in between (as when a host pauses there).
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("paused");
    let a = Mount::with_args_env(
        &["--allow-other", "--volatile", "--etcd", &eps, "--etcd-prefix", &p],
        &[("LEASEFS_PAUSE", "guarded-publish:3000"), ("LEASEFS_PAUSE_MARK", mark.to_str().unwrap())],
    );
    let b = host(&cluster, &p, &[]);
    sh_ok(&b.path, "touch x && echo original > reg && setfattr -n user.leasefs.guard -v x reg");
    let go = a.dir.path().join("go");
    let holder = guarded_holder(&go, "stale   ", true);
    let mut h = py_ready(&a, &holder);
    await_entries(&cluster, &p, "x", 1);
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    // The key whose loss ends the hold, as a lost session's would: the
    // holder's entry, or for a holder granted solo its session key.
    let q = format!("{p}/q/x/").into_bytes();
    let gone = match c.range(&q, &prefix_end(&q)).unwrap().0.first() {
        Some(entry) => entry.key.clone(),
        None => {
            let counter = c.get(format!("{p}/epoch/x").as_bytes()).unwrap().0.expect("the counter");
            let solo = leasefs::cluster::arbiter::solo_of(&counter.value).expect("a holder without an entry is solo");
            format!("{p}/s/{:016x}", solo.lease).into_bytes()
        }
    };
    std::fs::write(&go, "").unwrap();
    // Host a decided the write and is about to store it.
    let deadline = Instant::now() + STEP;
    while !mark.exists() {
        assert!(Instant::now() < deadline, "host a never started storing the write");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Meanwhile a reader on a asks for the file: it waits for the write
    // to be stored or refused, and never sees it before.
    let mut reader = Bg::capture(&a.path, "cat", &["reg"]);
    // Meanwhile its holder's entry goes (as on expiry) and b is granted.
    c.delete(&gone, &[]).unwrap();
    if next_holder {
        let waiter = "import fcntl, os\nfd = os.open('x', os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))";
        let mut w = Bg::capture(&b.path, "python3", &["-c", waiter]);
        assert!(w.wait(STEP).success(), "b was never granted");
        let e1: u64 = h.output()[0].parse().unwrap();
        assert_eq!(w.output(), [format!("{}", e1 + 1)]);
    } else {
        assert!(gone.starts_with(format!("{p}/s/").as_bytes()), "the holder was not granted solo");
    }
    await_lines(&h, 2, "the write never returned");
    assert_eq!(h.output()[1], "ESTALE", "the stale holder's write was stored");
    assert_eq!(sh_ok(&b.path, "cat reg"), "original\n");
    assert_eq!(sh_ok(&a.path, "cat reg"), "original\n");
    assert!(reader.wait(STEP).success());
    assert_eq!(reader.output(), ["original"], "a reader saw a write that was never stored");
    h.kill_all();
}

#[test]
fn a_rename_over_a_lease_held_on_another_host_keeps_its_inode_and_stale_views_get_estale() {
    let cluster = Cluster::start();
    let p = prefix("renameover");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "echo v1 > lease.json && echo p1 > plain");
    let go = b.dir.path().join("go");
    // On b: a holder of lease.json, and a process that observed both files
    // and later renames over them (a compare-and-swap).
    let script = format!(
        r#"
import errno, fcntl, os, time
fd = os.open("lease.json", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
mine = os.fstat(fd).st_ino
os.stat("plain")
print("ready", flush=True)
while not os.path.exists("{go}"):
    time.sleep(0.01)
print(os.pread(fd, 64, 0).decode().strip(), os.stat("lease.json").st_ino == mine, flush=True)
pid = os.fork()
if pid == 0:
    # A process that observed nothing yet: observes now, then swaps.
    os.stat("lease.json")
    open("mine", "w").write("v9\n")
    os.rename("mine", "lease.json")
    os._exit(0)
os.waitpid(pid, 0)
for name in ["lease.json", "plain"]:
    open("tmp", "w").write("late")
    try:
        os.rename("tmp", name)
        print(name, "renamed", flush=True)
    except OSError as e:
        print(name, errno.errorcode[e.errno], flush=True)
        os.unlink("tmp")
"#,
        go = go.display()
    );
    let mut h = py_ready(&b, &script);
    await_entries(&cluster, &p, "lease.json", 1);
    // On a, the usual renewal by rename, over both.
    sh_ok(&a.path, "echo v2 > t && mv t lease.json && echo p2 > t && mv t plain");
    std::fs::write(&go, "").unwrap();
    assert!(h.wait(STEP).success());
    // The holder on b keeps the lease's inode and sees the new content; the
    // process that observed before a's renames is refused on both names
    // (the lease's content changed; the plain name now leads elsewhere).
    assert_eq!(h.output(), ["v2 True", "lease.json ESTALE", "plain ESTALE"]);
    assert_eq!(sh_ok(&a.path, "cat lease.json plain"), "v9\np2\n");
}

/// A Python holder of `x`: prints `ready` and its epoch, runs `before`,
/// renews by writing every 0.2 s until the file `stop` (in `scratch`)
/// appears, then at `probe` writes once more and prints the errno name (or
/// `written`) and its epoch read by descriptor and by path (or the errno).
fn renewing_holder(scratch: &Path, before: &str) -> String {
    format!(
        r#"
import errno, fcntl, os, time
fd = os.open("x", os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("ready", flush=True)
print(int(os.getxattr(fd, "user.leasefs.epoch")), flush=True)
{before}
while not os.path.exists("{stop}"):
    os.pwrite(fd, b"renew", 0)
    time.sleep(0.2)
while not os.path.exists("{probe}"):
    time.sleep(0.01)
try:
    os.pwrite(fd, b"late", 0)
    print("written", flush=True)
except OSError as e:
    print(errno.errorcode[e.errno], flush=True)
for what in (fd, "x"):
    try:
        print(int(os.getxattr(what, "user.leasefs.epoch")), flush=True)
    except OSError as e:
        print(errno.errorcode[e.errno], flush=True)
time.sleep(60)
"#,
        stop = scratch.join("stop").display(),
        probe = scratch.join("probe").display()
    )
}

/// Host `a` saw another host break its holder `h` (a [`renewing_holder`]):
/// once `probe` exists, the holder's write and its epoch reads by
/// descriptor and by path are all refused with `ESTALE`.
fn await_broken_holder_refused(a: &Mount, h: &Bg, probe: &Path) {
    let deadline = Instant::now() + STEP;
    while status(a)["etcd"]["ttl_breaks"]["by_other_hosts"] != 1 {
        assert!(Instant::now() < deadline, "host a never saw its holder broken: {}", status(a));
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(probe, "").unwrap();
    await_lines(h, 4, "the late write never returned");
    assert_eq!(h.output()[1..4], ["ESTALE", "ESTALE", "ESTALE"], "the broken holder's write and epoch reads");
}

#[test]
fn a_holder_that_stops_renewing_is_broken_by_a_waiter_on_another_host_after_its_ttl() {
    let cluster = Cluster::start();
    let p = prefix("ttl");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    // A TTL well above the time one renewal takes on a loaded machine.
    sh_ok(&b.path, "touch x && setfattr -n user.leasefs.ttl -v 4s x");
    let (stop, probe) = (a.dir.path().join("stop"), a.dir.path().join("probe"));
    let holder = renewing_holder(a.dir.path(), "");
    let mut h = py_ready(&a, &holder);
    await_entries(&cluster, &p, "x", 1);
    // While the holder renews, a waiter on b waits well past the TTL...
    let waiter = "import fcntl, os\nfd = os.open('x', os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))";
    let mut w = Bg::capture(&b.path, "python3", &["-c", waiter]);
    await_entries(&cluster, &p, "x", 2);
    // The entry is in etcd once the enqueue committed; b counts the wait
    // once it has the answer, a moment later.
    let deadline = Instant::now() + STEP;
    while status(&b)["leases"]["awaited"] != 1 {
        assert!(Instant::now() < deadline, "a wait parked in etcd counts: {}", status(&b)["leases"]);
        std::thread::sleep(Duration::from_millis(10));
    }
    // ...and so does a non-blocking contender, try after try.
    let renewing = Instant::now();
    while renewing.elapsed() < Duration::from_secs(6) {
        assert_eq!(py_lock(&b.path, "x", "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"), "EAGAIN");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(w.running(), "a renewing holder was broken: {:?}", w.output());
    // Once it stops renewing, the waiter breaks it after the TTL.
    std::fs::write(&stop, "").unwrap();
    assert!(w.wait(STEP).success(), "the waiter was never granted");
    let e1: u64 = h.output()[0].parse().unwrap();
    assert_eq!(w.output(), [format!("{}", e1 + 1)]);
    // The holder's host learns it was broken: its write is refused. The
    // token is a right (SPEC 5): the lost holder reads ESTALE for its
    // epoch, by descriptor and by path; every other process on either
    // host reads the new holder's epoch.
    await_broken_holder_refused(&a, &h, &probe);
    let by_fd = "import os\nprint(int(os.getxattr(os.open('x', os.O_RDONLY), 'user.leasefs.epoch')))";
    for m in [&a, &b] {
        assert_eq!(epoch(&m.path, "x"), e1 + 1, "by path on {}", m.path.display());
        assert_eq!(py_ok(&m.path, by_fd).trim(), format!("{}", e1 + 1), "by descriptor on {}", m.path.display());
    }
    assert_eq!(status(&b)["etcd"]["ttl_breaks"]["of_other_hosts"], 1);
    h.kill_all();
}

/// The TTL the held entry of lease `name` shows other hosts (`None`: no
/// held entry, or one without a TTL).
fn held_entry_ttl(cluster: &Cluster, prefix: &str, name: &str) -> Option<u64> {
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    let q = format!("{prefix}/q/{name}/").into_bytes();
    c.range(&q, &prefix_end(&q)).expect("read the queue").0.iter().find_map(|kv| {
        let v: serde_json::Value = serde_json::from_slice(&kv.value).ok()?;
        if v["state"] == "held" {
            v["ttl_ms"].as_u64()
        } else {
            None
        }
    })
}

#[test]
fn a_ttl_set_after_the_grant_lets_waiters_on_other_hosts_break_a_holder_that_stops_renewing() {
    let cluster = Cluster::start();
    let p = prefix("latettl");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x y");
    let waiter = |f: &str| {
        format!("import fcntl, os\nfd = os.open('{f}', os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))")
    };
    // x: granted solo (no TTL, nobody in the way); then its holder sets a
    // TTL and renews.
    let (go, stop, probe) = (a.dir.path().join("go"), a.dir.path().join("stop"), a.dir.path().join("probe"));
    let holder = renewing_holder(
        a.dir.path(),
        &format!(
            "while not os.path.exists('{}'):\n    time.sleep(0.01)\nos.setxattr('x', 'user.leasefs.ttl', b'3s')",
            go.display()
        ),
    );
    let mut h = py_ready(&a, &holder);
    await_lines(&h, 1, "the holder never printed its epoch");
    let e1: u64 = h.output()[0].parse().unwrap();
    assert_eq!(status(&a)["etcd"]["solo"]["granted"], 1, "x was not granted solo");
    assert_eq!(held_entry_ttl(&cluster, &p, "x"), None);
    std::fs::write(&go, "").unwrap();
    // The holder's host writes its entry, with the TTL.
    let deadline = Instant::now() + STEP;
    while held_entry_ttl(&cluster, &p, "x") != Some(3000) {
        assert!(Instant::now() < deadline, "the TTL set after the grant never reached etcd: {}", status(&a)["etcd"]);
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the holder renews (and its renewals reach etcd), a waiter on b
    // waits two TTLs and more...
    let mut w = Bg::capture(&b.path, "python3", &["-c", &waiter("x")]);
    await_entries(&cluster, &p, "x", 2);
    std::thread::sleep(Duration::from_secs(7));
    assert!(w.running(), "a renewing holder was broken: {:?}", w.output());
    // ...and once it stops, breaks it after the TTL.
    std::fs::write(&stop, "").unwrap();
    assert!(w.wait(STEP).success(), "the waiter was never granted x");
    assert_eq!(w.output(), [format!("{}", e1 + 1)]);
    await_broken_holder_refused(&a, &h, &probe);
    h.kill_all();

    // y: a waiter on b is already queued behind the holder when the TTL
    // is set, on b: the holder's host learns it through the shared
    // namespace, and the waiter from the holder's rewritten entry.
    let mut hy = Bg::ready(
        &a.path,
        "exec flock y sh -c 'echo ready; getfattr --only-values -n user.leasefs.epoch y; echo; sleep 60'",
    );
    await_lines(&hy, 1, "the holder of y never printed its epoch");
    let ey: u64 = hy.output()[0].parse().unwrap();
    let mut wy = Bg::capture(&b.path, "python3", &["-c", &waiter("y")]);
    await_entries(&cluster, &p, "y", 2);
    let deadline = Instant::now() + STEP;
    while status(&b)["leases"]["awaited"] != 1 {
        assert!(Instant::now() < deadline, "the wait on y never parked: {}", status(&b)["leases"]);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(held_entry_ttl(&cluster, &p, "y"), None);
    sh_ok(&b.path, "setfattr -n user.leasefs.ttl -v 1s y");
    let deadline = Instant::now() + STEP;
    while wy.running() {
        assert!(
            Instant::now() < deadline,
            "the waiter never learned the holder's new TTL (its entry shows {:?}): {}",
            held_entry_ttl(&cluster, &p, "y"),
            status(&b)["etcd"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(wy.wait(STEP).success());
    assert_eq!(wy.output(), [format!("{}", ey + 1)]);
    hy.kill_all();

    // z: a waiter on b granted after the TTL was set while it waited
    // shows that TTL in its entry from its grant on.
    sh_ok(&a.path, "touch z");
    let mut hz = Bg::ready(&a.path, "exec flock z sh -c 'echo ready; sleep 60'");
    let mut wz = Bg::capture(&b.path, "flock", &["z", "sh", "-c", "echo granted; sleep 60"]);
    await_entries(&cluster, &p, "z", 2);
    sh_ok(&a.path, "setfattr -n user.leasefs.ttl -v 60s z");
    // b's copy has the TTL before the grant (so no later change of it
    // reaches b's holder).
    let deadline = Instant::now() + STEP;
    while sh_ok(&b.path, "getfattr --only-values -n user.leasefs.ttl z") != "60s" {
        assert!(Instant::now() < deadline, "b never saw z's TTL");
        std::thread::sleep(Duration::from_millis(20));
    }
    hz.kill_all();
    await_lines(&wz, 1, "the waiter on z was never granted");
    let deadline = Instant::now() + STEP;
    while held_entry_ttl(&cluster, &p, "z") != Some(60_000) {
        assert!(
            Instant::now() < deadline,
            "the holder granted after the TTL was set shows {:?}",
            held_entry_ttl(&cluster, &p, "z")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    wz.kill_all();
}

#[test]
fn a_non_blocking_contender_on_another_host_breaks_a_holder_it_saw_unrenewed_for_a_ttl() {
    let cluster = Cluster::start();
    let p = prefix("ttlnb");
    let (a, b) = (host(&cluster, &p, &["--lease-ttl", "1s"]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x");
    let mut h = Bg::ready(
        &a.path,
        "exec flock x sh -c 'echo ready; getfattr --only-values -n user.leasefs.epoch x; echo; sleep 60'",
    );
    await_entries(&cluster, &p, "x", 1);
    await_lines(&h, 1, "the holder never printed its epoch");
    let e1: u64 = h.output()[0].parse().unwrap();
    // The first try starts this host's clock on the holder's TTL.
    assert_eq!(sh_code(&b.path, "flock -n x true"), 1);
    let deadline = Instant::now() + STEP;
    let got = loop {
        let o = sh_ok(&b.path, "flock -n x getfattr --only-values -n user.leasefs.epoch x || echo busy");
        if o != "busy\n" {
            break o;
        }
        assert!(Instant::now() < deadline, "never broken");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(got, format!("{}", e1 + 1));
    h.kill_all();
}

#[test]
fn byte_range_locks_conflict_across_hosts_only_where_they_overlap() {
    let cluster = Cluster::start();
    let p = prefix("ranges");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "head -c 100 /dev/zero > f");
    let before = epoch(&a.path, "f");
    let (u1, u2) = (a.dir.path().join("u1"), a.dir.path().join("u2"));
    let holder = format!(
        r#"
import fcntl, os, time
fd = os.open("f", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
print("ready", flush=True)
for step, start, length in [("{u1}", 0, 5), ("{u2}", 5, 5)]:
    while not os.path.exists(step):
        time.sleep(0.01)
    fcntl.lockf(fd, fcntl.LOCK_UN, length, start)
    print("unlocked", start, flush=True)
time.sleep(60)
"#,
        u1 = u1.display(),
        u2 = u2.display()
    );
    let mut h = py_ready(&a, &holder);
    await_entries(&cluster, &p, "f", 1);
    // Disjoint bytes are free on the other host; overlapping ones are not,
    // in either mode; F_GETLK names the holder (pid 0: another host's).
    let lock = |how: &str| py_lock(&b.path, "f", how);
    assert_eq!(lock("fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 20)"), "ok");
    assert_eq!(lock("fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 5)"), "EAGAIN");
    assert_eq!(lock("fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 9)"), "EAGAIN");
    assert_eq!(lock("fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)"), "EAGAIN");
    let getlk = py_ok(
        &b.path,
        r#"
import fcntl, os, struct
fd = os.open("f", os.O_RDWR)
got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 7, 1, 0))
t, w, start, length, pid = struct.unpack("hhqqi", got)
print(t == fcntl.F_WRLCK, start, length, pid)
"#,
    );
    assert_eq!(getlk.trim(), "True 0 10 0");
    // A blocking waiter for bytes 5..8 waits until exactly those are free.
    let waiter =
        "import fcntl, os\nfd = os.open('f', os.O_RDWR)\nfcntl.lockf(fd, fcntl.LOCK_EX, 3, 5)\nprint('granted')";
    let mut w = Bg::capture(&b.path, "python3", &["-c", waiter]);
    await_entries(&cluster, &p, "f", 2);
    std::fs::write(&u1, "").unwrap();
    await_lines(&h, 1, "the first unlock never returned");
    // Bytes 0..4 are free now; the waiter's 5..7 are not.
    assert_eq!(lock("fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 0)"), "ok");
    assert!(w.running(), "granted while bytes 5..9 were still held");
    std::fs::write(&u2, "").unwrap();
    assert!(w.wait(STEP).success());
    assert_eq!(w.output(), ["granted"]);
    // Record locks never take the lease: the epoch did not move.
    assert_eq!(epoch(&a.path, "f"), before);
    h.kill_all();
}

#[test]
fn a_cycle_of_byte_range_waits_on_one_host_of_an_etcd_mount_is_refused_with_edeadlk() {
    let cluster = Cluster::start();
    let p = prefix("deadlock");
    let a = host(&cluster, &p, &[]);
    sh_ok(&a.path, "head -c 100 /dev/zero > f");
    let go = a.dir.path().join("go");
    // The first process holds bytes 0..9 and then waits for 50..59; the
    // second holds 50..59 and then asks for 0..9: a cycle.
    let first = format!(
        r#"
import fcntl, os, time
fd = os.open("f", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
print("ready", flush=True)
while not os.path.exists("{go}"):
    time.sleep(0.01)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 50)
print("got 50", flush=True)
"#,
        go = go.display()
    );
    let mut one = py_ready(&a, &first);
    let go2 = a.dir.path().join("go2");
    let second = format!(
        r#"
import errno, fcntl, os, time
fd = os.open("f", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 10, 50)
print("ready", flush=True)
while not os.path.exists("{go2}"):
    time.sleep(0.01)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX, 10, 0)
    print("granted", flush=True)
except OSError as e:
    print("EDEADLK" if e.errno == errno.EDEADLK else errno.errorcode[e.errno], flush=True)
"#,
        go2 = go2.display()
    );
    let mut two = py_ready(&a, &second);
    std::fs::write(&go, "").unwrap();
    // The first process waits in the etcd queue behind the second.
    await_entries(&cluster, &p, "f", 3);
    std::fs::write(&go2, "").unwrap();
    assert!(two.wait(STEP).success());
    assert_eq!(two.output(), ["EDEADLK"]);
    // The second process's exit freed 50..59 for the first.
    assert!(one.wait(STEP).success());
    assert_eq!(one.output(), ["got 50"]);
}

#[test]
fn compaction_takes_nothing_from_a_host_s_watch_and_a_watch_that_lost_changes_says_so() {
    let cluster = Cluster::start();
    let p = prefix("compact");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&b.path, "echo 0 > n");
    let before = status(&b)["etcd"]["namespace"]["reloads"].as_u64().unwrap();
    sh_ok(&a.path, "for i in 1 2 3; do echo $i > n; done; echo x > more");
    // etcd forgets the history.
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    let (_, rev) = c.get(b"x").unwrap();
    let o = run_timeout(
        std::process::Command::new("etcdctl").args([
            "--endpoints",
            &cluster.endpoints().join(","),
            "compact",
            &rev.to_string(),
        ]),
        STEP,
    );
    assert!(o.status.success(), "{o:?}");
    // b's watch was open all along: it has every change, nothing to re-read.
    assert_eq!(sh_ok(&b.path, "cat n more"), "3\nx\n");
    assert_eq!(status(&b)["etcd"]["namespace"]["reloads"].as_u64().unwrap(), before);
    // A watch that has to resume from a compacted revision reports the
    // loss (a host's table then reads the namespace whole).
    let base = format!("{p}/ns/").into_bytes();
    let feed = Feed::start(std::sync::Arc::new(c), base, 1);
    assert!(feed.take_through(rev, Instant::now() + STEP).is_none());
    assert!(feed.broken());
    feed.stop();
}

/// Every host shows an epoch no lower than any grant that completed
/// anywhere before the read began (SPEC 10): right after another host's
/// grant, in `.leasefs/leases`, and while the other host is granted 200
/// times in a row.
#[test]
fn an_epoch_read_on_one_host_is_never_older_than_a_grant_completed_on_another() {
    let cluster = Cluster::start();
    let p = prefix("fresh-epoch");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x");
    // A knows the lease (it has a copy of its own that could go stale).
    let e0 = epoch(&a.path, "x");
    sh_ok(&a.path, "flock x true");
    assert_eq!(epoch(&a.path, "x"), e0 + 1);
    let e1: u64 = sh_ok(&b.path, "flock x getfattr --only-values -n user.leasefs.epoch x").trim().parse().unwrap();
    assert_eq!(e1, e0 + 2);
    assert_eq!(epoch(&a.path, "x"), e1, "A right after B's grant");
    let holder = Bg::ready(&b.path, "exec flock x sh -c 'echo ready; exec sleep 60'");
    let listed = std::fs::read_to_string(a.p(".leasefs/leases")).unwrap();
    let row: serde_json::Value = listed
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["path"] == "/x")
        .unwrap();
    assert_eq!(row["epoch"], e1 + 1, "A's listing while B holds it: {listed}");
    drop(holder);

    // Under load: A reads while B is granted 200 times; each read must be
    // at least the epoch of every grant that returned before it started.
    let done = a.dir.path().join("b-done");
    let reader = py_ready(
        &a,
        &format!(
            r#"
import os, time
print("ready", flush=True)
while not os.path.exists({done:?}):
    s = time.monotonic()
    print(repr(s), int(os.getxattr("x", "user.leasefs.epoch")), flush=True)
"#,
            done = done.display().to_string()
        ),
    );
    let grants = py_ok(
        &b.path,
        r#"
import fcntl, os, time
for i in range(200):
    fd = os.open("x", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    t = time.monotonic()
    print(repr(t), int(os.getxattr(fd, "user.leasefs.epoch")))
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
"#,
    );
    std::fs::write(&done, "").unwrap();
    let mut reader = reader;
    assert!(reader.wait(STEP).success());
    let parse = |text: &str| -> Vec<(f64, u64)> {
        text.lines()
            .map(|l| {
                let (t, e) = l.split_once(' ').unwrap();
                (t.parse().unwrap(), e.parse().unwrap())
            })
            .collect()
    };
    let grants = parse(&grants);
    let reads = parse(&reader.output().join("\n"));
    assert_eq!(grants.len(), 200);
    assert_eq!(grants.last().unwrap().1, e1 + 201, "one epoch per grant");
    assert!(reads.len() >= 20, "A read {} times meanwhile", reads.len());
    for (start, seen) in &reads {
        let before = grants.iter().filter(|(t, _)| t < start).map(|(_, e)| *e).max().unwrap_or(0);
        assert!(*seen >= before, "A read epoch {seen} at {start}, after B was granted {before}");
    }
}

/// An `O_EXCL` create or a `link()` acquires the lease with the next epoch
/// from etcd; when etcd does not hand it out (a failpoint here), the call
/// fails with `EIO` and leaves no name, instead of going on with an epoch
/// made up locally that another host may also have handed out.
#[test]
fn an_acquisition_by_create_or_link_that_etcd_cannot_number_fails_with_eio_and_leaves_no_name() {
    let cluster = Cluster::start();
    let p = prefix("bump-eio");
    let eps = cluster.endpoints().join(",");
    let args = ["--allow-other", "--volatile", "--etcd", &eps, "--etcd-prefix", &p];
    let a = Mount::with_args_env(&args, &[("LEASEFS_FAILPOINT", "etcd-bump")]);
    let b = host(&cluster, &p, &[]);
    let out = py_ok(
        &a.path,
        r#"
import errno, os
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
open("tmp", "w").close()
print(attempt(lambda: os.open("lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)))
print(attempt(lambda: os.link("tmp", "dot")))
print(sorted(os.listdir(".")))
"#,
    );
    assert_eq!(out, "EIO\nEIO\n['tmp']\n", "refused, and no name left on A");
    assert_eq!(sh_ok(&b.path, "ls"), "tmp\n", "nor on B");
    // Where etcd numbers it, the same acquisition works, with etcd's epoch.
    let e = py_ok(
        &b.path,
        "import os\nfd = os.open('lock', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)\nprint(int(os.getxattr(fd, 'user.leasefs.epoch')))",
    );
    assert_eq!(e.trim(), "1");
}

/// A process on `m` that opens `.leasefs/events`, prints `ready` once it
/// is open, then prints each event line.
fn events_reader(m: &Mount) -> Bg {
    py_ready(
        m,
        r#"
import os, select
fd = os.open(".leasefs/events", os.O_RDONLY)
print("ready", flush=True)
p = select.poll()
p.register(fd, select.POLLIN)
rest = b""
while p.poll(20000):
    lines = (rest + os.read(fd, 65536)).split(b"\n")
    rest = lines.pop()
    for l in lines:
        print(l.decode(), flush=True)
"#,
    )
}

/// `.leasefs/events` on one host shows the grants and releases of holders
/// on another, with their host, pid and command, in epoch order.
#[test]
fn events_on_one_host_show_the_grants_and_releases_of_holders_on_another() {
    let cluster = Cluster::start();
    let p = prefix("remote-events");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&b.path, "touch x y");
    let mut reader = events_reader(&a);
    sh_ok(&b.path, "flock x true; flock x true; flock x true");
    let holder = Bg::ready(&b.path, "exec flock y sh -c 'echo ready; exec sleep 60'");
    let events = |bg: &Bg| -> Vec<serde_json::Value> {
        bg.output().iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
    };
    let deadline = Instant::now() + STEP;
    while !events(&reader).iter().any(|e| e["path"] == "/y" && e["event"] == "grant") {
        assert!(Instant::now() < deadline, "A never saw B's grant of /y: {:?}", reader.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    let evs = events(&reader);
    let on_x: Vec<(String, u64)> = evs
        .iter()
        .filter(|e| e["path"] == "/x")
        .map(|e| (e["event"].as_str().unwrap().to_string(), e["epoch"].as_u64().unwrap()))
        .collect();
    let e = on_x.first().map_or(0, |(_, e)| *e);
    let want: Vec<(String, u64)> =
        (0..3).flat_map(|i| [("grant".to_string(), e + i), ("release".to_string(), e + i)]).collect();
    assert_eq!(on_x, want, "three holders on B, in epoch order: {evs:?}");
    let host = format!(":{}", b.path.display());
    for ev in &evs {
        assert!(ev["host"].as_str().is_some_and(|h| h.ends_with(&host)), "B's host on every event: {ev}");
        assert_eq!(
            (ev["comm"].as_str(), ev["owner"].as_str(), ev["mode"].as_str()),
            (Some("flock"), Some("flock"), Some("exclusive")),
            "{ev}"
        );
    }
    let y = evs.iter().find(|e| e["path"] == "/y").unwrap();
    assert_eq!(y["pid"], holder.pid(), "the holder's pid on B: {y}");
    drop(holder);
    reader.kill_all();
}

/// A process that starts reading `.leasefs/events` on one host while
/// another host holds a lease solo (granted before anybody listened: no
/// entry, no `grant` event) sees that holder's `release`: listening
/// writes the entries of holders granted solo before its `open` returns.
/// Red (no event) without that.
#[test]
fn events_read_after_a_solo_grant_on_another_host_show_its_release() {
    let cluster = Cluster::start();
    let p = prefix("eventsolo");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&b.path, "touch x");
    let holder = Bg::ready(&b.path, "exec flock x sh -c 'echo ready; exec sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    assert_eq!(status(&b)["etcd"]["solo"]["granted"], 1, "the holder was not granted solo");
    let mut reader = events_reader(&a);
    drop(holder);
    let deadline = Instant::now() + STEP;
    loop {
        let seen = reader.output().iter().any(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .is_ok_and(|e| e["path"] == "/x" && e["event"] == "release" && e["epoch"] == 1)
        });
        if seen {
            break;
        }
        assert!(Instant::now() < deadline, "A never saw B's release of /x: {:?}", reader.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.kill_all();
}

/// The stalled request `slow` on host `a` (a `what`) is still running
/// after the requests before this were served, a `status` read runs beside
/// it, and it then ends printing `printed`.
fn ends_after_the_others(slow: &mut Bg, a: &Mount, what: &str, printed: &str) {
    assert!(slow.running(), "the requests above must have been served while the {what} was stalled");
    let h = &status(a)["handlers"];
    assert!(h["held"].as_u64().unwrap() >= 2, "the status read ran beside the stalled {what}: {h}");
    assert!(slow.wait(STEP).success());
    assert_eq!(slow.output(), [printed]);
}

/// While one change waits for etcd (its store step stalled on host a),
/// host a goes on serving everything else: reads, `stat` and listings of
/// other files and lock steps of another lease (each also asks etcd). The
/// change is made in a directory of its own: the kernel itself holds back
/// lookups in a directory while a name in it is being created.
#[test]
fn a_request_waiting_for_etcd_holds_up_no_other_request_on_its_host() {
    let cluster = Cluster::start();
    let p = prefix("stall");
    let (_marks, mark, a, b) = paused_and_plain(&cluster, &p, 8000, "echo kept > other && touch lk && mkdir d");
    let _ = std::fs::remove_file(&mark);
    let mut slow = Bg::capture(&a.path, "sh", &["-c", "echo new > d/slow && echo stored"]);
    await_mark(&mark);
    // a's create is stalled for 8 s; all of this is served meanwhile.
    assert_eq!(sh_ok(&a.path, "cat other; stat -c %s other; ls"), "kept\n5\nd\nlk\nother\n");
    assert_eq!(sh_ok(&a.path, "flock -n lk getfattr --only-values -n user.leasefs.epoch lk"), "1");
    assert_eq!(sh_ok(&b.path, "ls d"), "", "the stalled create is not stored yet");
    ends_after_the_others(&mut slow, &a, "create", "stored");
    assert_eq!(sh_ok(&b.path, "cat d/slow"), "new\n");
    assert_eq!(status(&a)["handlers"]["refused"], 0);
}

/// While one lock step waits for etcd (host a's request for the lease
/// `slow`, stalled before its transaction), host a goes on serving
/// everything else: reads and writes of other files, lock steps of another
/// lease, a wait ended by a signal, the hand-off of a lease from a holder
/// on host b to a waiter on a (decided by a's lease timer) and `status`.
#[test]
fn a_lock_step_waiting_for_etcd_holds_up_no_other_request_on_its_host() {
    let cluster = Cluster::start();
    let p = prefix("lockstall");
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("paused");
    let b = host(&cluster, &p, &[]);
    sh_ok(&b.path, "echo kept > other && touch slow lk handed");
    let a = pausing_host_at(&cluster, &p, "lock-step/slow", 10_000, &mark);
    let mut slow = Bg::capture(&a.path, "flock", &["slow", "echo", "granted"]);
    await_mark(&mark);
    // a's request for `slow` is stalled for 10 s; all of this is served meanwhile.
    assert_eq!(sh_ok(&a.path, "cat other; echo more >> other; stat -c %s other"), "kept\n10\n");
    assert_eq!(sh_ok(&a.path, "flock -n lk getfattr --only-values -n user.leasefs.epoch lk"), "1");
    let holder = Bg::ready(&b.path, "exec flock handed sh -c 'echo ready; sleep 2'");
    assert_eq!(sh_ok(&a.path, "timeout -s INT 0.3 flock handed true; echo $?"), "124\n");
    assert_eq!(sh_ok(&a.path, "flock handed getfattr --only-values -n user.leasefs.epoch handed"), "2");
    ends_after_the_others(&mut slow, &a, "lock step", "granted");
    assert_eq!(sh_ok(&b.path, "getfattr --only-values -n user.leasefs.epoch slow"), "1");
    drop(holder);
}

/// An `O_EXCL` create takes its epoch in the transaction that stores it,
/// compared on the epoch counter as this host last saw it: after another
/// host took epochs of the same lease, the create is decided again on the
/// counter as it is and takes the next epoch (never one given out already);
/// on a host whose sight of the counter is current it costs that one
/// transaction.
#[test]
fn an_exclusive_create_takes_its_epoch_in_its_own_transaction_and_is_decided_again_when_the_counter_moved() {
    let cluster = Cluster::start();
    let p = prefix("claim");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    let create = "python3 -c \"import os; os.close(os.open('l', os.O_CREAT | os.O_EXCL | os.O_WRONLY))\"";
    let excl = format!("{create} && getfattr --only-values -n user.leasefs.epoch l && rm l");
    assert_eq!(sh_ok(&a.path, &excl), "1");
    assert_eq!(sh_ok(&b.path, &format!("{excl}; {excl}")), "23");
    let before = conflicts(&a);
    assert_eq!(sh_ok(&a.path, &excl), "4");
    assert!(conflicts(&a) > before, "a decided on the counter it had seen (epoch 1) and must have lost the compare");
    let txns = |m: &Mount| status(m)["etcd"]["requests"]["txn"].as_u64().unwrap();
    let t0 = txns(&a);
    sh_ok(&a.path, create);
    assert_eq!(txns(&a) - t0, 1, "the create, its name and its epoch are one transaction");
    assert_eq!(sh_ok(&b.path, "getfattr --only-values -n user.leasefs.epoch l"), "5");
}

/// A directory for pause marks and gates, and the pause mark's path in it.
fn mark_dir() -> (tempfile::TempDir, PathBuf) {
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("paused");
    (marks, mark)
}

/// A shell in `dir` that says ready, waits until `gate` exists, then runs
/// `script`.
fn after_gate(dir: &Path, gate: &Path, script: &str) -> Bg {
    Bg::ready(dir, &format!("echo ready; while [ ! -e {} ]; do sleep 0.01; done; {script}", gate.display()))
}

/// Readers served by a revision read another reader sent, and the whole
/// `barriers` object of host `m`'s status.
fn shared_reads(m: &Mount) -> (u64, serde_json::Value) {
    let b = status(m)["etcd"]["namespace"]["barriers"].clone();
    (b["shared"].as_u64().unwrap(), b)
}

/// Each of `bgs` ends well, having printed just `line`.
fn each_prints(bgs: &mut [Bg], line: &str, why: &str) {
    for b in bgs {
        assert!(b.wait(STEP).success());
        assert_eq!(b.output_to_end(), [line], "{why}");
    }
}

/// Readers of one host that come while a read of the namespace revision is
/// on its way share the next one, never the one on its way. Host a holds
/// each such read's answer back 500 ms and its watch's events 400 ms (a
/// slow watch); host b replaces the file each reader will read, by
/// `rename`, after a's first read was answered and before the readers
/// come: every reader reads the new file, and they shared reads between
/// them. (Each reader reads in a directory of its own: requests for one
/// directory or one file are handled one at a time anyway.)
#[test]
fn readers_that_come_while_a_revision_read_is_on_its_way_share_the_next_one() {
    let cluster = Cluster::start();
    let p = prefix("share");
    let (marks, mark) = mark_dir();
    let gate = marks.path().join("go");
    let b = host(&cluster, &p, &[]);
    sh_ok(&b.path, "echo g > g; for k in 1 2 3; do mkdir d$k; echo v1 > d$k/f; echo v2 > d$k/n; done");
    let eps = cluster.endpoints().join(",");
    let a = Mount::with_args_env(
        &["--allow-other", "--volatile", "--etcd", &eps, "--etcd-prefix", &p, "--etcd-timeout", "10s"],
        &[("LEASEFS_PAUSE", "barrier:500,feed:400"), ("LEASEFS_PAUSE_MARK", mark.to_str().unwrap())],
    );
    // Three readers, each in its directory, waiting for the gate.
    let mut readers: Vec<Bg> =
        (1..=3).map(|k| after_gate(&a.path.join(format!("d{k}")), &gate, "exec cat f")).collect();
    let (shared0, _) = shared_reads(&a);
    let _ = std::fs::remove_file(&mark);
    // The first reader's read is answered, then held back.
    let mut first = Bg::capture(&a.path, "cat", &["g"]);
    await_mark(&mark);
    // b's renames return while it is held back; then the readers come.
    sh_ok(&b.path, "for k in 1 2 3; do mv d$k/n d$k/f; done");
    std::fs::write(&gate, "").unwrap();
    each_prints(&mut readers, "v2", "a reader that came after the rename read the file it replaced");
    assert!(first.wait(STEP).success());
    let (shared, after) = shared_reads(&a);
    assert!(shared - shared0 >= 2, "the three readers shared reads of the revision: {after}");
}

/// Epoch reads of one host that come while one is on its way share the
/// next one, never the one on its way (SPEC 10: fencing facts are
/// linearizable, one quorum read shared by the readers that come
/// together). Host a holds each epoch read's answer back 500 ms; the first
/// reader's read (a listing of three leases) is answered, then held; host
/// b is granted each lease meanwhile; three readers, one per lease, that
/// come after those grants read the new epochs, and they shared reads. Red (a reader shows the epoch before b's grant)
/// when a reader may take the answer of the read on its way.
#[test]
fn epoch_readers_that_come_while_a_read_is_on_its_way_share_the_next_one() {
    let cluster = Cluster::start();
    let p = prefix("epochshare");
    let (marks, mark) = mark_dir();
    let gate = marks.path().join("go");
    let b = host(&cluster, &p, &[]);
    // One lease per reader (requests for one file are handled one at a
    // time), each with a TTL so that a's listing reads their epochs.
    sh_ok(&b.path, "for k in 1 2 3; do touch x$k && setfattr -n user.leasefs.ttl -v 60s x$k && flock x$k true; done");
    let a = pausing_host_at(&cluster, &p, "epochs", 500, &mark);
    let mut readers: Vec<Bg> = (1..=3)
        .map(|k| after_gate(&a.path, &gate, &format!("exec getfattr --only-values -n user.leasefs.epoch x{k}; echo")))
        .collect();
    let shared0 = status(&a)["etcd"]["epoch_reads"]["shared"].as_u64().unwrap();
    let _ = std::fs::remove_file(&mark);
    // The first read: a's listing, which reads the three epochs in one round.
    let mut first = Bg::capture(&a.path, "cat", &[".leasefs/leases"]);
    await_mark(&mark);
    // b's grants complete while a's first read is held back; then the readers come.
    sh_ok(&b.path, "flock x1 true && flock x2 true && flock x3 true");
    std::fs::write(&gate, "").unwrap();
    each_prints(&mut readers, "2", "a reader that came after b's grant read an older epoch");
    assert!(first.wait(STEP).success());
    let shared = status(&a)["etcd"]["epoch_reads"]["shared"].as_u64().unwrap();
    assert!(shared - shared0 >= 2, "the three readers shared epoch reads: {}", status(&a)["etcd"]);
}

/// Lookups of different names in one directory are served at once (not
/// one after another as requests for one directory are): three processes
/// look up three missing names in the root while host a holds each revision
/// read's answer back 500 ms, and two of them share a read.
#[test]
fn lookups_of_different_names_in_one_directory_run_at_once() {
    let cluster = Cluster::start();
    let p = prefix("lookups");
    let (marks, mark) = mark_dir();
    let gate = marks.path().join("go");
    let a = pausing_host_at(&cluster, &p, "barrier", 500, &mark);
    let mut lookers: Vec<Bg> =
        (1..=3).map(|k| after_gate(&a.path, &gate, &format!("test -e missing{k}; echo $?"))).collect();
    let (shared0, _) = shared_reads(&a);
    std::fs::write(&gate, "").unwrap();
    each_prints(&mut lookers, "1", "the name is missing");
    let (shared, after) = shared_reads(&a);
    assert!(shared > shared0, "lookups in one directory waited for each other instead of sharing a read: {after}");
}

/// `user.leasefs.holder` is a fencing fact (SPEC 10): every host shows a
/// lease's holders wherever they are, held solo (the counter alone) or
/// with an entry in the queue, and `leasefs wait --free` waits for them.
/// Red (`a` listed no holder, `wait --free` returned at once) while the
/// attribute read this host's table only.
#[test]
fn the_holder_attribute_shows_holders_of_other_hosts_and_wait_free_waits_for_them() {
    let cluster = Cluster::start();
    let p = prefix("holderattr");
    let (a, b) = (host(&cluster, &p, &[]), host(&cluster, &p, &[]));
    sh_ok(&a.path, "touch x y");
    let b_host = status(&b)["etcd"]["host"].as_str().expect("b's host name").to_string();
    let a_host = status(&a)["etcd"]["host"].as_str().expect("a's host name").to_string();
    assert_ne!(a_host, b_host);
    let holders = |m: &Mount, f: &str| -> serde_json::Value {
        serde_json::from_str(&sh_ok(&m.path, &format!("getfattr --only-values -n user.leasefs.holder {f}")))
            .expect("the holder attribute is JSON")
    };
    let bin = leasefs_bin();
    let wait = |m: &Mount, args: &[&str]| {
        run_timeout(std::process::Command::new(&bin).arg("wait").arg(&m.path).args(args), STEP).status.code()
    };
    // Held solo on b: the counter alone records it.
    let holder = Bg::ready(&b.path, "exec flock x sh -c 'echo ready; exec sleep 60'");
    await_entries(&cluster, &p, "x", 1);
    assert_eq!(status(&b)["etcd"]["solo"]["granted"], 1, "the holder was not granted solo");
    let h = holders(&a, "x");
    assert_eq!(h["epoch"], 1, "{h}");
    let rows = h["holders"].as_array().expect("holders");
    assert_eq!(rows.len(), 1, "a shows b's holder: {h}");
    assert_eq!(rows[0]["host"], b_host.as_str(), "{h}");
    assert_eq!(rows[0]["mode"], "exclusive", "{h}");
    assert_eq!(rows[0]["kind"], "flock", "{h}");
    let on_b = holders(&b, "x");
    assert_eq!(on_b["holders"].as_array().map(Vec::len), Some(1), "b shows its own holder once: {on_b}");
    assert!(on_b["holders"][0].get("host").is_none(), "b's own holder is local: {on_b}");
    // F_GETLK on a names the holder while it is still solo (pid 0: its
    // pid is another host's).
    let getlk = "import fcntl, os, struct\nfd = os.open('x', os.O_RDWR)\nask = struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0)\nt, _, _, _, pid = struct.unpack('hhqqi', fcntl.fcntl(fd, fcntl.F_GETLK, ask))\nprint(t, pid)";
    assert_eq!(py_ok(&a.path, getlk).trim(), format!("{} 0", libc::F_WRLCK));
    assert_eq!(status(&a)["etcd"]["solo"]["entries_written"], 0, "the holder was read solo, not made an entry");
    assert_eq!(wait(&a, &["x", "--free", "-w", "0.5"]), Some(1), "wait --free on a returned while b holds x");
    assert_eq!(wait(&a, &["x", "--held"]), Some(0));
    // The holder has an entry now (`leasefs wait` listening for events
    // wrote it) and a waiter queues behind it: still one holder, shown once.
    let waiter = Bg::spawn(&a.path, "exec flock -w 30 x true");
    await_entries(&cluster, &p, "x", 2);
    let h = holders(&a, "x");
    assert_eq!(h["holders"].as_array().map(Vec::len), Some(1), "one holder, from its queue entry: {h}");
    assert_eq!(h["holders"][0]["host"], b_host.as_str(), "{h}");
    // A wait for the lease to be free, started while b holds it, returns
    // once b's holder is gone.
    drop(waiter);
    await_entries(&cluster, &p, "x", 1);
    let path = a.path.to_string_lossy().to_string();
    let mut free = Bg::capture(&a.path, bin.to_str().unwrap(), &["wait", &path, "x", "--free", "-w", "30"]);
    free.wait_blocked();
    drop(holder);
    assert!(free.wait(STEP).success(), "wait --free on a never saw b's release");
    assert_eq!(holders(&b, "x")["holders"].as_array().map(Vec::len), Some(0));
}

/// The listener key of a host whose session etcd expired is written again
/// under its new session, so other hosts' grants keep reaching its event
/// readers: host a (host TTL 2 s) has `.leasefs/events` open and is frozen
/// until etcd drops its key with its session; resumed, a writes the key
/// again, and b's next holder is not granted solo and shows on a's stream.
/// Red (no key after the thaw, b's holder granted solo, no event on a)
/// without the lease timer's rewrite.
#[test]
fn a_host_back_from_a_lost_session_keeps_other_hosts_events_coming() {
    let cluster = Cluster::start();
    let p = prefix("listen-again");
    let a = host(&cluster, &p, &["--host-ttl", "2s"]);
    let b = host(&cluster, &p, &[]);
    sh_ok(&b.path, "touch x");
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    let l = format!("{p}/l/").into_bytes();
    let listeners = || -> Vec<Vec<u8>> {
        c.range(&l, &prefix_end(&l)).expect("read the listener keys").0.into_iter().map(|kv| kv.key).collect()
    };
    let await_listeners = |want: &dyn Fn(&[Vec<u8>]) -> bool, what: &str| {
        let deadline = Instant::now() + STEP;
        loop {
            let now = listeners();
            if want(&now) {
                return now;
            }
            assert!(Instant::now() < deadline, "{what}: {now:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut reader = events_reader(&a);
    let first = await_listeners(&|k| k.len() == 1, "a's reader left no listener key");
    let frozen = Frozen::stop(a.pid());
    await_listeners(&|k| k.is_empty(), "etcd kept the frozen host's listener key");
    drop(frozen);
    let again = await_listeners(&|k| k.len() == 1, "a never wrote its listener key again");
    assert_ne!(again, first, "the key of a's new session");
    let solo = status(&b)["etcd"]["solo"]["granted"].as_u64().unwrap();
    sh_ok(&b.path, "flock x true");
    assert_eq!(status(&b)["etcd"]["solo"]["granted"].as_u64().unwrap(), solo, "granted solo while a reads events");
    let deadline = Instant::now() + STEP;
    while !reader
        .output()
        .iter()
        .any(|l| serde_json::from_str::<serde_json::Value>(l).is_ok_and(|e| e["path"] == "/x" && e["event"] == "grant"))
    {
        assert!(Instant::now() < deadline, "a never saw b's grant of /x: {:?}", reader.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.kill_all();
}
