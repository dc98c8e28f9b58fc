//! What each process has seen of each lease, and what each name pointed at
//! before: the memory behind the compare-and-swap verdicts (SPEC 6).
//!
//! Invariants:
//! - A process is identified by its thread-group id *and* start time, read
//!   afresh from `/proc` before every verdict, so a reused pid never
//!   inherits another process's observations.
//! - Everything is bounded: observations (see [`Observations`]), the
//!   thread-id cache (8192), predecessor chains (16 per inode), removed
//!   names (16 384); exited processes are swept every 4096 observations.
//! - A name re-pointed at the *same* inode (rename over a live lease,
//!   re-attach after unlink) records the version at which it happened:
//!   observations older than that are stale for `unlink` too.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::observe::{Observations, Proc, Verdict};
use crate::namespace::Ino;

/// How many earlier targets of a name are remembered per inode.
const MAX_PREDECESSORS: usize = 16;
/// How many removed names remember their last target.
const MAX_REMOVED_NAMES: usize = 16_384;
/// Observations recorded between sweeps for exited processes.
const SWEEP_EVERY: u64 = 4096;
/// Thread ids whose process identity is cached.
const MAX_TIDS: usize = 8192;

/// Resolve a request's thread id to the process identity (thread-group id
/// and start time) from `/proc`.
pub fn proc_of_tid(tid: u32) -> Option<Proc> {
    let tgid = crate::procfs::tgid(tid)?;
    Some(Proc { tgid, start: crate::procfs::start_time(tgid)? })
}

/// A stale view: who acted on which version, and what is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleView {
    pub pid: u32,
    pub seen: u64,
    pub current: u64,
}

/// Per-process views and name history.
#[derive(Debug)]
pub struct Views {
    /// What each process last observed of each file.
    obs: Observations,
    /// Inodes a name pointed at before it pointed at this one.
    predecessors: HashMap<Ino, Vec<Ino>>,
    /// The version at which a name was last re-pointed at the same inode.
    repointed: HashMap<Ino, u64>,
    /// The last inode each removed name pointed at.
    removed: HashMap<PathBuf, Ino>,
    /// Thread id → process identity cache.
    tids: HashMap<u32, Proc>,
    recorded: u64,
    resolve: fn(u32) -> Option<Proc>,
}

impl Default for Views {
    fn default() -> Views {
        Views {
            obs: Observations::new(),
            predecessors: HashMap::new(),
            repointed: HashMap::new(),
            removed: HashMap::new(),
            tids: HashMap::new(),
            recorded: 0,
            resolve: proc_of_tid,
        }
    }
}

impl Views {
    /// Identify processes with `resolve` instead of `/proc` (tests).
    pub fn set_resolver(&mut self, resolve: fn(u32) -> Option<Proc>) {
        self.resolve = resolve;
        self.tids.clear();
    }

    /// The process behind a request's thread id, cached; `fresh` re-reads it
    /// (before a compare-and-swap check, so a reused pid is never trusted).
    pub fn proc(&mut self, tid: u32, fresh: bool) -> Option<Proc> {
        if tid == 0 {
            return None;
        }
        if !fresh {
            if let Some(p) = self.tids.get(&tid) {
                return Some(*p);
            }
        }
        let p = (self.resolve)(tid)?;
        if self.tids.len() > MAX_TIDS {
            self.tids.clear();
        }
        self.tids.insert(tid, p);
        Some(p)
    }

    /// The calling process and its ancestors: a holder's shell running
    /// `touch`, `setfattr` or `echo >> file` acts for the holder.
    pub fn lineage(&mut self, tid: u32) -> Vec<u32> {
        let Some(p) = self.proc(tid, false) else {
            return Vec::new();
        };
        let mut out = vec![p.tgid];
        let mut pid = p.tgid;
        for _ in 0..32 {
            let Some(ppid) = crate::procfs::parent(pid) else { break };
            if ppid <= 1 {
                break;
            }
            out.push(ppid);
            pid = ppid;
        }
        out
    }

    /// The process `p` observed the file `ino` at `version`.
    pub fn observe(&mut self, p: Proc, ino: Ino, version: u64) {
        self.obs.record(p, ino, version);
        self.recorded += 1;
        if self.recorded.is_multiple_of(SWEEP_EVERY) {
            let resolve = self.resolve;
            self.obs.forget_dead(|p| resolve(p.tgid).is_some_and(|q| q == *p));
            self.tids.clear();
        }
    }

    /// Whether `tid` acts on a current view of the file `ino`, now at
    /// `version`. For a rename over (`content_counts`) any change of content
    /// or of what the name points at makes the view stale; for an unlink
    /// only the name being re-pointed does (a parent removing a file its
    /// child rewrote is ordinary cleanup). Processes that never observed it
    /// are not checked.
    pub fn check(&mut self, tid: u32, ino: Ino, version: u64, content_counts: bool) -> Result<(), StaleView> {
        let Some(p) = self.proc(tid, true) else {
            return Ok(());
        };
        let preds: Vec<(Ino, u64)> =
            self.predecessors.get(&ino).map(|v| v.iter().map(|i| (*i, 0)).collect()).unwrap_or_default();
        let verdict = if content_counts {
            self.obs.check(p, ino, version, &preds)
        } else {
            let repointed_at = self.repointed.get(&ino).copied().unwrap_or(0);
            self.obs.check_name(p, ino, repointed_at, &preds)
        };
        match verdict {
            Verdict::Current | Verdict::Unobserved => Ok(()),
            Verdict::Stale { seen, current } => Err(StaleView { pid: p.tgid, seen, current }),
        }
    }

    /// The name leading to `ino` was re-pointed at it again (same inode) at
    /// `version`: earlier observers of the name hold a stale view.
    pub fn repoint(&mut self, ino: Ino, version: u64) {
        self.repointed.insert(ino, version);
    }

    /// The name now pointing at `new` pointed at `old` before.
    pub fn succeed(&mut self, old: Ino, new: Ino) {
        if old == new {
            return;
        }
        let mut chain = self.predecessors.get(&old).cloned().unwrap_or_default();
        chain.push(old);
        let entry = self.predecessors.entry(new).or_default();
        entry.extend(chain);
        if entry.len() > MAX_PREDECESSORS {
            let cut = entry.len() - MAX_PREDECESSORS;
            entry.drain(..cut);
        }
    }

    /// The name `path` was removed; it pointed at `ino`.
    pub fn name_removed(&mut self, path: PathBuf, ino: Ino) {
        if self.removed.len() >= MAX_REMOVED_NAMES {
            self.removed.clear();
        }
        self.removed.insert(path, ino);
    }

    /// What the removed name `path` pointed at, forgetting it (the name
    /// exists again).
    pub fn take_removed(&mut self, path: &Path) -> Option<Ino> {
        self.removed.remove(path)
    }

    /// The inode is gone.
    pub fn forget(&mut self, ino: Ino) {
        self.predecessors.remove(&ino);
        self.repointed.remove(&ino);
    }

    /// Observation records kept.
    pub fn len(&self) -> usize {
        self.obs.len()
    }

    /// True when no observation is kept.
    pub fn is_empty(&self) -> bool {
        self.obs.len() == 0
    }
}
