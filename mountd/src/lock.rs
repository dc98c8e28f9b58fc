//! `leasefs lock` (hold a lease around a command, and never let the
//! command outlive it) and `leasefs wait` (block until a lease is free or
//! held), both driven by `.leasefs/events`, never by polling the lease.

use std::ffi::{CString, OsString};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use leasefs::fuse::session;

use crate::tree::{self, Tree};
use crate::wakeup::{self, drain};

/// Exit status when the lease was lost while the command ran (broken,
/// taken over, fenced); the command was terminated.
pub const LOST: u8 = 75;

/// Exit status of flock(1) when the lock was not taken (conflict, timeout).
pub const NOT_TAKEN: u8 = 1;

/// The leasefs mount `path` is on, and `path` relative to it (`/a/b`).
pub fn locate(path: &Path) -> Result<(PathBuf, PathBuf, String), String> {
    let abs = session::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut dir = abs.parent();
    while let Some(d) = dir {
        if session::find_mount(d).is_some() {
            let rel = crate::watch::lease_path(d, &abs)?;
            return Ok((d.to_path_buf(), abs.clone(), rel));
        }
        dir = d.parent();
    }
    Err(format!("{}: not on a leasefs mount", path.display()))
}

/// The events stream of `mount`, filtered to `rel`.
fn open_events(mount: &Path, rel: &str) -> Result<std::fs::File, String> {
    let p = mount.join(".leasefs/events");
    let mut f =
        std::fs::OpenOptions::new().read(true).write(true).open(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    f.write_all(rel.as_bytes()).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(f)
}

/// Whole event lines read so far from a stream.
#[derive(Default)]
struct Lines {
    pending: Vec<u8>,
}

impl Lines {
    fn read(&mut self, f: &mut std::fs::File) -> std::io::Result<Vec<serde_json::Value>> {
        let mut buf = [0u8; 16 * 1024];
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the event stream ended"));
        }
        self.pending.extend_from_slice(&buf[..n]);
        let mut out = Vec::new();
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            if let Ok(v) = serde_json::from_slice(&line) {
                out.push(v);
            }
        }
        Ok(out)
    }
}

fn epoch_of(file: &Path) -> Option<u64> {
    read_epoch(file).ok()
}

/// The epoch (fencing token) of the lease at `file`, from `user.leasefs.epoch`.
fn read_epoch(file: &Path) -> Result<u64, String> {
    let show = file.display();
    let c = CString::new(file.as_os_str().as_bytes()).map_err(|_| format!("{show}: a path cannot hold NUL"))?;
    let mut buf = [0u8; 32];
    // SAFETY: valid C strings and a buffer of the given size.
    let n = unsafe { libc::getxattr(c.as_ptr(), c"user.leasefs.epoch".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENODATA | libc::EOPNOTSUPP) => format!("{show}: not a file on a leasefs mount"),
            _ => format!("{show}: {e}"),
        });
    }
    let text = String::from_utf8_lossy(&buf[..n as usize]);
    text.trim().parse().map_err(|_| format!("{show}: unexpected epoch {text:?}"))
}

