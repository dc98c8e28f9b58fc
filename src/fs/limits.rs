//! Bounds on everything a caller can make the daemon keep, so no user can
//! exhaust the process every lease on the host depends on.
//!
//! Contents and extended attributes count against `size` and inodes
//! against `inodes`, as tmpfs counts `size=` and `nr_inodes=`; the lock
//! table's bounds live in [`crate::lease::machine::LockLimits`]. Root
//! keeps a reserve of each ([`RESERVE_PERCENT`], like ext4's reserved
//! blocks), so `leasefs break`, reading `.leasefs/` and root's own leases
//! still work when users filled the mount. A refusal changes nothing; it is
//! counted per limit (metrics) and logged at most once a minute per limit.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::namespace::PAGE;

/// Share of each limit only root may use.
pub const RESERVE_PERCENT: u64 = 5;

/// Default `--size`: this share of the machine's memory.
pub const DEFAULT_SIZE_PERCENT: u64 = 10;

/// Open handles of control files (`.leasefs/`) allowed beyond `handles`.
pub const CONTROL_HANDLES: usize = 64;

/// Files whose inodes the kernel may keep cached by default (about 1 KiB
/// of kernel memory each, and what a clean unmount has to evict).
pub const DEFAULT_KERNEL_INODES: usize = 65_536;

/// The bounds of one mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of contents (stored 4 KiB pages) and extended attributes.
    pub size: u64,
    /// Inodes (files, directories, symlinks, the root).
    pub inodes: u64,
    /// Extended attributes per file.
    pub xattrs_per_file: usize,
    /// Bytes of extended attribute names and values per file.
    pub xattr_bytes_per_file: u64,
    /// Open file handles.
    pub handles: usize,
    /// Files the kernel may keep cached inodes of (see `KernelCache`).
    pub kernel_inodes: usize,
}

impl Limits {
    /// Defaults for a machine with `ram` bytes of memory: `size` 10 % of
    /// it, one inode per KiB of `size` (an idle lease costs under 1 KiB of
    /// memory, so the inode bound adds at most about `size` again).
    pub fn for_memory(ram: u64) -> Limits {
        let size = (ram / 100 * DEFAULT_SIZE_PERCENT).max(16 << 20);
        Limits::with_size(size)
    }

    /// Defaults around a given `size`.
    pub fn with_size(size: u64) -> Limits {
        Limits {
            size,
            inodes: (size / 1024).max(1024),
            xattrs_per_file: 128,
            xattr_bytes_per_file: 256 << 10,
            handles: 1 << 20,
            kernel_inodes: DEFAULT_KERNEL_INODES,
        }
    }

    /// This machine's defaults (memory from `/proc/meminfo`).
    pub fn for_this_machine() -> Limits {
        Limits::for_memory(memory_total().unwrap_or(4 << 30))
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::for_this_machine()
    }
}

use crate::procfs::memory_total;

/// `BYTES` with an optional `k`/`m`/`g`/`t` suffix (powers of 1024), or
/// `N%` of the machine's memory, as tmpfs's `size=` takes it.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    if let Some(p) = t.strip_suffix('%') {
        let p: u64 = p.parse().map_err(|_| format!("{text:?}: not a percentage"))?;
        if p == 0 || p > 100 {
            return Err(format!("{text:?}: a percentage from 1% to 100%"));
        }
        let ram = memory_total().ok_or("cannot read MemTotal from /proc/meminfo")?;
        return Ok(ram / 100 * p);
    }
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                _ => return Err(format!("{text:?}: unknown unit (k, m, g, t or %)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{text:?}: not a size"))?;
    let bytes = n.checked_mul(mult).ok_or_else(|| format!("{text:?}: too large"))?;
    if bytes < PAGE as u64 {
        return Err(format!("{text:?}: at least 4k"));
    }
    Ok(bytes)
}

/// Which bound a refusal hit (the `limit` label of the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    Size,
    Inodes,
    Xattrs,
    Handles,
    Locks,
}

impl Limit {
    pub const ALL: [Limit; 5] = [Limit::Size, Limit::Inodes, Limit::Xattrs, Limit::Handles, Limit::Locks];

    pub fn name(self) -> &'static str {
        match self {
            Limit::Size => "size",
            Limit::Inodes => "inodes",
            Limit::Xattrs => "xattrs",
            Limit::Handles => "handles",
            Limit::Locks => "locks",
        }
    }
}

