//! The process tree of a command run by `leasefs lock`, contained so that
//! none of it can outlive the lease.
//!
//! Invariants:
//! - Every process the command starts stays reachable: `leasefs lock` is a
//!   child subreaper (`PR_SET_CHILD_SUBREAPER`), so a descendant whose
//!   parent exits (double fork, `setsid` daemons) is re-parented to it, not
//!   to init; a walk of `/proc` from our pid finds the whole tree.
//! - Where a cgroup v2 directory of our own can be made (root, or a
//!   delegated subtree), the command runs in it and `cgroup.kill` ends every
//!   member at once, even one that moved to another parent.
//! - A process is signalled through a pidfd opened *before* its parentage is
//!   checked again, so a recycled pid of an unrelated process is never hit.
//! - The command's process group is signalled only while its leader (the
//!   command) is not reaped: until then its id cannot be reused.
//! - `terminate` returns only when nothing of the tree is left, not even a
//!   zombie.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long SIGKILL may take to end the tree before what is left is
/// reported instead of waited for.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// How the tree is contained, for `leasefs lock -v`.
pub enum Containment {
    /// A cgroup v2 directory of the command's own, ended with `cgroup.kill`
    /// (and the process-tree walk as well).
    Cgroup(PathBuf),
    /// A process group and a subreaper's walk of `/proc`; why no cgroup.
    Tree(String),
}

impl std::fmt::Display for Containment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Containment::Cgroup(dir) => write!(f, "cgroup {} (cgroup.kill)", dir.display()),
            Containment::Tree(why) => write!(f, "process group and subreaper (no cgroup: {why})"),
        }
    }
}

/// A cgroup v2 directory made for one command.
struct Cgroup {
    dir: PathBuf,
    /// The cgroup `leasefs lock` itself is in, where `--keep-children`
    /// moves what is left before the directory is removed.
    home: PathBuf,
}

/// The running command and everything it started.
pub struct Tree {
    /// The command (leader of its own process group).
    pid: i32,
    /// Its wait status once reaped.
    status: Option<i32>,
    cgroup: Option<Cgroup>,
    /// Our terminal, when it was handed to the command's group.
    tty: Option<RawFd>,
    pub containment: Containment,
}

/// Make this process a child subreaper: orphaned descendants come back to it.
pub fn become_subreaper() -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The cgroup v2 directory this process is in, if the unified hierarchy is
/// mounted here.
fn own_cgroup() -> Result<PathBuf, String> {
    let cgroup = leasefs::procfs::own_cgroup().map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let rel = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| "not in a cgroup v2 hierarchy".to_string())?
        .to_string();
    let info = leasefs::procfs::mountinfo().map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    for line in info.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        if right.split(' ').next() != Some("cgroup2") {
            continue;
        }
        let fields: Vec<&str> = left.split(' ').collect();
        let (Some(root), Some(mnt)) = (fields.get(3), fields.get(4)) else { continue };
        // The mount shows the hierarchy from `root` down.
        let Some(below) = rel.strip_prefix(root.trim_end_matches('/')) else { continue };
        let mnt = mnt.replace("\\040", " ");
        return Ok(Path::new(&mnt).join(below.trim_start_matches('/')));
    }
    Err("no cgroup2 mount".into())
}

