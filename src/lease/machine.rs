//! The lease state machine: holders, waiters and epochs of every lease.
//!
//! Pure: no I/O, no clock, no fuser types. Callers describe what happened
//! (a lock request, a close, an interrupt) and get back what to do
//! ([`Effect`]s: answer a parked waiter, make an epoch durable).
//!
//! Invariants kept here:
//! - **One exclusive holder.** No two locks of different owners that overlap
//!   are both held unless both are shared. `flock` and POSIX locks on one
//!   lease conflict with each other: a lease has one owner at a time.
//! - **Epochs only go up.** A lease's epoch rises by exactly one each time a
//!   new owner acquires it exclusively (exclusive `flock`, whole-file POSIX
//!   write lock, `O_EXCL` create, `link`), never on re-locks by the owner
//!   that already holds it, never on shared or byte-range locks.
//! - **Fair.** Waiters are served in arrival order: a request that conflicts
//!   with an earlier waiter queues behind it, so a stream of shared requests
//!   cannot starve a waiting exclusive one. An owner that already holds a lock
//!   on the lease is not queued behind others (its upgrade would otherwise
//!   deadlock against waiters that wait for it).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::error::Error;
use crate::namespace::{Ino, InoMap, InoSet};

/// Who owns a lock: the open file description for `flock` and OFD locks,
/// the process's file table for POSIX locks (as the kernel reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner(pub u64);

/// A parked lock request, named by the FUSE request id that waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitId(pub u64);

/// A lease's fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(pub u64);

/// Which API took a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// `flock(2)`: whole file, owned by the open file description.
    Flock,
    /// `fcntl` record locks (POSIX and OFD).
    Posix,
}

/// Shared (read) or exclusive (write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// Largest offset POSIX locks use for "to end of file" (`OFFSET_MAX`).
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// An inclusive byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub end: u64,
}

impl Range {
    /// The whole file.
    pub const WHOLE: Range = Range { start: 0, end: OFFSET_MAX };

    fn overlaps(&self, o: &Range) -> bool {
        self.start <= o.end && o.start <= self.end
    }

    /// True when the range covers the whole file.
    pub fn is_whole(&self) -> bool {
        self.start == 0 && self.end >= OFFSET_MAX
    }
}

/// A held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock {
    pub owner: Owner,
    pub kind: LockKind,
    pub mode: Mode,
    pub range: Range,
    /// Process id of the holder (reported by `F_GETLK`).
    pub pid: u32,
    /// The open file handle the lock was taken through.
    pub handle: u64,
    /// When it was granted (caller's clock, milliseconds).
    pub since: u64,
}

/// A holder whose lease was broken: its descriptor and process are fenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced {
    pub owner: Owner,
    pub handle: u64,
    pub pid: u32,
    /// The epoch it held.
    pub epoch: Epoch,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub owner: Owner,
    pub kind: LockKind,
    /// `None` unlocks.
    pub mode: Option<Mode>,
    pub range: Range,
    pub pid: u32,
    pub handle: u64,
}

impl Request {
    fn conflicts_with_lock(&self, l: &Lock) -> bool {
        let Some(mode) = self.mode else { return false };
        l.owner != self.owner && l.range.overlaps(&self.range) && (l.mode == Mode::Exclusive || mode == Mode::Exclusive)
    }

    fn conflicts_with_request(&self, o: &Request) -> bool {
        match (self.mode, o.mode) {
            (Some(a), Some(b)) => {
                o.owner != self.owner && o.range.overlaps(&self.range) && (a == Mode::Exclusive || b == Mode::Exclusive)
            }
            _ => false,
        }
    }

    fn acquires_lease(&self) -> bool {
        self.mode == Some(Mode::Exclusive) && (self.kind == LockKind::Flock || self.range.is_whole())
    }
}

/// What the caller must do after a state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Answer this parked request: granted.
    Grant(WaitId),
    /// Answer this parked request with an error.
    Refuse(WaitId, Error),
    /// A lease reached a new epoch (reported for events and logs). It is
    /// durable already: the core reserves epochs in the epoch journal
    /// before it asks for a grant (`reserve`), so nothing waits on this.
    Epoch(Ino, Epoch),
    /// A holder's lease was broken (TTL passed with a contender waiting, or
    /// an administrator broke it); it is fenced from now on.
    Broken(Ino, Fenced),
    /// A lease's TTL ran out with nobody waiting: its holder (pid) keeps it
    /// until a contender comes (then it is broken). Reported once per expiry.
    Expired(Ino, Epoch, u32),
}