/// Refusals per limit, and when each was last logged.
#[derive(Debug, Default)]
pub struct Hits {
    counts: [u64; 5],
    logged: [Option<Instant>; 5],
}

impl Hits {
    /// Count a refusal by `limit` (logged once a minute per limit) and
    /// return the error the caller sees.
    pub fn refuse(&mut self, limit: Limit, err: Error, detail: std::fmt::Arguments<'_>) -> Error {
        let i = Limit::ALL.iter().position(|l| *l == limit).expect("every limit is listed");
        self.counts[i] += 1;
        let due = self.logged[i].is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
        if due {
            self.logged[i] = Some(Instant::now());
            tracing::warn!(
                limit = limit.name(),
                refusals = self.counts[i],
                "limit reached: {detail} (logged once a minute)"
            );
        }
        err
    }

    /// Refusals by `limit` so far.
    pub fn count(&self, limit: Limit) -> u64 {
        let i = Limit::ALL.iter().position(|l| *l == limit).expect("every limit is listed");
        self.counts[i]
    }

    /// Add refusals counted elsewhere (the lock table).
    pub fn set_count(&mut self, limit: Limit, n: u64) {
        let i = Limit::ALL.iter().position(|l| *l == limit).expect("every limit is listed");
        self.counts[i] = n;
    }
}

/// What `uid` may use of a limit of `total`: root all of it, others all
/// but the reserve.
pub fn allowed(total: u64, uid: u32) -> u64 {
    if uid == 0 {
        total
    } else {
        total - (u128::from(total) * u128::from(RESERVE_PERCENT)).div_ceil(100) as u64
    }
}

/// Refuse with `ENOSPC` when `used + extra` exceeds what `uid` may use.
pub fn check(used: u64, extra: u64, total: u64, uid: u32) -> Result<()> {
    if extra > 0 && used.saturating_add(extra) > allowed(total, uid) {
        return Err(Error::NoSpace);
    }
    Ok(())
}

/// The bounds in force and the refusals they made.
#[derive(Debug)]
pub(super) struct Bounds {
    pub(super) limits: Limits,
    /// Refusals by each limit.
    pub(super) hits: Hits,
    /// Largest file size accepted (`EFBIG` beyond).
    pub(super) max_file: u64,
    /// Whether removed files only the kernel remembers are room (see
    /// [`super::State::let_go_of_removed`]); not on a shared namespace,
    /// whose changes store every inode they touch.
    pub(super) removed_are_room: bool,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            limits: Limits::default(),
            hits: Hits::default(),
            max_file: crate::namespace::MAX_FILE_SIZE,
            removed_are_room: true,
        }
    }
}

impl super::State {
    /// Refuse with `ENOSPC` unless `extra` more bytes fit in what `uid` may
    /// use, once removed files only the kernel still remembers have let go
    /// of their contents (see [`State::let_go_of_removed`]).
    pub(super) fn room_for_bytes(&mut self, uid: u32, extra: u64) -> Result<()> {
        let size = self.bounds.limits.size;
        if self.bounds.removed_are_room && check(self.ns.usage().bytes(), extra, size, uid).is_err() {
            self.let_go_of_removed();
        }
        let used = self.ns.usage().bytes();
        check(used, extra, size, uid).map_err(|e| {
            self.bounds.hits.refuse(
                Limit::Size,
                e,
                format_args!("{used} of {size} bytes used, {extra} more asked by uid {uid}"),
            )
        })
    }

    /// Refuse with `ENOSPC` unless `uid` may make one more inode (removed
    /// inodes only the kernel still remembers not counted).
    pub(super) fn room_for_inode(&mut self, uid: u32) -> Result<()> {
        let mut used = self.ns.len() as u64;
        if self.bounds.removed_are_room && check(used, 1, self.bounds.limits.inodes, uid).is_err() {
            used -= self.ns.forgettable().count() as u64;
        }
        check(used, 1, self.bounds.limits.inodes, uid).map_err(|e| {
            let max = self.bounds.limits.inodes;
            self.bounds.hits.refuse(
                Limit::Inodes,
                e,
                format_args!("{used} of {max} inodes used, one more asked by uid {uid}"),
            )
        })
    }

