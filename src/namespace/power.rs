//! What a power cut would leave (SPEC 13), tracked while the test bench
//! asks for it: each file's contents and size as of its last `fsync` or
//! `fdatasync`, its attributes and extended attributes as of its last
//! `fsync`, and each directory's names as of its last `fsync`; a rename is
//! kept only once every directory it changed was synced after it.
//!
//! Nothing is copied ahead: the first change of an inode after its last
//! sync keeps its attributes, the first change of a page keeps the page
//! (in the file's `Data`), the first change of a name keeps what it named
//! (in the directory's `Dir`). A sync drops what it made durable, so the
//! cost is in proportion to what changed between syncs. Inodes dropped
//! while a kept name may still lead to them wait among the ghosts.

use super::data::Synced;
use super::*;

/// An inode's attributes as of its last `fsync`.
#[derive(Debug, Clone)]
struct Meta {
    perm: u16,
    uid: u32,
    gid: u32,
    rdev: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
    xattrs: BTreeMap<OsString, Vec<u8>>,
}

impl Meta {
    fn of(i: &Inode) -> Meta {
        Meta {
            perm: i.perm,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.crtime,
            xattrs: i.xattrs.clone(),
        }
    }

    /// Put the attributes back; true when any differed.
    fn restore(self, i: &mut Inode) -> bool {
        let changed = i.perm != self.perm
            || i.uid != self.uid
            || i.gid != self.gid
            || i.rdev != self.rdev
            || i.mtime != self.mtime
            || i.ctime != self.ctime
            || i.xattrs != self.xattrs;
        i.perm = self.perm;
        i.uid = self.uid;
        i.gid = self.gid;
        i.rdev = self.rdev;
        i.atime = self.atime;
        i.mtime = self.mtime;
        i.ctime = self.ctime;
        i.crtime = self.crtime;
        i.xattrs = self.xattrs;
        changed
    }
}

/// A rename waiting for its directories' syncs.
#[derive(Debug, Clone)]
struct Rename {
    /// Directories not synced since.
    waiting: Vec<Ino>,
    /// The names it changed.
    halves: Vec<(Ino, OsString)>,
}

/// The power-cut tracking of a namespace.
#[derive(Debug, Default)]
pub struct Power {
    /// Attributes of inodes changed since their last `fsync`.
    meta: InoMap<Meta>,
    /// Dropped inodes, as they were dropped (with what they kept).
    ghosts: InoMap<Box<Inode>>,
    renames: HashMap<u64, Rename>,
    next_rename: u64,
    /// Directories (live or ghosts) that keep names.
    dirs: InoSet,
    /// Ghosts counted when they are next sorted out.
    gc_at: usize,
    /// Content pages the ghosts hold, and the count at which they are next
    /// sorted out (a removed large file is not kept for long).
    ghost_pages: u64,
    gc_pages_at: u64,
}

/// Ghosts are sorted out past this many of them, or past this many pages
/// (64 MiB), at least.
const GHOSTS_KEPT: usize = 1024;
const GHOST_PAGES_KEPT: u64 = 16 * 1024;

fn pages_of(i: &Inode) -> u64 {
    match &i.body {
        Body::File(d) => d.pages(),
        _ => 0,
    }
}

/// A file whose contents or attributes a power cut took back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostFile {
    pub ino: Ino,
    /// The size before the cut and after it.
    pub size: (u64, u64),
    /// Byte ranges (offset, length) whose contents the cut took back.
    pub lost: Vec<(u64, u64)>,
    /// Attributes or extended attributes went back.
    pub attrs: bool,
}

/// A name a power cut took back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostName {
    pub dir: Ino,
    pub name: OsString,
    /// What it named before the cut, and after it.
    pub was: Option<Ino>,
    pub now: Option<Ino>,
}

/// What a power cut took back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cut {
    pub files: Vec<LostFile>,
    pub names: Vec<LostName>,
    /// Inodes that existed before the cut and do not after it.
    pub gone: Vec<Ino>,
}

impl Power {
    /// Note the first change of `i` since its last sync.
    pub(super) fn touch(&mut self, i: &mut Inode) {
        if !self.meta.contains_key(&i.ino) {
            self.meta.insert(i.ino, Meta::of(i));
        }
        match &mut i.body {
            Body::File(d) if d.synced.is_none() => {
                d.synced = Some(Box::new(Synced { size: d.size, pages: BTreeMap::new() }));
            }
            Body::Dir(d) if d.synced.is_none() => {
                d.synced = Some(BTreeMap::new());
                self.dirs.insert(i.ino);
            }
            _ => {}
        }
    }

