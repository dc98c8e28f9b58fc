//! What operations take and answer (callers, handles, attribute changes,
//! directory entries, write options), the `user.leasefs.*` names and the
//! set-user-ID rules every write and ownership change applies.

use super::*;

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

impl SetAttr {
    /// Nothing to set: how the kernel asks to drop suid/sgid, both for
    /// `chown(f, -1, -1)` and (`file_remove_privs`) before an unprivileged
    /// writer's `fallocate` or `copy_file_range`.
    pub fn asks_nothing(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
            && self.ctime.is_none()
    }

    /// A change of owner or group, or the kernel's request to drop suid and
    /// sgid: either way the set-ID bits follow [`after_chown`] unless the
    /// request sets the mode itself.
    pub(super) fn drops_set_id(&self) -> bool {
        self.mode.is_none() && (self.uid.is_some() || self.gid.is_some() || self.asks_nothing())
    }
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
pub(super) fn after_unprivileged_change(perm: u16, file_gid: u32, caller: Caller) -> u16 {
    if caller.uid == 0 || perm & (libc::S_ISUID | libc::S_ISGID) as u16 == 0 {
        return perm;
    }
    kill_suidgid(perm, in_group(caller.pid, caller.gid, file_gid))
}

/// What a change of owner (`chown`, `chown(f, -1, -1)` included) leaves of
/// a non-directory's mode, as the kernel's `chown_common` decides it: suid
/// always goes, for root too; sgid goes when group-executable, or when the
/// caller is neither root (`CAP_FSETID`) nor in the file's group as it was
/// before the change. With `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves this
/// to the filesystem (it marks every such `SETATTR` `FATTR_KILL_SUIDGID`,
/// and sends `chown(f, -1, -1)` as a `SETATTR` with nothing to set).
pub(super) fn after_chown(perm: u16, file_gid: u32, caller: Caller) -> u16 {
    if perm & (libc::S_ISUID | libc::S_ISGID) as u16 == 0 {
        return perm;
    }
    kill_suidgid(perm, caller.uid == 0 || in_group(caller.pid, caller.gid, file_gid))
}

/// True when thread `tid` (with primary group `gid`) is a member of group
/// `file_gid`, supplementary groups included (from `/proc`).
pub(super) fn in_group(tid: u32, gid: u32, file_gid: u32) -> bool {
    if gid == file_gid {
        return true;
    }
    crate::procfs::in_supplementary_group(tid, file_gid)
}

/// Rename flags (`renameat2`).
pub const RENAME_NOREPLACE: u32 = 1;
/// Rename flags (`renameat2`).
pub const RENAME_EXCHANGE: u32 = 2;
