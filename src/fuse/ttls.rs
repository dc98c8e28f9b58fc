//! What the kernel may cache of this mount's names and attributes, and
//! for how long.

use super::*;

/// Attributes of anything but a directory are never cached by the kernel:
/// every `stat` of a file reaches the daemon, where it counts as an
/// observation for compare-and-swap (SPEC 6), and every open checks
/// permissions against fresh attributes.
pub(super) const ATTR_TTL: Duration = Duration::ZERO;

/// How long the kernel may trust a name leading to a file or symlink that
/// it looked up (see [`crate::fs::FILE_ENTRY_TTL`]).
pub(super) const FILE_ENTRY_TTL: Duration = crate::fs::FILE_ENTRY_TTL;

/// How long the kernel may trust a directory's name and attributes. A lease
/// is never a directory and a directory holding a live lease cannot move, so
/// a directory's name changes only through this kernel's own mkdir, rmdir and
/// rename; its attributes change only through this kernel's requests too
/// (setattr and setxattr replies, and the kernel drops a directory's cached
/// attributes itself after every create, link, unlink, rename and readdir in
/// it). With `default_permissions` every directory on a path is checked
/// against its attributes, so caching them saves one round trip per path
/// component.
pub(super) const DIR_TTL: Duration = Duration::from_secs(1);

/// What the kernel may cache of this mount's names and attributes.
#[derive(Debug, Clone, Copy)]
pub(super) struct KernelTtls {
    /// False when the kernel may cache no names at all.
    pub(super) cache_names: bool,
    /// A namespace shared with other hosts (`--etcd`): names change through
    /// other kernels too. The kernel may keep a name it looked up only as
    /// long as the daemon's copy stays within its lag of the store (the
    /// `budget` of the entry methods), so what it answers by itself is
    /// never older than what the daemon may answer from its copy (SPEC 10).
    /// An `open` through such an entry still reaches the daemon, which
    /// refuses it `ESTALE` when another host moved the name since the
    /// kernel looked it up (see `Fs::open`); attributes of directories and
    /// names that do not exist are not cached there.
    pub(super) shared: bool,
}

impl KernelTtls {
    /// The attribute timeout of `a`.
    pub(super) fn attr(self, a: &Attr) -> &'static Duration {
        if a.kind == Kind::Dir && self.cache_names && !self.shared {
            &DIR_TTL
        } else {
            &ATTR_TTL
        }
    }

    /// The entry timeout of a name leading to `a`, found by a lookup, with
    /// `budget` the longest the daemon allows now (see
    /// [`crate::fs::Fs::entry_budget`]).
    pub(super) fn entry(self, a: &Attr, budget: Duration) -> Duration {
        if !self.cache_names || crate::control::is_control(a.ino) {
            Duration::ZERO
        } else if a.kind == Kind::Dir {
            DIR_TTL.min(budget)
        } else {
            FILE_ENTRY_TTL.min(budget)
        }
    }

    /// The entry timeout of a name that a create, mknod, symlink or link
    /// just made: a file's expires at once. The daemon does not have to
    /// remember such entries, so the usual renewal (create a file, write
    /// it, rename it over the lease) never needs the retry of a rename over
    /// a live lease (see [`crate::fs::Fs::rename`]); the next use of the
    /// name looks it up. On a shared namespace a directory's expires at
    /// once too: whether the kernel may keep a name depends on who may
    /// search the directory holding it, which the lookup checks.
    pub(super) fn made_entry(self, a: &Attr) -> Duration {
        if a.kind == Kind::Dir && !self.shared {
            self.entry(a, Duration::MAX)
        } else {
            Duration::ZERO
        }
    }

    /// How long the kernel may remember that a name does not exist: never
    /// on a shared namespace, where another host may make it.
    pub(super) fn negative(self) -> &'static Duration {
        if self.cache_names && !self.shared {
            &NEGATIVE_TTL
        } else {
            &Duration::ZERO
        }
    }

    /// Answer a lookup.
    pub(super) fn reply_entry(self, reply: ReplyEntry, a: &Attr, budget: Duration) {
        reply.entry_with_ttls(self.attr(a), &self.entry(a, budget), &attr(a), Generation(0))
    }

    /// Answer a request that made a name.
    pub(super) fn reply_made(self, reply: ReplyEntry, a: &Attr) {
        reply.entry_with_ttls(self.attr(a), &self.made_entry(a), &attr(a), Generation(0))
    }
}

/// How long the kernel may remember that a name does not exist.
pub(super) const NEGATIVE_TTL: Duration = Duration::from_secs(1);
