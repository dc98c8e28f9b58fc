//! Filesystem operations over the namespace, callable without the kernel.
//!
//! Every method takes the caller's identity and returns `Result<_, Error>`;
//! the FUSE adapter only decodes requests and encodes replies. Permission
//! checks are the kernel's (`default_permissions`); this layer enforces what
//! the kernel cannot know: names, emptiness, types, ownership inheritance.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::control::{self, ControlFile, Metrics};
use crate::error::{Error, Result};
use crate::lease::authority::{LeaseAuthority, Wake};
use crate::lease::local::LocalAuthority;
use crate::lease::observe::Proc;
use crate::lease::views::read_proc;
use crate::lease::{Effect, Epoch, Lock, Outcome, Owner, Request, WaitId};
use crate::namespace::{check_name, Attr, Body, Ino, Kind, Namespace, NewInode, PAGE};
use tracing::debug;

mod control_files;
pub use control_files::BREAK_ALL;
mod io;
pub mod limits;
mod locks;
mod names;
mod xattr;

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
    pub bavail: u64,
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
    /// The writer's user (request header), for root's reserve.
    pub uid: u32,
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
    let Some(status) = read_proc(&format!("/proc/{tid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .is_some_and(|g| g.split_whitespace().any(|x| x.parse() == Ok(file_gid)))
}

/// Rename flags (`renameat2`).
pub const RENAME_NOREPLACE: u32 = 1;
/// Rename flags (`renameat2`).
pub const RENAME_EXCHANGE: u32 = 2;

/// How often a change of a shared namespace is decided again after losing
/// a race with another host before it fails (`EIO`).
const CONFLICT_TRIES: u32 = 16;

/// Threads running the request handlers of a shared mount (requests that
/// wait for etcd hold one each; a blocked lock wait holds none).
const HANDLER_THREADS: usize = 16;

/// Requests of a shared mount queued or running at most; past it a request
/// is answered `EAGAIN`.
const HANDLERS_HELD: usize = 4096;

const XATTR_CREATE: i32 = 1;
const XATTR_REPLACE: i32 = 2;
const XATTR_SIZE_MAX: usize = 65_536;

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
const YOUNG: Duration = Duration::from_secs(1);

/// Added to every recorded deadline: the kernel starts an entry's timeout
/// when the looking-up thread runs again after the reply, a little later
/// than the daemon records it.
const ENTRY_MARGIN: Duration = Duration::from_secs(1);

/// The latest time until which the kernel may hold a cached entry (with
/// [`FILE_ENTRY_TTL`]) of each file it looked up; entries that expire at
/// once (of files younger than [`YOUNG`], and every entry a create, mknod,
/// symlink or link returns) are not here. Expired deadlines are pruned as
/// the map grows, so it holds about the files looked up in the last two
/// seconds.
#[derive(Debug, Default)]
struct EntryDeadlines {
    until: HashMap<Ino, Instant>,
    /// Prune when the map reaches this size.
    prune_at: usize,
}

impl EntryDeadlines {
    /// The kernel was just given an entry of `ino` that it may keep.
    fn given(&mut self, ino: Ino, now: Instant) {
        if self.until.len() >= self.prune_at.max(1024) {
            self.until.retain(|_, d| *d > now);
            self.prune_at = 2 * self.until.len();
        }
        self.until.insert(ino, now + FILE_ENTRY_TTL + ENTRY_MARGIN);
    }

    /// The kernel may still hold a valid entry of `ino`.
    fn cached(&self, ino: Ino, now: Instant) -> bool {
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
struct KernelCache {
    /// Files in the order the kernel first took a reference to them (each
    /// may have been forgotten since; checked when it comes up).
    order: std::collections::VecDeque<Ino>,
    /// Entries to invalidate, taken by the FUSE layer after the reply.
    drop: Vec<(Ino, OsString)>,
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
const DROP_BATCH: usize = 128;

/// Files past the bound are dropped once no file was newly referenced for
/// this long.
pub(crate) const TRIM_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// The pause between two batches of such a trim.
const TRIM_GAP: std::time::Duration = std::time::Duration::from_millis(2);

impl KernelCache {
    fn batch(bound: usize) -> usize {
        (bound / 8).clamp(1, DROP_BATCH)
    }

    /// The kernel took its first reference to the file `ino`: queue it;
    /// past twice `bound`, pick a batch of entries to drop. True when the
    /// timer must be woken to trim back to the bound later.
    fn took(&mut self, ns: &Namespace, ino: Ino, bound: usize, now: Instant) -> bool {
        self.order.push_back(ino);
        self.last_took = Some(now);
        // Forgotten files leave stale slots behind: rebuild the queue from
        // what the kernel holds when it has grown far past it.
        if self.order.len() > 4 * bound.max(ns.held()) + 1024 {
            self.order.retain(|i| ns.get(*i).is_ok_and(|i| i.lookups > 0));
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

    /// Once no file was newly referenced for [`TRIM_AFTER`], pick a batch of
    /// entries to drop towards `bound`. When to call again (none: at the
    /// bound, or nothing left that can be dropped).
    fn trim(&mut self, ns: &Namespace, bound: usize, now: Instant) -> Option<std::time::Duration> {
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
    fn pick(&mut self, ns: &Namespace, over: usize, target: usize, most: usize) -> Option<(usize, usize)> {
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
struct PendingRenames(HashMap<(Ino, OsString), (u32, bool)>);

/// At most this many pending renames are remembered (a thread killed
/// between the two tries leaves one behind).
const PENDING_RENAMES: usize = 256;

impl PendingRenames {
    /// `tid` must retry its rename of `name` in `parent`.
    fn ask(&mut self, parent: Ino, name: &OsStr, tid: u32) {
        if self.0.len() >= PENDING_RENAMES {
            self.0.clear();
        }
        self.0.insert((parent, name.to_os_string()), (tid, false));
    }

    /// A lookup of `name` in `parent` by `tid`: true when a rename of it is
    /// pending (the kernel must not keep the entry).
    fn looked_up(&mut self, parent: Ino, name: &OsStr, tid: u32) -> bool {
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
    fn retried(&mut self, parent: Ino, name: &OsStr, tid: u32) -> bool {
        let key = (parent, name.to_os_string());
        if self.0.get(&key) == Some(&(tid, true)) {
            self.0.remove(&key);
            return true;
        }
        false
    }
}

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
    /// `.leasefs/leases`: rendered row by row as it is read.
    listing: Option<Box<control_files::Listing>>,
}

#[derive(Debug)]
struct State {
    ns: Namespace,
    handles: HashMap<Handle, OpenFile>,
    next_handle: u64,
    /// Every lease question is asked here (SPEC 3 to 7).
    lease: Box<dyn LeaseAuthority>,
    /// Inodes whose cached pages the kernel must drop (content replaced
    /// behind open descriptors).
    invalidate: Vec<Ino>,
    /// Renames over a live lease waiting for the kernel to look their
    /// source up again (see `Fs::rename`).
    pending_renames: PendingRenames,
    /// Files of which the kernel may hold a cached entry.
    entry_deadlines: EntryDeadlines,
    /// Keeps the kernel's references to files bounded.
    kernel: KernelCache,
    /// The kernel caches names of files (not on a shared namespace).
    names_cached: bool,
    /// Open `O_TMPFILE` files that were never linked: `link()` may give
    /// them their first name (the kernel allows it unless `O_EXCL`).
    tmpfiles: std::collections::HashSet<Ino>,
    metrics: Metrics,
    /// When each parked lock request started waiting (lease clock, ms).
    parked_at: HashMap<WaitId, u64>,
    /// Where and how it is mounted, for `.leasefs/status`.
    mount_point: PathBuf,
    mount_source: String,
    /// Other users may use the mount (`allow_other`).
    shared: bool,
    /// Where `/metrics` is served over HTTP, if it is.
    metrics_addr: Option<String>,
    /// The durable namespace (none: contents live in memory only).
    store: Option<crate::store::snapshot::Store>,
    /// `--volatile`: the namespace is deliberately not kept.
    volatile: bool,
    /// A snapshot being encoded between requests or written off the
    /// request path.
    compaction: Option<Compaction>,
    /// How long one slice of a snapshot image may hold the state lock.
    slice: std::time::Duration,
    /// Wakes the lease timer (the authority has effects to hand over, a
    /// snapshot was written).
    wake: Wake,
    /// What callers may make the daemon keep.
    limits: limits::Limits,
    /// Refusals by each limit.
    hits: limits::Hits,
    /// Readers of `.leasefs/events`.
    events: crate::events::Hub,
    /// Parked lock requests, for the events of their grant or cancellation.
    parked_req: HashMap<WaitId, (Ino, Request)>,
    /// Why holders are being broken (`ttl` unless an administrator does it).
    breaking: &'static str,
    /// Command names of processes named in events.
    comms: HashMap<Proc, String>,
    /// The store the namespace is shared through (an `--etcd` mount).
    replica: Option<Box<dyn crate::namespace::replica::Replica>>,
    /// Largest file size accepted (`EFBIG` beyond).
    max_file: u64,
    /// What the change in progress may be stored under only (guarded writes).
    conditions: Vec<crate::namespace::replica::Condition>,
    /// Inodes the change being decided on a shared namespace handed to
    /// the kernel (a lookup reference each), let go if it does not land.
    referenced_now: Option<Vec<Ino>>,
    /// Handles the change being decided on a shared namespace opened, let
    /// go if it does not land.
    opened_now: Option<Vec<Handle>>,
    /// Inodes of this host's change on its way to the shared store: the
    /// table has the change already, so readers of these inodes wait until
    /// it is stored or undone ([`Fs::settled`]).
    in_flight: std::collections::HashSet<Ino>,
    /// Names (directory, name) that change with it: lookups of them wait
    /// too (lookups of other names in those directories do not).
    in_flight_names: std::collections::HashSet<(Ino, OsString)>,
    /// The pool running request handlers (a shared mount), for `status`.
    handlers: Option<crate::fuse::workers::Workers>,
}

impl State {
    /// A new handle number, remembered by the change being decided.
    fn new_handle(&mut self) -> Handle {
        let h = Handle(self.next_handle);
        self.next_handle += 1;
        if let Some(now) = self.opened_now.as_mut() {
            now.push(h);
        }
        h
    }

    /// The kernel took a reference to `ino` (a lookup, create, mknod,
    /// symlink or link reply).
    fn referenced(&mut self, ino: Ino) {
        if let Some(now) = self.referenced_now.as_mut() {
            now.push(ino);
        }
        if self.ns.add_lookup(ino) {
            let bound = self.limits.kernel_inodes;
            if self.kernel.took(&self.ns, ino, bound, Instant::now()) {
                self.wake.wake();
            }
        }
    }

    /// Publish `ev` about the lease at `ino` to the readers of
    /// `.leasefs/events` (nothing is computed when nobody reads).
    fn emit(&mut self, mut ev: crate::events::Event, ino: Ino) {
        if !self.events.listening() {
            return;
        }
        ev.path = self.lease_path(ino);
        let ts = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let comm = ev.pid.and_then(|p| self.comm(p));
        if self.events.publish(crate::events::Item::new(ev, ts, comm)) {
            self.wake.wake();
        }
    }

    /// Publish events of holders on other hosts (their path, pid and
    /// command name come with them).
    fn emit_remote(&mut self, events: Vec<(crate::events::Event, Option<String>)>) {
        if !self.events.listening() {
            return;
        }
        let ts = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut woke = false;
        for (ev, comm) in events {
            woke |= self.events.publish(crate::events::Item::new(ev, ts, comm));
        }
        if woke {
            self.wake.wake();
        }
    }

    /// A process's command name, cached by its identity (pid and start
    /// time, so a reused pid is not given an old name).
    fn comm(&mut self, pid: u32) -> Option<String> {
        let p = self.proc(pid, false)?;
        if let Some(c) = self.comms.get(&p) {
            return Some(c.clone());
        }
        let c = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim_end().to_string();
        if self.comms.len() >= 4096 {
            self.comms.clear();
        }
        self.comms.insert(p, c.clone());
        Some(c)
    }

    /// The event of `req` (pid, lock API, mode).
    fn lock_event(kind: crate::events::Kind, req: &Request, epoch: Epoch) -> crate::events::Event {
        let mut ev = crate::events::Event::new(kind, String::new(), epoch.0);
        ev.pid = Some(req.pid);
        ev.owner = Some(match req.kind {
            crate::lease::LockKind::Flock => "flock",
            crate::lease::LockKind::Posix => "posix",
        });
        ev.mode = req.mode.map(|m| match m {
            crate::lease::Mode::Shared => "shared",
            crate::lease::Mode::Exclusive => "exclusive",
        });
        ev
    }

    /// Release events for the locks of `ino` that `gone` selects, before
    /// they go.
    fn releases(&mut self, ino: Ino, gone: impl Fn(&Lock) -> bool) -> Vec<crate::events::Event> {
        if !self.events.listening() {
            return Vec::new();
        }
        let epoch = self.lease.epoch(ino);
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for k in self.lease.lease(ino).map(|l| l.locks().to_vec()).unwrap_or_default() {
            if gone(&k) && !seen.contains(&k.owner) {
                seen.push(k.owner);
                let req = Request {
                    owner: k.owner,
                    kind: k.kind,
                    mode: Some(k.mode),
                    range: k.range,
                    pid: k.pid,
                    handle: k.handle,
                };
                out.push(Self::lock_event(crate::events::Kind::Release, &req, epoch));
            }
        }
        out
    }

    /// A file's mount-relative path (`/a/b`), empty if it has none.
    fn lease_path(&self, ino: Ino) -> String {
        if let Some(p) = self.ns.path_hint(ino) {
            return format!("/{}", p.display());
        }
        let wanted = std::iter::once(ino).collect();
        Fs::paths_of(self, &wanted).get(&ino).map(|p| format!("/{}", p.display())).unwrap_or_default()
    }

    /// Tell an authority that arbitrates by name (etcd) which path `ino` is.
    fn name_lease(&mut self, ino: Ino) {
        if self.lease.wants_paths() {
            let path = self.lease_path(ino);
            self.lease.bind_path(ino, &path);
        }
    }

    /// Refuse with `ENOSPC` unless `extra` more bytes fit in what `uid` may use.
    fn room_for_bytes(&mut self, uid: u32, extra: u64) -> Result<()> {
        let used = self.ns.usage().bytes();
        limits::check(used, extra, self.limits.size, uid).map_err(|e| {
            let size = self.limits.size;
            self.hits.refuse(
                limits::Limit::Size,
                e,
                format_args!("{used} of {size} bytes used, {extra} more asked by uid {uid}"),
            )
        })
    }

    /// Refuse with `ENOSPC` unless `uid` may make one more inode.
    fn room_for_inode(&mut self, uid: u32) -> Result<()> {
        let used = self.ns.len() as u64;
        limits::check(used, 1, self.limits.inodes, uid).map_err(|e| {
            let max = self.limits.inodes;
            self.hits.refuse(
                limits::Limit::Inodes,
                e,
                format_args!("{used} of {max} inodes used, one more asked by uid {uid}"),
            )
        })
    }

    /// Refuse with `ENFILE` when no more handles may be open (control
    /// files have a few more, so `.leasefs/` stays readable).
    fn room_for_handle(&mut self, control: bool) -> Result<()> {
        let max = self.limits.handles + if control { limits::CONTROL_HANDLES } else { 0 };
        if self.handles.len() >= max {
            let open = self.handles.len();
            return Err(self.hits.refuse(
                limits::Limit::Handles,
                Error::TooManyOpen,
                format_args!("{open} handles open"),
            ));
        }
        Ok(())
    }

    /// Every bound with its use and refusals (status and metrics).
    fn limit_rows(&self) -> Vec<crate::control::LimitRow> {
        use crate::control::LimitRow;
        use limits::Limit;
        let (locks, waiters) = self.lease.lock_usage();
        let ll = self.lease.lock_limits();
        let row = |name, used, max, refused| LimitRow { name, used, max, refused };
        vec![
            row("size", Some(self.ns.usage().bytes()), self.limits.size, self.hits.count(Limit::Size)),
            row("inodes", Some(self.ns.len() as u64), self.limits.inodes, self.hits.count(Limit::Inodes)),
            row(
                "handles",
                Some(self.handles.len() as u64),
                self.limits.handles as u64,
                self.hits.count(Limit::Handles),
            ),
            row("xattrs_per_file", None, self.limits.xattrs_per_file as u64, self.hits.count(Limit::Xattrs)),
            row("xattr_bytes_per_file", None, self.limits.xattr_bytes_per_file, 0),
            row("locks", Some(locks as u64), ll.locks_total as u64, self.hits.count(Limit::Locks)),
            row("ranges_per_owner", None, ll.ranges_per_owner as u64, 0),
            row("waiters", Some(waiters as u64), ll.waiters_total as u64, 0),
            row("waiters_per_lease", None, ll.waiters_per_lease as u64, 0),
            row("kernel_inodes", Some(self.ns.held() as u64), self.limits.kernel_inodes as u64, 0),
        ]
    }

    /// Ask `lease` every lease question from now on.
    fn set_authority(&mut self, mut lease: Box<dyn LeaseAuthority>) {
        lease.set_wake(self.wake.clone());
        self.lease = lease;
    }

    /// The process behind a request's thread id (cached unless `fresh`).
    fn proc(&mut self, tid: u32, fresh: bool) -> Option<Proc> {
        self.lease.views().proc(tid, fresh)
    }

    /// `tid` observed the regular file `ino` at its current version.
    fn observe(&mut self, tid: u32, ino: Ino) {
        let Some(p) = self.proc(tid, false) else {
            return;
        };
        self.observe_as(p, ino);
    }

    /// The process `p` observed the regular file `ino` at its current version.
    fn observe_as(&mut self, p: Proc, ino: Ino) {
        let Ok(i) = self.ns.get(ino) else { return };
        if i.kind == Kind::File {
            let version = i.version;
            self.lease.views().observe(p, ino, version);
        }
    }

    /// Refuse with `ESTALE` when `tid` acts on an older view of the file at
    /// `ino` (SPEC 6; `content_counts` for a rename over, not for unlink).
    fn check_current(&mut self, tid: u32, ino: Ino, content_counts: bool, what: &str) -> Result<()> {
        let Ok(i) = self.ns.get(ino) else {
            return Ok(());
        };
        if i.kind != Kind::File {
            return Ok(());
        }
        let version = i.version;
        let verdict = self.lease.views().check(tid, ino, version, content_counts);
        verdict.map_err(|v| {
            debug!(path = %self.path_for_log(ino), pid = v.pid, ino = ino.0, seen = v.seen, current = v.current, epoch = self.lease.epoch(ino).0, op = what, "compare-and-swap rejected: stale view");
            self.metrics.cas_rejections += 1;
            let mut ev = crate::events::Event::new(crate::events::Kind::CasReject, String::new(), self.lease.epoch(ino).0);
            ev.pid = Some(v.pid);
            ev.reason = Some(what.to_string());
            self.emit(ev, ino);
            Error::Stale
        })
    }

    /// The name leading to `ino` was re-pointed at it again (same inode):
    /// earlier observers of the name hold a stale view.
    fn repoint(&mut self, ino: Ino) {
        if let Ok(i) = self.ns.get(ino) {
            let version = i.version;
            self.lease.views().repoint(ino, version);
        }
    }

    /// The name now pointing at `new` pointed at `old` before.
    fn succeed(&mut self, old: Ino, new: Ino) {
        self.lease.views().succeed(old, new);
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
    /// out (SPEC 5).
    fn reserve(&mut self, ino: Ino) -> Result<()> {
        let need = self.lease.epoch(ino).0 + 1;
        self.lease.floors().reserve(need)
    }

    /// Lease settings of `ino` for the durable store.
    fn extra(&self, ino: Ino) -> crate::store::snapshot::Extra {
        extra_of(&*self.lease, ino)
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
    fn append_changes(&mut self) -> Result<Option<crate::store::storage::Syncer>> {
        self.finish_compaction(false);
        let Some(store) = self.store.as_ref() else {
            return Ok(None);
        };
        if store.failed() {
            return Err(Error::Io);
        }
        let (dirty, freed) = self.ns.dirty();
        if dirty.is_empty() && freed.is_empty() {
            return Ok(None);
        }
        let batch = crate::store::snapshot::encode_changes(&self.ns, |ino| self.extra(ino));
        let store = self.store.as_mut().expect("checked above");
        let sync = match store.append(&batch) {
            Ok(sync) => sync,
            Err(e) => return Err(if e.raw_os_error() == Some(libc::ENOSPC) { Error::NoSpace } else { Error::Io }),
        };
        self.ns.clear_dirty();
        let live = self.live_bytes();
        let store = self.store.as_ref().expect("checked above");
        if !store.compacting() && store.wants_snapshot_for(|| live) {
            self.start_compaction();
        }
        Ok(Some(sync))
    }

    /// An estimate of the bytes a snapshot of the namespace would take now
    /// (the threshold the flush applies to a snapshot much larger than it).
    fn live_bytes(&self) -> u64 {
        self.ns.usage().pages * PAGE as u64 + self.ns.len() as u64 * 128
    }

    /// The live state the state directory is bounded by: contents (in
    /// pages), extended attributes, and 256 bytes for each inode (its
    /// record and its name; a snapshot takes ~220 bytes for a small file
    /// with a short name, at most about three times that with the longest
    /// names).
    pub(crate) fn live_state(&self) -> u64 {
        self.ns.usage().bytes() + self.ns.len() as u64 * 256
    }

    /// True when the state directory holds far more than the live state:
    /// large files were removed, or churn left a journal of what no longer
    /// exists, and nothing appended since made a flush look at it (an
    /// `fsync`, a write-back). Past 4 x the live state + 2 MiB it is
    /// compacted, to about one snapshot (at most ~3 x the live state, so a
    /// compaction never retriggers itself) and a short journal: within 6 x
    /// live + 4 MiB a few seconds after the last change (SPEC 9).
    fn outgrown(&self) -> bool {
        let Some(store) = self.store.as_ref() else { return false };
        if self.compaction.is_some() || store.compacting() || store.failed() {
            return false;
        }
        let (dirty, freed) = self.ns.dirty();
        if dirty.is_empty() && freed.is_empty() && !store.changed_since_snapshot() {
            return false;
        }
        let disk = store.snapshot_bytes() + store.journal_bytes();
        disk > self.live_state().saturating_mul(4).saturating_add(2 * store.snapshot_min)
    }

    /// Fold the journal into a snapshot: the image is encoded a slice at a
    /// time by the lease timer ([`State::compaction_step`]), then written,
    /// synced and renamed on a thread of its own while requests (and
    /// journal appends) go on; [`State::finish_compaction`] then starts the
    /// new journal. Backends without a second handle write it in line.
    fn start_compaction(&mut self) {
        use crate::store::snapshot::{encode_streamed, Slices};
        let Some(store) = self.store.as_mut() else { return };
        if store.fork_storage().is_none() {
            let (head, ns, lease) = (store.head(), &self.ns, &*self.lease);
            // Failures are logged by the store; a full disk postpones it.
            let _ = store.snapshot_streamed(|out| encode_streamed(head, ns, |ino| extra_of(lease, ino), out));
            return;
        }
        let Some(head) = store.begin_snapshot() else { return };
        self.compaction = Some(Compaction::Encoding(Slices::new(head, &self.ns)));
        // The timer encodes the slices.
        self.wake.wake();
    }

    /// What a compaction in progress is doing, for `status`.
    fn compaction_phase(&self) -> Option<&'static str> {
        self.compaction.as_ref().map(Compaction::phase)
    }

    /// True while a snapshot image is being encoded: the lease timer calls
    /// [`State::compaction_step`] once the namespace is all in the journal.
    fn encoding(&self) -> bool {
        matches!(self.compaction, Some(Compaction::Encoding(_)))
    }

    /// Encode the next slice of the snapshot image (the caller appended
    /// every change to the journal first: see [`Slices`]); once the image
    /// is whole, write it on a thread of its own.
    fn compaction_step(&mut self) {
        debug_assert!(self.ns.dirty().0.is_empty() && self.ns.dirty().1.is_empty());
        let Some(Compaction::Encoding(slices)) = &mut self.compaction else { return };
        let lease = &*self.lease;
        if !slices.step(&self.ns, |ino| extra_of(lease, ino), self.slice) {
            return;
        }
        let Some(Compaction::Encoding(slices)) = self.compaction.take() else { unreachable!("matched above") };
        let img = slices.finish(&self.ns);
        let Some(store) = self.store.as_mut() else { return };
        let Some(mut storage) = store.fork_storage() else {
            store.abandon_snapshot();
            return;
        };
        let job = store.snapshot_job(img);
        let wake = self.wake.clone();
        let spawned = std::thread::Builder::new().name("snapshot".into()).spawn(move || {
            // Background work: requests come first when the CPUs are busy.
            // SAFETY: setpriority on this thread's own id.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
            }
            let written = crate::store::snapshot::write_snapshot(&mut *storage, &job);
            // The timer finishes the compaction.
            wake.wake();
            written
        });
        match spawned {
            Ok(t) => self.compaction = Some(Compaction::Writing(t)),
            Err(e) => {
                tracing::warn!("cannot start the snapshot thread: {e}; compaction postponed");
                store.abandon_snapshot();
            }
        }
    }

    /// Finish a snapshot written off the request path once it is written
    /// (`wait`: block until it is; an image still being encoded is
    /// dropped).
    fn finish_compaction(&mut self, wait: bool) {
        match &self.compaction {
            Some(Compaction::Writing(t)) if wait || t.is_finished() => {}
            Some(Compaction::Encoding(_)) if wait => {
                self.compaction = None;
                if let Some(store) = self.store.as_mut() {
                    store.abandon_snapshot();
                }
                return;
            }
            _ => return,
        }
        let Some(Compaction::Writing(t)) = self.compaction.take() else { unreachable!("matched above") };
        let written = t.join().unwrap_or_else(|_| Err(std::io::Error::from_raw_os_error(libc::EIO)));
        if let Some(store) = self.store.as_mut() {
            // Failures are logged by the store.
            let _ = store.finish_snapshot(written);
        }
    }

    /// Count what the lease core decided (grants, waits, breaks).
    fn account(&mut self, effects: &[Effect]) {
        let now = self.lease.now();
        for e in effects {
            match e {
                Effect::Grant(id) => {
                    self.metrics.acquisitions += 1;
                    if let Some(t) = self.parked_at.remove(id) {
                        self.metrics.waited(now.saturating_sub(t) as f64 / 1000.0);
                    }
                    if let Some((ino, req)) = self.parked_req.remove(id) {
                        let ev = Self::lock_event(crate::events::Kind::Grant, &req, self.lease.epoch(ino));
                        self.emit(ev, ino);
                    }
                }
                Effect::Refuse(id, err) => {
                    self.parked_at.remove(id);
                    if let Some((ino, req)) = self.parked_req.remove(id) {
                        let mut ev = Self::lock_event(crate::events::Kind::Cancel, &req, self.lease.epoch(ino));
                        ev.reason = Some(if *err == Error::Interrupted { "signal".into() } else { format!("{err}") });
                        self.emit(ev, ino);
                    }
                }
                Effect::Expired(ino, epoch, pid) => {
                    let mut ev = crate::events::Event::new(crate::events::Kind::Expire, String::new(), epoch.0);
                    ev.pid = Some(*pid);
                    self.emit(ev, *ino);
                }
                Effect::Broken(ino, f) => {
                    self.metrics.breaks += 1;
                    let mut ev = crate::events::Event::new(crate::events::Kind::Break, String::new(), f.epoch.0);
                    ev.pid = Some(f.pid);
                    ev.reason = Some(self.lease.break_reason(*ino, f).unwrap_or(self.breaking).to_string());
                    self.emit(ev, *ino);
                }
                Effect::Epoch(..) => {}
            }
        }
    }

    /// Milliseconds on the lease clock; also advances the lease table's clock.
    fn clock(&mut self) -> u64 {
        self.lease.now()
    }

    /// The calling process and its ancestors (who acts for a holder).
    fn lineage(&mut self, tid: u32) -> Vec<u32> {
        self.lease.views().lineage(tid)
    }

    /// A fenced holder's operation was refused.
    fn emit_fence(&mut self, ino: Ino, pid: u32, epoch: Epoch, what: &str) {
        let mut ev = crate::events::Event::new(crate::events::Kind::Fence, String::new(), epoch.0);
        ev.pid = Some(pid);
        ev.reason = Some(what.to_string());
        self.emit(ev, ino);
    }

    /// Refuse with `ESTALE` when the process was fenced off this lease.
    fn check_fenced_pid(&mut self, tid: u32, ino: Ino, what: &str) -> Result<()> {
        if !self.lease.has_fenced(ino) {
            return Ok(());
        }
        let pids = self.lineage(tid);
        if let Some(f) = self.lease.fenced_pid(ino, &pids) {
            debug!(path = %self.path_for_log(ino), pid = f.pid, ino = ino.0, held = f.epoch.0, current = self.lease.epoch(ino).0, op = what, "fenced");
            self.metrics.fenced_operations += 1;
            self.emit_fence(ino, f.pid, f.epoch, what);
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
        let e = self.lease.epoch(ino);
        self.lease.floors().remember(path, e);
    }

    /// The lowest epoch an inode newly named by `path` may carry.
    fn path_floor(&self, path: Option<&PathBuf>) -> Epoch {
        self.lease.floors_ref().floor(path)
    }

    /// Never let an inode named by `path` carry a lower epoch than the path did.
    fn floor_epoch(&mut self, path: Option<&PathBuf>, ino: Ino) {
        let floor = self.path_floor(path);
        if floor.0 > 0 {
            self.lease.raise_epoch(ino, floor);
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
            self.lease.forget(ino);
            self.tmpfiles.remove(&ino);
        }
        let ns = &self.ns;
        self.lease.retain_detached(&mut |i| ns.get(i).is_ok());
    }

    /// Bring a shared namespace up to `target` (from its barrier): every
    /// change other hosts committed before the barrier was asked; when its
    /// store cannot be reached, reads answer from the table as it is
    /// (SPEC 10).
    fn catch_up_to(&mut self, target: Result<i64>) {
        let Some(r) = self.replica.as_mut() else { return };
        match r.catch_up_to(&mut self.ns, target) {
            Ok(c) => self.caught(c),
            Err(e) => tracing::debug!("answering from the local copy of the namespace: {e:?}"),
        }
    }

    /// Undo what a change that did not land opened and made: its handles
    /// and the references it handed to the kernel (which never heard of
    /// either).
    fn let_go(&mut self, opened: Vec<Handle>, referenced: Vec<Ino>) {
        for h in opened {
            if let Some(f) = self.handles.remove(&h) {
                let _ = self.lease.release_handle(f.ino, h.0, None);
                if let Ok(i) = self.ns.get_mut(f.ino) {
                    i.opens = i.opens.saturating_sub(1);
                }
            }
        }
        for ino in referenced {
            self.ns.forget(ino, 1);
            self.collect(ino);
        }
    }

    /// Lease settings and names another host changed.
    fn caught(&mut self, c: crate::namespace::replica::Caught) {
        for (ino, x) in c.extras {
            if self.lease.lease(ino).and_then(|l| l.ttl()) != x.ttl_ms {
                // Effects of a changed TTL reach waiters at the next tick.
                let _ = self.lease.set_ttl(ino, x.ttl_ms);
            }
            match x.guard {
                Some(g) if self.lease.guard(ino).as_ref() != Some(&g) => self.lease.set_guard(ino, g),
                Some(_) => {}
                None => {
                    self.lease.remove_guard(ino);
                }
            }
        }
        for (dir, name, ino) in c.removed_names {
            if let Some(p) = self.path_of(dir, &name) {
                self.lease.views().name_removed(p, ino);
            }
        }
        for (dir, name, ino) in c.added_names {
            if let Some(old) = self.path_of(dir, &name).and_then(|p| self.lease.views().take_removed(&p)) {
                if old != ino {
                    self.succeed(old, ino);
                }
            }
        }
        for ino in c.unlinked {
            self.collect(ino);
        }
    }

    /// True when `ino` or anything below it is a live lease.
    fn holds_live_lease(&self, ino: Ino) -> bool {
        if self.lease.is_live(ino) {
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
    group: crate::store::group::GroupCommit,
    /// A shared namespace's read barrier, asked without the state lock.
    barrier: std::sync::OnceLock<Arc<dyn crate::namespace::replica::Barrier>>,
    /// A shared namespace's changes on this host, one at a time (each is
    /// decided, stored and settled before the next is decided; the state
    /// lock is not held while one is stored). Nothing is serialized
    /// across hosts.
    changing: Mutex<()>,
    /// A change on its way to the shared store settled.
    settled: parking_lot::Condvar,
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
    /// A filesystem whose leases carry `ttl_ms` unless a file sets its own.
    pub fn with_lease_ttl(uid: u32, gid: u32, ttl_ms: Option<u64>) -> Fs {
        let fs = Fs::new(uid, gid);
        fs.state.lock().set_authority(Box::new(LocalAuthority::new(ttl_ms)));
        fs
    }

    /// A filesystem whose lease questions `lease` answers (the etcd backend).
    pub fn with_authority(uid: u32, gid: u32, lease: Box<dyn LeaseAuthority>) -> Fs {
        let fs = Fs::new(uid, gid);
        fs.state.lock().set_authority(lease);
        fs
    }

    /// A filesystem with an empty root owned by `uid:gid` (mode 0755).
    pub fn new(uid: u32, gid: u32) -> Fs {
        let fs = Fs {
            state: Mutex::new(State {
                ns: Namespace::new(0o755, uid, gid, now()),
                handles: HashMap::new(),
                next_handle: 1,
                lease: Box::new(LocalAuthority::new(None)),
                invalidate: Vec::new(),
                pending_renames: PendingRenames::default(),
                entry_deadlines: EntryDeadlines::default(),
                kernel: KernelCache::default(),
                names_cached: true,
                tmpfiles: std::collections::HashSet::new(),
                metrics: Metrics::default(),
                parked_at: HashMap::new(),
                mount_point: PathBuf::new(),
                mount_source: String::new(),
                shared: false,
                metrics_addr: None,
                store: None,
                volatile: false,
                compaction: None,
                slice: SLICE,
                wake: Wake::default(),
                limits: limits::Limits::default(),
                hits: limits::Hits::default(),
                events: crate::events::Hub::default(),
                parked_req: HashMap::new(),
                breaking: "ttl",
                comms: HashMap::new(),
                replica: None,
                max_file: crate::namespace::MAX_FILE_SIZE,
                conditions: Vec::new(),
                referenced_now: None,
                opened_now: None,
                in_flight: std::collections::HashSet::new(),
                in_flight_names: std::collections::HashSet::new(),
                handlers: None,
            }),
            group: crate::store::group::GroupCommit::default(),
            barrier: std::sync::OnceLock::new(),
            changing: Mutex::new(()),
            settled: parking_lot::Condvar::new(),
        };
        let wake = fs.state.lock().wake.clone();
        fs.state.lock().lease.set_wake(wake);
        fs
    }

    /// The state, after catching up with the other hosts of a shared
    /// namespace: for every operation that reads names, attributes or
    /// contents of `inos`. The store is asked without the state lock, and
    /// a reader of an inode whose change is on its way to the store waits
    /// until that change is stored or undone (it never sees a change that
    /// may not land).
    fn fresh(&self, inos: &[Ino]) -> parking_lot::MutexGuard<'_, State> {
        self.fresh_unless(|st| inos.iter().any(|i| st.in_flight.contains(i)))
    }

    /// As [`Fs::fresh`], for a listing of directory `dir`: it waits for
    /// changes of the directory's names.
    fn fresh_listing(&self, dir: Ino) -> parking_lot::MutexGuard<'_, State> {
        self.fresh_unless(|st| st.in_flight_names.iter().any(|(d, _)| *d == dir))
    }

    /// As [`Fs::fresh`], for a lookup of `name` in `dir`: it waits for a
    /// change of that name or of the inode it leads to, not of other names
    /// of the directory.
    fn fresh_name(&self, dir: Ino, name: &OsStr) -> parking_lot::MutexGuard<'_, State> {
        self.fresh_unless(|st| {
            (!st.in_flight.is_empty() || !st.in_flight_names.is_empty())
                && (st.in_flight_names.contains(&(dir, name.to_owned()))
                    || st.ns.child(dir, name).is_ok_and(|c| st.in_flight.contains(&c)))
        })
    }

    /// The state caught up, once `waits` says nothing the caller reads is
    /// on its way to the store. After a wait it catches up again: a change
    /// that did not land leaves the table to be brought up to the target
    /// (another host's change that won may have been held back meanwhile).
    fn fresh_unless(&self, waits: impl Fn(&State) -> bool) -> parking_lot::MutexGuard<'_, State> {
        let target = self.barrier.get().map(|b| b.target());
        let mut st = self.state.lock();
        let Some(target) = target else { return st };
        loop {
            st.catch_up_to(target);
            if !waits(&st) {
                return st;
            }
            while waits(&st) {
                self.settled.wait(&mut st);
            }
        }
    }

    /// Run `op`, which changes the namespace. On a shared namespace it runs
    /// on a table caught up with every other host, and its change is stored
    /// before its caller is answered (`EIO` when it could not be; the change
    /// is then undone). When another host changed what `op` decided on
    /// first, nothing was stored: what `op` opened and made is let go, and
    /// `op` runs again on the fresh copy (at most [`CONFLICT_TRIES`] times),
    /// so it answers as if it had come after the other host's change.
    ///
    /// The state lock is not held while etcd is asked (the barrier of a
    /// retry, the check of an answer that stores nothing, the store step):
    /// other requests are served meanwhile; this host's changes wait for
    /// each other ([`Fs::changing`]).
    fn change<T>(&self, mut op: impl FnMut(&mut State) -> Result<T>) -> Result<T> {
        let Some(barrier) = self.barrier.get() else {
            let mut st = self.state.lock();
            let out = op(&mut st);
            self.write_back(&mut st);
            return out;
        };
        let _one_at_a_time = self.changing.lock();
        let mut tries = 0;
        loop {
            tries += 1;
            // The first attempt is decided on what this host knows (its
            // watch applied): what it stores is compared anyway.
            let fresh = tries > 1;
            let target = fresh.then(|| barrier.target_now());
            let mut st = self.state.lock();
            let Some(mut r) = st.replica.take() else { return Err(Error::Unreachable) };
            let c = match r.begin(&mut st.ns, target) {
                Ok(c) => c,
                Err(e) => {
                    st.replica = Some(r);
                    return Err(e);
                }
            };
            st.caught(c);
            st.referenced_now = Some(Vec::new());
            st.opened_now = Some(Vec::new());
            let out = op(&mut st);
            let referenced = st.referenced_now.take().unwrap_or_default();
            let opened = st.opened_now.take().unwrap_or_default();
            let (dirty, freed) = st.ns.dirty();
            if !fresh && dirty.is_empty() && freed.is_empty() && st.conditions.is_empty() {
                // Nothing to store, so nothing compared: an answer that
                // changes nothing (an error, an existing file opened) stands
                // only if the namespace had not moved on before the call.
                let before = r.applied();
                st.replica = Some(r);
                drop(st);
                let target = barrier.target_now();
                let mut st = self.state.lock();
                let Some(mut r) = st.replica.take() else { return Err(Error::Unreachable) };
                let caught = r.catch_up_to(&mut st.ns, target);
                let moved = r.applied() != before;
                st.replica = Some(r);
                match caught {
                    Ok(c) if !moved => {
                        st.caught(c);
                        return out;
                    }
                    Ok(c) => {
                        st.let_go(opened, referenced);
                        st.caught(c);
                        continue;
                    }
                    Err(e) => {
                        st.let_go(opened, referenced);
                        return Err(e);
                    }
                }
            }
            // Readers wait for the files and names the change touches. A
            // directory's own attributes (times, link count) are not waited
            // for: every lookup walks through them.
            let mut in_flight = std::collections::HashSet::new();
            let mut in_flight_names = std::collections::HashSet::new();
            for &ino in dirty.iter().chain(freed.iter()) {
                match st.ns.get(ino).map(|i| &i.body) {
                    Ok(Body::Dir(d)) => in_flight_names.extend(d.dirty_names().map(|n| (ino, n.clone()))),
                    _ => {
                        in_flight.insert(ino);
                    }
                }
            }
            let conditions = std::mem::take(&mut st.conditions);
            let st_ref = &mut *st;
            let lease = &*st_ref.lease;
            let prepared = r.prepare(&mut st_ref.ns, &|ino| extra_of(lease, ino), &conditions);
            let mut publication = match prepared {
                Ok(Some(p)) => p,
                Ok(None) => {
                    st.replica = Some(r);
                    return out;
                }
                Err(e) => {
                    st.let_go(opened, referenced);
                    st.replica = Some(r);
                    return Err(e);
                }
            };
            st.in_flight = in_flight;
            st.in_flight_names = in_flight_names;
            st.replica = Some(r);
            drop(st);
            if !conditions.is_empty() {
                crate::store::snapshot::pausepoint("guarded-publish");
            }
            if tries == 1 {
                crate::store::snapshot::pausepoint("publish");
            }
            publication.send();
            let mut st = self.state.lock();
            st.in_flight.clear();
            st.in_flight_names.clear();
            self.settled.notify_all();
            let Some(mut r) = st.replica.take() else { return Err(Error::Unreachable) };
            let published = r.settle(&mut st.ns, publication);
            st.replica = Some(r);
            match (out, published) {
                (Ok(v), Ok(())) => return Ok(v),
                (_, Err(Error::Conflict)) if tries < CONFLICT_TRIES => st.let_go(opened, referenced),
                (_, Err(e)) => {
                    st.let_go(opened, referenced);
                    return Err(e);
                }
                (Err(e), Ok(())) => return Err(e),
            }
        }
    }

    /// Changes without a sync are appended to the journal once
    /// [`WRITEBACK`] inodes have changed (their sync runs on the
    /// group-commit thread, answering nobody), so no `fsync` has to encode
    /// and append more than that while it holds the state lock: an `fsync`
    /// after a million leases created without one would stop every request
    /// for seconds. A failure here is met again, and reported, by the next
    /// `fsync`.
    fn write_back(&self, st: &mut State) {
        let (dirty, freed) = st.ns.dirty();
        if st.store.is_none() || dirty.len() + freed.len() < WRITEBACK {
            return;
        }
        let _ = self.append_unsynced(st);
    }

    /// Append what changed since the last flush to the journal; its sync
    /// runs on the group-commit thread and answers nobody, so no disk sync
    /// lands on the request path.
    fn append_unsynced(&self, st: &mut State) -> Result<()> {
        let (dirty, freed) = st.ns.dirty();
        if dirty.is_empty() && freed.is_empty() {
            return Ok(());
        }
        let sync = st.append_changes()?;
        let failed = st.store.as_ref().map(|s| s.fail_flag()).unwrap_or_default();
        self.group.submit(sync, &failed, Box::new(|_| {}));
        Ok(())
    }

    /// On a shared namespace, `check` before the change asks etcd anything:
    /// a refusal that needs no other host (a fenced holder) is answered
    /// even while the shared store cannot be reached.
    fn precheck(&self, check: impl FnOnce(&mut State) -> Result<()>) -> Result<()> {
        let mut st = self.state.lock();
        if st.replica.is_some() {
            check(&mut st)?;
        }
        Ok(())
    }

    /// Share the namespace through `replica`: the table is replaced by the
    /// shared namespace as it is now.
    pub fn set_replica(&self, mut replica: Box<dyn crate::namespace::replica::Replica>) -> Result<()> {
        let _ = self.barrier.set(replica.barrier());
        let mut st = self.state.lock();
        st.ns.set_tracking();
        let c = replica.catch_up(&mut st.ns)?;
        st.caught(c);
        st.max_file = replica.max_file_size();
        st.replica = Some(replica);
        st.names_cached = false;
        Ok(())
    }

    /// Start the pool that runs request handlers of a shared mount
    /// ([`HANDLER_THREADS`] threads, at most [`HANDLERS_HELD`] requests
    /// queued or running); `status` shows it.
    pub fn start_handlers(&self) -> std::io::Result<crate::fuse::workers::Workers> {
        let w = crate::fuse::workers::Workers::start(HANDLER_THREADS, HANDLERS_HELD)?;
        self.state.lock().handlers = Some(w.clone());
        Ok(w)
    }

    /// True when the namespace is shared with other hosts (the kernel must
    /// then cache nothing: another host's change could not reach it in time).
    pub fn is_shared(&self) -> bool {
        self.state.lock().replica.is_some()
    }

    /// Bound what callers may make the daemon keep.
    pub fn set_limits(&self, l: limits::Limits, locks: crate::lease::machine::LockLimits) {
        let mut st = self.state.lock();
        st.limits = l;
        st.lease.set_lock_limits(locks);
    }

    /// The bounds in force.
    pub fn limits(&self) -> (limits::Limits, crate::lease::machine::LockLimits) {
        let st = self.state.lock();
        (st.limits, st.lease.lock_limits())
    }

    /// What wakes the lease timer before its deadline.
    pub fn wake(&self) -> Wake {
        self.state.lock().wake.clone()
    }

    /// Keep epochs durable in `journal`; `ceiling` is the recovered one,
    /// above which every path resumes.
    pub fn set_journal(&self, journal: crate::store::epochs::EpochJournal, ceiling: u64) {
        let mut st = self.state.lock();
        st.lease.floors().set_journal(journal, ceiling);
    }

    /// Keep the namespace durable in `store`, starting from what it
    /// recovered. Call after [`Fs::set_journal`], so restored leases start
    /// at their path's epoch floor.
    pub fn set_store(&self, store: crate::store::snapshot::Store, rec: crate::store::snapshot::Recovered) {
        let mut st = self.state.lock();
        let root = st.ns.get(Ino::ROOT).map(|r| (r.perm, r.uid, r.gid)).unwrap_or((0o755, 0, 0));
        let fresh = std::mem::replace(&mut st.ns, Namespace::new(root.0, root.1, root.2, now()));
        st.ns = Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, fresh);
        for (ino, x) in rec.extras {
            if st.ns.get(ino).is_err() {
                continue;
            }
            if let Some(t) = x.ttl_ms {
                st.lease.set_ttl(ino, Some(t));
            }
            if let Some(g) = x.guard {
                st.lease.set_guard(ino, g);
            }
        }
        // Restored files resume above the recovered epoch ceiling: any epoch
        // up to it may have been handed out before the restart.
        let floor = st.lease.floors().new_path_floor();
        st.lease.raise_all(floor);
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
    pub fn sync_then(&self, done: crate::store::group::Done) {
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

    /// Clean unmount: fold everything into a snapshot. Changes never
    /// synced (at most [`WRITEBACK`] inodes) are flushed to the journal
    /// first, so a crash during the snapshot keeps them too. Nothing is
    /// written when nothing changed since the last snapshot.
    pub fn shutdown(&self) {
        self.group.stop();
        let mut st = self.state.lock();
        st.lease.shutdown();
        st.finish_compaction(true);
        let Some(store) = st.store.as_ref() else { return };
        let (dirty, freed) = st.ns.dirty();
        let pending = dirty.len() + freed.len();
        if pending == 0 && !store.changed_since_snapshot() {
            tracing::info!("nothing changed since the last snapshot");
            return;
        }
        if let Err(e) = st.flush() {
            tracing::error!("final flush failed: {e:?}");
            return;
        }
        let started = std::time::Instant::now();
        // Streamed to the file as it is encoded (see `encode_streamed`).
        let st = &mut *st;
        let (store, ns, lease) = (st.store.as_mut().expect("checked above"), &st.ns, &*st.lease);
        let head = store.head();
        let written = store.snapshot_streamed(|out| {
            crate::store::snapshot::encode_streamed(head, ns, |ino| extra_of(lease, ino), out)
        });
        let bytes = store.snapshot_bytes();
        match written {
            Ok(()) => tracing::info!(bytes, ms = started.elapsed().as_millis() as u64, "snapshot written"),
            Err(e) => tracing::error!("snapshot at unmount failed: {e}"),
        }
    }

    /// A file's path for debug logs (empty unless debug logging is on).
    pub fn describe(&self, ino: Ino) -> String {
        self.state.lock().path_for_log(ino)
    }

    /// Record where the filesystem is mounted (for `.leasefs/status`).
    /// Record where `/metrics` is served (for `.leasefs/status`).
    pub fn set_metrics_addr(&self, addr: String) {
        self.state.lock().metrics_addr = Some(addr);
    }

    pub fn set_mount_point(&self, p: PathBuf, source: &str, shared: bool) {
        let mut st = self.state.lock();
        st.mount_point = p;
        st.mount_source = source.to_string();
        st.shared = shared;
    }

    /// Replace how thread ids map to processes (tests).
    pub fn set_proc_resolver(&self, resolve: fn(u32) -> Option<Proc>) {
        let mut st = self.state.lock();
        st.lease.views().set_resolver(resolve);
    }
}

/// Return free heap memory to the system.
/// Lease settings of `ino` for the durable store.
fn extra_of(lease: &dyn LeaseAuthority, ino: Ino) -> crate::store::snapshot::Extra {
    crate::store::snapshot::Extra { ttl_ms: lease.lease(ino).and_then(|l| l.ttl()), guard: lease.guard(ino) }
}

/// Changed inodes (and dropped ones) that are appended to the journal
/// without waiting for an `fsync` (a millisecond or two of encoding under
/// the state lock; 2 048 took up to 17 ms, traced, when each also
/// re-encoded a directory).
const WRITEBACK: usize = 1024;

/// How long one slice of a snapshot image holds the state lock.
const SLICE: std::time::Duration = std::time::Duration::from_millis(2);

/// A compaction in progress.
enum Compaction {
    /// The image, encoded a slice at a time between requests.
    Encoding(crate::store::snapshot::Slices),
    /// The image is being written by this thread.
    Writing(std::thread::JoinHandle<std::io::Result<crate::store::snapshot::SnapshotWritten>>),
}

impl Compaction {
    fn phase(&self) -> &'static str {
        match self {
            Compaction::Encoding(_) => "encoding",
            Compaction::Writing(_) => "writing",
        }
    }
}

impl std::fmt::Debug for Compaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.phase())
    }
}

/// Have the allocator map buffers of a MiB or more on their own (journal
/// batches and snapshot images as large as the namespace, the sets and
/// tables of a million leases): they go back to the system when freed and
/// grow by remapping, not copying, so neither a trim nor a copy of one runs
/// under the state lock. Without this, glibc raises its threshold to the
/// largest buffer freed so far (up to 32 MiB) and serves later ones from
/// the heap.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

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
        "comm": std::fs::read_to_string(format!("/proc/{}/comm", k.pid)).ok().map(|c| c.trim_end().to_string()),
        "kind": match k.kind { crate::lease::LockKind::Flock => "flock", crate::lease::LockKind::Posix => "posix" },
        "mode": match k.mode { crate::lease::Mode::Shared => "shared", crate::lease::Mode::Exclusive => "exclusive" },
        "start": k.range.start,
        "end": k.range.end,
        "since_ms_ago": now.saturating_sub(k.since),
    })
}

/// `user.leasefs.holder`: the holders as JSON.
fn holder_json(locks: &dyn LeaseAuthority, ino: Ino, now: u64) -> String {
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
mod tests;
