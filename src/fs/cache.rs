//! What the kernel may cache of names, and what the daemon remembers of
//! it: the deadlines of the entries it handed out, the bound on the files
//! it keeps referenced, and renames over live leases waiting for the
//! kernel to look their source up again. One cache policy, in one place.

use super::*;

/// How long the kernel may trust a name leading to a file or symlink that
/// it looked up. The kernel changes its own entries with every create,
/// link, unlink and rename it sends; the one change the daemon makes
/// differently (a rename over a live lease keeps the destination's inode
/// while the kernel moves the source's entry to the name) is handled in
/// [`Fs::rename`] with the deadlines below. A path walk then costs no
/// LOOKUP for its last component.
pub const FILE_ENTRY_TTL: Duration = Duration::from_secs(1);

/// Names of files younger than this are not cached by the kernel: a file
/// is usually renamed over a lease right after it was created and written
/// (a renewal), and a source without a cached entry needs no retry (see
/// [`Fs::rename`]). The age comes from the file's creation time; the
/// deadlines below do not depend on the clock.
pub(super) const YOUNG: Duration = Duration::from_secs(1);

/// Added to every recorded deadline: the kernel starts an entry's timeout
/// when the looking-up thread runs again after the reply, a little later
/// than the daemon records it.
pub(super) const ENTRY_MARGIN: Duration = Duration::from_secs(1);

/// What the kernel may cache of the namespace, and what it must be told
/// to drop.
#[derive(Debug)]
pub(super) struct KernelView {
    /// Inodes whose cached pages the kernel must drop (content replaced
    /// behind open descriptors).
    pub(super) invalidate: Vec<Ino>,
    /// Renames over a live lease waiting for the kernel to look their
    /// source up again (see `Fs::rename`).
    pub(super) pending_renames: PendingRenames,
    /// Files of which the kernel may hold a cached entry.
    pub(super) entry_deadlines: EntryDeadlines,
    /// Keeps the kernel's references to files bounded.
    pub(super) refs: KernelCache,
    /// The kernel caches names of files (not on a shared namespace).
    pub(super) names_cached: bool,
    /// Files the kernel may hold pages of (kept across opens, until it
    /// forgets the inode or they are dropped), with the number of their
    /// descriptors open through the page cache. A change of their content
    /// that does not pass through that cache (a write through a direct
    /// descriptor) drops the pages; once no such descriptor is open, none
    /// can bring pages back, and the file leaves this map.
    pub(super) paged: HashMap<Ino, usize>,
}

impl Default for KernelView {
    fn default() -> KernelView {
        KernelView {
            invalidate: Vec::new(),
            pending_renames: PendingRenames::default(),
            entry_deadlines: EntryDeadlines::default(),
            refs: KernelCache::default(),
            names_cached: true,
            paged: Default::default(),
        }
    }
}

/// The latest time until which the kernel may hold a cached entry (with
/// [`FILE_ENTRY_TTL`]) of each file it looked up; entries that expire at
/// once (of files younger than [`YOUNG`], and every entry a create, mknod,
/// symlink or link returns) are not here. Expired deadlines are pruned as
/// the map grows, so it holds about the files looked up in the last two
/// seconds.
#[derive(Debug, Default)]
pub(super) struct EntryDeadlines {
    pub(super) until: HashMap<Ino, Instant>,
    /// Prune when the map reaches this size.
    prune_at: usize,
}

impl EntryDeadlines {
    /// The kernel was just given an entry of `ino` that it may keep.
    pub(super) fn given(&mut self, ino: Ino, now: Instant) {
        if self.until.len() >= self.prune_at.max(1024) {
            self.until.retain(|_, d| *d > now);
            self.prune_at = 2 * self.until.len();
        }
        self.until.insert(ino, now + FILE_ENTRY_TTL + ENTRY_MARGIN);
    }

    /// The kernel may still hold a valid entry of `ino`.
    pub(super) fn cached(&self, ino: Ino, now: Instant) -> bool {
        self.until.get(&ino).is_some_and(|d| *d > now)
    }
}

