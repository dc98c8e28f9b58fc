//! Ring entries and their set-up: the mappings that hold them, a queue's
//! shared part (where replies are written and handed back to its thread),
//! registration of more entries.

use super::*;

/// An anonymous mapping holding [`CHUNK`] entries.
pub(super) struct Chunk {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
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
pub(super) struct Entry {
    pub(super) header: *mut u8,
    pub(super) payload: *mut u8,
}

/// The part of a queue other threads reach: entries (for replies), the
/// replies waiting to be committed, the wake-up eventfd.
pub(super) struct Shared {
    pub(super) qid: u16,
    pub(super) payload_len: usize,
    pub(super) entries: Mutex<Vec<Entry>>,
    pub(super) chunks: Mutex<Vec<Chunk>>,
    /// (entry, commit id) answered and not yet committed.
    pub(super) answered: Mutex<Vec<u32>>,
    pub(super) wake: OwnedFd,
    /// Where the eventfd reads land (written by the kernel, never read).
    pub(super) wake_buf: AtomicU64,
    /// What other threads may look at in the ring, while it exists.
    pub(super) view: RwLock<Option<RingView>>,
    pub(super) stats: Arc<QueueStats>,
    /// Set while the queue's thread serves what it received; the fence
    /// waits for it to clear after the thread took the kernel's news.
    pub(super) busy: AtomicBool,
    /// Bumped each time the queue's thread went through the kernel and
    /// served everything it got.
    pub(super) rounds: AtomicU64,
    pub(super) round_done: Condvar,
    pub(super) round_lock: Mutex<()>,
    /// Set when the connection is gone.
    pub(super) over: AtomicBool,
    /// The queue's thread.
    pub(super) tid: AtomicU32,
    /// The mount point, for kicks (set once the mount is live).
    pub(super) mountpoint: Arc<OnceLock<std::ffi::CString>>,
    /// Kicker threads whose kick is not known to be stuck (see [`kick`]).
    pub(super) kicks: AtomicU32,
    /// Every kicker thread, stuck ones too.
    pub(super) kickers: Mutex<Vec<Kicker>>,
    /// How many there are (`kickers.len()`, read without the lock).
    pub(super) kicker_threads: AtomicU32,
    /// Kicks asked for and not yet made.
    pub(super) kicks_wanted: AtomicU32,
}

// SAFETY: `Entry` pointers are into mappings owned by `chunks` for the
// life of `Shared`; access to an entry's bytes follows its ownership.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

thread_local! {
    /// The queue whose thread this is.
    pub(super) static QUEUE: std::cell::Cell<Option<u16>> = const { std::cell::Cell::new(None) };
}

impl Shared {
    pub(super) fn entry(&self, i: u32) -> Entry {
        self.entries.lock()[i as usize]
    }

    /// Nothing delivered and not yet served: no completion waiting, no
    /// task work pending for the ring, an entry free for a new request.
    /// The thread must also be asleep: while the kernel runs the task work
    /// that copies a request into an entry, the flag is already cleared and
    /// the completion not yet posted, but the thread is running.
    pub(super) fn quiet(&self) -> bool {
        let view = self.view.read();
        let Some(v) = view.as_ref() else { return true };
        v.quiet()
            && self.stats.entries.load(Ordering::Relaxed) > self.stats.held.load(Ordering::Relaxed)
            && crate::procfs::state(self.tid.load(Ordering::Relaxed)) == Some('S')
    }

    pub(super) fn wake(&self) {
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

/// Bind this thread to its queue's CPU, make its ring, register the first
/// entries and the wake-up read.
pub(super) fn setup(dev: RawFd, q: &Shared) -> io::Result<(Ring, Vec<(u64, i32)>)> {
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
pub(super) fn arm_wake(ring: &mut Ring, q: &Shared) {
    let buf = q.wake_buf.as_ptr() as u64;
    let sqe = Sqe::new(OP_READ, q.wake.as_raw_fd(), WAKE).addr(buf).len(8).off(u64::MAX);
    push(ring, &sqe);
}

pub(super) fn push(ring: &mut Ring, sqe: &Sqe) {
    while !ring.push(sqe) {
        if let Err(e) = ring.submit(false) {
            warn!("io_uring submit: {e}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Register `count` more entries (rounded up to a chunk) on queue `q`.
pub(super) fn grow(ring: &mut Ring, dev: RawFd, q: &Shared, count: u32) -> io::Result<()> {
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
