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

/// What a change's store step compares and writes beyond the keys of the
/// namespace it changed.
#[derive(Clone)]
pub enum Condition {
    /// A key that must still exist as it was created at `create_revision`
    /// (a lease holder's entry: a write through a guarded file lands only
    /// while its lease is held); `Stale` when it does not.
    Held { key: Vec<u8>, create_revision: i64 },
    /// A solo holder's hold (no entry; see `cluster::arbiter`): the
    /// counter must still have the value its grant wrote, and the
    /// holder's session key (`session`) must exist. When a waiter
    /// has written the holder's entry meanwhile, the holder still holds:
    /// `moved` hears that entry's create revision and the change is
    /// decided again (`Conflict`); without an entry the hold is lost
    /// (`Stale`).
    HeldSolo { counter: Vec<u8>, value: Vec<u8>, session: Vec<u8>, entry: Vec<u8>, moved: Moved },
    /// An acquisition by create or link takes the next epoch in the same
    /// step: the counter `key` must still be at `mod_revision` (0: absent)
    /// and is written `value`. When it moved, the change is decided again
    /// (`Conflict`). `seen` hears the counter as the step left it (its value
    /// and revision; `None` when absent).
    Claim { key: Vec<u8>, mod_revision: i64, value: Vec<u8>, seen: Seen },
    /// A create of the name of a lease that a holder on another host holds
    /// re-attaches it (SPEC 4: same holders and epoch), taking no epoch:
    /// the counter `key` must still be at `mod_revision` and name that
    /// holder, and `alive` (its entry, or a solo holder's session key) must
    /// still exist. Otherwise the change is decided again (`Conflict`) and
    /// `seen` hears the counter first.
    Reattach { key: Vec<u8>, mod_revision: i64, alive: Vec<u8>, seen: Seen },
    /// No key may be under `prefix` (a lease's queue: nobody on any host
    /// holds or awaits it), as the host last saw it when it decided the
    /// change. When one is, the change is decided again (`Conflict`) and
    /// `busy` is told first (the store step read the keys under it).
    Free { prefix: Vec<u8>, busy: Busy },
    /// The lease counter `key` records no solo holder (a holder on some
    /// host that has no queue entry, see `cluster::arbiter`), as a change
    /// that found the lease's queue empty must also see. `exists`: the
    /// counter was seen to exist (counters are never deleted), so its value
    /// is compared (bytewise below a solo holder's); otherwise it must be
    /// absent. When not so, the change is decided again (`Conflict`) and
    /// `seen` hears the counter first.
    NoSolo { key: Vec<u8>, exists: bool, seen: Seen },
}

/// Told the create revision of a solo holder's entry a waiter wrote.
pub type Moved = std::sync::Arc<dyn Fn(i64) + Send + Sync>;

/// Told that a [`Condition::Free`] prefix had keys under it.
pub type Busy = std::sync::Arc<dyn Fn() + Send + Sync>;

/// Told what a [`Condition::Claim`]'s counter holds after the store step.
pub type Seen = std::sync::Arc<dyn Fn(Option<(&[u8], i64)>) + Send + Sync>;

impl std::fmt::Debug for Condition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Condition::Held { key, create_revision } => {
                write!(f, "Held({}, {create_revision})", String::from_utf8_lossy(key))
            }
            Condition::Claim { key, mod_revision, .. } => {
                write!(f, "Claim({}, {mod_revision})", String::from_utf8_lossy(key))
            }
            Condition::Reattach { key, mod_revision, .. } => {
                write!(f, "Reattach({}, {mod_revision})", String::from_utf8_lossy(key))
            }
            Condition::Free { prefix, .. } => write!(f, "Free({})", String::from_utf8_lossy(prefix)),
            Condition::NoSolo { key, exists, .. } => write!(f, "NoSolo({}, {exists})", String::from_utf8_lossy(key)),
            Condition::HeldSolo { entry, .. } => write!(f, "HeldSolo({})", String::from_utf8_lossy(entry)),
        }
    }
}

impl Condition {
    pub fn key(&self) -> &[u8] {
        match self {
            Condition::Held { key, .. }
            | Condition::Claim { key, .. }
            | Condition::Reattach { key, .. }
            | Condition::NoSolo { key, .. } => key,
            // Read when the compare fails: whether a waiter wrote it.
            Condition::HeldSolo { entry, .. } => entry,
            Condition::Free { prefix, .. } => prefix,
        }
    }
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
    /// Directories another host made not searchable by everyone.
    pub unsearchable: Vec<Ino>,
}

