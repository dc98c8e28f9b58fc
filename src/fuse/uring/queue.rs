//! The queue loop: one thread per queue takes completed entries, serves
//! their requests, commits the answers, keeps entries free and kicks the
//! kernel for requests it queued for want of one.

use super::*;

/// Serve queue `q` until the connection ends.
pub(super) fn run(ring: &mut Ring, early: Vec<(u64, i32)>, dev: RawFd, q: &Arc<Shared>, server: &fuser::RequestServer) {
    let mut l = QueueLoop {
        ring,
        dev,
        q,
        server,
        sink: q.clone(),
        scratch: vec![0; (COPY_BELOW + IN_HEADER + 256) / 8],
        held: 0,
        answered: Vec::new(),
        // Only root may leave SCHED_IDLE again.
        // SAFETY: geteuid has no preconditions.
        may_idle: unsafe { libc::geteuid() } == 0,
        movable: std::collections::HashMap::new(),
        wake_movable: false,
        last_kick: 0,
    };
    let mut early = early.into_iter();
    loop {
        if early.len() == 0 && !l.wait() {
            break;
        }
        l.q.busy.store(true, Ordering::SeqCst);
        let (over, kick_again) = l.serve_completions(&mut early);
        // Every entry was out: requests that came meanwhile wait in the
        // kernel for an entry to be committed (see [`kick`]).
        let exhausted = l.held >= l.q.stats.entries.load(Ordering::Relaxed);
        l.commit_answers();
        let grew = l.keep_entries_free();
        l.kick_if_needed(grew || exhausted || kick_again);
        {
            let _g = l.q.round_lock.lock();
            l.q.rounds.fetch_add(1, Ordering::SeqCst);
            l.q.round_done.notify_all();
        }
        l.q.busy.store(false, Ordering::SeqCst);
        if over {
            debug!(queue = l.q.qid, "connection ended");
            // Send the commits of the last answers, then stop.
            let _ = l.ring.submit(false);
            break;
        }
    }
}

/// One queue thread's loop and what it keeps between rounds.
struct QueueLoop<'a> {
    ring: &'a mut Ring,
    dev: RawFd,
    q: &'a Arc<Shared>,
    server: &'a fuser::RequestServer,
    sink: Arc<dyn fuser::ReplySink>,
    scratch: Vec<u64>,
    /// Entries holding a request not yet answered.
    held: u32,
    /// The answers to commit, swapped with `q.answered` each round (no
    /// allocation per round).
    answered: Vec<u32>,
    /// The thread may switch to `SCHED_IDLE` and back (root).
    may_idle: bool,
    movable: std::collections::HashMap<u32, bool>,
    /// An answer of this round goes to a client that may run on another
    /// CPU (see `client_may_move`).
    wake_movable: bool,
    /// The newest kick's request id: a request older than it delivered
    /// after it was a queued one (see [`kick`]).
    last_kick: u64,
}

