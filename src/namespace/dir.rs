//! Directories: their names (sharded so a large one grows a little at a
//! time), readdir cookies, and what changed since the last sync.

use super::*;

/// A directory's names: each name's cookie and inode. A hash table grows
/// by moving every entry at once (a quarter of a second at a million
/// names, stopping every request), so a large directory splits its names
/// over [`NAME_SHARDS`] tables that each grow on their own, a few
/// milliseconds at a time.
#[derive(Debug, Clone, Default)]
pub(super) struct Names {
    pub(super) shards: Vec<HashMap<OsString, (u64, Ino)>>,
    pub(super) len: usize,
}

/// Tables of a large directory's names.
pub(super) const NAME_SHARDS: usize = 64;
/// A directory splits its names once it has this many (moving them takes
/// about a millisecond, once; at 32 768 the split and the doubling just
/// before it stopped requests for 9 ms each).
pub(super) const SPLIT_NAMES_AT: usize = 1 << 12;

impl Names {
    /// Which table holds `name` (FNV-1a; the tables hash with their own
    /// random keys).
    pub(super) fn shard(&self, name: &OsStr) -> usize {
        if self.shards.len() <= 1 {
            return 0;
        }
        use std::os::unix::ffi::OsStrExt;
        let h = name
            .as_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3));
        (h % self.shards.len() as u64) as usize
    }

    pub(super) fn get(&self, name: &OsStr) -> Option<&(u64, Ino)> {
        self.shards.get(self.shard(name))?.get(name)
    }

    pub(super) fn entry(&mut self, name: OsString) -> std::collections::hash_map::Entry<'_, OsString, (u64, Ino)> {
        if self.shards.is_empty() {
            self.shards.push(HashMap::new());
        } else if self.shards.len() == 1 && self.len >= SPLIT_NAMES_AT {
            let all = std::mem::take(&mut self.shards[0]);
            self.shards = (0..NAME_SHARDS).map(|_| HashMap::with_capacity(2 * all.len() / NAME_SHARDS)).collect();
            for (n, v) in all {
                let i = self.shard(&n);
                self.shards[i].insert(n, v);
            }
        }
        let i = self.shard(&name);
        self.shards[i].entry(name)
    }

    /// Room for `n` names in all (split over the tables when that many
    /// would split them).
    pub(super) fn reserve(&mut self, n: usize) {
        if self.len > 0 || n == 0 {
            return;
        }
        self.shards = if n >= SPLIT_NAMES_AT {
            (0..NAME_SHARDS).map(|_| HashMap::with_capacity(n / NAME_SHARDS + n / NAME_SHARDS / 8)).collect()
        } else {
            vec![HashMap::with_capacity(n)]
        };
    }

    /// Count a name added through [`Names::entry`].
    pub(super) fn added(&mut self) {
        self.len += 1;
    }

    pub(super) fn remove(&mut self, name: &OsStr) -> Option<(u64, Ino)> {
        let i = self.shard(name);
        let v = self.shards.get_mut(i)?.remove(name)?;
        self.len -= 1;
        Some(v)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }
}

/// Entries of a directory with stable readdir cookies.
#[derive(Debug, Clone)]
pub struct Dir {
    /// The parent directory (the root is its own parent).
    pub parent: Ino,
    pub(super) entries: BTreeMap<u64, (OsString, Ino)>,
    /// Each name's cookie, and the inode (a lookup in a directory of a
    /// million names then touches one table, not two).
    pub(super) by_name: Names,
    pub(super) next_cookie: u64,
    /// Names changed since the last flush, when the namespace is durable.
    pub(super) dirty: Option<DirDirty>,
    /// Names changed since the directory's last `fsync`, with what a power
    /// cut would leave them naming, while the test bench tracks it.
    pub(super) synced: Option<BTreeMap<OsString, Kept>>,
}

/// What a name of a directory would name after a power cut: its value as
/// of the last change that is durable, and the changes since, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Kept {
    pub(super) durable: Option<Ino>,
    pub(super) pending: Vec<Change>,
}

/// One change of a name not yet durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Change {
    /// What the name named after it.
    pub(super) now: Option<Ino>,
    /// Its place among every change (see [`next_change`]).
    pub(super) seq: u64,
    /// The rename it was part of.
    pub(super) rename: Option<u64>,
    /// The directory was synced after it.
    pub(super) synced: bool,
}

