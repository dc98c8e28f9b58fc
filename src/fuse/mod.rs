//! Thin adapter from `fuser::Filesystem` to the [`Fs`] core.
//!
//! Each handler decodes the request, calls the core, and replies. All fuser
//! types stay in this module (its API churns between releases): the
//! handlers here, the kernel cache timeouts in `ttls.rs`, parked replies in
//! `waits.rs`. A panic in the
//! core is caught here: the request is answered with `EIO` and the mount stays
//! up.

pub mod fusermount;
mod ring;
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
use crate::lease::{Effect, LockKind, Mode, Outcome, Owner, Range, Request as LockRequest, WaitId};
use crate::namespace::{Attr, Ino, Kind};
use ttls::*;
use waits::*;

/// `fuse_lk_in.lk_flags` bit marking a `flock(2)` request.
const FUSE_LK_FLOCK: u32 = 1;
/// How long the lease timer sleeps when it has no deadline and nobody
/// wakes it (a safety net: every change that needs it wakes it).
const TIMER_IDLE: Duration = Duration::from_secs(1);
/// How many interrupts for not-yet-parked requests are remembered.
const EARLY_INTERRUPTS: usize = 256;

/// The part of the filesystem the request hook calls into.
pub struct Interceptor {
    fs: Arc<Fs>,
    waits: Arc<Mutex<Waits>>,
}

impl Intercept for Interceptor {
    fn interrupt(&self, unique: u64) {
        let mut w = self.waits.lock();
        match self.fs.interrupt(WaitId(unique)) {
            Some(effects) => {
                debug!(unique, "lock wait interrupted by a signal");
                w.deliver(effects, &self.fs);
            }
            None if w.parked_reads.contains_key(&unique) && self.fs.events_interrupt(unique) => {
                debug!(unique, "event read interrupted by a signal");
                if let Some(r) = w.parked_reads.remove(&unique) {
                    r.error(refuse("events read", Error::Interrupted));
                }
            }
            None => {
                // Either not a lock wait (ignored: it completes on its own) or
                // not parked yet: remember it for when it arrives.
                if w.early.len() >= EARLY_INTERRUPTS {
                    w.early.pop_front();
                }
                w.early.push_back(unique);
            }
        }
    }

    fn lock_request(&self, unique: u64, lk_flags: u32) {
        self.waits.lock().lk_flags.insert(unique, lk_flags);
    }

    fn tmpfile(&self, r: TmpfileRequest) -> Result<TmpfileReply, i32> {
        let direct_io = self.waits.lock().direct_io;
        let caller = Caller { uid: r.uid, gid: r.gid, pid: r.pid };
        let guarded =
            catch_unwind(AssertUnwindSafe(|| self.fs.tmpfile(caller, Ino(r.parent), r.mode, r.umask, r.flags as i32)));
        match guarded {
            Ok(Ok((attr, h))) => Ok(TmpfileReply { attr, fh: h.0, direct_io }),
            Ok(Err(e)) => Err(refuse("tmpfile", e).code()),
            Err(_) => {
                error!(op = "tmpfile", "handler panicked; request answered with EIO");
                Err(libc::EIO)
            }
        }
    }

    fn attach(&self, notices: Notices) {
        self.waits.lock().notices = Some(notices);
        // Lease timers: a waiter on a lease whose TTL runs out is granted
        // without any other request arriving, and answers the authority
        // decided later are delivered. The timer sleeps to its next
        // deadline unless the authority wakes it; the thread ends with the
        // filesystem.
        let wake = self.fs.wake();
        let (fs, waits) = (Arc::downgrade(&self.fs), Arc::downgrade(&self.waits));
        let spawned = std::thread::Builder::new().name("lease-timer".into()).spawn(move || loop {
            let (Some(fs), Some(waits)) = (fs.upgrade(), waits.upgrade()) else {
                return;
            };
            let next = {
                // Without the `Waits` lock: a tick may ask etcd (answers
                // that come before their request is parked are kept).
                let (effects, next) = fs.tick();
                let mut w = waits.lock();
                send_entry_drops(&fs, &w);
                w.deliver(effects, &fs);
                w.deliver_events(&fs);
                next
            };
            drop((fs, waits));
            let nap = next.unwrap_or(TIMER_IDLE).clamp(Duration::from_millis(1), TIMER_IDLE);
            wake.sleep(nap);
        });
        if let Err(e) = spawned {
            error!("cannot start the lease timer: {e}");
        }
    }
}

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

