//! Mounting, the request hook, and the session loop.
//!
//! The daemon opens `/dev/fuse` and mounts it itself, then runs fuser's
//! session on the device. A request hook (a small patch to fuser, see
//! `vendor/fuser/LEASEFS-PATCH.md`) sees every raw request first, which lets
//! the daemon see what stock fuser hides: FUSE_INTERRUPT (fuser answers it
//! with ENOSYS, after which the kernel never interrupts again and a process
//! blocked in a lock wait cannot be killed) and the raw lock flags of lock
//! requests (a `flock` and a whole-file POSIX lock otherwise look alike).
//!
//! Every `unsafe` block, here and elsewhere, carries a `SAFETY:` comment
//! (clippy's `undocumented_unsafe_blocks` is part of the lint policy).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;

use tracing::{debug, info, warn};

/// Opcode of FUSE_INTERRUPT.
const FUSE_INTERRUPT: u32 = 36;
/// Size of `fuse_in_header`.
pub(super) const IN_HEADER: usize = 40;

/// What a mount needs from the command line.
#[derive(Debug, Clone, Default)]
pub struct MountOptions {
    /// Mount over a non-empty directory.
    pub nonempty: bool,
    /// Let other users use the mount (`allow_other`).
    pub allow_other: bool,
    /// The mount's source as `/proc/mounts` shows it (the fstab source, so
    /// `mount -a` recognises the mount); empty: [`DEFAULT_SOURCE`].
    pub source: String,
    /// Run request handlers on this pool instead of the session thread.
    pub handlers: Option<super::workers::Workers>,
    /// Let the kernel check permissions (`default_permissions`); false when
    /// the filesystem checks them (`Fs::checks_access`).
    pub kernel_permissions: bool,
    /// The transport asked for (`--transport`).
    pub transport: super::uring::Transport,
    /// Where the transport in use is reported (`Fs::transport`).
    pub report: Arc<super::uring::TransportReport>,
}

/// The source of a mount made without one.
pub const DEFAULT_SOURCE: &str = "leasefs";

pub use super::fusermount::MountError;

/// Opcodes of lock requests (GETLK, SETLK, SETLKW).
const FUSE_GETLK: u32 = 31;
const FUSE_SETLKW: u32 = 33;
/// Offset of `fuse_lk_in.lk_flags` in a lock request.
const LK_FLAGS_AT: usize = IN_HEADER + 40;
/// Opcode of FUSE_TMPFILE (`open(O_TMPFILE)`), which fuser 0.18 does not
/// know (it would answer ENOSYS and the kernel would stop asking).
const FUSE_TMPFILE: u32 = 51;
/// Size of `fuse_create_in`.
const CREATE_IN: usize = 16;
/// `FOPEN_DIRECT_IO`.
const FOPEN_DIRECT_IO: u32 = 1;
/// `FUSE_NOTIFY_INVAL_INODE`.
const NOTIFY_INVAL_INODE: i32 = 2;
/// `FUSE_NOTIFY_INVAL_ENTRY`.
const NOTIFY_INVAL_ENTRY: i32 = 3;

/// What the request hook reports to the filesystem.
pub trait Intercept: Send + Sync {
    /// FUSE_INTERRUPT for the request with this unique id.
    fn interrupt(&self, unique: u64);
    /// A lock request is about to be dispatched, with its raw `lk_flags`.
    fn lock_request(&self, unique: u64, lk_flags: u32);
    /// The channel for kernel notifications is ready.
    fn attach(&self, notices: Notices);
    /// `open(O_TMPFILE)` in a directory: a new open file without a name,
    /// or the errno to answer.
    fn tmpfile(&self, req: TmpfileRequest) -> Result<TmpfileReply, i32>;
    /// The test bench's door: whether a fault rule consumed the request
    /// (answered it, or holds it to answer or serve later).
    fn door(&self, msg: &[u8], answer: &fuser::RawReply<'_>) -> bool;
    /// Whether a request is answered on the thread that received it,
    /// although handlers run on a pool ([`MountOptions::handlers`]): one
    /// that never waits.
    fn inline(&self, _msg: &[u8]) -> bool {
        false
    }
}

/// Opcode of FUSE_GETATTR.
pub(super) const FUSE_GETATTR: u32 = 3;
/// Opcode of FUSE_GETXATTR.
pub(super) const FUSE_GETXATTR: u32 = 22;
/// Size of `fuse_getxattr_in`, which the name follows.
pub(super) const GETXATTR_IN: usize = 8;

/// A decoded FUSE_TMPFILE request.
#[derive(Debug, Clone, Copy)]
pub struct TmpfileRequest {
    pub parent: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// `open(2)` flags.
    pub flags: u32,
    pub mode: u32,
    pub umask: u32,
}

/// What FUSE_TMPFILE answers: the new inode and its open handle.
#[derive(Debug, Clone, Copy)]
pub struct TmpfileReply {
    pub attr: crate::namespace::Attr,
    pub fh: u64,
    pub direct_io: bool,
}

fn split_time(t: std::time::SystemTime) -> (u64, u32) {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => (d.as_secs(), d.subsec_nanos()),
        Err(_) => (0, 0),
    }
}

