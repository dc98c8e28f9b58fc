//! The arbitration of a mount with `--etcd` (SPEC 10): every lease-level
//! lock is arbitrated cluster-wide by the [`Arbiter`] in etcd and carried
//! out on the host's lease table ([`LocalAuthority`], handed to every
//! call), which keeps deciding everything a host decides on its own
//! (per-process views and compare-and-swap, fences, guards, detached
//! leases). This is the [`Arbitration`] half of
//! [`LeaseAuthority`](crate::lease::authority::LeaseAuthority); it keeps
//! only what ties the table to etcd: the queue entry behind each lock,
//! the waits parked in etcd, the names leases are arbitrated by.
//!
//! A request for a `flock`, a whole-file POSIX lock or an OFD lock joins
//! the lease's queue in etcd (one entry per lock owner, on this host's
//! etcd lease) and is granted here only once etcd granted that entry by a
//! transaction compared on the revisions it was decided on; the local
//! grant then carries the epoch that transaction wrote. A request that
//! must wait is parked; the host's one queue watch notes when its
//! predecessor's entry goes and wakes the lease timer, whose tick decides
//! again. No etcd call of a lock step is made under the core's state lock:
//! a request and a tick return a [`Question`] the core sends without it
//! (`begin_request`/`finish_request`, `begin_tick`/`finish_tick`), and
//! releases, renewals and byte-range shrinks are [`Errand`]s the core runs
//! after letting it go, and other hosts' leases are listed by a closure it
//! calls without it ([`Arbitration::remote_leases`]). Leases are named by
//! their mount-relative path (the core names each lease before asking),
//! so a lease keeps its queue and epoch counter across unlink, re-create
//! and rename over, as SPEC 4 asks.
//!
//! Invariants:
//! - A lease-level lock exists on this host only while its owner's entry
//!   is held in etcd on the host's current session (`held`).
//! - An exclusive grant's local epoch is the counter etcd's grant wrote
//!   (raised to it before the local grant), so epochs are the cluster's.
//! - When the session's jeopardy deadline passes (see
//!   [`super::session`]), its holders are fenced: [`fenced_handle`] and
//!   [`held_by`] compare every entry with the live session on every call,
//!   so a daemon resumed from SIGSTOP refuses its holders' writes before
//!   its timer has even run; the next tick fences them for good.
//!
//! Byte-range POSIX locks join the same queue with their ranges and
//! conflict across hosts only where they overlap; a holder's entry carries
//! its lease's TTL and is rewritten on each renewal, so a contender on any
//! host breaks a holder it saw unrenewed for a whole TTL on its own clock;
//! the namespace itself (names, contents, xattrs) is shared through etcd
//! by [`super::namespace`]. Only a file that never had a name (`O_TMPFILE`
//! before `linkat`) is arbitrated on this host alone: no other host can
//! reach it.
//!
//! [`fenced_handle`]: crate::lease::authority::LeaseAuthority::fenced_handle
//! [`held_by`]: crate::lease::authority::LeaseAuthority::held_by

mod carry;

use std::collections::HashMap;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::arbiter::{Arbiter, Asker, Decision, Mode as QMode, Ticket, Withdrawn};
use super::client::{Client, EtcdError};
use super::session::HostSession;
use super::watcher::QueueWatcher;
use crate::error::{Error, Result};
use crate::lease::arbitration::Arbitration;
use crate::lease::authority::{Answer, Errand, Question, RemoteHolders, RemoteLeases, Step, Wake};
use crate::lease::local::LocalAuthority;
use crate::lease::machine::{Effect, Epoch, Fenced, Lock, LockKind, Mode, Outcome, Owner, Range, Request, WaitId};
use crate::lease::rows::{kind_name, HolderRow, LeaseRow};
use crate::namespace::Ino;

/// How a mount reaches its etcd cluster.
#[derive(Debug, Clone)]
pub struct EtcdConfig {
    /// Client URLs of the members (`http://HOST:PORT`).
    pub endpoints: Vec<String>,
    /// Key prefix of the shared namespace (`leasefs`).
    pub prefix: String,
    /// TTL of this host's etcd lease, in seconds.
    pub host_ttl: i64,
    /// A lease whose holder's host was lost is not granted again before this.
    pub lock_delay: Duration,
    /// Deadline of one etcd call across all endpoints.
    pub request_timeout: Duration,
    /// How far behind etcd this host's copy of the namespace may answer
    /// reads (close-to-open, SPEC 10).
    pub copy_lag: Duration,
    /// This host as other hosts see it.
    pub host: String,
}

