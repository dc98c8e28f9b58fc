//! The lease authority: the one interface through which the filesystem core
//! asks every question SPEC sections 3 to 7 call lease behaviour, and learns
//! what to carry out.
//!
//! The core never decides a lease question itself. It asks: may this owner
//! have this range now, and with which epoch ([`LeaseAuthority::request`])?
//! Is this process's view of this name current (the table's views)?
//! Is this holder still the holder, or was it fenced
//! ([`LeaseAuthority::fenced_handle`], [`LeaseAuthority::held_by`])? What is
//! the lowest epoch a path may carry (the table's floors)? It then
//! carries out the answer: replies, parks a lock wait, delivers the
//! returned [`Effect`]s (grant or refuse a parked waiter, a lease broken).
//!
//! [`LeaseAuthority`] is one type for one host and for several. The lease
//! table ([`LocalAuthority`], over the pure state machine in
//! [`super::machine`]) answers everything a host decides on its own: views
//! and compare-and-swap, fences, guards, detached leases, TTLs. What is this
//! host's alone in every backend the core reads and changes on the table
//! itself ([`LeaseAuthority::table`]); everything another host may have a
//! say in is a method of the authority. With other
//! hosts (SPEC 10), an [`Arbitration`] decides what they share: who is
//! granted a lease-level lock and with which epoch, which epochs users may
//! read, whether a lease is held anywhere, and what a change's transaction
//! must also compare. That trait is the whole difference between one host
//! and several:
//! - Leases are named by inode *and* reached by path: the arbitration keys
//!   them by mount-relative path, which the core supplies
//!   ([`LeaseAuthority::bind_path`]).
//! - An answer may arrive later: a request that cannot be granted now is
//!   parked ([`Outcome`]) and granted by a later effect (a timer tick here;
//!   a watch event or a remote transaction there).
//! - Asking may fail because the arbiter is unreachable: the operations
//!   that need it return `Result` and fail with `EIO` within bounded time,
//!   and what must be asked is handed to the caller as a [`Question`] to
//!   send without its state lock.
//! - Answers that arrive later are handed over by [`LeaseAuthority::tick`]:
//!   the authority calls its [`Wake`] when it has some, and the lease
//!   timer then ticks at once instead of sleeping to its next deadline.
//! - A whole host's holders can be fenced at once
//!   ([`LeaseAuthority::fence_all`]: an administrator here, the loss of the
//!   host's arbiter session there), reported as one [`Effect::Broken`] per
//!   holder, like a single break.

use super::arbitration::Arbitration;
use super::local::LocalAuthority;
use super::machine::{Effect, Epoch, Fenced, Lock, Outcome, Owner, Request, WaitId};
pub use super::seam::{Answer, Errand, Question, RemoteHolders, RemoteLeases, Step, Wake};
use crate::error::Result;
use crate::namespace::Ino;

/// Everything the filesystem core asks about leases: the lease table of
/// this host ([`LocalAuthority`]: holders, waiters, epochs, views, fences,
/// guards, detached leases), and, on a mount whose leases are shared by
/// several hosts, the [`Arbitration`] that decides their grants and
/// epochs. Every question goes to the table; only those whose answer
/// depends on other hosts also go through the arbitration, so what one
/// host and several hosts do differently is exactly the [`Arbitration`]
/// trait.
#[derive(Debug)]
pub struct LeaseAuthority {
    local: LocalAuthority,
    shared: Option<Box<dyn Arbitration>>,
}

impl LeaseAuthority {
    /// Leases decided on this host alone.
    pub fn single_host(local: LocalAuthority) -> LeaseAuthority {
        LeaseAuthority { local, shared: None }
    }

    /// Leases whose grants and epochs `arbitration` decides with other hosts.
    pub fn shared(local: LocalAuthority, arbitration: Box<dyn Arbitration>) -> LeaseAuthority {
        LeaseAuthority { local, shared: Some(arbitration) }
    }

