//! The inode table and directory tree.
//!
//! Invariants this module keeps:
//! - Inode numbers come from a counter that only goes up, so a number is never
//!   reused while the kernel may still hold it.
//! - An inode stays in the table while it has a name (`nlink > 0`) or the
//!   kernel still holds lookups on it; only FORGET lowers the lookup count.
//! - Directory entries carry a cookie assigned at insertion from a per-directory
//!   counter. `readdir` resumes strictly after a cookie, so offsets handed to
//!   the kernel stay valid while entries are added and removed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::time::SystemTime;

use crate::error::{Error, Result};

mod data;
mod dir;
pub mod inomap;
mod pages;
pub mod power;
pub mod replica;

pub use data::Data;
use data::{freed, FREED_PAGES};
use dir::DirDirty;
pub use dir::{Dir, FIRST_COOKIE};

/// An inode number as the kernel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl Ino {
    /// The mount root.
    pub const ROOT: Ino = Ino(1);
}

/// Hashes inode numbers with one multiplication. Inode numbers come from a
/// counter, not from callers, so a keyed hash (SipHash, several times
/// slower) buys nothing here, and a million-inode table is rebuilt at every
/// start.
#[derive(Default, Clone, Copy)]
pub struct InoHasher(u64);

impl std::hash::Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing: spreads consecutive numbers over the high bits
        // (the table's control bytes) and the low bits (its index) alike.
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub use inomap::InoMap;
/// A set of inode numbers.
pub type InoSet = HashSet<Ino, std::hash::BuildHasherDefault<InoHasher>>;

/// Longest name a directory entry may have, in bytes.
pub const NAME_MAX: usize = 255;
/// Size of a content page; files are stored as sparse pages.
pub const PAGE: usize = 4096;
/// Largest file size (the kernel's `MAX_LFS_FILESIZE` on 64-bit).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// The type of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe (inert: the kernel implements the pipe).
    Fifo,
    /// Unix socket node (inert).
    Socket,
    /// Character device node (inert).
    CharDev,
    /// Block device node (inert).
    BlockDev,
}

impl Kind {
    /// The kind encoded in the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Some(Kind::File),
            libc::S_IFDIR => Some(Kind::Dir),
            libc::S_IFLNK => Some(Kind::Symlink),
            libc::S_IFIFO => Some(Kind::Fifo),
            libc::S_IFSOCK => Some(Kind::Socket),
            libc::S_IFCHR => Some(Kind::CharDev),
            libc::S_IFBLK => Some(Kind::BlockDev),
            _ => None,
        }
    }
}

/// Attributes of an inode, as returned to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    /// Permission bits including setuid, setgid and sticky.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub rdev: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
}

impl Attr {
    /// Attributes of nothing (a negative directory entry carries them).
    pub fn absent() -> Attr {
        let t = SystemTime::UNIX_EPOCH;
        Attr {
            ino: Ino(0),
            kind: Kind::File,
            perm: 0,
            nlink: 0,
            uid: 0,
            gid: 0,
            size: 0,
            blocks: 0,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
        }
    }
}

/// What an inode holds besides its attributes.
#[derive(Debug, Clone)]
pub enum Body {
    File(Data),
    Dir(Box<Dir>),
    Symlink(OsString),
    /// FIFOs, sockets and device nodes carry nothing.
    Special,
}

/// One inode.
#[derive(Debug, Clone)]
pub struct Inode {
    pub ino: Ino,
    pub kind: Kind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub crtime: SystemTime,
    /// Kernel references from lookup-type replies, lowered only by FORGET.
    pub lookups: u64,
    /// Open handles on the inode.
    pub opens: u64,
    /// Bumped on every change of content or of the name pointing at it
    /// (the lease version of SPEC 6).
    pub version: u64,
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
    pub body: Body,
}

impl Inode {
    /// Reset change tracking of the content to "nothing changed".
    fn start_tracking(&mut self) {
        match &mut self.body {
            Body::File(d) => d.dirty = Some(data::DirtyPages::Clean),
            Body::Dir(d) => d.dirty = Some(DirDirty { mark: d.next_cookie, ..DirDirty::default() }),
            _ => {}
        }
    }