/// A parked request: its entry waits in etcd behind `predecessor`.
#[derive(Debug)]
struct Parked {
    ino: Ino,
    req: Request,
    ticket: Ticket,
    predecessor: Vec<u8>,
    /// Set by the host's queue watch when the predecessor went away.
    ready: Arc<AtomicBool>,
    /// The predecessor holds with a TTL: when it may be broken unless
    /// renewed, and the revision of its last renewal.
    breakable: Option<(Instant, i64)>,
    /// Held back by `--lock-delay` until then (the previous holder's host
    /// was lost): not watched; decided again when the delay has passed.
    held_until: Option<Instant>,
}

/// Deletes queue entries whose release failed, retrying until etcd takes
/// it or the session they hang on is gone (etcd then deletes them itself).
/// An entry left behind would stand in every later request's way.
#[derive(Debug, Clone)]
struct Leftovers {
    tx: std::sync::mpsc::Sender<Ticket>,
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

impl Leftovers {
    fn start(arbiter: Arc<Arbiter>) -> Leftovers {
        let (tx, rx) = std::sync::mpsc::channel::<Ticket>();
        let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = pending.clone();
        let _ = std::thread::Builder::new().name("etcd-release".into()).spawn(move || {
            for t in rx {
                while arbiter.session().alive() == Some(t.session) {
                    match arbiter.release(&t) {
                        Ok(()) => break,
                        Err(_) => std::thread::sleep(Duration::from_millis(200)),
                    }
                }
                count.fetch_sub(1, Ordering::Relaxed);
            }
        });
        Leftovers { tx, pending }
    }

