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
use crate::error::{Error, Result, Stale};
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
mod emit;
mod faults;
use emit::Reporting;
pub use faults::{FaultSeen, PowerCut};
mod leases;
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
use shared::Sharing;
mod types;
pub use config::{Keep, Serving, Setup};
pub use types::*;
mod config;
#[cfg(test)]
mod power_tests;
mod xattr;

/// How often a change of a shared namespace is decided again after losing
/// a race with another host before it fails (`EIO`).
const CONFLICT_TRIES: u32 = 16;

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
    /// Opened through the kernel's page cache ([`Fs::page_cache`]).
    paged: bool,
}

/// Everything the filesystem keeps, behind one lock, in named parts.
#[derive(Debug)]
struct State {
    ns: Namespace,
    /// Every lease question is asked here (SPEC 3 to 7).
    lease: LeaseAuthority,
    open: OpenFiles,
    /// What the kernel may cache, and what it must be told to drop.
    cache: KernelView,
    /// Events and metrics.
    report: Reporting,
    mount: MountInfo,
    /// The journal, snapshots and compaction (none of it on a volatile or
    /// shared mount).
    durable: Durable,
    /// What callers may make the daemon keep.
    bounds: limits::Bounds,
    /// A namespace shared with other hosts, and the change on its way.
    sharing: Sharing,
    /// Wakes the lease timer (the authority has effects to hand over, a
    /// snapshot was written).
    wake: Wake,
}

/// Open files. Invariant: every handle number is issued once
/// (`next_handle` only grows), and a tmpfile in `tmpfiles` is open.
#[derive(Debug)]
struct OpenFiles {
    handles: HashMap<Handle, OpenFile>,
    next_handle: u64,
    /// Handles below this were opened before a power cut: their release
    /// leaves the inodes' open counts (rebuilt by the cut) alone.
    cut_below: u64,
    /// Open `O_TMPFILE` files that were never linked: `link()` may give
    /// them their first name (the kernel allows it unless `O_EXCL`).
    tmpfiles: std::collections::HashSet<Ino>,
}

/// Where and how the filesystem is mounted, for `.leasefs/status`, and
/// who checks permissions. Set once by the daemon before it serves.
#[derive(Debug, Default)]
struct MountInfo {
    point: PathBuf,
    source: String,
    /// Other users may use the mount (`allow_other`).
    allow_other: bool,
    /// Where `/metrics` is served over HTTP, if it is.
    metrics_addr: Option<String>,
    /// The daemon checks permissions, not the kernel (a shared namespace:
    /// see [`access`]).
    checks_access: bool,
}

impl State {
    /// A new handle number, remembered by the change being decided.
    fn new_handle(&mut self) -> Handle {
        let h = Handle(self.open.next_handle);
        self.open.next_handle += 1;
        if let Some(now) = self.sharing.opened_now.as_mut() {
            now.push(h);
        }
        h
    }

    /// The kernel took a reference to `ino` (a lookup, create, mknod,
    /// symlink or link reply).
    fn referenced(&mut self, ino: Ino) {
        if let Some(now) = self.sharing.referenced_now.as_mut() {
            now.push(ino);
        }
        if self.ns.add_lookup(ino) {
            let bound = self.bounds.limits.kernel_inodes;
            if self.cache.refs.took(&self.ns, ino, bound, Instant::now()) {
                self.wake.wake();
            }
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
            self.open.tmpfiles.remove(&ino);
        }
        let ns = &self.ns;
        self.lease.table_mut().retain_detached(&mut |i| ns.get(i).is_ok());
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
    /// What the daemon serving the mount reports of itself (`status`,
    /// `/metrics`), once it serves.
    serving: std::sync::OnceLock<Arc<dyn config::Serving>>,
    /// The test bench: fault rules and the requests they hold (SPEC 13).
    bench: Arc<crate::bench::Bench>,
    /// The user the daemon runs as (who may set rules on a private mount).
    bench_owner: u32,
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
    pub fn new(uid: u32, gid: u32) -> Fs {
        let fs = Fs {
            state: Mutex::new(State {
                ns: Namespace::new(0o755, uid, gid, now()),
                lease: LeaseAuthority::single_host(LocalAuthority::new(None)),
                open: OpenFiles { handles: HashMap::new(), next_handle: 1, cut_below: 0, tmpfiles: Default::default() },
                cache: KernelView::default(),
                report: Reporting::default(),
                mount: MountInfo::default(),
                durable: Durable::default(),
                bounds: limits::Bounds::default(),
                sharing: Sharing::default(),
                wake: Wake::default(),
            }),
            group: crate::store::group::GroupCommit::default(),
            barrier: std::sync::OnceLock::new(),
            changing: Mutex::new(()),
            settled: parking_lot::Condvar::new(),
            serving: std::sync::OnceLock::new(),
            bench: crate::bench::Bench::new(false),
            // SAFETY: geteuid cannot fail.
            bench_owner: unsafe { libc::geteuid() },
        };
        let wake = fs.state.lock().wake.clone();
        fs.state.lock().lease.set_wake(wake);
        fs
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

#[cfg(test)]
mod tests;