    /// Attributes for the kernel.
    pub fn attr(&self) -> Attr {
        let (size, pages) = match &self.body {
            Body::File(d) => (d.size(), d.pages()),
            Body::Dir(d) => ((d.len() as u64 + 2) * 20, 0),
            Body::Symlink(t) => (t.len() as u64, 0),
            Body::Special => (0, 0),
        };
        Attr {
            ino: self.ino,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            size,
            blocks: pages * (PAGE as u64 / 512),
            rdev: self.rdev,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.crtime,
        }
    }

    /// The directory body, or `ENOTDIR`.
    pub fn dir(&self) -> Result<&Dir> {
        match &self.body {
            Body::Dir(d) => Ok(d),
            _ => Err(Error::NotDir),
        }
    }

    /// The directory body, or `ENOTDIR`.
    pub fn dir_mut(&mut self) -> Result<&mut Dir> {
        match &mut self.body {
            Body::Dir(d) => Ok(d),
            _ => Err(Error::NotDir),
        }
    }

    /// The file contents, or `EISDIR`/`EINVAL`.
    pub fn data(&self) -> Result<&Data> {
        match &self.body {
            Body::File(d) => Ok(d),
            Body::Dir(_) => Err(Error::IsDir),
            _ => Err(Error::Invalid),
        }
    }

    /// The file contents, or `EISDIR`/`EINVAL`.
    pub fn data_mut(&mut self) -> Result<&mut Data> {
        match &mut self.body {
            Body::File(d) => Ok(d),
            Body::Dir(_) => Err(Error::IsDir),
            _ => Err(Error::Invalid),
        }
    }

    /// Mark a change of content: mtime and ctime.
    pub fn touch_content(&mut self, now: SystemTime) {
        self.mtime = now;
        self.ctime = now;
    }

    /// Mark a change of a regular file's content: times and version.
    pub fn change_content(&mut self, now: SystemTime) {
        self.touch_content(now);
        self.version += 1;
    }
}

/// Fields of a new inode.
#[derive(Debug, Clone)]
pub struct NewInode {
    pub kind: Kind,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub symlink: Option<OsString>,
}

/// The inode table.
#[derive(Debug)]
pub struct Namespace {
    /// Boxed: a million-inode table is then 16 bytes a slot, not 224
    /// (a hash table keeps up to half its slots empty), and rebuilding it
    /// at start moves pointers, not inodes.
    inodes: InoMap<Box<Inode>>,
    next_ino: u64,
    /// Track changes for the durable store.
    track: bool,
    /// Inodes changed since the last flush.
    dirty: InoSet,
    /// Inodes created since the last flush: the durable image has never
    /// seen them, so dropping one needs no record.
    fresh: InoSet,
    /// Inodes dropped since the last flush.
    freed: InoSet,
    /// Where each inode was last given a name: a hint for finding a path
    /// without walking the tree (verified before use).
    hints: InoMap<(Ino, OsString)>,
    /// What the contents and extended attributes occupy, kept up to date by
    /// [`Namespace::account`] and [`Namespace::maybe_drop`] so the size
    /// limit is checked in O(1).
    usage: Usage,
    /// Content pages added and removed since start (every page stored
    /// or freed), counted apart so a flush can tell new content from
    /// rewritten or removed content.
    churn: PageChurn,
    /// Non-directories the kernel holds a reference to (lookups > 0).
    held: usize,
    /// Inodes left without a name but not dropped (a handle or the
    /// kernel's memory keeps them): where [`Namespace::forgettable`]
    /// looks, so it never walks the table.
    removed: InoSet,
    /// What a power cut would leave, while the test bench tracks it.
    power: Option<Box<power::Power>>,
}

/// Content pages added and removed since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageChurn {
    pub added: u64,
    pub removed: u64,
}

/// Space the namespace occupies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Content pages stored.
    pub pages: u64,
    /// Names and values of extended attributes.
    pub xattr_bytes: u64,
}

impl Usage {
    /// Bytes counted against the size limit.
    pub fn bytes(&self) -> u64 {
        self.pages * PAGE as u64 + self.xattr_bytes
    }

    /// What the inode `i` occupies.
    pub fn of(i: &Inode) -> Usage {
        Usage {
            pages: match &i.body {
                Body::File(d) => d.pages(),
                _ => 0,
            },
            xattr_bytes: xattr_bytes(&i.xattrs),
        }
    }
}