    fn push(&self, t: Ticket) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(t).is_err() {
            self.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

/// The lease authority of one mount of a namespace shared through etcd.
pub struct EtcdArbitration {
    arbiter: Arc<Arbiter>,
    session: Arc<HostSession>,
    config: EtcdConfig,
    /// The mount-relative path each lease is arbitrated by (no leading `/`).
    names: HashMap<Ino, String>,
    /// The etcd entry behind each lease-level lock on this host.
    held: HashMap<(Ino, Owner), Ticket>,
    /// The etcd entries behind each owner's byte-range locks on this host
    /// (one per grant, shrunk as parts are unlocked).
    ranges: HashMap<(Ino, Owner), Vec<Ticket>>,
    parked: HashMap<WaitId, Parked>,
    /// `--lock-delay`: each lease's lost holder (its entry's key) and when
    /// this host first found it lost; the delay runs from then.
    lost_seen: HashMap<String, (String, Instant)>,
    /// Entries whose release failed (etcd unreachable), deleted by a
    /// thread of their own until it succeeds, off the request path.
    leftover: Leftovers,
    wake: Wake,
    /// The host's watch over every queue (started with the lease timer).
    watcher: Option<QueueWatcher>,
    /// Sessions lost (and their holders fenced) so far.
    losses: u64,
    /// The holders fenced by the last session loss (for the events' reason).
    lost_holders: Vec<(Ino, u64)>,
    /// When this host first saw each holder entry with a TTL at a given
    /// renewal (key, mod revision): its TTL runs from there on this host's
    /// clock, so it is never broken earlier than the holder's own host
    /// would let it lapse.
    seen: Seen,
    /// Held entries with a TTL, flagged by the queue watch when another
    /// host breaks them.
    broken_flags: HashMap<Vec<u8>, Arc<AtomicBool>>,
    /// Holders of other hosts broken here, and holders here broken by others.
    ttl_breaks: (u64, u64),
    /// etcd calls whose outcome nobody waits on here (releases, renewals),
    /// left for the caller to run without the state lock.
    errands: Vec<Errand>,
    /// Waiters taken from `parked` while their tick decides them again
    /// without the state lock; true once a signal interrupted one.
    deciding: HashMap<WaitId, bool>,
    /// Waits a signal ended, leaving the queue before their `EINTR` is
    /// answered (SPEC 5: a hand-off must never grant a waiter that is gone).
    withdrawing: Vec<(WaitId, Parked)>,
    /// Epochs taken by acquisitions by create or link, for the transaction
    /// that stores the change to write.
    claims: Vec<crate::namespace::replica::Condition>,
    /// Leases a change's transaction found held or awaited (entries in
    /// their queue) after this host's watch had shown them free: the
    /// change, decided again, takes them as held without asking etcd.
    busy: Arc<parking_lot::Mutex<std::collections::HashSet<String>>>,
    /// Solo holders of this host whose entries a waiter wrote, by entry
    /// key: the create revision a write through them compares now.
    materialized: Arc<parking_lot::Mutex<HashMap<Vec<u8>, i64>>>,
    /// Waits of this host granted by another holder's release.
    handoffs: u64,
}

/// When this host first saw a holder entry at a given renewal, shared with
/// the questions sent without the state lock.
type Seen = Arc<parking_lot::Mutex<HashMap<(Vec<u8>, i64), Instant>>>;

/// When the TTL of the holder entry `key`, renewed at revision `renewed`,
/// runs out as this host measures it: from when this host first saw that
/// renewal, so it is never broken earlier than the holder's own host would
/// let it lapse.
fn lapses_at(seen: &Seen, key: &[u8], renewed: i64, ttl_ms: u64) -> Instant {
    let mut seen = seen.lock();
    if seen.len() >= 4096 {
        seen.clear();
    }
    let first = *seen.entry((key.to_vec(), renewed)).or_insert_with(Instant::now);
    first + Duration::from_millis(ttl_ms)
}

/// A lock request's question: join the queue and decide, without the
/// state lock.
struct Asked {
    ino: Ino,
    req: Request,
    wait: Option<WaitId>,
    ticket: Ticket,
    decided: std::result::Result<Decision, EtcdError>,
    /// A lapsed holder of another host was broken on the way.
    broke: bool,
    /// Effects decided before the question was sent.
    effects: Vec<Effect>,
}

/// A tick's question: waiters decided again, without the state lock.
struct Redecided {
    decided: Vec<(WaitId, Parked, std::result::Result<Decision, EtcdError>, bool)>,
    withdrawn: Vec<(WaitId, Parked, std::result::Result<Withdrawn, EtcdError>)>,
}

impl std::fmt::Debug for EtcdArbitration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdArbitration")
            .field("config", &self.config)
            .field("held", &self.held.len())
            .field("parked", &self.parked.len())
            .finish_non_exhaustive()
    }
}

/// The queue mode of a lease-level request; `None` for unlocks and byte ranges.
fn cluster_mode(req: &Request) -> Option<QMode> {
    let mode = req.mode?;
    if req.kind != LockKind::Flock && !req.range.is_whole() {
        return None;
    }
    Some(match mode {
        Mode::Shared => QMode::Shared,
        Mode::Exclusive => QMode::Exclusive,
    })
}

/// The queue mode and range of a byte-range request (a record lock on
/// part of the file); `None` for lease-level requests and unlocks.
fn record_range(req: &Request) -> Option<(QMode, Range)> {
    let mode = req.mode?;
    if req.kind == LockKind::Flock || req.range.is_whole() {
        return None;
    }
    Some((if mode == Mode::Shared { QMode::Shared } else { QMode::Exclusive }, req.range))
}

/// A lock that the entry of its owner backs (flock or the whole file).
fn lease_level(l: &Lock) -> bool {
    l.kind == LockKind::Flock || l.range.is_whole()
}

fn comm(pid: u32) -> String {
    crate::procfs::comm(pid).unwrap_or_default()
}

fn unreachable(what: &str, e: &EtcdError) -> Error {
    tracing::warn!("{what}: {e}");
    Error::Unreachable
}

fn millis_until(t: Instant) -> u64 {
    t.saturating_duration_since(Instant::now()).as_millis() as u64 + 1
}

impl EtcdArbitration {
    /// Reach the cluster and register this host's session; a one-line
    /// reason when etcd cannot be reached.
    pub fn connect(config: EtcdConfig) -> std::result::Result<EtcdArbitration, String> {
        let client = Arc::new(Client::new(&config.endpoints, config.request_timeout));
        let prefix = config.prefix.trim_end_matches('/').to_string();
        client
            .get(format!("{prefix}/hosts").as_bytes())
            .map_err(|e| format!("etcd at {}: {e}", config.endpoints.join(",")))?;
        let session = Arc::new(
            HostSession::start(client.clone(), config.host_ttl)
                .map_err(|e| format!("etcd at {}: registering this host: {e}", config.endpoints.join(",")))?,
        );
        let arbiter = Arc::new(Arbiter::new(client, &prefix, session.clone(), &config.host));
        let leftover = Leftovers::start(arbiter.clone());
        Ok(EtcdArbitration {
            arbiter,
            session,
            config: EtcdConfig { prefix, ..config },
            names: HashMap::new(),
            held: HashMap::new(),
            ranges: HashMap::new(),
            parked: HashMap::new(),
            lost_seen: HashMap::new(),
            leftover,
            wake: Wake::default(),
            watcher: None,
            losses: 0,
            lost_holders: Vec::new(),
            seen: Seen::default(),
            broken_flags: HashMap::new(),
            ttl_breaks: (0, 0),
            handoffs: 0,
            busy: Default::default(),
            materialized: Default::default(),
            errands: Vec::new(),
            deciding: HashMap::new(),
            withdrawing: Vec::new(),
            claims: Vec::new(),
        })
    }

