//! What each process last observed of each lease, for compare-and-swap
//! renames and unlinks (SPEC 6).
//!
//! Pure bookkeeping: the caller resolves who a process is ([`Proc`]: its
//! thread-group id and start time, so a reused pid is a different process)
//! and which lease versions exist.
//!
//! Invariants:
//! - **Bounded.** At most [`MAX_PROCS`] processes with at most
//!   [`MAX_PER_PROC`] observed inodes each; past that the least recently
//!   active process (or observation) is forgotten. Forgetting only ever makes
//!   a process "never observed", which falls back to POSIX behaviour.
//! - **No inheritance.** Observations are keyed by `(tgid, start time)`; a
//!   process that reuses a pid starts empty, and [`Observations::forget_dead`]
//!   drops processes that exited.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::namespace::Ino;

/// Most processes tracked at once.
pub const MAX_PROCS: usize = 4096;
/// Most inodes tracked per process.
pub const MAX_PER_PROC: usize = 1024;

/// A process identity that survives pid reuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Proc {
    /// Thread-group id (the process id).
    pub tgid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start: u64,
}

/// Whether a namespace change by a process may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The process saw the current version (or never looked): go ahead.
    Current,
    /// The process never observed this lease: POSIX behaviour.
    Unobserved,
    /// The process acts on an old version: refuse with `ESTALE`.
    Stale { seen: u64, current: u64 },
}

/// A map that keeps its `cap` most recently used keys. Evicting costs
/// O(1) amortised (a queue of uses, stale uses skipped and the queue
/// rebuilt when it is mostly stale), not a scan of the map per insert: a
/// process touching a million leases, or a shell loop starting a new
/// process per lock, pays the same per request as one touching ten.
#[derive(Debug)]
struct Lru<K, V> {
    map: HashMap<K, (V, u64)>,
    /// Uses in order, `(key, tick)`; a use is current when the map holds
    /// the same tick for the key.
    order: VecDeque<(K, u64)>,
    tick: u64,
    cap: usize,
}

impl<K: Copy + Eq + Hash, V> Lru<K, V> {
    fn new(cap: usize) -> Lru<K, V> {
        Lru { map: HashMap::new(), order: VecDeque::new(), tick: 0, cap }
    }

    fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k).map(|(v, _)| v)
    }

    /// The value at `k` (made with `make` if absent), now the most recent.
    fn touch(&mut self, k: K, make: impl FnOnce() -> V) -> &mut V {
        self.tick += 1;
        let tick = self.tick;
        self.order.push_back((k, tick));
        let fresh = !self.map.contains_key(&k);
        self.map.entry(k).or_insert_with(|| (make(), tick)).1 = tick;
        if fresh {
            while self.map.len() > self.cap {
                let Some((old, t)) = self.order.pop_front() else { break };
                if self.map.get(&old).is_some_and(|(_, at)| *at == t) {
                    self.map.remove(&old);
                }
            }
        }
        if self.order.len() > 2 * self.cap + 64 {
            let mut live: Vec<(K, u64)> = self.map.iter().map(|(k, (_, t))| (*k, *t)).collect();
            live.sort_unstable_by_key(|(_, t)| *t);
            self.order = live.into();
        }
        &mut self.map.get_mut(&k).expect("inserted above").0
    }

    fn remove(&mut self, k: &K) {
        self.map.remove(k);
    }

    fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.map.retain(|k, _| keep(k));
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn values(&self) -> impl Iterator<Item = &V> {
        self.map.values().map(|(v, _)| v)
    }
}

#[derive(Debug)]
struct Seen {
    versions: Lru<Ino, u64>,
}

/// Observations of all processes.
#[derive(Debug)]
pub struct Observations {
    procs: Lru<Proc, Seen>,
}

impl Default for Observations {
    fn default() -> Observations {
        Observations { procs: Lru::new(MAX_PROCS) }
    }
}

impl Observations {
    /// An empty table.
    pub fn new() -> Observations {
        Observations::default()
    }

    /// Number of (process, inode) observations held.
    pub fn len(&self) -> usize {
        self.procs.values().map(|s| s.versions.len()).sum()
    }