/// Bytes of a file's extended attributes (names and values).
pub fn xattr_bytes(x: &BTreeMap<OsString, Vec<u8>>) -> u64 {
    x.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
}

impl Namespace {
    /// A namespace holding only the root directory.
    pub fn new(root_perm: u16, uid: u32, gid: u32, now: SystemTime) -> Namespace {
        let root = Inode {
            ino: Ino::ROOT,
            kind: Kind::Dir,
            perm: root_perm,
            nlink: 2,
            uid,
            gid,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            // The kernel holds the root without ever looking it up.
            lookups: 1,
            opens: 0,
            version: 1,
            xattrs: BTreeMap::new(),
            body: Body::Dir(Box::new(Dir::new(Ino::ROOT))),
        };
        let mut inodes = InoMap::default();
        inodes.insert(Ino::ROOT, Box::new(root));
        Namespace {
            inodes,
            next_ino: 2,
            track: false,
            dirty: InoSet::default(),
            fresh: InoSet::default(),
            freed: InoSet::default(),
            hints: InoMap::default(),
            usage: Usage::default(),
            churn: PageChurn::default(),
            held: 0,
            removed: InoSet::default(),
            power: None,
        }
    }

    /// A namespace rebuilt from recovered inodes: link counts and directory
    /// parents are recomputed from the entries, and inodes no name reaches
    /// (files that were unlinked while open) are dropped. `dirs` says which
    /// inodes are directories (recovery notes them as it decodes), so the
    /// walk reads no inode it does not change: reading each entry's inode
    /// would be a cache miss apiece at a million.
    /// `fresh` supplies the root when nothing was recovered.
    pub fn restore(mut inodes: InoMap<Box<Inode>>, dirs: &InoSet, next_ino: u64, mut fresh: Namespace) -> Namespace {
        if !inodes.contains_key(&Ino::ROOT) {
            if let Some(root) = fresh.inodes.remove(&Ino::ROOT) {
                inodes.insert(Ino::ROOT, root);
            }
        }
        let n = inodes.len();
        let mut stack = vec![Ino::ROOT];
        // Link counts of files named more than once (most have one name).
        let mut links: InoMap<u32> = InoMap::default();
        let mut parents: InoMap<(Ino, u32)> = InoMap::default();
        // Every inode reached from the root but the root has a hint: the
        // walk needs no set of its own (at a million inodes each pass over
        // a table of them is a cache miss per inode).
        let mut hints: InoMap<(Ino, OsString)> = InoMap::with_capacity_and_hasher(n, Default::default());
        // Entries naming an inode that is not there.
        let mut dead = Vec::new();
        while let Some(dir) = stack.pop() {
            let Some(Body::Dir(d)) = inodes.get(&dir).map(|i| &i.body) else {
                continue;
            };
            let mut subdirs = 0;
            for (name, child) in d.iter() {
                let kind =
                    inodes.contains_key(&child).then(|| if dirs.contains(&child) { Kind::Dir } else { Kind::File });
                match kind {
                    Some(Kind::Dir) if child != Ino::ROOT && !hints.contains_key(&child) => {
                        subdirs += 1;
                        parents.insert(child, (dir, 0));
                        hints.insert(child, (dir, name.clone()));
                        stack.push(child);
                    }
                    Some(Kind::Dir) => {}
                    Some(_) => {
                        if hints.insert(child, (dir, name.clone())).is_some() {
                            *links.entry(child).or_insert(1) += 1;
                        }
                    }
                    None => dead.push((dir, name.clone())),
                }
            }
            parents.entry(dir).or_insert((dir, 0)).1 = subdirs;
        }
        // Inodes no name leads to (only hinted ones were reached).
        if hints.len() + 1 < inodes.len() {
            inodes.retain(|ino, _| *ino == Ino::ROOT || hints.contains_key(ino));
        }
        for (dir, name) in dead {
            if let Some(Body::Dir(d)) = inodes.get_mut(&dir).map(|i| &mut i.body) {
                d.remove(&name);
            }
        }
        let mut usage = Usage::default();
        let mut highest = 1;
        for i in inodes.values_mut() {
            match &mut i.body {
                Body::Dir(d) => {
                    let (parent, subdirs) = parents.get(&i.ino).copied().unwrap_or((i.ino, 0));
                    d.parent = if i.ino == Ino::ROOT { Ino::ROOT } else { parent };
                    i.nlink = 2 + subdirs;
                }
                _ => i.nlink = links.get(&i.ino).copied().unwrap_or(1),
            }
            i.lookups = u64::from(i.ino == Ino::ROOT);
            i.opens = 0;
            highest = highest.max(i.ino.0);
            let u = Usage::of(i);
            usage.pages += u.pages;
            usage.xattr_bytes += u.xattr_bytes;
        }
        Namespace {
            inodes,
            next_ino: next_ino.max(highest + 1),
            track: false,
            dirty: InoSet::default(),
            fresh: InoSet::default(),
            freed: InoSet::default(),
            hints,
            usage,
            churn: PageChurn::default(),
            held: 0,
            removed: InoSet::default(),
            power: None,
        }
    }

