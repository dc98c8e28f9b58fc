//! FUSE-over-io_uring (Linux 6.14+, the fuse module's `enable_uring`): the
//! kernel hands requests to ring entries the daemon registered, one queue
//! per possible CPU, and a request made on CPU k arrives on queue k. Each
//! queue is served by its own thread bound to that CPU, so a request is
//! answered where it was made, without the wake-up of a `/dev/fuse` reader
//! on another CPU. See the kernel's `Documentation/filesystems/fuse-io-uring.rst`.
//!
//! What stays on `/dev/fuse`: INIT (before the rings exist), FORGET,
//! INTERRUPT, notifications (the daemon's `inval` notices), and requests the
//! kernel queued before every queue had an entry. The session thread keeps
//! reading `/dev/fuse` for them. (The kernel sends no `FUSE_INTERRUPT` for
//! a request signalled between getting an entry and being copied into it:
//! the adapter looks at the pending signals of a waiter it parks.)
//!
//! An entry is a header (the `fuse_in_header` or `fuse_out_header`, the
//! operation's fixed argument, and `fuse_uring_ent_in_out`) and a payload
//! buffer as large as the largest request. A request holds its entry until
//! it is answered: a lock wait parked for an hour holds one for an hour.
//! So a queue registers more entries whenever fewer than [`SPARE`] (and
//! fewer than it holds) are left for new requests, up to [`MAX_ENTRIES`];
//! their memory is touched only when used (one page of header for a parked
//! waiter). The kernel gives a request that found no free entry to the
//! next entry *committed* on that queue, never to one registered later: a
//! burst of blocking lock requests larger than the free entries of one
//! queue, after which that queue answers nothing, leaves the excess
//! waiting in the kernel until one of the parked requests is answered.
//!
//! Requests are served through fuser's [`fuser::RequestServer`]: the same
//! hook, dispatcher and handlers as a request read from `/dev/fuse`.
//! Replies come through [`fuser::ReplySink`]: into the entry's header and
//! payload, then a `COMMIT_AND_FETCH` on the entry's queue, issued by the
//! queue's own thread (a reply made elsewhere, such as a lock granted to a
//! waiter when another process unlocks, wakes it through an eventfd).
//!
//! Order: requests of one queue are served one after another, in the order
//! the kernel delivered them. Requests from different CPUs are served side
//! by side; the kernel serializes what must be (a file's writes and
//! truncates, a directory's changes) before it sends them, and the lease
//! rules only ever compare requests that the daemon has received. A
//! `flock` lock goes with the last close of a file description, a release
//! the kernel queues on the closing CPU's queue before `close` returns but
//! answers nobody for; so a lock request about to be *refused* for a
//! conflict goes to the adapter's settler thread, which has every queue
//! that has something delivered or pending serve it first
//! ([`Queues::settle`]) and decides again: the next `flock -n` by another
//! process on another CPU finds the lock released, as it would through
//! `/dev/fuse`'s single queue. Queue threads never wait for that, and
//! granted requests never meet it.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, RwLock};
use tracing::{debug, info, warn};

use super::ring::{Ring, RingView, Sqe, OP_READ, OP_URING_CMD};

mod entries;
mod queue;
mod report;

use entries::{arm_wake, grow, push, setup, Entry, Shared, QUEUE};
use queue::{run, Kicker};
pub use report::{QueueStats, TransportReport};

