//! The single-host lease authority: the pure state machine plus the
//! bookkeeping around it (views, floors, detached leases, guards), with the
//! lease clock running from the daemon's start.
//!
//! Invariants: everything it keeps is bounded by what is live (leases with
//! holders, waiters, TTL or fences; detached names only while their lease is
//! live; see [`Views`] and [`Floors`] for theirs), and it answers every
//! question at once (nothing here waits for a remote arbiter).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::authority::LeaseAuthority;
use super::floors::Floors;
use super::machine::{Effect, Epoch, Fenced, Lease, Lock, Locks, Outcome, Owner, Request, WaitId};
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
        }
    }

    fn clock(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

impl LeaseAuthority for LocalAuthority {
    fn now(&mut self) -> u64 {
        let now = self.clock();
        self.locks.advance(now);
        now
    }

    fn request(&mut self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<(Outcome, Vec<Effect>)> {
        Ok(self.locks.set(ino, req, wait))
    }

    fn test(&self, ino: Ino, req: &Request) -> Option<Lock> {
        self.locks.test(ino, req)
    }

    fn interrupt(&mut self, id: WaitId) -> Option<Vec<Effect>> {
        self.locks.interrupt(id)
    }

    fn release_owner(&mut self, ino: Ino, owner: Owner) -> Vec<Effect> {
        self.locks.release_owner(ino, owner)
    }

    fn release_handle(&mut self, ino: Ino, handle: u64, flock_owner: Option<Owner>) -> Vec<Effect> {
        self.locks.release_handle(ino, handle, flock_owner)
    }

    fn epoch(&self, ino: Ino) -> Epoch {
        self.locks.epoch(ino)
    }

    fn reserve(&mut self, ino: Ino) -> Result<()> {
        let need = self.locks.epoch(ino).0 + 1;
        self.floors.reserve(need)
    }

    fn acquire_by_create(&mut self, ino: Ino) -> Vec<Effect> {
        self.locks.acquire_by_create(ino)
    }

    fn acquire_by_link(&mut self, ino: Ino, floor: Epoch) -> Vec<Effect> {
        self.locks.acquire_by_link(ino, floor)
    }

    fn raise_epoch(&mut self, ino: Ino, floor: Epoch) {
        self.locks.raise_epoch(ino, floor);
    }

    fn floors(&mut self) -> &mut Floors {
        &mut self.floors
    }

    fn floors_ref(&self) -> &Floors {
        &self.floors
    }

    fn is_live(&self, ino: Ino) -> bool {
        self.locks.is_live(ino)
    }

    fn forget(&mut self, ino: Ino) {
        self.locks.forget(ino);
        self.views.forget(ino);
    }

    fn detach(&mut self, path: PathBuf, ino: Ino) {
        self.detached.insert(path, ino);
    }

    fn take_detached(&mut self, path: &Path) -> Option<Ino> {
        self.detached.remove(path)
    }

    fn detached(&self, path: &Path) -> Option<Ino> {
        self.detached.get(path).copied()
    }

    fn detached_all(&self) -> Vec<(PathBuf, Ino)> {
        self.detached.iter().map(|(p, i)| (p.clone(), *i)).collect()
    }

    fn retain_detached(&mut self, keep: &mut dyn FnMut(Ino) -> bool) {
        let locks = &self.locks;
        self.detached.retain(|_, i| locks.is_live(*i) && keep(*i));
    }

    fn views(&mut self) -> &mut Views {
        &mut self.views
    }

    fn observations(&self) -> usize {
        self.views.len()
    }

    fn set_ttl(&mut self, ino: Ino, ttl: Option<u64>) -> Vec<Effect> {
        self.locks.set_ttl(ino, ttl)
    }

    fn effective_ttl(&self, ino: Ino) -> Option<u64> {
        self.locks.effective_ttl(ino)
    }

    fn renew(&mut self, ino: Ino, handle: Option<u64>, pids: &[u32]) -> bool {
        self.locks.renew(ino, handle, pids)
    }

    fn tick(&mut self) -> (Vec<Effect>, Option<u64>) {
        let now = self.clock();
        let effects = self.locks.tick(now);
        (effects, self.locks.next_deadline().map(|d| d.saturating_sub(now)))
    }

    fn break_now(&mut self, ino: Ino) -> Vec<Effect> {
        self.locks.break_now(ino)
    }

    fn fenced_handle(&self, ino: Ino, handle: u64) -> Option<Fenced> {
        self.locks.fenced_handle(ino, handle)
    }

    fn fenced_pid(&self, ino: Ino, pids: &[u32]) -> Option<Fenced> {
        self.locks.fenced_pid(ino, pids)
    }

    fn has_fenced(&self, ino: Ino) -> bool {
        self.locks.has_fenced(ino)
    }

    fn held_by(&self, ino: Ino, pids: &[u32]) -> Option<u32> {
        self.locks.held_by(ino, pids)
    }

    fn guard(&self, ino: Ino) -> Option<PathBuf> {
        self.guards.get(&ino).cloned()
    }

    fn set_guard(&mut self, ino: Ino, path: PathBuf) {
        self.guards.insert(ino, path);
    }

    fn remove_guard(&mut self, ino: Ino) -> bool {
        self.guards.remove(&ino).is_some()
    }

    fn leases(&self) -> Vec<(Ino, &Lease)> {
        self.locks.leases()
    }

    fn lease(&self, ino: Ino) -> Option<&Lease> {
        self.locks.lease(ino)
    }

    fn uptime(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}