    /// Note that `name` in `parent` now leads to `ino`.
    pub fn hint(&mut self, ino: Ino, parent: Ino, name: &OsStr) {
        if self.inodes.contains_key(&ino) {
            self.hints.insert(ino, (parent, name.to_os_string()));
        }
    }

    /// The path (relative to the root) of a non-directory, when the name it
    /// was last given still leads to it.
    pub fn path_hint(&self, ino: Ino) -> Option<std::path::PathBuf> {
        let (parent, name) = self.entry_of(ino)?;
        let mut p: std::path::PathBuf = self.dir_path(parent)?.into_iter().collect();
        p.push(name);
        Some(p)
    }

    /// Start tracking changes for the durable store.
    pub fn set_tracking(&mut self) {
        self.track = true;
        for i in self.inodes.values_mut() {
            i.start_tracking();
        }
    }

    /// Inodes changed since the last flush, and inodes dropped.
    pub fn dirty(&self) -> (&InoSet, &InoSet) {
        (&self.dirty, &self.freed)
    }

    /// Mark an inode changed (for settings kept outside the inode).
    pub fn mark_dirty(&mut self, ino: Ino) {
        if self.track && self.inodes.contains_key(&ino) {
            self.dirty.insert(ino);
        }
    }

    /// Forget what was flushed.
    pub fn clear_dirty(&mut self) {
        for ino in std::mem::take(&mut self.dirty) {
            if let Some(i) = self.inodes.get_mut(&ino) {
                i.start_tracking();
            }
        }
        self.freed.clear();
        self.fresh.clear();
    }

    /// The next inode number to hand out.
    pub fn next_ino(&self) -> u64 {
        self.next_ino
    }

    /// Every inode (for snapshots).
    pub fn inodes(&self) -> impl Iterator<Item = &Inode> {
        self.inodes.values().map(|i| &**i)
    }

    /// Removed inodes (no name) that no handle has open: only the kernel's
    /// memory of them keeps them, until its FORGET. That may reach the
    /// daemon after later requests (the kernel sends forgets in batches
    /// between other requests, and over io_uring on `/dev/fuse`, apart
    /// from the queues), so the limits do not count them.
    pub fn forgettable(&self) -> impl Iterator<Item = &Inode> {
        self.removed
            .iter()
            .filter_map(|ino| self.inodes.get(ino))
            .map(|i| &**i)
            .filter(|i| i.nlink == 0 && i.opens == 0 && i.ino != Ino::ROOT)
    }

    /// The inode, or `ENOENT`.
    pub fn get(&self, ino: Ino) -> Result<&Inode> {
        self.inodes.get(&ino).map(|i| &**i).ok_or(Error::NotFound)
    }

    /// The inode, or `ENOENT`.
    pub fn get_mut(&mut self, ino: Ino) -> Result<&mut Inode> {
        if self.track && self.inodes.contains_key(&ino) {
            self.dirty.insert(ino);
        }
        let i = self.inodes.get_mut(&ino).map(|i| &mut **i).ok_or(Error::NotFound)?;
        if let Some(p) = &mut self.power {
            p.touch(i);
        }
        Ok(i)
    }

    /// True (once) when at least `pages` content pages were freed since the
    /// last time this said so.
    pub fn freed_at_least(&mut self, pages: u64) -> bool {
        use std::sync::atomic::Ordering;
        if FREED_PAGES.load(Ordering::Relaxed) < pages {
            return false;
        }
        FREED_PAGES.store(0, Ordering::Relaxed);
        true
    }