    /// Free the contents and extended attributes of removed files that no
    /// handle has open ([`crate::namespace::Namespace::forgettable`]): as
    /// on tmpfs, `rm` of a file nobody has open frees its room at once,
    /// though the daemon keeps the inode until the kernel's FORGET comes.
    /// Nothing can read them any more but a reopen through an `O_PATH`
    /// descriptor's `/proc/self/fd` link, which then finds the file empty.
    /// Run only when a change would not fit otherwise.
    pub(super) fn let_go_of_removed(&mut self) {
        let held: Vec<_> =
            self.ns.forgettable().filter(|i| crate::namespace::Usage::of(i).bytes() > 0).map(|i| i.ino).collect();
        for ino in held {
            let _ = self.ns.account(ino, |i| {
                i.xattrs.clear();
                match i.data_mut() {
                    Ok(d) => d.truncate(0),
                    Err(_) => Ok(()),
                }
            });
        }
    }

    /// Refuse with `ENFILE` when no more handles may be open (control
    /// files have a few more, so `.leasefs/` stays readable).
    pub(super) fn room_for_handle(&mut self, control: bool) -> Result<()> {
        let max = self.bounds.limits.handles + if control { CONTROL_HANDLES } else { 0 };
        if self.open.handles.len() >= max {
            let open = self.open.handles.len();
            return Err(self.bounds.hits.refuse(
                Limit::Handles,
                Error::TooManyOpen,
                format_args!("{open} handles open"),
            ));
        }
        Ok(())
    }

    /// Every bound with its use and refusals (status and metrics).
    pub(super) fn limit_rows(&self) -> Vec<crate::control::LimitRow> {
        use self::Limit;
        use crate::control::LimitRow;
        let (locks, waiters) = self.lease.lock_usage();
        let ll = self.lease.table().lock_limits();
        let row = |name, used, max, refused| LimitRow { name, used, max, refused };
        // Removed files only the kernel still remembers are free room.
        let (gone, gone_bytes) = match self.bounds.removed_are_room {
            true => self.ns.forgettable().fold((0, 0), |(n, b), i| (n + 1, b + crate::namespace::Usage::of(i).bytes())),
            false => (0, 0),
        };
        let (bytes, inodes) = (self.ns.usage().bytes() - gone_bytes, self.ns.len() as u64 - gone);
        vec![
            row("size", Some(bytes), self.bounds.limits.size, self.bounds.hits.count(Limit::Size)),
            row("inodes", Some(inodes), self.bounds.limits.inodes, self.bounds.hits.count(Limit::Inodes)),
            row(
                "handles",
                Some(self.open.handles.len() as u64),
                self.bounds.limits.handles as u64,
                self.bounds.hits.count(Limit::Handles),
            ),
            row(
                "xattrs_per_file",
                None,
                self.bounds.limits.xattrs_per_file as u64,
                self.bounds.hits.count(Limit::Xattrs),
            ),
            row("xattr_bytes_per_file", None, self.bounds.limits.xattr_bytes_per_file, 0),
            row("locks", Some(locks as u64), ll.locks_total as u64, self.bounds.hits.count(Limit::Locks)),
            row("ranges_per_owner", None, ll.ranges_per_owner as u64, 0),
            row("waiters", Some(waiters as u64), ll.waiters_total as u64, 0),
            row("waiters_per_lease", None, ll.waiters_per_lease as u64, 0),
            row("kernel_inodes", Some(self.ns.held() as u64), self.bounds.limits.kernel_inodes as u64, 0),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_tmpfs_size_options() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        let ram = memory_total().unwrap();
        assert_eq!(parse_size("10%").unwrap(), ram / 100 * 10);
        for bad in ["", "x", "10q", "0%", "101%", "1", "-5", "99999999999999999999t"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn root_may_use_the_reserve_and_others_may_not() {
        assert!(check(90, 5, 100, 1000).is_ok());
        assert_eq!(check(90, 6, 100, 1000), Err(Error::NoSpace));
        assert!(check(90, 10, 100, 0).is_ok());
        assert_eq!(check(90, 11, 100, 0), Err(Error::NoSpace));
        assert!(check(200, 0, 100, 1000).is_ok(), "nothing new needs no room");
        let d = Limits::for_memory(24 << 30);
        assert_eq!(d.size, (24u64 << 30) / 100 * 10);
        assert_eq!(d.inodes, d.size / 1024);
    }
}