/// `fuse_out_header` + `fuse_entry_out` (zero timeouts, as every entry of
/// leasefs) + `fuse_open_out`.
fn encode_create_reply(unique: u64, r: &TmpfileReply) -> Vec<u8> {
    use crate::namespace::Kind;
    let a = &r.attr;
    let fmt = match a.kind {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDev => libc::S_IFCHR,
        Kind::BlockDev => libc::S_IFBLK,
    };
    let mut m = Vec::with_capacity(16 + 128 + 16);
    let len: u32 = 16 + 128 + 16;
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&0i32.to_ne_bytes());
    m.extend_from_slice(&unique.to_ne_bytes());
    // fuse_entry_out
    m.extend_from_slice(&a.ino.0.to_ne_bytes()); // nodeid
    m.extend_from_slice(&0u64.to_ne_bytes()); // generation
    m.extend_from_slice(&0u64.to_ne_bytes()); // entry_valid
    m.extend_from_slice(&0u64.to_ne_bytes()); // attr_valid
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // fuse_attr
    let (at, atn) = split_time(a.atime);
    let (mt, mtn) = split_time(a.mtime);
    let (ct, ctn) = split_time(a.ctime);
    for v in [a.ino.0, a.size, a.blocks, at, mt, ct] {
        m.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [atn, mtn, ctn, fmt | u32::from(a.perm), a.nlink, a.uid, a.gid, a.rdev, 4096, 0] {
        m.extend_from_slice(&v.to_ne_bytes());
    }
    // fuse_open_out
    m.extend_from_slice(&r.fh.to_ne_bytes());
    m.extend_from_slice(&(if r.direct_io { FOPEN_DIRECT_IO } else { 0 }).to_ne_bytes());
    m.extend_from_slice(&0i32.to_ne_bytes());
    m
}

pub(super) fn encode_error_reply(unique: u64, errno: i32) -> Vec<u8> {
    let mut m = Vec::with_capacity(16);
    m.extend_from_slice(&16u32.to_ne_bytes());
    m.extend_from_slice(&(-errno).to_ne_bytes());
    m.extend_from_slice(&unique.to_ne_bytes());
    m
}

/// What the notifier thread does next.
enum Notice {
    /// Drop the kernel's cached pages and attributes of an inode, then run
    /// the continuation (if any).
    InvalInode(u64, Option<Box<dyn FnOnce() + Send>>),
}

/// Sends invalidation notices to the kernel from a thread of its own, never
/// from inside a request handler (the kernel may wait on pages that a
/// pending request holds, and only the session thread can answer it).
///
/// Entries are dropped by a second thread: the kernel takes the directory's
/// lock to drop one, and a rename or unlink holding that lock may be
/// waiting for its answer behind an inode notice.
#[derive(Clone)]
pub struct Notices {
    tx: std::sync::mpsc::Sender<Notice>,
    entries: std::sync::mpsc::SyncSender<Vec<(u64, OsString)>>,
}

/// Batches of entry drops queued for the kernel at most; more are skipped
/// (the kernel then keeps more inodes than the bound, until the next).
const ENTRY_DROPS_QUEUED: usize = 64;

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notices")
    }
}