/// The kernel keeps the inode of every file it was given a reference to
/// until it sends FORGET, and with FUSE it does so only under memory
/// pressure or at unmount (an expired entry stays cached too). A million
/// files looked up once would hold a million kernel inodes (about 1 KiB
/// each) and make the unmount evict them all. So the daemon keeps the
/// kernel's references to files near [`limits::Limits::kernel_inodes`]:
/// files are queued in the order the kernel first took a reference, and
/// the oldest that are not open and still have their names are
/// invalidated by name (the kernel drops each entry and, with it, the
/// inode: their FORGETs follow). Nothing depends on it for correctness: a
/// dropped entry costs a LOOKUP the next time the name is used.
///
/// Like the kernel's own reclaim, it has two watermarks: past the bound,
/// files are dropped by the lease timer once no new file was referenced
/// for [`TRIM_AFTER`] (a burst of new names does not pay for evicting old
/// ones); past twice the bound, right away, a batch at a time.
#[derive(Debug, Default)]
pub(super) struct KernelCache {
    /// Files in the order the kernel first took a reference to them (each
    /// may have been forgotten since; checked when it comes up).
    order: std::collections::VecDeque<Ino>,
    /// Entries to invalidate, taken by the FUSE layer after the reply.
    pub(super) drop: Vec<(Ino, OsString)>,
    /// The files of the last batch of drops: until their FORGETs arrive
    /// they still count as held, and must not start another batch.
    in_flight: Vec<Ino>,
    /// New references to let pass before trying again after a batch came
    /// out short (most queued files open or renamed).
    backoff: usize,
    /// When the kernel last took a first reference to a file.
    last_took: Option<Instant>,
    /// The kernel holds more than the bound and the timer was told to
    /// bring it back once references stop coming.
    trim_due: bool,
}

/// Files are dropped in batches of this many (at most; an eighth of the
/// bound when that is less): one wake-up of the dropping thread and one
/// BATCH_FORGET for the lot, not one of each per file.
pub(super) const DROP_BATCH: usize = 128;

/// Files past the bound are dropped once no file was newly referenced for
/// this long.
pub(crate) const TRIM_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// The pause between two batches of such a trim.
pub(super) const TRIM_GAP: std::time::Duration = std::time::Duration::from_millis(2);

impl KernelCache {
    pub(super) fn batch(bound: usize) -> usize {
        (bound / 8).clamp(1, DROP_BATCH)
    }

    /// The kernel took its first reference to the file `ino`: queue it;
    /// past twice `bound`, pick a batch of entries to drop. True when the
    /// timer must be woken to trim back to the bound later.
    pub(super) fn took(&mut self, ns: &Namespace, ino: Ino, bound: usize, now: Instant) -> bool {
        self.order.push_back(ino);
        self.last_took = Some(now);
        // Forgotten files leave stale slots behind: rebuild the queue from
        // what the kernel holds when it has grown far past it (a walk per
        // `3 * held + 1024` new references at least, so O(1) each; the
        // queue stays near what is held, not near the bound, when files
        // come and go: one per renewal by `rename`).
        if self.order.len() > 4 * ns.held() + 1024 {
            self.compact(ns);
        }
        let batch = Self::batch(bound);
        if ns.held() <= bound + batch {
            return false;
        }
        let ceiling = bound.saturating_mul(2);
        if ns.held() > ceiling + batch {
            if self.backoff > 0 {
                self.backoff -= 1;
            } else if let Some((picked, wanted)) = self.pick(ns, ceiling + batch, ceiling, usize::MAX) {
                if picked < wanted {
                    self.backoff = batch;
                }
            }
        }
        !std::mem::replace(&mut self.trim_due, true)
    }

    /// Keep one slot per file the kernel holds: its latest, the time of its
    /// current first reference (a file forgotten and looked up again was
    /// queued again).
    fn compact(&mut self, ns: &Namespace) {
        let mut seen = std::collections::HashSet::new();
        let mut kept: Vec<Ino> = Vec::with_capacity(ns.held());
        for &i in self.order.iter().rev() {
            if ns.get(i).is_ok_and(|i| i.lookups > 0) && seen.insert(i) {
                kept.push(i);
            }
        }
        kept.reverse();
        self.order = kept.into();
    }

