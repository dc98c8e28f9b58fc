//! Thin adapter from `fuser::Filesystem` to the [`Fs`] core.
//!
//! Each handler decodes the request, calls the core, and replies. All fuser
//! types stay in this module (its API churns between releases): the
//! handlers here, the kernel cache timeouts in `ttls.rs`, parked replies in
//! `waits.rs`. A panic in the
//! core is caught here: the request is answered with `EIO` and the mount stays
//! up.

mod convert;
mod faults;
pub mod fusermount;
mod intercept;
mod locks;
mod ring;
pub mod serving;
pub mod session;
mod ttls;
pub mod uring;
mod waits;
pub mod workers;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, PollEvents, PollFlags, PollNotifier, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use tracing::{debug, error, warn};

use crate::error::Error;
use crate::fs::{Caller, Fs, Handle, SetAttr, SetTime, WriteOpts};
use crate::fuse::session::{Intercept, Notices, TmpfileReply, TmpfileRequest};
use crate::fuse::uring::TransportReport;
use crate::lease::{Effect, LockKind, Mode, Outcome, Owner, Range, Request as LockRequest, WaitId};
use crate::namespace::{Attr, Ino, Kind};
use convert::*;
pub use intercept::Interceptor;
use locks::*;
use ttls::*;
use waits::*;

/// How long the lease timer sleeps when it has no deadline and nobody
/// wakes it (a safety net: every change that needs it wakes it).
const TIMER_IDLE: Duration = Duration::from_secs(1);
/// How many interrupts for not-yet-parked requests are remembered.
const EARLY_INTERRUPTS: usize = 256;

/// Largest write the kernel may send in one request (the kernel's default
/// page limit per request, 256 pages).
pub const MAX_WRITE: u32 = 1024 * 1024;

thread_local! {
    /// Each session or handler thread's buffer for file reads, kept from
    /// read to read (see [`Fs::read_into`]).
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Descriptors flushed and not yet released, by inode, with the time of
/// their last flush, and their change.
type Closing = (Mutex<HashMap<u64, Vec<(u64, std::time::Instant)>>>, parking_lot::Condvar);

/// The `fuser::Filesystem` implementation.
pub struct LeaseFs {
    fs: Arc<Fs>,
    waits: Arc<Mutex<Waits>>,
    /// Under io_uring: descriptors flushed by a `close` whose `RELEASE`
    /// (which ends their `flock` locks) has not been served yet, by inode.
    closing: Arc<Closing>,
    /// Under io_uring: the thread that decides lock conflicts again once
    /// what may end them was served (started at the first one).
    settler: std::sync::OnceLock<std::sync::mpsc::Sender<Settle>>,
    /// Open regular files with direct I/O (kernel supports mmap with it).
    direct_io: bool,
    ttls: KernelTtls,
    /// The transport serving the mount.
    transport: Arc<TransportReport>,
}

impl std::fmt::Debug for LeaseFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseFs").finish_non_exhaustive()
    }
}

impl LeaseFs {
    /// Serve `fs` through the transport `transport` reports on; the
    /// interceptor goes to the request hook.
    pub fn new(fs: Arc<Fs>, transport: Arc<TransportReport>) -> (LeaseFs, Arc<Interceptor>) {
        let waits = Arc::new(Mutex::new(Waits::default()));
        let icpt = Arc::new(Interceptor { fs: fs.clone(), waits: waits.clone() });
        let ttls = KernelTtls { cache_names: fs.names_cached(), shared: fs.is_shared() };
        let closing = Arc::default();
        (LeaseFs { fs, waits, closing, settler: Default::default(), direct_io: false, ttls, transport }, icpt)
    }

