//! The lease authority: the one interface through which the filesystem core
//! asks every question SPEC sections 3 to 7 call lease behaviour, and learns
//! what to carry out.
//!
//! The core never decides a lease question itself. It asks: may this owner
//! have this range now, and with which epoch ([`LeaseAuthority::request`])?
//! Is this process's view of this name current ([`LeaseAuthority::views`])?
//! Is this holder still the holder, or was it fenced
//! ([`LeaseAuthority::fenced_handle`], [`LeaseAuthority::held_by`])? What is
//! the lowest epoch a path may carry ([`LeaseAuthority::floors`])? It then
//! carries out the answer: replies, parks a lock wait, delivers the
//! returned [`Effect`]s (grant or refuse a parked waiter, a lease broken).
//!
//! Shaped for a second, multi-host implementation (SPEC 10, etcd):
//! - Leases are named by inode *and* reached by path: a remote authority
//!   keys them by mount-relative path, which the core can always supply
//!   ([`LeaseAuthority::detach`] binds a live lease to its path when its
//!   name goes away).
//! - An answer may arrive later: a request that cannot be granted now is
//!   parked ([`Outcome`]) and granted by a later effect (a timer tick here;
//!   a watch event or a remote transaction there).
//! - Asking may fail because the arbiter is unreachable: the operations
//!   that need it return `Result` and fail with `EIO` within bounded time.
//! - Answers that arrive later are handed over by [`LeaseAuthority::tick`]:
//!   the authority calls its [`Wake`] when it has some (here: a waiter's
//!   deadline came nearer; there: a watch event or a finished remote
//!   transaction), and the lease timer then ticks at once instead of
//!   sleeping to its next deadline.
//! - A whole host's holders can be fenced at once
//!   ([`LeaseAuthority::fence_all`]: an administrator here, the loss of the
//!   host's arbiter session there), reported as one [`Effect::Broken`] per
//!   holder, like a single break.
//!
//! [`LocalAuthority`](super::local::LocalAuthority) is the single-host
//! implementation over the pure state machine in [`super::machine`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::floors::Floors;
use super::machine::{Effect, Epoch, Fenced, Lease, Lock, Outcome, Owner, Request, WaitId};
use super::views::Views;
use crate::error::Result;
use crate::namespace::Ino;

/// Wakes the lease timer before its deadline: the authority has effects to
/// hand over through [`LeaseAuthority::tick`]. A wake-up given while the
/// timer is busy is kept, so none is lost.
#[derive(Debug, Clone, Default)]
pub struct Wake(Arc<(Mutex<bool>, Condvar)>);

impl Wake {
    /// Have the timer tick now.
    pub fn wake(&self) {
        let (flag, cond) = &*self.0;
        *flag.lock() = true;
        cond.notify_one();
    }

    /// Sleep until woken or for `timeout`; true when woken.
    pub fn sleep(&self, timeout: Duration) -> bool {
        let (flag, cond) = &*self.0;
        let mut woken = flag.lock();
        if !*woken {
            cond.wait_for(&mut woken, timeout);
        }
        std::mem::take(&mut *woken)
    }
}

/// Lists other hosts' leases under a prefix ([`LeaseAuthority::remote_leases`]).
pub type RemoteLeases = Box<dyn FnOnce(&str) -> Vec<super::rows::LeaseRow> + Send>;

/// What an authority must ask another party (etcd) before it can answer:
/// the caller sends it **without the state lock**, so other requests go on
/// meanwhile, and hands the answer back to the `finish_` call that matches
/// the `begin_` call that returned it.
pub struct Question(Box<dyn FnOnce() -> Answer + Send>);

impl Question {
    pub fn new(ask: impl FnOnce() -> Answer + Send + 'static) -> Question {
        Question(Box::new(ask))
    }

    /// Ask (blocks for as long as the other party takes).
    pub fn send(self) -> Answer {
        (self.0)()
    }
}

/// The answer to a [`Question`], meaningful only to the authority that
/// asked it.
pub struct Answer(pub Box<dyn std::any::Any + Send>);

impl Answer {
    /// The answer to [`LeaseAuthority::begin_test`]'s question: the lock
    /// that would conflict, if any.
    pub fn found_lock(self) -> Option<Lock> {
        self.0.downcast::<Option<Lock>>().map(|b| *b).unwrap_or(None)
    }
}

