//! Where rules meet requests: the decisions of a live mount's rules, the
//! requests they hold (delays, hangs) and the fault counts (SPEC 13).
//!
//! Invariants:
//! - With no rule in force and nothing held, a request costs one atomic
//!   load here ([`Bench::engaged`]).
//! - Nothing sleeps or waits while the rules' lock is held: a delayed or
//!   hung request is *parked* (its reply path kept, no thread held) and
//!   resumed by the bench timer, by `fault release`, by the removal of its
//!   rule, or ended by a signal to its caller (`EINTR`).
//! - A request resumed goes through the door once more and passes it
//!   untouched (it was already decided).
//! - Once the kernel was told that `fsync` needs no request (a mount with
//!   nothing to sync), no rule may name `fsync`; once a rule names it, that
//!   shortcut is never taken (see [`Bench::may_skip_sync`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::rules::{Action, Call, Fired, RuleSpec, Rules};

/// How a parked request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Carry it out now.
    Go,
    /// Answer it with this errno.
    Fail(i32),
}

/// What a parked request does with its end (answers it on its transport).
pub type Then = Box<dyn FnOnce(Resume) + Send>;

struct Parked {
    rule: u64,
    /// When the timer ends it, and how (none: a hang).
    until: Option<(Instant, Resume)>,
    then: Then,
}

#[derive(Default)]
struct Inner {
    rules: Rules,
    parked: HashMap<u64, Parked>,
    /// Resumed requests on their way through the door again.
    passing: HashSet<u64>,
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    timer: bool,
}

impl Inner {
    fn engaged(&self) -> bool {
        !self.rules.is_empty() || !self.parked.is_empty() || !self.passing.is_empty()
    }
}

/// The fsync shortcut, see [`Bench::may_skip_sync`].
const SYNC_UNDECIDED: u8 = 0;
const SYNC_SKIPPED: u8 = 1;
const SYNC_FORWARDED: u8 = 2;

/// Faults fired, by action (`leasefs_faults_total{action=...}`).
pub const ACTIONS: [&str; 6] = ["errno", "delay", "hang", "short", "lose_lease", "crash"];

fn action_index(a: &Action) -> usize {
    match a {
        Action::Errno { .. } => 0,
        Action::Delay { .. } => 1,
        Action::Hang => 2,
        Action::Short { .. } => 3,
        Action::LoseLease => 4,
        Action::Crash => 5,
    }
}

/// A mount's test bench.
pub struct Bench {
    engaged: AtomicBool,
    /// [`Rules::ops_mask`] of the rules in force (0 while none; every bit
    /// while requests are held or passing).
    ops: AtomicU64,
    /// [`Wants`] of the rules in force, as bits.
    wants: AtomicU8,
    inner: Mutex<Inner>,
    tick: Condvar,
    sync: AtomicU8,
    fired: [AtomicU64; 6],
    me: Weak<Bench>,
    /// Handles below this number were opened before a power cut and
    /// answer `EIO` (0: no cut yet).
    cut: AtomicU64,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bench").field("engaged", &self.engaged).finish_non_exhaustive()
    }
}

impl Bench {
    /// A bench with no rules. `forward_syncs`: every `fsync` reaches the
    /// daemon even when it has nothing to sync (`--bench`).
    pub fn new(forward_syncs: bool) -> Arc<Bench> {
        Arc::new_cyclic(|me| Bench {
            engaged: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            wants: AtomicU8::new(0),
            inner: Mutex::new(Inner::default()),
            tick: Condvar::new(),
            sync: AtomicU8::new(if forward_syncs { SYNC_FORWARDED } else { SYNC_UNDECIDED }),
            fired: Default::default(),
            me: me.clone(),
            cut: AtomicU64::new(0),
        })
    }

    /// Whether a request must be shown to the door at all.
    #[inline]
    pub fn engaged(&self) -> bool {
        self.engaged.load(Ordering::Acquire)
    }

    fn settle(&self, inner: &Inner) {
        let held = !inner.parked.is_empty() || !inner.passing.is_empty();
        self.ops.store(if held { u64::MAX } else { inner.rules.ops_mask() }, Ordering::Release);
        let r = &inner.rules;
        let bits = u8::from(r.wants_path())
            | u8::from(r.wants_pid()) << 1
            | u8::from(r.wants_comm()) << 2
            | u8::from(r.wants_cgroup()) << 3;
        self.wants.store(bits, Ordering::Release);
        self.engaged.store(inner.engaged() || self.cut.load(Ordering::Acquire) > 0, Ordering::Release);
    }

    /// A power cut happened: handles below `first_new` are dead from now on.
    pub fn cut_handles_below(&self, first_new: u64) {
        self.cut.store(first_new, Ordering::Release);
        self.engaged.store(true, Ordering::Release);
    }