/// Outcome of a lock request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done (granted or unlocked).
    Granted,
    /// Parked until granted, refused or interrupted (reported as an effect).
    Parked,
    /// Refused at once.
    Refused(Error),
}

#[derive(Debug, Clone)]
struct Waiter {
    id: WaitId,
    req: Request,
}

/// State of one lease.
#[derive(Debug, Clone, Default)]
pub struct Lease {
    epoch: Epoch,
    /// The owner that acquired the current epoch and still holds it exclusively.
    epoch_owner: Option<Owner>,
    locks: Vec<Lock>,
    waiters: VecDeque<Waiter>,
    /// Per-file TTL in milliseconds (the mount default applies without one).
    ttl: Option<u64>,
    /// When the holders' TTL runs out (caller's clock, milliseconds).
    expires: Option<u64>,
    /// Holders whose lease was broken.
    fenced: Vec<Fenced>,
    /// The expiry already reported as [`Effect::Expired`] (uncontended).
    told_expiry: Option<u64>,
}

impl Lease {
    /// The current epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// When the lease timer has work on this lease: the holders' TTL runs
    /// out while someone waits (break), or, uncontended, the first time it
    /// runs out (reported once; the holders keep the lease).
    fn deadline(&self) -> Option<u64> {
        if self.locks.is_empty() || self.waiters.is_empty() && self.told_expiry == self.expires {
            return None;
        }
        self.expires
    }

    /// True while the lease has a holder or a waiter.
    pub fn is_live(&self) -> bool {
        !self.locks.is_empty() || !self.waiters.is_empty()
    }

    /// Held locks.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Number of parked waiters.
    pub fn waiters(&self) -> usize {
        self.waiters.len()
    }

    /// Per-file TTL in milliseconds.
    pub fn ttl(&self) -> Option<u64> {
        self.ttl
    }

    /// When the current holders' TTL runs out.
    pub fn expires(&self) -> Option<u64> {
        self.expires
    }

    /// Holders that were broken and are fenced.
    pub fn fenced(&self) -> &[Fenced] {
        &self.fenced
    }

    fn holds_any(&self, owner: Owner) -> bool {
        self.locks.iter().any(|l| l.owner == owner)
    }

    fn blockers(&self, req: &Request) -> Vec<Owner> {
        self.locks.iter().filter(|l| req.conflicts_with_lock(l)).map(|l| l.owner).collect()
    }

    /// Can `req` be granted now, given the waiters queued before it?
    fn grantable(&self, req: &Request, ahead: usize) -> bool {
        if self.locks.iter().any(|l| req.conflicts_with_lock(l)) {
            return false;
        }
        // Fairness: queue behind earlier conflicting waiters unless we
        // already hold something here.
        self.holds_any(req.owner) || !self.waiters.iter().take(ahead).any(|w| req.conflicts_with_request(&w.req))
    }

    /// Apply a grantable request; returns the new epoch if it advanced.
    fn apply(&mut self, req: &Request, now: u64, ttl: Option<u64>) -> Option<Epoch> {
        if req.mode.is_some() {
            // (Re-)locking renews; a fenced holder that acquires again is
            // fenced no more.
            self.expires = ttl.map(|t| now.saturating_add(t));
            self.fenced.retain(|f| f.owner != req.owner && f.handle != req.handle);
        }
        let held_exclusively = self.epoch_owner == Some(req.owner);
        match req.kind {
            LockKind::Flock => self.locks.retain(|l| !(l.owner == req.owner && l.kind == LockKind::Flock)),
            LockKind::Posix => self.cut(req.owner, req.range),
        }
        if let Some(mode) = req.mode {
            self.locks.push(Lock {
                owner: req.owner,
                kind: req.kind,
                mode,
                range: req.range,
                pid: req.pid,
                handle: req.handle,
                since: now,
            });
            if req.kind == LockKind::Posix {
                self.merge(req.owner);
            }
        }
        self.settle_epoch_owner();
        if req.acquires_lease() && !held_exclusively {
            self.epoch = Epoch(self.epoch.0 + 1);
            self.epoch_owner = Some(req.owner);
            return Some(self.epoch);
        }
        None
    }

