//! The lease table of one host: the pure state machine plus the
//! bookkeeping around it (views, floors, detached leases, guards), with the
//! lease clock running from the daemon's start. On one host it decides
//! every lease question; with other hosts an
//! [`Arbitration`](super::arbitration::Arbitration) decides grants and
//! epochs of shared leases and carries them out on it.
//!
//! Invariants: everything it keeps is bounded by what is live (leases with
//! holders, waiters, TTL or fences; detached names only while their lease is
//! live; see [`Views`] and [`Floors`] for theirs), and it answers every
//! question at once (nothing here waits for a remote arbiter).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::floors::Floors;
use super::machine::{Effect, Epoch, Fenced, Lease, Lock, Locks, Outcome, Owner, Request, WaitId};
use super::seam::Wake;
use super::views::Views;
use crate::error::Result;
use crate::namespace::Ino;

/// Lease state of one mount on one host.
#[derive(Debug)]
pub struct LocalAuthority {
    locks: Locks,
    /// Live leases whose name was unlinked, by path: re-creating the path
    /// re-attaches the same inode (SPEC 4).
    detached: HashMap<PathBuf, Ino>,
    /// Guarded files and the mount-relative path of their lease.
    guards: HashMap<Ino, PathBuf>,
    floors: Floors,
    views: Views,
    /// The clock leases run on.
    start: Instant,
    /// The lease timer, and the deadline it was last told to sleep to.
    wake: Wake,
    armed: Option<u64>,
}

impl LocalAuthority {
    /// An authority whose leases carry `ttl_ms` unless a file sets its own.
    pub fn new(ttl_ms: Option<u64>) -> LocalAuthority {
        LocalAuthority {
            locks: Locks::with_default_ttl(ttl_ms),
            detached: HashMap::new(),
            guards: HashMap::new(),
            floors: Floors::default(),
            views: Views::default(),
            start: Instant::now(),
            wake: Wake::default(),
            armed: None,
        }
    }

    fn clock(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// A request changed `ino`: wake the timer if its deadline is now
    /// nearer than the one the timer sleeps to.
    fn rearm(&mut self, ino: Ino) {
        if let Some(due) = self.locks.deadline(ino) {
            if self.armed.is_none_or(|armed| due < armed) {
                self.armed = Some(due);
                self.wake.wake();
            }
        }
    }
}

/// The lease table's answers, asked through
/// [`LeaseAuthority`](super::authority::LeaseAuthority) (see its methods of
/// the same names).
impl LocalAuthority {
    pub fn now(&mut self) -> u64 {
        let now = self.clock();
        self.locks.advance(now);
        now
    }

    pub fn set_wake(&mut self, wake: Wake) {
        self.wake = wake;
    }