    /// The namespace shared through the same cluster, prefix and host
    /// session.
    pub fn namespace(&self) -> super::namespace::EtcdNamespace {
        super::namespace::EtcdNamespace::open(
            self.arbiter.client().clone(),
            self.session.clone(),
            &self.config.prefix,
            self.config.copy_lag,
        )
    }

    /// The host session (tests pause its renewals to cut the host off).
    pub fn session(&self) -> &Arc<HostSession> {
        &self.session
    }
}

impl Arbitration for EtcdArbitration {
    fn set_wake(&mut self, wake: Wake) {
        let watcher =
            QueueWatcher::start(self.arbiter.client().clone(), &self.config.prefix, self.arbiter.host(), wake.clone());
        self.arbiter.set_mirror(watcher.mirror());
        self.watcher = Some(watcher);
        let w = wake.clone();
        self.session.on_lost(Box::new(move |_| w.wake()));
        self.wake = wake;
    }

    fn begin_request(
        &mut self,
        local: &mut LocalAuthority,
        ino: Ino,
        req: Request,
        wait: Option<WaitId>,
    ) -> Result<Step> {
        let mut effects = Vec::new();
        self.on_session_loss(local, &mut effects);
        let record = record_range(&req);
        let Some(mode) = cluster_mode(&req).or(record.map(|(m, _)| m)) else {
            let (outcome, more) = local.request(ino, req, wait)?;
            effects.extend(more);
            self.reconcile(local, ino);
            return Ok(Step::Done(outcome, effects));
        };
        if let Some(t) = self.held.get(&(ino, req.owner)).filter(|_| record.is_none()) {
            if t.mode == mode {
                // Re-locking what this owner holds: a renewal (a round trip
                // only when other hosts must see it, for a TTL).
                let (outcome, more) = local.request(ino, req, wait)?;
                effects.extend(more);
                if outcome == Outcome::Granted {
                    self.touch(local, ino);
                }
                return Ok(Step::Done(outcome, effects));
            }
            // A conversion is not atomic, as flock(2) says: the old entry
            // goes first, the new one queues behind whoever came before.
            if let Some(t) = self.held.remove(&(ino, req.owner)) {
                self.release_ticket(t);
            }
        }
        // A conflict on this host answers a non-blocking request without a round trip.
        if wait.is_none() && local.test(ino, &req).is_some() {
            return Ok(Step::Done(Outcome::Refused(Error::WouldBlock), effects));
        }
        let Some(name) = self.names.get(&ino).cloned() else {
            // A file that never had a name is arbitrated on this host only.
            let (outcome, more) = local.request(ino, req, wait)?;
            effects.extend(more);
            return Ok(Step::Done(outcome, effects));
        };
        let asker = Asker {
            pid: req.pid,
            comm: comm(req.pid),
            owner: super::arbiter::owner_key(req.kind, req.owner),
            ttl_ms: local.effective_ttl(ino),
        };
        let mut ticket = match self.arbiter.ticket(&name, mode, &asker) {
            Ok(t) => t,
            Err(e) => {
                // No session: the fences of its loss still go out.
                return Ok(Step::Done(Outcome::Refused(unreachable("joining an etcd queue", &e)), effects));
            }
        };
        if let Some((_, r)) = record {
            ticket = ticket.with_ranges(vec![(r.start, r.end)]);
        }
        ticket.delay_lost = !self.config.lock_delay.is_zero();
        // Recorded in the counter alone while nothing is in its way and no
        // host reads events (the arbiter checks both): an exclusive
        // whole-lease lock without a TTL (a TTL holder's entry carries its
        // renewals).
        ticket.solo_ok = mode == QMode::Exclusive && record.is_none() && asker.ttl_ms.is_none();
        ticket.served = self.served(&name);
        // Releases this request caused (a conversion) go first.
        let before = std::mem::take(&mut self.errands);
        let (arbiter, seen) = (self.arbiter.clone(), self.seen.clone());
        Ok(Step::Ask(Question::new(move || {
            for e in before {
                e.run();
            }
            crate::failpoints::pausepoint(&format!("lock-step/{name}"));
            let mut decided = arbiter.join_and_decide(&mut ticket);
            let mut broke = false;
            // A non-blocking contender breaks a holder whose TTL it saw run out.
            if let (None, Ok(Decision::Behind { predecessor, breakable: Some((ttl, renewed)), .. })) = (wait, &decided)
            {
                let (predecessor, ttl, renewed) = (predecessor.clone(), *ttl, *renewed);
                if Self::break_if_lapsed(&arbiter, &seen, &name, &predecessor, renewed, ttl) {
                    broke = true;
                    decided = arbiter.decide(&ticket);
                }
            }
            Answer(Box::new(Asked { ino, req, wait, ticket, decided, broke, effects }))
        })))
    }