/// `FUSE_IO_URING_CMD_REGISTER`.
const CMD_REGISTER: u64 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`.
const CMD_COMMIT_AND_FETCH: u64 = 2;
/// Bytes of `struct fuse_uring_req_header`: `in_out` (128), `op_in` (128),
/// `fuse_uring_ent_in_out` (32).
const HEADER_BYTES: usize = 288;
const OP_IN_AT: usize = 128;
const ENT_AT: usize = 256;
/// `fuse_in_header`.
const IN_HEADER: usize = 40;
/// `fuse_out_header`.
const OUT_HEADER: usize = 16;
/// The header page of an entry; the request is rebuilt at its end, right
/// before the payload, so a large write is parsed where it lies.
const HEADER_PAGE: usize = 4096;
/// Requests with at most this much payload are copied out of the entry
/// before they are served, so a reply written into the payload never
/// overwrites a request still being read. Larger ones (writes) are served
/// in place: their replies are a few bytes written after the data was used.
const COPY_BELOW: usize = 64 * 1024;
/// Entries each queue registers at the start.
const FIRST_ENTRIES: u32 = 64;
/// Free entries a queue keeps for new requests while others are parked
/// (at least; also at least as many as it holds).
pub const SPARE: u32 = 16;
/// Entries registered together (one mapping).
const CHUNK: u32 = 16;
/// Most entries one queue registers.
pub const MAX_ENTRIES: u32 = 1 << 15;
/// How long a lock conflict waits at most for another queue to serve
/// what it holds ([`Queues::settle`]).
const SETTLE_FOR: Duration = Duration::from_millis(500);
/// Kicks (see [`kick`]) in flight at most per queue, not counting those
/// stuck in the kernel's queue.
const MAX_KICKS: u32 = 4;
/// Kicker threads at most per queue, counting those whose kick is stuck
/// in the kernel's queue (see [`kick`]).
const MAX_KICKERS: usize = 256;
/// A kick not delivered after this long is queued in the kernel behind
/// the requests it was to fetch: another kick is made.
const KICK_PATIENCE: Duration = Duration::from_millis(2);
/// The attribute a kick asks the mount's root for (answered `ENODATA`).
const KICK_NAME: &std::ffi::CStr = c"user.leasefs.kick";
/// User data of the eventfd read that wakes a queue's thread.
const WAKE: u64 = u64::MAX;

/// The transport a mount asks for (`--transport`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Transport {
    /// io_uring when the kernel offers it at INIT, else `/dev/fuse`.
    #[default]
    Auto,
    /// io_uring, or the mount fails.
    Uring,
    /// `/dev/fuse` only.
    Dev,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "uring" | "io_uring" => Ok(Transport::Uring),
            "dev" => Ok(Transport::Dev),
            _ => Err(format!("{s:?}: one of auto, uring, dev")),
        }
    }
}

/// Every queue of a mount, for [`Queues::settle`].
pub struct Queues {
    all: OnceLock<Vec<Arc<Shared>>>,
    mountpoint: Arc<OnceLock<std::ffi::CString>>,
}

impl Queues {
    /// The live mount's path, for the queues' kicks (a request from a
    /// queue's CPU that makes the kernel hand over requests it queued).
    pub fn set_mountpoint(&self, path: &std::path::Path) {
        use std::os::unix::ffi::OsStrExt;
        if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) {
            let _ = self.mountpoint.set(c);
        }
    }

    /// Have every queue serve what the kernel already handed it: called
    /// (by the adapter's settler thread, never by a queue thread) before a
    /// lock request is refused for a conflict, since the release that ends
    /// the conflict may be on its way on another CPU's queue (a `close`
    /// queues its `flock` release before it returns). Queues with nothing
    /// delivered are passed over. True when it waited for one.
    pub fn settle(&self) -> bool {
        if self.settle_once() {
            return true;
        }
        // Nothing visible yet: a release queued an instant ago may still be
        // on its way into a ring (the kernel's background queue); look once
        // more after a moment.
        std::thread::sleep(Duration::from_micros(200));
        self.settle_once()
    }

    fn settle_once(&self) -> bool {
        let Some(all) = self.all.get() else { return false };
        let mut waited = false;
        for q in all.iter() {
            // Read busy before rounds: a round counted after `busy` was
            // seen clear began its kernel wait after this call did.
            let busy = q.busy.load(Ordering::SeqCst);
            let seen = q.rounds.load(Ordering::SeqCst);
            if (!busy && q.quiet()) || q.over.load(Ordering::Acquire) {
                continue;
            }
            waited = true;
            let need = seen + 1 + u64::from(busy);
            let deadline = std::time::Instant::now() + SETTLE_FOR;
            let mut g = q.round_lock.lock();
            while q.rounds.load(Ordering::SeqCst) < need && !q.over.load(Ordering::Acquire) {
                q.wake();
                if q.round_done.wait_until(&mut g, deadline).timed_out() {
                    debug!(queue = q.qid, "settle: queue did not answer in time");
                    break;
                }
            }
        }
        waited
    }
}

/// The possible CPUs (the kernel makes one queue for each).
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| s.trim().rsplit(['-', ',']).next().and_then(|n| n.parse::<usize>().ok()))
        .map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), |last| last + 1)
}

/// Whether the fuse module lets a daemon use io_uring (`enable_uring`).
pub fn kernel_allows() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|s| s.trim() == "Y")
}

/// The running transport: its queue threads.
pub struct Started {
    server: Arc<OnceLock<fuser::RequestServer>>,
    ready: Arc<(Mutex<bool>, Condvar)>,
    /// The queues, for [`Queues::settle`].
    pub queues: Arc<Queues>,
}

impl Started {
    /// Give the queues the session's request server (they wait for it
    /// before serving their first request).
    pub fn serve(&self, server: fuser::RequestServer) {
        let _ = self.server.set(server);
        let (m, c) = &*self.ready;
        *m.lock() = true;
        c.notify_all();
    }
}

/// Register entries on every queue of the connection behind `dev` and
/// start their threads. `Err` when a queue could not register (io_uring
/// refused); nothing then runs.
pub fn start(dev: Arc<OwnedFd>, payload_len: usize, report: Arc<TransportReport>) -> io::Result<Started> {
    let n = possible_cpus();
    let server: Arc<OnceLock<fuser::RequestServer>> = Arc::new(OnceLock::new());
    let ready = Arc::new((Mutex::new(false), Condvar::new()));
    let mountpoint = Arc::new(OnceLock::new());
    let queues = Arc::new(Queues { all: OnceLock::new(), mountpoint: mountpoint.clone() });
    let mut shared = Vec::with_capacity(n);
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
    for qid in 0..n as u16 {
        // SAFETY: eventfd has no preconditions; checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        let stats = Arc::new(QueueStats::default());
        let q = Arc::new(Shared {
            qid,
            payload_len,
            entries: Mutex::new(Vec::new()),
            chunks: Mutex::new(Vec::new()),
            answered: Mutex::new(Vec::new()),
            // SAFETY: a fresh eventfd.
            wake: unsafe { OwnedFd::from_raw_fd(efd) },
            wake_buf: AtomicU64::new(0),
            view: RwLock::new(None),
            stats,
            busy: AtomicBool::new(false),
            rounds: AtomicU64::new(0),
            round_done: Condvar::new(),
            round_lock: Mutex::new(()),
            over: AtomicBool::new(false),
            tid: AtomicU32::new(0),
            mountpoint: mountpoint.clone(),
            kicks: AtomicU32::new(0),
            kickers: Mutex::new(Vec::new()),
            kicker_threads: AtomicU32::new(0),
            kicks_wanted: AtomicU32::new(0),
        });
        shared.push(q.clone());
        let (server, ready, tx, dev) = (server.clone(), ready.clone(), tx.clone(), dev.clone());
        std::thread::Builder::new().name(format!("fuse-ring-{qid}")).spawn(move || {
            let dev = dev.as_raw_fd();
            let (mut ring, early) = match setup(dev, &q) {
                Ok(r) => {
                    let _ = tx.send(Ok(()));
                    r
                }
                Err(e) => {
                    q.over.store(true, Ordering::Release);
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            drop(tx);
            {
                let (m, c) = &*ready;
                let mut g = m.lock();
                while !*g {
                    c.wait(&mut g);
                }
            }
            if let Some(server) = server.get() {
                run(&mut ring, early, dev, &q, server);
            }
            q.over.store(true, Ordering::Release);
            *q.view.write() = None;
            drop(ring);
            let _g = q.round_lock.lock();
            q.round_done.notify_all();
        })?;
    }
    drop(tx);
    let mut failed = None;
    for _ in 0..n {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(_) => failed = failed.or(Some(io::Error::other("a queue thread ended"))),
        }
    }
    let _ = queues.all.set(shared.clone());
    *report.queues.lock() = shared.iter().map(|q| q.stats.clone()).collect();
    if let Some(e) = failed {
        // Threads that registered wait for a server that never comes:
        // release them (they exit without serving).
        let (m, c) = &*ready;
        *m.lock() = true;
        c.notify_all();
        report.queues.lock().clear();
        return Err(e);
    }
    report.uring.store(true, Ordering::Relaxed);
    info!(queues = n, "serving through FUSE-over-io_uring, one queue per CPU");
    Ok(Started { server, ready, queues })
}