impl QueueLoop<'_> {
    /// Submit what the last round queued and wait for completions; false
    /// when the ring failed.
    fn wait(&mut self) -> bool {
        let q = self.q;
        // Answers to clients that may run on another CPU: commit them as an
        // idle-policy thread, so that the scheduler counts this CPU as idle
        // and wakes the client here (see `client_may_move`).
        if self.wake_movable && self.ring.unsubmitted() > 0 {
            let p = libc::sched_param { sched_priority: 0 };
            // SAFETY: plain syscalls on this thread.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) };
            let _ = self.ring.submit(false);
            // SAFETY: as above.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
            q.stats.woken_here.fetch_add(1, Ordering::Relaxed);
        }
        self.wake_movable = false;
        // While kicks are out, look again after KICK_PATIENCE even if
        // nothing arrives: a kick may be stuck in the kernel's queue.
        let waited = if q.kicks.load(Ordering::SeqCst) > 0 {
            self.ring.submit_and_wait_for(KICK_PATIENCE)
        } else {
            self.ring.submit(true)
        };
        if let Err(e) = waited {
            warn!(queue = q.qid, "io_uring wait: {e}");
            return false;
        }
        true
    }

    /// Serve every completed entry (the early ones first); whether the
    /// connection ended, and whether a request older than the last kick
    /// arrived (one the kernel had queued: kick again).
    fn serve_completions(&mut self, early: &mut std::vec::IntoIter<(u64, i32)>) -> (bool, bool) {
        let q = self.q;
        let (mut over, mut kick_again) = (false, false);
        while let Some((user_data, res)) = early.next().or_else(|| self.ring.pop()) {
            if user_data == WAKE {
                arm_wake(self.ring, q);
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
            self.held += 1;
            q.stats.held.store(self.held, Ordering::Relaxed);
            q.stats.peak.fetch_max(self.held, Ordering::Relaxed);
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
                self.last_kick = self.last_kick.max(unique);
                answer_kick(q, user_data, unique);
                continue;
            } else if unique < self.last_kick {
                kick_again = true;
            }
            serve(q, e, &mut self.scratch, self.server, &self.sink, user_data);
        }
        (over, kick_again)
    }

    /// Commit what was answered (here or by other threads): each commit
    /// also fetches the entry's next request.
    fn commit_answers(&mut self) {
        let q = self.q;
        std::mem::swap(&mut self.answered, &mut *q.answered.lock());
        for i in self.answered.drain(..) {
            let e = q.entry(i);
            // SAFETY: the answered entry's header page is ours until committed.
            let commit_id = unsafe { std::ptr::read_unaligned(e.header.add(ENT_AT + 8).cast::<u64>()) };
            if self.may_idle && !self.wake_movable {
                // The request's pid, past the 16 bytes the answer overwrote.
                // SAFETY: as above.
                let tid = unsafe { std::ptr::read_unaligned(e.header.add(32).cast::<u32>()) };
                self.wake_movable = client_may_move(&mut self.movable, tid);
            }
            let mut cmd = [0u8; 24];
            cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
            cmd[16..18].copy_from_slice(&q.qid.to_ne_bytes());
            push(self.ring, &Sqe::new(OP_URING_CMD, self.dev, u64::from(i)).off(CMD_COMMIT_AND_FETCH).cmd(&cmd));
            self.held -= 1;
        }
        q.stats.held.store(self.held, Ordering::Relaxed);
    }

    /// Keep entries free for new requests while others wait: the kernel
    /// queues a request that finds no free entry and hands it to the next
    /// entry *committed* on that queue, not to entries registered later,
    /// so stay well ahead of parked requests. Whether it grew.
    fn keep_entries_free(&mut self) -> bool {
        let q = self.q;
        let entries = q.stats.entries.load(Ordering::Relaxed);
        if entries.saturating_sub(self.held) < SPARE.max(self.held) && entries < MAX_ENTRIES {
            match grow(self.ring, self.dev, q, entries) {
                Ok(()) => return true,
                Err(e) => warn!(queue = q.qid, "registering more ring entries: {e}"),
            }
        }
        false
    }

    /// Parked requests filled the entries (we grew) or took every one
    /// (exhausted), or a queued request arrived (`wanted`): requests may
    /// wait in the kernel. Kick until none older than the last kick
    /// arrives. A kick queued in the kernel (every entry was taken when it
    /// came) fetches nothing until an entry commits: its slot is given up,
    /// and another kick is made once entries are free (registered and
    /// submitted), where it takes one at once instead of queueing too.
    fn kick_if_needed(&mut self, wanted: bool) {
        let q = self.q;
        if q.kicks.load(Ordering::SeqCst) > 0 {
            let n = mark_stuck(&mut q.kickers.lock(), std::time::Instant::now());
            q.kicks.fetch_sub(n, Ordering::SeqCst);
            q.kicks_wanted.fetch_add(n, Ordering::SeqCst);
        }
        if kick_now(
            q.kicks_wanted.load(Ordering::SeqCst),
            q.kicks.load(Ordering::SeqCst),
            self.held,
            q.stats.entries.load(Ordering::Relaxed),
        ) {
            match self.ring.submit(false) {
                Ok(_) => start_kicks(q),
                Err(e) => warn!(queue = q.qid, "io_uring submit: {e}"),
            }
        }
        if wanted && self.held < q.stats.entries.load(Ordering::Relaxed) {
            // The kick must find the new entries registered and the
            // commits done, or it would queue behind the others.
            match self.ring.submit(false) {
                Ok(_) => kick(q),
                Err(e) => warn!(queue = q.qid, "io_uring submit: {e}"),
            }
        }
    }
}

/// A kick's request: answered here (`ENODATA`), the filesystem never sees it.
fn answer_kick(q: &Arc<Shared>, user_data: u64, unique: u64) {
    let mut out = [0u8; OUT_HEADER];
    out[..4].copy_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-libc::ENODATA).to_ne_bytes());
    out[8..].copy_from_slice(&unique.to_ne_bytes());
    if let Err(e) = fuser::ReplySink::send(&**q, user_data, &[IoSlice::new(&out)]) {
        warn!(queue = q.qid, "answering a kick: {e}");
    }
}

/// A kicker thread of a queue.
pub(super) struct Kicker {
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