    /// Forget the epoch owner once it no longer holds the lease exclusively,
    /// so its next acquisition counts as a new holder.
    fn settle_epoch_owner(&mut self) {
        if let Some(o) = self.epoch_owner {
            let still = self.locks.iter().any(|l| {
                l.owner == o && l.mode == Mode::Exclusive && (l.kind == LockKind::Flock || l.range.is_whole())
            });
            if !still {
                self.epoch_owner = None;
            }
        }
    }

    /// Remove `range` from `owner`'s POSIX locks, splitting as needed.
    fn cut(&mut self, owner: Owner, range: Range) {
        let mut out = Vec::with_capacity(self.locks.len() + 1);
        for l in self.locks.drain(..) {
            if l.owner != owner || l.kind != LockKind::Posix || !l.range.overlaps(&range) {
                out.push(l);
                continue;
            }
            if l.range.start < range.start {
                out.push(Lock { range: Range { start: l.range.start, end: range.start - 1 }, ..l });
            }
            if l.range.end > range.end {
                out.push(Lock { range: Range { start: range.end + 1, end: l.range.end }, ..l });
            }
        }
        self.locks = out;
    }

    /// Merge `owner`'s adjacent or overlapping POSIX locks of the same mode.
    fn merge(&mut self, owner: Owner) {
        let (mut mine, rest): (Vec<Lock>, Vec<Lock>) =
            self.locks.drain(..).partition(|l| l.owner == owner && l.kind == LockKind::Posix);
        self.locks = rest;
        mine.sort_by_key(|l| l.range.start);
        let mut merged: Vec<Lock> = Vec::with_capacity(mine.len());
        for l in mine {
            if let Some(last) = merged.last_mut() {
                if last.mode == l.mode && last.range.end.saturating_add(1) >= l.range.start {
                    last.range.end = last.range.end.max(l.range.end);
                    continue;
                }
            }
            merged.push(l);
        }
        self.locks.extend(merged);
    }
}

/// Bounds on what callers can make the lock table keep. Beyond them a lock
/// request is refused with `ENOLCK`, as the kernel's own lock table does
/// when it cannot grow, instead of the daemon's memory growing without end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockLimits {
    /// POSIX/OFD ranges one owner may hold on one file.
    pub ranges_per_owner: usize,
    /// Locks (ranges and flocks) held on the whole mount.
    pub locks_total: usize,
    /// Waiters queued on one lease.
    pub waiters_per_lease: usize,
    /// Waiters queued on the whole mount.
    pub waiters_total: usize,
}

impl Default for LockLimits {
    fn default() -> LockLimits {
        LockLimits { ranges_per_owner: 16_384, locks_total: 1 << 20, waiters_per_lease: 4096, waiters_total: 65_536 }
    }
}

/// All leases and the waits-for relation between lock owners.
#[derive(Debug, Default)]
pub struct Locks {
    leases: InoMap<Lease>,
    limits: LockLimits,
    /// Locks held over every lease (kept up to date by [`Locks::recount`]).
    total_locks: usize,
    /// Requests refused because a limit was reached.
    limit_refusals: u64,
    /// Where each parked owner waits (for deadlock detection).
    waiting: HashMap<Owner, (Ino, WaitId)>,
    /// The caller's clock as of the last [`Locks::tick`], in milliseconds.
    now: u64,
    /// The mount's default TTL in milliseconds.
    default_ttl: Option<u64>,
    /// Leases with a TTL of their own: without a mount default, only these
    /// can have a deadline, so the timer looks at them and not at every
    /// lease of a mount with a million.
    timed: InoSet,
    /// Leases with nothing but an epoch (no holder, waiter, fence or TTL
    /// of their own): kept as just the epoch, 16 bytes instead of a
    /// [`Lease`], since a mount may hold a million idle leases.
    idle: InoMap<Epoch>,
    /// The epoch of every lease the table holds nothing for (see
    /// [`Locks::raise_all`]); idle leases at it are not kept at all.
    base: Epoch,
}

/// The lease at `ino`, made a full [`Lease`] again if it was idle.
fn slot<'a>(leases: &'a mut InoMap<Lease>, idle: &mut InoMap<Epoch>, base: Epoch, ino: Ino) -> &'a mut Lease {
    leases.entry(ino).or_insert_with(|| Lease { epoch: idle.remove(&ino).unwrap_or(base), ..Lease::default() })
}

impl Locks {
    /// An empty table.
    pub fn new() -> Locks {
        Locks::default()
    }

    /// An empty table whose leases carry `ttl` milliseconds unless a file
    /// sets its own.
    pub fn with_default_ttl(ttl: Option<u64>) -> Locks {
        Locks { default_ttl: ttl, ..Locks::default() }
    }

