//! Errors of the filesystem core and their one mapping to errno.
//!
//! Every refusal the daemon gives a process goes through [`Error::errno`]. The
//! match is exhaustive on purpose: adding a variant without deciding which
//! errno a user sees is a compile error, not a silent `EIO`.

use std::fmt;

/// Why a filesystem operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The name or inode does not exist.
    NotFound,
    /// The name already exists.
    Exists,
    /// A path component or target is not a directory.
    NotDir,
    /// The operation needs a non-directory.
    IsDir,
    /// A directory to remove or replace still has entries.
    NotEmpty,
    /// A name is longer than 255 bytes.
    NameTooLong,
    /// An argument is malformed (bad flag, bad xattr value, bad name).
    Invalid,
    /// The operation is not permitted (read-only attribute, wrong owner).
    NotPermitted,
    /// Access denied.
    Access,
    /// The extended attribute does not exist.
    NoAttr,
    /// The caller's buffer is too small for the answer.
    Range,
    /// A value is too large (xattr value).
    TooBig,
    /// A file would grow beyond the maximum size.
    FileTooBig,
    /// The object is in use (a live lease cannot be moved).
    Busy,
    /// The operation is not supported on this object.
    NotSupported,
    /// The handle does not name an open file.
    BadHandle,
    /// The lease is held by someone else and the caller asked not to wait.
    WouldBlock,
    /// The caller's view of the lease is out of date, or it was fenced.
    Stale,
    /// A guarded file was opened for writing without holding its lease.
    NoLock,
    /// Waiting would deadlock.
    Deadlock,
    /// A wait was interrupted by a signal.
    Interrupted,
    /// The state directory is full.
    NoSpace,
    /// The state directory failed; durability can no longer be promised.
    Io,
    /// `SEEK_DATA`/`SEEK_HOLE` found nothing at or after the offset.
    NoSuchOffset,
    /// No more files may be open on the mount.
    TooManyOpen,
    /// The lease arbiter of a multi-host mount (etcd) did not answer in
    /// time, or this host's session with it is lost.
    Unreachable,
    /// Another host changed what a change of a shared namespace was
    /// decided on; the change did not land and is decided again on the
    /// fresh copy (a caller sees it only when that kept failing).
    Conflict,
}

impl Error {
    /// The errno a process sees for this refusal.
    #[must_use]
    pub fn errno(self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::Invalid => libc::EINVAL,
            Error::NotPermitted => libc::EPERM,
            Error::Access => libc::EACCES,
            Error::NoAttr => libc::ENODATA,
            Error::Range => libc::ERANGE,
            Error::TooBig => libc::E2BIG,
            Error::FileTooBig => libc::EFBIG,
            Error::Busy => libc::EBUSY,
            Error::NotSupported => libc::EOPNOTSUPP,
            Error::BadHandle => libc::EBADF,
            Error::WouldBlock => libc::EWOULDBLOCK,
            Error::Stale => libc::ESTALE,
            Error::NoLock => libc::ENOLCK,
            Error::Deadlock => libc::EDEADLK,
            Error::Interrupted => libc::EINTR,
            Error::NoSpace => libc::ENOSPC,
            Error::Io => libc::EIO,
            Error::NoSuchOffset => libc::ENXIO,
            Error::TooManyOpen => libc::ENFILE,
            Error::Unreachable => libc::EIO,
            Error::Conflict => libc::EIO,
        }
    }
}

impl From<&std::io::Error> for Error {
    /// A state-directory write that failed: a full disk is `ENOSPC` (room
    /// can be made; the request may be tried again), anything else `EIO`.
    /// A failed sync is always `EIO`: after it nothing is promised
    /// (fail-stop), whatever the reason.
    fn from(e: &std::io::Error) -> Error {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            Error::NoSpace
        } else {
            Error::Io
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::io::Error::from_raw_os_error(self.errno()))
    }
}

impl std::error::Error for Error {}

/// Result of a core operation.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_are_the_ones_users_recognise() {
        assert_eq!(Error::Stale.errno(), libc::ESTALE);
        assert_eq!(Error::WouldBlock.errno(), libc::EAGAIN);
        assert_eq!(Error::NameTooLong.errno(), libc::ENAMETOOLONG);
        assert_eq!(Error::NoLock.errno(), libc::ENOLCK);
        assert_eq!(Error::NoAttr.errno(), libc::ENODATA);
    }
}