/// Work an authority leaves to run without the state lock, whose outcome
/// it needs to hear nothing of (a release, a renewal seen by other hosts).
/// The caller runs it before it answers the request that caused it, so a
/// release is done when the unlock or close returns; what no request path
/// runs, the next tick does.
pub struct Errand(Box<dyn FnOnce() + Send>);

impl Errand {
    pub fn new(run: impl FnOnce() + Send + 'static) -> Errand {
        Errand(Box::new(run))
    }

    pub fn run(self) {
        (self.0)()
    }
}

/// How a lock request goes on: answered, or a question to send first.
pub enum Step {
    Done(Outcome, Vec<Effect>),
    Ask(Question),
}

/// Everything the filesystem core asks about leases.
pub trait LeaseAuthority: Send + std::fmt::Debug {
    /// Milliseconds on the lease clock (advances the authority's clock).
    fn now(&mut self) -> u64;
    /// Call `wake` whenever [`LeaseAuthority::tick`] has work before the
    /// deadline it last returned.
    fn set_wake(&mut self, wake: Wake);

    // Lock requests, tests, releases and interrupts (SPEC 2, 3).

    /// Ask for a lock (or unlock). `wait` names the request when it may
    /// block: the answer is then either now or a later effect for `wait`.
    fn request(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<(Outcome, Vec<Effect>)>;
    /// [`LeaseAuthority::request`] in two halves, for the caller to send
    /// the question in between without its state lock. An authority that
    /// never asks anyone answers at once.
    fn begin_request(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<Step> {
        let (outcome, effects) = self.request(ino, req, wait)?;
        Ok(Step::Done(outcome, effects))
    }
    /// The answer to the question [`LeaseAuthority::begin_request`] returned.
    fn finish_request(&mut self, answer: Answer) -> Result<(Outcome, Vec<Effect>)> {
        let _ = answer;
        Err(crate::error::Error::Io)
    }
    /// What the transaction storing the current change must also compare
    /// and write (the epochs of acquisitions by create or link on a shared
    /// namespace).
    fn take_claims(&mut self) -> Vec<crate::namespace::replica::Condition> {
        Vec::new()
    }
    /// Errands left by the calls so far, to run without the state lock.
    fn take_errands(&mut self) -> Vec<Errand> {
        Vec::new()
    }
    /// The lock that would conflict with `req` (`F_GETLK`).
    fn test(&self, ino: Ino, req: &Request) -> Option<Lock>;
    /// [`LeaseAuthority::test`], or the read to send without the state
    /// lock first; its answer is the `Option<Lock>` to report.
    fn begin_test(&self, ino: Ino, req: &Request) -> std::result::Result<Option<Lock>, Question> {
        Ok(self.test(ino, req))
    }
    /// A parked request was interrupted by a signal: forget it.
    fn interrupt(&mut self, id: WaitId) -> Option<Vec<Effect>>;
    /// POSIX locks of `owner` on the file are released (close of any of
    /// its descriptors).
    fn release_owner(&mut self, ino: Ino, owner: Owner) -> Vec<Effect>;
    /// The open file `handle` is closed for good: its `flock` and OFD locks
    /// go.
    fn release_handle(&mut self, ino: Ino, handle: u64, flock_owner: Option<Owner>) -> Vec<Effect>;

    // Epochs and their durability (SPEC 5).

    /// The lease's current epoch as this host knows it.
    fn epoch(&self, ino: Ino) -> Epoch;
    /// Bring the epochs of `inos` up to what the whole namespace knows now:
    /// afterwards [`LeaseAuthority::epoch`] of each is no lower than any
    /// grant that completed anywhere before the call (SPEC 10). What users
    /// read as an epoch (the xattr, `.leasefs/leases`) goes through here.
    /// On one host its epochs are already that; across hosts it costs one
    /// quorum read, and fails (`EIO`) rather than show an epoch it could
    /// not check.
    fn refresh_epochs(&mut self, _inos: &[Ino]) -> Result<()> {
        Ok(())
    }
    /// [`LeaseAuthority::refresh_epochs`] in two halves: the read to send
    /// without the state lock (none when there is nothing to ask), whose
    /// answer goes to [`LeaseAuthority::finish_refresh`].
    fn begin_refresh(&mut self, _inos: &[Ino]) -> Option<Question> {
        None
    }
    /// Raise the epochs as [`LeaseAuthority::begin_refresh`]'s read found them.
    fn finish_refresh(&mut self, answer: Answer) -> Result<()> {
        let _ = answer;
        Ok(())
    }
    /// Make the next epoch of `ino` durable before anything may hand it out.
    fn reserve(&mut self, ino: Ino) -> Result<()>;
    /// `open(O_CREAT|O_EXCL)` created the file: a new holder, epoch + 1.
    /// Fails (`EIO`) when the epoch cannot come from where epochs are
    /// decided (etcd): an acquisition never goes on with an epoch made up
    /// locally, which another host may have handed out too.
    fn acquire_by_create(&mut self, ino: Ino) -> Result<Vec<Effect>>;
    /// `link()` created the name (the dotlock idiom): epoch + 1, above
    /// `floor`; fails as [`LeaseAuthority::acquire_by_create`] does.
    fn acquire_by_link(&mut self, ino: Ino, floor: Epoch) -> Result<Vec<Effect>>;
    /// Never let `ino` carry an epoch below `floor`.
    fn raise_epoch(&mut self, ino: Ino, floor: Epoch);
    /// Never let any lease carry an epoch below `floor` (restored files
    /// after a restart), in O(1) per lease not yet touched.
    fn raise_all(&mut self, floor: Epoch);
    /// Path epoch floors and the durable ceiling.
    fn floors(&mut self) -> &mut Floors;
    /// The same, to read.
    fn floors_ref(&self) -> &Floors;

    // Lease identity (SPEC 4).

    /// True while the lease has a holder or a waiter.
    fn is_live(&self, ino: Ino) -> bool;
    /// Live on this host or, for a remote arbiter, on any host (asked
    /// before a rename over the lease, which keeps a live lease's inode).
    /// A remote arbiter may answer from what it last saw and leave a
    /// condition for the change's store step ([`LeaseAuthority::take_claims`])
    /// that fails it when that is no longer so.
    fn held_anywhere(&mut self, ino: Ino) -> bool {
        self.is_live(ino)
    }
    /// The inode is gone: drop its lease state.
    fn forget(&mut self, ino: Ino);
    /// A live lease lost its name: re-creating `path` re-attaches it.
    fn detach(&mut self, path: PathBuf, ino: Ino);
    /// The live lease detached from `path`, taken back (the name exists
    /// again).
    fn take_detached(&mut self, path: &Path) -> Option<Ino>;
    /// The live lease detached from `path`.
    fn detached(&self, path: &Path) -> Option<Ino>;
    /// Every detached lease and its path.
    fn detached_all(&self) -> Vec<(PathBuf, Ino)>;
    /// Keep only the detached leases for which `keep` holds.
    fn retain_detached(&mut self, keep: &mut dyn FnMut(Ino) -> bool);

    // Observations and compare-and-swap verdicts (SPEC 6).

    /// Per-process views and name history.
    fn views(&mut self) -> &mut Views;
    /// Observation records kept.
    fn observations(&self) -> usize;

    // Bounds on the lock table (ENOLCK beyond them).

    /// Bound what the lock table keeps.
    fn set_lock_limits(&mut self, limits: crate::lease::machine::LockLimits);
    /// The bounds in force.
    fn lock_limits(&self) -> crate::lease::machine::LockLimits;
    /// Locks held and waiters queued on the whole mount.
    fn lock_usage(&self) -> (usize, usize);
    /// Requests refused because a lock-table bound was reached.
    fn lock_limit_refusals(&self) -> u64;

    // TTLs, renewal, breaking and fences (SPEC 7).

    /// Set or clear the file's own TTL.
    fn set_ttl(&mut self, ino: Ino, ttl: Option<u64>) -> Vec<Effect>;
    /// The TTL in force (the file's own, else the mount's).
    fn effective_ttl(&self, ino: Ino) -> Option<u64>;
    /// Renew the holds of `handle` or of any of `pids`; true if one was held.
    fn renew(&mut self, ino: Ino, handle: Option<u64>, pids: &[u32]) -> bool;
    /// Expire what is due; the next deadline on the lease clock.
    fn tick(&mut self) -> (Vec<Effect>, Option<u64>);
    /// What the tick must ask another party (waiters to decide again), to
    /// send without the state lock; its answer goes to
    /// [`LeaseAuthority::finish_tick`].
    fn begin_tick(&mut self) -> Option<Question> {
        None
    }
    /// Carry out the answer to [`LeaseAuthority::begin_tick`]'s question.
    fn finish_tick(&mut self, answer: Answer) -> Vec<Effect> {
        let _ = answer;
        Vec::new()
    }
    /// Break the lease now (administrator): holders are fenced.
    fn break_now(&mut self, ino: Ino) -> Vec<Effect>;
    /// Every lease with a holder on this host.
    fn held(&self) -> Vec<Ino>;
    /// Every lease with a waiter (found from the waiters, not by looking
    /// at every lease).
    fn waited(&self) -> Vec<Ino>;
    /// Break every lease held on this host at once (administrator, or the
    /// host lost its arbiter session): every holder is fenced.
    fn fence_all(&mut self) -> Vec<Effect>;
    /// The fence on `handle`, if its hold was broken or taken over.
    fn fenced_handle(&self, ino: Ino, handle: u64) -> Option<Fenced>;
    /// The fence on any of `pids`.
    fn fenced_pid(&self, ino: Ino, pids: &[u32]) -> Option<Fenced>;
    /// True when anyone was fenced off the lease.
    fn has_fenced(&self, ino: Ino) -> bool;
    /// The pid among `pids` that holds the lease.
    fn held_by(&self, ino: Ino, pids: &[u32]) -> Option<u32>;

    // Guards (writes to a file allowed only to a lease's holder).

    /// The path of the lease guarding `ino`.
    fn guard(&self, ino: Ino) -> Option<PathBuf>;
    /// Guard `ino` by the lease at `path`.
    fn set_guard(&mut self, ino: Ino, path: PathBuf);
    /// Remove the guard; false if there was none.
    fn remove_guard(&mut self, ino: Ino) -> bool;

    // What `.leasefs/` shows.

    /// Every lease with state beyond its epoch (idle leases, known only by
    /// their epoch, are not listed).
    fn leases(&self) -> Vec<(Ino, &Lease)>;
    /// How many leases have state of their own, idle ones included (not
    /// those that only carry the floor of [`LeaseAuthority::raise_all`],
    /// such as files not touched since a restart).
    fn known(&self) -> usize;
    /// One lease's state.
    fn lease(&self, ino: Ino) -> Option<&Lease>;
    /// Seconds since the authority started.
    fn uptime(&self) -> f64;

    // A remote arbiter (SPEC 10).

    /// True when leases are arbitrated by name across hosts: the core then
    /// names a lease ([`LeaseAuthority::bind_path`]) before each lock
    /// request and acquisition.
    fn wants_paths(&self) -> bool {
        false
    }
    /// `ino` is the lease at the mount-relative `path` (`/a/b`).
    fn bind_path(&mut self, _ino: Ino, _path: &str) {}
    /// Grants and releases of holders on other hosts since the last call,
    /// in the order they happened (so in epoch order per lease), for
    /// `.leasefs/events`, each with the holder's command name.
    fn remote_events(&mut self) -> Vec<(crate::events::Event, Option<String>)> {
        Vec::new()
    }
    /// The backend's name and, for a remote one, what `status` shows of it.
    fn backend(&self) -> (&'static str, Option<serde_json::Value>) {
        ("local", None)
    }
    /// Why `fenced` was broken when it was not the lease timer or an
    /// administrator (`host_lost`: its host's arbiter session ended).
    fn break_reason(&self, _ino: Ino, _fenced: &Fenced) -> Option<&'static str> {
        None
    }
    /// What a shared namespace must find unchanged for a write under the
    /// lease `ino` (held here) to land: the holder's entry in the remote
    /// arbiter. `None` when the arbiter is this host.
    fn hold_condition(&self, _ino: Ino) -> Option<crate::namespace::replica::Condition> {
        None
    }

    /// How to list the leases held or awaited on other hosts (a remote
    /// arbiter), at or under a mount-relative prefix: one row each, shaped
    /// like the rows of `.leasefs/leases`, with each holder's `host`. Run by
    /// the caller without the state lock (it asks etcd); `None`: no other
    /// hosts.
    fn remote_leases(&self) -> Option<RemoteLeases> {
        None
    }
    /// The mount goes away: leave the arbiter cleanly, so other hosts'
    /// waiters are served at once instead of after this host's session expires.
    fn shutdown(&mut self) {}
}