    /// Keep a dropped inode while a kept name may lead to it; true when
    /// the ghosts are due to be sorted out ([`Namespace::power_gc`]).
    pub(super) fn bury(&mut self, i: Box<Inode>) -> bool {
        self.ghost_pages += pages_of(&i);
        self.ghosts.insert(i.ino, i);
        self.ghosts.len() > self.gc_at.max(GHOSTS_KEPT) || self.ghost_pages > self.gc_pages_at.max(GHOST_PAGES_KEPT)
    }

    /// Drop the ghosts that none of `named` (what names kept in live
    /// directories lead to) leads to, directly or through ghost
    /// directories' kept names.
    fn sort_out_ghosts(&mut self, named: &InoSet) {
        let mut keep = InoSet::default();
        let mut stack: Vec<Ino> = named.iter().copied().collect();
        while let Some(ino) = stack.pop() {
            if !keep.insert(ino) {
                continue;
            }
            if let Some(Body::Dir(d)) = self.ghosts.get(&ino).map(|g| &g.body) {
                for k in d.synced.iter().flat_map(|m| m.values()) {
                    stack.extend(k.durable);
                    stack.extend(k.pending.iter().filter_map(|c| c.now));
                }
            }
        }
        let dropped: Vec<Ino> = self.ghosts.iter().map(|(i, _)| *i).filter(|i| !keep.contains(i)).collect();
        for ino in dropped {
            self.ghosts.remove(&ino);
            self.meta.remove(&ino);
            self.dirs.remove(&ino);
        }
        self.ghost_pages = self.ghosts.values().map(|g| pages_of(g)).sum();
        self.gc_at = (self.ghosts.len() * 2).max(GHOSTS_KEPT);
        self.gc_pages_at = (self.ghost_pages * 2).max(GHOST_PAGES_KEPT);
    }
}

impl Namespace {
    /// Start tracking what a power cut would leave: from now on, what the
    /// namespace holds counts as synced.
    pub fn power_on(&mut self) {
        self.power = Some(Box::default());
    }

    /// True while a power cut is tracked.
    pub fn power_tracked(&self) -> bool {
        self.power.is_some()
    }

    /// Inodes and kept names the tracking holds (for `status`).
    pub fn power_kept(&self) -> (usize, usize) {
        self.power.as_ref().map_or((0, 0), |p| (p.meta.len(), p.ghosts.len()))
    }