    /// Number of inodes in the table.
    pub fn len(&self) -> usize {
        self.inodes.len()
    }

    /// True when only impossible: the root is always there.
    pub fn is_empty(&self) -> bool {
        self.inodes.is_empty()
    }

    /// Space the contents and extended attributes occupy now.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Content pages added and removed since start.
    pub fn churn(&self) -> PageChurn {
        self.churn
    }

    /// Run `change` on the inode `ino` and account for the space it takes
    /// or frees (every change of contents or extended attributes goes
    /// through here, so [`Namespace::usage`] stays exact).
    pub fn account<T>(&mut self, ino: Ino, change: impl FnOnce(&mut Inode) -> Result<T>) -> Result<T> {
        let i = self.get_mut(ino)?;
        let before = Usage::of(i);
        let out = change(i);
        let after = Usage::of(i);
        self.churn.added += after.pages.saturating_sub(before.pages);
        self.churn.removed += before.pages.saturating_sub(after.pages);
        self.usage.pages = (self.usage.pages + after.pages).saturating_sub(before.pages);
        self.usage.xattr_bytes = (self.usage.xattr_bytes + after.xattr_bytes).saturating_sub(before.xattr_bytes);
        out
    }

    /// Total stored pages over all files, counted afresh (checks
    /// [`Namespace::usage`]; a walk over every inode, so never on the
    /// request path).
    #[cfg(test)]
    pub fn pages(&self) -> u64 {
        self.inodes
            .values()
            .map(|i| match &i.body {
                Body::File(d) => d.pages(),
                _ => 0,
            })
            .sum()
    }

    /// The inode a name in `parent` points at.
    pub fn child(&self, parent: Ino, name: &OsStr) -> Result<Ino> {
        check_name(name)?;
        self.get(parent)?.dir()?.get(name).ok_or(Error::NotFound)
    }

    /// Create an inode (without a name yet; nlink starts at 0).
    pub fn alloc(&mut self, new: NewInode, parent: Ino, now: SystemTime) -> Ino {
        let ino = Ino(self.next_ino);
        self.next_ino += 1;
        let body = match new.kind {
            Kind::File => Body::File(Data::default()),
            Kind::Dir => Body::Dir(Box::new(Dir::new(parent))),
            Kind::Symlink => Body::Symlink(new.symlink.unwrap_or_default()),
            Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev => Body::Special,
        };
        let inode = Inode {
            ino,
            kind: new.kind,
            perm: new.perm,
            nlink: 0,
            uid: new.uid,
            gid: new.gid,
            rdev: new.rdev,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            lookups: 0,
            opens: 0,
            version: 1,
            xattrs: BTreeMap::new(),
            body,
        };
        self.inodes.insert(ino, Box::new(inode));
        if let (Some(p), Some(i)) = (&mut self.power, self.inodes.get_mut(&ino)) {
            // Synced as created: empty, with the attributes it was made with.
            p.touch(i);
        }
        if self.track {
            self.dirty.insert(ino);
            self.fresh.insert(ino);
            self.inodes.get_mut(&ino).expect("just inserted").start_tracking();
        }
        ino
    }

    /// Link `ino` into `parent` under `name` (which must be free); keeps the
    /// nlink counts of the inode and, for directories, of the parent.
    pub fn link(&mut self, parent: Ino, name: &OsStr, ino: Ino) -> Result<()> {
        let is_dir = self.get(ino)?.kind == Kind::Dir;
        let p = self.get_mut(parent)?;
        p.dir_mut()?.insert(name.to_os_string(), ino);
        if is_dir {
            p.nlink += 1;
        }
        self.removed.remove(&ino);
        let i = self.get_mut(ino)?;
        if is_dir {
            i.nlink = 2;
            if let Body::Dir(d) = &mut i.body {
                d.parent = parent;
            }
        } else {
            i.nlink += 1;
        }
        self.hints.insert(ino, (parent, name.to_os_string()));
        Ok(())
    }

    /// Remove `name` from `parent`; the inode loses a link and is dropped when
    /// nothing refers to it any more.
    pub fn unlink(&mut self, parent: Ino, name: &OsStr) -> Result<Ino> {
        let p = self.get_mut(parent)?;
        let ino = p.dir_mut()?.remove(name).ok_or(Error::NotFound)?;
        let is_dir = self.get(ino)?.kind == Kind::Dir;
        if is_dir {
            self.get_mut(parent)?.nlink -= 1;
        }
        let i = self.get_mut(ino)?;
        i.nlink = if is_dir { 0 } else { i.nlink.saturating_sub(1) };
        self.maybe_drop(ino);
        Ok(ino)
    }

