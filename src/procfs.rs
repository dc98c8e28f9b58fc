//! Everything leasefs reads from `/proc`, and the only place its formats
//! are parsed. A process that is gone reads as `None` (or the documented
//! default), never as an error: the caller goes on without it.

use std::io::Read;

/// A small `/proc` file, read with one buffer large enough for all of it
/// (`read_to_string` would start small and grow, one `read` per doubling).
pub fn read(path: &str) -> Option<String> {
    let mut text = String::with_capacity(4096);
    std::fs::File::open(path).ok()?.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The fields of `/proc/PID/stat` after the command name (which may hold
/// spaces and parentheses): field 3 of proc(5), the state, comes first.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = read(&format!("/proc/{pid}/stat"))?;
    Some(stat.rsplit_once(')')?.1.split_whitespace().map(str::to_string).collect())
}

/// The state letter of a process (`R`, `S`, `T`, `Z`...).
pub fn state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// The parent of a process.
pub fn parent(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The parent and process group of a process.
pub fn parent_and_group(pid: u32) -> Option<(u32, u32)> {
    let f = stat_fields(pid)?;
    Some((f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
}

/// When a process started, in clock ticks after boot (with the pid, it
/// names one process: a pid is reused, the pair is not).
pub fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid)?.get(19)?.parse().ok()
}

/// The thread-group id (the process) of thread `tid`.
pub fn tgid(tid: u32) -> Option<u32> {
    let status = read(&format!("/proc/{tid}/status"))?;
    status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
}

/// Whether thread `tid` has `gid` among its supplementary groups.
pub fn in_supplementary_group(tid: u32, gid: u32) -> bool {
    read(&format!("/proc/{tid}/status")).is_some_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(gid)))
    })
}

/// A process's command name.
pub fn comm(pid: u32) -> Option<String> {
    Some(read(&format!("/proc/{pid}/comm"))?.trim_end().to_string())
}

/// Whether the thread `tid` has a signal pending that it does not block:
/// one that ends (or restarts) an interruptible wait in the kernel. A
/// signal sent to a multi-threaded process as a whole may be taken by any
/// of its threads and counts only for a process of one thread (a fatal one
/// is put on every thread). False when the thread is gone.
pub fn signal_pending(tid: u32) -> bool {
    let Some(status) = read(&format!("/proc/{tid}/status")) else { return false };
    signal_pending_in(&status)
}

/// [`signal_pending`] of the text of a `/proc/TID/status`.
pub fn signal_pending_in(status: &str) -> bool {
    let field = |name: &str| -> Option<&str> {
        status.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(str::trim))
    };
    let mask = |name: &str| field(name).and_then(|v| u64::from_str_radix(v, 16).ok()).unwrap_or(0);
    let alone = field("Threads").is_some_and(|t| t == "1");
    let pending = mask("SigPnd") | if alone { mask("ShdPnd") } else { 0 };
    pending & !mask("SigBlk") != 0
}

/// Whether a process exists (a zombie does).
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// How many threads a process has (0 when it is gone).
pub fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0)
}

/// Every pid now alive or a zombie.
pub fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect()
}

/// The machine's memory (`MemTotal`), in bytes.
pub fn memory_total() -> Option<u64> {
    let text = read("/proc/meminfo")?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The host name (empty when unknown).
pub fn hostname() -> String {
    read("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
}

/// This process's mount table (`/proc/self/mountinfo`).
pub fn mountinfo() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
}

/// This process's cgroup membership (`/proc/self/cgroup`).
pub fn own_cgroup() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/self/cgroup")
}

/// A process's cgroup v2 path (`/user.slice/...`), from `/proc/PID/cgroup`.
pub fn cgroup(pid: u32) -> Option<String> {
    read(&format!("/proc/{pid}/cgroup"))?.lines().find_map(|l| l.strip_prefix("0::")).map(str::to_string)
}