    /// Where the changes of a rename about to be made start (for
    /// [`Namespace::power_renamed`]).
    pub fn power_mark(&self) -> u64 {
        if self.power.is_some() {
            dir::RENAMING.with(|r| r.set(true));
        }
        dir::CHANGES.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The changes made since `mark` were a rename of `from` to `to` (or,
    /// with `RENAME_EXCHANGE`, both ways): one change of each name, kept
    /// only once every directory it changed is synced after it.
    pub fn power_renamed(&mut self, from: (Ino, &OsStr), to: (Ino, &OsStr), mark: u64) {
        dir::RENAMING.with(|r| r.set(false));
        let Some(p) = self.power.as_mut() else { return };
        let id = p.next_rename;
        p.next_rename += 1;
        let mut r = Rename { waiting: Vec::new(), halves: Vec::new() };
        for (dir, name) in [from, to] {
            let Some(Body::Dir(d)) = self.inodes.get_mut(&dir).map(|i| &mut i.body) else { continue };
            let Some(k) = d.synced.as_mut().and_then(|m| m.get_mut(name)) else { continue };
            let at = k.pending.iter().position(|c| c.seq >= mark).unwrap_or(k.pending.len());
            let Some(last) = k.pending.drain(at..).next_back() else { continue };
            k.pending.push(dir::Change { rename: Some(id), ..last });
            if !r.waiting.contains(&dir) {
                r.waiting.push(dir);
            }
            r.halves.push((dir, name.to_os_string()));
        }
        if !r.halves.is_empty() {
            p.renames.insert(id, r);
        }
    }

    /// `fsync` (`data_only`: `fdatasync`) of `ino` returned: what it made
    /// durable is no longer kept.
    pub fn power_synced(&mut self, ino: Ino, data_only: bool) {
        let Some(p) = self.power.as_mut() else { return };
        if !data_only {
            p.meta.remove(&ino);
        }
        let Some(i) = self.inodes.get_mut(&ino) else { return };
        match &mut i.body {
            Body::File(d) => d.synced = None,
            Body::Dir(_) => self.power_sync_dir(ino),
            _ => {}
        }
    }

    /// A directory's sync: every change of its names so far is synced; a
    /// change is durable once synced, and, if a rename made it, once every
    /// directory of the rename was synced after it.
    fn power_sync_dir(&mut self, dir: Ino) {
        let Some(p) = self.power.as_mut() else { return };
        let mut done = Vec::new();
        for (id, r) in p.renames.iter_mut() {
            if r.waiting.contains(&dir) {
                r.waiting.retain(|w| *w != dir);
                if r.waiting.is_empty() {
                    done.push(*id);
                }
            }
        }
        let mut dirs = vec![dir];
        for id in &done {
            if let Some(r) = p.renames.remove(id) {
                dirs.extend(r.halves.into_iter().map(|(d, _)| d));
            }
        }
        dirs.sort();
        dirs.dedup();
        for d_ino in dirs {
            let Some(Body::Dir(d)) = self.inodes.get_mut(&d_ino).map(|i| &mut i.body) else { continue };
            let Some(kept) = d.synced.as_mut() else { continue };
            kept.retain(|_, k| {
                if d_ino == dir {
                    for c in &mut k.pending {
                        c.synced = true;
                    }
                }
                fold(k, &p.renames);
                !k.pending.is_empty()
            });
        }
    }

    /// Drop ghosts no kept name can lead to any more.
    pub(super) fn power_gc(&mut self) {
        let Some(p) = self.power.as_mut() else { return };
        let mut named = InoSet::default();
        for dir in p.dirs.iter() {
            if let Some(Body::Dir(d)) = self.inodes.get(dir).map(|i| &i.body) {
                for k in d.synced.iter().flat_map(|m| m.values()) {
                    named.extend(k.durable);
                    named.extend(k.pending.iter().filter_map(|c| c.now));
                }
            }
        }
        p.sort_out_ghosts(&named);
    }

    /// Cut the power: every file, attribute and name goes back to what was
    /// synced; inodes nothing durable names are gone. Kernel references
    /// (lookups) of inodes that remain are kept; open counts are not (the
    /// descriptors opened before the cut are dead). Tracking starts again
    /// from the state after the cut.
    pub fn power_cut(&mut self) -> Cut {
        let Some(mut p) = self.power.take() else { return Cut::default() };
        let mut cut = Cut::default();
        let before: InoSet = self.inodes.iter().map(|(i, _)| *i).collect();
        let lookups: Vec<(Ino, u64)> =
            self.inodes.values().filter(|i| i.lookups > 0).map(|i| (i.ino, i.lookups)).collect();
        for (ino, g) in std::mem::take(&mut p.ghosts) {
            self.inodes.insert(ino, g);
        }
        // Names first, with what each named before the cut.
        for dir in p.dirs.iter() {
            let Some(Body::Dir(d)) = self.inodes.get_mut(dir).map(|i| &mut i.body) else { continue };
            let Some(kept) = d.synced.take() else { continue };
            for (name, mut k) in kept {
                fold(&mut k, &p.renames);
                let was = d.get(&name);
                let now = k.durable;
                if was == now {
                    continue;
                }
                match now {
                    Some(i) => d.insert(name.clone(), i),
                    None => {
                        d.remove(&name);
                    }
                }
                cut.names.push(LostName { dir: *dir, name, was, now });
            }
        }
        let touched: Vec<Ino> = p.meta.iter().map(|(i, _)| *i).collect();
        let mut files = std::collections::BTreeMap::new();
        for ino in touched {
            let Some(i) = self.inodes.get_mut(&ino) else { continue };
            let mut lost = LostFile { ino, size: (0, 0), lost: Vec::new(), attrs: false };
            if let Body::File(d) = &mut i.body {
                (lost.size, lost.lost) = roll_back(d);
            }
            if let Some(m) = p.meta.remove(&ino) {
                lost.attrs = m.restore(i);
            }
            if !lost.lost.is_empty() || lost.attrs || lost.size.0 != lost.size.1 {
                // A content token (SPEC 6) never comes back.
                i.version += 1;
                files.insert(ino, lost);
            }
        }
        // Files whose contents changed with no attribute change noted
        // (their attributes were synced by an fsync, their data not since).
        for i in self.inodes.values_mut() {
            if let Body::File(d) = &mut i.body {
                if d.synced.is_some() {
                    let (size, lost) = roll_back(d);
                    i.version += 1;
                    files.insert(i.ino, LostFile { ino: i.ino, size, lost, attrs: false });
                }
            } else if let Body::Dir(d) = &mut i.body {
                d.synced = None;
            }
        }
        // Rebuilt from the names: link counts, parents, usage; inodes no
        // durable name reaches are dropped.
        let inodes = std::mem::take(&mut self.inodes);
        let dirs: InoSet = inodes.values().filter(|i| i.kind == Kind::Dir).map(|i| i.ino).collect();
        let root = Namespace::new(0o755, 0, 0, SystemTime::UNIX_EPOCH);
        let (track, churn) = (self.track, self.churn);
        *self = Namespace::restore(inodes, &dirs, self.next_ino, root);
        self.churn = churn;
        for (ino, n) in lookups {
            if let Some(i) = self.inodes.get_mut(&ino) {
                i.lookups = n;
                if i.kind != Kind::Dir {
                    self.held += 1;
                }
            }
        }
        cut.gone = before.into_iter().filter(|i| !self.inodes.contains_key(i)).collect();
        cut.gone.sort();
        cut.files = files.into_values().filter(|f| self.inodes.contains_key(&f.ino)).collect();
        cut.names.sort_by(|a, b| (a.dir, &a.name).cmp(&(b.dir, &b.name)));
        if track {
            self.set_tracking();
        }
        self.power_on();
        cut
    }
}

/// Put a file's contents back to what its last sync saw; the sizes before
/// and after, and the byte ranges that changed.
fn roll_back(d: &mut Data) -> ((u64, u64), Vec<(u64, u64)>) {
    let Some(s) = d.synced.take() else { return ((d.size, d.size), Vec::new()) };
    let lost = lost_ranges(d, &s);
    let sizes = (d.size, s.size);
    for (idx, page) in s.pages {
        match page {
            Some(pg) => d.pages.insert(idx, pg),
            None => {
                d.pages.remove(idx);
            }
        }
    }
    d.pages.split_off(s.size.div_ceil(PAGE as u64));
    d.size = s.size;
    (sizes, lost)
}

/// Make the latest durable change of a name its durable value: a change
/// the directory's sync saw, not made by a rename still waiting for
/// another directory's sync.
fn fold(k: &mut dir::Kept, renames: &HashMap<u64, Rename>) {
    let durable = |c: &dir::Change| c.synced && c.rename.is_none_or(|r| !renames.contains_key(&r));
    if let Some(i) = k.pending.iter().rposition(durable) {
        k.durable = k.pending[i].now;
        k.pending.drain(..=i);
    }
}

/// Byte ranges of `d` that differ from what `s` kept (the pages it kept,
/// and whatever lies past the kept size), merged.
fn lost_ranges(d: &Data, s: &Synced) -> Vec<(u64, u64)> {
    let byte = |page: Option<&[u8]>, size: u64, off: u64| -> Option<u8> {
        (off < size).then(|| page.and_then(|p| p.get((off % PAGE as u64) as usize)).copied().unwrap_or(0))
    };
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut add = |from: u64, to: u64| {
        if from >= to {
            return;
        }
        match out.last_mut() {
            Some((o, l)) if *o + *l >= from => *l = (*l).max(to - *o),
            _ => out.push((from, to - from)),
        }
    };
    let mut spans: Vec<(u64, u64)> = Vec::new();
    for (idx, old) in &s.pages {
        let start = idx * PAGE as u64;
        let (mut first, mut last) = (None, None);
        let cur = d.pages.get(*idx).map(|p| &**p);
        for off in start..start + PAGE as u64 {
            if byte(cur, d.size, off) != byte(old.as_deref(), s.size, off) {
                first.get_or_insert(off);
                last = Some(off);
            }
        }
        if let (Some(f), Some(l)) = (first, last) {
            spans.push((f, l + 1));
        }
    }
    if d.size > s.size {
        // Past the kept size, outside the kept pages: a grown hole.
        spans.push((s.size, d.size));
    }
    spans.sort();
    for (f, t) in spans {
        add(f, t);
    }
    out
}
