//! Epoch floors: the lowest epoch a path may carry, so a path's epoch never
//! goes back across unlink, re-create, rename over and restarts (SPEC 5).
//!
//! Invariants:
//! - A path that was removed or replaced resumes at or above the highest
//!   epoch it ever carried: exactly while it is remembered, and above the
//!   mount-wide floor once forgotten (the floor is raised to the highest
//!   epoch of every path forgotten, so state stays bounded by what is
//!   live: at most 16 384 remembered paths).
//! - After a restart the floor is the recovered durable ceiling: no epoch
//!   handed out before the crash can be handed out again.
//! - An epoch is handed out only when the durable ceiling covers it; the
//!   ceiling is raised in the background before it runs out, so a grant
//!   rarely waits for a journal sync, and a new path never does.

use std::collections::HashMap;
use std::path::PathBuf;

use super::machine::Epoch;
use crate::error::{Error, Result};
use crate::store::epochs::{EpochJournal, RESERVE_AHEAD};

/// How many removed or replaced paths remember their exact epoch; past
/// that they are folded into the mount-wide floor for new paths.
const MAX_PATH_EPOCHS: usize = 16_384;

/// Remembered path epochs, the mount-wide floor and the durable ceiling.
#[derive(Debug, Default)]
pub struct Floors {
    /// The highest epoch each removed or replaced path carried.
    path_epochs: HashMap<PathBuf, Epoch>,
    /// Where every path without a remembered epoch starts.
    new_path_floor: Epoch,
    /// Durable epoch reservations (none: epochs live in memory only).
    journal: Option<EpochJournal>,
}

impl Floors {
    /// Keep epochs durable in `journal`; `ceiling` is the recovered one,
    /// above which every path resumes.
    pub fn set_journal(&mut self, journal: EpochJournal, ceiling: u64) {
        self.new_path_floor = self.new_path_floor.max(Epoch(ceiling));
        self.journal = Some(journal);
    }

    /// The epoch journal, for status and metrics.
    pub fn journal(&self) -> Option<&EpochJournal> {
        self.journal.as_ref()
    }

    /// The floor of every path without a remembered epoch.
    pub fn new_path_floor(&self) -> Epoch {
        self.new_path_floor
    }

    /// Remember that `path` carried epoch `e`.
    pub fn remember(&mut self, path: Option<PathBuf>, e: Epoch) {
        if let (Some(p), true) = (path, e > self.new_path_floor) {
            if self.path_epochs.len() >= MAX_PATH_EPOCHS && !self.path_epochs.contains_key(&p) {
                // Forget them all at once: every forgotten path resumes
                // above the highest epoch any of them had.
                let highest = self.path_epochs.values().copied().max().unwrap_or_default();
                self.new_path_floor = self.new_path_floor.max(highest);
                self.path_epochs = HashMap::new();
            }
            let slot = self.path_epochs.entry(p).or_default();
            *slot = (*slot).max(e);
        }
    }

    /// The lowest epoch an inode newly named by `path` may carry.
    pub fn floor(&self, path: Option<&PathBuf>) -> Epoch {
        let known = path.and_then(|p| self.path_epochs.get(p)).copied().unwrap_or_default();
        known.max(self.new_path_floor)
    }

    /// Make `need` safe to hand out (SPEC 5): the journal's mount-wide
    /// ceiling must cover it. Costs a journal sync only when the ceiling is
    /// used up, never per new path.
    pub fn reserve(&mut self, need: u64) -> Result<()> {
        let Some(j) = self.journal.as_mut() else {
            return Ok(());
        };
        let ceiling = j.ceiling();
        if need <= ceiling {
            if ceiling - need < RESERVE_AHEAD / 2 {
                // Running low: raise it in the background, off this path.
                j.reserve_ahead(ceiling + 1);
            }
            return Ok(());
        }
        match j.ensure(need) {
            Ok(_) => Ok(()),
            Err(e) => Err(Error::from(&e)),
        }
    }
}
