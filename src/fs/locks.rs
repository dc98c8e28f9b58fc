//! Lock requests, tests, interrupts, the lease timer and breaking, each
//! answered by the lease state machine and accounted for in the metrics.

use super::*;

/// How often the timer looks for a finished snapshot while one is written.
const COMPACTION_POLL: std::time::Duration = std::time::Duration::from_millis(5);
/// The pause between two slices of a snapshot image, for requests.
const SLICE_GAP: std::time::Duration = std::time::Duration::from_millis(1);
/// How often a host holding leases of a shared namespace applies what its
/// watch delivered when no request does: a TTL another host sets on a
/// lease held here reaches the holder's entry within about this long.
const HELD_CATCH_UP: std::time::Duration = std::time::Duration::from_millis(250);

impl Fs {
    /// Run lease timers: break leases whose TTL ran out while someone
    /// waits. Returns what to answer and when to call again.
    pub fn tick(&self) -> (Vec<Effect>, Option<std::time::Duration>) {
        let mut st = self.state.lock();
        st.finish_compaction(false);
        if st.encoding() {
            self.compaction_step(&mut st);
        }
        let held_shared = st.sharing.replica.is_some() && !st.lease.held().is_empty();
        if held_shared {
            // TTLs other hosts set on leases held here (no round trip: what
            // the watch delivered).
            st.catch_up_queued();
        }
        let waited = st.lease.waited();
        for ino in waited {
            if let Err(e) = st.reserve(ino) {
                tracing::error!(
                    ino = ino.0,
                    "cannot make the next epoch durable ({e}); expired leases stay with their holders"
                );
                return (Vec::new(), Some(std::time::Duration::from_millis(100)));
            }
        }
        let (mut effects, next) = st.lease.tick();
        if let Some(question) = st.lease.begin_tick() {
            // Waiters decided again in etcd, without the state lock.
            drop(st);
            let answer = question.send();
            st = self.state.lock();
            effects.extend(st.lease.finish_tick(answer));
        }
        st.account(&effects);
        let remote = st.lease.remote_events();
        if !remote.is_empty() {
            st.emit_remote(remote);
        }
        let mut next = next.map(std::time::Duration::from_millis);
        if held_shared {
            next = Some(next.map_or(HELD_CATCH_UP, |n| n.min(HELD_CATCH_UP)));
        }
        if st.outgrown() {
            // Without an fsync nothing else would shrink the directory.
            self.tidy(&mut st);
        }
        if st.durable.compaction.is_some() {
            // The next slice of the image; or, while it is written: the
            // snapshot thread wakes the timer as it ends, and this covers
            // the moment between its wake-up and its exit.
            let poll = if st.encoding() { SLICE_GAP } else { COMPACTION_POLL };
            next = Some(next.map_or(poll, |n| n.min(poll)));
        }
        // Files the kernel holds past its bound, once new ones stop coming
        // (sent by the caller with `take_entry_drops`).
        let bound = st.bounds.limits.kernel_inodes;
        let parts = &mut *st;
        if let Some(again) = parts.cache.refs.trim(&parts.ns, bound, std::time::Instant::now()) {
            next = Some(next.map_or(again, |n| n.min(again)));
        }
        // Releases and renewals no request path sent.
        Self::run_errands(st);
        (effects, next)
    }

    /// Compact a state directory that outgrew the live state: what changed
    /// since the last flush is appended (its sync runs on the group-commit
    /// thread, answering nobody: no disk sync on the request path), then a
    /// snapshot is encoded a slice at a time and written off the request
    /// path as any other compaction.
    fn tidy(&self, st: &mut State) {
        tracing::debug!("the state directory outgrew the live state: compacting");
        // A full state disk or a failed store: nothing to compact now.
        if self.append_unsynced(st).is_err() {
            return;
        }
        // Unless appending started one already.
        if st.outgrown() {
            st.start_compaction();
        }
    }

    /// One slice of the snapshot image being encoded. Changes not yet in
    /// the journal are appended first (their sync runs on the group-commit
    /// thread, answering nobody): a slice must see only journaled state.
    fn compaction_step(&self, st: &mut State) {
        // A full state disk: try again on the next tick; other failures
        // are fail-stop and end the compaction.
        if self.append_unsynced(st).is_err() {
            if st.durable.store.as_ref().is_some_and(|s| s.failed()) {
                st.finish_compaction(true);
            }
            return;
        }
        st.compaction_step();
    }

    /// Break every lease held on this host at once (administrator; the
    /// multi-host authority does the same when the host loses its arbiter
    /// session). Returns the holders fenced and what to answer.
    pub fn fence_all(&self) -> Result<(usize, Vec<Effect>)> {
        let mut st = self.state.lock();
        st.clock();
        for ino in st.lease.held() {
            st.reserve(ino)?;
        }
        let effects = st.lease.fence_all();
        st.report.breaking = "admin";
        st.account(&effects);
        st.report.breaking = "ttl";
        let fenced = effects.iter().filter(|e| matches!(e, Effect::Broken(..))).count();
        Ok((fenced, effects))
    }