    /// Bound what callers can make the table keep.
    pub fn set_limits(&mut self, limits: LockLimits) {
        self.limits = limits;
    }

    /// The bounds in force.
    pub fn limits(&self) -> LockLimits {
        self.limits
    }

    /// Locks held and waiters queued over the whole mount.
    pub fn usage(&self) -> (usize, usize) {
        (self.total_locks, self.waiting.len())
    }

    /// Requests refused with `ENOLCK` because a limit was reached.
    pub fn limit_refusals(&self) -> u64 {
        self.limit_refusals
    }

    fn lock_count(&self, ino: Ino) -> usize {
        self.leases.get(&ino).map_or(0, |l| l.locks.len())
    }

    /// The lease at `ino` had `before` locks; account for what it has now.
    fn recount(&mut self, ino: Ino, before: usize) {
        self.total_locks = (self.total_locks + self.lock_count(ino)).saturating_sub(before);
        self.settle(ino);
        if let Some(l) = self.leases.get_mut(&ino) {
            // An idle lease keeps its epoch, not the memory of its last
            // holders and waiters (a mount may have a million idle leases).
            if l.locks.is_empty() && l.locks.capacity() > 0 {
                l.locks = Vec::new();
            }
            if l.waiters.is_empty() && l.waiters.capacity() > 0 {
                l.waiters = VecDeque::new();
            }
        }
    }

    /// Keep a lease that has nothing but its epoch as just the epoch.
    fn settle(&mut self, ino: Ino) {
        let Some(l) = self.leases.get(&ino) else { return };
        let bare = l.locks.is_empty()
            && l.waiters.is_empty()
            && l.fenced.is_empty()
            && l.ttl.is_none()
            && l.expires.is_none()
            && l.told_expiry.is_none()
            && l.epoch_owner.is_none();
        if bare {
            let epoch = l.epoch;
            self.leases.remove(&ino);
            if epoch > self.base {
                self.idle.insert(ino, epoch);
            }
        }
    }

    /// Every lease carries at least `floor` from now on: those the table
    /// knows are raised, and every other one starts there (a restart
    /// resumes all restored files above the recovered epoch ceiling in
    /// O(1), without an entry per file).
    pub fn raise_all(&mut self, floor: Epoch) {
        if floor <= self.base {
            return;
        }
        self.base = floor;
        for l in self.leases.values_mut() {
            l.epoch = l.epoch.max(floor);
        }
        self.idle.retain(|_, e| *e > floor);
    }

    /// Leases kept as just their epoch.
    pub fn idle_count(&self) -> usize {
        self.idle.len()
    }

    /// Advance the clock without acting on it (the next [`Locks::tick`] or
    /// lock request does).
    pub fn advance(&mut self, now: u64) {
        self.now = self.now.max(now);
    }

    /// Advance the clock; leases whose TTL ran out while someone waits are
    /// broken and the first waiters granted.
    pub fn tick(&mut self, now: u64) -> Vec<Effect> {
        self.now = self.now.max(now);
        let due: Vec<Ino> = self
            .timed_leases()
            .filter(|(_, l)| !l.waiters.is_empty() && !l.locks.is_empty() && l.expires.is_some_and(|e| e <= self.now))
            .map(|(i, _)| i)
            .collect();
        let mut effects = Vec::new();
        for ino in due {
            let before = self.lock_count(ino);
            self.break_holders(ino, None, &mut effects);
            self.drain(ino, &mut effects);
            self.recount(ino, before);
        }
        let now = self.now;
        let lapsed: Vec<Ino> = self
            .timed_leases()
            .filter(|(_, l)| l.expires.is_some_and(|e| e <= now) && l.told_expiry != l.expires && l.waiters.is_empty())
            .map(|(i, _)| i)
            .collect();
        for ino in lapsed {
            let l = self.leases.get_mut(&ino).expect("listed above");
            if let Some(holder) = l.locks.first() {
                l.told_expiry = l.expires;
                effects.push(Effect::Expired(ino, l.epoch, holder.pid));
            }
        }
        effects
    }