impl Notices {
    fn start(dev: Arc<OwnedFd>) -> io::Result<Notices> {
        let drop_dev = dev.clone();
        let (tx, rx) = std::sync::mpsc::channel::<Notice>();
        thread::Builder::new().name("fuse-notify".into()).spawn(move || {
            for notice in rx {
                let Notice::InvalInode(ino, then) = notice;
                let mut msg = Vec::with_capacity(40);
                msg.extend_from_slice(&40u32.to_ne_bytes());
                msg.extend_from_slice(&NOTIFY_INVAL_INODE.to_ne_bytes());
                msg.extend_from_slice(&0u64.to_ne_bytes());
                msg.extend_from_slice(&ino.to_ne_bytes());
                msg.extend_from_slice(&0i64.to_ne_bytes());
                msg.extend_from_slice(&0i64.to_ne_bytes());
                if let Err(e) = write_all(dev.as_raw_fd(), &msg) {
                    // ENOENT: the kernel no longer has the inode; nothing cached.
                    if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) {
                        warn!(ino, "invalidation notice failed: {e}");
                    }
                }
                if let Some(then) = then {
                    then();
                }
            }
        })?;
        let (entries, rx) = std::sync::mpsc::sync_channel::<Vec<(u64, OsString)>>(ENTRY_DROPS_QUEUED);
        thread::Builder::new().name("fuse-drop".into()).spawn(move || {
            for (parent, name) in rx.into_iter().flatten() {
                let name = name.as_bytes();
                let len = 16 + 16 + name.len() + 1;
                let mut msg = Vec::with_capacity(len);
                msg.extend_from_slice(&(len as u32).to_ne_bytes());
                msg.extend_from_slice(&NOTIFY_INVAL_ENTRY.to_ne_bytes());
                msg.extend_from_slice(&0u64.to_ne_bytes());
                msg.extend_from_slice(&parent.to_ne_bytes());
                msg.extend_from_slice(&(name.len() as u32).to_ne_bytes());
                msg.extend_from_slice(&0u32.to_ne_bytes());
                msg.extend_from_slice(name);
                msg.push(0);
                if let Err(e) = write_all(drop_dev.as_raw_fd(), &msg) {
                    // ENOENT: the kernel has no such entry (any more).
                    if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENODEV)) {
                        warn!(parent, "entry invalidation failed: {e}");
                    }
                }
            }
        })?;
        Ok(Notices { tx, entries })
    }

    /// Ask the kernel to drop the entries (`name` in `parent`), and the
    /// inodes with them when nothing uses them. Skipped when the queue is
    /// full.
    pub fn drop_entries(&self, entries: Vec<(u64, OsString)>) {
        let _ = self.entries.try_send(entries);
    }

    /// Drop the kernel's cached pages and attributes of an inode, then run
    /// `then` (e.g. answer the request that changed the content, so the
    /// caller cannot read stale pages after it returns).
    pub fn inval_inode(&self, ino: u64, then: Option<Box<dyn FnOnce() + Send>>) {
        if let Err(std::sync::mpsc::SendError(Notice::InvalInode(_, Some(then)))) =
            self.tx.send(Notice::InvalInode(ino, then))
        {
            then();
        }
    }
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// One entry of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    /// The device number, `major:minor`, as mountinfo writes it.
    pub dev: String,
    pub fstype: String,
    pub source: String,
}

fn unescape(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from_vec(out)
}

/// The kernel reads ahead of a sequential reader at most the smaller of
/// what INIT offered (`max_readahead`, 1 MiB) and the mount's backing
/// device setting, which starts at 128 KiB: raise that to 1 MiB, so a
/// cold sequential read of a file served through the page cache takes one
/// request per MiB instead of eight. Only root may; others keep 128 KiB.
fn widen_readahead(path: &Path) {
    let Some(m) = find_mount(path) else { return };
    let knob = format!("/sys/class/bdi/{}/read_ahead_kb", m.dev);
    if let Err(e) = std::fs::write(&knob, format!("{}", crate::fuse::MAX_WRITE / 1024)) {
        debug!(knob, "readahead left at the kernel's default: {e}");
    }
}