    /// Break a lease at once (administrator).
    pub fn break_lease(&self, ino: Ino) -> Vec<Effect> {
        self.break_for(ino, "admin")
    }

    /// Break a lease at once; the break event's reason is `why`.
    pub(super) fn break_for(&self, ino: Ino, why: &'static str) -> Vec<Effect> {
        let mut st = self.state.lock();
        st.clock();
        if st.reserve(ino).is_err() {
            return Vec::new();
        }
        let effects = st.lease.break_now(ino);
        st.report.breaking = why;
        st.account(&effects);
        st.report.breaking = "ttl";
        effects
    }

    /// The lease version of a file (SPEC 6).
    pub fn version(&self, ino: Ino) -> Result<u64> {
        Ok(self.state.lock().ns.get(ino)?.version)
    }

    /// Lock, unlock, or park a waiter (`wait`); see [`LeaseAuthority::request`].
    pub fn setlk(&self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<(Outcome, Vec<Effect>)> {
        let mut st = self.state.lock();
        st.ns.get(ino)?;
        st.name_lease(ino);
        let now = st.lease.now();
        // Durable before visible: a request that could advance the epoch
        // waits for the reservation (refused with ENOSPC/EIO if the state
        // directory cannot take it).
        if req.mode.is_some() {
            st.reserve(ino)?;
        } else if let Err(e) = st.reserve(ino) {
            tracing::error!(ino = ino.0, "cannot make the next epoch durable: {e}");
        }
        let released = if req.mode.is_none() { st.releases(ino, |l| l.owner == req.owner) } else { Vec::new() };
        let (outcome, effects) = match st.lease.begin_request(ino, req, wait)? {
            Step::Done(outcome, effects) => (outcome, effects),
            Step::Ask(question) => {
                // etcd is asked without the state lock: other requests go on
                // (requests on this file wait: they are keyed to its thread).
                drop(st);
                let answer = question.send();
                st = self.state.lock();
                st.lease.finish_request(answer)?
            }
        };
        match outcome {
            Outcome::Granted if req.mode.is_some() => {
                st.report.metrics.acquisitions += 1;
                let ev = State::lock_event(crate::events::Kind::Grant, &req, st.lease.epoch(ino));
                st.emit(ev, ino);
            }
            Outcome::Granted => {
                // An unlock: only what it really let go is a release.
                let still = st.lease.table().lease(ino).is_some_and(|l| l.locks().iter().any(|k| k.owner == req.owner));
                if !still {
                    for ev in released {
                        st.emit(ev, ino);
                    }
                }
            }
            Outcome::Parked => {
                st.report.metrics.contention += 1;
                if let Some(id) = wait {
                    st.report.parked_at.insert(id, now);
                    st.report.parked_req.insert(id, (ino, req));
                }
                let ev = State::lock_event(crate::events::Kind::Wait, &req, st.lease.epoch(ino));
                st.emit(ev, ino);
            }
            Outcome::Refused(Error::NoLock) => {
                let (held, waiting) = st.lease.lock_usage();
                st.bounds.hits.refuse(
                    super::limits::Limit::Locks,
                    Error::NoLock,
                    format_args!("lock table bound reached ({held} locks held, {waiting} waiters on the mount)"),
                );
            }
            Outcome::Refused(_) => st.report.metrics.contention += 1,
        }
        st.account(&effects);
        st.collect(ino);
        // An unlock's release is done before the unlock returns.
        Self::run_errands(st);
        Ok((outcome, effects))
    }

    /// Run what the lease authority left to send without the state lock
    /// (releases and renewals in etcd), after letting the lock go.
    pub(super) fn run_errands(mut st: parking_lot::MutexGuard<'_, State>) {
        let errands = st.lease.take_errands();
        drop(st);
        for e in errands {
            e.run();
        }
    }

    /// The lock that would block `req` (`F_GETLK`).
    pub fn getlk(&self, ino: Ino, req: &Request) -> Result<Option<Lock>> {
        let mut st = self.state.lock();
        st.ns.get(ino)?;
        st.name_lease(ino);
        match st.lease.begin_test(ino, req) {
            Ok(found) => Ok(found),
            Err(read) => {
                // Other hosts' holders are read without the state lock.
                drop(st);
                Ok(read.send().found_lock())
            }
        }
    }

    /// A signal interrupted a parked lock request.
    pub fn interrupt(&self, id: WaitId) -> Option<Vec<Effect>> {
        let mut st = self.state.lock();
        let waited = st.lease.waited();
        for ino in waited {
            let _ = st.reserve(ino);
        }
        let effects = st.lease.interrupt(id)?;
        st.account(&effects);
        Some(effects)
    }

    /// The epoch of the lease at `ino`.
    pub fn epoch(&self, ino: Ino) -> Epoch {
        self.state.lock().lease.epoch(ino)
    }
}
