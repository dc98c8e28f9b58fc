//! Filesystem operations over the namespace, callable without the kernel.
//!
//! Every method takes the caller's identity and returns `Result<_, Error>`;
//! the FUSE adapter only decodes requests and encodes replies. Permission
//! checks are the kernel's (`default_permissions`) on a single host and the
//! daemon's on a shared namespace (see `fs/access.rs`); this layer also enforces
//! what the kernel cannot know: names, emptiness, types, ownership
//! inheritance.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;

use crate::control::{self, ControlFile, Metrics};
use crate::error::{Error, Result};
use crate::lease::arbitration::Arbitration;
use crate::lease::authority::{LeaseAuthority, Step, Wake};
use crate::lease::local::LocalAuthority;
use crate::lease::observe::Proc;
use crate::lease::rows::{HolderRow, LeaseRow};
use crate::lease::{Effect, Epoch, Lock, Outcome, Owner, Request, WaitId};
use crate::namespace::{check_name, Attr, Body, Ino, Kind, Namespace, NewInode, PAGE};
use tracing::debug;

mod access;
mod cache;
mod control_files;
mod durability;
pub use control_files::BREAK_ALL;
mod io;
pub mod limits;
pub use cache::FILE_ENTRY_TTL;
use cache::*;
pub use durability::tune_allocator;
use durability::*;
mod locks;
mod names;
mod shared;
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
    crate::procfs::in_supplementary_group(tid, file_gid)
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
    lease: LeaseAuthority,
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
    /// The daemon checks permissions, not the kernel (a shared namespace:
    /// see [`access`]).
    checks_access: bool,
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
        let c = crate::procfs::comm(pid)?;
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
    fn set_authority(&mut self, mut lease: LeaseAuthority) {
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
        fs.state.lock().set_authority(LeaseAuthority::single_host(LocalAuthority::new(ttl_ms)));
        fs
    }

    /// A filesystem whose leases are shared with other hosts through
    /// `arbitration` (the etcd backend), carrying `ttl_ms` unless a file
    /// sets its own.
    pub fn with_arbitration(uid: u32, gid: u32, ttl_ms: Option<u64>, arbitration: Box<dyn Arbitration>) -> Fs {
        let fs = Fs::new(uid, gid);
        fs.state.lock().set_authority(LeaseAuthority::shared(LocalAuthority::new(ttl_ms), arbitration));
        fs
    }

    /// A filesystem with an empty root owned by `uid:gid` (mode 0755).
    pub fn new(uid: u32, gid: u32) -> Fs {
        let fs = Fs {
            state: Mutex::new(State {
                ns: Namespace::new(0o755, uid, gid, now()),
                handles: HashMap::new(),
                next_handle: 1,
                lease: LeaseAuthority::single_host(LocalAuthority::new(None)),
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
                checks_access: false,
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

    /// Whether the kernel may cache names (not on a shared namespace:
    /// names change through other hosts' kernels too).
    pub fn names_cached(&self) -> bool {
        self.state.lock().names_cached
    }

    /// True when the namespace is shared with other hosts (the kernel must
    /// then cache nothing: another host's change could not reach it in time).
    pub fn is_shared(&self) -> bool {
        self.state.lock().replica.is_some()
    }

    /// True when the daemon checks permissions itself: mount without
    /// `default_permissions` (a shared namespace, see `fs/access.rs`).
    pub fn checks_access(&self) -> bool {
        self.state.lock().checks_access
    }

    /// Check permissions in the daemon from now on (tests of a single-host
    /// table; [`Fs::set_replica`] does it for a shared namespace).
    #[cfg(test)]
    pub(crate) fn check_access_here(&self) {
        self.state.lock().checks_access = true;
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
fn extra_of(lease: &LeaseAuthority, ino: Ino) -> crate::store::snapshot::Extra {
    crate::store::snapshot::Extra { ttl_ms: lease.lease(ino).and_then(|l| l.ttl()), guard: lease.guard(ino) }
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
/// `user.leasefs.holder`: the holders as JSON.
fn holder_json(locks: &LeaseAuthority, ino: Ino, now: u64) -> String {
    let holders: Vec<HolderRow> =
        locks.lease(ino).map(|l| l.locks().iter().map(|k| HolderRow::local(k, now)).collect()).unwrap_or_default();
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
