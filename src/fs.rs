//! Filesystem operations over the namespace, callable without the kernel.
//!
//! Every method takes the caller's identity and returns `Result<_, Error>`;
//! the FUSE adapter only decodes requests and encodes replies. Permission
//! checks are the kernel's (`default_permissions`); this layer enforces what
//! the kernel cannot know: names, emptiness, types, ownership inheritance.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::control::{self, ControlFile, Metrics};
use crate::error::{Error, Result};
use crate::lease::{Effect, Epoch, Lock, Locks, Outcome, Owner, Request, WaitId};
use crate::namespace::{check_name, Attr, Body, Ino, Kind, Namespace, NewInode, PAGE};
use crate::observe::{Observations, Proc, Verdict};
use tracing::debug;

/// How many earlier targets of a name are remembered per inode.
const MAX_PREDECESSORS: usize = 16;
/// How many removed names remember their last target.
const MAX_REMOVED_NAMES: usize = 16_384;
/// How many removed or replaced paths remember their exact epoch; past
/// that they are folded into the mount-wide floor for new paths.
const MAX_PATH_EPOCHS: usize = 16_384;
/// Observations recorded between sweeps for exited processes.
const SWEEP_EVERY: u64 = 4096;

/// A small `/proc` file, read with one buffer large enough for all of it
/// (`read_to_string` would start small and grow, one `read` per doubling).
fn read_proc(path: &str) -> Option<String> {
    use std::io::Read;
    let mut text = String::with_capacity(4096);
    std::fs::File::open(path).ok()?.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The parent of a process, from `/proc`.
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = read_proc(&format!("/proc/{pid}/stat"))?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Resolve a request's thread id to the process identity (thread-group id
/// and start time) from `/proc`.
pub fn proc_of_tid(tid: u32) -> Option<Proc> {
    let status = read_proc(&format!("/proc/{tid}/status"))?;
    let tgid: u32 = status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()?;
    let stat = read_proc(&format!("/proc/{tgid}/stat"))?;
    let start = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    Some(Proc { tgid, start })
}

/// Prefix of the extended attributes leasefs computes itself.
pub const XATTR_PREFIX: &str = "user.leasefs.";
/// The lease's epoch (fencing token), decimal text, read-only.
pub const XATTR_EPOCH: &str = "user.leasefs.epoch";
/// The lease version (SPEC 6), decimal text, read-only.
pub const XATTR_VERSION: &str = "user.leasefs.version";
/// The holders, JSON, read-only.
pub const XATTR_HOLDER: &str = "user.leasefs.holder";
/// The file's own TTL (`500ms`, `30s`, `2m`, plain seconds; `0`/`off` removes it).
pub const XATTR_TTL: &str = "user.leasefs.ttl";
/// Setting it renews the caller's hold on the lease.
pub const XATTR_RENEW: &str = "user.leasefs.renew";
/// The mount-relative path of the lease that fences writes to this file.
pub const XATTR_GUARD: &str = "user.leasefs.guard";

/// Parse a TTL: `500ms`, `30s`, `2m`, `1h`, or plain (possibly fractional)
/// seconds; `0` and `off` mean none. Anything else is `EINVAL`.
pub fn parse_ttl(v: &str) -> Result<Option<u64>> {
    let v = v.trim();
    if v == "off" || v == "0" {
        return Ok(None);
    }
    let (num, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60_000.0)
    } else if let Some(n) = v.strip_suffix('h') {
        (n, 3_600_000.0)
    } else {
        (v, 1000.0)
    };
    let n: f64 = num.parse().map_err(|_| Error::Invalid)?;
    if !n.is_finite() || n < 0.0 || n * scale > 1e15 {
        return Err(Error::Invalid);
    }
    let ms = (n * scale).round() as u64;
    Ok(if ms == 0 { None } else { Some(ms) })
}

/// Format a TTL the way `parse_ttl` reads it.
pub fn format_ttl(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Who is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Process (thread) id from the request header.
    pub pid: u32,
}

impl Caller {
    /// The superuser, for tests and internal calls.
    pub const ROOT: Caller = Caller { uid: 0, gid: 0, pid: 0 };
}

/// An open file handle number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(pub u64);

/// A time given to `setattr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The changes of a `setattr` call; `None` leaves a field alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
    pub handle: Option<Handle>,
}

/// One directory entry as returned by `readdir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// Cookie to resume after this entry.
    pub cookie: u64,
    pub ino: Ino,
    pub kind: Kind,
    pub name: OsString,
}

/// `statfs` answer.
#[derive(Debug, Clone, Copy)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

/// How one `write` request arrived.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteOpts {
    /// The thread that wrote (request header).
    pub tid: u32,
    /// `O_APPEND` as of this write: `fcntl(F_SETFL)` may have set or
    /// cleared it since open, so the flags stored at open do not decide.
    pub append: bool,
    /// The kernel leaves clearing suid/sgid to the filesystem
    /// (`FUSE_WRITE_KILL_SUIDGID`: a writer without `CAP_FSETID`).
    pub kill_suidgid: bool,
    /// The writer's group (request header), for the sgid rule.
    pub gid: u32,
    /// Writeback of cached pages (a shared mapping), sent by the kernel on
    /// behalf of whoever opened the handle.
    pub writeback: bool,
}

/// The bits an unprivileged write leaves, as the kernel decides them
/// (`file_remove_privs`): suid always goes; sgid goes when it means
/// set-group-ID (group-executable) or the writer is not in the file's group.
pub fn kill_suidgid(perm: u16, writer_in_group: bool) -> u16 {
    let mut p = perm & !(libc::S_ISUID as u16);
    if p & libc::S_ISGID as u16 != 0 && (p & libc::S_IXGRP as u16 != 0 || !writer_in_group) {
        p &= !(libc::S_ISGID as u16);
    }
    p
}

/// What an unprivileged caller's truncate or `fallocate` leaves of the
/// mode. The kernel sends the mode change itself for suid and for
/// group-executable sgid, but not for the newer rule (sgid without
/// group-execute goes when the caller is not in the file's group), so the
/// daemon applies the whole rule. Root stands for `CAP_FSETID`.
fn after_unprivileged_change(perm: u16, file_gid: u32, caller: Caller) -> u16 {
    if caller.uid == 0 || perm & (libc::S_ISUID | libc::S_ISGID) as u16 == 0 {
        return perm;
    }
    kill_suidgid(perm, in_group(caller.pid, caller.gid, file_gid))
}

/// True when thread `tid` (with primary group `gid`) is a member of group
/// `file_gid`, supplementary groups included (from `/proc`).
fn in_group(tid: u32, gid: u32, file_gid: u32) -> bool {
    if gid == file_gid {
        return true;
    }
    let Some(status) = read_proc(&format!("/proc/{tid}/status")) else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(file_gid)))
}

/// Rename flags (`renameat2`).
pub const RENAME_NOREPLACE: u32 = 1;
/// Rename flags (`renameat2`).
pub const RENAME_EXCHANGE: u32 = 2;

const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;
const XATTR_SIZE_MAX: usize = 65_536;
const TOTAL_BLOCKS: u64 = 1 << 28;
const TOTAL_FILES: u64 = 1 << 32;

#[derive(Debug)]
struct OpenFile {
    ino: Ino,
    /// The process that opened it: writes the kernel sends on its behalf
    /// later (writeback of a shared mapping) are that process's own.
    opener: Option<Proc>,
    /// For a guarded file opened for writing: the lease, the epoch it had
    /// at open, and the process that held it.
    guard: Option<(Ino, Epoch, u32)>,
    /// A control file's content, rendered at open.
    control: Option<Vec<u8>>,
}

#[derive(Debug)]
struct State {
    ns: Namespace,
    handles: HashMap<Handle, OpenFile>,
    next_handle: u64,
    locks: Locks,
    /// Live leases whose name was unlinked, by path: re-creating the path
    /// re-attaches the same inode (SPEC 4).
    detached: HashMap<PathBuf, Ino>,
    /// The highest epoch each removed or replaced path carried, so a
    /// re-created or re-targeted path never goes back (SPEC 5). Bounded:
    /// forgotten paths resume above `new_path_floor`.
    path_epochs: HashMap<PathBuf, Epoch>,
    /// Where every path without a remembered epoch starts: at or above the
    /// epoch of every path that was forgotten, and after a restart the
    /// recovered ceiling (SPEC 5: state bounded by what is live).
    new_path_floor: Epoch,
    /// Inodes whose cached pages the kernel must drop (content replaced
    /// behind open descriptors).
    invalidate: Vec<Ino>,
    /// What each process last observed of each file (SPEC 6).
    obs: Observations,
    /// Inodes a name pointed at before it pointed at this one.
    predecessors: HashMap<Ino, Vec<Ino>>,
    /// Open `O_TMPFILE` files that were never linked: `link()` may give
    /// them their first name (the kernel allows it unless `O_EXCL`).
    tmpfiles: std::collections::HashSet<Ino>,
    /// The version at which a name was last re-pointed at the same inode
    /// (rename over a live lease, re-attach after unlink): observations
    /// older than it are stale for `unlink` (SPEC 6).
    repointed: HashMap<Ino, u64>,
    /// The last inode each removed name pointed at.
    removed: HashMap<PathBuf, Ino>,
    /// Thread id → process identity cache.
    tids: HashMap<u32, Proc>,
    recorded: u64,
    resolve: fn(u32) -> Option<Proc>,
    /// Guarded files and the mount-relative path of their lease.
    guards: HashMap<Ino, PathBuf>,
    /// The clock leases run on.
    start: std::time::Instant,
    metrics: Metrics,
    /// When each parked lock request started waiting (lease clock, ms).
    parked_at: HashMap<WaitId, u64>,
    /// Mount point and daemon pid, for `.leasefs/status`.
    mount_point: PathBuf,
    /// Durable epoch reservations (none: epochs live in memory only).
    journal: Option<crate::store::EpochJournal>,
    /// The durable namespace (none: contents live in memory only).
    store: Option<crate::persist::Store>,
    /// `--volatile`: the namespace is deliberately not kept.
    volatile: bool,
}

