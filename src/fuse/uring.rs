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

/// What `status` and `/metrics` say about the transport in use.
#[derive(Default)]
pub struct TransportReport {
    /// The transport asked for.
    wanted: Mutex<Transport>,
    /// io_uring was accepted at INIT.
    offered: AtomicBool,
    uring: AtomicBool,
    /// The running queues, for [`TransportReport::settle`].
    running: OnceLock<Arc<Queues>>,
    /// Why `/dev/fuse` serves everything, when it does.
    why: Mutex<String>,
    queues: Mutex<Vec<Arc<QueueStats>>>,
}

/// One queue's counters.
#[derive(Default)]
pub struct QueueStats {
    /// Requests served through this queue.
    pub served: AtomicU64,
    /// Entries registered with the kernel.
    pub entries: AtomicU32,
    /// Entries holding a request not yet answered (parked waits included).
    pub held: AtomicU32,
    /// The most ever held at once.
    pub peak: AtomicU32,
    /// Lock conflicts found on this queue, decided again after the
    /// queues served what they held ([`Queues::settle`]).
    pub fenced: AtomicU64,
    /// Rounds whose answers were committed as an idle-policy thread, for
    /// clients that may run on another CPU (see `client_may_move`).
    pub woken_here: AtomicU64,
}

impl std::fmt::Debug for TransportReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportReport").field("uring", &self.is_uring()).finish_non_exhaustive()
    }
}

impl TransportReport {
    /// `status`'s `transport` object.
    pub fn status(&self) -> serde_json::Value {
        let queues = self.queues.lock();
        let uring = self.uring.load(Ordering::Relaxed);
        serde_json::json!({
            "kind": if uring { "uring" } else { "dev" },
            "why": if uring { None } else { Some(self.why.lock().clone()).filter(|w| !w.is_empty()) },
            "queues": queues.iter().enumerate().map(|(q, s)| serde_json::json!({
                "queue": q,
                "served": s.served.load(Ordering::Relaxed),
                "entries": s.entries.load(Ordering::Relaxed),
                "held": s.held.load(Ordering::Relaxed),
                "peak": s.peak.load(Ordering::Relaxed),
                "fenced": s.fenced.load(Ordering::Relaxed),
                "woken_here": s.woken_here.load(Ordering::Relaxed),
            })).collect::<Vec<_>>(),
        })
    }

    /// Whether io_uring serves the mount.
    pub fn is_uring(&self) -> bool {
        self.uring.load(Ordering::Relaxed)
    }

    /// The transport's lines of `/metrics` (Prometheus text format) for
    /// the mount labelled `mount`.
    pub fn metrics(&self, mount: &str) -> String {
        let m = format!("mount=\"{}\"", mount.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"));
        let kind = if self.is_uring() { "uring" } else { "dev" };
        let mut out = format!(
            "# HELP leasefs_transport The transport serving the mount.\n# TYPE leasefs_transport gauge\n\
             leasefs_transport{{kind=\"{kind}\",{m}}} 1\n"
        );
        let queues = self.queues.lock();
        if queues.is_empty() {
            return out;
        }
        let mut family = |name: &str, kind: &str, help: &str, get: &dyn Fn(&QueueStats) -> u64| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (q, s) in queues.iter().enumerate() {
                out.push_str(&format!("{name}{{queue=\"{q}\",{m}}} {}\n", get(s)));
            }
        };
        family("leasefs_uring_requests_total", "counter", "Requests served through each io_uring queue.", &|s| {
            s.served.load(Ordering::Relaxed)
        });
        family("leasefs_uring_entries", "gauge", "Ring entries registered on each queue.", &|s| {
            u64::from(s.entries.load(Ordering::Relaxed))
        });
        family("leasefs_uring_held", "gauge", "Ring entries holding a request not yet answered.", &|s| {
            u64::from(s.held.load(Ordering::Relaxed))
        });
        out
    }

    /// The transport the mount asks for; set before the mount.
    pub fn set_wanted(&self, wanted: Transport) {
        *self.wanted.lock() = wanted;
    }