/// How long after a descriptor's `FLUSH` a conflicting lock request waits
/// for its `RELEASE` (io_uring only, see `LeaseFs::settle`).
const RELEASE_GRACE: Duration = Duration::from_millis(100);

/// A lock request about to be refused for a conflict, to be decided again
/// (and answered) by the settler once the inode's pending releases and the
/// other queues were served.
struct Settle {
    ino: u64,
    decide: Box<dyn FnOnce() + Send>,
}

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
}

impl std::fmt::Debug for LeaseFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseFs").finish_non_exhaustive()
    }
}

impl LeaseFs {
    /// Serve `fs`; the interceptor goes to the request hook.
    pub fn new(fs: Arc<Fs>) -> (LeaseFs, Arc<Interceptor>) {
        let waits = Arc::new(Mutex::new(Waits::default()));
        let icpt = Arc::new(Interceptor { fs: fs.clone(), waits: waits.clone() });
        let ttls = KernelTtls { cache_names: fs.names_cached() };
        (LeaseFs { fs, waits, closing: Arc::default(), settler: Default::default(), direct_io: false, ttls }, icpt)
    }

    /// `fsync`/`fsyncdir`: flush every pending change (one group commit).
    /// Answered when the journal sync is done, from the group-commit
    /// thread: other requests are served meanwhile.
    fn sync(&self, op: &'static str, reply: ReplyEmpty) {
        guarded(op, || {
            if self.fs.nothing_to_sync() {
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

    #[allow(clippy::too_many_arguments)] // the fields of a FUSE lock request, passed on
    fn lock_request(
        &self,
        w: &mut Waits,
        unique: u64,
        fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
    ) -> Result<LockRequest, Error> {
        let flags = w.lk_flags.remove(&unique).unwrap_or(0);
        let mode = match typ {
            libc::F_RDLCK => Some(Mode::Shared),
            libc::F_WRLCK => Some(Mode::Exclusive),
            libc::F_UNLCK => None,
            _ => return Err(Error::Invalid),
        };
        if start > end {
            return Err(Error::Invalid);
        }
        Ok(LockRequest {
            owner: Owner(owner.0),
            kind: if flags & FUSE_LK_FLOCK != 0 { LockKind::Flock } else { LockKind::Posix },
            mode,
            range: Range { start, end },
            pid,
            handle: fh.0,
        })
    }

    /// A descriptor's `RELEASE` was served: its `close` is complete.
    fn closed(&self, ino: u64, fh: u64) {
        let (m, c) = &*self.closing;
        let mut g = m.lock();
        if let Some(v) = g.get_mut(&ino) {
            v.retain(|(f, _)| *f != fh);
            if v.is_empty() {
                g.remove(&ino);
            }
            c.notify_all();
        }
    }

    /// Under io_uring, a lock request about to be refused for a conflict on
    /// `ino` is not answered yet: `decide` (which decides it again and
    /// answers) runs on the settler thread once what may end the conflict
    /// was served. A `close` returns once its `FLUSH` is answered, but the
    /// `RELEASE` that ends its `flock` locks is queued on the closing CPU's
    /// queue and may not have been served when a process on another CPU
    /// asks for the lock. The settler waits for the inode's descriptors
    /// flushed and not released, each until `RELEASE_GRACE` after its
    /// flush (a descriptor closed while a duplicate from `dup` or `fork`
    /// stays open is released only at its last close, so past the grace
    /// its flush is forgotten), then for every queue to serve what the
    /// kernel handed it ([`Queues::settle`]). The queue threads never wait:
    /// the request holds its ring entry meanwhile, and the release it waits
    /// for is served on its own queue. Only under io_uring: on
    /// `/dev/fuse` requests are served in order.
    fn defer_conflict(&self, ino: u64, decide: Box<dyn FnOnce() + Send>) {
        self.fs.transport().note_conflict();
        let tx = self.settler.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Settle>();
            let (fs, closing) = (Arc::downgrade(&self.fs), self.closing.clone());
            let spawned = std::thread::Builder::new().name("lock-settle".into()).spawn(move || {
                while let Ok(first) = rx.recv() {
                    // Every request deferred before this round began is
                    // covered by it.
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    wait_for_releases(&closing, batch.iter().map(|s| s.ino));
                    if let Some(fs) = fs.upgrade() {
                        fs.transport().settle();
                    }
                    for s in batch {
                        guarded("settle", s.decide);
                    }
                }
            });
            if let Err(e) = spawned {
                error!("cannot start the lock settler: {e}");
            }
            tx
        });
        if let Err(std::sync::mpsc::SendError(s)) = tx.send(Settle { ino, decide }) {
            (s.decide)();
        }
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

fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() }
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

fn kind(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.crtime,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    })
}

/// Run a handler, turning a panic into an `EIO` reply (the reply object
/// answers `EIO` when it is dropped unanswered during unwinding).
/// Answer `F_GETLK` with the conflicting lock found, if any.
fn answer_getlk(result: Result<Option<crate::lease::Lock>, Error>, start: u64, end: u64, reply: ReplyLock) {
    match result {
        Ok(Some(l)) => {
            let typ = if l.mode == Mode::Exclusive { libc::F_WRLCK } else { libc::F_RDLCK };
            reply.locked(l.range.start, l.range.end, typ, l.pid);
        }
        Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
        Err(e) => reply.error(refuse("getlk", e)),
    }
}

/// Answer `F_SETLK`/`F_SETLKW`/`flock` with the lease core's decision:
/// granted, parked until granted, or refused.
#[allow(clippy::too_many_arguments)] // a lock request's decision and how to answer it
fn answer_setlk(
    fs: &Fs,
    waits: &Mutex<Waits>,
    ino: u64,
    lreq: LockRequest,
    pid: u32,
    unique: u64,
    answer: Result<(Outcome, Vec<Effect>), Error>,
    reply: ReplyEmpty,
) -> bool {
    let mut w = waits.lock();
    match answer {
        Ok((Outcome::Granted, effects)) => {
            debug!(path = %fs.describe(Ino(ino)), ino, pid, kind = ?lreq.kind, mode = ?lreq.mode, epoch = fs.epoch(Ino(ino)).0, "lock granted");
            // Hand the lock on before answering the releaser, as the
            // kernel's own lock code wakes waiters inside the unlock.
            w.deliver(effects, fs);
            reply.ok();
        }
        Ok((Outcome::Parked, effects)) => {
            debug!(path = %fs.describe(Ino(ino)), ino, pid, kind = ?lreq.kind, "lock wait parked");
            w.deliver(effects, fs);
            w.park(WaitId(unique), reply, fs);
            return true;
        }
        Ok((Outcome::Refused(e), effects)) => {
            reply.error(refuse("setlk", e));
            w.deliver(effects, fs);
        }
        Err(e) => reply.error(refuse("setlk", e)),
    }
    false
}

/// Under io_uring, whether the thread `tid` whose request was just
/// delivered was signalled before the kernel marked the request sent: the
/// kernel then never sends the `FUSE_INTERRUPT` (on `/dev/fuse` it does,
/// when the request is read), and a waiter killed or signalled in that
/// moment would wait, unkillable, until it is answered. A signal the
/// thread does not block is still pending while it waits in the kernel,
/// so the daemon answers `EINTR` as the interrupt would have made it.
/// Signals that come later arrive as `FUSE_INTERRUPT`.
fn signalled_unseen(fs: &Fs, tid: u32) -> bool {
    fs.transport().is_uring() && tid != 0 && crate::procfs::signal_pending(tid)
}

/// A parked lock wait of a thread [`signalled_unseen`]: ended with `EINTR`
/// as a `FUSE_INTERRUPT` would end it (nothing if it was answered since).
fn interrupt_parked(fs: &Fs, waits: &Mutex<Waits>, unique: u64) {
    let mut w = waits.lock();
    if let Some(effects) = fs.interrupt(WaitId(unique)) {
        debug!(unique, "lock wait of a thread signalled as it was delivered: interrupted");
        w.deliver(effects, fs);
    }
}

/// Wait until no descriptor of `inos` is flushed and not released, each
/// flush for at most `RELEASE_GRACE` after it (see
/// `LeaseFs::defer_conflict`); flushes past their grace are forgotten.
fn wait_for_releases(closing: &Closing, inos: impl Iterator<Item = u64>) {
    let (m, c) = closing;
    let inos: Vec<u64> = inos.collect();
    let mut g = m.lock();
    loop {
        let now = std::time::Instant::now();
        let mut deadline = None;
        for ino in &inos {
            let Some(v) = g.get_mut(ino) else { continue };
            v.retain(|(_, at)| now < *at + RELEASE_GRACE);
            match v.iter().map(|(_, at)| *at + RELEASE_GRACE).max() {
                Some(d) => deadline = deadline.max(Some(d)),
                None => {
                    g.remove(ino);
                }
            }
        }
        let Some(deadline) = deadline else { return };
        // Woken by each release; past the deadline the loop forgets the
        // flushes whose grace ran out.
        c.wait_until(&mut g, deadline);
    }
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
        if self.fs.transport().accept(offered) {
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
            Ok((a, true)) => self.ttls.reply_entry(reply, &a),
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
                        if signalled_unseen(&self.fs, req.pid()) && self.fs.events_interrupt(unique) =>
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
            if self.fs.transport().is_uring() {
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

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync("fsync", reply);
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

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync("fsyncdir", reply);
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
                    self.ttls.made_entry(&a),
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
        guarded("getlk", || {
            let lreq = {
                let mut w = self.waits.lock();
                self.lock_request(&mut w, req.unique().0, fh, lock_owner, start, end, typ, pid)
            };
            let result = lreq.and_then(|r| self.fs.getlk(Ino(ino.0), &r));
            match (result, lreq) {
                // A conflict may be a release still on another CPU's queue.
                (Ok(Some(_)), Ok(r)) if self.fs.transport().is_uring() => {
                    let fs = self.fs.clone();
                    self.defer_conflict(
                        ino.0,
                        Box::new(move || answer_getlk(fs.getlk(Ino(ino.0), &r), start, end, reply)),
                    );
                }
                (result, _) => answer_getlk(result, start, end, reply),
            }
        });
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
        guarded("setlk", || {
            let unique = req.unique().0;
            let lreq = {
                let mut w = self.waits.lock();
                let lreq = match self.lock_request(&mut w, unique, fh, lock_owner, start, end, typ, pid) {
                    Ok(r) => r,
                    Err(e) => return reply.error(refuse("setlk", e)),
                };
                if sleep && w.take_early(unique) {
                    return reply.error(refuse("setlk", Error::Interrupted));
                }
                lreq
            };
            let wait = (sleep && lreq.mode.is_some()).then_some(WaitId(unique));
            // Without the `Waits` lock: the lease core may ask etcd, and
            // interrupts and other lock requests must not wait for that.
            let answer = self.fs.setlk(Ino(ino.0), lreq, wait);
            // A conflict may be a release still on another CPU's queue
            // (io_uring): decided again once the other queues served what
            // they hold.
            if let Ok((Outcome::Refused(Error::WouldBlock), _)) = &answer {
                if self.fs.transport().is_uring() {
                    if let Ok((_, effects)) = answer {
                        self.waits.lock().deliver(effects, &self.fs);
                    }
                    let (fs, waits, tid) = (self.fs.clone(), self.waits.clone(), req.pid());
                    return self.defer_conflict(
                        ino.0,
                        Box::new(move || {
                            let answer = fs.setlk(Ino(ino.0), lreq, wait);
                            if answer_setlk(&fs, &waits, ino.0, lreq, pid, unique, answer, reply)
                                && signalled_unseen(&fs, tid)
                            {
                                interrupt_parked(&fs, &waits, unique);
                            }
                        }),
                    );
                }
            }
            if answer_setlk(&self.fs, &self.waits, ino.0, lreq, pid, unique, answer, reply)
                && signalled_unseen(&self.fs, req.pid())
            {
                interrupt_parked(&self.fs, &self.waits, unique);
            }
        });
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

fn reply_xattr(op: &str, r: crate::error::Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(refuse(op, Error::Range)),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(refuse(op, e)),
    }
}