    pub fn request(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<(Outcome, Vec<Effect>)> {
        let answer = self.locks.set(ino, req, wait);
        self.rearm(ino);
        Ok(answer)
    }

    pub fn test(&self, ino: Ino, req: &Request) -> Option<Lock> {
        self.locks.test(ino, req)
    }

    pub fn interrupt(&mut self, id: WaitId) -> Option<Vec<Effect>> {
        self.locks.interrupt(id)
    }

    pub fn release_owner(&mut self, ino: Ino, owner: Owner) -> Vec<Effect> {
        let effects = self.locks.release_owner(ino, owner);
        self.rearm(ino);
        effects
    }

    pub fn release_handle(&mut self, ino: Ino, handle: u64, flock_owner: Option<Owner>) -> Vec<Effect> {
        let effects = self.locks.release_handle(ino, handle, flock_owner);
        self.rearm(ino);
        effects
    }

    pub fn epoch(&self, ino: Ino) -> Epoch {
        self.locks.epoch(ino)
    }

    pub fn reserve(&mut self, ino: Ino) -> Result<()> {
        let need = self.locks.epoch(ino).0 + 1;
        self.floors.reserve(need)
    }

    pub fn acquire_by_create(&mut self, ino: Ino) -> Result<Vec<Effect>> {
        Ok(self.locks.acquire_by_create(ino))
    }

    pub fn acquire_by_link(&mut self, ino: Ino, floor: Epoch) -> Result<Vec<Effect>> {
        Ok(self.locks.acquire_by_link(ino, floor))
    }

    pub fn raise_epoch(&mut self, ino: Ino, floor: Epoch) {
        self.locks.raise_epoch(ino, floor);
    }
    pub fn align_epoch(&mut self, ino: Ino, before: Epoch) {
        self.locks.align_epoch(ino, before);
    }
    pub fn raise_all(&mut self, floor: Epoch) {
        self.locks.raise_all(floor);
    }

    pub fn floors(&mut self) -> &mut Floors {
        &mut self.floors
    }

    pub fn floors_ref(&self) -> &Floors {
        &self.floors
    }

    pub fn is_live(&self, ino: Ino) -> bool {
        self.locks.is_live(ino)
    }

    pub fn forget(&mut self, ino: Ino) {
        self.locks.forget(ino);
        self.views.forget(ino);
    }

    pub fn detach(&mut self, path: PathBuf, ino: Ino) {
        self.detached.insert(path, ino);
    }

    pub fn take_detached(&mut self, path: &Path) -> Option<Ino> {
        self.detached.remove(path)
    }

    pub fn detached(&self, path: &Path) -> Option<Ino> {
        self.detached.get(path).copied()
    }

    pub fn detached_all(&self) -> Vec<(PathBuf, Ino)> {
        self.detached.iter().map(|(p, i)| (p.clone(), *i)).collect()
    }

    pub fn retain_detached(&mut self, keep: &mut dyn FnMut(Ino) -> bool) {
        let locks = &self.locks;
        self.detached.retain(|_, i| locks.is_live(*i) && keep(*i));
    }

    pub fn views(&mut self) -> &mut Views {
        &mut self.views
    }

    pub fn observations(&self) -> usize {
        self.views.len()
    }

    pub fn set_lock_limits(&mut self, limits: crate::lease::machine::LockLimits) {
        self.locks.set_limits(limits);
    }

    pub fn lock_limits(&self) -> crate::lease::machine::LockLimits {
        self.locks.limits()
    }

    pub fn lock_usage(&self) -> (usize, usize) {
        self.locks.usage()
    }

    pub fn lock_limit_refusals(&self) -> u64 {
        self.locks.limit_refusals()
    }

    pub fn set_ttl(&mut self, ino: Ino, ttl: Option<u64>) -> Vec<Effect> {
        let effects = self.locks.set_ttl(ino, ttl);
        self.rearm(ino);
        effects
    }

    pub fn effective_ttl(&self, ino: Ino) -> Option<u64> {
        self.locks.effective_ttl(ino)
    }

    pub fn renew(&mut self, ino: Ino, handle: Option<u64>, pids: &[u32]) -> bool {
        self.locks.renew(ino, handle, pids)
    }

    pub fn tick(&mut self) -> (Vec<Effect>, Option<u64>) {
        let now = self.clock();
        let effects = self.locks.tick(now);
        self.armed = self.locks.next_deadline();
        (effects, self.armed.map(|d| d.saturating_sub(now)))
    }

    pub fn break_now(&mut self, ino: Ino) -> Vec<Effect> {
        let effects = self.locks.break_now(ino);
        self.rearm(ino);
        effects
    }

    pub fn held(&self) -> Vec<Ino> {
        self.locks.held()
    }

    pub fn waited(&self) -> Vec<Ino> {
        self.locks.waited()
    }

    pub fn fence_all(&mut self) -> Vec<Effect> {
        let held = self.locks.held();
        let effects = self.locks.break_all();
        for ino in held {
            self.rearm(ino);
        }
        effects
    }

    pub fn fenced_handle(&self, ino: Ino, handle: u64) -> Option<Fenced> {
        self.locks.fenced_handle(ino, handle)
    }

    pub fn fenced_pid(&self, ino: Ino, pids: &[u32]) -> Option<Fenced> {
        self.locks.fenced_pid(ino, pids)
    }

    pub fn has_fenced(&self, ino: Ino) -> bool {
        self.locks.has_fenced(ino)
    }

    pub fn held_by(&self, ino: Ino, pids: &[u32]) -> Option<u32> {
        self.locks.held_by(ino, pids)
    }

    pub fn guard(&self, ino: Ino) -> Option<PathBuf> {
        self.guards.get(&ino).cloned()
    }

    pub fn set_guard(&mut self, ino: Ino, path: PathBuf) {
        self.guards.insert(ino, path);
    }

    pub fn remove_guard(&mut self, ino: Ino) -> bool {
        self.guards.remove(&ino).is_some()
    }

    pub fn leases(&self) -> Vec<(Ino, &Lease)> {
        self.locks.leases()
    }

    pub fn known(&self) -> usize {
        self.locks.leases().len() + self.locks.idle_count()
    }

    pub fn lease(&self, ino: Ino) -> Option<&Lease> {
        self.locks.lease(ino)
    }

    pub fn uptime(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::lease::machine::{LockKind, Mode, Range};

    fn flock(owner: u64, mode: Option<Mode>) -> Request {
        Request {
            owner: Owner(owner),
            kind: LockKind::Flock,
            mode,
            range: Range::WHOLE,
            pid: owner as u32,
            handle: owner,
        }
    }

    /// The timer sleeps to its deadline; a holder taking a TTL lease brings
    /// a nearer one (its expiry) and must wake it, or the expiry would be
    /// seen only after the timer's idle nap.
    #[test]
    fn a_nearer_deadline_wakes_the_timer_and_a_later_one_does_not() {
        let wake = Wake::default();
        let mut a = LocalAuthority::new(Some(60_000));
        a.set_wake(wake.clone());
        let i = Ino(5);
        a.request(i, flock(1, Some(Mode::Exclusive)), None).unwrap();
        assert!(wake.sleep(Duration::ZERO), "a holder of a TTL lease brings its expiry");
        let (_, next) = a.tick();
        assert!(next.is_some_and(|n| n <= 60_000));
        let (o, _) = a.request(i, flock(2, Some(Mode::Exclusive)), Some(WaitId(2))).unwrap();
        assert_eq!(o, Outcome::Parked);
        assert!(!wake.sleep(Duration::ZERO), "a waiter brings the same deadline: no wake-up");
        // A second waiter has the same deadline: no wake-up.
        a.request(i, flock(3, Some(Mode::Exclusive)), Some(WaitId(3))).unwrap();
        assert!(!wake.sleep(Duration::ZERO));
        // A shorter TTL does.
        a.set_ttl(i, Some(10_000));
        assert!(wake.sleep(Duration::ZERO));
    }

    #[test]
    fn known_counts_idle_leases_and_waited_lists_only_waited_ones() {
        let mut a = LocalAuthority::new(None);
        for i in 1..=3 {
            a.request(Ino(i), flock(i, Some(Mode::Exclusive)), None).unwrap();
        }
        a.request(Ino(1), flock(1, None), None).unwrap();
        a.request(Ino(2), flock(9, Some(Mode::Exclusive)), Some(WaitId(7))).unwrap();
        // Ino 1 is idle (just its epoch), 2 and 3 are held, 2 has a waiter.
        assert_eq!((a.known(), a.leases().len()), (3, 2));
        assert_eq!(a.waited(), vec![Ino(2)]);
        assert_eq!(a.epoch(Ino(1)), Epoch(1));
    }

    #[test]
    fn fence_all_breaks_every_held_lease() {
        let mut a = LocalAuthority::new(None);
        for i in 1..=3 {
            a.request(Ino(i), flock(i, Some(Mode::Exclusive)), None).unwrap();
        }
        assert_eq!(a.held(), vec![Ino(1), Ino(2), Ino(3)]);
        let broken = a.fence_all().iter().filter(|e| matches!(e, Effect::Broken(..))).count();
        assert_eq!(broken, 3);
        assert!(a.held().is_empty());
        for i in 1..=3 {
            assert!(a.fenced_handle(Ino(i), i).is_some());
        }
    }
}