    /// At INIT: whether to accept the kernel's offer of io_uring (`offered`)
    /// for the transport asked for. Not for `dev`, and not when this
    /// process cannot make a ring (`io_uring_disabled`, seccomp): the
    /// reason is kept for [`TransportReport::why_not`].
    pub fn accept(&self, offered: bool) -> bool {
        let why = if *self.wanted.lock() == Transport::Dev {
            Some("--transport dev".to_string())
        } else if !offered {
            Some(if kernel_allows() {
                "the kernel did not offer FUSE-over-io_uring at INIT".to_string()
            } else {
                "FUSE-over-io_uring is off (/sys/module/fuse/parameters/enable_uring is not Y, or the kernel lacks it)"
                    .to_string()
            })
        } else {
            Ring::new(2).err().map(|e| format!("io_uring_setup: {e}"))
        };
        let accepted = why.is_none();
        self.offered.store(accepted, Ordering::Relaxed);
        *self.why.lock() = why.unwrap_or_default();
        accepted
    }

    /// Whether io_uring was accepted at INIT (the queues must then start).
    pub fn accepted(&self) -> bool {
        self.offered.load(Ordering::Relaxed)
    }

    /// Why io_uring was not accepted at INIT.
    pub fn why_not(&self) -> String {
        self.why.lock().clone()
    }

    /// The queues that serve the mount.
    pub fn set_queues(&self, queues: Arc<Queues>) {
        let _ = self.running.set(queues);
    }