    /// `fsync`/`fsyncdir`: flush every pending change (one group commit).
    /// Answered when the journal sync is done, from the group-commit
    /// thread: other requests are served meanwhile.
    fn sync(&self, op: &'static str, ino: Ino, fh: Handle, datasync: bool, reply: ReplyEmpty) {
        guarded(op, || {
            if let Err(e) = self.fs.power_synced(ino, fh, datasync) {
                return reply.error(refuse(op, e));
            }
            // Not once a fault rule may name fsync: the kernel would never
            // send another (see `Bench::may_skip_sync`).
            if self.fs.nothing_to_sync() && self.fs.bench().may_skip_sync() {
                // The kernel takes ENOSYS as "fsync needs no request" and
                // answers every later `fsync` (`fsyncdir`) of the mount
                // with success itself, after writing back dirty pages as
                // always: a `--volatile` mount's `msync` loop or SQLite
                // commits cost no round trip for a sync that does nothing.
                return reply.error(Errno::from_i32(libc::ENOSYS));
            }
            self.fs.sync_then(Box::new(move |r| match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(refuse(op, e)),
            }))
        });
    }

    /// Send the entry drops that keep the kernel's references to files
    /// bounded (after the reply that gave the kernel a new one).
    fn drop_entries(&self) {
        send_entry_drops(&self.fs, &self.waits.lock());
    }

    /// Answer a request that replaced file content only after the kernel
    /// dropped its cached pages of those files.
    fn reply_after_invalidation(&self, reply: ReplyEmpty) {
        self.answer_after_invalidation(move || reply.ok());
    }

    /// Run `answer` once the kernel dropped its cached pages of the files
    /// whose content changed behind its page cache (at once when none).
    fn answer_after_invalidation(&self, answer: impl FnOnce() + Send + 'static) {
        let mut inos = self.fs.take_invalidations();
        if inos.is_empty() {
            return answer();
        }
        let w = self.waits.lock();
        match (&w.notices, inos.pop()) {
            (Some(n), Some(last)) => {
                for ino in inos {
                    n.inval_inode(ino.0, None);
                }
                n.inval_inode(last.0, Some(Box::new(answer)));
            }
            _ => answer(),
        }
    }

    /// The open flags of a regular file's new descriptor: through the page
    /// cache, kept across opens, where [`Fs::page_cache`] allows it;
    /// otherwise direct I/O (when the kernel keeps shared mappings working
    /// with it).
    fn file_open_flags(&self, ino: Ino, h: Handle) -> FopenFlags {
        if self.fs.page_cache(ino, h) {
            FopenFlags::FOPEN_KEEP_CACHE
        } else if self.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }
}

/// Refuse a request with `e`: the one place a refusal is logged (at
/// debug, with what the error carries: which epoch was held and which is
/// current for an `ESTALE`), counted by errno (`leasefs_refusals_total`)
/// and turned into the errno the process sees.
pub(super) fn refuse(op: &str, e: Error) -> Errno {
    debug!(op, errno = e.errno_name(), "refused: {e}");
    crate::control::count_refusal(e.errno_name());
    Errno::from_i32(e.errno())
}

fn guarded(op: &str, f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        error!(op, "handler panicked; request answered with EIO");
    }
}