/// How a call makes the name [`making`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Making {
    /// An open with `O_CREAT` but not `O_EXCL`: it opens the name when it
    /// exists.
    Open,
    /// An open with `O_CREAT|O_EXCL`, `mkdir`, `mknod`, `symlink`: it
    /// fails with `EEXIST` when the name exists.
    Exclusive,
    /// `link`, `linkat`, or `renameat2` with `RENAME_NOREPLACE` (the new
    /// name): it fails with `EEXIST` when the name exists, but its own
    /// request to the filesystem does not make a new file.
    Link,
}

/// The name a thread is making, and how, while it waits in a call that
/// makes one: `open`, `openat` or `openat2` with `O_CREAT`, `mkdir`,
/// `mkdirat`, `mknod`, `mknodat`, `symlink`, `symlinkat`, and the new name
/// of `link`, `linkat` or a `renameat2` with `RENAME_NOREPLACE`. It is the
/// path the call was given, made absolute (lexically) from the thread's
/// root, working directory or directory descriptor as this process sees
/// them (a directory's trailing `/` dropped). `None` when the thread is in
/// no such call, the path's last part is not a name (`.`, `..`, a trailing
/// `/` elsewhere) or another part is `..` (a walk that may leave a
/// directory lexically named), or anything cannot be read (another user's
/// process, for an unprivileged daemon; a call made by io_uring's
/// workers).
pub fn making(tid: u32) -> Option<(std::path::PathBuf, Making)> {
    let text = read(&format!("/proc/{tid}/syscall"))?;
    let mut fields = text.split_whitespace();
    let nr: libc::c_long = fields.next()?.parse().ok()?;
    let args =
        fields.take(6).map(|a| u64::from_str_radix(a.strip_prefix("0x")?, 16).ok()).collect::<Option<Vec<u64>>>()?;
    if args.len() != 6 {
        return None;
    }
    let creates = |flags: u64| flags & libc::O_CREAT as u64 != 0;
    let excl = |flags: u64| if flags & libc::O_EXCL as u64 != 0 { Making::Exclusive } else { Making::Open };
    // The descriptor argument is an `int`: its low 32 bits.
    let fd = |a: u64| a as u32 as i32;
    // (directory descriptor, path, whether the call makes a directory,
    // whether it fails when the name exists)
    let (dirfd, path, dir, exclusive) = match nr {
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open if creates(args[1]) => (libc::AT_FDCWD, args[0], false, excl(args[1])),
        libc::SYS_openat if creates(args[2]) => (fd(args[0]), args[1], false, excl(args[2])),
        // `struct open_how` starts with the flags, a u64.
        libc::SYS_openat2 => {
            let mut how = [0u8; 8];
            (read_memory(tid, args[2], &mut how)? == 8 && creates(u64::from_ne_bytes(how))).then_some(())?;
            (fd(args[0]), args[1], false, excl(u64::from_ne_bytes(how)))
        }
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mkdir => (libc::AT_FDCWD, args[0], true, Making::Exclusive),
        libc::SYS_mkdirat => (fd(args[0]), args[1], true, Making::Exclusive),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_mknod => (libc::AT_FDCWD, args[0], false, Making::Exclusive),
        libc::SYS_mknodat => (fd(args[0]), args[1], false, Making::Exclusive),
        // The target (the first argument) is a string, never walked.
        #[cfg(target_arch = "x86_64")]
        libc::SYS_symlink => (libc::AT_FDCWD, args[1], false, Making::Exclusive),
        libc::SYS_symlinkat => (fd(args[1]), args[2], false, Making::Exclusive),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_link => (libc::AT_FDCWD, args[1], false, Making::Link),
        libc::SYS_linkat => (fd(args[2]), args[3], false, Making::Link),
        libc::SYS_renameat2 if args[4] & libc::RENAME_NOREPLACE as u64 != 0 => {
            (fd(args[2]), args[3], false, Making::Link)
        }
        _ => return None,
    };
    let mut path = read_string(tid, path)?;
    if dir {
        // `mkdir d/` makes `d`.
        while path.len() > 1 && path.ends_with(b"/") {
            path.pop();
        }
    }
    let full = lexical_path(&path, || {
        let link = if path.first() == Some(&b'/') {
            format!("/proc/{tid}/root")
        } else if dirfd == libc::AT_FDCWD {
            format!("/proc/{tid}/cwd")
        } else {
            format!("/proc/{tid}/fd/{dirfd}")
        };
        std::fs::read_link(link).ok()
    })?;
    Some((full, exclusive))
}

