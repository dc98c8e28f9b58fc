//! Shared harness: a real leasefs mount in a temp dir whose `Drop` unmounts,
//! readiness over a pipe, and child processes that cannot hang a test.

#![allow(dead_code)]

use std::io::Read;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// How long any single blocking step of a test may take.
pub const STEP: Duration = Duration::from_secs(30);

/// The `leasefs` binary: `$LEASEFS_BIN`, or next to the test executable.
pub fn leasefs_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LEASEFS_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("leasefs");
    assert!(bin.exists(), "{} not built: run `cargo build --workspace` first (scripts/test.sh does)", bin.display());
    bin
}

/// Wait for `child` at most `timeout`; kill it and panic past that.
pub fn wait_timeout(child: &mut Child, timeout: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            // Reap if it dies soon; a process stuck in the kernel must not
            // turn this failure into a hang.
            for _ in 0..200 {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("{what}: still running after {timeout:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Run a command with a timeout, capturing output.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = wait_timeout(&mut child, timeout, &what);
    Output { status, stdout: t_out.join().unwrap(), stderr: t_err.join().unwrap() }
}

/// Run `sh -c script` in `dir`; returns the output.
pub fn sh(dir: &Path, script: &str) -> Output {
    run_timeout(Command::new("sh").arg("-c").arg(script).current_dir(dir), STEP)
}

/// Run `sh -c script` in `dir` and require success; returns stdout.
pub fn sh_ok(dir: &Path, script: &str) -> String {
    let o = sh(dir, script);
    assert!(
        o.status.success(),
        "`{script}` failed: {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Run a python3 program in `dir` and require success; returns stdout.
pub fn py_ok(dir: &Path, program: &str) -> String {
    let o = run_timeout(Command::new("python3").arg("-c").arg(program).current_dir(dir), STEP);
    assert!(
        o.status.success(),
        "python failed: {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// True when the process runs as root (mounting needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn unmount(path: &Path, flags: libc::c_int) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is a valid path string.
    unsafe { libc::umount2(c.as_ptr(), flags) == 0 }
}

/// True when `path` is a mount point in this namespace.
pub fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy().replace(' ', "\\040");
    text.lines().any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

/// A leasefs daemon in the foreground serving a mount in a temp dir.
pub struct Mount {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub child: Option<Child>,
    /// The transport the mount asked for itself (`--transport`), if any.
    pub transport: Option<String>,
}

impl Mount {
    /// Mount with `--allow-other` (tests switch users).
    pub fn new() -> Mount {
        Mount::with_args(&["--allow-other"])
    }

    /// Mount with extra command-line arguments.
    pub fn with_args(args: &[&str]) -> Mount {
        Mount::with_args_env(args, &[])
    }

    /// Mount with extra arguments and environment variables for the daemon.
    pub fn with_args_env(args: &[&str], envs: &[(&str, &str)]) -> Mount {
        Mount::in_netns(args, envs, None)
    }

    /// Mount with the daemon in the network namespace `netns` (a file
    /// under /run/netns); the mount itself is visible as any other.
    pub fn in_netns(args: &[&str], envs: &[(&str, &str)], netns: Option<&Path>) -> Mount {
        assert!(is_root(), "integration tests mount filesystems and must run as root");
        let dir = tempfile::Builder::new().prefix("leasefs-test").tempdir().expect("tempdir");
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).unwrap();
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds is a valid array for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let (rd, wr) = (fds[0], fds[1]);
        let mut cmd = Command::new(leasefs_bin());
        cmd.arg("mount").arg(&path).arg("--foreground");
        if !args.contains(&"--state-dir") {
            cmd.arg("--state-dir").arg(dir.path().join("state"));
        }
        cmd.args(args).env("LEASEFS_READY_FD", wr.to_string()).stdin(Stdio::null());
        cmd.envs(envs.iter().copied());
        if std::env::var_os("LEASEFS_TEST_LOG").is_none() {
            cmd.stderr(Stdio::null());
        }
        let ns = netns.map(|p| std::fs::File::open(p).expect("open the network namespace"));
        let ns_fd = ns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        // SAFETY: only fcntl and setns (async-signal-safe) between fork and
        // exec: let the daemon inherit the write end, enter the namespace.
        unsafe {
            cmd.pre_exec(move || {
                libc::fcntl(wr, libc::F_SETFD, 0);
                if let Some(fd) = ns_fd {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn leasefs");
        drop(ns);
        // SAFETY: closing our copy of the write end; rd is ours.
        unsafe { libc::close(wr) };
        // SAFETY: rd came from pipe2 above and is owned here.
        let mut reader = unsafe { std::fs::File::from_raw_fd(rd) };
        let transport =
            args.iter().position(|a| *a == "--transport").and_then(|i| args.get(i + 1)).map(|t| t.to_string());
        let m = Mount { dir, path, child: Some(child), transport };
        let msg = read_with_timeout(&mut reader, STEP);
        assert!(msg.starts_with("READY"), "daemon did not become ready: {msg:?}");
        m
    }

    /// When the suite runs on one transport (`LEASEFS_TRANSPORT=uring` or
    /// `dev`, see scripts/test.sh), require that it served this mount.
    fn check_transport(&self) {
        let Ok(want) = std::env::var("LEASEFS_TRANSPORT") else { return };
        if want == "auto" || self.transport.is_some() || std::thread::panicking() {
            return;
        }
        // In a child with a deadline: the daemon may be stopped or gone.
        let o = run_timeout(Command::new("cat").arg(self.p(".leasefs/status")), Duration::from_secs(5));
        let Ok(status) = serde_json::from_slice::<serde_json::Value>(&o.stdout) else { return };
        let kind = status["transport"]["kind"].as_str().unwrap_or("?");
        assert_eq!(kind, want, "LEASEFS_TRANSPORT={want} but the mount was served by {kind}: {status}");
    }

    /// A path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("daemon").id() as i32
    }

    /// Stop the daemon (SIGSTOP) until the guard is dropped.
    pub fn pause(&self) -> Stopped {
        Stopped::new(self.pid())
    }

    /// Force the mount off (`umount -f`: the kernel aborts the FUSE
    /// connection, open descriptors and all) and wait for the daemon to
    /// end; returns its exit status. The mount point itself is detached
    /// when the guard drops.
    pub fn force_off(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon");
        // Busy (a descriptor is open) after the abort: the daemon ends anyway.
        unmount(&self.path, libc::MNT_FORCE);
        wait_timeout(&mut child, STEP, "the daemon of a mount forced off")
    }

    /// Unmount and wait for the daemon; returns its exit status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        self.check_transport();
        if !unmount(&self.path, 0) {
            unmount(&self.path, libc::MNT_DETACH);
        }
        let deadline = Instant::now() + STEP;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let st = self.stop();
        if is_mounted(&self.path) {
            unmount(&self.path, libc::MNT_DETACH);
        }
        if let Some(st) = st {
            if !std::thread::panicking() {
                assert!(st.success() || st.signal().is_some(), "daemon exited with {st:?}");
            }
        }
    }
}

fn read_with_timeout(f: &mut std::fs::File, timeout: Duration) -> String {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: pfd is a valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    if n <= 0 {
        return format!("no answer within {timeout:?}");
    }
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

/// A private tmpfs in a temp dir, unmounted on drop (the differential
/// baseline).
pub struct Tmpfs {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl Tmpfs {
    pub fn new() -> Tmpfs {
        Tmpfs::with_options("")
    }

    /// A tmpfs mounted with `-o OPTIONS` (e.g. `size=1m,nr_inodes=64`).
    pub fn with_options(options: &str) -> Tmpfs {
        let dir = tempfile::Builder::new().prefix("leasefs-tmpfs").tempdir().unwrap();
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).unwrap();
        let mut cmd = Command::new("mount");
        cmd.args(["-t", "tmpfs", "tmpfs"]).arg(&path);
        if !options.is_empty() {
            cmd.args(["-o", options]);
        }
        let o = run_timeout(&mut cmd, STEP);
        assert!(o.status.success(), "mount tmpfs: {}", String::from_utf8_lossy(&o.stderr));
        Tmpfs { dir, path }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if !unmount(&self.path, 0) {
            unmount(&self.path, libc::MNT_DETACH);
        }
    }
}

/// Small deterministic PRNG (xorshift64*), so failures replay from a seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// Start `cmd` in `dir` in its own process group with default signal
/// handling and its stdout piped to us.
fn spawn_piped(cmd: &mut Command, dir: &Path) -> (Child, std::process::ChildStdout) {
    let mut child = cmd
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .default_signals()
        .spawn()
        .expect("spawn");
    let out = child.stdout.take().unwrap();
    (child, out)
}

/// A background process killed (and reaped) on drop.
pub struct Bg {
    pub child: Child,
    /// Lines the process printed after `ready` (for `Bg::ready`).
    pub lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Set once the output reached its end (every line is in `lines`).
    drained: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Bg {
    /// Start `sh -c script` in `dir` and wait until it prints a line `ready`.
    pub fn ready(dir: &Path, script: &str) -> Bg {
        use std::io::BufRead;
        let (child, out) = spawn_piped(Command::new("sh").arg("-c").arg(script), dir);
        let (tx, rx) = std::sync::mpsc::channel();
        let rest = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = rest.clone();
        let drained = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let end = drained.clone();
        std::thread::spawn(move || {
            let mut lines = std::io::BufReader::new(out).lines();
            let first = lines.next().and_then(|l| l.ok()).unwrap_or_default();
            let _ = tx.send(first);
            for l in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
            end.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let mut child = child;
        let line = rx.recv_timeout(STEP).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("`{script}` did not get ready within {STEP:?}")
        });
        assert_eq!(line.trim(), "ready", "`{script}` printed {line:?}");
        Bg { child, lines: rest, drained }
    }

    /// Start `sh -c script` in `dir` without waiting.
    pub fn spawn(dir: &Path, script: &str) -> Bg {
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .stdin(Stdio::null())
            .process_group(0)
            .default_signals()
            .spawn()
            .expect("spawn");
        Bg { child, lines: Default::default(), drained: Default::default() }
    }

    /// Start a program directly (its pid is the program's).
    pub fn exec(dir: &Path, prog: &str, args: &[&str]) -> Bg {
        let child = Command::new(prog)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .process_group(0)
            .default_signals()
            .spawn()
            .expect("spawn");
        Bg { child, lines: Default::default(), drained: Default::default() }
    }

    /// Start a program directly, collecting every line it prints
    /// (see [`Bg::output`]).
    pub fn capture(dir: &Path, prog: &str, args: &[&str]) -> Bg {
        use std::io::BufRead;
        let (child, out) = spawn_piped(Command::new(prog).args(args), dir);
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let drained = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let end = drained.clone();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(l);
            }
            end.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        Bg { child, lines, drained }
    }

    /// The first line printed after `ready`, waiting for it at most
    /// `timeout` (`what` names it in the failure).
    pub fn first_line(&self, timeout: Duration, what: &str) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines.lock().unwrap().first() {
                return l.clone();
            }
            assert!(std::time::Instant::now() < deadline, "{what}: nothing printed within {timeout:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lines printed after `ready` so far: for a process that exited,
    /// once its output stopped growing.
    pub fn output(&self) -> Vec<String> {
        let deadline = Instant::now() + STEP;
        loop {
            let n = self.lines.lock().unwrap().len();
            if self.drained.load(std::sync::atomic::Ordering::SeqCst) {
                return self.lines.lock().unwrap().clone();
            }
            std::thread::sleep(Duration::from_millis(20));
            if n == self.lines.lock().unwrap().len() || Instant::now() > deadline {
                return self.lines.lock().unwrap().clone();
            }
        }
    }

    /// Every line printed after `ready`, once the output reached its end
    /// (after exit; at most `STEP` later, for output a leftover child
    /// keeps open).
    pub fn output_to_end(&self) -> Vec<String> {
        let deadline = Instant::now() + STEP;
        while !self.drained.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.lines.lock().unwrap().clone()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Wait for exit within `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        wait_timeout(&mut self.child, timeout, "background process")
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// The scheduler state letter from /proc (R, S, D, ...).
    pub fn state(&self) -> char {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        s.rsplit_once(')').and_then(|(_, r)| r.trim_start().chars().next()).unwrap_or('?')
    }

    /// Wait (at most `STEP`) until the process waits in the kernel for the
    /// answer to a FUSE request.
    pub fn wait_for_answer(&self) {
        let wchan = format!("/proc/{}/wchan", self.pid());
        let deadline = Instant::now() + STEP;
        while std::fs::read_to_string(&wchan).unwrap_or_default() != "request_wait_answer" {
            assert!(Instant::now() < deadline, "the process never waited for a FUSE answer");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Wait until the process is blocked (sleeping) — i.e. parked in a lock
    /// wait — or fail after `STEP`.
    pub fn wait_blocked(&mut self) {
        let deadline = Instant::now() + STEP;
        while self.state() != 'S' {
            assert!(self.running(), "process exited instead of blocking");
            assert!(Instant::now() < deadline, "process never blocked");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Bg {
    /// Kill the whole process group (the process and everything it started).
    pub fn kill_all(&mut self) {
        // SAFETY: signalling the process group we created for our child.
        unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
        let _ = self.child.kill();
        // Bounded: a process stuck in the kernel on a broken daemon must
        // fail the test, not hang it (the mount guard then kills the daemon).
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("process {} did not die within 10s of SIGKILL", self.pid());
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Exit code of `sh -c script` in `dir`.
pub fn sh_code(dir: &Path, script: &str) -> i32 {
    sh(dir, script).status.code().unwrap_or(-1)
}

/// The epoch of a lease file, from `getfattr`.
pub fn epoch(dir: &Path, file: &str) -> u64 {
    sh_ok(dir, &format!("getfattr --only-values -n user.leasefs.epoch {file}")).trim().parse().expect("epoch")
}

/// True when `cmd` is installed; in CI a missing tool fails the test instead
/// of skipping it.
pub fn have(cmd: &str) -> bool {
    let found =
        Command::new("sh").arg("-c").arg(format!("command -v {cmd}")).output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "CI must install {cmd} (see .ci/run)");
        eprintln!("{cmd} not installed: skipping");
    }
    found
}

/// Prometheus text with the `mount` label taken out of every sample
/// (`name{mount="/x"} 1` reads `name 1`), to compare values.
pub fn unlabeled(text: &str) -> String {
    text.lines()
        .map(|l| match (l.find("mount=\""), l.find("} ")) {
            (Some(a), Some(b)) if a < b => {
                let (name, rest) = l.split_at(l.find('{').unwrap_or(a));
                let labels: Vec<&str> =
                    rest[1..rest.find("} ").unwrap()].split(',').filter(|p| !p.starts_with("mount=")).collect();
                let value = &rest[rest.find("} ").unwrap() + 1..];
                if labels.is_empty() {
                    format!("{name}{value}")
                } else {
                    format!("{name}{{{}}}{value}", labels.join(","))
                }
            }
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Children the tests signal start with the default action for the signals
/// the tests send, whatever the test runner inherited (a shell's background
/// job ignores SIGINT and SIGQUIT, and ignoring survives `exec`).
pub trait DefaultSignals {
    fn default_signals(&mut self) -> &mut Self;
}

impl DefaultSignals for Command {
    fn default_signals(&mut self) -> &mut Self {
        // SAFETY: only signal(2), async-signal-safe, between fork and exec.
        unsafe {
            self.pre_exec(|| {
                for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            })
        }
    }
}

/// SIGCONT for a stopped daemon, also when the test fails.
pub struct Stopped(i32);

impl Stopped {
    pub fn new(pid: i32) -> Stopped {
        // SAFETY: signalling the test's own daemon.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") T ")) {
            assert!(Instant::now() < deadline, "the daemon did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Run tests/helpers/ghost.py (`rounds` waiters that give up, the holder
/// taking the lease through `holder`, the waiters through `waiter`) and
/// check SPEC 5's "no epoch without a holder": every grant, the holders'
/// and the waiters' that won a race, is exactly one above the one before.
/// Returns how many waiters were granted in a race.
pub fn no_epoch_without_a_holder(holder: &Path, waiter: &Path, name: &str, rounds: usize) -> usize {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helpers/ghost.py");
    let o = run_timeout(
        Command::new("python3").arg(&script).arg(holder).arg(waiter).arg(name).arg(rounds.to_string()),
        Duration::from_secs(600),
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "ghost.py: {o:?}\n{out}");
    let mut grants = Vec::new();
    let mut raced = 0;
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 3, "{line}");
        *kinds.entry(f[0].to_string()).or_default() += 1;
        grants.push((format!("{} holder", f[0]), f[1].parse::<u64>().unwrap()));
        if f[2] != "-" {
            raced += 1;
            grants.push((format!("{} waiter", f[0]), f[2].parse::<u64>().unwrap()));
        }
    }
    assert_eq!(kinds.values().sum::<usize>(), rounds + 1, "{out}");
    for w in grants.windows(2) {
        assert_eq!(w[1].1, w[0].1 + 1, "{} granted {} after {} was granted {}:\n{out}", w[1].0, w[1].1, w[0].0, w[0].1);
    }
    raced
}