impl fuser::Filesystem for LeaseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        // Readahead would fetch lease contents the process never asked for.
        let _ = config.set_max_readahead(MAX_WRITE);
        // Without these the kernel keeps locks to itself and the daemon would
        // never see a holder.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS) {
            error!("kernel lacks lock forwarding ({missing:?}); locks stay kernel-local");
        }
        // Regular files are opened with direct I/O so every read and write
        // reaches the daemon (observations, fencing, rename-over content);
        // this flag keeps shared mmap working (SQLite WAL's -shm).
        self.direct_io = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_ok();
        // The daemon clears suid/sgid on writes, truncates and fallocate
        // itself (`FUSE_WRITE_KILL_SUIDGID`, the caller's groups): with
        // this the kernel also marks inodes it found without privileges to
        // kill (`SB_NOSEC`) and stops asking for `security.capability`
        // before every write (two requests per page in a shared-mapping
        // loop). It still removes file capabilities itself
        // (compat::writes_truncates_and_chowns_remove_file_capabilities).
        let _ = config.add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        // Without this the kernel sends one lookup (or readdir) at a time
        // per directory: on a shared mount each waits for etcd, and every
        // path walk looks up names in the root.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // The kernel offers io_uring only when its fuse module may use it.
        // Accepting it is a promise: the kernel holds every request until
        // the daemon has registered its queues, so it is accepted only when
        // asked for and io_uring works for this process.
        let offered = config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING);
        if self.transport.accept(offered) {
            let _ = config.add_capabilities(InitFlags::FUSE_OVER_IO_URING);
        }
        self.waits.lock().direct_io = self.direct_io;
        if !self.direct_io {
            warn!("kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: file reads may be served from the page cache");
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        guarded("lookup", || match self.fs.lookup(Ino(parent.0), name, caller(req)) {
            // A young file, or the source of a rename over a live lease
            // (the kernel is about to move this entry to the lease's name).
            Ok((a, false)) => reply.entry_with_ttls(self.ttls.attr(&a), &Duration::ZERO, &attr(&a), Generation(0)),
            Ok((a, true)) => self.ttls.reply_entry(reply, &a, self.fs.entry_budget()),
            // "No such name" may be cached (node id 0): every name of this
            // mount is created through this kernel, whose create, link,
            // rename and mknod replace the negative entry. Programs that probe
            // for files that rarely exist (SQLite's -journal and -wal) then
            // cost one round trip per NEGATIVE_TTL, not one per probe.
            Err(Error::NotFound) if !crate::control::is_control(Ino(parent.0)) => {
                let mut none = attr(&Attr::absent());
                none.ino = INodeNo(0);
                let negative = self.ttls.negative();
                reply.entry_with_ttls(&Duration::ZERO, negative, &none, Generation(0));
            }
            Err(e) => reply.error(refuse("lookup", e)),
        });
        self.drop_entries();
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        guarded("forget", || self.fs.forget(Ino(ino.0), nlookup));
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        guarded("getattr", || match self.fs.getattr(Ino(ino.0), req.pid()) {
            Ok(a) => reply.attr(self.ttls.attr(&a), &attr(&a)),
            Err(e) => reply.error(refuse("getattr", e)),
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        guarded("setattr", || {
            let set = SetAttr {
                mode,
                uid,
                gid,
                size,
                atime: set_time(atime),
                mtime: set_time(mtime),
                ctime,
                handle: fh.map(|h| Handle(h.0)),
            };
            match self.fs.setattr(Ino(ino.0), &set, caller(req)) {
                Ok(a) => reply.attr(self.ttls.attr(&a), &attr(&a)),
                Err(e) => reply.error(refuse("setattr", e)),
            }
        });
        // A directory that not everyone may search any more: the names the
        // kernel kept in it go (a shared namespace, see `Fs::lookup`).
        self.drop_entries();
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        guarded("readlink", || match self.fs.readlink(Ino(ino.0)) {
            Ok(t) => reply.data(std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str())),
            Err(e) => reply.error(refuse("readlink", e)),
        });
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        guarded("mknod", || match self.fs.mknod(caller(req), Ino(parent.0), name, mode, umask, rdev) {
            Ok(a) => self.ttls.reply_made(reply, &a),
            Err(e) => reply.error(refuse("mknod", e)),
        });
        self.drop_entries();
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        guarded("mkdir", || match self.fs.mkdir(caller(req), Ino(parent.0), name, mode, umask) {
            Ok(a) => self.ttls.reply_made(reply, &a),
            Err(e) => reply.error(refuse("mkdir", e)),
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        guarded("unlink", || match self.fs.unlink(Ino(parent.0), name, caller(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(refuse("unlink", e)),
        });
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        guarded("rmdir", || match self.fs.rmdir(Ino(parent.0), name, caller(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(refuse("rmdir", e)),
        });
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        guarded("symlink", || match self.fs.symlink(caller(req), Ino(parent.0), link_name, target.as_os_str()) {
            Ok(a) => self.ttls.reply_made(reply, &a),
            Err(e) => reply.error(refuse("symlink", e)),
        });
        self.drop_entries();
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        guarded("rename", || {
            match self.fs.rename(Ino(parent.0), name, Ino(newparent.0), newname, flags.bits(), caller(req)) {
                Ok(()) => self.reply_after_invalidation(reply),
                Err(e) => reply.error(refuse("rename", e)),
            }
        });
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        guarded("link", || match self.fs.link(Ino(ino.0), Ino(newparent.0), newname, caller(req)) {
            Ok(a) => self.ttls.reply_made(reply, &a),
            Err(e) => reply.error(refuse("link", e)),
        });
        self.drop_entries();
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        guarded("open", || {
            match self.fs.open(Ino(ino.0), flags.0, caller(req)) {
                // The event stream has no offsets.
                Ok(h) if Fs::is_events(Ino(ino.0)) => {
                    reply.opened(FileHandle(h.0), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NONSEEKABLE)
                }
                // Control files have no size: their reads must reach the daemon.
                Ok(h) if crate::control::is_control(Ino(ino.0)) => {
                    reply.opened(FileHandle(h.0), FopenFlags::FOPEN_DIRECT_IO)
                }
                Ok(h) => reply.opened(FileHandle(h.0), self.file_open_flags(Ino(ino.0), h)),
                Err(e) => reply.error(refuse("open", e)),
            }
        });
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if Fs::is_events(Ino(ino.0)) {
            return guarded("events read", || {
                let unique = req.unique().0;
                let nonblock = flags.0 & libc::O_NONBLOCK != 0;
                let mut w = self.waits.lock();
                if w.take_early(unique) {
                    return reply.error(refuse("events read", Error::Interrupted));
                }
                match self.fs.events_read(Handle(fh.0), size, nonblock, unique) {
                    Ok(crate::events::Read::Data(d)) => reply.data(&d),
                    // A reader signalled as its read was delivered is
                    // interrupted (see `signalled_unseen`).
                    Ok(crate::events::Read::Parked)
                        if signalled_unseen(&self.transport, req.pid()) && self.fs.events_interrupt(unique) =>
                    {
                        reply.error(refuse("events read", Error::Interrupted))
                    }
                    Ok(crate::events::Read::Parked) => {
                        w.parked_reads.insert(unique, reply);
                    }
                    Err(e) => reply.error(refuse("events read", e)),
                }
            });
        }
        guarded("read", || {
            READ_BUF.with_borrow_mut(|buf| {
                match self.fs.read_into(Ino(ino.0), Handle(fh.0), offset, size, req.pid(), buf) {
                    Ok(()) => reply.data(buf),
                    Err(e) => reply.error(refuse("read", e)),
                }
                // A buffer grown past the largest read the kernel sends
                // (a listing, say) is not kept.
                if buf.capacity() > 2 * MAX_WRITE as usize {
                    *buf = Vec::new();
                }
            })
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if Fs::is_filtered(Ino(ino.0)) {
            let filter = |h, data| {
                if Fs::is_events(Ino(ino.0)) {
                    self.fs.events_filter(h, data)
                } else {
                    self.fs.listing_filter(h, offset, data)
                }
            };
            return guarded("control filter", || match filter(Handle(fh.0), data) {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(refuse("control filter", e)),
            });
        }
        if crate::control::ControlFile::by_ino(Ino(ino.0)) == Some(crate::control::ControlFile::Faults) {
            return guarded("faults write", || match self.fs.faults_write(Handle(fh.0), data, caller(req)) {
                Ok((n, None)) => reply.written(n),
                Ok((n, Some(cut))) => faults::after_cut(&self.fs, &self.waits, cut, move || reply.written(n)),
                Err(e) => reply.error(refuse("faults write", e)),
            });
        }
        if crate::control::is_control(Ino(ino.0)) {
            return guarded("control write", || match self.fs.control_write(Ino(ino.0), data, caller(req)) {
                Ok((n, effects)) => {
                    reply.written(n);
                    self.waits.lock().deliver(effects, &self.fs);
                }
                Err(e) => reply.error(refuse("control write", e)),
            });
        }
        let how = WriteOpts {
            tid: req.pid(),
            append: flags.0 & libc::O_APPEND != 0,
            kill_suidgid: write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID),
            gid: req.gid(),
            uid: req.uid(),
            writeback: write_flags.contains(WriteFlags::FUSE_WRITE_CACHE),
        };
        guarded("write", || match self.fs.write(Ino(ino.0), Handle(fh.0), offset, data, how) {
            Ok(n) => self.answer_after_invalidation(move || reply.written(n)),
            Err(e) => reply.error(refuse("write", e)),
        });
    }

    fn flush(&self, _req: &Request, ino: INodeNo, fh: FileHandle, lock_owner: LockOwner, reply: ReplyEmpty) {
        guarded("flush", || {
            let effects = self.fs.flush(Ino(ino.0), Owner(lock_owner.0));
            if self.transport.is_uring() {
                let now = std::time::Instant::now();
                let mut g = self.closing.0.lock();
                let v = g.entry(ino.0).or_default();
                v.retain(|(f, at)| *f != fh.0 && now < *at + RELEASE_GRACE);
                v.push((fh.0, now));
            }
            reply.ok();
            self.waits.lock().deliver(effects, &self.fs);
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        guarded("release", || match self.fs.release(Handle(fh.0), lock_owner.map(|o| Owner(o.0))) {
            Ok(effects) => {
                reply.ok();
                self.waits.lock().deliver(effects, &self.fs);
                self.closed(ino.0, fh.0);
            }
            Err(e) => {
                reply.error(refuse("release", e));
                self.closed(ino.0, fh.0);
            }
        });
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.sync("fsync", Ino(ino.0), Handle(fh.0), datasync, reply);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        guarded("opendir", || match self.fs.open(Ino(ino.0), flags.0, caller(req)) {
            Ok(h) => reply.opened(FileHandle(h.0), FopenFlags::empty()),
            Err(e) => reply.error(refuse("opendir", e)),
        });
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        guarded("readdir", || match self.fs.readdir(Ino(ino.0), offset, 512) {
            Ok(entries) => {
                for e in entries {
                    if reply.add(INodeNo(e.ino.0), e.cookie, kind(e.kind), &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(refuse("readdir", e)),
        });
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        guarded("releasedir", || match self.fs.release(Handle(fh.0), None) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(refuse("releasedir", e)),
        });
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        self.sync("fsyncdir", Ino(ino.0), Handle(fh.0), datasync, reply);
    }

    fn destroy(&mut self) {
        self.fs.shutdown();
    }

    /// `access(2)` and `chdir(2)`: asked only of a mount without
    /// `default_permissions` (a shared namespace), where the daemon checks.
    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        guarded("access", || match self.fs.access(Ino(ino.0), mask.bits(), caller(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(refuse("access", e)),
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        guarded("statfs", || {
            let s = self.fs.statfs();
            reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize);
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        guarded("setxattr", || match self.fs.setxattr(Ino(ino.0), name, value, flags, caller(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(refuse("setxattr", e)),
        });
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        guarded("getxattr", || reply_xattr("getxattr", self.fs.getxattr(Ino(ino.0), name, caller(req)), size, reply));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        guarded("listxattr", || reply_xattr("listxattr", self.fs.listxattr(Ino(ino.0)), size, reply));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        guarded("removexattr", || match self.fs.removexattr(Ino(ino.0), name, caller(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(refuse("removexattr", e)),
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        guarded("create", || match self.fs.create(caller(req), Ino(parent.0), name, mode, umask, flags) {
            Ok((a, h)) => {
                let flags = self.file_open_flags(a.ino, h);
                reply.created_with_ttls(
                    self.ttls.attr(&a),
                    &self.ttls.made_entry(&a),
                    &attr(&a),
                    Generation(0),
                    FileHandle(h.0),
                    flags,
                )
            }
            Err(e) => reply.error(refuse("create", e)),
        });
        self.drop_entries();
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        self.serve_getlk(lock_call(req, ino, fh, lock_owner, start, end, typ, pid), reply);
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        self.serve_setlk(lock_call(req, ino, fh, lock_owner, start, end, typ, pid), sleep, reply);
    }

    fn poll(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        ph: PollNotifier,
        _events: PollEvents,
        flags: PollFlags,
        reply: ReplyPoll,
    ) {
        guarded("poll", || {
            if !Fs::is_events(Ino(ino.0)) {
                // Files and directories are always ready, as on any disk filesystem.
                let all = PollEvents::POLLIN | PollEvents::POLLOUT | PollEvents::POLLRDNORM | PollEvents::POLLWRNORM;
                return reply.poll(all);
            }
            let mut w = self.waits.lock();
            let kh = ph.handle().0;
            let schedule = flags.contains(PollFlags::FUSE_POLL_SCHEDULE_NOTIFY);
            match self.fs.events_poll(Handle(fh.0), schedule.then_some(kh)) {
                Ok(true) => reply.poll(PollEvents::POLLIN | PollEvents::POLLRDNORM | PollEvents::POLLOUT),
                Ok(false) => {
                    if schedule {
                        w.polls.insert(kh, ph);
                    }
                    reply.poll(PollEvents::POLLOUT)
                }
                Err(e) => reply.error(refuse("poll", e)),
            }
        });
    }

    fn lseek(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        guarded("lseek", || match self.fs.lseek(Ino(ino.0), offset, whence) {
            Ok(off) => reply.offset(off as i64),
            Err(e) => reply.error(refuse("lseek", e)),
        });
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        guarded("fallocate", || match self.fs.fallocate(Ino(ino.0), offset, length, mode, caller(req)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(refuse("fallocate", e)),
        });
    }
}