impl State {
    /// The process behind a request's thread id, cached; `fresh` re-reads it
    /// (before a compare-and-swap check, so a reused pid is never trusted).
    fn proc(&mut self, tid: u32, fresh: bool) -> Option<Proc> {
        if tid == 0 {
            return None;
        }
        if !fresh {
            if let Some(p) = self.tids.get(&tid) {
                return Some(*p);
            }
        }
        let p = (self.resolve)(tid)?;
        if self.tids.len() > 8192 {
            self.tids.clear();
        }
        self.tids.insert(tid, p);
        Some(p)
    }

    /// `tid` observed the regular file `ino` at its current version.
    fn observe(&mut self, tid: u32, ino: Ino) {
        let Some(p) = self.proc(tid, false) else { return };
        self.observe_as(p, ino);
    }

    /// The process `p` observed the regular file `ino` at its current version.
    fn observe_as(&mut self, p: Proc, ino: Ino) {
        let Ok(i) = self.ns.get(ino) else { return };
        if i.kind != Kind::File {
            return;
        }
        let version = i.version;
        self.obs.record(p, ino, version);
        self.recorded += 1;
        if self.recorded.is_multiple_of(SWEEP_EVERY) {
            let resolve = self.resolve;
            self.obs.forget_dead(|p| resolve(p.tgid).is_some_and(|q| q == *p));
            self.tids.clear();
        }
    }

    /// Refuse with `ESTALE` when `tid` acts on an older view of the file at
    /// `ino` (SPEC 6). For a rename over (`content_counts`) any change of
    /// content or of what the name points at makes the view stale; for an
    /// unlink only the name being re-pointed does (a parent removing a file
    /// its child rewrote is ordinary cleanup).
    fn check_current(&mut self, tid: u32, ino: Ino, content_counts: bool, what: &str) -> Result<()> {
        let Ok(i) = self.ns.get(ino) else { return Ok(()) };
        if i.kind != Kind::File {
            return Ok(());
        }
        let current = i.version;
        let Some(p) = self.proc(tid, true) else { return Ok(()) };
        let preds: Vec<(Ino, u64)> =
            self.predecessors.get(&ino).map(|v| v.iter().map(|i| (*i, 0)).collect()).unwrap_or_default();
        let verdict = if content_counts {
            self.obs.check(p, ino, current, &preds)
        } else {
            let repointed_at = self.repointed.get(&ino).copied().unwrap_or(0);
            self.obs.check_name(p, ino, repointed_at, &preds)
        };
        match verdict {
            Verdict::Current | Verdict::Unobserved => Ok(()),
            Verdict::Stale { seen, current } => {
                debug!(path = %self.path_for_log(ino), pid = p.tgid, ino = ino.0, seen, current, epoch = self.locks.epoch(ino).0, op = what, "compare-and-swap rejected: stale view");
                self.metrics.cas_rejections += 1;
                Err(Error::Stale)
            }
        }
    }

    /// The name leading to `ino` was re-pointed at it again (same inode):
    /// earlier observers of the name hold a stale view.
    fn repoint(&mut self, ino: Ino) {
        if let Ok(i) = self.ns.get(ino) {
            self.repointed.insert(ino, i.version);
        }
    }

    /// The name now pointing at `new` pointed at `old` before.
    fn succeed(&mut self, old: Ino, new: Ino) {
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

    /// A file's path for debug logs (computed only when debug logging is on).
    fn path_for_log(&self, ino: Ino) -> String {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return String::new();
        }
        if let Some(p) = self.ns.path_hint(ino) {
            return format!("/{}", p.display());
        }
        let wanted = std::iter::once(ino).collect();
        Fs::paths_of(self, &wanted).get(&ino).map(|p| format!("/{}", p.display())).unwrap_or_default()
    }

    /// Make the next epoch of `ino` durable before any operation can hand it
    /// out (SPEC 5): the journal's mount-wide ceiling must cover it. Costs a
    /// journal sync only when the ceiling is used up, never per new path.
    fn reserve(&mut self, ino: Ino) -> Result<()> {
        let Some(j) = self.journal.as_mut() else { return Ok(()) };
        let need = self.locks.epoch(ino).0 + 1;
        let ceiling = j.ceiling();
        if need <= ceiling {
            if ceiling - need < crate::store::RESERVE_AHEAD / 2 {
                // Running low: raise it in the background, off this path.
                j.reserve_ahead(ceiling + 1);
            }
            return Ok(());
        }
        match j.ensure(need) {
            Ok(_) => Ok(()),
            Err(e) => Err(if e.raw_os_error() == Some(libc::ENOSPC) { Error::NoSpace } else { Error::Io }),
        }
    }

    /// Lease settings of `ino` for the durable store.
    fn extra(&self, ino: Ino) -> crate::persist::Extra {
        crate::persist::Extra {
            ttl_ms: self.locks.lease(ino).and_then(|l| l.ttl()),
            guard: self.guards.get(&ino).cloned(),
        }
    }

    /// Write what changed since the last flush to the journal and sync it.
    fn flush(&mut self) -> Result<()> {
        match self.append_changes()? {
            Some(sync) => sync().map_err(|e| {
                tracing::error!("journal sync failed: {e}; durability is no longer promised (fail-stop)");
                if let Some(s) = &self.store {
                    s.fail_flag().store(true, std::sync::atomic::Ordering::Release);
                }
                Error::Io
            }),
            None => Ok(()),
        }
    }

    /// Append what changed since the last flush to the journal; the
    /// returned sync makes it durable (none: nothing to write). Folds the
    /// journal into a snapshot when it has grown (the snapshot is durable
    /// when this returns).
    fn append_changes(&mut self) -> Result<Option<crate::storage::Syncer>> {
        let Some(store) = self.store.as_ref() else { return Ok(None) };
        if store.failed() {
            return Err(Error::Io);
        }
        let (dirty, freed) = self.ns.dirty();
        if dirty.is_empty() && freed.is_empty() {
            return Ok(None);
        }
        let batch = crate::persist::encode_changes(&self.ns, |ino| self.extra(ino));
        let store = self.store.as_mut().expect("checked above");
        let sync = match store.append(&batch) {
            Ok(sync) => sync,
            Err(e) => return Err(if e.raw_os_error() == Some(libc::ENOSPC) { Error::NoSpace } else { Error::Io }),
        };
        self.ns.clear_dirty();
        let ns = &self.ns;
        let large = batch.len() > 4 << 20;
        if store.wants_snapshot_for(|| ns.pages() * PAGE as u64 + ns.len() as u64 * 128) {
            let img = crate::persist::encode_all(&self.ns, |ino| self.extra(ino));
            // Failures are logged by the store; a full disk postpones it.
            let _ = self.store.as_mut().expect("checked above").snapshot(&img);
        }
        if large {
            // The batch (and snapshot) buffers were as large as the data.
            drop(batch);
            give_memory_back();
        }
        Ok(Some(sync))
    }

    /// Count what the lease core decided (grants, waits, breaks).
    fn account(&mut self, effects: &[Effect]) {
        let now = self.start.elapsed().as_millis() as u64;
        for e in effects {
            match e {
                Effect::Grant(id) => {
                    self.metrics.acquisitions += 1;
                    if let Some(t) = self.parked_at.remove(id) {
                        self.metrics.waited(now.saturating_sub(t) as f64 / 1000.0);
                    }
                }
                Effect::Refuse(id, _) => {
                    self.parked_at.remove(id);
                }
                Effect::Broken(..) => self.metrics.breaks += 1,
                Effect::Epoch(..) => {}
            }
        }
    }

    /// Milliseconds on the lease clock; also advances the lease table's clock.
    fn clock(&mut self) -> u64 {
        let now = self.start.elapsed().as_millis() as u64;
        self.locks.advance(now);
        now
    }

    /// The calling process and its ancestors: a holder's shell running
    /// `touch`, `setfattr` or `echo >> file` acts for the holder.
    fn lineage(&mut self, tid: u32) -> Vec<u32> {
        let Some(p) = self.proc(tid, false) else { return Vec::new() };
        let mut out = vec![p.tgid];
        let mut pid = p.tgid;
        for _ in 0..32 {
            let Some(ppid) = parent_pid(pid) else { break };
            if ppid <= 1 {
                break;
            }
            out.push(ppid);
            pid = ppid;
        }
        out
    }

    /// Refuse with `ESTALE` when the process was fenced off this lease.
    fn check_fenced_pid(&mut self, tid: u32, ino: Ino, what: &str) -> Result<()> {
        if !self.locks.has_fenced(ino) {
            return Ok(());
        }
        let pids = self.lineage(tid);
        if let Some(f) = self.locks.fenced_pid(ino, &pids) {
            debug!(path = %self.path_for_log(ino), pid = f.pid, ino = ino.0, held = f.epoch.0, current = self.locks.epoch(ino).0, op = what, "fenced");
            self.metrics.fenced_operations += 1;
            return Err(Error::Stale);
        }
        Ok(())
    }

    /// The inode at a mount-relative path.
    fn resolve_path(&self, path: &std::path::Path) -> Option<Ino> {
        let mut ino = Ino::ROOT;
        for c in path.components() {
            match c {
                std::path::Component::Normal(n) => ino = self.ns.child(ino, n).ok()?,
                std::path::Component::CurDir => {}
                _ => return None,
            }
        }
        Some(ino)
    }

    fn path_of(&self, parent: Ino, name: &OsStr) -> Option<PathBuf> {
        let mut p: PathBuf = self.ns.dir_path(parent)?.into_iter().collect();
        p.push(name);
        Some(p)
    }

