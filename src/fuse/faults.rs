//! The test bench's door (SPEC 13): every request, before it is parsed, is
//! shown to the mount's fault rules while any are in force. The raw
//! request is decoded just enough to name it as users know the system
//! call (`write`, `fsync`, `flock`...), find its path and caller; a rule
//! that fires answers it with an errno, holds it (a delay, a hang: parked
//! with its reply path, no thread held), shortens it, or breaks the
//! lease it names, and each firing is an event.
//!
//! Requests on the control directory never meet a rule, so `fault clear`
//! and `fault release` always get through.

use super::session::{encode_error_reply, IN_HEADER};
use super::*;
use crate::bench::{Action, Call, Resume};
use crate::fs::FaultSeen;

/// `fuse_lk_in.lk_flags`: the lock is a `flock`.
const FUSE_LK_FLOCK: u32 = 1;
/// `fuse_setattr_in.valid` bits.
const FATTR_MODE: u32 = 1;
const FATTR_UID: u32 = 2;
const FATTR_GID: u32 = 4;
const FATTR_SIZE: u32 = 8;
const FATTR_TIMES: u32 = 16 | 32 | 128 | 256 | 1024;

/// A request as the door names it.
struct Named<'a> {
    op: &'static str,
    /// The node the path is of, and the name in it (a name's request).
    node: u64,
    name: Option<&'a [u8]>,
    /// The other path of a rename or link.
    to: Option<(u64, &'a [u8])>,
}

/// After a power cut: the broken leases' answers, the entries and the
/// inodes the kernel must drop, then `answer` once the inodes' notices
/// were sent. No other request's answer waits for them: a writer cut off
/// in the middle of a write holds pages they drop until its own write is
/// answered.
pub(super) fn after_cut(
    fs: &Fs,
    waits: &Mutex<Waits>,
    cut: crate::fs::PowerCut,
    answer: impl FnOnce() + Send + 'static,
) {
    let mut w = waits.lock();
    w.deliver(cut.effects, fs);
    send_entry_drops(fs, &w);
    match (&w.notices, cut.inval.split_last()) {
        (Some(n), Some((last, rest))) => {
            for ino in rest {
                n.inval_inode(ino.0, None);
            }
            n.inval_inode(last.0, Some(Box::new(answer)));
        }
        _ => {
            drop(w);
            answer();
        }
    }
}

/// The request's unique id when it names a file handle opened before a
/// power cut (a release still goes through, and control files live on).
fn dead_handle(m: &[u8], bench: &crate::bench::Bench) -> Option<u64> {
    let opcode = word(m, 4)?;
    // READ WRITE FSYNC FLUSH READDIR FSYNCDIR GETLK SETLK SETLKW IOCTL
    // POLL FALLOCATE READDIRPLUS LSEEK COPY_FILE_RANGE: the handle first.
    const WITH_FH: [u32; 15] = [15, 16, 20, 25, 28, 30, 31, 32, 33, 39, 40, 43, 44, 46, 47];
    if !WITH_FH.contains(&opcode) {
        return None;
    }
    let node = dword(m, 16)?;
    if crate::control::is_control(Ino(node)) || node == crate::control::DIR_INO.0 {
        return None;
    }
    let fh = dword(m, IN_HEADER)?;
    bench.cut_off(fh).then(|| dword(m, 8)).flatten()
}

fn word(m: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(m.get(at..at + 4)?.try_into().ok()?))
}

fn dword(m: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(m.get(at..at + 8)?.try_into().ok()?))
}

/// The NUL-terminated names of a request from `at` on.
fn names(m: &[u8], at: usize) -> impl Iterator<Item = &[u8]> {
    m.get(at..).unwrap_or_default().split(|b| *b == 0)
}