    /// Slots in the queue (stale ones too).
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.order.len()
    }

    /// Once no file was newly referenced for [`TRIM_AFTER`], pick a batch of
    /// entries to drop towards `bound`. When to call again (none: at the
    /// bound, or nothing left that can be dropped).
    pub(super) fn trim(&mut self, ns: &Namespace, bound: usize, now: Instant) -> Option<std::time::Duration> {
        if !self.trim_due {
            return None;
        }
        let quiet = self.last_took.map_or(TRIM_AFTER, |t| now.saturating_duration_since(t));
        if quiet < TRIM_AFTER {
            return Some(TRIM_AFTER - quiet);
        }
        match self.pick(ns, bound, bound, Self::batch(bound)) {
            Some((picked, _)) if picked > 0 => Some(TRIM_GAP),
            // At the bound once the last FORGETs arrive, or the rest is
            // open or renamed away from its hint.
            _ => {
                self.trim_due = false;
                None
            }
        }
    }

    /// When the kernel holds (less the last batch, whose FORGETs may still
    /// be on their way) more than `over`, pick up to `most` of the oldest
    /// droppable files to bring it down to `target`: how many were picked,
    /// of how many wanted.
    pub(super) fn pick(&mut self, ns: &Namespace, over: usize, target: usize, most: usize) -> Option<(usize, usize)> {
        let pending = self.in_flight.iter().filter(|i| ns.get(**i).is_ok_and(|i| i.lookups > 0)).count();
        let held = ns.held() - pending.min(ns.held());
        if held <= over {
            return None;
        }
        let want = (held - target).min(most);
        self.in_flight.clear();
        let mut looked = 0;
        while self.in_flight.len() < want && looked < 4 * want {
            looked += 1;
            let Some(old) = self.order.pop_front() else { break };
            let Ok(i) = ns.get(old) else { continue };
            if i.lookups == 0 {
                continue;
            }
            if i.opens > 0 {
                // In use: its turn comes again after the others.
                self.order.push_back(old);
                continue;
            }
            // A file whose name is gone (or moved where the hint does not
            // lead) cannot be dropped by name; the kernel keeps it until
            // memory pressure or the unmount.
            if let Some((parent, name)) = ns.entry_of(old) {
                self.drop.push((parent, name.to_os_string()));
                self.in_flight.push(old);
            }
        }
        Some((self.in_flight.len(), want))
    }
}

/// Renames over a live lease that were answered `ESTALE` so that the kernel
/// retries them after looking the source up again, by source (directory,
/// name): the thread that asked, and whether it has looked the source up
/// since.
#[derive(Debug, Default)]
pub(super) struct PendingRenames(HashMap<(Ino, OsString), (u32, bool)>);

/// At most this many pending renames are remembered (a thread killed
/// between the two tries leaves one behind).
pub(super) const PENDING_RENAMES: usize = 256;

impl PendingRenames {
    /// `tid` must retry its rename of `name` in `parent`.
    pub(super) fn ask(&mut self, parent: Ino, name: &OsStr, tid: u32) {
        if self.0.len() >= PENDING_RENAMES {
            self.0.clear();
        }
        self.0.insert((parent, name.to_os_string()), (tid, false));
    }

    /// A lookup of `name` in `parent` by `tid`: true when a rename of it is
    /// pending (the kernel must not keep the entry).
    pub(super) fn looked_up(&mut self, parent: Ino, name: &OsStr, tid: u32) -> bool {
        if self.0.is_empty() {
            return false;
        }
        match self.0.get_mut(&(parent, name.to_os_string())) {
            Some(p) => {
                if p.0 == tid {
                    p.1 = true;
                }
                true
            }
            None => false,
        }
    }

    /// True (and forgotten) when `tid` retries its rename after looking
    /// the source up again.
    pub(super) fn retried(&mut self, parent: Ino, name: &OsStr, tid: u32) -> bool {
        let key = (parent, name.to_os_string());
        if self.0.get(&key) == Some(&(tid, true)) {
            self.0.remove(&key);
            return true;
        }
        false
    }
}