    /// Remember the epoch a path carried.
    fn remember_epoch(&mut self, path: Option<PathBuf>, ino: Ino) {
        let e = self.locks.epoch(ino);
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
    fn path_floor(&self, path: Option<&PathBuf>) -> Epoch {
        let known = path.and_then(|p| self.path_epochs.get(p)).copied().unwrap_or_default();
        known.max(self.new_path_floor)
    }

    /// Never let an inode named by `path` carry a lower epoch than the path did.
    fn floor_epoch(&mut self, path: Option<&PathBuf>, ino: Ino) {
        let floor = self.path_floor(path);
        if floor.0 > 0 {
            self.locks.raise_epoch(ino, floor);
        }
    }

    /// Drop lease state of inodes that are gone, and detached names whose
    /// lease is no longer live; hand memory of removed contents back to the
    /// system once a few MiB were freed (the allocator keeps freed pages
    /// otherwise, and the daemon's RSS would stay at its high-water mark).
    fn collect(&mut self, ino: Ino) {
        if self.ns.freed_at_least(1024) {
            give_memory_back();
        }
        if self.ns.get(ino).is_err() {
            self.locks.forget(ino);
            self.predecessors.remove(&ino);
            self.repointed.remove(&ino);
            self.tmpfiles.remove(&ino);
        }
        let (ns, locks) = (&self.ns, &self.locks);
        self.detached.retain(|_, i| locks.is_live(*i) && ns.get(*i).is_ok());
    }

    /// True when `ino` or anything below it is a live lease.
    fn holds_live_lease(&self, ino: Ino) -> bool {
        if self.locks.is_live(ino) {
            return true;
        }
        match self.ns.get(ino).map(|i| &i.body) {
            Ok(Body::Dir(d)) => d.iter().any(|(_, c)| self.holds_live_lease(c)),
            _ => false,
        }
    }
}

/// The filesystem core.
#[derive(Debug)]
pub struct Fs {
    state: Mutex<State>,
    /// Journal syncs in flight, answered off the request path.
    group: crate::group::GroupCommit,
}

fn now() -> SystemTime {
    SystemTime::now()
}

fn resolve(t: SetTime, now: SystemTime) -> SystemTime {
    match t {
        SetTime::Now => now,
        SetTime::At(t) => t,
    }
}

impl Fs {
    /// A filesystem with an empty root owned by `uid:gid` (mode 0755).
    /// A filesystem whose leases carry `ttl_ms` unless a file sets its own.
    pub fn with_lease_ttl(uid: u32, gid: u32, ttl_ms: Option<u64>) -> Fs {
        let fs = Fs::new(uid, gid);
        fs.state.lock().locks = Locks::with_default_ttl(ttl_ms);
        fs
    }

    /// Run lease timers: break leases whose TTL ran out while someone
    /// waits. Returns what to answer and when to call again.
    pub fn tick(&self) -> (Vec<Effect>, Option<std::time::Duration>) {
        let mut st = self.state.lock();
        let now = st.start.elapsed().as_millis() as u64;
        let waited: Vec<Ino> = st.locks.leases().into_iter().filter(|(_, l)| l.waiters() > 0).map(|(i, _)| i).collect();
        for ino in waited {
            if let Err(e) = st.reserve(ino) {
                tracing::error!(ino = ino.0, "cannot make the next epoch durable ({e}); expired leases stay with their holders");
                return (Vec::new(), Some(std::time::Duration::from_millis(100)));
            }
        }
        let effects = st.locks.tick(now);
        st.account(&effects);
        let next = st.locks.next_deadline().map(|d| std::time::Duration::from_millis(d.saturating_sub(now)));
        (effects, next)
    }

    /// Break a lease at once (administrator).
    pub fn break_lease(&self, ino: Ino) -> Vec<Effect> {
        let mut st = self.state.lock();
        st.clock();
        if st.reserve(ino).is_err() {
            return Vec::new();
        }
        let effects = st.locks.break_now(ino);
        st.account(&effects);
        effects
    }

    pub fn new(uid: u32, gid: u32) -> Fs {
        Fs {
            state: Mutex::new(State {
                ns: Namespace::new(0o755, uid, gid, now()),
                handles: HashMap::new(),
                next_handle: 1,
                locks: Locks::new(),
                detached: HashMap::new(),
                path_epochs: HashMap::new(),
                new_path_floor: Epoch(0),
                invalidate: Vec::new(),
                obs: Observations::new(),
                predecessors: HashMap::new(),
                repointed: HashMap::new(),
                tmpfiles: std::collections::HashSet::new(),
                removed: HashMap::new(),
                tids: HashMap::new(),
                recorded: 0,
                resolve: proc_of_tid,
                guards: HashMap::new(),
                start: std::time::Instant::now(),
                metrics: Metrics::default(),
                parked_at: HashMap::new(),
                mount_point: PathBuf::new(),
                journal: None,
                store: None,
                volatile: false,
            }),
            group: crate::group::GroupCommit::default(),
        }
    }

    /// Keep epochs durable in `journal`; `ceiling` is the recovered one,
    /// above which every path resumes.
    pub fn set_journal(&self, journal: crate::store::EpochJournal, ceiling: u64) {
        let mut st = self.state.lock();
        st.new_path_floor = st.new_path_floor.max(Epoch(ceiling));
        st.journal = Some(journal);
    }

    /// Keep the namespace durable in `store`, starting from what it
    /// recovered. Call after [`Fs::set_journal`], so restored leases start
    /// at their path's epoch floor.
    pub fn set_store(&self, store: crate::persist::Store, rec: crate::persist::Recovered) {
        let mut st = self.state.lock();
        let root = st.ns.get(Ino::ROOT).map(|r| (r.perm, r.uid, r.gid)).unwrap_or((0o755, 0, 0));
        let fresh = std::mem::replace(&mut st.ns, Namespace::new(root.0, root.1, root.2, now()));
        st.ns = Namespace::restore(rec.inodes, rec.next_ino, fresh);
        for (ino, x) in rec.extras {
            if st.ns.get(ino).is_err() {
                continue;
            }
            if let Some(t) = x.ttl_ms {
                st.locks.set_ttl(ino, Some(t));
            }
            if let Some(g) = x.guard {
                st.guards.insert(ino, g);
            }
        }
        // Restored files resume above the recovered epoch ceiling: any epoch
        // up to it may have been handed out before the restart.
        let floor = st.new_path_floor;
        if floor.0 > 0 {
            let files: Vec<Ino> = st.ns.inodes().filter(|i| i.kind != Kind::Dir).map(|i| i.ino).collect();
            for ino in files {
                st.locks.raise_epoch(ino, floor);
            }
        }
        st.ns.set_tracking();
        st.store = Some(store);
    }

    /// `--volatile`: contents live in memory only (epochs stay durable).
    pub fn set_volatile(&self) {
        self.state.lock().volatile = true;
    }

    /// `fsync`, `fdatasync`, `fsyncdir`: make every change so far durable
    /// (one flush covers all files), then call `done`: at once when there is
    /// nothing to wait for, otherwise from the group-commit thread while
    /// other requests go on. `ENOSPC` on a full state disk, `EIO` for good
    /// after any other state-disk error.
    pub fn sync_then(&self, done: crate::group::Done) {
        let mut st = self.state.lock();
        match st.append_changes() {
            Err(e) => {
                drop(st);
                done(Err(e));
            }
            Ok(None) if !self.group.busy() => {
                drop(st);
                done(Ok(()));
            }
            Ok(sync) => {
                // Queued under the state lock: callers are answered in the
                // order their changes were appended.
                let failed = st.store.as_ref().map(|s| s.fail_flag()).unwrap_or_default();
                self.group.submit(sync, &failed, done);
            }
        }
    }

    /// [`Fs::sync_then`], waiting for the answer.
    pub fn sync(&self) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.sync_then(Box::new(move |r| {
            let _ = tx.send(r);
        }));
        rx.recv().unwrap_or(Err(Error::Io))
    }

    /// Clean unmount: flush and fold the journal into a snapshot.
    pub fn shutdown(&self) {
        self.group.stop();
        let mut st = self.state.lock();
        if st.store.is_none() {
            return;
        }
        if let Err(e) = st.flush() {
            tracing::error!("final flush failed: {e:?}");
            return;
        }
        let img = crate::persist::encode_all(&st.ns, |ino| st.extra(ino));
        if let Some(store) = st.store.as_mut() {
            match store.snapshot(&img) {
                Ok(()) => tracing::info!(bytes = img.len(), "snapshot written"),
                Err(e) => tracing::error!("snapshot at unmount failed: {e}"),
            }
        }
    }

    /// A file's path for debug logs (empty unless debug logging is on).
    pub fn describe(&self, ino: Ino) -> String {
        self.state.lock().path_for_log(ino)
    }

    /// Record where the filesystem is mounted (for `.leasefs/status`).
    pub fn set_mount_point(&self, p: PathBuf) {
        self.state.lock().mount_point = p;
    }

    fn control_lookup(&self, parent: Ino, name: &OsStr) -> Result<Option<Attr>> {
        if parent == Ino::ROOT && name == control::DIR_NAME {
            return Ok(Some(self.control_attr(control::DIR_INO)));
        }
        if parent == control::DIR_INO {
            let c = name.to_str().and_then(ControlFile::by_name).ok_or(Error::NotFound)?;
            return Ok(Some(self.control_attr(c.ino())));
        }
        Ok(None)
    }

    fn control_attr(&self, ino: Ino) -> Attr {
        let st = self.state.lock();
        let root = st.ns.get(Ino::ROOT).map(|r| r.attr()).ok();
        let t = root.map_or_else(now, |r| r.ctime);
        let (kind, perm, nlink) = match ControlFile::by_ino(ino) {
            Some(c) => (Kind::File, c.perm(), 1),
            None => (Kind::Dir, 0o555, 2),
        };
        Attr { ino, kind, perm, nlink, atime: t, mtime: t, ctime: t, crtime: t, ..Attr::absent() }
    }