/// Name a raw request as users know the system call; `None` for requests
/// no rule names (forget, release, init, interrupt, ...).
fn name(m: &[u8]) -> Option<Named<'_>> {
    let opcode = word(m, 4)?;
    let node = dword(m, 16)?;
    let plain = |op| Some(Named { op, node, name: None, to: None });
    let named = |op, at| Some(Named { op, node, name: names(m, IN_HEADER + at).next(), to: None });
    match opcode {
        1 => named("lookup", 0),
        3 | 52 => plain("stat"),
        4 => {
            let valid = word(m, IN_HEADER)?;
            plain(if valid & FATTR_SIZE != 0 {
                "truncate"
            } else if valid & FATTR_MODE != 0 {
                "chmod"
            } else if valid & (FATTR_UID | FATTR_GID) != 0 {
                "chown"
            } else if valid & FATTR_TIMES != 0 {
                "utimes"
            } else {
                return None;
            })
        }
        5 => plain("readlink"),
        6 => named("symlink", 0),
        8 => named("create", 16),
        9 => named("mkdir", 8),
        10 => named("unlink", 0),
        11 => named("rmdir", 0),
        12 | 45 => {
            let newdir = dword(m, IN_HEADER)?;
            let mut n = names(m, IN_HEADER + if opcode == 12 { 8 } else { 16 });
            let (old, new) = (n.next()?, n.next()?);
            Some(Named { op: "rename", node, name: Some(old), to: Some((newdir, new)) })
        }
        13 => {
            let old = dword(m, IN_HEADER)?;
            let new = names(m, IN_HEADER + 8).next()?;
            Some(Named { op: "link", node: old, name: None, to: Some((node, new)) })
        }
        14 | 27 => plain("open"),
        15 => plain("read"),
        16 => plain("write"),
        17 => plain("statfs"),
        20 | 30 => plain(if word(m, IN_HEADER + 8)? & 1 != 0 { "fdatasync" } else { "fsync" }),
        21 => plain("setxattr"),
        22 => plain("getxattr"),
        23 => plain("listxattr"),
        24 => plain("removexattr"),
        25 => plain("close"),
        28 | 44 => plain("readdir"),
        31..=33 => plain(if word(m, IN_HEADER + 40)? & FUSE_LK_FLOCK != 0 { "flock" } else { "fcntl" }),
        34 => plain("access"),
        35 => named("create", 16),
        43 => plain("fallocate"),
        46 => plain("lseek"),
        51 => plain("create"),
        _ => None,
    }
}

/// An 8-byte aligned copy of a request (the parser needs the alignment).
struct Copy {
    words: Vec<u64>,
    len: usize,
}