/// Make a cgroup for a command under our own, with `cgroup.kill`.
fn make_cgroup() -> Result<Cgroup, String> {
    let home = own_cgroup()?;
    let dir = home.join(format!("leasefs-lock.{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !dir.join("cgroup.kill").exists() {
        let _ = std::fs::remove_dir(&dir);
        return Err("the kernel has no cgroup.kill (Linux 5.14+)".into());
    }
    Ok(Cgroup { dir, home })
}

impl Cgroup {
    /// Every process in the cgroup and in cgroups the command made below it.
    fn members(&self) -> Vec<i32> {
        fn walk(dir: &Path, out: &mut Vec<i32>) {
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.dir, &mut out);
        out
    }

    fn kill(&self) {
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
    }

    /// Remove the directory (and any the command made below it); it must be
    /// empty of processes.
    fn remove(&self) {
        fn rm(dir: &Path) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    rm(&e.path());
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        rm(&self.dir);
    }

    /// Move what is left to `home` (`--keep-children`), then remove the directory.
    fn release(&self) {
        for pid in self.members() {
            let _ = std::fs::write(self.home.join("cgroup.procs"), pid.to_string());
        }
        self.remove();
    }
}

/// Parent pid and process group of `pid`.
fn stat(pid: i32) -> Option<(i32, i32)> {
    let (ppid, pgrp) = leasefs::procfs::parent_and_group(u32::try_from(pid).ok()?)?;
    Some((ppid as i32, pgrp as i32))
}

/// Every descendant of `root` now alive or a zombie, parents before children.
fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for pid in leasefs::procfs::pids() {
        let pid = pid as i32;
        if let Some((ppid, _)) = stat(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            out.push(c);
            next.push(c);
        }
    }
    out
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; a non-negative result is a
    // new descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: see above.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn pidfd_signal(fd: &OwnedFd, sig: i32) {
    // SAFETY: a valid pidfd, no siginfo, no flags.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd.as_raw_fd(), sig, std::ptr::null::<u8>(), 0) };
}

impl Tree {
    /// Start `cmd` in a process group of its own, in a cgroup of its own
    /// unless `cgroup` is false or none can be made, with the terminal
    /// handed to it when we had it.
    pub fn spawn(cmd: &mut Command, cgroup: bool) -> std::io::Result<Tree> {
        use std::os::unix::process::CommandExt;
        let made = if cgroup { make_cgroup() } else { Err("--no-cgroup".into()) };
        let procs: Option<File> = match &made {
            Ok(cg) => std::fs::OpenOptions::new().write(true).open(cg.dir.join("cgroup.procs")).ok(),
            Err(_) => None,
        };
        let procs_fd = procs.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        // The terminal goes to the command's group when ours has it, so an
        // interactive command can read it and Ctrl-C reaches the command.
        let tty = foreground_tty();
        cmd.process_group(0);
        // SAFETY: only async-signal-safe calls (write, signal, tcsetpgrp,
        // getpid) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if procs_fd >= 0 && libc::write(procs_fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(fd) = tty {
                    libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(fd, libc::getpid());
                    libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let (child, containment, cgroup) = match (cmd.spawn(), made) {
            (Ok(c), Ok(cg)) if procs.is_some() => {
                let dir = cg.dir.clone();
                (c, Containment::Cgroup(dir), Some(cg))
            }
            (Ok(c), Ok(cg)) => {
                cg.remove();
                (c, Containment::Tree(format!("{}: not writable", cg.dir.join("cgroup.procs").display())), None)
            }
            (Ok(c), Err(why)) => (c, Containment::Tree(why), None),
            (Err(e), Ok(cg)) if procs.is_some() => {
                // The move into the cgroup was refused (a domain cgroup with
                // controllers, a subtree we may not write): run without it.
                cg.remove();
                drop(procs);
                return Tree::spawn_plain(cmd, format!("{}: {e}", cg.dir.display()), tty);
            }
            (Err(e), made) => {
                if let Ok(cg) = made {
                    cg.remove();
                }
                return Err(e);
            }
        };
        if let Some(fd) = tty {
            give_tty(fd, child.id() as i32);
        }
        Ok(Tree { pid: child.id() as i32, status: None, cgroup, tty, containment })
    }

    fn spawn_plain(cmd: &mut Command, why: String, tty: Option<RawFd>) -> std::io::Result<Tree> {
        use std::os::unix::process::CommandExt;
        // SAFETY: as in `spawn`, without the cgroup move.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(fd) = tty {
                    libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                    libc::tcsetpgrp(fd, libc::getpid());
                    libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        if let Some(fd) = tty {
            give_tty(fd, child.id() as i32);
        }
        Ok(Tree { pid: child.id() as i32, status: None, cgroup: None, tty, containment: Containment::Tree(why) })
    }

    /// The command's pid.
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// The command's wait status, once it has ended.
    pub fn status(&self) -> Option<i32> {
        self.status
    }