/// `leasefs epoch PATH`: print the lease's epoch, the fencing token.
pub fn epoch(file: &Path) -> ExitCode {
    match read_epoch(file) {
        Ok(e) => {
            println!("{e}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// The holders of the lease at `file`, from `user.leasefs.holder`.
fn holders(file: &Path) -> Option<usize> {
    let c = CString::new(file.as_os_str().as_bytes()).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    // SAFETY: valid C strings and a buffer of the given size.
    let n = unsafe { libc::getxattr(c.as_ptr(), c"user.leasefs.holder".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&buf[..n as usize]).ok()?;
    Some(v["holders"].as_array().map_or(0, Vec::len))
}

/// What `leasefs lock` was asked.
pub struct LockSpec {
    pub path: PathBuf,
    pub shared: bool,
    pub nonblock: bool,
    pub wait: Option<f64>,
    pub conflict_exit: u8,
    pub ttl: Option<String>,
    pub grace: Duration,
    /// Leave the command's other processes running after it exits normally.
    pub keep_children: bool,
    /// Contain the tree without a cgroup (process group and subreaper only).
    pub no_cgroup: bool,
    /// Say how the tree is contained.
    pub verbose: bool,
    pub command: Vec<OsString>,
}

fn fail(msg: String) -> ExitCode {
    eprintln!("leasefs: {msg}");
    ExitCode::FAILURE
}

/// Take the lease, run the command with `LEASEFS_EPOCH`/`LEASEFS_PATH`,
/// renew a TTL while it runs, and terminate it if the lease is lost.
pub fn lock(spec: &LockSpec) -> ExitCode {
    let (mount, file, rel) = match locate(&spec.path) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let sigs = match wakeup::catch(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGCHLD, libc::SIGALRM]) {
        Ok(fd) => fd,
        Err(e) => return fail(format!("signals: {e}")),
    };
    // Listen before taking the lease, so no loss can go unseen.
    let events = match open_events(&mount, &rel) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let f = match acquire(spec, &file) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let epoch = epoch_of(&file).unwrap_or(0);
    // Descendants that leave the command (double fork, setsid) come back to
    // us instead of init, so none of them escapes the walk of our tree.
    if let Err(e) = tree::become_subreaper() {
        return fail(format!("PR_SET_CHILD_SUBREAPER: {e}"));
    }
    let tree = match spawn(spec, &file, epoch) {
        Ok(t) => t,
        Err(e) => return fail(format!("{}: {e}", spec.command[0].to_string_lossy())),
    };
    if spec.verbose {
        eprintln!("leasefs: {rel}: epoch {epoch}; command {} contained by {}", tree.pid(), tree.containment);
    }
    hold(spec, tree, &f, events, sigs, &rel, epoch)
}

/// Open the lease file as `flock(1)` does, set its TTL, and take the lock
/// (within `-w`); the exit code when it was not taken.
fn acquire(spec: &LockSpec, file: &Path) -> Result<std::fs::File, ExitCode> {
    let fail = |m: String| Err(fail(m));
    // As flock(1) opens it: read-only, created if missing.
    let opened = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CREAT | libc::O_NOCTTY).mode(0o666).open(file)
    };
    let f = match opened {
        Ok(f) => f,
        Err(e) => return fail(format!("{}: {e}", file.display())),
    };
    if let Some(ttl) = &spec.ttl {
        let c = CString::new(file.as_os_str().as_bytes()).expect("no NUL in a path");
        // SAFETY: valid C strings and value buffer.
        let r = unsafe { libc::setxattr(c.as_ptr(), c"user.leasefs.ttl".as_ptr(), ttl.as_ptr().cast(), ttl.len(), 0) };
        if r != 0 {
            return fail(format!("{}: setting the TTL: {}", file.display(), std::io::Error::last_os_error()));
        }
    }
    let op = if spec.shared { libc::LOCK_SH } else { libc::LOCK_EX };
    if let Some(w) = spec.wait.filter(|w| *w > 0.0) {
        // SAFETY: arms a one-shot real-time timer; its SIGALRM ends flock with EINTR.
        unsafe {
            let t = libc::itimerval {
                it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
                it_value: libc::timeval { tv_sec: w.trunc() as i64, tv_usec: (w.fract() * 1e6) as i64 },
            };
            libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut());
        }
    }
    let nonblock = spec.nonblock || spec.wait == Some(0.0);
    // SAFETY: flock on our own descriptor.
    let r = unsafe { libc::flock(f.as_raw_fd(), op | if nonblock { libc::LOCK_NB } else { 0 }) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Err(ExitCode::from(spec.conflict_exit)),
            // The -w timer.
            Some(libc::EINTR) if wakeup::last_signal() == 0 => Err(ExitCode::from(spec.conflict_exit)),
            Some(libc::EINTR) => Err(ExitCode::from(128 + wakeup::last_signal() as u8)),
            _ => fail(format!("{}: {e}", file.display())),
        };
    }
    // SAFETY: disarm the -w timer.
    unsafe {
        let zero = libc::itimerval {
            it_interval: libc::timeval { tv_sec: 0, tv_usec: 0 },
            it_value: libc::timeval { tv_sec: 0, tv_usec: 0 },
        };
        libc::setitimer(libc::ITIMER_REAL, &zero, std::ptr::null_mut());
    }
    Ok(f)
}

/// Start the command in its own contained tree, with the lease's epoch and
/// path in its environment.
fn spawn(spec: &LockSpec, file: &Path, epoch: u64) -> std::io::Result<Tree> {
    let mut cmd = std::process::Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..]).env("LEASEFS_EPOCH", epoch.to_string()).env("LEASEFS_PATH", file);
    // SAFETY: prctl and signal are async-signal-safe. The command dies with
    // us (it must never run without the lease), and starts with the default
    // signal handling.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGCHLD, libc::SIGALRM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    Tree::spawn(&mut cmd, !spec.no_cgroup)
}