/// Changes of names are numbered in one sequence, so a rename can tell
/// the changes it made from earlier ones.
pub(super) static CHANGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn next_change() -> u64 {
    CHANGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

thread_local! {
    /// A rename is being made on this thread (between
    /// `Namespace::power_mark` and `Namespace::power_renamed`): its changes
    /// never cancel out, the rename tags them once it is whole.
    pub(super) static RENAMING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// What changed in a directory since the last flush. Cookies are handed out
/// in order, so every entry from `mark` on is new and needs no record of
/// its own: a directory that gained a million names copies none of them
/// (and frees none at the flush). A name created and removed again in
/// between is no change at all.
#[derive(Debug, Clone, Default)]
pub(super) struct DirDirty {
    /// The next cookie at the last flush.
    pub(super) mark: u64,
    /// Cookies below the mark whose entry now names another inode.
    pub(super) replaced: BTreeSet<u64>,
    /// Names that existed at the last flush and were removed since (some
    /// may exist again, under a cookie from the mark on).
    pub(super) removed: HashSet<OsString>,
}

/// First cookie handed to a real entry; 1 and 2 are `.` and `..`.
pub const FIRST_COOKIE: u64 = 3;

impl Dir {
    /// An empty directory (for recovery).
    pub fn empty(parent: Ino) -> Dir {
        Dir::new(parent)
    }

    pub(super) fn new(parent: Ino) -> Dir {
        Dir {
            parent,
            entries: BTreeMap::new(),
            by_name: Names::default(),
            next_cookie: FIRST_COOKIE,
            dirty: None,
            synced: None,
        }
    }

    /// Room for `n` names, for an empty directory about to get them
    /// (recovery): its tables are allocated once.
    pub fn reserve(&mut self, n: usize) {
        self.by_name.reserve(n);
    }

    /// The inode a name points at.
    pub fn get(&self, name: &OsStr) -> Option<Ino> {
        self.by_name.get(name).map(|&(_, ino)| ino)
    }

    /// Number of entries (without `.` and `..`).
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True when the directory has no entries.
    pub fn is_empty(&self) -> bool {
        self.by_name.len() == 0
    }

    /// Note a change of `name` (now naming `now`) for a power cut.
    fn keep(&mut self, name: &OsStr, now: Option<Ino>) {
        let Some(kept) = &mut self.synced else { return };
        let before = self.by_name.get(name).map(|&(_, i)| i);
        let k = kept.entry(name.to_os_string()).or_insert(Kept { durable: before, pending: Vec::new() });
        k.pending.push(Change { now, seq: next_change(), rename: None, synced: false });
        // Changes no sync saw and no rename made, back where they started:
        // the next sync would make the name what it was.
        let renaming = RENAMING.with(std::cell::Cell::get);
        if !renaming && k.durable == now && k.pending.iter().all(|c| c.rename.is_none() && !c.synced) {
            kept.remove(name);
        }
    }

    /// Add or replace a name.
    pub fn insert(&mut self, name: OsString, ino: Ino) {
        use std::collections::hash_map::Entry;
        self.keep(&name, Some(ino));
        match self.by_name.entry(name) {
            Entry::Occupied(mut slot) => {
                let cookie = slot.get().0;
                slot.get_mut().1 = ino;
                if let Some(d) = &mut self.dirty {
                    if cookie < d.mark {
                        d.replaced.insert(cookie);
                    }
                }
                // Replacing keeps the position: the name was already listed.
                self.entries.insert(cookie, (slot.key().clone(), ino));
            }
            Entry::Vacant(slot) => {
                let cookie = self.next_cookie;
                self.next_cookie += 1;
                self.entries.insert(cookie, (slot.key().clone(), ino));
                slot.insert((cookie, ino));
                self.by_name.added();
            }
        }
    }

    /// Remove a name, returning the inode it pointed at.
    pub fn remove(&mut self, name: &OsStr) -> Option<Ino> {
        if self.by_name.get(name).is_some() {
            self.keep(name, None);
        }
        let (cookie, _) = self.by_name.remove(name)?;
        if let Some(d) = &mut self.dirty {
            // Created since the last flush: removing it leaves nothing to record.
            if cookie < d.mark {
                d.replaced.remove(&cookie);
                d.removed.insert(name.to_os_string());
            }
        }
        self.entries.remove(&cookie).map(|(_, ino)| ino)
    }

    /// Entries strictly after `cookie`, at most `max`.
    pub fn after(&self, cookie: u64, max: usize) -> Vec<(u64, OsString, Ino)> {
        self.entries.range(cookie.saturating_add(1)..).take(max).map(|(&c, (n, i))| (c, n.clone(), *i)).collect()
    }

    /// Names changed since the last flush.
    pub fn dirty_names(&self) -> impl Iterator<Item = &OsString> {
        self.dirty.iter().flat_map(move |d| {
            let new = self.entries.range(d.mark..).map(|(_, (n, _))| n);
            let replaced = d.replaced.iter().filter_map(|c| self.entries.get(c)).map(|(n, _)| n);
            // A removed name that exists again is listed with the new ones.
            let removed = d.removed.iter().filter(|n| self.by_name.get(n.as_os_str()).is_none_or(|&(c, _)| c < d.mark));
            new.chain(replaced).chain(removed)
        })
    }

    /// Entries from `cookie` on, with their cookies (an image encoded a
    /// slice at a time resumes there).
    pub fn from_cookie(&self, cookie: u64) -> impl Iterator<Item = (u64, &OsString, Ino)> {
        self.entries.range(cookie..).map(|(&c, (n, i))| (c, n, *i))
    }

    /// All entries in cookie order.
    pub fn iter(&self) -> impl Iterator<Item = (&OsString, Ino)> {
        self.entries.values().map(|(n, i)| (n, *i))
    }
}