/// The mounts of this process's namespace.
pub fn mounts() -> Vec<MountEntry> {
    let Ok(text) = crate::procfs::mountinfo() else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(MountEntry {
                mount_point: PathBuf::from(unescape(f.get(4)?)),
                dev: (*f.get(2)?).to_string(),
                fstype: (*f.get(sep + 1)?).to_string(),
                source: unescape(f.get(sep + 2)?).to_string_lossy().into_owned(),
            })
        })
        .collect()
}

/// The leasefs mount at `path`, if any (the last one mounted there wins).
pub fn find_mount(path: &Path) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.mount_point == path && m.fstype == "fuse.leasefs")
}

/// The pid of the daemon serving the leasefs mount at `path`, from its
/// `.leasefs/status` (none when the daemon does not answer).
pub fn daemon_pid(path: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(path.join(crate::control::DIR_NAME).join("status")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["pid"].as_i64().and_then(|p| i32::try_from(p).ok())
}

/// An absolute path without resolving the last component through a possibly
/// dead mount.
pub fn absolute(p: &Path) -> io::Result<PathBuf> {
    let abs = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir()?.join(p) };
    let name = abs.file_name().map(OsStr::to_os_string);
    match (abs.parent(), name) {
        (Some(parent), Some(name)) => Ok(std::fs::canonicalize(parent)?.join(name)),
        _ => Ok(abs),
    }
}

/// Whether `e`, from a request on a mount, says its daemon is gone:
/// `ENOTCONN`, or `ECONNABORTED` or `ECANCELED`, which the kernel answers
/// for a moment after a daemon that served through io_uring died (while it
/// tears the rings down) before it answers `ENOTCONN`.
pub fn daemon_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED))
}

/// Check the mount point and mount `/dev/fuse` on it. Returns the device fd.
pub fn mount(mountpoint: &Path, opts: &MountOptions) -> Result<(OwnedFd, PathBuf), MountError> {
    let show = mountpoint.display();
    let meta = std::fs::metadata(mountpoint).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => MountError(format!("{show}: no such directory")),
        _ if daemon_gone(&e) => MountError(format!(
            "{show}: a dead leasefs daemon's mount is still there (Transport endpoint is not connected); \
             run `leasefs unmount {show}` first"
        )),
        _ => MountError(format!("{show}: {e}")),
    })?;
    if !meta.is_dir() {
        return Err(MountError(format!("{show}: not a directory")));
    }
    let path = std::fs::canonicalize(mountpoint).map_err(|e| MountError(format!("{show}: {e}")))?;
    if mounts().iter().any(|m| m.mount_point == path) {
        return Err(MountError(format!("{show}: already a mount point")));
    }
    if !opts.nonempty {
        let mut rd = std::fs::read_dir(&path).map_err(|e| MountError(format!("{show}: {e}")))?;
        if rd.next().is_some() {
            return Err(MountError(format!("{show}: directory is not empty (pass --nonempty to mount over it)")));
        }
    }
    let source = if opts.source.is_empty() { DEFAULT_SOURCE } else { &opts.source };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Users mount through the setuid helper, which checks that they may.
        let mut o = format!("fsname={source},subtype=leasefs");
        if opts.kernel_permissions {
            o.push_str(",default_permissions");
        }
        if opts.allow_other {
            o.push_str(",allow_other");
        }
        return Ok((super::fusermount::mount(&path, &o)?, path));
    }
    let dev = std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").map_err(|e| {
        MountError(match e.raw_os_error() {
            Some(libc::ENOENT) => "no /dev/fuse: load the fuse module (modprobe fuse) or run where FUSE exists".into(),
            Some(libc::EACCES) | Some(libc::EPERM) => {
                "cannot open /dev/fuse: permission denied (run as root or join the fuse group)".into()
            }
            _ => format!("cannot open /dev/fuse: {e}"),
        })
    })?;
    let fd: OwnedFd = dev.into();
    // SAFETY: getuid/getgid/getpid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!("fd={},rootmode=40000,user_id={uid},group_id={gid}", fd.as_raw_fd());
    if opts.kernel_permissions {
        data.push_str(",default_permissions");
    }
    if opts.allow_other {
        data.push_str(",allow_other");
    }
    let source = CString::new(source).map_err(|_| MountError("the mount source contains a NUL byte".into()))?;
    let target = cstr(path.as_os_str()).map_err(|e| MountError(format!("{show}: {e}")))?;
    let fstype = CString::new("fuse.leasefs").expect("no NUL");
    let cdata = CString::new(data).expect("no NUL");
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            cdata.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = errno();
        return Err(MountError(match e.raw_os_error() {
            Some(libc::EPERM) => format!(
                "{show}: not permitted to mount (leasefs mounts /dev/fuse directly; run it as root \
                 or with CAP_SYS_ADMIN)"
            ),
            _ => format!("{show}: mount failed: {e}"),
        }));
    }
    Ok((fd, path))
}