    fn control_open(&self, ino: Ino, flags: i32) -> Result<Handle> {
        let content = match ControlFile::by_ino(ino) {
            None => None,
            Some(ControlFile::Break) => {
                if flags & libc::O_ACCMODE == libc::O_RDONLY {
                    return Err(Error::Access);
                }
                Some(Vec::new())
            }
            Some(c) => {
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    return Err(Error::Access);
                }
                Some(self.render(c).into_bytes())
            }
        };
        let mut st = self.state.lock();
        let h = Handle(st.next_handle);
        st.next_handle += 1;
        st.handles.insert(h, OpenFile { ino, opener: None, guard: None, control: content });
        Ok(h)
    }

    /// A write to `.leasefs/break`: the mount-relative path of the lease to
    /// break at once. Root only.
    pub fn control_write(&self, ino: Ino, data: &[u8], caller: Caller) -> Result<(u32, Vec<Effect>)> {
        if ControlFile::by_ino(ino) != Some(ControlFile::Break) {
            return Err(Error::NotPermitted);
        }
        if caller.uid != 0 {
            return Err(Error::NotPermitted);
        }
        let text = std::str::from_utf8(data).map_err(|_| Error::Invalid)?.trim();
        let rel = text.trim_start_matches('/');
        let mut st = self.state.lock();
        let target = if rel.is_empty() { None } else { st.resolve_path(std::path::Path::new(rel)) };
        let lease = target.or_else(|| st.detached.get(std::path::Path::new(rel)).copied()).ok_or(Error::NotFound)?;
        st.clock();
        st.reserve(lease)?;
        let effects = st.locks.break_now(lease);
        st.account(&effects);
        tracing::info!(path = %format!("/{rel}"), ino = lease.0, epoch = st.locks.epoch(lease).0, pid = caller.pid, "lease broken by administrator");
        Ok((data.len() as u32, effects))
    }

    /// Every file's paths that currently lead to `ino`s of interest.
    fn paths_of(st: &State, wanted: &std::collections::HashSet<Ino>) -> HashMap<Ino, PathBuf> {
        let mut out = HashMap::new();
        let mut stack = vec![(Ino::ROOT, PathBuf::new())];
        while let Some((dir, path)) = stack.pop() {
            let Ok(d) = st.ns.get(dir).and_then(|i| i.dir()) else { continue };
            for (name, child) in d.iter() {
                let p = path.join(name);
                if wanted.contains(&child) {
                    out.entry(child).or_insert_with(|| p.clone());
                }
                if st.ns.get(child).is_ok_and(|c| c.kind == Kind::Dir) {
                    stack.push((child, p));
                }
            }
        }
        for (p, ino) in &st.detached {
            out.entry(*ino).or_insert_with(|| p.clone());
        }
        out
    }

    /// Render a read-only control file.
    fn render(&self, c: ControlFile) -> String {
        let st = self.state.lock();
        let now = st.start.elapsed().as_millis() as u64;
        let leases = st.locks.leases();
        match c {
            ControlFile::Status => {
                let held = leases.iter().filter(|(_, l)| !l.locks().is_empty()).count();
                let awaited = leases.iter().filter(|(_, l)| l.waiters() > 0).count();
                let ttl = leases.iter().filter(|(i, _)| st.locks.effective_ttl(*i).is_some()).count();
                let status = serde_json::json!({
                    "version": crate::VERSION,
                    "backend": "local",
                    "pid": std::process::id(),
                    "mount_point": st.mount_point.to_string_lossy(),
                    "uptime_secs": st.start.elapsed().as_secs_f64(),
                    "leases": { "held": held, "awaited": awaited, "with_ttl": ttl, "known": leases.len() },
                    "inodes": st.ns.len(),
                    "observations": st.obs.len(),
                    "state_dir": st.journal.as_ref().and_then(|j| j.path().parent()).map(|p| p.to_string_lossy().into_owned()),
                    "journal_bytes": st.journal.as_ref().map(|j| j.size()),
                    "journal_commits": st.journal.as_ref().map(|j| j.commits()),
                    "epoch_ceiling": st.journal.as_ref().map(|j| j.ceiling()),
                    "journal_compactions": st.journal.as_ref().map(|j| j.compactions()),
                    "durability": match &st.store {
                        Some(s) if s.failed() => "failed",
                        Some(_) => "durable",
                        None if st.volatile => "volatile",
                        None => "memory",
                    },
                    "namespace_journal_bytes": st.store.as_ref().map(|s| s.journal_bytes()),
                    "namespace_flushes": st.store.as_ref().map(|s| s.flushes),
                    "snapshot": st.store.as_ref().map(|s| serde_json::json!({
                        "generation": s.generation(),
                        "bytes": s.snapshot_bytes(),
                        "written_at": s.last_snapshot.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs()),
                    })),
                });
                format!("{status}
")
            }
            ControlFile::Leases => {
                let wanted: std::collections::HashSet<Ino> = leases
                    .iter()
                    .filter(|(i, l)| l.is_live() || l.ttl().is_some() || st.locks.effective_ttl(*i).is_some() && !l.locks().is_empty())
                    .map(|(i, _)| *i)
                    .collect();
                let paths = Self::paths_of(&st, &wanted);
                let mut rows: Vec<(String, String)> = Vec::new();
                for (ino, l) in leases.iter().filter(|(i, _)| wanted.contains(i)) {
                    let path = paths.get(ino).map(|p| format!("/{}", p.display())).unwrap_or_default();
                    let holders: Vec<serde_json::Value> = l.locks().iter().map(|k| holder_value(k, now)).collect();
                    let row = serde_json::json!({
                        "path": path,
                        "inode": ino.0,
                        "epoch": l.epoch().0,
                        "version": st.ns.get(*ino).map(|i| i.version).unwrap_or(0),
                        "holders": holders,
                        "waiters": l.waiters(),
                        "ttl_ms": st.locks.effective_ttl(*ino),
                        "expires_in_ms": l.expires().map(|e| e as i64 - now as i64),
                    });
                    rows.push((path, row.to_string()));
                }
                rows.sort();
                rows.into_iter().map(|(_, r)| r + "\n").collect()
            }
            ControlFile::Metrics => {
                let live = leases.iter().filter(|(_, l)| l.is_live()).count();
                st.metrics.render(live, st.journal.as_ref().map_or(0, |j| j.commits()))
            }
            ControlFile::Break => String::new(),
        }
    }

    /// Replace how thread ids map to processes (tests).
    pub fn set_proc_resolver(&self, resolve: fn(u32) -> Option<Proc>) {
        let mut st = self.state.lock();
        st.resolve = resolve;
        st.tids.clear();
    }

    /// The lease version of a file (SPEC 6).
    pub fn version(&self, ino: Ino) -> Result<u64> {
        Ok(self.state.lock().ns.get(ino)?.version)
    }

    /// Resolve `name` in `parent` and take a kernel reference on it.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        if let Some(a) = self.control_lookup(parent, name)? {
            return Ok(a);
        }
        let mut st = self.state.lock();
        let ino = st.ns.child(parent, name)?;
        st.ns.add_lookup(ino);
        Ok(st.ns.get(ino)?.attr())
    }

    /// Drop `n` kernel references.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut st = self.state.lock();
        st.ns.forget(ino, n);
        st.collect(ino);
    }

    /// Attributes of an inode (`stat`: an observation by `tid`).
    pub fn getattr(&self, ino: Ino, tid: u32) -> Result<Attr> {
        if control::is_control(ino) {
            return Ok(self.control_attr(ino));
        }
        let mut st = self.state.lock();
        let a = st.ns.get(ino)?.attr();
        st.observe(tid, ino);
        Ok(a)
    }

    /// Change attributes (chmod, chown, truncate, utimensat).
    pub fn setattr(&self, ino: Ino, set: &SetAttr, caller: Caller) -> Result<Attr> {
        let tid = caller.pid;
        if control::is_control(ino) {
            // `echo PATH > .leasefs/break` opens with O_TRUNC: let that be.
            let only_truncate = set.size == Some(0) && set.mode.is_none() && set.uid.is_none() && set.gid.is_none();
            return if ControlFile::by_ino(ino) == Some(ControlFile::Break) && only_truncate {
                Ok(self.control_attr(ino))
            } else {
                Err(Error::NotPermitted)
            };
        }
        let mut st = self.state.lock();
        st.clock();
        if set.size.is_some() {
            match set.handle {
                Some(h) => Self::check_handle(&mut st, ino, h, "truncate")?,
                None => st.check_fenced_pid(tid, ino, "truncate")?,
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            // touch/utimensat by the holder renews its lease.
            let pids = st.lineage(tid);
            st.locks.renew(ino, set.handle.map(|h| h.0), &pids);
        }
        let now = now();
        let i = st.ns.get_mut(ino)?;
        if let Some(size) = set.size {
            i.data_mut()?.truncate(size)?;
            i.change_content(now);
            if set.mode.is_none() {
                i.perm = after_unprivileged_change(i.perm, i.gid, caller);
            }
        }
        if let Some(mode) = set.mode {
            i.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = set.uid {
            i.uid = uid;
        }
        if let Some(gid) = set.gid {
            i.gid = gid;
        }
        if let Some(t) = set.atime {
            i.atime = resolve(t, now);
        }
        if let Some(t) = set.mtime {
            i.mtime = resolve(t, now);
        }
        i.ctime = set.ctime.unwrap_or(now);
        let a = i.attr();
        if set.size.is_some() {
            st.observe(tid, ino);
            st.collect(ino);
        }
        Ok(a)
    }

    /// Target of a symlink.
    pub fn readlink(&self, ino: Ino) -> Result<OsString> {
        match &self.state.lock().ns.get(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(Error::Invalid),
        }
    }

    #[allow(clippy::too_many_arguments)] // the arguments of mknod/mkdir/symlink/create, passed on
    fn make(
        st: &mut State,
        caller: Caller,
        parent: Ino,
        name: &OsStr,
        kind: Kind,
        perm: u32,
        rdev: u32,
        symlink: Option<OsString>,
    ) -> Result<Attr> {
        check_name(name)?;
        refuse_control_name(parent, name)?;
        let now = now();
        let p = st.ns.get(parent)?;
        if p.nlink == 0 {
            // A removed directory accepts no new entries.
            return Err(Error::NotFound);
        }
        if p.dir()?.get(name).is_some() {
            return Err(Error::Exists);
        }
        let mut perm = (perm & 0o7777) as u16;
        let mut gid = caller.gid;
        // A setgid directory hands its group down, and its setgid bit to subdirectories.
        if p.perm & libc::S_ISGID as u16 != 0 {
            gid = p.gid;
            if kind == Kind::Dir {
                perm |= libc::S_ISGID as u16;
            }
        }
        let path = st.path_of(parent, name);
        if kind == Kind::File {
            // A live lease whose name was removed comes back with its inode,
            // holders, waiters and epoch (SPEC 4), also while other hard
            // links still name it. Without other names its content starts
            // empty like any newly created file; with them it keeps the
            // content those names still show.
            if let Some(ino) = path.as_ref().and_then(|p| st.detached.remove(p)) {
                if st.locks.is_live(ino) && st.ns.get(ino).is_ok_and(|i| i.kind == Kind::File) {
                    let orphan = st.ns.get(ino)?.nlink == 0;
                    st.ns.link(parent, name, ino)?;
                    st.ns.add_lookup(ino);
                    let i = st.ns.get_mut(ino)?;
                    if orphan {
                        i.data_mut()?.truncate(0)?;
                    }
                    i.change_content(now);
                    st.ns.get_mut(parent)?.touch_content(now);
                    st.repoint(ino);
                    return Ok(st.ns.get(ino)?.attr());
                }
            }
        }
        let ino = st.ns.alloc(NewInode { kind, perm, uid: caller.uid, gid, rdev, symlink }, parent, now);
        st.ns.link(parent, name, ino)?;
        st.ns.add_lookup(ino);
        st.floor_epoch(path.as_ref(), ino);
        if let Some(old) = path.as_ref().and_then(|p| st.removed.remove(p)) {
            // The name points at something new: whoever looked at the old
            // target has a stale view.
            st.succeed(old, ino);
        }
        st.ns.get_mut(parent)?.touch_content(now);
        Ok(st.ns.get(ino)?.attr())
    }

    /// `mknod`: regular files, FIFOs, sockets and (inert) device nodes.
    pub fn mknod(&self, caller: Caller, parent: Ino, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> Result<Attr> {
        let kind = Kind::from_mode(mode).ok_or(Error::Invalid)?;
        if matches!(kind, Kind::Dir | Kind::Symlink) {
            return Err(Error::Invalid);
        }
        let mut st = self.state.lock();
        Self::make(&mut st, caller, parent, name, kind, mode & !umask, rdev, None)
    }

    /// `mkdir`.
    pub fn mkdir(&self, caller: Caller, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        let mut st = self.state.lock();
        Self::make(&mut st, caller, parent, name, Kind::Dir, mode & !umask & 0o7777, 0, None)
    }

    /// `symlink`.
    pub fn symlink(&self, caller: Caller, parent: Ino, name: &OsStr, target: &OsStr) -> Result<Attr> {
        if target.len() >= libc::PATH_MAX as usize {
            return Err(Error::NameTooLong);
        }
        let mut st = self.state.lock();
        Self::make(&mut st, caller, parent, name, Kind::Symlink, 0o777, 0, Some(target.to_os_string()))
    }

    /// `create`: make a regular file and open it.
    pub fn create(
        &self,
        caller: Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Handle)> {
        let mut st = self.state.lock();
        let attr = match Self::make(&mut st, caller, parent, name, Kind::File, mode & !umask, 0, None) {
            Ok(a) => {
                // O_CREAT|O_EXCL that creates the file acquires the lease (the
                // lockfile idiom). A re-attached live lease keeps its holder.
                if flags & libc::O_EXCL != 0 && !st.locks.is_live(a.ino) {
                    st.reserve(a.ino)?;
                    st.locks.acquire_by_create(a.ino);
                }
                a
            }
            Err(Error::Exists) if flags & libc::O_EXCL == 0 => {
                // The kernel raced with another creator: open the existing file.
                let ino = st.ns.child(parent, name)?;
                st.ns.add_lookup(ino);
                st.ns.get(ino)?.attr()
            }
            Err(e) => return Err(e),
        };
        let h = Self::open_locked(&mut st, attr.ino, flags, caller.pid)?;
        st.observe(caller.pid, attr.ino);
        Ok((attr, h))
    }

    /// `O_TMPFILE`: an open regular file in `parent` without a name
    /// (nlink 0) until `linkat` gives it one; dropped at its last close.
    pub fn tmpfile(&self, caller: Caller, parent: Ino, mode: u32, umask: u32, flags: i32) -> Result<(Attr, Handle)> {
        let mut st = self.state.lock();
        let p = st.ns.get(parent)?;
        if p.nlink == 0 {
            return Err(Error::NotFound);
        }
        let mut gid = caller.gid;
        if p.perm & libc::S_ISGID as u16 != 0 {
            gid = p.gid;
        }
        let perm = (mode & !umask & 0o7777) as u16;
        let ino = st.ns.alloc(NewInode { kind: Kind::File, perm, uid: caller.uid, gid, rdev: 0, symlink: None }, parent, now());
        st.ns.add_lookup(ino);
        st.tmpfiles.insert(ino);
        let h = Self::open_locked(&mut st, ino, flags, caller.pid)?;
        st.observe(caller.pid, ino);
        Ok((st.ns.get(ino)?.attr(), h))
    }

    /// `unlink` by thread `tid`; `ESTALE` when it acts on an old view.
    pub fn unlink(&self, parent: Ino, name: &OsStr, tid: u32) -> Result<()> {
        refuse_control_name(parent, name)?;
        let mut st = self.state.lock();
        let ino = st.ns.child(parent, name)?;
        if st.ns.get(ino)?.kind == Kind::Dir {
            return Err(Error::IsDir);
        }
        st.check_fenced_pid(tid, ino, "unlink")?;
        st.check_current(tid, ino, false, "unlink")?;
        let now = now();
        let path = st.path_of(parent, name);
        if let Some(p) = &path {
            if st.removed.len() >= MAX_REMOVED_NAMES {
                st.removed.clear();
            }
            st.removed.insert(p.clone(), ino);
        }
        st.remember_epoch(path.clone(), ino);
        if st.locks.is_live(ino) {
            // The name goes (POSIX), the lease stays bound to the path.
            if let Some(p) = path {
                st.detached.insert(p, ino);
            }
        }
        st.ns.get_mut(ino)?.ctime = now;
        st.ns.unlink(parent, name)?;
        st.ns.get_mut(parent)?.touch_content(now);
        st.collect(ino);
        Ok(())
    }

    /// `rmdir`.
    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> Result<()> {
        refuse_control_name(parent, name)?;
        let mut st = self.state.lock();
        if name == "." {
            return Err(Error::Invalid);
        }
        if name == ".." {
            return Err(Error::NotEmpty);
        }
        let ino = st.ns.child(parent, name)?;
        let d = st.ns.get(ino)?.dir()?;
        if !d.is_empty() {
            return Err(Error::NotEmpty);
        }
        let now = now();
        st.ns.get_mut(ino)?.ctime = now;
        st.ns.unlink(parent, name)?;
        st.ns.get_mut(parent)?.touch_content(now);
        Ok(())
    }

    /// `link`: a new name for an existing non-directory.
    pub fn link(&self, ino: Ino, parent: Ino, name: &OsStr) -> Result<Attr> {
        check_name(name)?;
        refuse_control_name(parent, name)?;
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        let mut st = self.state.lock();
        let i = st.ns.get(ino)?;
        if i.kind == Kind::Dir {
            return Err(Error::NotPermitted);
        }
        if i.nlink == 0 && !st.tmpfiles.contains(&ino) {
            return Err(Error::NotFound);
        }
        let p = st.ns.get(parent)?;
        if p.nlink == 0 {
            return Err(Error::NotFound);
        }
        if p.dir()?.get(name).is_some() {
            return Err(Error::Exists);
        }
        let now = now();
        let path = st.path_of(parent, name);
        st.ns.link(parent, name, ino)?;
        st.ns.add_lookup(ino);
        st.tmpfiles.remove(&ino);
        st.ns.get_mut(parent)?.touch_content(now);
        // link() creating the name acquires the lease (the dotlock idiom).
        let floor = st.path_floor(path.as_ref());
        st.locks.raise_epoch(ino, floor);
        if let Err(e) = st.reserve(ino) {
            // Undo the name: the acquisition could not be made durable.
            let _ = st.ns.unlink(parent, name);
            return Err(e);
        }
        st.locks.acquire_by_link(ino, floor);
        // The name now leads to `ino`: whoever looked at what it named
        // before holds a stale view (the dotlock-breaking race).
        if let Some(old) = path.as_ref().and_then(|p| st.removed.remove(p)) {
            st.succeed(old, ino);
        }
        let i = st.ns.get_mut(ino)?;
        i.ctime = now;
        Ok(i.attr())
    }

    /// `rename` / `renameat2` with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
        tid: u32,
    ) -> Result<()> {
        check_name(name)?;
        check_name(newname)?;
        refuse_control_name(parent, name)?;
        refuse_control_name(newparent, newname)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0
        {
            return Err(Error::Invalid);
        }
        let mut st = self.state.lock();
        let src = st.ns.child(parent, name)?;
        let dst = match st.ns.child(newparent, newname) {
            Ok(i) => Some(i),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        let src_dir = st.ns.get(src)?.kind == Kind::Dir;
        let now = now();

        if flags & RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or(Error::NotFound)?;
            if src == dst {
                return Ok(());
            }
            // Moving a live lease would let newcomers lock a fresh file at
            // its old name (SPEC 4).
            if st.holds_live_lease(src) || st.holds_live_lease(dst) {
                return Err(Error::Busy);
            }
            let dst_dir = st.ns.get(dst)?.kind == Kind::Dir;
            // Neither may end up inside itself.
            if src_dir && st.ns.is_ancestor(src, newparent) || dst_dir && st.ns.is_ancestor(dst, parent) {
                return Err(Error::Invalid);
            }
            st.ns.get_mut(parent)?.dir_mut()?.insert(name.to_os_string(), dst);
            st.ns.get_mut(newparent)?.dir_mut()?.insert(newname.to_os_string(), src);
            st.ns.hint(dst, parent, name);
            st.ns.hint(src, newparent, newname);
            if parent != newparent {
                if src_dir {
                    Self::reparent(&mut st.ns, src, parent, newparent)?;
                }
                if dst_dir {
                    Self::reparent(&mut st.ns, dst, newparent, parent)?;
                }
            }
            for ino in [src, dst, parent, newparent] {
                st.ns.get_mut(ino)?.ctime = now;
            }
            st.ns.get_mut(parent)?.mtime = now;
            st.ns.get_mut(newparent)?.mtime = now;
            return Ok(());
        }

        if let Some(dst) = dst {
            if flags & RENAME_NOREPLACE != 0 {
                return Err(Error::Exists);
            }
            if dst == src {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
            let d = st.ns.get(dst)?;
            match (src_dir, d.kind == Kind::Dir) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if !d.dir()?.is_empty() => return Err(Error::NotEmpty),
                _ => {}
            }
        }
        if src_dir && st.ns.is_ancestor(src, newparent) {
            return Err(Error::Invalid);
        }
        if st.ns.get(newparent)?.nlink == 0 {
            return Err(Error::NotFound);
        }
        st.check_fenced_pid(tid, src, "rename")?;
        if st.holds_live_lease(src) {
            return Err(Error::Busy);
        }
        if let Some(dst) = dst {
            st.check_fenced_pid(tid, dst, "rename over")?;
            st.check_current(tid, dst, true, "rename over")?;
        }
        let old_path = st.path_of(parent, name);
        let new_path = st.path_of(newparent, newname);
        if let Some(dst) = dst {
            let live = st.locks.is_live(dst);
            let both_files = st.ns.get(dst)?.kind == Kind::File && st.ns.get(src)?.kind == Kind::File;
            if live && both_files {
                // Rename over a live lease replaces its content and keeps
                // its inode, holders, waiters and epoch (SPEC 4). Anything
                // else is renamed over exactly as POSIX says.
                let data = st.ns.get(src)?.data()?.clone();
                let d = st.ns.get_mut(dst)?;
                d.data_mut()?.replace_with(data);
                d.change_content(now);
                st.remember_epoch(old_path, src);
                st.ns.get_mut(src)?.ctime = now;
                st.ns.unlink(parent, name)?;
                st.ns.get_mut(parent)?.touch_content(now);
                st.ns.get_mut(newparent)?.touch_content(now);
                st.invalidate.push(dst);
                st.repoint(dst);
                st.collect(src);
                // Its own rename is an observation of the new version.
                st.observe(tid, dst);
                return Ok(());
            }
            st.remember_epoch(new_path.clone(), dst);
            // Whoever looked at the replaced file now has a stale view of
            // this name (versions count content changes; re-pointing a name
            // is tracked through predecessors, so other hard links of the
            // moved file are unaffected).
            st.succeed(dst, src);
            st.ns.get_mut(dst)?.ctime = now;
            st.ns.unlink(newparent, newname)?;
            st.collect(dst);
        }
        st.remember_epoch(old_path, src);
        st.ns.get_mut(parent)?.dir_mut()?.remove(name);
        st.ns.get_mut(newparent)?.dir_mut()?.insert(newname.to_os_string(), src);
        st.ns.hint(src, newparent, newname);
        if src_dir && parent != newparent {
            Self::reparent(&mut st.ns, src, parent, newparent)?;
        }
        st.floor_epoch(new_path.as_ref(), src);
        if dst.is_none() {
            if let Some(old) = new_path.as_ref().and_then(|p| st.removed.remove(p)) {
                st.succeed(old, src);
            }
        }
        st.ns.get_mut(src)?.ctime = now;
        st.ns.get_mut(parent)?.touch_content(now);
        st.ns.get_mut(newparent)?.touch_content(now);
        st.observe(tid, src);
        Ok(())
    }

    fn reparent(ns: &mut Namespace, dir: Ino, from: Ino, to: Ino) -> Result<()> {
        ns.get_mut(from)?.nlink -= 1;
        ns.get_mut(to)?.nlink += 1;
        ns.get_mut(dir)?.dir_mut()?.parent = to;
        Ok(())
    }

    /// Writes through a fenced descriptor, or through a guarded file's
    /// descriptor whose lease moved on since open, fail with `ESTALE`.
    fn check_handle(st: &mut State, ino: Ino, h: Handle, what: &str) -> Result<()> {
        if let Some(f) = st.locks.fenced_handle(ino, h.0) {
            debug!(path = %st.path_for_log(ino), ino = ino.0, pid = f.pid, held = f.epoch.0, current = st.locks.epoch(ino).0, op = what, "fenced");
            st.metrics.fenced_operations += 1;
            return Err(Error::Stale);
        }
        if let Some((lease, epoch, pid)) = st.handles.get(&h).and_then(|f| f.guard) {
            let now = st.locks.epoch(lease);
            if now != epoch || st.locks.held_by(lease, &[pid]).is_none() {
                debug!(path = %st.path_for_log(ino), lease = %st.path_for_log(lease), pid, held = epoch.0, current = now.0, op = what, "guard fenced");
                st.metrics.fenced_operations += 1;
                return Err(Error::Stale);
            }
        }
        Ok(())
    }

    fn open_locked(st: &mut State, ino: Ino, flags: i32, tid: u32) -> Result<Handle> {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let mut guard = None;
        if writes {
            if let Some(path) = st.guards.get(&ino).cloned() {
                // A guarded file opens for writing only under its lease.
                let pids = st.lineage(tid);
                let lease = st.resolve_path(&path).ok_or(Error::NoLock)?;
                let Some(holder) = st.locks.held_by(lease, &pids) else {
                    debug!(ino = ino.0, pids = ?pids, lease = %path.display(), "guarded open refused: lease not held");
                    return Err(Error::NoLock);
                };
                guard = Some((lease, st.locks.epoch(lease), holder));
            }
        }
        let opener = st.proc(tid, false);
        let i = st.ns.get_mut(ino)?;
        i.opens += 1;
        let h = Handle(st.next_handle);
        st.next_handle += 1;
        st.handles.insert(h, OpenFile { ino, opener, guard, control: None });
        Ok(h)
    }

    /// `open` / `opendir` by thread `tid` (an observation).
    pub fn open(&self, ino: Ino, flags: i32, tid: u32) -> Result<Handle> {
        if control::is_control(ino) {
            return self.control_open(ino, flags);
        }
        let mut st = self.state.lock();
        let h = Self::open_locked(&mut st, ino, flags, tid)?;
        st.observe(tid, ino);
        Ok(h)
    }

    /// `release` / `releasedir`: the last close of an open file description.
    /// Every lock taken through it goes; returns what that unblocked.
    pub fn release(&self, h: Handle, flock_owner: Option<Owner>) -> Result<Vec<Effect>> {
        let mut st = self.state.lock();
        let f = st.handles.remove(&h).ok_or(Error::BadHandle)?;
        if let Err(e) = st.reserve(f.ino) {
            tracing::error!(ino = f.ino.0, "cannot make the next epoch durable: {e}");
        }
        let effects = st.locks.release_handle(f.ino, h.0, flock_owner);
        st.account(&effects);
        if let Ok(i) = st.ns.get_mut(f.ino) {
            i.opens = i.opens.saturating_sub(1);
        }
        st.ns.maybe_drop(f.ino);
        st.collect(f.ino);
        Ok(effects)
    }

    /// A process closed a descriptor (FLUSH): its POSIX locks on the file go.
    pub fn flush(&self, ino: Ino, owner: Owner) -> Vec<Effect> {
        let mut st = self.state.lock();
        if let Err(e) = st.reserve(ino) {
            tracing::error!(ino = ino.0, "cannot make the next epoch durable: {e}");
        }
        let effects = st.locks.release_owner(ino, owner);
        st.account(&effects);
        st.collect(ino);
        effects
    }

    /// Lock, unlock, or park a waiter (`wait`); see [`Locks::set`].
    pub fn setlk(&self, ino: Ino, req: Request, wait: Option<WaitId>) -> Result<(Outcome, Vec<Effect>)> {
        let mut st = self.state.lock();
        st.ns.get(ino)?;
        let now = st.start.elapsed().as_millis() as u64;
        st.locks.advance(now);
        // Durable before visible: a request that could advance the epoch
        // waits for the reservation (refused with ENOSPC/EIO if the state
        // directory cannot take it).
        if req.mode.is_some() {
            st.reserve(ino)?;
        } else if let Err(e) = st.reserve(ino) {
            tracing::error!(ino = ino.0, "cannot make the next epoch durable: {e}");
        }
        let (outcome, effects) = st.locks.set(ino, req, wait);
        match outcome {
            Outcome::Granted if req.mode.is_some() => st.metrics.acquisitions += 1,
            Outcome::Parked => {
                st.metrics.contention += 1;
                if let Some(id) = wait {
                    st.parked_at.insert(id, now);
                }
            }
            Outcome::Refused(_) => st.metrics.contention += 1,
            Outcome::Granted => {}
        }
        st.account(&effects);
        st.collect(ino);
        Ok((outcome, effects))
    }

    /// The lock that would block `req` (`F_GETLK`).
    pub fn getlk(&self, ino: Ino, req: &Request) -> Result<Option<Lock>> {
        let st = self.state.lock();
        st.ns.get(ino)?;
        Ok(st.locks.test(ino, req))
    }

    /// A signal interrupted a parked lock request.
    pub fn interrupt(&self, id: WaitId) -> Option<Vec<Effect>> {
        let mut st = self.state.lock();
        let waited: Vec<Ino> = st.locks.leases().into_iter().filter(|(_, l)| l.waiters() > 0).map(|(i, _)| i).collect();
        for ino in waited {
            let _ = st.reserve(ino);
        }
        let effects = st.locks.interrupt(id)?;
        st.account(&effects);
        Some(effects)
    }

    /// The epoch of the lease at `ino`.
    pub fn epoch(&self, ino: Ino) -> Epoch {
        self.state.lock().locks.epoch(ino)
    }

    /// Inodes whose kernel page cache must be dropped.
    pub fn take_invalidations(&self) -> Vec<Ino> {
        std::mem::take(&mut self.state.lock().invalidate)
    }

    /// `read` by thread `tid` (an observation).
    pub fn read(&self, ino: Ino, h: Handle, offset: u64, size: u32, tid: u32) -> Result<Vec<u8>> {
        let mut st = self.state.lock();
        if control::is_control(ino) {
            let c = st.handles.get(&h).and_then(|f| f.control.as_ref()).ok_or(Error::BadHandle)?;
            let from = (offset as usize).min(c.len());
            let to = from.saturating_add(size as usize).min(c.len());
            return Ok(c[from..to].to_vec());
        }
        let d = st.ns.get(ino)?.data()?.read(offset, size as usize);
        st.observe(tid, ino);
        Ok(d)
    }

    /// `write`; returns the number of bytes written.
    pub fn write(&self, ino: Ino, h: Handle, offset: u64, data: &[u8], how: WriteOpts) -> Result<u32> {
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        let mut st = self.state.lock();
        st.clock();
        Self::check_handle(&mut st, ino, h, "write")?;
        // A write through the holder's descriptor renews its lease.
        st.locks.renew(ino, Some(h.0), &[]);
        let opener = st.handles.get(&h).and_then(|f| f.opener);
        let i = st.ns.get_mut(ino)?;
        let d = i.data_mut()?;
        // O_APPEND writes land at the daemon's end of file, which other
        // writers may have moved since the kernel last saw the size.
        let offset = if how.append { d.size() } else { offset };
        d.write(offset, data)?;
        i.change_content(now());
        if how.kill_suidgid && i.perm & (libc::S_ISUID | libc::S_ISGID) as u16 != 0 {
            let file_gid = i.gid;
            let member = how.tid != 0 && !how.writeback && in_group(how.tid, how.gid, file_gid);
            let i = st.ns.get_mut(ino)?;
            i.perm = kill_suidgid(i.perm, member);
        }
        // Writeback carries no meaningful caller: the pages were dirtied
        // through the opener's mapping, so the opener's own view stays
        // current (its own writes never make it stale).
        match (how.writeback || how.tid == 0, opener) {
            (true, Some(p)) => st.observe_as(p, ino),
            _ => st.observe(how.tid, ino),
        }
        Ok(data.len() as u32)
    }

    /// `fallocate`: mode 0 and `FALLOC_FL_KEEP_SIZE` reserve (a no-op in
    /// memory beyond growing the size), `PUNCH_HOLE|KEEP_SIZE` zeroes.
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: i32, caller: Caller) -> Result<()> {
        let tid = caller.pid;
        let mut st = self.state.lock();
        let i = st.ns.get_mut(ino)?;
        i.perm = after_unprivileged_change(i.perm, i.gid, caller);
        let i = st.ns.get_mut(ino)?;
        let d = i.data_mut()?;
        let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
        match mode {
            0 => {
                if end > d.size() {
                    d.truncate(end)?;
                }
            }
            libc::FALLOC_FL_KEEP_SIZE => {}
            m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => d.zero_range(offset, len),
            _ => return Err(Error::NotSupported),
        }
        i.change_content(now());
        st.observe(tid, ino);
        st.collect(ino);
        Ok(())
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (the kernel handles the
    /// other whences itself) over the sparse pages.
    pub fn lseek(&self, ino: Ino, offset: i64, whence: i32) -> Result<u64> {
        let from = u64::try_from(offset).map_err(|_| Error::NoSuchOffset)?;
        let st = self.state.lock();
        let d = st.ns.get(ino)?.data()?;
        match whence {
            libc::SEEK_DATA => d.seek_data(from).ok_or(Error::NoSuchOffset),
            libc::SEEK_HOLE => d.seek_hole(from).ok_or(Error::NoSuchOffset),
            _ => Err(Error::Invalid),
        }
    }

    /// `readdir`: entries after `offset` (0 starts over), including `.` and `..`.
    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        if ino == control::DIR_INO {
            let mut out = vec![
                DirEntry { cookie: 1, ino, kind: Kind::Dir, name: ".".into() },
                DirEntry { cookie: 2, ino: Ino::ROOT, kind: Kind::Dir, name: "..".into() },
            ];
            for (i, c) in ControlFile::ALL.into_iter().enumerate() {
                out.push(DirEntry { cookie: 3 + i as u64, ino: c.ino(), kind: Kind::File, name: c.name().into() });
            }
            out.retain(|e| e.cookie > offset);
            return Ok(out);
        }
        let st = self.state.lock();
        let i = st.ns.get(ino)?;
        let d = i.dir()?;
        let mut out = Vec::new();
        if offset < 1 {
            out.push(DirEntry { cookie: 1, ino, kind: Kind::Dir, name: ".".into() });
        }
        if offset < 2 {
            out.push(DirEntry { cookie: 2, ino: d.parent, kind: Kind::Dir, name: "..".into() });
        }
        for (cookie, name, child) in d.after(offset.max(2), max) {
            let kind = st.ns.get(child).map_or(Kind::File, |c| c.kind);
            out.push(DirEntry { cookie, ino: child, kind, name });
        }
        Ok(out)
    }

    /// `statfs`.
    pub fn statfs(&self) -> StatFs {
        let st = self.state.lock();
        let used = st.ns.pages();
        StatFs {
            blocks: TOTAL_BLOCKS,
            bfree: TOTAL_BLOCKS.saturating_sub(used),
            files: TOTAL_FILES,
            ffree: TOTAL_FILES - st.ns.len() as u64,
            bsize: PAGE as u32,
            namelen: crate::namespace::NAME_MAX as u32,
        }
    }

    /// `setxattr` by thread `tid`.
    pub fn setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: i32, tid: u32) -> Result<()> {
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::TooBig);
        }
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        let mut st = self.state.lock();
        st.clock();
        st.ns.get(ino)?;
        st.check_fenced_pid(tid, ino, "setxattr")?;
        if is_leasefs_xattr(name) {
            let text = std::str::from_utf8(value).map_err(|_| Error::Invalid)?.trim_end_matches('\0');
            return match name.to_str() {
                Some(XATTR_TTL) => {
                    let ttl = parse_ttl(text)?;
                    st.locks.set_ttl(ino, ttl);
                    st.ns.mark_dirty(ino);
                    Ok(())
                }
                Some(XATTR_RENEW) => {
                    let pids = st.lineage(tid);
                    if st.locks.renew(ino, None, &pids) { Ok(()) } else { Err(Error::NoLock) }
                }
                Some(XATTR_GUARD) => {
                    let path = PathBuf::from(text);
                    let ok = !text.is_empty()
                        && text.len() < 4096
                        && path.components().all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
                    if !ok {
                        return Err(Error::Invalid);
                    }
                    st.guards.insert(ino, path);
                    st.ns.mark_dirty(ino);
                    Ok(())
                }
                _ => Err(Error::NotPermitted),
            };
        }
        let i = st.ns.get_mut(ino)?;
        let exists = i.xattrs.contains_key(name);
        if flags & XATTR_CREATE != 0 && exists {
            return Err(Error::Exists);
        }
        if flags & XATTR_REPLACE != 0 && !exists {
            return Err(Error::NoAttr);
        }
        i.xattrs.insert(name.to_os_string(), value.to_vec());
        i.ctime = now();
        Ok(())
    }

    /// `getxattr`.
    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        if control::is_control(ino) {
            return Err(Error::NoAttr);
        }
        let st = self.state.lock();
        let i = st.ns.get(ino)?;
        match name.to_str() {
            Some(XATTR_EPOCH) => return Ok(st.locks.epoch(ino).0.to_string().into_bytes()),
            Some(XATTR_VERSION) => return Ok(i.version.to_string().into_bytes()),
            Some(XATTR_HOLDER) => {
                let now = st.start.elapsed().as_millis() as u64;
                return Ok(holder_json(&st.locks, ino, now).into_bytes());
            }
            Some(XATTR_TTL) => {
                let ttl = st.locks.lease(ino).and_then(|l| l.ttl()).ok_or(Error::NoAttr)?;
                return Ok(format_ttl(ttl).into_bytes());
            }
            Some(XATTR_GUARD) => {
                let g = st.guards.get(&ino).ok_or(Error::NoAttr)?;
                return Ok(g.to_string_lossy().into_owned().into_bytes());
            }
            Some(XATTR_RENEW) => return Err(Error::NoAttr),
            _ => {}
        }
        st.ns.get(ino)?.xattrs.get(name).cloned().ok_or(Error::NoAttr)
    }

    /// `listxattr`: NUL-terminated names.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        if control::is_control(ino) {
            return Ok(Vec::new());
        }
        let st = self.state.lock();
        let mut out = Vec::new();
        for name in st.ns.get(ino)?.xattrs.keys() {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// `removexattr` by thread `tid`.
    pub fn removexattr(&self, ino: Ino, name: &OsStr, tid: u32) -> Result<()> {
        check_xattr_name(name)?;
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        let mut st = self.state.lock();
        st.ns.get(ino)?;
        st.check_fenced_pid(tid, ino, "removexattr")?;
        if is_leasefs_xattr(name) {
            return match name.to_str() {
                Some(XATTR_TTL) => {
                    st.clock();
                    st.locks.set_ttl(ino, None);
                    st.ns.mark_dirty(ino);
                    Ok(())
                }
                Some(XATTR_GUARD) => {
                    st.ns.mark_dirty(ino);
                    st.guards.remove(&ino).map(|_| ()).ok_or(Error::NoAttr)
                }
                _ => Err(Error::NotPermitted),
            };
        }
        let i = st.ns.get_mut(ino)?;
        i.xattrs.remove(name).ok_or(Error::NoAttr)?;
        i.ctime = now();
        Ok(())
    }
}