    /// Whether handle `fh` was opened before a power cut.
    pub fn cut_off(&self, fh: u64) -> bool {
        fh < self.cut.load(Ordering::Acquire)
    }

    /// Whether a request of operation `op` may meet a rule (or is held or
    /// passing): no lock is taken to say no.
    #[inline]
    pub fn may_match(&self, op: &str) -> bool {
        self.ops.load(Ordering::Acquire) & super::rules::op_bit(op) != 0
    }

    /// Whether `fsync` may be answered with "no request needed" on a mount
    /// with nothing to sync (the kernel then answers every later one
    /// itself): only while no rule has named it, and never after.
    pub fn may_skip_sync(&self) -> bool {
        match self.sync.compare_exchange(SYNC_UNDECIDED, SYNC_SKIPPED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(state) => state == SYNC_SKIPPED,
        }
    }

    /// Whether every `fsync` reaches the daemon.
    pub fn syncs_forwarded(&self) -> bool {
        self.sync.load(Ordering::Acquire) == SYNC_FORWARDED
    }

    /// Put a rule in force; its id, or why it was refused.
    pub fn add(&self, spec: RuleSpec) -> Result<u64, String> {
        let names_sync = spec.op.iter().any(|o| o.eq_ignore_ascii_case("fsync") || o.eq_ignore_ascii_case("fdatasync"));
        // A rule on every operation keeps fsync coming too, when it still can.
        let sees_sync = names_sync || spec.op.is_empty();
        let mut inner = self.inner.lock();
        // Checked whole first, so a refused rule changes nothing, not even
        // the fsync shortcut.
        Rules::check(&spec)?;
        if sees_sync
            && self
                .sync
                .compare_exchange(SYNC_UNDECIDED, SYNC_FORWARDED, Ordering::AcqRel, Ordering::Acquire)
                .is_err_and(|s| s == SYNC_SKIPPED)
            && names_sync
        {
            return Err("the kernel no longer sends fsync to this mount (it has nothing to sync and said so at the \
                        first fsync): mount it with --bench for fsync rules"
                .into());
        }
        let id = inner.rules.add(spec)?;
        self.settle(&inner);
        Ok(id)
    }

    /// Remove rule `id` (its held requests go on); false when there is none.
    pub fn remove(&self, id: u64) -> bool {
        let mut inner = self.inner.lock();
        let found = inner.rules.remove(id);
        let ends = if found { Self::take(&mut inner, Some(id), false) } else { Vec::new() };
        self.settle(&inner);
        drop(inner);
        Self::finish(ends);
        found
    }