/// Detach the mount at `path` (lazily if it is busy).
pub fn unmount(path: &Path, lazy: bool) -> io::Result<()> {
    let c = cstr(path.as_os_str())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        let e = errno();
        // SAFETY: geteuid has no preconditions.
        if e.raw_os_error() == Some(libc::EPERM) && unsafe { libc::geteuid() } != 0 {
            // A user's mount, made through fusermount3.
            return super::fusermount::unmount(path, lazy);
        }
        return Err(e);
    }
    Ok(())
}

fn write_all(fd: RawFd, buf: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: buf is a valid readable buffer of buf.len() bytes.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(());
        }
        let e = errno();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// The raw-request hook: FUSE_INTERRUPT goes to the filesystem (and is
/// consumed), lock requests report their raw `lk_flags` before dispatch,
/// FUSE_TMPFILE is served here (and answered on `dev`).
fn request_hook(hook: Arc<dyn Intercept>) -> fuser::RequestHook {
    Arc::new(move |msg: &[u8], answer: &fuser::RawReply| {
        if msg.len() < IN_HEADER {
            return false;
        }
        let opcode = u32::from_ne_bytes(msg[4..8].try_into().expect("4 bytes"));
        crate::control::count_request(opcode);
        if hook.door(msg, answer) {
            return true;
        }
        tracing::trace!(
            op = crate::control::opcode_name(opcode as usize).unwrap_or("?"),
            ino = u64::from_ne_bytes(msg[16..24].try_into().expect("8 bytes")),
            pid = u32::from_ne_bytes(msg[32..36].try_into().expect("4 bytes")),
            "request"
        );
        let word = |at: usize| u32::from_ne_bytes(msg[at..at + 4].try_into().expect("4 bytes"));
        if opcode == FUSE_TMPFILE && msg.len() >= IN_HEADER + CREATE_IN {
            let unique = u64::from_ne_bytes(msg[8..16].try_into().expect("8 bytes"));
            let req = TmpfileRequest {
                parent: u64::from_ne_bytes(msg[16..24].try_into().expect("8 bytes")),
                uid: word(24),
                gid: word(28),
                pid: word(32),
                flags: word(IN_HEADER),
                mode: word(IN_HEADER + 4),
                umask: word(IN_HEADER + 8),
            };
            let reply = match hook.tmpfile(req) {
                Ok(r) => encode_create_reply(unique, &r),
                Err(e) => encode_error_reply(unique, e),
            };
            if let Err(e) = answer.send(&reply) {
                warn!(unique, "tmpfile reply failed: {e}");
            }
            return true;
        }
        if opcode == FUSE_INTERRUPT && msg.len() >= IN_HEADER + 8 {
            let target = u64::from_ne_bytes(msg[IN_HEADER..IN_HEADER + 8].try_into().expect("8 bytes"));
            hook.interrupt(target);
            return true;
        }
        if (FUSE_GETLK..=FUSE_SETLKW).contains(&opcode) && msg.len() >= LK_FLAGS_AT + 4 {
            let unique = u64::from_ne_bytes(msg[8..16].try_into().expect("8 bytes"));
            let flags = u32::from_ne_bytes(msg[LK_FLAGS_AT..LK_FLAGS_AT + 4].try_into().expect("4 bytes"));
            hook.lock_request(unique, flags);
        }
        false
    })
}

