//! A namespace shared with other hosts.
//!
//! A mount whose namespace is shared (the etcd backend) keeps the inode
//! table as a local replica of a namespace stored elsewhere. The filesystem
//! core asks the replica at two points and never decides sharing itself:
//! - before an operation that reads names, attributes or contents,
//!   [`Replica::catch_up`] brings the table up to every change another host
//!   committed before the call (a read barrier);
//! - around an operation that changes the namespace, [`Replica::begin`]
//!   catches up (with no round trip when the store step will check the
//!   decision anyway), and [`Replica::publish`] stores what the operation changed
//!   (the table's change tracking) in one step that lands only if nothing
//!   it was decided on changed meanwhile; otherwise it fails with
//!   [`crate::error::Error::Conflict`] and the core decides the operation
//!   again on the fresh copy. The operation's caller is answered only after
//!   the change is stored.

use super::{Ino, Namespace};
use crate::error::Result;
use crate::store::records::Extra;

/// A key of the shared store that must still exist as it was created at
/// `create_revision` for a change to be stored (a lease holder's entry: a
/// write through a guarded file lands only while its lease is held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub key: Vec<u8>,
    pub create_revision: i64,
}

/// What catching up changed besides the table itself.
#[derive(Debug, Default)]
pub struct Caught {
    /// Lease settings (TTL, guard) of inodes another host changed.
    pub extras: Vec<(Ino, Extra)>,
    /// Inodes that lost a name: their lease state may be collectable.
    pub unlinked: Vec<Ino>,
    /// Names another host removed (directory, name, inode), then names it
    /// added, in that order: a name that now leads elsewhere makes earlier
    /// observers' views stale (SPEC 6).
    pub removed_names: Vec<(Ino, std::ffi::OsString, Ino)>,
    pub added_names: Vec<(Ino, std::ffi::OsString, Ino)>,
}

/// The shared store behind a replicated namespace.
pub trait Replica: Send + std::fmt::Debug {
    /// Apply every change committed before this call.
    fn catch_up(&mut self, ns: &mut Namespace) -> Result<Caught>;
    /// Catch up before a change is decided: with `fresh`, as
    /// [`Replica::catch_up`]; without, only with what is already known
    /// here (no round trip), for a change whose store step checks what it
    /// was decided on anyway.
    fn begin(&mut self, ns: &mut Namespace, fresh: bool) -> Result<Caught>;
    /// The revision of the shared store the table reflects (it moves when
    /// a catch-up applied something).
    fn applied(&self) -> i64;
    /// Store what changed since [`Replica::begin`], in one step that also
    /// checks `conditions` (`ESTALE` when one does not hold) and that
    /// nothing the change was decided on changed meanwhile (`Conflict`).
    /// On failure the change is undone by the next catch-up.
    fn publish(&mut self, ns: &mut Namespace, extra: &dyn Fn(Ino) -> Extra, conditions: &[Condition]) -> Result<()>;
    /// Largest file the shared store keeps.
    fn max_file_size(&self) -> u64;
    /// For `status`.
    fn status(&self) -> serde_json::Value;
}
