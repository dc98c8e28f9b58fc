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
    /// The caller's view of the lease is out of date, or it was fenced
    /// (what was held or seen, and what is current).
    Stale(Stale),
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

/// Why an `ESTALE` was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// A compare-and-swap on a file whose content or name moved on since
    /// the process observed it (versions, SPEC 6).
    View { seen: u64, current: u64 },
    /// A holder fenced off its lease (broken, expired, taken over): the
    /// epoch it held and the lease's current one (SPEC 7).
    Fenced { held: u64, current: u64 },
    /// A write to a guarded file through a descriptor opened under an
    /// epoch that is no longer the lease's, or whose opener no longer holds
    /// it.
    Guard { held: u64, current: u64 },
    /// A guarded write on a shared namespace reached the store after its
    /// lease was lost there.
    LeaseLost,
    /// The kernel must look a rename's source up again first (its cached
    /// entry could still lead to the old file); it retries once.
    Lookup,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stale::View { seen, current } => write!(f, "stale view: observed version {seen}, current {current}"),
            Stale::Fenced { held, current } => write!(f, "fenced: held epoch {held}, current {current}"),
            Stale::Guard { held, current } => write!(f, "guard: opened under epoch {held}, current {current}"),
            Stale::LeaseLost => write!(f, "the guarding lease was lost"),
            Stale::Lookup => write!(f, "the source must be looked up again"),
        }
    }
}

impl Error {
    /// The errno a process sees for this refusal.
    #[must_use]
    pub fn errno(self) -> i32 {
        self.errno_and_name().0
    }

    /// The errno's symbolic name (`ESTALE`), for logs and metrics.
    #[must_use]
    pub fn errno_name(self) -> &'static str {
        self.errno_and_name().1
    }

    /// The one mapping to errno.
    fn errno_and_name(self) -> (i32, &'static str) {
        match self {
            Error::NotFound => (libc::ENOENT, "ENOENT"),
            Error::Exists => (libc::EEXIST, "EEXIST"),
            Error::NotDir => (libc::ENOTDIR, "ENOTDIR"),
            Error::IsDir => (libc::EISDIR, "EISDIR"),
            Error::NotEmpty => (libc::ENOTEMPTY, "ENOTEMPTY"),
            Error::NameTooLong => (libc::ENAMETOOLONG, "ENAMETOOLONG"),
            Error::Invalid => (libc::EINVAL, "EINVAL"),
            Error::NotPermitted => (libc::EPERM, "EPERM"),
            Error::Access => (libc::EACCES, "EACCES"),
            Error::NoAttr => (libc::ENODATA, "ENODATA"),
            Error::Range => (libc::ERANGE, "ERANGE"),
            Error::TooBig => (libc::E2BIG, "E2BIG"),
            Error::FileTooBig => (libc::EFBIG, "EFBIG"),
            Error::Busy => (libc::EBUSY, "EBUSY"),
            Error::NotSupported => (libc::EOPNOTSUPP, "EOPNOTSUPP"),
            Error::BadHandle => (libc::EBADF, "EBADF"),
            Error::WouldBlock => (libc::EWOULDBLOCK, "EAGAIN"),
            Error::Stale(_) => (libc::ESTALE, "ESTALE"),
            Error::NoLock => (libc::ENOLCK, "ENOLCK"),
            Error::Deadlock => (libc::EDEADLK, "EDEADLK"),
            Error::Interrupted => (libc::EINTR, "EINTR"),
            Error::NoSpace => (libc::ENOSPC, "ENOSPC"),
            Error::Io => (libc::EIO, "EIO"),
            Error::NoSuchOffset => (libc::ENXIO, "ENXIO"),
            Error::TooManyOpen => (libc::ENFILE, "ENFILE"),
            Error::Unreachable => (libc::EIO, "EIO"),
            Error::Conflict => (libc::EIO, "EIO"),
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
        write!(f, "{}", std::io::Error::from_raw_os_error(self.errno()))?;
        if let Error::Stale(why) = self {
            write!(f, " ({why})")?;
        }
        Ok(())
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
        assert_eq!(Error::Stale(Stale::Lookup).errno(), libc::ESTALE);
        assert_eq!(Error::WouldBlock.errno(), libc::EAGAIN);
        assert_eq!(Error::NameTooLong.errno(), libc::ENAMETOOLONG);
        assert_eq!(Error::NoLock.errno(), libc::ENOLCK);
        assert_eq!(Error::NoAttr.errno(), libc::ENODATA);
        assert_eq!(Error::WouldBlock.errno_name(), "EAGAIN");
    }

    #[test]
    fn a_stale_refusal_says_which_epoch_was_held_and_which_is_current() {
        let e = Error::Stale(Stale::Fenced { held: 3, current: 5 });
        assert_eq!(e.errno(), libc::ESTALE);
        assert_eq!(e.errno_name(), "ESTALE");
        assert!(e.to_string().ends_with("(fenced: held epoch 3, current 5)"), "{e}");
        assert_eq!(Error::NotFound.to_string(), std::io::Error::from_raw_os_error(libc::ENOENT).to_string());
    }
}