    /// Count a lock conflict found by the calling queue thread, to be
    /// decided again after [`TransportReport::settle`].
    pub fn note_conflict(&self) {
        if let (Some(q), Some(all)) = (QUEUE.with(|q| q.get()), self.running.get().and_then(|r| r.all.get())) {
            if let Some(s) = all.get(q as usize) {
                s.stats.fenced.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// [`Queues::settle`] when io_uring serves the mount; false otherwise
    /// (one `/dev/fuse` reader delivers requests in the kernel's order).
    pub fn settle(&self) -> bool {
        self.running.get().is_some_and(|q| q.settle())
    }

    /// Record that `/dev/fuse` serves everything, and why.
    pub fn set_dev(&self, why: &str) {
        self.uring.store(false, Ordering::Relaxed);
        *self.why.lock() = why.to_string();
    }
}

/// An anonymous mapping holding [`CHUNK`] entries.
struct Chunk {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; who writes which entry is ruled by
// the entry's ownership (kernel, serving thread, or replier), see `Entry`.
unsafe impl Send for Chunk {}
// SAFETY: as above.
unsafe impl Sync for Chunk {}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `Queue::grow`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring entry: its header page and payload, inside a [`Chunk`]. An
/// entry belongs to the kernel from its registration or commit until its
/// completion arrives, then to its queue's thread until it is dispatched,
/// then to whoever holds its reply until the reply is written.
#[derive(Clone, Copy)]
struct Entry {
    header: *mut u8,
    payload: *mut u8,
}

/// The part of a queue other threads reach: entries (for replies), the
/// replies waiting to be committed, the wake-up eventfd.
struct Shared {
    qid: u16,
    payload_len: usize,
    entries: Mutex<Vec<Entry>>,
    chunks: Mutex<Vec<Chunk>>,
    /// (entry, commit id) answered and not yet committed.
    answered: Mutex<Vec<u32>>,
    wake: OwnedFd,
    /// Where the eventfd reads land (written by the kernel, never read).
    wake_buf: AtomicU64,
    /// What other threads may look at in the ring, while it exists.
    view: RwLock<Option<RingView>>,
    stats: Arc<QueueStats>,
    /// Set while the queue's thread serves what it received; the fence
    /// waits for it to clear after the thread took the kernel's news.
    busy: AtomicBool,
    /// Bumped each time the queue's thread went through the kernel and
    /// served everything it got.
    rounds: AtomicU64,
    round_done: Condvar,
    round_lock: Mutex<()>,
    /// Set when the connection is gone.
    over: AtomicBool,
    /// The queue's thread.
    tid: AtomicU32,
    /// The mount point, for kicks (set once the mount is live).
    mountpoint: Arc<OnceLock<std::ffi::CString>>,
    /// Kicker threads whose kick is not known to be stuck (see [`kick`]).
    kicks: AtomicU32,
    /// Every kicker thread, stuck ones too.
    kickers: Mutex<Vec<Kicker>>,
    /// How many there are (`kickers.len()`, read without the lock).
    kicker_threads: AtomicU32,
    /// Kicks asked for and not yet made.
    kicks_wanted: AtomicU32,
}

// SAFETY: `Entry` pointers are into mappings owned by `chunks` for the
// life of `Shared`; access to an entry's bytes follows its ownership.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

thread_local! {
    /// The queue whose thread this is.
    static QUEUE: std::cell::Cell<Option<u16>> = const { std::cell::Cell::new(None) };
}

impl Shared {
    fn entry(&self, i: u32) -> Entry {
        self.entries.lock()[i as usize]
    }

    /// Nothing delivered and not yet served: no completion waiting, no
    /// task work pending for the ring, an entry free for a new request.
    /// The thread must also be asleep: while the kernel runs the task work
    /// that copies a request into an entry, the flag is already cleared and
    /// the completion not yet posted, but the thread is running.
    fn quiet(&self) -> bool {
        let view = self.view.read();
        let Some(v) = view.as_ref() else { return true };
        v.quiet()
            && self.stats.entries.load(Ordering::Relaxed) > self.stats.held.load(Ordering::Relaxed)
            && crate::procfs::state(self.tid.load(Ordering::Relaxed)) == Some('S')
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

impl fuser::ReplySink for Shared {
    fn send(&self, token: u64, bufs: &[IoSlice<'_>]) -> io::Result<()> {
        let i = token as u32;
        let e = self.entry(i);
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total < OUT_HEADER || total - OUT_HEADER > self.payload_len {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // Header first, then the arguments into the payload.
        let mut at = 0usize;
        for b in bufs {
            let mut src: &[u8] = b;
            while !src.is_empty() {
                let (dst, room) = if at < OUT_HEADER {
                    // SAFETY: the entry's header page is ours until the commit.
                    (unsafe { e.header.add(at) }, OUT_HEADER - at)
                } else {
                    // SAFETY: payload has payload_len bytes; checked above.
                    (unsafe { e.payload.add(at - OUT_HEADER) }, usize::MAX)
                };
                let n = src.len().min(room);
                // SAFETY: dst has room for n bytes (see above).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, n) };
                src = &src[n..];
                at += n;
            }
        }
        // fuse_uring_ent_in_out.payload_sz: the arguments only.
        let payload_sz = (total - OUT_HEADER) as u32;
        // SAFETY: the ent_in_out area is inside the header page.
        unsafe { std::ptr::write_unaligned(e.header.add(ENT_AT + 16).cast::<u32>(), payload_sz) };
        self.answered.lock().push(i);
        if QUEUE.with(|q| q.get()) != Some(self.qid) {
            self.wake();
        }
        Ok(())
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

/// Bind this thread to its queue's CPU, make its ring, register the first
/// entries and the wake-up read.
fn setup(dev: RawFd, q: &Shared) -> io::Result<(Ring, Vec<(u64, i32)>)> {
    QUEUE.with(|c| c.set(Some(q.qid)));
    // SAFETY: gettid has no preconditions.
    q.tid.store(unsafe { libc::gettid() } as u32, Ordering::Relaxed);
    // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(q.qid as usize, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!(queue = q.qid, "CPU offline: queue thread not bound");
        }
    }
    let mut ring = Ring::new(256)?;
    *q.view.write() = Some(ring.view());
    arm_wake(&mut ring, q);
    grow(&mut ring, dev, q, FIRST_ENTRIES)?;
    ring.submit(false)?;
    // A refused registration completes at once with its error; a request
    // may already have arrived in an entry: keep it for the loop.
    let mut early = Vec::new();
    while let Some((user_data, res)) = ring.pop() {
        if res < 0 && user_data != WAKE {
            return Err(io::Error::from_raw_os_error(-res));
        }
        early.push((user_data, res));
    }
    Ok((ring, early))
}

/// The eventfd read whose completion wakes the queue's thread.
fn arm_wake(ring: &mut Ring, q: &Shared) {
    let buf = q.wake_buf.as_ptr() as u64;
    let sqe = Sqe::new(OP_READ, q.wake.as_raw_fd(), WAKE).addr(buf).len(8).off(u64::MAX);
    push(ring, &sqe);
}

fn push(ring: &mut Ring, sqe: &Sqe) {
    while !ring.push(sqe) {
        if let Err(e) = ring.submit(false) {
            warn!("io_uring submit: {e}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Register `count` more entries (rounded up to a chunk) on queue `q`.
fn grow(ring: &mut Ring, dev: RawFd, q: &Shared, count: u32) -> io::Result<()> {
    let have = q.stats.entries.load(Ordering::Relaxed);
    let count = count.div_ceil(CHUNK) * CHUNK;
    let count = count.min(MAX_ENTRIES.saturating_sub(have));
    if count == 0 {
        return Ok(());
    }
    let stride = HEADER_PAGE + q.payload_len.next_multiple_of(4096);
    let len = stride * count as usize;
    // SAFETY: a fresh private anonymous mapping; pages are allocated only
    // when touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let ptr = ptr.cast::<u8>();
    q.chunks.lock().push(Chunk { ptr, len });
    let mut entries = q.entries.lock();
    for k in 0..count as usize {
        // SAFETY: inside the mapping of len = stride * count bytes.
        let header = unsafe { ptr.add(k * stride) };
        // SAFETY: as above.
        let payload = unsafe { header.add(HEADER_PAGE) };
        let i = entries.len() as u32;
        entries.push(Entry { header, payload });
        // The iovec array is read when the registration is issued: keep it
        // in the entry's header page, after the header.
        // SAFETY: HEADER_BYTES + 32 < HEADER_PAGE - 256 (the rebuild area).
        let iov = unsafe { header.add(HEADER_BYTES + 32).cast::<libc::iovec>() };
        // SAFETY: iov has room for two iovecs (see above).
        unsafe {
            *iov = libc::iovec { iov_base: header.cast(), iov_len: HEADER_BYTES };
            *iov.add(1) = libc::iovec { iov_base: payload.cast(), iov_len: q.payload_len };
        }
        let mut cmd = [0u8; 24];
        cmd[16..18].copy_from_slice(&q.qid.to_ne_bytes());
        let sqe = Sqe::new(OP_URING_CMD, dev, u64::from(i)).off(CMD_REGISTER).addr(iov as u64).len(2).cmd(&cmd);
        push(ring, &sqe);
    }
    q.stats.entries.store(entries.len() as u32, Ordering::Relaxed);
    Ok(())
}

/// Serve queue `q` until the connection ends.
fn run(ring: &mut Ring, early: Vec<(u64, i32)>, dev: RawFd, q: &Arc<Shared>, server: &fuser::RequestServer) {
    let sink: Arc<dyn fuser::ReplySink> = q.clone();
    let mut scratch: Vec<u64> = vec![0; (COPY_BELOW + IN_HEADER + 256) / 8];
    let mut held = 0u32;
    // The answers to commit, swapped with `q.answered` each round (no
    // allocation per round).
    let mut answered: Vec<u32> = Vec::new();
    // Only root may leave SCHED_IDLE again.
    // SAFETY: geteuid has no preconditions.
    let may_idle = unsafe { libc::geteuid() } == 0;
    let mut movable: std::collections::HashMap<u32, bool> = std::collections::HashMap::new();
    let mut wake_movable = false;
    let mut early = early.into_iter();
    // The newest kick's request id: a request older than it delivered
    // after it was a queued one (see [`kick`]).
    let mut last_kick = 0u64;
    loop {
        let mut kick_again = false;
        if early.len() == 0 {
            // Answers to clients that may run on another CPU: commit them
            // as an idle-policy thread, so that the scheduler counts this
            // CPU as idle and wakes the client here (see `client_may_move`).
            if wake_movable && ring.unsubmitted() > 0 {
                let p = libc::sched_param { sched_priority: 0 };
                // SAFETY: plain syscalls on this thread.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) };
                let _ = ring.submit(false);
                // SAFETY: as above.
                unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
                q.stats.woken_here.fetch_add(1, Ordering::Relaxed);
            }
            wake_movable = false;
            // While kicks are out, look again after KICK_PATIENCE even if
            // nothing arrives: a kick may be stuck in the kernel's queue.
            let waited = if q.kicks.load(Ordering::SeqCst) > 0 {
                ring.submit_and_wait_for(KICK_PATIENCE)
            } else {
                ring.submit(true)
            };
            if let Err(e) = waited {
                warn!(queue = q.qid, "io_uring wait: {e}");
                break;
            }
        }
        q.busy.store(true, Ordering::SeqCst);
        let mut over = false;
        while let Some((user_data, res)) = early.next().or_else(|| ring.pop()) {
            if user_data == WAKE {
                arm_wake(ring, q);
                continue;
            }
            if res < 0 {
                match -res {
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED => over = true,
                    e => warn!(
                        queue = q.qid,
                        entry = user_data,
                        "ring entry failed: {}",
                        io::Error::from_raw_os_error(e)
                    ),
                }
                continue;
            }
            held += 1;
            q.stats.held.store(held, Ordering::Relaxed);
            q.stats.peak.fetch_max(held, Ordering::Relaxed);
            q.stats.served.fetch_add(1, Ordering::Relaxed);
            let e = q.entry(user_data as u32);
            // SAFETY: the completed entry's header page is ours (fuse_in_header).
            let (unique, pid) = unsafe {
                (
                    std::ptr::read_unaligned(e.header.add(8).cast::<u64>()),
                    std::ptr::read_unaligned(e.header.add(32).cast::<u32>()),
                )
            };
            let kicked = q.kicker_threads.load(Ordering::SeqCst) > 0
                && q.kickers.lock().iter_mut().find(|k| k.tid == pid).map(|k| k.delivered = true).is_some();
            if kicked {
                // A kick: answered here (`ENODATA`), the filesystem never sees it.
                last_kick = last_kick.max(unique);
                let mut out = [0u8; OUT_HEADER];
                out[..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
                out[4..8].copy_from_slice(&(-libc::ENODATA).to_ne_bytes());
                out[8..].copy_from_slice(&unique.to_ne_bytes());
                if let Err(e) = fuser::ReplySink::send(&**q, user_data, &[IoSlice::new(&out)]) {
                    warn!(queue = q.qid, "answering a kick: {e}");
                }
                continue;
            } else if unique < last_kick {
                kick_again = true;
            }
            serve(q, e, &mut scratch, server, &sink, user_data);
        }
        // Every entry was out: requests that came meanwhile wait in the
        // kernel for an entry to be committed (see [`kick`]).
        let exhausted = held >= q.stats.entries.load(Ordering::Relaxed);
        // Commit what was answered (here or by other threads).
        std::mem::swap(&mut answered, &mut *q.answered.lock());
        for i in answered.drain(..) {
            let e = q.entry(i);
            // SAFETY: the answered entry's header page is ours until committed.
            let commit_id = unsafe { std::ptr::read_unaligned(e.header.add(ENT_AT + 8).cast::<u64>()) };
            if may_idle && !wake_movable {
                // The request's pid, past the 16 bytes the answer overwrote.
                // SAFETY: as above.
                let tid = unsafe { std::ptr::read_unaligned(e.header.add(32).cast::<u32>()) };
                wake_movable = client_may_move(&mut movable, tid);
            }
            let mut cmd = [0u8; 24];
            cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
            cmd[16..18].copy_from_slice(&q.qid.to_ne_bytes());
            push(ring, &Sqe::new(OP_URING_CMD, dev, u64::from(i)).off(CMD_COMMIT_AND_FETCH).cmd(&cmd));
            held -= 1;
        }
        q.stats.held.store(held, Ordering::Relaxed);
        // Keep entries free for new requests while others wait.
        let entries = q.stats.entries.load(Ordering::Relaxed);
        // The kernel queues a request that finds no free entry and hands it
        // to the next entry *committed* on that queue, not to entries
        // registered later: keep well ahead of parked requests.
        let mut grew = false;
        if entries.saturating_sub(held) < SPARE.max(held) && entries < MAX_ENTRIES {
            match grow(ring, dev, q, entries) {
                Ok(()) => grew = true,
                Err(e) => warn!(queue = q.qid, "registering more ring entries: {e}"),
            }
        }
        // Parked requests filled the entries (we grow) or took every one
        // (exhausted): requests may wait in the kernel. Kick until none
        // older than the last kick arrives.
        // A kick queued in the kernel (every entry was taken when it came)
        // fetches nothing until an entry commits: its slot is given up, and
        // another kick is made once entries are free (registered and
        // submitted), where it takes one at once instead of queueing too.
        if q.kicks.load(Ordering::SeqCst) > 0 {
            let n = mark_stuck(&mut q.kickers.lock(), std::time::Instant::now());
            q.kicks.fetch_sub(n, Ordering::SeqCst);
            q.kicks_wanted.fetch_add(n, Ordering::SeqCst);
        }
        if kick_now(
            q.kicks_wanted.load(Ordering::SeqCst),
            q.kicks.load(Ordering::SeqCst),
            held,
            q.stats.entries.load(Ordering::Relaxed),
        ) {
            match ring.submit(false) {
                Ok(_) => start_kicks(q),
                Err(e) => warn!(queue = q.qid, "io_uring submit: {e}"),
            }
        }
        if (grew || exhausted || kick_again) && held < q.stats.entries.load(Ordering::Relaxed) {
            // The kick must find the new entries registered and the
            // commits done, or it would queue behind the others.
            match ring.submit(false) {
                Ok(_) => kick(q),
                Err(e) => warn!(queue = q.qid, "io_uring submit: {e}"),
            }
        }
        {
            let _g = q.round_lock.lock();
            q.rounds.fetch_add(1, Ordering::SeqCst);
            q.round_done.notify_all();
        }
        q.busy.store(false, Ordering::SeqCst);
        if over {
            debug!(queue = q.qid, "connection ended");
            // Send the commits of the last answers, then stop.
            let _ = ring.submit(false);
            break;
        }
    }
}

/// A kicker thread of a queue.
struct Kicker {
    tid: u32,
    /// When its current kick was made.
    made: std::time::Instant,
    /// The queue received its current kick.
    delivered: bool,
    /// Its kick was found queued in the kernel: it no longer holds a slot
    /// of `kicks`, and it ends once the kick is fetched.
    stuck: bool,
}

/// Mark the kicks not delivered within `KICK_PATIENCE` stuck (queued in the
/// kernel behind the requests they were to fetch); how many were. Each
/// gives its slot of `kicks` back and asks for a kick in its place.
fn mark_stuck(kickers: &mut [Kicker], now: std::time::Instant) -> u32 {
    let mut n = 0;
    for k in kickers.iter_mut().filter(|k| !k.delivered && !k.stuck && now.duration_since(k.made) >= KICK_PATIENCE) {
        k.stuck = true;
        n += 1;
    }
    n
}

/// Whether a kicker starts now for the kicks `wanted`: none is out making
/// them, and an entry is free, so that a kick made now takes it at once
/// instead of queueing behind the requests it is to fetch.
fn kick_now(wanted: u32, kicks: u32, held: u32, entries: u32) -> bool {
    wanted > 0 && kicks == 0 && held < entries
}

/// Make the kernel hand queue `q` the requests it queued for want of a free
/// entry. A request that finds every entry of its queue out waits in the
/// kernel, and the kernel gives it only to an entry *committed* on that
/// queue afterwards, never to one registered later: with every entry held
/// by parked lock waits, it would wait until one of them is answered. A
/// kick is a request from a thread on the queue's CPU (`getxattr` of the
/// mount's root, answered `ENODATA` by the queue thread itself): it takes a free entry, and the commit
/// of its answer fetches the oldest queued request. While requests older
/// than the last kick keep arriving, the queue kicks again (at most
/// `MAX_KICKS` threads kick at once; one that finishes makes the kicks
/// asked for meanwhile). A kick made while new requests took every entry
/// is itself queued behind the others; the queue thread, which waits at
/// most `KICK_PATIENCE` while kicks are out, then takes its slot back and,
/// once entries are free, starts another kicker (at most `MAX_KICKERS`
/// threads, stuck ones included): a queued kick is fetched in its turn.
fn kick(q: &Arc<Shared>) {
    q.kicks_wanted.fetch_add(1, Ordering::SeqCst);
    start_kicks(q);
}

/// Start a kicker for the kicks wanted, unless `MAX_KICKS` are making them
/// (they make them before they end).
fn start_kicks(q: &Arc<Shared>) {
    if q.kicks_wanted.load(Ordering::SeqCst) > 0 && take_slot(&q.kicks, MAX_KICKS) {
        start_kicker(q);
    }
}

/// Start a kicker thread holding one slot of `q.kicks` (given back when it
/// cannot start).
fn start_kicker(q: &Arc<Shared>) {
    let Some(path) = q.mountpoint.get().cloned() else {
        q.kicks.fetch_sub(1, Ordering::SeqCst);
        return;
    };
    if q.kicker_threads.fetch_add(1, Ordering::SeqCst) as usize >= MAX_KICKERS {
        q.kicker_threads.fetch_sub(1, Ordering::SeqCst);
        q.kicks.fetch_sub(1, Ordering::SeqCst);
        debug!(queue = q.qid, "every kicker thread is out");
        return;
    }
    debug!(queue = q.qid, "kick");
    let q2 = q.clone();
    let spawned =
        std::thread::Builder::new().name(format!("fuse-kick-{}", q.qid)).stack_size(64 * 1024).spawn(move || {
            let q = q2;
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread.
            let bound = unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(q.qid as usize, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
            };
            let now = std::time::Instant::now();
            q.kickers.lock().push(Kicker { tid, made: now, delivered: true, stuck: false });
            loop {
                let wanted =
                    q.kicks_wanted.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| w.checked_sub(1)).is_ok();
                if !wanted || !bound || q.over.load(Ordering::Acquire) {
                    // Leave, unless a kick was asked for since and no other
                    // kicker is there to make it.
                    q.kicks.fetch_sub(1, Ordering::SeqCst);
                    if bound
                        && q.kicks_wanted.load(Ordering::SeqCst) > 0
                        && !q.over.load(Ordering::Acquire)
                        && take_slot(&q.kicks, MAX_KICKS)
                    {
                        continue;
                    }
                    break;
                }
                if let Some(k) = q.kickers.lock().iter_mut().find(|k| k.tid == tid) {
                    *k = Kicker { tid, made: std::time::Instant::now(), delivered: false, stuck: false };
                }
                // SAFETY: both strings are NUL-terminated; size 0 asks for the
                // length only (no buffer is written).
                unsafe { libc::getxattr(path.as_ptr(), KICK_NAME.as_ptr(), std::ptr::null_mut(), 0) };
                let stuck = q.kickers.lock().iter_mut().find(|k| k.tid == tid).is_some_and(|k| {
                    k.delivered = true;
                    k.stuck
                });
                if stuck {
                    // Its slot was given to another kicker meanwhile.
                    break;
                }
            }
            q.kickers.lock().retain(|k| k.tid != tid);
            q.kicker_threads.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        q.kicker_threads.fetch_sub(1, Ordering::SeqCst);
        q.kicks.fetch_sub(1, Ordering::SeqCst);
        debug!(queue = q.qid, "cannot start a kick: {e}");
    }
}

/// Whether the client thread `tid` may run on more than one CPU (cached;
/// the cache is cleared past 4 096 threads). A client woken while the
/// queue thread runs is placed on an idle CPU if it may be, and migrates:
/// answers to such clients are committed as an idle-policy thread. A
/// client pinned to this CPU gains nothing from that and pays for it.
fn client_may_move(cache: &mut std::collections::HashMap<u32, bool>, tid: u32) -> bool {
    if tid == 0 {
        return false;
    }
    if let Some(m) = cache.get(&tid) {
        return *m;
    }
    // SAFETY: a zeroed cpu_set_t filled by the kernel for `tid`.
    let m = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
            && libc::CPU_COUNT(&set) > 1
    };
    if cache.len() >= 4096 {
        cache.clear();
    }
    cache.insert(tid, m);
    m
}

/// Take one of `max` slots; false when all are taken.
fn take_slot(kicks: &AtomicU32, max: u32) -> bool {
    kicks.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| (k < max).then_some(k + 1)).is_ok()
}

/// Rebuild the request in entry `e` (user data `token`) as `/dev/fuse`
/// would have delivered it and serve it.
fn serve(
    q: &Shared,
    e: Entry,
    scratch: &mut [u64],
    server: &fuser::RequestServer,
    sink: &Arc<dyn fuser::ReplySink>,
    token: u64,
) {
    // SAFETY: the entry was just completed: its header page and payload
    // are ours; the kernel wrote the header and payload_sz bytes.
    let (len, payload_sz) = unsafe {
        (
            std::ptr::read_unaligned(e.header.cast::<u32>()) as usize,
            std::ptr::read_unaligned(e.header.add(ENT_AT + 16).cast::<u32>()) as usize,
        )
    };
    let op_len = len.saturating_sub(IN_HEADER + payload_sz);
    if len < IN_HEADER || op_len > 128 || payload_sz > q.payload_len {
        warn!(queue = q.qid, len, payload_sz, "malformed ring request");
        return;
    }
    let head = IN_HEADER + op_len;
    if payload_sz <= COPY_BELOW || !head.is_multiple_of(8) {
        let dst = scratch.as_mut_ptr().cast::<u8>();
        if len > scratch.len() * 8 {
            warn!(queue = q.qid, len, "ring request too large to copy");
            return;
        }
        // SAFETY: scratch holds len bytes (checked); the sources are the
        // entry's header (in_header, op_in) and payload.
        unsafe {
            std::ptr::copy_nonoverlapping(e.header, dst, IN_HEADER);
            std::ptr::copy_nonoverlapping(e.header.add(OP_IN_AT), dst.add(IN_HEADER), op_len);
            std::ptr::copy_nonoverlapping(e.payload, dst.add(head), payload_sz);
        }
        // SAFETY: the first len bytes of scratch were written above.
        let data = unsafe { std::slice::from_raw_parts(dst, len) };
        server.serve(data, sink.clone(), token);
    } else {
        // Put the header right before the payload (the end of the header
        // page) and serve the request where it lies.
        // SAFETY: head <= 168 bytes before the payload, inside the header
        // page and past the header and the iovecs.
        unsafe {
            let at = e.payload.sub(head);
            std::ptr::copy_nonoverlapping(e.header, at, IN_HEADER);
            std::ptr::copy(e.header.add(OP_IN_AT), at.add(IN_HEADER), op_len);
            let data = std::slice::from_raw_parts(at, len);
            server.serve(data, sink.clone(), token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn kicker(made: Instant, delivered: bool) -> Kicker {
        Kicker { tid: 1, made, delivered, stuck: false }
    }

    /// A kick not delivered within its patience is stuck once: delivered
    /// kicks and young ones are not.
    #[test]
    fn a_kick_undelivered_past_its_patience_is_stuck_once() {
        let now = Instant::now() + Duration::from_secs(1);
        let old = now - KICK_PATIENCE * 2;
        let mut k = vec![kicker(old, true), kicker(now, false), kicker(old, false)];
        assert_eq!(mark_stuck(&mut k, now), 1);
        assert!(k[2].stuck && !k[0].stuck && !k[1].stuck);
        assert_eq!(mark_stuck(&mut k, now), 0, "a stuck kick gives its slot back once");
    }

    /// The state a 10 000-waiter run once stopped in: 64 kicks, all queued in
    /// the kernel, and 1 127 of 2 048 entries free. The stuck kicks give
    /// their slots back and a new kick starts; none starts while every entry
    /// is taken (it would queue too), nor while a kicker is out.
    #[test]
    fn stuck_kicks_make_way_for_a_new_one_once_an_entry_is_free() {
        let now = Instant::now() + Duration::from_secs(1);
        let mut k: Vec<Kicker> = (0..64).map(|_| kicker(now - KICK_PATIENCE * 2, false)).collect();
        let mut kicks = 64u32;
        let mut wanted = 0u32;
        assert!(!kick_now(wanted, kicks, 921, 2048));
        let n = mark_stuck(&mut k, now);
        kicks -= n;
        wanted += n;
        assert!(kick_now(wanted, kicks, 921, 2048), "a new kick once the stuck ones gave their slots back");
        assert!(!kick_now(wanted, kicks, 2048, 2048), "no kick while every entry is taken");
        assert!(!kick_now(wanted, 1, 921, 2048), "no second kicker while one is out");
        assert!(!kick_now(0, kicks, 921, 2048), "no kick nobody asked for");
    }
}