/// Return free heap memory to the system.
fn give_memory_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Names inside `.leasefs/`, and `.leasefs` itself in the root, are not
/// part of the namespace: creating, removing or moving them is refused.
fn refuse_control_name(parent: Ino, name: &OsStr) -> Result<()> {
    if parent == control::DIR_INO {
        return Err(Error::NotPermitted);
    }
    if parent == Ino::ROOT && name == control::DIR_NAME {
        return Err(Error::Exists);
    }
    Ok(())
}

/// One holder as JSON (for `user.leasefs.holder` and `.leasefs/leases`).
fn holder_value(k: &Lock, now: u64) -> serde_json::Value {
    serde_json::json!({
        "pid": k.pid,
        "kind": match k.kind { crate::lease::LockKind::Flock => "flock", crate::lease::LockKind::Posix => "posix" },
        "mode": match k.mode { crate::lease::Mode::Shared => "shared", crate::lease::Mode::Exclusive => "exclusive" },
        "start": k.range.start,
        "end": k.range.end,
        "since_ms_ago": now.saturating_sub(k.since),
    })
}

/// `user.leasefs.holder`: the holders as JSON.
fn holder_json(locks: &Locks, ino: Ino, now: u64) -> String {
    let holders: Vec<serde_json::Value> =
        locks.lease(ino).map(|l| l.locks().iter().map(|k| holder_value(k, now)).collect()).unwrap_or_default();
    serde_json::json!({ "epoch": locks.epoch(ino).0, "holders": holders }).to_string()
}