    /// Remove every rule (held requests go on).
    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.rules.clear();
        let ends = Self::take(&mut inner, None, false);
        self.settle(&inner);
        drop(inner);
        Self::finish(ends);
    }

    /// Let the requests hung by rule `id` (every rule: `None`) go on; how
    /// many there were.
    pub fn release(&self, id: Option<u64>) -> usize {
        let mut inner = self.inner.lock();
        let ends = Self::take(&mut inner, id, true);
        self.settle(&inner);
        drop(inner);
        let n = ends.len();
        Self::finish(ends);
        n
    }

    /// Every rule as written, with its counts.
    pub fn list(&self) -> Vec<RuleSpec> {
        self.inner.lock().rules.list()
    }

    /// Requests held now (delayed or hung).
    pub fn held(&self) -> usize {
        self.inner.lock().parked.len()
    }

    /// Faults fired so far, by [`ACTIONS`].
    pub fn fired(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.fired[i].load(Ordering::Relaxed))
    }

    /// Which rules' questions a request's [`Call`] must answer.
    pub fn wants(&self) -> Wants {
        let bits = self.wants.load(Ordering::Acquire);
        Wants { path: bits & 1 != 0, pid: bits & 2 != 0, comm: bits & 4 != 0, cgroup: bits & 8 != 0 }
    }

    /// Whether new descriptors should bypass the page cache: a rule may
    /// name reads or writes, which only reach the daemon that way.
    pub fn wants_direct_io(&self) -> bool {
        self.engaged() && self.inner.lock().rules.names_data()
    }

    /// The request `unique` as the door sees it: `None` when it passes
    /// (no rule fired, or it was resumed and passes the door once more).
    pub fn decide(&self, unique: u64, call: &Call) -> Option<Fired> {
        let mut inner = self.inner.lock();
        if !inner.passing.is_empty() && inner.passing.remove(&unique) {
            self.settle(&inner);
            return None;
        }
        let fired = inner.rules.decide(call);
        if let Some(f) = &fired {
            self.fired[action_index(&f.action)].fetch_add(1, Ordering::Relaxed);
        }
        fired
    }

    /// Whether `unique` was resumed and passes the door once more (taken).
    pub fn passes(&self, unique: u64) -> bool {
        let mut inner = self.inner.lock();
        let p = inner.passing.remove(&unique);
        self.settle(&inner);
        p
    }

    /// Let `unique` pass the door once more untouched (it is served again,
    /// changed: a short read or write).
    pub fn pass(&self, unique: u64) {
        let mut inner = self.inner.lock();
        inner.passing.insert(unique);
        self.settle(&inner);
    }

    /// Hold request `unique`, fired by rule `rule`: until `until` (then
    /// ended as it says) or, with none, until released. What to run at once
    /// instead, when its rule is already gone (a hang that goes on): the
    /// caller runs it, with none of its locks held.
    #[must_use]
    pub fn park(
        &self,
        unique: u64,
        rule: u64,
        until: Option<(Duration, Resume)>,
        then: Then,
    ) -> Option<(Then, Resume)> {
        let mut inner = self.inner.lock();
        let until = until.map(|(d, r)| (Instant::now() + d, r));
        if let Some((at, _)) = until {
            inner.deadlines.push(Reverse((at, unique)));
            if !inner.timer {
                inner.timer = self.start_timer();
            }
            self.tick.notify_one();
        }
        // A hang whose rule went away meanwhile is not held.
        if until.is_none() && !inner.rules.holds(rule) {
            inner.passing.insert(unique);
            self.settle(&inner);
            return Some((then, Resume::Go));
        }
        inner.parked.insert(unique, Parked { rule, until, then });
        self.settle(&inner);
        None
    }

    /// The caller of `unique` was signalled: a held request ends with
    /// `EINTR`. False when it is not held here.
    pub fn interrupt(&self, unique: u64) -> bool {
        let mut inner = self.inner.lock();
        let Some(p) = inner.parked.remove(&unique) else { return false };
        self.settle(&inner);
        drop(inner);
        (p.then)(Resume::Fail(libc::EINTR));
        true
    }

    /// Take the held requests of rule `id` (all: `None`), hangs only or
    /// every one, marking those that go on as passing.
    fn take(inner: &mut Inner, id: Option<u64>, hangs_only: bool) -> Vec<(Then, Resume)> {
        let keys: Vec<u64> = inner
            .parked
            .iter()
            .filter(|(_, p)| id.is_none_or(|i| p.rule == i) && (!hangs_only || p.until.is_none()))
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::new();
        for k in keys {
            let p = inner.parked.remove(&k).expect("listed");
            // A delayed errno still fails, now; everything else goes on.
            let how = match p.until {
                Some((_, Resume::Fail(e))) => Resume::Fail(e),
                _ => Resume::Go,
            };
            if how == Resume::Go {
                inner.passing.insert(k);
            }
            out.push((p.then, how));
        }
        out
    }

    fn finish(ends: Vec<(Then, Resume)>) {
        for (then, how) in ends {
            then(how);
        }
    }

    /// The timer that ends delays: one thread per mount, started at the
    /// first delay, gone with the bench.
    fn start_timer(&self) -> bool {
        let me = self.me.clone();
        std::thread::Builder::new()
            .name("fault-timer".into())
            .spawn(move || loop {
                let Some(bench) = me.upgrade() else { return };
                let mut inner = bench.inner.lock();
                let now = Instant::now();
                let mut due = Vec::new();
                while let Some(Reverse((at, unique))) = inner.deadlines.peek().copied() {
                    if at > now {
                        break;
                    }
                    inner.deadlines.pop();
                    if inner.parked.get(&unique).is_some_and(|p| p.until.is_some_and(|(u, _)| u == at)) {
                        let p = inner.parked.remove(&unique).expect("checked");
                        let how = p.until.map_or(Resume::Go, |(_, r)| r);
                        if how == Resume::Go {
                            inner.passing.insert(unique);
                        }
                        due.push((p.then, how));
                    }
                }
                bench.settle(&inner);
                if due.is_empty() {
                    let next = inner.deadlines.peek().map(|Reverse((at, _))| *at);
                    let cap = now + Duration::from_secs(1);
                    bench.tick.wait_until(&mut inner, next.map_or(cap, |n| n.min(cap)));
                    drop(inner);
                } else {
                    drop(inner);
                    Self::finish(due);
                }
                drop(bench);
            })
            .is_ok()
    }
}

/// Which parts of a [`Call`] some rule asks about (the others are left
/// out, unread).
#[derive(Debug, Clone, Copy, Default)]
pub struct Wants {
    pub path: bool,
    pub pid: bool,
    pub comm: bool,
    pub cgroup: bool,
}