    /// Add a kernel lookup; true when it is the kernel's first reference
    /// to a non-directory.
    pub fn add_lookup(&mut self, ino: Ino) -> bool {
        let Some(i) = self.inodes.get_mut(&ino) else {
            return false;
        };
        i.lookups += 1;
        let first = i.lookups == 1 && i.kind != Kind::Dir;
        self.held += usize::from(first);
        first
    }

    /// Non-directories the kernel holds a reference to.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The name an inode was last given, when it still leads to it.
    pub fn entry_of(&self, ino: Ino) -> Option<(Ino, &OsStr)> {
        let (parent, name) = self.hints.get(&ino)?;
        (self.get(*parent).ok()?.dir().ok()?.get(name) == Some(ino)).then_some((*parent, name.as_os_str()))
    }

    /// FORGET: lower the lookup count and drop an unreachable inode.
    pub fn forget(&mut self, ino: Ino, n: u64) {
        if ino == Ino::ROOT {
            return;
        }
        if let Some(i) = self.inodes.get_mut(&ino) {
            let before = i.lookups;
            i.lookups = i.lookups.saturating_sub(n);
            if before > 0 && i.lookups == 0 && i.kind != Kind::Dir {
                self.held -= 1;
            }
        }
        self.maybe_drop(ino);
    }

    /// Drop the inode when it has no name, no kernel reference and no handle.
    pub fn maybe_drop(&mut self, ino: Ino) {
        if ino == Ino::ROOT {
            return;
        }
        if let Some(i) = self.inodes.get(&ino) {
            if i.nlink == 0 && (i.lookups > 0 || i.opens > 0) {
                self.removed.insert(ino);
            }
            if i.nlink == 0 && i.lookups == 0 && i.opens == 0 {
                self.removed.remove(&ino);
                if let Body::File(d) = &i.body {
                    freed(d.pages.len());
                }
                let gone = Usage::of(i);
                self.churn.removed += gone.pages;
                self.usage.pages -= gone.pages.min(self.usage.pages);
                self.usage.xattr_bytes -= gone.xattr_bytes.min(self.usage.xattr_bytes);
                let gone = self.inodes.remove(&ino);
                self.hints.remove(&ino);
                if let (Some(p), Some(g)) = (&mut self.power, gone) {
                    if p.bury(g) {
                        self.power_gc();
                    }
                }
                if self.track {
                    self.dirty.remove(&ino);
                    if !self.fresh.remove(&ino) {
                        self.freed.insert(ino);
                    }
                }
            }
        }
    }

    /// True when `ancestor` is `ino` or one of its parents.
    pub fn is_ancestor(&self, ancestor: Ino, mut ino: Ino) -> bool {
        loop {
            if ino == ancestor {
                return true;
            }
            let Ok(parent) = self.get(ino).and_then(|i| i.dir().map(|d| d.parent)) else {
                return false;
            };
            if parent == ino {
                return false;
            }
            ino = parent;
        }
    }

    /// The path of a directory from the root (used to name leases).
    pub fn dir_path(&self, mut dir: Ino) -> Option<Vec<OsString>> {
        let mut parts = Vec::new();
        while dir != Ino::ROOT {
            let d = self.get(dir).ok()?;
            if d.nlink == 0 {
                return None;
            }
            let parent = d.dir().ok()?.parent;
            // The hint, checked; a walk of the parent's entries (a
            // million in a large directory) only when it is stale.
            let name = match self.entry_of(dir) {
                Some((p, name)) if p == parent => name.to_os_string(),
                _ => self.get(parent).ok()?.dir().ok()?.iter().find(|(_, i)| *i == dir)?.0.clone(),
            };
            parts.push(name);
            dir = parent;
        }
        parts.reverse();
        Some(parts)
    }
}

/// Reject names the kernel should never send and names over 255 bytes.
pub fn check_name(name: &OsStr) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if b.is_empty() || b.contains(&b'/') || b.contains(&0) {
        return Err(Error::Invalid);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
