//! The seam between the lease table, the arbitration of several hosts and
//! the authority in front of both: questions an authority must send
//! without the state lock, their answers, errands, and the timer's wake-up.
//! Below all three, so none of them imports another to name these.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::machine::{Effect, Lock, Outcome};

/// Wakes the lease timer before its deadline: the authority has effects to
/// hand over through `LeaseAuthority::tick`. A wake-up given while the
/// timer is busy is kept, so none is lost.
#[derive(Debug, Clone, Default)]
pub struct Wake(Arc<(Mutex<bool>, Condvar)>);

impl Wake {
    /// Have the timer tick now.
    pub fn wake(&self) {
        let (flag, cond) = &*self.0;
        *flag.lock() = true;
        cond.notify_one();
    }

    /// Sleep until woken or for `timeout`; true when woken.
    pub fn sleep(&self, timeout: Duration) -> bool {
        let (flag, cond) = &*self.0;
        let mut woken = flag.lock();
        if !*woken {
            cond.wait_for(&mut woken, timeout);
        }
        std::mem::take(&mut *woken)
    }
}

/// Lists other hosts' leases under a prefix (`LeaseAuthority::remote_leases`).
pub type RemoteLeases = Box<dyn FnOnce(&str) -> Vec<super::rows::LeaseRow> + Send>;

/// Reads other hosts' holders of one lease (`LeaseAuthority::remote_holders`);
/// `Err` when the other hosts cannot be asked.
pub type RemoteHolders = Box<dyn FnOnce() -> Result<Vec<super::rows::HolderRow>, String> + Send>;

/// What an authority must ask another party (etcd) before it can answer:
/// the caller sends it **without the state lock**, so other requests go on
/// meanwhile, and hands the answer back to the `finish_` call that matches
/// the `begin_` call that returned it.
pub struct Question(Box<dyn FnOnce() -> Answer + Send>);

impl Question {
    pub fn new(ask: impl FnOnce() -> Answer + Send + 'static) -> Question {
        Question(Box::new(ask))
    }

    /// Ask (blocks for as long as the other party takes).
    pub fn send(self) -> Answer {
        (self.0)()
    }
}

/// The answer to a [`Question`], meaningful only to the authority that
/// asked it.
pub struct Answer(pub Box<dyn std::any::Any + Send>);

impl Answer {
    /// The answer to `LeaseAuthority::begin_test`'s question: the lock
    /// that would conflict, if any.
    pub fn found_lock(self) -> Option<Lock> {
        self.0.downcast::<Option<Lock>>().map(|b| *b).unwrap_or(None)
    }
}

/// Work an authority leaves to run without the state lock, whose outcome
/// it needs to hear nothing of (a release, a renewal seen by other hosts).
/// The caller runs it before it answers the request that caused it, so a
/// release is done when the unlock or close returns; what no request path
/// runs, the next tick does.
pub struct Errand(Box<dyn FnOnce() + Send>);

impl Errand {
    pub fn new(run: impl FnOnce() + Send + 'static) -> Errand {
        Errand(Box::new(run))
    }

    pub fn run(self) {
        (self.0)()
    }
}

/// How a lock request goes on: answered, or a question to send first.
pub enum Step {
    Done(Outcome, Vec<Effect>),
    Ask(Question),
}