fn is_leasefs_xattr(name: &OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes().starts_with(XATTR_PREFIX.as_bytes())
}

fn check_xattr_name(name: &OsStr) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    if b.is_empty() || b.len() > 255 {
        return Err(Error::Range);
    }
    // POSIX ACLs (system.*) are not supported, as on a filesystem without acl.
    if ["user.", "trusted.", "security."].iter().any(|p| b.starts_with(p.as_bytes())) {
        Ok(())
    } else {
        Err(Error::NotSupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs() -> Fs {
        Fs::new(0, 0)
    }
    const C: Caller = Caller::ROOT;

    #[test]
    fn hard_links_share_nlink_and_content() {
        let fs = fs();
        let (a, h) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0o022, libc::O_RDWR).unwrap();
        assert_eq!(a.perm, 0o644);
        fs.write(a.ino, h, 0, b"hello", WriteOpts::default()).unwrap();
        let b = fs.link(a.ino, Ino::ROOT, OsStr::new("b")).unwrap();
        assert_eq!(b.nlink, 2);
        fs.unlink(Ino::ROOT, OsStr::new("a"), 0).unwrap();
        assert_eq!(fs.lookup(Ino::ROOT, OsStr::new("b")).unwrap().nlink, 1);
        assert_eq!(fs.read(a.ino, h, 0, 10, 0).unwrap(), b"hello");
        assert_eq!(fs.link(a.ino, Ino::ROOT, OsStr::new("b")), Err(Error::Exists));
    }

    #[test]
    fn rename_error_cases() {
        let fs = fs();
        let d = fs.mkdir(C, Ino::ROOT, OsStr::new("d"), 0o755, 0).unwrap();
        let e = fs.mkdir(C, d.ino, OsStr::new("e"), 0o755, 0).unwrap();
        fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
        fs.mknod(C, e.ino, OsStr::new("g"), libc::S_IFREG | 0o644, 0, 0).unwrap();
        let r = Ino::ROOT;
        assert_eq!(fs.rename(r, OsStr::new("d"), e.ino, OsStr::new("x"), 0, 0), Err(Error::Invalid));
        assert_eq!(fs.rename(r, OsStr::new("d"), r, OsStr::new("f"), 0, 0), Err(Error::NotDir));
        assert_eq!(fs.rename(r, OsStr::new("f"), r, OsStr::new("d"), 0, 0), Err(Error::IsDir));
        fs.mkdir(C, r, OsStr::new("z"), 0o755, 0).unwrap();
        assert_eq!(fs.rename(r, OsStr::new("z"), d.ino, OsStr::new("e"), 0, 0), Err(Error::NotEmpty));
        assert_eq!(fs.rename(r, OsStr::new("f"), r, OsStr::new("z"), RENAME_NOREPLACE, 0), Err(Error::Exists));
        assert_eq!(fs.rename(r, OsStr::new("nope"), r, OsStr::new("q"), 0, 0), Err(Error::NotFound));
        // Moving a directory across parents moves the ".." link count.
        assert_eq!(fs.getattr(r, 0).unwrap().nlink, 4);
        fs.rename(d.ino, OsStr::new("e"), r, OsStr::new("e2"), 0, 0).unwrap();
        assert_eq!(fs.getattr(r, 0).unwrap().nlink, 5);
        assert_eq!(fs.getattr(d.ino, 0).unwrap().nlink, 2);
        fs.rename(r, OsStr::new("f"), r, OsStr::new("d"), RENAME_EXCHANGE, 0).unwrap();
        assert_eq!(fs.lookup(r, OsStr::new("f")).unwrap().kind, Kind::Dir);
    }

    #[test]
    fn setgid_directories_hand_down_group() {
        let fs = fs();
        let d = fs.mkdir(C, Ino::ROOT, OsStr::new("d"), 0o2775, 0).unwrap();
        fs.setattr(d.ino, &SetAttr { gid: Some(50), ..SetAttr::default() }, C).unwrap();
        let u = Caller { uid: 1000, gid: 1000, pid: 1 };
        let f = fs.mknod(u, d.ino, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
        assert_eq!(f.gid, 50);
        let s = fs.mkdir(u, d.ino, OsStr::new("s"), 0o755, 0).unwrap();
        assert_eq!(s.perm & libc::S_ISGID as u16, libc::S_ISGID as u16);
    }

    #[test]
    fn xattr_flags_and_errors() {
        let fs = fs();
        let f = fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
        let n = OsStr::new("user.k");
        assert_eq!(fs.setxattr(f.ino, n, b"v", XATTR_REPLACE, 0), Err(Error::NoAttr));
        fs.setxattr(f.ino, n, b"v", XATTR_CREATE, 0).unwrap();
        assert_eq!(fs.setxattr(f.ino, n, b"v", XATTR_CREATE, 0), Err(Error::Exists));
        assert_eq!(fs.getxattr(f.ino, n).unwrap(), b"v");
        assert_eq!(fs.listxattr(f.ino).unwrap(), b"user.k\0");
        fs.removexattr(f.ino, n, 0).unwrap();
        assert_eq!(fs.getxattr(f.ino, n), Err(Error::NoAttr));
        assert_eq!(fs.setxattr(f.ino, OsStr::new("bogus.k"), b"v", 0, 0), Err(Error::NotSupported));
    }

    fn flock(h: Handle, mode: Option<crate::lease::Mode>) -> Request {
        Request {
            owner: Owner(h.0),
            kind: crate::lease::LockKind::Flock,
            mode,
            range: crate::lease::Range { start: 0, end: u64::MAX },
            pid: 1,
            handle: h.0,
        }
    }

    /// SPEC 4: rename over keeps the destination's inode only while it is
    /// live; over a released lease it is POSIX, and the epoch floor holds.
    #[test]
    fn rename_over_keeps_identity_only_while_live() {
        use crate::lease::Mode;
        let fs = fs();
        let r = Ino::ROOT;
        let (dst, h) = fs.create(C, r, OsStr::new("dst"), 0o600, 0, libc::O_RDWR | libc::O_EXCL).unwrap();
        fs.setlk(dst.ino, flock(h, Some(Mode::Exclusive)), None).unwrap();
        assert_eq!(fs.epoch(dst.ino), Epoch(2));
        // Held: the content moves, the inode, epoch and holder stay.
        let (src, _) = fs.create(C, r, OsStr::new("src"), 0o640, 0, libc::O_RDWR).unwrap();
        fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, 0).unwrap();
        assert_eq!(fs.lookup(r, OsStr::new("dst")).unwrap().ino, dst.ino);
        assert_eq!(fs.epoch(dst.ino), Epoch(2));
        assert_ne!(src.ino, dst.ino);
        // Released: POSIX, the source's inode and mode arrive at the name.
        fs.setlk(dst.ino, flock(h, None), None).unwrap();
        let (src, _) = fs.create(C, r, OsStr::new("src"), 0o640, 0, libc::O_RDWR).unwrap();
        fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, 0).unwrap();
        let now = fs.lookup(r, OsStr::new("dst")).unwrap();
        assert_eq!((now.ino, now.perm), (src.ino, 0o640));
        assert!(fs.epoch(src.ino) >= Epoch(2), "the path's epoch never goes back");
    }

    #[test]
    fn unlinked_open_file_lives_until_forget_and_release() {
        let fs = fs();
        let (a, h) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.unlink(Ino::ROOT, OsStr::new("a"), 0).unwrap();
        fs.write(a.ino, h, 0, b"x", WriteOpts::default()).unwrap();
        fs.forget(a.ino, 1);
        assert_eq!(fs.getattr(a.ino, 0).unwrap().nlink, 0);
        fs.release(h, None).unwrap();
        assert_eq!(fs.getattr(a.ino, 0), Err(Error::NotFound));
        // A new file never reuses the number.
        let (b, _) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0, 0).unwrap();
        assert!(b.ino > a.ino);
    }
}