    /// This host's lease table, for what is this host's alone in every
    /// backend and needs no other host's word: detached names, guards,
    /// per-process views, TTL settings, lock-table bounds, and the rows
    /// `.leasefs/` shows. Questions whose answer may depend on other hosts
    /// (grants, releases, epochs, holders, fences, ticks) are the
    /// authority's own methods, never asked here.
    pub fn table(&self) -> &LocalAuthority {
        &self.local
    }

    /// [`LeaseAuthority::table`], to change what is this host's alone.
    pub fn table_mut(&mut self) -> &mut LocalAuthority {
        &mut self.local
    }

    /// Milliseconds on the lease clock (advances the authority's clock).
    pub fn now(&mut self) -> u64 {
        self.local.now()
    }

    /// Call `wake` whenever [`LeaseAuthority::tick`] has work before the
    /// deadline it last returned.
    pub fn set_wake(&mut self, wake: Wake) {
        self.local.set_wake(wake.clone());
        if let Some(a) = &mut self.shared {
            a.set_wake(wake);
        }
    }

    // Lock requests, tests, releases and interrupts (SPEC 2, 3).

    /// Ask for a lock (or unlock). `wait` names the request when it may
    /// block: the answer is then either now or a later effect for `wait`.
    pub fn request(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<(Outcome, Vec<Effect>)> {
        match self.begin_request(ino, req, wait)? {
            Step::Done(outcome, effects) => Ok((outcome, effects)),
            Step::Ask(q) => self.finish_request(q.send()),
        }
    }

    /// [`LeaseAuthority::request`] in two halves, for the caller to send
    /// the question in between without its state lock. A single host
    /// answers at once.
    pub fn begin_request(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<Step> {
        match &mut self.shared {
            Some(a) => a.begin_request(&mut self.local, ino, req, wait),
            None => {
                let (outcome, effects) = self.local.request(ino, req, wait)?;
                Ok(Step::Done(outcome, effects))
            }
        }
    }

    /// The answer to the question [`LeaseAuthority::begin_request`] returned.
    pub fn finish_request(&mut self, answer: Answer) -> Result<(Outcome, Vec<Effect>)> {
        match &mut self.shared {
            Some(a) => a.finish_request(&mut self.local, answer),
            None => Err(crate::error::Error::Io),
        }
    }

    /// What the transaction storing the current change must also compare
    /// and write (the epochs of acquisitions by create or link on a shared
    /// namespace).
    pub fn take_claims(&mut self) -> Vec<crate::namespace::replica::Condition> {
        self.shared.as_mut().map(|a| a.take_claims()).unwrap_or_default()
    }

    /// Whether a process on this host reads the event stream (other
    /// hosts' grants and releases are wanted); leaves an errand.
    pub fn listen(&mut self, on: bool) {
        if let Some(a) = self.shared.as_mut() {
            a.listen(on);
        }
    }

    /// Errands left by the calls so far, to run without the state lock.
    pub fn take_errands(&mut self) -> Vec<Errand> {
        self.shared.as_mut().map(|a| a.take_errands()).unwrap_or_default()
    }

    /// The lock that would conflict with `req` (`F_GETLK`).
    pub fn test(&self, ino: Ino, req: &Request) -> Option<Lock> {
        match self.begin_test(ino, req) {
            Ok(found) => found,
            Err(q) => q.send().found_lock(),
        }
    }

    /// [`LeaseAuthority::test`], or the read to send without the state
    /// lock first; its answer is the `Option<Lock>` to report.
    pub fn begin_test(&self, ino: Ino, req: &Request) -> std::result::Result<Option<Lock>, Question> {
        if let Some(l) = self.local.test(ino, req) {
            return Ok(Some(l));
        }
        match self.shared.as_ref().and_then(|a| a.ask_test(ino, req)) {
            Some(q) => Err(q),
            None => Ok(None),
        }
    }

    /// A parked request was interrupted by a signal: forget it.
    pub fn interrupt(&mut self, id: WaitId) -> Option<Vec<Effect>> {
        if let Some(effects) = self.shared.as_mut().and_then(|a| a.interrupt(id)) {
            return Some(effects);
        }
        self.local.interrupt(id)
    }

    /// POSIX locks of `owner` on the file are released (close of any of
    /// its descriptors).
    pub fn release_owner(&mut self, ino: Ino, owner: Owner) -> Vec<Effect> {
        let effects = self.local.release_owner(ino, owner);
        self.changed(ino);
        effects
    }

    /// The open file `handle` is closed for good: its `flock` and OFD locks
    /// go.
    pub fn release_handle(&mut self, ino: Ino, handle: u64, flock_owner: Option<Owner>) -> Vec<Effect> {
        let effects = self.local.release_handle(ino, handle, flock_owner);
        self.changed(ino);
        effects
    }

    /// Holders of `ino` on this host changed without a request the
    /// arbitration saw (a release, a break, a fence).
    fn changed(&mut self, ino: Ino) {
        if let Some(a) = &mut self.shared {
            a.changed(&self.local, ino);
        }
    }

    // Epochs and their durability (SPEC 5).

    /// The lease's current epoch as this host knows it.
    pub fn epoch(&self, ino: Ino) -> Epoch {
        self.local.epoch(ino)
    }

    /// Bring the epochs of `inos` up to what the whole namespace knows now:
    /// afterwards [`LeaseAuthority::epoch`] of each is no lower than any
    /// grant that completed anywhere before the call (SPEC 10). What users
    /// read as an epoch (the xattr, `.leasefs/leases`) goes through here.
    /// On one host its epochs are already that; across hosts it costs one
    /// quorum read, and fails (`EIO`) rather than show an epoch it could
    /// not check.
    pub fn refresh_epochs(&mut self, inos: &[Ino]) -> Result<()> {
        match self.begin_refresh(inos) {
            Some(q) => self.finish_refresh(q.send()),
            None => Ok(()),
        }
    }

    /// [`LeaseAuthority::refresh_epochs`] in two halves: the read to send
    /// without the state lock (none when there is nothing to ask), whose
    /// answer goes to [`LeaseAuthority::finish_refresh`].
    pub fn begin_refresh(&mut self, inos: &[Ino]) -> Option<Question> {
        self.shared.as_mut().and_then(|a| a.begin_refresh(&self.local, inos))
    }

    /// Raise the epochs as [`LeaseAuthority::begin_refresh`]'s read found them.
    pub fn finish_refresh(&mut self, answer: Answer) -> Result<()> {
        match &mut self.shared {
            Some(a) => a.finish_refresh(&mut self.local, answer),
            None => Ok(()),
        }
    }

    /// Make the next epoch of `ino` durable before anything may hand it out.
    pub fn reserve(&mut self, ino: Ino) -> Result<()> {
        self.local.reserve(ino)
    }

    /// `open(O_CREAT|O_EXCL)` created the file: a new holder, epoch + 1.
    /// Fails (`EIO`) when the epoch cannot come from where epochs are
    /// decided (etcd): an acquisition never goes on with an epoch made up
    /// locally, which another host may have handed out too.
    pub fn acquire_by_create(&mut self, ino: Ino) -> Result<Vec<Effect>> {
        if let Some(a) = &mut self.shared {
            if !a.claim(&mut self.local, ino, "O_EXCL")? {
                return Ok(Vec::new());
            }
        }
        self.local.acquire_by_create(ino)
    }

    /// `link()` created the name (the dotlock idiom): epoch + 1, above
    /// `floor`; fails as [`LeaseAuthority::acquire_by_create`] does.
    pub fn acquire_by_link(&mut self, ino: Ino, floor: Epoch) -> Result<Vec<Effect>> {
        if let Some(a) = &mut self.shared {
            a.claim(&mut self.local, ino, "link")?;
        }
        self.local.acquire_by_link(ino, floor)
    }

    /// Never let `ino` carry an epoch below `floor`.
    pub fn raise_epoch(&mut self, ino: Ino, floor: Epoch) {
        self.local.raise_epoch(ino, floor);
    }

    /// Never let any lease carry an epoch below `floor` (restored files
    /// after a restart), in O(1) per lease not yet touched.
    pub fn raise_all(&mut self, floor: Epoch) {
        self.local.raise_all(floor);
    }

    // Lease identity (SPEC 4).

    /// True while the lease has a holder or a waiter on this host.
    pub fn is_live(&self, ino: Ino) -> bool {
        self.local.is_live(ino) || self.shared.as_ref().is_some_and(|a| a.parked().any(|i| i == ino))
    }

    /// Live on this host or, with other hosts, on any host (asked before a
    /// rename over the lease, which keeps a live lease's inode). The
    /// arbitration may answer from what it last saw and leave a condition
    /// for the change's store step ([`LeaseAuthority::take_claims`]) that
    /// fails it when that is no longer so.
    pub fn held_anywhere(&mut self, ino: Ino) -> bool {
        self.is_live(ino) || self.shared.as_mut().is_some_and(|a| a.held_anywhere(ino))
    }

    /// The inode is gone: drop its lease state.
    pub fn forget(&mut self, ino: Ino) {
        if let Some(a) = &mut self.shared {
            a.forget(ino);
        }
        self.local.forget(ino);
    }

    // Observations and compare-and-swap verdicts (SPEC 6).

    // Bounds on the lock table (ENOLCK beyond them).

    /// Locks held and waiters queued on the whole mount.
    pub fn lock_usage(&self) -> (usize, usize) {
        let (held, waiting) = self.local.lock_usage();
        (held, waiting + self.shared.as_ref().map_or(0, |a| a.parked().count()))
    }

    // TTLs, renewal, breaking and fences (SPEC 7).

    /// Set or remove the TTL of `ino` (`None`: the mount's, if any).
    pub fn set_ttl(&mut self, ino: Ino, ttl: Option<u64>) -> Vec<Effect> {
        let effects = self.local.set_ttl(ino, ttl);
        if let Some(a) = &mut self.shared {
            a.ttl_changed(&self.local, ino);
        }
        effects
    }

    /// Renew the holds of `handle` or of any of `pids`; true if one was held.
    pub fn renew(&mut self, ino: Ino, handle: Option<u64>, pids: &[u32]) -> bool {
        let renewed = self.local.renew(ino, handle, pids);
        if renewed {
            if let Some(a) = &mut self.shared {
                a.renewed(&self.local, ino);
            }
        }
        renewed
    }

    /// Expire what is due; the next deadline on the lease clock.
    pub fn tick(&mut self) -> (Vec<Effect>, Option<u64>) {
        match &mut self.shared {
            Some(a) => a.tick(&mut self.local),
            None => self.local.tick(),
        }
    }

    /// What the tick must ask another party (waiters to decide again), to
    /// send without the state lock; its answer goes to
    /// [`LeaseAuthority::finish_tick`].
    pub fn begin_tick(&mut self) -> Option<Question> {
        self.shared.as_mut().and_then(|a| a.begin_tick())
    }

    /// Carry out the answer to [`LeaseAuthority::begin_tick`]'s question.
    pub fn finish_tick(&mut self, answer: Answer) -> Vec<Effect> {
        match &mut self.shared {
            Some(a) => a.finish_tick(&mut self.local, answer),
            None => Vec::new(),
        }
    }

    /// Break the lease now (administrator): holders are fenced.
    pub fn break_now(&mut self, ino: Ino) -> Vec<Effect> {
        let effects = self.local.break_now(ino);
        self.changed(ino);
        effects
    }

    /// Every lease with a holder on this host.
    pub fn held(&self) -> Vec<Ino> {
        self.local.held()
    }

    /// Every lease with a waiter (found from the waiters, not by looking
    /// at every lease).
    pub fn waited(&self) -> Vec<Ino> {
        let mut w = self.local.waited();
        if let Some(a) = &self.shared {
            w.extend(a.parked());
            w.sort_unstable_by_key(|i| i.0);
            w.dedup();
        }
        w
    }

    /// Break every lease held on this host at once (administrator, or the
    /// host lost its arbiter session): every holder is fenced.
    pub fn fence_all(&mut self) -> Vec<Effect> {
        let held = self.local.held();
        let effects = self.local.fence_all();
        for ino in held {
            self.changed(ino);
        }
        effects
    }

    /// The fence on `handle`, if its hold was broken or taken over.
    pub fn fenced_handle(&self, ino: Ino, handle: u64) -> Option<Fenced> {
        self.local.fenced_handle(ino, handle).or_else(|| self.lost_hold(ino, &|l| l.handle == handle))
    }

    /// The fence on any of `pids`.
    pub fn fenced_pid(&self, ino: Ino, pids: &[u32]) -> Option<Fenced> {
        self.local.fenced_pid(ino, pids).or_else(|| self.lost_hold(ino, &|l| pids.contains(&l.pid)))
    }

    /// True when anyone was fenced off the lease.
    pub fn has_fenced(&self, ino: Ino) -> bool {
        self.local.has_fenced(ino) || self.lost_hold(ino, &|_| true).is_some()
    }

    /// The pid among `pids` that holds the lease.
    pub fn held_by(&self, ino: Ino, pids: &[u32]) -> Option<u32> {
        let pid = self.local.held_by(ino, pids)?;
        self.lost_hold(ino, &|l| l.pid == pid).is_none().then_some(pid)
    }

    /// A lock of this host that the arbitration no longer backs (its host
    /// session is gone), to be treated as fenced before any tick says so.
    fn lost_hold(&self, ino: Ino, pick: &dyn Fn(&Lock) -> bool) -> Option<Fenced> {
        self.shared.as_ref()?.lost_hold(&self.local, ino, pick)
    }

    // Guards (writes to a file allowed only to a lease's holder).

    // What `.leasefs/` shows.

    // Several hosts (SPEC 10).

    /// True when leases are arbitrated by name across hosts: the core then
    /// names a lease ([`LeaseAuthority::bind_path`]) before each lock
    /// request and acquisition.
    pub fn wants_paths(&self) -> bool {
        self.shared.is_some()
    }

    /// `ino` is the lease at the mount-relative `path` (`/a/b`).
    pub fn bind_path(&mut self, ino: Ino, path: &str) {
        if let Some(a) = &mut self.shared {
            a.bind_path(ino, path);
        }
    }

    /// Grants and releases of holders on other hosts since the last call,
    /// in the order they happened (so in epoch order per lease), for
    /// `.leasefs/events`, each with the holder's command name.
    pub fn remote_events(&mut self) -> Vec<(crate::events::Event, Option<String>)> {
        self.shared.as_mut().map(|a| a.remote_events()).unwrap_or_default()
    }

    /// The backend's name and, for several hosts, what `status` shows of it.
    pub fn backend(&self) -> (&'static str, Option<serde_json::Value>) {
        match &self.shared {
            Some(a) => a.backend(),
            None => ("local", None),
        }
    }

    /// Why `fenced` was broken when it was not the lease timer or an
    /// administrator (`host_lost`: its host's arbiter session ended).
    pub fn break_reason(&self, ino: Ino, fenced: &Fenced) -> Option<&'static str> {
        self.shared.as_ref().and_then(|a| a.break_reason(ino, fenced))
    }

    /// What a shared namespace must find unchanged for a write under the
    /// lease `ino` (held here) to land: the holder's entry in the remote
    /// arbiter. `None` on a single host.
    pub fn hold_condition(&self, ino: Ino) -> Option<crate::namespace::replica::Condition> {
        self.shared.as_ref().and_then(|a| a.hold_condition(ino))
    }

    /// How to list the leases held or awaited on other hosts, at or under
    /// a mount-relative prefix: one row each, shaped like the rows of
    /// `.leasefs/leases`, with each holder's `host`. Run by the caller
    /// without the state lock (it asks etcd); `None`: no other hosts.
    pub fn remote_leases(&self) -> Option<RemoteLeases> {
        self.shared.as_ref().and_then(|a| a.remote_leases())
    }

    /// Other hosts' holders of `ino`, for `user.leasefs.holder`. Run by
    /// the caller without the state lock (it asks etcd); `None`: no other
    /// hosts.
    pub fn remote_holders(&self, ino: Ino) -> Option<RemoteHolders> {
        self.shared.as_ref().and_then(|a| a.remote_holders(ino))
    }

    /// The mount goes away: leave the arbiter cleanly, so other hosts'
    /// waiters are served at once instead of after this host's session expires.
    pub fn shutdown(&mut self) {
        if let Some(a) = &mut self.shared {
            a.shutdown();
        }
    }
}