    fn finish_request(&mut self, local: &mut LocalAuthority, answer: Answer) -> Result<(Outcome, Vec<Effect>)> {
        let Ok(asked) = answer.0.downcast::<Asked>() else {
            return Err(Error::Io);
        };
        let Asked { ino, req, wait, ticket, decided, broke, mut effects } = *asked;
        if broke {
            self.ttl_breaks.0 += 1;
        }
        self.on_session_loss(local, &mut effects);
        match decided {
            Ok(Decision::Granted { .. } | Decision::Behind { .. } | Decision::HeldBack { .. })
                if self.session.alive() != Some(ticket.session) =>
            {
                // The session went while etcd was asked: its entries went with it.
                Ok((Outcome::Refused(Error::Unreachable), effects))
            }
            Ok(Decision::Granted { epoch, .. }) => {
                let outcome = self.answer_grant(local, ino, req, ticket, epoch, wait, false, &mut effects);
                Ok((outcome, effects))
            }
            Ok(Decision::HeldBack { holder }) => match wait {
                // Refused without an epoch (SPEC 5); the next request is
                // held back as long as the delay runs.
                None => {
                    self.note_lost(&ticket.name, &holder);
                    self.release_ticket(ticket);
                    Ok((Outcome::Refused(Error::WouldBlock), effects))
                }
                Some(id) => {
                    self.hold_back(id, ino, req, ticket, holder);
                    Ok((Outcome::Parked, effects))
                }
            },
            Ok(Decision::Behind { predecessor, revision, breakable }) => match wait {
                None => {
                    self.release_ticket(ticket);
                    Ok((Outcome::Refused(Error::WouldBlock), effects))
                }
                Some(_) if req.kind == LockKind::Posix && self.would_deadlock(req.owner, &predecessor) => {
                    self.release_ticket(ticket);
                    Ok((Outcome::Refused(Error::Deadlock), effects))
                }
                Some(id) => {
                    self.park(id, ino, req, ticket, predecessor, revision, breakable);
                    Ok((Outcome::Parked, effects))
                }
            },
            Ok(Decision::Gone) => Err(Error::Unreachable),
            Err(e) => {
                let err = unreachable("deciding a lock request", &e);
                // It may be queued, even granted: delete it, retrying until
                // it is gone, off the request path (etcd is evidently not
                // answering).
                self.leftover.push(ticket);
                Err(err)
            }
        }
    }

    fn ask_test(&self, ino: Ino, req: &Request) -> Option<Question> {
        // A holder on another host: reported with pid 0 (its pid means
        // nothing here; `leasefs leases` names it and its host).
        let record = record_range(req);
        let mode = cluster_mode(req).or(record.map(|(m, _)| m))?;
        let wanted = record.map(|(_, r)| vec![(r.start, r.end)]);
        let name = self.names.get(&ino).cloned()?;
        let mine: Vec<Vec<u8>> =
            self.held.values().chain(self.ranges.values().flatten()).map(|t| t.key.clone()).collect();
        let arbiter = self.arbiter.clone();
        Some(Question::new(move || {
            let found = match arbiter.entries(&name) {
                Ok((entries, _)) => entries.into_iter().find(|e| {
                    e.held
                        && !mine.contains(&e.key)
                        && e.mode.conflicts(mode)
                        && super::arbiter::overlap(&e.ranges, &wanted)
                }),
                Err(e) => {
                    tracing::warn!("F_GETLK of {name}: {e}");
                    None
                }
            };
            let lock = found.map(|other| Lock {
                owner: Owner(0),
                kind: super::arbiter::owner_kind(&other.asker.owner),
                mode: if other.mode == QMode::Shared { Mode::Shared } else { Mode::Exclusive },
                range: match &other.ranges {
                    Some(rs) => rs.first().map_or(Range::WHOLE, |&(start, end)| Range { start, end }),
                    None => Range::WHOLE,
                },
                pid: 0,
                handle: 0,
                since: 0,
            });
            Answer(Box::new(lock))
        }))
    }

    fn interrupt(&mut self, id: WaitId) -> Option<Vec<Effect>> {
        if let Some(p) = self.parked.remove(&id) {
            self.unpark(&p);
            // Answered once the entry left the queue (the next tick, off
            // the thread that reads the kernel's requests): until then a
            // release elsewhere may still hand it the lease, and then the
            // wait ends with that grant instead.
            self.withdrawing.push((id, p));
            self.wake.wake();
            return Some(Vec::new());
        }
        if let Some(interrupted) = self.deciding.get_mut(&id) {
            // Answered when etcd's decision comes back.
            *interrupted = true;
            return Some(Vec::new());
        }
        None
    }

    fn changed(&mut self, local: &LocalAuthority, ino: Ino) {
        self.reconcile(local, ino);
    }