/// Start the io_uring queues when the mount asks for them and the kernel
/// offered them at INIT; `None` when `/dev/fuse` serves everything (the
/// report says why). `Err` only for `--transport uring`.
fn start_transport(opts: &MountOptions, dev: &Arc<OwnedFd>) -> io::Result<Option<super::uring::Started>> {
    use super::uring::{self, Transport};
    if !opts.report.accepted() {
        let why = opts.report.why_not();
        if opts.transport == Transport::Uring {
            return Err(io::Error::other(why));
        }
        if opts.transport == Transport::Auto {
            info!("serving through /dev/fuse: {why}");
        }
        opts.report.set_dev(&why);
        return Ok(None);
    }
    // Accepted at INIT: the kernel holds requests until the queues are
    // registered, so a failure here cannot fall back to /dev/fuse.
    let started = uring::start(dev.clone(), PAYLOAD_BYTES, opts.report.clone())?;
    opts.report.set_queues(started.queues.clone());
    Ok(Some(started))
}

/// The payload buffer of an io_uring entry: the largest request or reply
/// (`max_write`, `max_pages`).
const PAYLOAD_BYTES: usize = super::MAX_WRITE as usize;

/// A live mount served by fuser.
pub struct Served<FS: fuser::Filesystem> {
    session: fuser::Session<FS>,
    /// The canonical mount point.
    pub path: PathBuf,
}

impl<FS: fuser::Filesystem> Served<FS> {
    /// Mount, install the request hook and complete the INIT handshake.
    /// When this returns the mount is live.
    pub fn start(fs: FS, mountpoint: &Path, opts: &MountOptions, hook: Arc<dyn Intercept>) -> Result<Self, MountError> {
        let (dev, path) = mount(mountpoint, opts)?;
        let dev = Arc::new(dev);
        let fail = |what: &str, e: io::Error| {
            let _ = unmount(&path, true);
            MountError(format!("{}: {what}: {e}", path.display()))
        };
        hook.attach(Notices::start(dev.clone()).map_err(|e| fail("starting the notifier", e))?);
        // SAFETY: dup of our own open fd; the copy is owned by the session.
        let fd = unsafe { libc::dup(dev.as_raw_fd()) };
        if fd < 0 {
            return Err(fail("dup /dev/fuse", errno()));
        }
        // SAFETY: fd is a fresh descriptor from dup.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut config = fuser::Config::default();
        config.acl = fuser::SessionACL::All;
        // One thread reads requests: per-inode lock requests must be
        // handled in arrival order (a handler pool keeps that order per
        // inode, see `workers`).
        config.n_threads = Some(1);
        let mut session =
            fuser::Session::from_fd(fs, sock, fuser::SessionACL::All, config).map_err(|e| fail("FUSE handshake", e))?;
        session.set_request_hook(request_hook(hook.clone()));
        if let Some(w) = opts.handlers.clone() {
            session.set_dispatcher(Arc::new(move |key, job| w.run(key, job).is_ok()));
            session.set_inline(Arc::new(move |msg| hook.inline(msg)));
        }
        if let Some(started) = start_transport(opts, &dev).map_err(|e| fail("FUSE-over-io_uring", e))? {
            started.queues.set_mountpoint(&path);
            session.set_request_server(Box::new(move |server| started.serve(server)));
        }
        widen_readahead(&path);
        info!(mountpoint = %path.display(), "mounted");
        Ok(Served { session, path })
    }

    /// A handle for sending invalidation notices to the kernel.
    pub fn notifier(&self) -> fuser::Notifier {
        self.session.notifier()
    }

    /// Serve requests until the mount goes away.
    pub fn run(self) {
        if let Err(e) = self.session.run() {
            debug!("session ended: {e}");
        }
        info!(mountpoint = %self.path.display(), "unmounted");
    }
}

/// Open a file for appending (used for log files).
pub fn open_append(p: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new().create(true).append(true).open(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errnos of a dead daemon's mount, including the ones io_uring's
    /// teardown answers for a moment, are told apart from other failures.
    #[test]
    fn a_gone_daemon_is_told_by_its_errnos() {
        for errno in [libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED] {
            assert!(daemon_gone(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [libc::ENOENT, libc::EIO, libc::EACCES] {
            assert!(!daemon_gone(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
    }
}
