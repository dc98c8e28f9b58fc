//! What one host and several hosts do differently: who decides a grant and
//! its epoch, and what a change must also store.
//!
//! On one host the lease table ([`LocalAuthority`]) decides everything.
//! With other hosts (SPEC 10) an [`Arbitration`] decides, for the leases
//! they share, what no host may decide alone: whether a lease-level lock
//! is granted and with which epoch, which epoch users read, whether a
//! lease is held or awaited anywhere, and which conditions and writes a
//! change's transaction must carry. It then carries each decision out on
//! the host's table, which it is handed on every call: it owns no lease
//! state of its own beyond what ties the table to the arbiter (the queue
//! entry behind each lock, the waits parked in the arbiter).
//!
//! [`LeaseAuthority`](super::authority::LeaseAuthority) asks the table
//! first and the arbitration only where the answer depends on other
//! hosts; every other question (views, guards, detached names, TTLs,
//! floors) is the table's alone.
//!
//! Rules every implementation keeps:
//! - No call blocks on another party: what must be asked is returned as a
//!   [`Question`] (answered in the matching `finish_` call) or left as an
//!   [`Errand`], both sent by the caller without its state lock.
//! - A grant on the table follows the arbiter's grant, with the arbiter's
//!   epoch: the table never hands out an epoch of a shared lease itself.
//! - A hold the arbiter no longer backs is reported fenced
//!   ([`Arbitration::lost_hold`]) from the moment it is lost, before any
//!   tick carries the fence out.

use super::local::LocalAuthority;
use super::machine::{Effect, Fenced, Lock, Outcome, Request, WaitId};
use super::seam::{Answer, Errand, Question, RemoteHolders, RemoteLeases, Step, Wake};
use crate::error::Result;
use crate::namespace::replica::Condition;
use crate::namespace::Ino;

/// The decisions other hosts share (see the module documentation).
pub trait Arbitration: Send + std::fmt::Debug {
    /// Call `wake` whenever [`Arbitration::tick`] or
    /// [`Arbitration::begin_tick`] has work.
    fn set_wake(&mut self, wake: Wake);

    // Lock steps.

    /// A lock or unlock request: answered now on `local`, or the question
    /// to ask the arbiter first.
    fn begin_request(
        &mut self,
        local: &mut LocalAuthority,
        ino: Ino,
        req: Request,
        wait: Option<WaitId>,
    ) -> Result<Step>;
    /// The answer to [`Arbitration::begin_request`]'s question, carried
    /// out on `local`.
    fn finish_request(&mut self, local: &mut LocalAuthority, answer: Answer) -> Result<(Outcome, Vec<Effect>)>;
    /// The read that finds a conflicting holder on another host
    /// (`F_GETLK` after `local` found none); its answer is an
    /// `Option<Lock>`.
    fn ask_test(&self, ino: Ino, req: &Request) -> Option<Question>;
    /// A signal interrupted `id`: its effects when the arbitration was the
    /// one keeping it (parked in the arbiter), `None` when the table is.
    fn interrupt(&mut self, id: WaitId) -> Option<Vec<Effect>>;
    /// Holders of `ino` changed on `local` without a request (a release by
    /// close, a break, a fence): leave the arbiter for what `local` no
    /// longer holds.
    fn changed(&mut self, local: &LocalAuthority, ino: Ino);
    /// A holder of `ino` renewed its lease on `local`.
    fn renewed(&mut self, local: &LocalAuthority, ino: Ino);
    /// The TTL of `ino` changed on `local` (set or removed here, or by
    /// another host through the shared namespace): holders here tell the
    /// other hosts, which break a holder only by the TTL they can see.
    fn ttl_changed(&mut self, _local: &LocalAuthority, _ino: Ino) {}
    /// The lease of each lock request parked in the arbiter, one per waiter.
    fn parked(&self) -> Box<dyn Iterator<Item = Ino> + '_>;
    /// Work for the lease timer: deliver what the arbiter decided
    /// meanwhile, then tick `local`; the effects and the next deadline.
    fn tick(&mut self, local: &mut LocalAuthority) -> (Vec<Effect>, Option<u64>);
    /// Waiters to decide again, asked without the state lock.
    fn begin_tick(&mut self) -> Option<Question>;
    /// Carry out [`Arbitration::begin_tick`]'s answer on `local`.
    fn finish_tick(&mut self, local: &mut LocalAuthority, answer: Answer) -> Vec<Effect>;
    /// Calls whose outcome no request waits on (releases, renewals), for
    /// the caller to run without the state lock.
    fn take_errands(&mut self) -> Vec<Errand>;
    /// A hold on `local` the arbiter no longer backs (its session is
    /// gone), among the locks `pick` selects.
    fn lost_hold(&self, local: &LocalAuthority, ino: Ino, pick: &dyn Fn(&Lock) -> bool) -> Option<Fenced>;