    fn renewed(&mut self, local: &LocalAuthority, ino: Ino) {
        self.touch(local, ino);
    }

    fn ttl_changed(&mut self, local: &LocalAuthority, ino: Ino) {
        EtcdArbitration::ttl_changed(self, local, ino);
    }

    fn parked(&self) -> Box<dyn Iterator<Item = Ino> + '_> {
        Box::new(self.parked.values().map(|p| p.ino))
    }

    fn tick(&mut self, local: &mut LocalAuthority) -> (Vec<Effect>, Option<u64>) {
        let mut effects = Vec::new();
        self.on_session_loss(local, &mut effects);
        self.broken_elsewhere(local, &mut effects);
        self.handed_over(local, &mut effects);
        let (more, mut next) = local.tick();
        effects.extend(more);
        if self.arbiter.listening_stale() {
            // A new session (or a failed write): the listener key again.
            let arbiter = self.arbiter.clone();
            self.errands.push(Errand::new(move || {
                if let Err(e) = arbiter.keep_listening() {
                    tracing::warn!("cannot tell other hosts that events are read here: {e}");
                }
            }));
        }
        let now = Instant::now();
        let mut due = false;
        for p in self.parked.values_mut() {
            if p.held_until.is_some_and(|until| until <= now) {
                // The delay has passed: decided again, and granted now.
                p.held_until = None;
                p.ready.store(true, Ordering::Relaxed);
                due = true;
            }
        }
        if due {
            self.wake.wake();
        }
        let soonest = |n: Option<u64>, m: u64| Some(n.map_or(m, |n| n.min(m)));
        if !self.held.is_empty() || !self.parked.is_empty() {
            // Fence at the jeopardy deadline, not when the keep-alive
            // thread gets round to it.
            next = soonest(next, millis_until(self.session.lease().1));
        }
        if let Some(until) = self.parked.values().filter_map(|p| p.held_until).min() {
            next = soonest(next, millis_until(until));
        }
        if let Some(at) = self.parked.values().filter_map(|p| p.breakable.map(|(at, _)| at)).min() {
            next = soonest(next, millis_until(at));
        }
        (effects, next)
    }

    fn begin_tick(&mut self) -> Option<Question> {
        // Waiters behind a holder whose TTL ran out break it, then decide
        // again; so do waiters whose predecessor left.
        let now = Instant::now();
        let due: Vec<(WaitId, Option<i64>)> = self
            .parked
            .iter()
            .filter_map(|(id, p)| match p.breakable {
                Some((at, renewed)) if at <= now => Some((*id, Some(renewed))),
                _ if p.ready.load(Ordering::Relaxed) => Some((*id, None)),
                _ => None,
            })
            .collect();
        if due.is_empty() && self.withdrawing.is_empty() {
            return None;
        }
        let leaving = std::mem::take(&mut self.withdrawing);
        let mut asks = Vec::new();
        for (id, lapsed) in due {
            let Some(p) = self.parked.remove(&id) else { continue };
            self.unpark(&p);
            let released =
                self.watcher.as_ref().and_then(|w| w.last_release(&self.arbiter.queue_prefix(&p.ticket.name)));
            self.deciding.insert(id, false);
            asks.push((id, p, lapsed, released));
        }
        let arbiter = self.arbiter.clone();
        Some(Question::new(move || {
            let mut out = Vec::new();
            for (id, p, lapsed, released) in asks {
                let broke =
                    lapsed.is_some_and(|renewed| Self::break_lapsed(&arbiter, &p.ticket.name, &p.predecessor, renewed));
                crate::failpoints::pausepoint(&format!("lock-step/{}", p.ticket.name));
                let decided = arbiter.decide_after(&p.ticket, released);
                out.push((id, p, decided, broke));
            }
            let withdrawn = leaving
                .into_iter()
                .map(|(id, p)| {
                    let w = arbiter.withdraw(&p.ticket);
                    (id, p, w)
                })
                .collect();
            Answer(Box::new(Redecided { decided: out, withdrawn }))
        }))
    }

    fn finish_tick(&mut self, local: &mut LocalAuthority, answer: Answer) -> Vec<Effect> {
        let Ok(r) = answer.0.downcast::<Redecided>() else {
            return Vec::new();
        };
        let mut effects = Vec::new();
        self.on_session_loss(local, &mut effects);
        let Redecided { decided, withdrawn } = *r;
        for (id, p, decided, broke) in decided {
            if broke {
                self.ttl_breaks.0 += 1;
            }
            self.redecided(local, id, p, decided, &mut effects);
        }
        for (id, p, w) in withdrawn {
            self.withdrawn(local, id, p, w, &mut effects);
        }
        effects
    }