    /// True when nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.procs.len() == 0
    }

    /// `p` observed `ino` at `version`.
    pub fn record(&mut self, p: Proc, ino: Ino, version: u64) {
        let seen = self.procs.touch(p, || Seen { versions: Lru::new(MAX_PER_PROC) });
        *seen.versions.touch(ino, || version) = version;
    }

    /// May `p` replace or remove the lease now at `ino` (version `current`),
    /// whose name earlier pointed at the inodes in `predecessors`?
    pub fn check(&self, p: Proc, ino: Ino, current: u64, predecessors: &[(Ino, u64)]) -> Verdict {
        let Some(seen) = self.procs.get(&p) else {
            return Verdict::Unobserved;
        };
        if let Some(&v) = seen.versions.get(&ino) {
            return if v == current { Verdict::Current } else { Verdict::Stale { seen: v, current } };
        }
        // The process looked at an inode the name pointed at before: its view
        // of the lease is older than the current target.
        match predecessors.iter().find_map(|(i, _)| seen.versions.get(i)) {
            Some(&v) => Verdict::Stale { seen: v, current },
            None => Verdict::Unobserved,
        }
    }

    /// May `p` remove the name now leading to `ino`? Only a change of what
    /// the name points at makes its view stale (SPEC 6): the inode replaced
    /// one `p` saw (`predecessors`), or the name was re-pointed at the same
    /// inode (rename over a live lease, re-attach) when its version became
    /// `repointed_at`. Content changes alone keep POSIX behaviour.
    pub fn check_name(&self, p: Proc, ino: Ino, repointed_at: u64, predecessors: &[(Ino, u64)]) -> Verdict {
        let Some(seen) = self.procs.get(&p) else {
            return Verdict::Unobserved;
        };
        if let Some(&v) = seen.versions.get(&ino) {
            return if v >= repointed_at {
                Verdict::Current
            } else {
                Verdict::Stale { seen: v, current: repointed_at }
            };
        }
        match predecessors.iter().find_map(|(i, _)| seen.versions.get(i)) {
            Some(&v) => Verdict::Stale { seen: v, current: repointed_at },
            None => Verdict::Unobserved,
        }
    }

    /// Drop every process for which `alive` says no (exited, or its pid now
    /// names another process).
    pub fn forget_dead(&mut self, alive: impl Fn(&Proc) -> bool) {
        self.procs.retain(|p| alive(p));
    }

    /// Drop one process's observations.
    pub fn forget(&mut self, p: Proc) {
        self.procs.remove(&p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Proc = Proc { tgid: 10, start: 1 };
    const A_REUSED: Proc = Proc { tgid: 10, start: 2 };

    #[test]
    fn stale_current_and_unobserved() {
        let mut o = Observations::new();
        assert_eq!(o.check(A, Ino(5), 3, &[]), Verdict::Unobserved);
        o.record(A, Ino(5), 3);
        assert_eq!(o.check(A, Ino(5), 3, &[]), Verdict::Current);
        assert_eq!(o.check(A, Ino(5), 4, &[]), Verdict::Stale { seen: 3, current: 4 });
        // The name now points at inode 6, which replaced 5.
        assert_eq!(o.check(A, Ino(6), 7, &[(Ino(5), 4)]), Verdict::Stale { seen: 3, current: 7 });
        o.record(A, Ino(6), 7);
        assert_eq!(o.check(A, Ino(6), 7, &[(Ino(5), 4)]), Verdict::Current);
    }

    #[test]
    fn names_go_stale_only_when_re_pointed() {
        let mut o = Observations::new();
        o.record(A, Ino(5), 3);
        // Content changed (version 3 -> 9), name not re-pointed: current.
        assert_eq!(o.check_name(A, Ino(5), 0, &[]), Verdict::Current);
        // Re-pointed at the same inode at version 4 (rename over a live lease).
        assert_eq!(o.check_name(A, Ino(5), 4, &[]), Verdict::Stale { seen: 3, current: 4 });
        // Replaced by another inode.
        assert_eq!(o.check_name(A, Ino(6), 0, &[(Ino(5), 0)]), Verdict::Stale { seen: 3, current: 0 });
        assert_eq!(o.check_name(A_REUSED, Ino(6), 0, &[(Ino(5), 0)]), Verdict::Unobserved);
    }

    #[test]
    fn a_reused_pid_inherits_nothing() {
        let mut o = Observations::new();
        o.record(A, Ino(5), 3);
        assert_eq!(o.check(A_REUSED, Ino(5), 4, &[]), Verdict::Unobserved);
        o.forget_dead(|p| p.start == 2);
        assert!(o.is_empty());
    }

    #[test]
    fn memory_is_bounded() {
        let mut o = Observations::new();
        for i in 0..(MAX_PER_PROC as u64 + 10) {
            o.record(A, Ino(i), 1);
        }
        assert_eq!(o.len(), MAX_PER_PROC);
        for t in 0..(MAX_PROCS as u32 + 10) {
            o.record(Proc { tgid: 1000 + t, start: 0 }, Ino(1), 1);
        }
        assert!(o.procs.len() <= MAX_PROCS);
    }

    #[test]
    fn the_least_recently_used_is_forgotten_first() {
        let mut o = Observations::new();
        for i in 0..MAX_PER_PROC as u64 {
            o.record(A, Ino(i), 1);
        }
        // Ino 0 is used again, so ino 1 is the oldest now.
        o.record(A, Ino(0), 2);
        for round in 0..5u64 {
            // Many repeated uses of the same inodes keep the queue bounded.
            for _ in 0..3000 {
                o.record(A, Ino(0), 2 + round);
            }
        }
        assert!(o.procs.get(&A).unwrap().versions.order.len() <= 2 * MAX_PER_PROC + 64);
        o.record(A, Ino(5000), 1);
        assert_eq!(o.check(A, Ino(1), 1, &[]), Verdict::Unobserved, "the oldest went");
        assert_eq!(o.check(A, Ino(0), 6, &[]), Verdict::Current, "the recently used stayed");
        assert_eq!(o.check(A, Ino(2), 1, &[]), Verdict::Current);
        assert_eq!(o.len(), MAX_PER_PROC);
        // Processes alike: the first one, used again, outlives newer ones.
        for t in 0..(MAX_PROCS as u32 - 1) {
            o.record(Proc { tgid: 1000 + t, start: 0 }, Ino(1), 1);
        }
        o.record(A, Ino(0), 6);
        o.record(Proc { tgid: 99_999, start: 0 }, Ino(1), 1);
        assert_eq!(o.check(A, Ino(0), 6, &[]), Verdict::Current);
        assert_eq!(o.check(Proc { tgid: 1000, start: 0 }, Ino(1), 1, &[]), Verdict::Unobserved);
    }
}