/// `path` made absolute from `base` lexically; `None` as
/// [`making`] says.
fn lexical_path(path: &[u8], base: impl FnOnce() -> Option<std::path::PathBuf>) -> Option<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let last = path.rsplit(|&b| b == b'/').next()?;
    if last.is_empty() || last == b"." || last == b".." || path.split(|&b| b == b'/').any(|p| p == b"..") {
        return None;
    }
    let mut full = base()?;
    if !full.is_absolute() {
        return None;
    }
    for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty() && *p != b".") {
        full.push(std::ffi::OsStr::from_bytes(part));
    }
    Some(full)
}

/// Read `buf.len()` bytes at `addr` of thread `tid`'s memory; how many
/// were read.
fn read_memory(tid: u32, addr: u64, buf: &mut [u8]) -> Option<usize> {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: `local` covers `buf`, writable for its length; the kernel
    // checks the remote range and the permission to read it.
    let n = unsafe { libc::process_vm_readv(tid as libc::pid_t, &local, 1, &remote, 1, 0) };
    usize::try_from(n).ok()
}

/// The NUL-terminated string at `addr` of thread `tid`'s memory (at most
/// `PATH_MAX` bytes), read a page at a time so an unmapped page after it
/// does not fail the read.
fn read_string(tid: u32, mut addr: u64) -> Option<Vec<u8>> {
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    while out.len() < libc::PATH_MAX as usize {
        let mut buf = vec![0u8; (PAGE - addr % PAGE) as usize];
        let n = read_memory(tid, addr, &mut buf)?;
        if n == 0 {
            return None;
        }
        if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Some(out);
        }
        out.extend_from_slice(&buf[..n]);
        addr += n as u64;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_itself() {
        let me = std::process::id();
        assert_eq!(tgid(me), Some(me));
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id()));
        assert!(start_time(me).is_some());
        assert!(matches!(state(me), Some('R' | 'S')));
        assert!(comm(me).is_some_and(|c| !c.is_empty()));
        assert!(threads(me) >= 1 && exists(me));
        assert!(pids().contains(&me));
        assert!(memory_total().is_some_and(|m| m > 0));
        // A pid beyond pid_max is never a process.
        assert_eq!((state(1 << 23), comm(1 << 23), threads(1 << 23)), (None, None, 0));
        assert!(!signal_pending(1 << 23));
    }

    #[test]
    fn pending_signals_count_unless_blocked_or_left_to_another_thread() {
        let status = |threads: u32, thread: &str, shared: &str, blocked: &str| {
            format!("Name:\tx\nThreads:\t{threads}\nSigQ:\t0/1\nSigPnd:\t{thread}\nShdPnd:\t{shared}\nSigBlk:\t{blocked}\nSigIgn:\t0000000000000000\n")
        };
        let none = "0000000000000000";
        let kill = "0000000000000100";
        let alarm = "0000000000002000";
        assert!(!signal_pending_in(&status(1, none, none, none)));
        assert!(signal_pending_in(&status(1, kill, none, none)));
        assert!(signal_pending_in(&status(1, none, alarm, none)), "a process-wide signal of a lone thread");
        assert!(!signal_pending_in(&status(4, none, alarm, none)), "another thread may take it");
        assert!(signal_pending_in(&status(4, kill, alarm, none)));
        assert!(!signal_pending_in(&status(1, alarm, alarm, alarm)), "blocked");
        assert!(signal_pending_in(&status(1, "0000000000002100", none, alarm)));
    }

    #[test]
    fn a_created_path_is_made_absolute_lexically() {
        let base = || Some(std::path::PathBuf::from("/m/d"));
        let p = |s: &str| lexical_path(s.as_bytes(), base).map(|p| p.to_string_lossy().into_owned());
        assert_eq!(p("x").as_deref(), Some("/m/d/x"));
        assert_eq!(p("./a//b/./x").as_deref(), Some("/m/d/a/b/x"));
        assert_eq!(p("/abs/x").as_deref(), Some("/m/d/abs/x"), "an absolute path is joined to the root");
        for bad in ["", "a/", "a/.", ".", "..", "a/../x", "a/.."] {
            assert_eq!(p(bad), None, "{bad:?}");
        }
        assert_eq!(lexical_path(b"x", || Some("rel".into())), None, "a base that is not absolute");
    }

    /// What `making` shows of a thread while `open` (given the FIFO's
    /// path) holds it in its call: a FIFO's write side blocks until a
    /// reader comes. The path is shown relative to the FIFO's directory.
    fn seen_while_opening(open: fn(&std::ffi::CStr) -> i64) -> Option<std::path::PathBuf> {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let fd = open(&c);
            assert!(fd >= 0, "{}", std::io::Error::last_os_error());
            // SAFETY: the descriptor this thread just opened.
            unsafe { libc::close(fd as i32) };
        });
        let tid = rx.recv().unwrap();
        let opens = [libc::SYS_openat, libc::SYS_openat2, libc::SYS_open];
        let in_open = || {
            read(&format!("/proc/{tid}/syscall"))
                .and_then(|l| l.split_whitespace().next()?.parse::<libc::c_long>().ok())
                .is_some_and(|nr| opens.contains(&nr))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !in_open() {
            assert!(std::time::Instant::now() < deadline, "the thread never waited in its open");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let seen = making(tid).map(|(path, _)| path);
        let _reader = std::fs::File::open(&fifo).unwrap();
        writer.join().unwrap();
        seen.map(|p| p.strip_prefix(dir.path().canonicalize().unwrap()).unwrap().to_path_buf())
    }

    #[test]
    fn a_thread_waiting_in_an_o_creat_open_shows_the_path_it_creates() {
        let fifo = Some(std::path::PathBuf::from("fifo"));
        // SAFETY: a NUL-terminated path and plain flags.
        let openat = |p: &std::ffi::CStr| unsafe {
            libc::openat(libc::AT_FDCWD, p.as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o600) as i64
        };
        assert_eq!(seen_while_opening(openat), fifo, "openat");
        let openat2 = |p: &std::ffi::CStr| {
            // `struct open_how`: flags, mode, resolve.
            let how: [u64; 3] = [(libc::O_WRONLY | libc::O_CREAT) as u64, 0o600, 0];
            // SAFETY: a NUL-terminated path and an `open_how` of the size given.
            unsafe { libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, p.as_ptr(), &how, std::mem::size_of_val(&how)) }
        };
        assert_eq!(seen_while_opening(openat2), fifo, "openat2");
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: a NUL-terminated path and plain flags.
            let open = |p: &std::ffi::CStr| unsafe {
                libc::syscall(libc::SYS_open, p.as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o600)
            };
            assert_eq!(seen_while_opening(open), fifo, "open");
        }
        // SAFETY: a NUL-terminated path and plain flags.
        let plain = |p: &std::ffi::CStr| unsafe { libc::openat(libc::AT_FDCWD, p.as_ptr(), libc::O_WRONLY) as i64 };
        assert_eq!(seen_while_opening(plain), None, "an open without O_CREAT makes nothing");
        assert_eq!(making(std::process::id()), None, "a thread in no open");
    }
}