    /// Reap every child that has ended (the command, and orphans handed to
    /// us as the subreaper); notes the command's status.
    pub fn reap(&mut self) {
        loop {
            let mut st = 0;
            // SAFETY: waitpid on any child, without blocking.
            let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if pid == self.pid {
                self.status = Some(st);
                if let Some(fd) = self.tty.take() {
                    // The command had the terminal: take it back.
                    give_tty(fd, own_pgrp());
                }
            }
        }
    }

    /// Every process of the tree now (not us).
    fn members(&self) -> HashSet<i32> {
        let mut all: HashSet<i32> = descendants(std::process::id() as i32).into_iter().collect();
        if let Some(cg) = &self.cgroup {
            all.extend(cg.members());
        }
        all
    }

    /// True while any process of the tree runs or waits to be reaped.
    pub fn is_empty(&self) -> bool {
        self.members().is_empty()
    }

    /// Send `sig` to the whole tree: the command's group while its leader is
    /// unreaped, every descendant, every member of its cgroup.
    pub fn signal(&self, sig: i32) {
        let group = self.status.is_none();
        if group {
            // SAFETY: the group's leader is our unreaped child, so the id
            // is still this group's.
            unsafe { libc::kill(-self.pid, sig) };
        }
        let pinned: Vec<(i32, OwnedFd)> =
            self.members().into_iter().filter_map(|p| pidfd_open(p).map(|fd| (p, fd))).collect();
        // Looked up again once the pidfds pin the processes: a pid recycled
        // by an unrelated process in between is not ours and is left alone.
        let now = self.members();
        for (pid, fd) in &pinned {
            // Members of the group had it once already.
            if now.contains(pid) && !(group && stat(*pid).is_some_and(|(_, pgrp)| pgrp == self.pid)) {
                pidfd_signal(fd, sig);
            }
        }
    }

    /// End the whole tree: SIGTERM (and SIGCONT, so a stopped process acts
    /// on it) to every process, SIGKILL (and `cgroup.kill`) to whatever is
    /// left after `grace`, and reap everything. Returns when nothing is left.
    pub fn terminate(&mut self, grace: Duration) {
        self.reap();
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            self.reap();
            if self.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // A SIGKILLed process forks no more; children forked before it are
        // found by the next walk. Only a process stuck in the kernel
        // (uninterruptible sleep) outlasts SIGKILL: it is reported, not
        // waited for forever.
        let stuck = Instant::now() + KILL_WAIT;
        loop {
            self.reap();
            if self.is_empty() {
                break;
            }
            if Instant::now() > stuck {
                let left: Vec<i32> = self.members().into_iter().collect();
                eprintln!(
                    "leasefs: processes {left:?} did not end within {KILL_WAIT:?} of SIGKILL (stuck in the kernel)"
                );
                return;
            }
            if let Some(cg) = &self.cgroup {
                cg.kill();
            }
            self.signal(libc::SIGKILL);
            std::thread::sleep(Duration::from_millis(5));
        }
        self.finish(false);
    }

    /// Remove the cgroup (moving what is left out of it when `keep`).
    pub fn finish(&mut self, keep: bool) {
        if let Some(cg) = self.cgroup.take() {
            if keep {
                cg.release();
            } else {
                cg.remove();
            }
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.finish(true);
    }
}

fn own_pgrp() -> i32 {
    // SAFETY: getpgrp has no preconditions.
    unsafe { libc::getpgrp() }
}

/// Our standard input when it is a terminal whose foreground group is ours.
fn foreground_tty() -> Option<RawFd> {
    // SAFETY: isatty/tcgetpgrp on fd 0.
    unsafe { (libc::isatty(0) == 1 && libc::tcgetpgrp(0) == own_pgrp()).then_some(0) }
}

/// Make `pgrp` the terminal's foreground group (we may be in the background
/// by then, so SIGTTOU is ignored meanwhile).
fn give_tty(fd: RawFd, pgrp: i32) {
    // SAFETY: signal disposition changes and tcsetpgrp on our terminal.
    unsafe {
        let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::tcsetpgrp(fd, pgrp);
        libc::signal(libc::SIGTTOU, old);
    }
}
