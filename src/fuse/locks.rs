//! Lock requests (`GETLK`, `SETLK`, `SETLKW`): decoding them into lease
//! requests, parking waiters, answering grants and refusals, and, under
//! io_uring, deciding a conflict again once the releases that may end it
//! were served (the settler).

use super::*;

/// How long after a descriptor's `FLUSH` a conflicting lock request waits
/// for its `RELEASE` (io_uring only, see `LeaseFs::settle`).
pub(super) const RELEASE_GRACE: Duration = Duration::from_millis(100);

/// `fuse_lk_in.lk_flags` bit marking a `flock(2)` request.
pub(super) const FUSE_LK_FLOCK: u32 = 1;

/// Run a handler, turning a panic into an `EIO` reply (the reply object
/// answers `EIO` when it is dropped unanswered during unwinding).
/// Answer `F_GETLK` with the conflicting lock found, if any.
pub(super) fn answer_getlk(result: Result<Option<crate::lease::Lock>, Error>, start: u64, end: u64, reply: ReplyLock) {
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
pub(super) fn answer_setlk(
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
pub(super) fn signalled_unseen(transport: &TransportReport, tid: u32) -> bool {
    transport.is_uring() && tid != 0 && crate::procfs::signal_pending(tid)
}

/// A parked lock wait of a thread [`signalled_unseen`]: ended with `EINTR`
/// as a `FUSE_INTERRUPT` would end it (nothing if it was answered since).
pub(super) fn interrupt_parked(fs: &Fs, waits: &Mutex<Waits>, unique: u64) {
    let mut w = waits.lock();
    if let Some(effects) = fs.interrupt(WaitId(unique)) {
        debug!(unique, "lock wait of a thread signalled as it was delivered: interrupted");
        w.deliver(effects, fs);
    }
}

/// Wait until no descriptor of `inos` is flushed and not released, each
/// flush for at most `RELEASE_GRACE` after it (see
/// `LeaseFs::defer_conflict`); flushes past their grace are forgotten.
pub(super) fn wait_for_releases(closing: &Closing, inos: impl Iterator<Item = u64>) {
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

/// A lock request about to be refused for a conflict, to be decided again
/// (and answered) by the settler once the inode's pending releases and the
/// other queues were served.
pub(super) struct Settle {
    ino: u64,
    decide: Box<dyn FnOnce() + Send>,
}

/// The fields of a FUSE lock request (`GETLK`, `SETLK`, `SETLKW`), as fuser
/// hands them to the adapter.
#[derive(Clone, Copy)]
pub(super) struct LockCall {
    /// The request's id.
    pub unique: u64,
    /// The thread that asked (request header).
    pub tid: u32,
    pub ino: u64,
    pub fh: FileHandle,
    pub owner: LockOwner,
    pub start: u64,
    pub end: u64,
    pub typ: i32,
    /// The lock's pid (`l_pid` of the request).
    pub pid: u32,
}

impl LeaseFs {
    /// The lease request a lock call asks for (its raw `lk_flags` taken
    /// from what the request hook recorded).
    pub(super) fn lock_request(&self, w: &mut Waits, c: &LockCall) -> Result<LockRequest, Error> {
        let LockCall { unique, fh, owner, start, end, typ, pid, .. } = *c;
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
    pub(super) fn closed(&self, ino: u64, fh: u64) {
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
    pub(super) fn defer_conflict(&self, ino: u64, decide: Box<dyn FnOnce() + Send>) {
        self.transport.note_conflict();
        let tx = self.settler.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<Settle>();
            let (transport, closing) = (Arc::downgrade(&self.transport), self.closing.clone());
            let spawned = std::thread::Builder::new().name("lock-settle".into()).spawn(move || {
                while let Ok(first) = rx.recv() {
                    // Every request deferred before this round began is
                    // covered by it.
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    wait_for_releases(&closing, batch.iter().map(|s| s.ino));
                    if let Some(transport) = transport.upgrade() {
                        transport.settle();
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

    /// `GETLK`.
    pub(super) fn serve_getlk(&self, c: LockCall, reply: ReplyLock) {
        let LockCall { ino, start, end, .. } = c;
        guarded("getlk", || {
            let lreq = self.lock_request(&mut self.waits.lock(), &c);
            let result = lreq.and_then(|r| self.fs.getlk(Ino(ino), &r));
            match (result, lreq) {
                // A conflict may be a release still on another CPU's queue.
                (Ok(Some(_)), Ok(r)) if self.transport.is_uring() => {
                    let fs = self.fs.clone();
                    self.defer_conflict(ino, Box::new(move || answer_getlk(fs.getlk(Ino(ino), &r), start, end, reply)));
                }
                (result, _) => answer_getlk(result, start, end, reply),
            }
        });
    }

    /// `SETLK` (`sleep`: `SETLKW`).
    pub(super) fn serve_setlk(&self, c: LockCall, sleep: bool, reply: ReplyEmpty) {
        let LockCall { unique, tid, ino, pid, .. } = c;
        guarded("setlk", || {
            let lreq = {
                let mut w = self.waits.lock();
                let lreq = match self.lock_request(&mut w, &c) {
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
            let answer = self.fs.setlk(Ino(ino), lreq, wait);
            // A conflict may be a release still on another CPU's queue
            // (io_uring): decided again once the other queues served what
            // they hold.
            if let Ok((Outcome::Refused(Error::WouldBlock), _)) = &answer {
                if self.transport.is_uring() {
                    if let Ok((_, effects)) = answer {
                        self.waits.lock().deliver(effects, &self.fs);
                    }
                    let (fs, waits) = (self.fs.clone(), self.waits.clone());
                    let transport = self.transport.clone();
                    return self.defer_conflict(
                        ino,
                        Box::new(move || {
                            let answer = fs.setlk(Ino(ino), lreq, wait);
                            if answer_setlk(&fs, &waits, ino, lreq, pid, unique, answer, reply)
                                && signalled_unseen(&transport, tid)
                            {
                                interrupt_parked(&fs, &waits, unique);
                            }
                        }),
                    );
                }
            }
            if answer_setlk(&self.fs, &self.waits, ino, lreq, pid, unique, answer, reply)
                && signalled_unseen(&self.transport, tid)
            {
                interrupt_parked(&self.fs, &self.waits, unique);
            }
        });
    }
}