    // Epochs.

    /// The read that brings the epochs of `inos` up to every grant that
    /// completed anywhere before it; none when nothing need be read.
    fn begin_refresh(&mut self, local: &LocalAuthority, inos: &[Ino]) -> Option<Question>;
    /// Raise the epochs on `local` as the read found them (`EIO` when it
    /// failed: an epoch that could not be checked is not shown).
    fn finish_refresh(&mut self, local: &mut LocalAuthority, answer: Answer) -> Result<()>;
    /// An acquisition by `how` (`O_EXCL`, `link`) of `ino`: take its next
    /// epoch from the arbiter in the transaction that stores the change
    /// ([`Arbitration::take_claims`]), raising `local` so its own
    /// acquisition (+1) lands on it; `EIO` when it cannot. False: not an
    /// acquisition after all (an `O_EXCL` create of the name of a lease a
    /// holder on another host holds re-attaches it, SPEC 4).
    fn claim(&mut self, local: &mut LocalAuthority, ino: Ino, how: &str) -> Result<bool>;
    /// What the transaction storing the current change must also compare
    /// and write.
    fn take_claims(&mut self) -> Vec<Condition>;

    // Identity and names.

    /// Held or awaited on another host (the table found it idle here). May
    /// answer from what the arbitration last saw, leaving a condition for
    /// the change's transaction ([`Arbitration::take_claims`]).
    fn held_anywhere(&mut self, ino: Ino) -> bool;
    /// `ino` is the lease at the mount-relative `path` (`/a/b`).
    fn bind_path(&mut self, ino: Ino, path: &str);
    /// The inode is gone.
    fn forget(&mut self, ino: Ino);
    /// What a shared namespace must find unchanged for a write under `ino`
    /// (held here) to land.
    fn hold_condition(&self, ino: Ino) -> Option<Condition>;

    // What users see.

    /// Grants and releases of other hosts' holders since the last call,
    /// with each holder's command name.
    fn remote_events(&mut self) -> Vec<(crate::events::Event, Option<String>)>;
    /// Whether a process on this host reads the event stream: while one
    /// does, other hosts' grants and releases must reach this host (an
    /// errand tells the other hosts).
    fn listen(&mut self, on: bool);
    /// The backend's name and what `status` shows of it.
    fn backend(&self) -> (&'static str, Option<serde_json::Value>);
    /// Why `fenced` was broken, when the arbitration broke it
    /// (`host_lost`).
    fn break_reason(&self, ino: Ino, fenced: &Fenced) -> Option<&'static str>;
    /// How to list other hosts' leases (a closure run without the state lock).
    fn remote_leases(&self) -> Option<RemoteLeases>;
    /// How to read other hosts' holders of `ino` (a closure run without
    /// the state lock); `None` when no other host can hold it.
    fn remote_holders(&self, ino: Ino) -> Option<RemoteHolders>;
    /// The mount goes away: leave the arbiter cleanly.
    fn shutdown(&mut self);
}