    /// The leases that can have a deadline: every one under a mount-wide
    /// TTL, otherwise those with a TTL of their own.
    fn timed_leases(&self) -> Box<dyn Iterator<Item = (Ino, &Lease)> + '_> {
        if self.default_ttl.is_some() {
            Box::new(self.leases.iter().map(|(i, l)| (*i, l)))
        } else {
            Box::new(self.timed.iter().filter_map(|i| Some((*i, self.leases.get(i)?))))
        }
    }

    /// The earliest moment [`Locks::tick`] has work to do.
    pub fn next_deadline(&self) -> Option<u64> {
        self.timed_leases().filter_map(|(_, l)| l.deadline()).min()
    }

    /// The moment [`Locks::tick`] has work to do on this lease.
    pub fn deadline(&self, ino: Ino) -> Option<u64> {
        self.leases.get(&ino).and_then(Lease::deadline)
    }

    /// Break every held lease at once (the host lost its place): all
    /// holders are fenced and waiters granted in order.
    pub fn break_all(&mut self) -> Vec<Effect> {
        let held: Vec<Ino> = self.held();
        let mut effects = Vec::new();
        for ino in held {
            effects.extend(self.break_now(ino));
        }
        effects
    }

    /// Every lease with a waiter, in inode order.
    pub fn waited(&self) -> Vec<Ino> {
        let mut inos: Vec<Ino> = self.waiting.values().map(|(i, _)| *i).collect();
        inos.sort();
        inos.dedup();
        inos
    }

    /// Every lease with a holder, in inode order.
    pub fn held(&self) -> Vec<Ino> {
        let mut held: Vec<Ino> = self.leases.iter().filter(|(_, l)| !l.locks.is_empty()).map(|(i, _)| *i).collect();
        held.sort_unstable();
        held
    }

    /// Set (or with `None` remove) a file's own TTL; current holders get
    /// the full new TTL from now.
    pub fn set_ttl(&mut self, ino: Ino, ttl: Option<u64>) -> Vec<Effect> {
        let now = self.now;
        let default = self.default_ttl;
        let l = slot(&mut self.leases, &mut self.idle, self.base, ino);
        l.ttl = ttl;
        if ttl.is_some() {
            self.timed.insert(ino);
        } else {
            self.timed.remove(&ino);
        }
        let eff = ttl.or(default);
        l.expires = if l.locks.is_empty() { None } else { eff.map(|t| now.saturating_add(t)) };
        // A shorter TTL may already have run out for a waiter.
        self.tick(now)
    }

    /// The TTL that applies to a lease (its own or the mount's).
    pub fn effective_ttl(&self, ino: Ino) -> Option<u64> {
        self.leases.get(&ino).and_then(|l| l.ttl).or(self.default_ttl)
    }

    /// A holder renewed (write through its descriptor, touch, setfattr
    /// renew): its lease runs for another TTL. Returns false when `pid` or
    /// `handle` holds nothing.
    pub fn renew(&mut self, ino: Ino, handle: Option<u64>, pids: &[u32]) -> bool {
        let now = self.now;
        let ttl = self.effective_ttl(ino);
        let Some(l) = self.leases.get_mut(&ino) else {
            return false;
        };
        let holds = l.locks.iter().any(|k| Some(k.handle) == handle || pids.contains(&k.pid));
        if holds {
            if let Some(ttl) = ttl {
                l.expires = Some(now.saturating_add(ttl));
            }
        }
        holds
    }

    /// Is this descriptor fenced off the lease?
    pub fn fenced_handle(&self, ino: Ino, handle: u64) -> Option<Fenced> {
        self.leases.get(&ino)?.fenced.iter().find(|f| f.handle == handle).copied()
    }

    /// Is one of these processes (a process and its ancestors) fenced off
    /// the lease while holding nothing there now?
    pub fn fenced_pid(&self, ino: Ino, pids: &[u32]) -> Option<Fenced> {
        let l = self.leases.get(&ino)?;
        if l.locks.iter().any(|k| pids.contains(&k.pid)) {
            return None;
        }
        l.fenced.iter().find(|f| pids.contains(&f.pid)).copied()
    }

    /// True when the lease has fenced holders at all (a cheap pre-check).
    pub fn has_fenced(&self, ino: Ino) -> bool {
        self.leases.get(&ino).is_some_and(|l| !l.fenced.is_empty())
    }

    /// Does one of these processes hold the lease exclusively (whole
    /// file)? Returns the holder's pid.
    pub fn held_by(&self, ino: Ino, pids: &[u32]) -> Option<u32> {
        self.leases.get(&ino).and_then(|l| {
            l.locks
                .iter()
                .find(|k| {
                    pids.contains(&k.pid)
                        && k.mode == Mode::Exclusive
                        && (k.kind == LockKind::Flock || k.range.is_whole())
                })
                .map(|k| k.pid)
        })
    }

    /// Break the lease at once (administrator): every holder is fenced and
    /// the first waiters are granted.
    pub fn break_now(&mut self, ino: Ino) -> Vec<Effect> {
        let mut effects = Vec::new();
        if self.leases.get(&ino).is_some_and(|l| !l.locks.is_empty()) {
            let before = self.lock_count(ino);
            self.break_holders(ino, None, &mut effects);
            self.drain(ino, &mut effects);
            self.recount(ino, before);
        }
        effects
    }

    /// Fence and remove every holder except `keep`.
    fn break_holders(&mut self, ino: Ino, keep: Option<Owner>, effects: &mut Vec<Effect>) {
        let Some(l) = self.leases.get_mut(&ino) else {
            return;
        };
        let epoch = l.epoch;
        let (gone, kept): (Vec<Lock>, Vec<Lock>) = l.locks.drain(..).partition(|k| Some(k.owner) != keep);
        l.locks = kept;
        for k in gone {
            let f = Fenced { owner: k.owner, handle: k.handle, pid: k.pid, epoch };
            if !l.fenced.contains(&f) {
                l.fenced.push(f);
                if l.fenced.len() > 64 {
                    l.fenced.remove(0);
                }
                effects.push(Effect::Broken(ino, f));
            }
        }
        l.expires = None;
        l.settle_epoch_owner();
    }

    /// Every lease with state beyond its epoch.
    pub fn leases(&self) -> Vec<(Ino, &Lease)> {
        self.leases.iter().map(|(i, l)| (*i, l)).collect()
    }

    /// The lease of an inode, if it has state.
    pub fn lease(&self, ino: Ino) -> Option<&Lease> {
        self.leases.get(&ino)
    }

    /// The epoch of an inode's lease (0 if it never had one).
    pub fn epoch(&self, ino: Ino) -> Epoch {
        self.leases.get(&ino).map_or_else(|| self.idle.get(&ino).copied().unwrap_or(self.base), |l| l.epoch)
    }

    /// True while the inode's lease has a holder or waiter.
    pub fn is_live(&self, ino: Ino) -> bool {
        self.leases.get(&ino).is_some_and(Lease::is_live)
    }

    /// Start a lease's epochs at `floor` (a path's remembered epoch) unless
    /// it is already higher.
    pub fn raise_epoch(&mut self, ino: Ino, floor: Epoch) {
        let l = slot(&mut self.leases, &mut self.idle, self.base, ino);
        if l.epoch < floor {
            l.epoch = floor;
        }
        self.settle(ino);
    }

    /// The arbiter granted a new exclusive holder of `ino` with epoch
    /// `before + 1`: set the epoch to `before` so the local grant that
    /// follows lands on exactly that. A read of the arbiter's counter made
    /// meanwhile may have raised it to the grant's epoch already (the grant
    /// was committed before it was answered here); raising alone would then
    /// give the holder one more than the arbiter handed out. Lowered only
    /// while nobody here holds the lease exclusively: then nothing here
    /// carries an epoch the arbiter has not seen.
    pub fn align_epoch(&mut self, ino: Ino, before: Epoch) {
        let l = slot(&mut self.leases, &mut self.idle, self.base, ino);
        if l.epoch < before || l.epoch > before && l.epoch_owner.is_none() {
            l.epoch = before;
        }
        self.settle(ino);
    }

    /// A new holder took the lease by creating the file (`O_CREAT|O_EXCL`):
    /// the epoch advances.
    pub fn acquire_by_create(&mut self, ino: Ino) -> Vec<Effect> {
        let l = slot(&mut self.leases, &mut self.idle, self.base, ino);
        let effects = Self::next_epoch(ino, l);
        self.settle(ino);
        effects
    }

    /// A new holder took the lease by creating its name with `link()` (the
    /// dotlock idiom): the name's epoch becomes one past what the path last
    /// carried (`floor`), never lower than the inode's own. The temporary file
    /// of the idiom was created with `O_EXCL` and already carries epoch 1, so
    /// each dotlock holder advances the lock path by exactly one.
    pub fn acquire_by_link(&mut self, ino: Ino, floor: Epoch) -> Vec<Effect> {
        let l = slot(&mut self.leases, &mut self.idle, self.base, ino);
        let next = Epoch(floor.0 + 1).max(l.epoch);
        if next == l.epoch {
            return Vec::new();
        }
        l.epoch = next;
        l.epoch_owner = None;
        self.settle(ino);
        vec![Effect::Epoch(ino, next)]
    }

    fn next_epoch(ino: Ino, l: &mut Lease) -> Vec<Effect> {
        l.epoch = Epoch(l.epoch.0 + 1);
        l.epoch_owner = None;
        vec![Effect::Epoch(ino, l.epoch)]
    }

    /// Move a lease's state to another inode number (used when a name is
    /// re-bound); the target's own state is replaced.
    pub fn rebind(&mut self, from: Ino, to: Ino) {
        if let Some(epoch) = self.idle.remove(&from) {
            if let Some(old) = self.leases.remove(&to) {
                self.total_locks -= old.locks.len().min(self.total_locks);
            }
            self.timed.remove(&to);
            self.idle.insert(to, epoch);
            return;
        }
        if let Some(l) = self.leases.remove(&from) {
            self.idle.remove(&to);
            let replaced = self.lock_count(to);
            self.total_locks -= replaced.min(self.total_locks);
            for w in &l.waiters {
                self.waiting.insert(w.req.owner, (to, w.id));
            }
            self.timed.remove(&from);
            if l.ttl.is_some() {
                self.timed.insert(to);
            } else {
                self.timed.remove(&to);
            }
            self.leases.insert(to, l);
        }
    }

    /// Drop the state of an inode that went away for good; returns its epoch
    /// so the caller can remember it for the path.
    pub fn forget(&mut self, ino: Ino) -> Epoch {
        if let Some(e) = self.idle.remove(&ino) {
            return e;
        }
        match self.leases.get(&ino) {
            Some(l) if !l.is_live() => {
                self.timed.remove(&ino);
                self.leases.remove(&ino).map_or(Epoch(0), |l| l.epoch)
            }
            Some(l) => l.epoch,
            None => self.base,
        }
    }

    /// The first lock that would block `req` (`F_GETLK`).
    pub fn test(&self, ino: Ino, req: &Request) -> Option<Lock> {
        self.leases.get(&ino)?.locks.iter().find(|l| req.conflicts_with_lock(l)).copied()
    }

    /// Lock, unlock or wait. With `wait` the request parks when it cannot be
    /// granted; without it the request is refused with `EWOULDBLOCK`.
    pub fn set(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> (Outcome, Vec<Effect>) {
        let before = self.lock_count(ino);
        let answer = self.set_counted(ino, req, wait);
        self.recount(ino, before);
        if answer.0 == Outcome::Refused(Error::NoLock) {
            self.limit_refusals += 1;
        }
        answer
    }

    fn set_counted(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> (Outcome, Vec<Effect>) {
        let mut effects = Vec::new();
        let now = self.now;
        let lease = slot(&mut self.leases, &mut self.idle, self.base, ino);
        // Past its TTL the lease is breakable by the next contender.
        let expired = lease.expires.is_some_and(|e| e <= now);
        if expired && req.mode.is_some() && lease.locks.iter().any(|l| req.conflicts_with_lock(l)) {
            self.break_holders(ino, Some(req.owner), &mut effects);
            self.drain(ino, &mut effects);
        }
        let ttl = self.leases.get(&ino).and_then(|l| l.ttl).or(self.default_ttl);
        let lease = slot(&mut self.leases, &mut self.idle, self.base, ino);
        let ahead = lease.waiters.len();
        if req.mode.is_none() || lease.grantable(&req, ahead) {
            // A POSIX request may split one of the owner's ranges (+1) and
            // add its own (+1); near the bound, apply it to a copy first so
            // a refusal changes nothing.
            let limits = self.limits;
            if req.mode.is_some() && self.total_locks + 2 > limits.locks_total {
                return (Outcome::Refused(Error::NoLock), effects);
            }
            let mine = lease.locks.iter().filter(|l| l.owner == req.owner).count();
            let saved = (req.kind == LockKind::Posix && mine + 2 > limits.ranges_per_owner).then(|| lease.clone());
            let epoch = lease.apply(&req, now, ttl);
            if let Some(saved) = saved {
                if lease.locks.iter().filter(|l| l.owner == req.owner).count() > limits.ranges_per_owner {
                    *lease = saved;
                    return (Outcome::Refused(Error::NoLock), effects);
                }
            }
            if let Some(e) = epoch {
                effects.push(Effect::Epoch(ino, e));
            }
            self.drain(ino, &mut effects);
            return (Outcome::Granted, effects);
        }
        let Some(id) = wait else {
            return (Outcome::Refused(Error::WouldBlock), effects);
        };
        if lease.waiters.len() >= self.limits.waiters_per_lease || self.waiting.len() >= self.limits.waiters_total {
            return (Outcome::Refused(Error::NoLock), effects);
        }
        if req.kind == LockKind::Posix && self.would_deadlock(ino, &req) {
            return (Outcome::Refused(Error::Deadlock), effects);
        }
        let lease = slot(&mut self.leases, &mut self.idle, self.base, ino);
        lease.waiters.push_back(Waiter { id, req });
        self.waiting.insert(req.owner, (ino, id));
        (Outcome::Parked, effects)
    }

    /// A parked request was interrupted by a signal: it ends with `EINTR`.
    /// Returns `None` when no such request is parked.
    pub fn interrupt(&mut self, id: WaitId) -> Option<Vec<Effect>> {
        let ino = self.waiting.values().find(|(_, w)| *w == id).map(|(i, _)| *i)?;
        let lease = self.leases.get_mut(&ino)?;
        let pos = lease.waiters.iter().position(|w| w.id == id)?;
        let w = lease.waiters.remove(pos)?;
        self.waiting.remove(&w.req.owner);
        let mut effects = vec![Effect::Refuse(id, Error::Interrupted)];
        // Later waiters may have queued only behind this one.
        let before = self.lock_count(ino);
        self.drain(ino, &mut effects);
        self.recount(ino, before);
        Some(effects)
    }

    /// A process closed a descriptor of the file (FLUSH): its POSIX locks on
    /// it go, as the kernel would do on close.
    pub fn release_owner(&mut self, ino: Ino, owner: Owner) -> Vec<Effect> {
        self.release_where(ino, |l| l.owner == owner && l.kind == LockKind::Posix)
    }

    /// The last close of an open file description (RELEASE): every lock
    /// taken through it goes (flock, OFD, and POSIX locks taken through it).
    pub fn release_handle(&mut self, ino: Ino, handle: u64, flock_owner: Option<Owner>) -> Vec<Effect> {
        self.release_where(ino, |l| l.handle == handle || Some(l.owner) == flock_owner && l.kind == LockKind::Flock)
    }

    fn release_where(&mut self, ino: Ino, gone: impl Fn(&Lock) -> bool) -> Vec<Effect> {
        let mut effects = Vec::new();
        let Some(lease) = self.leases.get_mut(&ino) else {
            return effects;
        };
        let before = lease.locks.len();
        lease.locks.retain(|l| !gone(l));
        if lease.locks.is_empty() {
            lease.expires = None;
        }
        if lease.locks.len() != before {
            lease.settle_epoch_owner();
            self.drain(ino, &mut effects);
        }
        self.recount(ino, before);
        effects
    }

    /// Grant every waiter that can go now, in arrival order.
    fn drain(&mut self, ino: Ino, effects: &mut Vec<Effect>) {
        let now = self.now;
        let ttl = self.leases.get(&ino).and_then(|l| l.ttl).or(self.default_ttl);
        let Some(lease) = self.leases.get_mut(&ino) else {
            return;
        };
        loop {
            let mut granted = None;
            for (i, w) in lease.waiters.iter().enumerate() {
                if lease.grantable(&w.req, i) {
                    granted = Some(i);
                    break;
                }
            }
            let Some(i) = granted else { break };
            let w = lease.waiters.remove(i).expect("index in range");
            if let Some(e) = lease.apply(&w.req, now, ttl) {
                effects.push(Effect::Epoch(ino, e));
            }
            self.waiting.remove(&w.req.owner);
            effects.push(Effect::Grant(w.id));
        }
    }

    /// Would `req` waiting close a cycle of owners waiting for each other?
    fn would_deadlock(&self, ino: Ino, req: &Request) -> bool {
        let mut stack = self.leases.get(&ino).map(|l| l.blockers(req)).unwrap_or_default();
        let mut seen = HashSet::new();
        while let Some(o) = stack.pop() {
            if o == req.owner {
                return true;
            }
            if !seen.insert(o) {
                continue;
            }
            if let Some((wino, wid)) = self.waiting.get(&o) {
                if let Some(l) = self.leases.get(wino) {
                    if let Some(w) = l.waiters.iter().find(|w| w.id == *wid) {
                        stack.extend(l.blockers(&w.req));
                    }
                }
            }
        }
        false
    }
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