/// Hold the lease while the command runs: renew its TTL, pass signals on
/// to the tree, and end the tree when the lease is lost or the command
/// ends; the command's exit code, or `LOST`.
fn hold(
    spec: &LockSpec,
    mut tree: Tree,
    f: &std::fs::File,
    mut events: std::fs::File,
    sigs: std::os::fd::RawFd,
    rel: &str,
    epoch: u64,
) -> ExitCode {
    let me = std::process::id();
    let renew_every = spec
        .ttl
        .as_deref()
        .and_then(|t| leasefs::fs::parse_ttl(t).ok().flatten())
        .map(|ms| Duration::from_millis(ms / 3));
    let mut next_renew = renew_every.map(|d| Instant::now() + d);
    let mut lines = Lines::default();
    let mut lost: Option<String> = None;
    loop {
        tree.reap();
        if let Some(why) = &lost {
            eprintln!("leasefs: {rel}: lease lost ({why}); terminating the command and everything it started");
            tree.terminate(spec.grace);
            return ExitCode::from(LOST);
        }
        if let Some(status) = tree.status() {
            // The command ended: what it left running would go on without
            // the lease once we exit, so it ends too (unless asked not to),
            // while the lease is still held.
            if spec.keep_children {
                tree.finish(true);
            } else {
                tree.terminate(spec.grace);
            }
            return if libc::WIFEXITED(status) {
                ExitCode::from(libc::WEXITSTATUS(status) as u8)
            } else {
                ExitCode::from(128 + libc::WTERMSIG(status) as u8)
            };
        }
        let timeout = next_renew.map(|t| t.saturating_duration_since(Instant::now()));
        let ready = wakeup::readable(&[events.as_raw_fd(), sigs], timeout);
        if ready[1] {
            drain(sigs);
            let sig = wakeup::take_signal();
            if sig != 0 {
                // Ctrl-C, SIGTERM and SIGHUP reach the whole tree.
                tree.signal(sig);
            }
        }
        if ready[0] {
            match lines.read(&mut events) {
                Ok(evs) => {
                    for v in evs {
                        lost = lost.or_else(|| lost_by(&v, me, epoch, spec.shared));
                    }
                }
                Err(e) => lost = Some(format!("{e}")),
            }
        }
        if let (Some(t), Some(every)) = (next_renew, renew_every) {
            if Instant::now() >= t {
                // Renew only while the command runs: a stopped (frozen) command
                // lets its lease expire, so a contender can break it.
                if !stopped(tree.pid()) {
                    // A holder's touch renews its lease.
                    // SAFETY: futimens on our own descriptor with "now" for both times.
                    unsafe { libc::futimens(f.as_raw_fd(), std::ptr::null()) };
                }
                next_renew = Some(Instant::now() + every);
            }
        }
    }
}

/// Why the event `v` means the holder `me` (granted `epoch`) lost its lease.
fn lost_by(v: &serde_json::Value, me: u32, epoch: u64, shared: bool) -> Option<String> {
    let ours = v["pid"].as_u64() == Some(u64::from(me));
    let newer = v["epoch"].as_u64().is_some_and(|e| e > epoch);
    match v["event"].as_str() {
        Some("break") if ours => Some(format!("broken: {}", v["reason"].as_str().unwrap_or("?"))),
        Some("fence") if ours => Some("fenced".into()),
        Some("grant") if !ours && newer && !shared => Some(format!("taken over at epoch {}", v["epoch"])),
        Some("host_lost") => Some("host lost".into()),
        _ => None,
    }
}

/// Whether process `pid` is stopped (SIGSTOP, a debugger).
fn stopped(pid: u32) -> bool {
    matches!(leasefs::procfs::state(pid), Some('T' | 't'))
}

/// Block until the lease at `path` is free (or held), at most `wait`.
pub fn wait(mount: &Path, path: &Path, held: bool, wait: Option<f64>) -> ExitCode {
    let abs = if path.is_absolute() { path.to_path_buf() } else { mount.join(path) };
    let rel = match crate::watch::lease_path(mount, &abs) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let mut events = match open_events(mount, &rel) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let deadline = wait.map(|w| Instant::now() + Duration::from_secs_f64(w));
    let mut lines = Lines::default();
    loop {
        // Checked after listening, so a change in between is seen either way.
        match holders(&abs) {
            Some(n) if (n > 0) == held => return ExitCode::SUCCESS,
            Some(_) => {}
            None => return fail(format!("{}: no such lease", abs.display())),
        }
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if timeout.is_some_and(|t| t.is_zero()) {
            return ExitCode::from(NOT_TAKEN);
        }
        if wakeup::readable(&[events.as_raw_fd()], timeout)[0] {
            if let Err(e) = lines.read(&mut events) {
                return fail(format!("{rel}: {e}"));
            }
        }
    }
}