    fn take_errands(&mut self) -> Vec<Errand> {
        std::mem::take(&mut self.errands)
    }

    fn lost_hold(&self, local: &LocalAuthority, ino: Ino, pick: &dyn Fn(&Lock) -> bool) -> Option<Fenced> {
        // An entry on a session that is no longer alive: its holder must be
        // treated as fenced now.
        let lease = local.lease(ino)?;
        let alive = self.session.alive();
        lease
            .locks()
            .iter()
            .filter(|l| pick(l))
            .find(|l| self.held.get(&(ino, l.owner)).is_some_and(|t| Some(t.session) != alive))
            .map(|l| Fenced { owner: l.owner, handle: l.handle, pid: l.pid, epoch: local.epoch(ino) })
    }

    fn begin_refresh(&mut self, local: &LocalAuthority, inos: &[Ino]) -> Option<Question> {
        let named: Vec<(Ino, String)> = inos
            .iter()
            .filter(|i| !self.keeps_its_epoch(local, **i))
            .filter_map(|i| self.names.get(i).map(|n| (*i, n.clone())))
            .collect();
        if named.is_empty() {
            return None;
        }
        let arbiter = self.arbiter.clone();
        Some(Question::new(move || {
            let names: Vec<&str> = named.iter().map(|(_, n)| n.as_str()).collect();
            let epochs = arbiter.epochs(&names);
            Answer(Box::new((named, epochs)))
        }))
    }

    fn finish_refresh(&mut self, local: &mut LocalAuthority, answer: Answer) -> Result<()> {
        type Read = (Vec<(Ino, String)>, std::result::Result<Vec<u64>, EtcdError>);
        let Ok(read) = answer.0.downcast::<Read>() else {
            return Err(Error::Io);
        };
        let (named, epochs) = *read;
        let epochs = epochs.map_err(|e| {
            tracing::warn!("cannot read the current epochs from etcd: {e}");
            Error::Io
        })?;
        for ((ino, _), e) in named.iter().zip(epochs) {
            // Granted here while etcd was read: it keeps its own epoch.
            if !self.keeps_its_epoch(local, *ino) {
                local.raise_epoch(*ino, Epoch(e));
            }
        }
        Ok(())
    }

    fn claim(&mut self, local: &mut LocalAuthority, ino: Ino, how: &str) -> Result<bool> {
        self.claimed(local, ino, how)
    }

    fn take_claims(&mut self) -> Vec<crate::namespace::replica::Condition> {
        std::mem::take(&mut self.claims)
    }

    fn held_anywhere(&mut self, ino: Ino) -> bool {
        let Some(name) = self.names.get(&ino).cloned() else { return false };
        // A change's transaction found entries in the queue the watch had
        // shown empty (it read them): held, as of that transaction.
        if self.busy.lock().remove(&name) {
            return true;
        }
        // What the host's watch of the queues saw, checked by the change's
        // own transaction (no entry under the queue); asked of etcd only
        // while the watch is down.
        let queue = self.arbiter.queue_prefix(&name);
        match self.watcher.as_ref().and_then(|w| w.mirror().queue(&queue)).map(|(kvs, _)| kvs.is_empty()) {
            Some(false) => return true,
            Some(true) => {
                let (busy, n) = (self.busy.clone(), name.clone());
                let seen: crate::namespace::replica::Busy = Arc::new(move || {
                    busy.lock().insert(n.clone());
                });
                // Nor a solo holder, which has no entry in the queue.
                self.claims.push(self.arbiter.no_solo(&name, seen.clone()));
                self.claims.push(crate::namespace::replica::Condition::Free { prefix: queue, busy: seen });
                return false;
            }
            None => {}
        }
        match self.arbiter.entries(&name) {
            Ok((entries, _)) => !entries.is_empty(),
            // Unknown: keeping the inode is the safe answer.
            Err(e) => {
                tracing::warn!(lease = %name, "cannot tell whether another host holds the lease: {e}");
                true
            }
        }
    }

    fn bind_path(&mut self, ino: Ino, path: &str) {
        // A lease with entries keeps the name they were queued under (a
        // live lease's name never moves: SPEC 4).
        if self.held.keys().any(|(i, _)| *i == ino) || self.parked.values().any(|p| p.ino == ino) {
            return;
        }
        let name = path.trim_start_matches('/');
        if !name.is_empty() && self.names.get(&ino).is_none_or(|n| n != name) {
            self.names.insert(ino, name.to_string());
        }
    }

    fn forget(&mut self, ino: Ino) {
        if !self.held.keys().any(|(i, _)| *i == ino) {
            self.names.remove(&ino);
        }
    }