/// The half of a read barrier that asks the shared store, run without the
/// table (the core holds no lock meanwhile, so other requests are served
/// while the store answers).
pub trait Barrier: Send + Sync + std::fmt::Debug {
    /// The store's revision now (a linearizable read), once this host's
    /// watch has received every change up to it. Right after a failed
    /// read this fails at once for a while (each read would otherwise
    /// wait a whole request timeout).
    fn target(&self) -> Result<i64>;
    /// As [`Barrier::target`], asking the store even right after a failure
    /// (a change always tries).
    fn target_now(&self) -> Result<i64>;
    /// How far this host's copy may be behind the store (SPEC 10): the
    /// time since a barrier read was sent whose revision the watch then
    /// delivered, while the watch lost nothing since. Every change
    /// committed before that read is in the copy once the watch's queue is
    /// applied. `None`: not known (no barrier yet, or the watch broke).
    fn lag(&self) -> Option<std::time::Duration>;
    /// The lag up to which reads answer from the copy.
    fn max_lag(&self) -> std::time::Duration;
}

/// A change on its way to the shared store: [`Publication::send`] talks to
/// the store only (the core holds no lock meanwhile), and
/// [`Replica::settle`] then takes the answer into the table.
pub trait Publication: Send {
    fn send(&mut self);
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

/// The shared store behind a replicated namespace.
pub trait Replica: Send + std::fmt::Debug {
    /// The store side of a read barrier, for use without the table.
    fn barrier(&self) -> std::sync::Arc<dyn Barrier>;
    /// Apply every change committed before `target` was taken from
    /// [`Barrier::target`] (answering from the table as it is when that
    /// failed, and saying so).
    fn catch_up_to(&mut self, ns: &mut Namespace, target: Result<i64>) -> Result<Caught>;
    /// Apply what the watch delivered so far, without asking the store.
    fn catch_up_quick(&mut self, ns: &mut Namespace) -> Result<Caught>;
    /// Apply what the watch delivered so far and nothing else: no re-read
    /// even when one is due (the lease timer's catch-up, which a request
    /// never waits for).
    fn catch_up_queued(&mut self, _ns: &mut Namespace) -> Result<Caught> {
        Ok(Caught::default())
    }
    /// Apply every change committed before this call.
    fn catch_up(&mut self, ns: &mut Namespace) -> Result<Caught> {
        let target = self.barrier().target();
        self.catch_up_to(ns, target)
    }
    /// Catch up before a change is decided: with a `target`, as
    /// [`Replica::catch_up_to`]; without, only with what is already known
    /// here (no round trip), for a change whose store step checks what it
    /// was decided on anyway.
    fn begin(&mut self, ns: &mut Namespace, target: Option<Result<i64>>) -> Result<Caught>;
    /// The revision of the shared store the table reflects (it moves when
    /// a catch-up applied something).
    fn applied(&self) -> i64;
    /// What changed since [`Replica::begin`], ready to be stored in one
    /// step that also checks `conditions` (`ESTALE` when one does not
    /// hold) and that nothing the change was decided on changed meanwhile
    /// (`Conflict`). `None`: nothing to store. The table keeps the change
    /// until [`Replica::settle`].
    fn prepare(
        &mut self,
        ns: &mut Namespace,
        extra: &dyn Fn(Ino) -> Extra,
        conditions: &[Condition],
    ) -> Result<Option<Box<dyn Publication>>>;
    /// Take a sent publication's answer: `Ok` when it was stored;
    /// otherwise the table is put back to what the store has.
    fn settle(&mut self, ns: &mut Namespace, p: Box<dyn Publication>) -> Result<()>;
    /// Prepare, send and settle in one call.
    fn publish(&mut self, ns: &mut Namespace, extra: &dyn Fn(Ino) -> Extra, conditions: &[Condition]) -> Result<()> {
        match self.prepare(ns, extra, conditions)? {
            None => Ok(()),
            Some(mut p) => {
                p.send();
                self.settle(ns, p)
            }
        }
    }
    /// Largest file the shared store keeps.
    fn max_file_size(&self) -> u64;
    /// For `status`.
    fn status(&self) -> serde_json::Value;
}