impl Copy {
    fn of(m: &[u8]) -> Copy {
        let mut words = vec![0u64; m.len().div_ceil(8)];
        // SAFETY: `words` owns at least `m.len()` bytes; u64 has no invalid bit patterns.
        unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), words.as_mut_ptr().cast::<u8>(), m.len()) };
        Copy { words, len: m.len() }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of `words` were written in `of`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `self` is borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }

    fn put(&mut self, at: usize, v: u32) {
        self.bytes_mut()[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
}

impl Interceptor {
    /// See [`Intercept::door`]: answer, hold or change a request a fault
    /// rule fires on. Costs one atomic load while no rule is in force.
    pub(super) fn door_here(&self, m: &[u8], answer: &fuser::RawReply<'_>) -> bool {
        let bench = self.fs.bench();
        if !bench.engaged() {
            return false;
        }
        if let Some(unique) = dead_handle(m, bench) {
            // Opened before a power cut: nothing but its close goes on.
            let _ = answer.send(&encode_error_reply(unique, libc::EIO));
            return true;
        }
        catch_unwind(AssertUnwindSafe(|| self.door_inner(m, answer))).unwrap_or_else(|_| {
            error!(op = "fault", "the bench's door panicked; request served as is");
            false
        })
    }

    fn door_inner(&self, m: &[u8], answer: &fuser::RawReply<'_>) -> bool {
        let bench = self.fs.bench();
        let Some(req) = name(m) else { return false };
        if !bench.may_match(req.op) {
            return false;
        }
        let (Some(unique), Some(uid), Some(tid)) = (dword(m, 8), word(m, 24), word(m, 32)) else { return false };
        let os = |b: &[u8]| <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b).to_os_string();
        let name = req.name.map(os);
        if Fs::is_control_name(Ino(req.node), name.as_deref().unwrap_or_default())
            || req.to.is_some_and(|(d, n)| Fs::is_control_name(Ino(d), &os(n)))
        {
            return false;
        }
        let wants = bench.wants();
        let path = if wants.path { self.fs.fault_path(Ino(req.node), name.as_deref()) } else { None };
        let to = match req.to {
            Some((d, n)) if wants.path => self.fs.fault_path(Ino(d), Some(&os(n))),
            _ => None,
        };
        // Requests carry the calling thread; rules name processes.
        let pid = if wants.pid { crate::procfs::tgid(tid).unwrap_or(tid) } else { tid };
        let comm = if wants.comm { self.fs.fault_comm(tid) } else { None };
        let cgroup = if wants.cgroup { crate::procfs::cgroup(tid) } else { None };
        let call = Call {
            op: req.op,
            path: path.as_deref(),
            to: to.as_deref(),
            pid,
            uid,
            comm: comm.as_deref().unwrap_or_default(),
            cgroup: cgroup.as_deref(),
        };
        let Some(fired) = bench.decide(unique, &call) else { return false };
        let target = self.fs.fault_target(Ino(req.node), name.as_deref());
        self.fs.fault_fired(FaultSeen {
            rule: fired.rule,
            matched: fired.matched,
            op: req.op,
            path: path.or_else(|| self.fs.fault_path(Ino(req.node), name.as_deref())),
            ino: target,
            pid: crate::procfs::tgid(tid).unwrap_or(tid),
            action: fired.action,
        });
        let fail = move |errno: i32| {
            crate::control::count_refusal(crate::bench::errnos::name_of(errno).unwrap_or("EIO"));
            encode_error_reply(unique, errno)
        };
        match fired.action {
            Action::Errno { errno, delay_ms: 0 } => {
                let _ = answer.send(&fail(errno));
                true
            }
            Action::Errno { .. } | Action::Delay { .. } | Action::Hang => {
                let Some(later) = answer.later() else { return false };
                let until = match fired.action {
                    Action::Errno { errno, delay_ms } => Some((Duration::from_millis(delay_ms), Resume::Fail(errno))),
                    Action::Delay { ms } => Some((Duration::from_millis(ms), Resume::Go)),
                    _ => None,
                };
                let copy = Copy::of(m);
                let then: crate::bench::Then = Box::new(move |how| match how {
                    Resume::Go => later.serve(copy.bytes()),
                    Resume::Fail(e) => {
                        let _ = later.send(&fail(e));
                    }
                });
                // Under the waits lock, as interrupts are taken: a signal
                // that came before the request was held still ends it.
                let now = {
                    let mut w = self.waits.lock();
                    if w.take_early(unique) {
                        Some((then, Resume::Fail(libc::EINTR)))
                    } else {
                        bench.park(unique, fired.rule, until, then)
                    }
                };
                if let Some((then, how)) = now {
                    then(how);
                }
                true
            }
            Action::Short { bytes } => {
                let Some(later) = answer.later() else { return false };
                let opcode = word(m, 4).unwrap_or_default();
                let mut copy = Copy::of(m);
                let size = word(m, IN_HEADER + 16).unwrap_or_default();
                let short = size.min(u32::try_from(bytes).unwrap_or(u32::MAX));
                copy.put(IN_HEADER + 16, short);
                if opcode == 16 {
                    // A write's data follows its 40-byte argument.
                    let len = (IN_HEADER + 40 + short as usize).min(copy.len);
                    copy.len = len;
                    copy.put(0, len as u32);
                }
                bench.pass(unique);
                later.serve(copy.bytes());
                true
            }
            Action::LoseLease => {
                if let Some(ino) = target {
                    let effects = self.fs.fault_break(ino);
                    self.waits.lock().deliver(effects, &self.fs);
                }
                false
            }
            Action::Crash => {
                // The power goes before the request is carried out: the
                // caller sees it fail as a dying machine's last call would.
                match self.fs.power_cut(false) {
                    Ok(cut) => after_cut(&self.fs, &self.waits, cut, || {}),
                    Err(why) => error!(op = req.op, "the rule's power cut was refused: {why}"),
                }
                let _ = answer.send(&fail(libc::EIO));
                true
            }
        }
    }
}