    fn hold_condition(&self, ino: Ino) -> Option<crate::namespace::replica::Condition> {
        self.held.iter().find(|((i, _), t)| *i == ino && t.mode == QMode::Exclusive).map(|(_, t)| {
            let written = self.materialized.lock().get(&t.key).copied();
            match (&t.solo, written) {
                (Some(value), None) => {
                    let (materialized, key) = (self.materialized.clone(), t.key.clone());
                    crate::namespace::replica::Condition::HeldSolo {
                        counter: self.arbiter.epoch_key_of(&t.name),
                        value: value.clone().into_bytes(),
                        session: self.arbiter.session_key_of(t.session),
                        entry: t.key.clone(),
                        moved: Arc::new(move |rev| {
                            materialized.lock().insert(key.clone(), rev);
                        }),
                    }
                }
                (Some(_), Some(rev)) => {
                    crate::namespace::replica::Condition::Held { key: t.key.clone(), create_revision: rev }
                }
                (None, _) => crate::namespace::replica::Condition::Held {
                    key: t.key.clone(),
                    create_revision: t.create_revision,
                },
            }
        })
    }

    fn remote_events(&mut self) -> Vec<(crate::events::Event, Option<String>)> {
        self.watcher.as_ref().map(QueueWatcher::take_remote).unwrap_or_default()
    }

    fn listen(&mut self, on: bool) {
        let arbiter = self.arbiter.clone();
        self.errands.push(Errand::new(move || {
            if let Err(e) = arbiter.listen(on) {
                // Tried again by the lease timer.
                tracing::warn!("cannot tell other hosts whether events are read here: {e}");
            }
        }));
    }

    fn backend(&self) -> (&'static str, Option<serde_json::Value>) {
        let (lease, deadline, generation) = self.session.lease();
        let alive = self.session.alive().is_some();
        let info = json!({
            "endpoints": self.config.endpoints,
            "current_endpoint": self.arbiter.client().current(),
            "prefix": self.config.prefix,
            "host": self.config.host,
            "session": {
                "lease": format!("{lease:016x}"),
                "alive": alive,
                "ttl_secs": self.session.ttl(),
                "jeopardy_in_ms": if alive { deadline.saturating_duration_since(Instant::now()).as_millis() as u64 } else { 0 },
                "generation": generation,
                "lost": self.session.lost(),
            },
            "lock_delay_ms": self.config.lock_delay.as_millis() as u64,
            "request_timeout_ms": self.config.request_timeout.as_millis() as u64,
            "entries": { "held": self.held.len(), "waiting": self.parked.len(), "delayed": self.parked.values().filter(|p| p.held_until.is_some()).count(), "release_retries": self.leftover.pending() },
            "requests": self.arbiter.client().calls(),
            "fenced_by_session_loss": self.losses,
            "ttl_breaks": { "of_other_hosts": self.ttl_breaks.0, "by_other_hosts": self.ttl_breaks.1 },
            "handoffs": { "given": self.arbiter.handoffs(), "received": self.handoffs },
            "solo": { "granted": self.arbiter.solo_counts().0, "entries_written": self.arbiter.solo_counts().1 },
            "epoch_reads": { "shared": self.arbiter.shared_epoch_reads() },
        });
        ("etcd", Some(info))
    }

    fn break_reason(&self, ino: Ino, fenced: &Fenced) -> Option<&'static str> {
        self.lost_holders.contains(&(ino, fenced.handle)).then_some("host_lost")
    }

    fn remote_leases(&self) -> Option<RemoteLeases> {
        let (arbiter, me) = (self.arbiter.clone(), self.config.host.clone());
        Some(Box::new(move |prefix: &str| Self::list_remote(&arbiter, &me, prefix)))
    }

    fn remote_holders(&self, ino: Ino) -> Option<RemoteHolders> {
        let name = self.names.get(&ino)?.clone();
        let (arbiter, me) = (self.arbiter.clone(), self.config.host.clone());
        Some(Box::new(move || Self::holders_elsewhere(&arbiter, &me, &name)))
    }

    fn shutdown(&mut self) {
        for e in std::mem::take(&mut self.errands) {
            e.run();
        }
        let parked: Vec<Parked> = std::mem::take(&mut self.parked).into_values().collect();
        for p in &parked {
            self.unpark(p);
        }
        let tickets: Vec<Ticket> = parked
            .into_iter()
            .map(|p| p.ticket)
            .chain(self.held.drain().map(|(_, t)| t))
            .chain(self.ranges.drain().flat_map(|(_, ts)| ts))
            .collect();
        for t in tickets {
            // etcd not answering: stop here rather than wait out a timeout
            // per entry; they go when this host's session expires.
            if let Err(e) = self.arbiter.release(&t) {
                tracing::warn!("leaving the etcd queues at unmount: {e}; the rest go when the session expires");
                break;
            }
        }
    }
}
