//! Cluster-wide lock arbitration and epochs in etcd.
//!
//! **Key schema** (under the mount's prefix `P`, lease names escaped so no
//! name's keys are a prefix of another's):
//! - A host session is an etcd lease: the entries below hang on it and
//!   vanish with it, and so does its session key `P/s/<lease>`, written
//!   before the session's first solo grant (below).
//! - `P/epoch/<name>`: the lease's epoch counter, `{"epoch":N,"holder":KEY}`
//!   (or the solo form below).
//!   Never deleted, so an epoch is never repeated or lowered, whatever is
//!   unlinked, re-created or restarted.
//! - `P/q/<name>/<session>/<seq>`: one entry per holder or waiter, on the
//!   session's etcd lease, `{"mode":"x"|"s","state":"wait"|"held",...}`.
//!   Entries are served in the order etcd created them (create revision).
//!
//! **One transaction when nothing is in the way.** An exclusive lease-level
//! request is queued and granted by one transaction that compares that
//! the queue is empty and that the counter reads `{epoch, no holder}` for
//! the highest epoch this host knows ([`Arbiter::join_and_decide`]); when
//! either is not so, the same transaction queues it as a waiter and reads
//! the queue and the counter, and the decision below goes on from that
//! read. A release is one transaction too ([`Arbiter::release`]).
//!
//! **Granting.** An entry may be granted when no entry created before it
//! conflicts with it (exclusive conflicts with everything, shared with
//! exclusive): strict arrival order across hosts, a shared request never
//! overtakes an earlier exclusive one. The decision is read at one
//! revision and applied by a transaction that compares the revisions it
//! was decided on: the entry itself (still there, so its host session is
//! alive) and the epoch counter (nobody was granted since). An exclusive
//! grant writes epoch + 1 in the same transaction. If anything changed,
//! the transaction fails and the decision is taken again. etcd's own Lock
//! RPC is not used (in etcd 3.4 it can grant to two holders after a pause).
//!
//! **Hand-off.** A holder's release grants the next waiter when it asks
//! for the whole lease exclusively, in the release's own transaction
//! (epoch + 1, compared on the counter and on both entries as the
//! releasing host's watch of the queues knows them). The waiter's host
//! sees its entry written held on its watch and grants it locally: a
//! hand-off between hosts costs one transaction and one watch event.
//!
//! **Waiting.** Each host has one watch over every queue
//! ([`super::watcher`]); a waiter is woken when its predecessor (the
//! latest earlier entry it conflicts with) is deleted or its own entry is
//! handed the lease, and otherwise decides again. A deletion that happened
//! between its decision and its registration wakes it at once, so none is
//! missed; a release wakes the waiters behind it, not all.
//!
//! **Solo holders.** An exclusive lease-level request whose ticket allows
//! it ([`Ticket::solo_ok`]) and finds nothing in its way is granted by a
//! transaction that writes the counter alone, `{"solo":{"lease":L,
//! "entry":E},"epoch":N,"holder":KEY}`: no queue entry (no watch event for
//! any host), compared on the host's session key `P/s/<L>` (written on
//! that etcd lease once per session, so it exists exactly while the
//! session does). Every reader of the counter knows the form: a waiter
//! that finds it writes the entry `E` at `KEY` on the holder's lease and
//! makes the counter a plain one naming it, in one transaction compared
//! on the counter's value and the session key (`Arbiter::unsolo`); from
//! then on the holder stands in the queue as any holder does, and a
//! holder stands in a waiter's way whatever its place in the queue. When
//! the session key is gone the counter only becomes a plain one: a holder
//! without an entry, lost. The holder's release compares the value it
//! wrote and clears it; when a waiter changed it, the release goes on as
//! any release does, from the queue that transaction read. A change that
//! needs a lease free (rename or unlink over it) compares that its counter
//! is absent or sorts before `{"solo"` (etcd compares values bytewise).
//! `leases`, `F_GETLK` and the epoch reads show a solo holder as any
//! other while its session lives.
//!
//! **Release and host loss.** A holder deletes its entry; a clean release
//! also clears `holder` in the counter (or names the waiter it handed the
//! lease to). When a host's session expires, etcd deletes its entries and
//! the next waiter is granted epoch + 1; the counter still naming a holder
//! whose entry is gone tells that waiter the previous holder was lost (for
//! `--lock-delay`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::client::{prefix_end, Client, Compare, EtcdError, Kv, Op, Result, WatchMsg};
use super::entries::entry;
pub use super::entries::{escape, overlap, owner_key, owner_kind, unescape, Asker, Entry, Mode};
use super::session::HostSession;
use super::watcher::Mirror;

use crate::namespace::replica::{Condition, Seen};

impl Entry {
    /// Whether this entry stands in the way of `t` (another owner's, on
    /// overlapping bytes, in a conflicting mode).
    fn blocks(&self, t: &Ticket, host: &str) -> bool {
        let same_owner = self.host == host && self.asker.owner == t.value["owner"].as_str().unwrap_or("");
        !same_owner && self.mode.conflicts(t.mode) && overlap(&self.ranges, &t.ranges)
    }
}

/// A request in the queue of one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub name: String,
    pub key: Vec<u8>,
    pub create_revision: i64,
    pub mode: Mode,
    /// The etcd lease the entry hangs on.
    pub session: i64,
    /// Byte ranges of a record lock (first and last byte); `None`: a
    /// lease-level lock (flock or the whole file).
    pub ranges: Option<Vec<(u64, u64)>>,
    /// `--lock-delay`: a decision that finds the previous holder lost
    /// grants nothing ([`Decision::HeldBack`]), unless that holder is
    /// `served` (its delay has passed on this host). The entry stays
    /// queued meanwhile, so nobody else is granted first.
    pub delay_lost: bool,
    /// The lost holder (its entry's key) whose lock delay has passed.
    pub served: Option<String>,
    /// May be granted as a *solo holder* when nothing is in the way: the
    /// counter alone records it, no entry is written (see the module's
    /// "Solo holders").
    pub solo_ok: bool,
    /// Granted solo: the counter's value as the grant wrote it (`None`
    /// once released, or when granted with an entry).
    pub solo: Option<String>,
    value: Value,
}

impl Ticket {
    /// Ask for byte ranges only (a record lock), not the whole lease.
    pub fn with_ranges(mut self, ranges: Vec<(u64, u64)>) -> Ticket {
        self.value["ranges"] = json!(ranges.iter().map(|r| [r.0, r.1]).collect::<Vec<_>>());
        self.ranges = Some(ranges);
        self
    }

    /// The TTL its entry shows other hosts.
    pub fn ttl_ms(&self) -> Option<u64> {
        self.value["ttl_ms"].as_u64()
    }

    /// Show other hosts `ttl` from the next write of its entry on.
    pub fn set_ttl_ms(&mut self, ttl: Option<u64>) {
        match (ttl, self.value.as_object_mut()) {
            (Some(ttl), _) => self.value["ttl_ms"] = json!(ttl),
            (None, Some(o)) => {
                o.remove("ttl_ms");
            }
            (None, None) => {}
        }
    }

    /// Record that etcd granted the entry, with `epoch`.
    pub fn mark_held(&mut self, epoch: u64) {
        self.value["state"] = json!("held");
        self.value["epoch"] = json!(epoch);
    }
}

/// What [`Arbiter::withdraw`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withdrawn {
    /// The wait left the queue (or was gone already): no epoch was taken.
    Left,
    /// A hand-off granted the entry before it could leave: the wait ended
    /// with this grant, at `epoch`, written at revision `rev`.
    Handed { epoch: u64, rev: i64 },
}

/// What one decision found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Granted with this epoch; `lost_holder` when the previous exclusive
    /// holder's session expired instead of releasing.
    Granted { epoch: u64, lost_holder: bool },
    /// Not yet: wait for this earlier entry to go, watching from `revision`.
    /// `breakable`: the predecessor holds with a TTL (its TTL and the
    /// revision of its last renewal).
    Behind { predecessor: Vec<u8>, revision: i64, breakable: Option<(u64, i64)> },
    /// The entry is gone (cancelled, or its session expired).
    Gone,
    /// Nothing granted: the previous exclusive holder (`holder`, its
    /// entry's key) was lost, and the ticket asked for the lock delay
    /// ([`Ticket::delay_lost`]). The entry waits, first in line; no epoch
    /// is taken until the delay has passed and it is decided again.
    HeldBack { holder: String },
}

/// The counter and the queue a transaction read (its answers from `at` on:
/// a get of the counter, then a get of the queue prefix), with the
/// revision they were read at.
fn counter_and_queue(r: &super::client::TxnResult, at: usize) -> Option<(Option<Kv>, Vec<Kv>, i64)> {
    match r.responses.get(at..)? {
        [super::client::OpResult::Range(c), super::client::OpResult::Range(q), ..] => {
            Some((c.first().cloned(), q.clone(), r.revision))
        }
        _ => None,
    }
}

/// The arbiter of one mount prefix, for one host session.
pub struct Arbiter {
    client: Arc<Client>,
    prefix: String,
    session: Arc<HostSession>,
    host: String,
    seq: AtomicU64,
    /// The epoch counters this host last read or wrote (epoch, holder,
    /// mod revision): a guess for one-transaction grants, checked by
    /// the transaction itself.
    counters: parking_lot::Mutex<std::collections::HashMap<String, Known>>,
    /// The etcd lease whose session key ([`Arbiter::session_key`]) this
    /// host has written (0: none yet).
    marked: std::sync::atomic::AtomicI64,
    /// Whether this host wants its listener key ([`Arbiter::listen`]),
    /// and the etcd lease the key is on (0: none).
    listening: parking_lot::Mutex<(bool, i64)>,
    /// The host's watch of the queues, once it runs: a release hands the
    /// lease to the next waiter from it without reading the queue first.
    mirror: parking_lot::Mutex<Option<Mirror>>,
    /// Releases that handed the lease to the next waiter.
    handoffs: AtomicU64,
    /// Solo grants of this host, and solo holders (of any host) whose
    /// entries this host wrote.
    solo: (AtomicU64, AtomicU64),
    /// Epoch reads, shared by the readers that come together.
    epoch_rounds: parking_lot::Mutex<EpochRounds>,
    epoch_done: parking_lot::Condvar,
}

/// Epoch reads in rounds: a reader that comes while a read is on its way
/// adds its names to the next one and takes its answer (SPEC 10: one
/// quorum read, shared by the readers that come together). A read sent
/// after a reader came shows every grant that completed before it came.
#[derive(Debug, Default)]
struct EpochRounds {
    /// Rounds sent so far (the last one may be on its way).
    sent: u64,
    on_its_way: bool,
    /// Names the next round reads.
    wanted: std::collections::BTreeSet<String>,
    /// Each name's epoch from the latest round that read it (or that
    /// round's failure), with the round's number.
    read: std::collections::HashMap<String, (u64, std::result::Result<u64, EtcdError>)>,
    /// Readers waiting now.
    waiting: usize,
    /// Readers served by a round another reader sent.
    shared: u64,
}

/// Attempts at a direct hand-off before a release only leaves the queue
/// (the waiters then decide for themselves).
const HANDOFFS: usize = 2;

/// Counters remembered at most (forgotten all at once past it).
const COUNTERS: usize = 65_536;

fn epoch_of(kv: Option<&Kv>) -> (u64, String, i64) {
    match kv {
        Some(kv) => {
            let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
            (v["epoch"].as_u64().unwrap_or(0), v["holder"].as_str().unwrap_or("").to_string(), kv.mod_revision)
        }
        None => (0, String::new(), 0),
    }
}

/// A solo holder as its counter records it: the etcd lease its entry
/// would hang on, and that entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solo {
    pub lease: i64,
    pub entry: Value,
}

/// The solo holder a counter's value records, if any.
pub fn solo_of(value: &[u8]) -> Option<Solo> {
    if !value.starts_with(SOLO_FROM) {
        return None;
    }
    let v: Value = serde_json::from_slice(value).ok()?;
    let lease = i64::from_str_radix(v["solo"]["lease"].as_str()?, 16).ok()?;
    Some(Solo { lease, entry: v["solo"]["entry"].clone() })
}

/// A counter recording a solo holder: `holder` (the key its entry would
/// have) granted `epoch`, on the etcd lease `lease`, with the entry value
/// `entry`. Spelled so that it sorts at or after [`SOLO_FROM`] and every
/// plain counter value before it (etcd compares values bytewise), and so
/// that `epoch` and `holder` read as in a plain one.
pub fn solo_value(epoch: u64, holder: &[u8], lease: i64, entry: &Value) -> String {
    format!(
        "{{\"solo\":{{\"lease\":\"{lease:016x}\",\"entry\":{entry}}},\"epoch\":{epoch},\"holder\":{}}}",
        Value::from(String::from_utf8_lossy(holder).into_owned())
    )
}

/// Every counter value recording a solo holder starts with these bytes;
/// a plain one (`{"epoch":…`) sorts before them.
pub const SOLO_FROM: &[u8] = b"{\"solo\"";

/// A counter as this host last read or wrote it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Known {
    epoch: u64,
    holder: String,
    rev: i64,
    /// Its value when it records a solo holder.
    solo: Option<Vec<u8>>,
    /// The holder it names was found gone (its entry, or a solo holder's
    /// session key) while the counter stayed as it is: a lost holder.
    lost: bool,
}

impl Arbiter {
    /// Arbitrate under `prefix` as `host` (shown to other hosts).
    pub fn new(client: Arc<Client>, prefix: &str, session: Arc<HostSession>, host: &str) -> Arbiter {
        Arbiter {
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            session,
            host: host.to_string(),
            seq: AtomicU64::new(0),
            counters: Default::default(),
            marked: Default::default(),
            listening: Default::default(),
            mirror: Default::default(),
            handoffs: AtomicU64::new(0),
            solo: Default::default(),
            epoch_rounds: Default::default(),
            epoch_done: Default::default(),
        }
    }

    /// Readers of epochs served by a read another reader sent.
    pub fn shared_epoch_reads(&self) -> u64 {
        self.epoch_rounds.lock().shared
    }

    /// Solo grants of this host, and solo holders whose entries it wrote.
    pub fn solo_counts(&self) -> (u64, u64) {
        (self.solo.0.load(Ordering::Relaxed), self.solo.1.load(Ordering::Relaxed))
    }

    /// Releases of this host that handed the lease to the next waiter.
    pub fn handoffs(&self) -> u64 {
        self.handoffs.load(Ordering::Relaxed)
    }

    /// `t` was handed the lease with `epoch` by a release committed at
    /// `rev` (which wrote the counter too).
    pub fn granted(&self, t: &Ticket, epoch: u64, rev: i64) {
        self.remember(&t.name, epoch, &String::from_utf8_lossy(&t.key), rev);
    }

    /// Hand leases on from what the host's watch of the queues knows.
    pub fn set_mirror(&self, mirror: Mirror) {
        *self.mirror.lock() = Some(mirror);
    }

    pub fn session(&self) -> &Arc<HostSession> {
        &self.session
    }

    /// The key of `name`'s epoch counter.
    pub fn epoch_key_of(&self, name: &str) -> Vec<u8> {
        self.epoch_key(name)
    }

    fn epoch_key(&self, name: &str) -> Vec<u8> {
        format!("{}/epoch/{}", self.prefix, escape(name)).into_bytes()
    }

    fn queue(&self, name: &str) -> Vec<u8> {
        format!("{}/q/{}/", self.prefix, escape(name)).into_bytes()
    }

    /// The session key of `lease`, for a write's condition.
    pub fn session_key_of(&self, lease: i64) -> Vec<u8> {
        self.session_key(lease)
    }

    /// The key that exists while the etcd lease `lease` does (written on
    /// it by the host whose session it is, before its first solo grant).
    fn session_key(&self, lease: i64) -> Vec<u8> {
        format!("{}/s/{lease:016x}", self.prefix).into_bytes()
    }

    /// The key prefix of the listener keys: while any is there, nobody is
    /// granted solo (grants stay entries every host's watch reports).
    fn listeners(&self) -> Vec<u8> {
        format!("{}/l/", self.prefix).into_bytes()
    }

    /// Whether a process on this host reads the events of every host
    /// (`.leasefs/events`): while one does, this host keeps a listener key
    /// on its session, and no host grants solo, so other hosts' grants
    /// and releases reach its watch. Returns once etcd has the key (or has
    /// dropped it).
    pub fn listen(&self, on: bool) -> Result<()> {
        let mut l = self.listening.lock();
        l.0 = on;
        self.sync_listening(&mut l)
    }

    /// True when the listener key is not as wanted (the session changed
    /// since it was written, or a write failed).
    pub fn listening_stale(&self) -> bool {
        let l = self.listening.lock();
        let lease = self.session.alive().unwrap_or(0);
        if l.0 {
            lease != 0 && l.1 != lease
        } else {
            l.1 != 0
        }
    }

    /// Bring the listener key to what is wanted.
    pub fn keep_listening(&self) -> Result<()> {
        let mut l = self.listening.lock();
        self.sync_listening(&mut l)
    }

    fn sync_listening(&self, l: &mut (bool, i64)) -> Result<()> {
        let lease = self.session.alive().unwrap_or(0);
        if l.1 != 0 && (!l.0 || l.1 != lease) {
            let mut key = self.listeners();
            key.extend_from_slice(format!("{:016x}", l.1).as_bytes());
            self.client.delete(&key, &[])?;
            l.1 = 0;
        }
        if l.0 && lease != 0 && l.1 != lease {
            let mut key = self.listeners();
            key.extend_from_slice(format!("{lease:016x}").as_bytes());
            self.client.put(&key, self.host.as_bytes(), lease)?;
            l.1 = lease;
            // Holders granted solo before the key was there get their
            // entries now, so that their releases reach every watch too.
            let c = format!("{}/epoch/", self.prefix).into_bytes();
            let (counters, _) = self.client.range(&c, &prefix_end(&c))?;
            for kv in counters.iter().filter(|kv| solo_of(&kv.value).is_some()) {
                let name = unescape(&String::from_utf8_lossy(&kv.key[c.len()..]));
                self.unsolo(&name, kv)?;
            }
        }
        Ok(())
    }

    /// Write this host's session key for `lease` unless written already.
    fn mark_session(&self, lease: i64) -> Result<()> {
        if self.marked.load(Ordering::Relaxed) != lease {
            self.client.put(&self.session_key(lease), self.host.as_bytes(), lease)?;
            self.marked.store(lease, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Give the solo holder that the counter of `name` records (`kv`, as
    /// read) its entry, written on that holder's etcd lease, and make the
    /// counter a plain one naming it: from then on the holder stands in
    /// the queue as if it had queued. When that lease is gone (its session
    /// key with it), the counter only stops recording a solo holder: it
    /// names a holder without an entry, one that was lost. Nothing changes
    /// when the counter moved on meanwhile.
    fn unsolo(&self, name: &str, kv: &Kv) -> Result<()> {
        use super::client::{CmpOp, OpResult, Target};
        let Some(solo) = solo_of(&kv.value) else { return Ok(()) };
        let (epoch, holder, _) = epoch_of(Some(kv));
        let ek = self.epoch_key(name);
        let same = Compare::new(ek.clone(), CmpOp::Equal, Target::Value(kv.value.clone()));
        let plain = Op::put(ek.clone(), counter_value(epoch, holder.as_bytes()), 0);
        let in_queue = holder.as_bytes().starts_with(&self.queue(name));
        if in_queue {
            let alive = Compare::new(self.session_key(solo.lease), CmpOp::Greater, Target::Version(0));
            let entry = Op::put(holder.as_bytes().to_vec(), solo.entry.to_string(), solo.lease);
            let r = self.client.txn(&[same.clone(), alive], &[entry, plain.clone()], &[Op::get(ek)])?;
            if r.succeeded {
                self.solo.1.fetch_add(1, Ordering::Relaxed);
            }
            let moved = match r.responses.first() {
                Some(OpResult::Range(kvs)) => kvs.first().is_none_or(|c| c.value != kv.value),
                _ => r.succeeded,
            };
            if r.succeeded || moved {
                return Ok(());
            }
        }
        // Its session is gone: a lost holder.
        self.client.txn(&[same], &[plain], &[])?;
        Ok(())
    }

    fn no_session() -> EtcdError {
        EtcdError::Unavailable("this host's etcd session is lost".into())
    }

    /// Join the queue of `name`. A put whose answer was lost may have
    /// queued the entry: it is deleted again (one try; see
    /// [`Arbiter::join`] to keep trying).
    pub fn enqueue(&self, name: &str, mode: Mode, asker: &Asker) -> Result<Ticket> {
        let mut t = self.ticket(name, mode, asker)?;
        match self.join(&mut t) {
            Err(e @ EtcdError::Indeterminate(_)) => {
                let _ = self.client.delete(&t.key, &[]);
                Err(e)
            }
            Err(e) => Err(e),
            Ok(()) => Ok(t),
        }
    }

    /// A ticket for the queue of `name` on the live session, not yet queued.
    pub fn ticket(&self, name: &str, mode: Mode, asker: &Asker) -> Result<Ticket> {
        let session = self.session.alive().ok_or_else(Self::no_session)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut key = self.queue(name);
        key.extend_from_slice(format!("{session:016x}/{seq:016x}").as_bytes());
        let mut value = json!({
            "mode": mode.tag(), "state": "wait", "host": self.host,
            "pid": asker.pid, "comm": asker.comm, "owner": asker.owner,
        });
        if let Some(ttl) = asker.ttl_ms {
            value["ttl_ms"] = json!(ttl);
        }
        Ok(Ticket {
            name: name.to_string(),
            key,
            create_revision: 0,
            mode,
            session,
            ranges: None,
            delay_lost: false,
            served: None,
            solo_ok: false,
            solo: None,
            value,
        })
    }

    /// Queue `t`. When this fails with [`EtcdError::Indeterminate`] the
    /// entry may be in the queue: the caller must delete it (until it
    /// succeeds), or it stands in everyone's way until this host's session
    /// expires.
    pub fn join(&self, t: &mut Ticket) -> Result<()> {
        // A new key: the put's revision is its create revision.
        t.create_revision = self.client.put(&t.key, t.value.to_string().as_bytes(), t.session)?;
        Ok(())
    }

    /// Every entry of `name`'s queue, in arrival order, and the revision read.
    pub fn entries(&self, name: &str) -> Result<(Vec<Entry>, i64)> {
        let q = self.queue(name);
        let r = self.client.txn(&[], &[Op::get(self.epoch_key(name)), Op::get_prefix(q)], &[])?;
        let (counter, kvs, rev) = counter_and_queue(&r, 0)
            .ok_or_else(|| EtcdError::Server { code: 0, message: "unexpected read answer".into() })?;
        let mut es: Vec<Entry> = kvs.iter().filter_map(entry).collect();
        if let Some(e) = counter.as_ref().and_then(|c| self.solo_entry(c, None).transpose()) {
            es.push(e?);
        }
        es.sort_by_key(|e| e.create_revision);
        Ok((es, rev))
    }

    /// The holder a counter (`kv`) records solo, as an entry (created at
    /// the counter's revision), while its session lives: `alive` names the
    /// sessions known to live, or `None` to ask etcd.
    fn solo_entry(&self, kv: &Kv, alive: Option<&std::collections::HashSet<Vec<u8>>>) -> Result<Option<Entry>> {
        let Some(solo) = solo_of(&kv.value) else { return Ok(None) };
        let sk = self.session_key(solo.lease);
        let lives = match alive {
            Some(set) => set.contains(&sk),
            None => self.client.get(&sk)?.0.is_some(),
        };
        let (_, holder, _) = epoch_of(Some(kv));
        let as_entry = Kv {
            key: holder.into_bytes(),
            value: solo.entry.to_string().into_bytes(),
            create_revision: kv.mod_revision,
            mod_revision: kv.mod_revision,
            version: 1,
            lease: solo.lease,
        };
        Ok(entry(&as_entry).filter(|_| lives))
    }

    /// Every entry of every queue, by lease name, and the epoch of each
    /// of those leases.
    pub fn all_entries(&self) -> Result<Vec<(String, u64, Vec<Entry>)>> {
        let q = format!("{}/q/", self.prefix).into_bytes();
        let (kvs, _) = self.client.range(&q, &prefix_end(&q))?;
        let mut by_name: std::collections::BTreeMap<String, Vec<Entry>> = Default::default();
        for kv in &kvs {
            let rest = String::from_utf8_lossy(&kv.key[q.len()..]).to_string();
            let Some((name, _)) = rest.split_once('/') else { continue };
            if let Some(e) = entry(kv) {
                by_name.entry(unescape(name)).or_default().push(e);
            }
        }
        // Solo holders: recorded in their counters only.
        let c = format!("{}/epoch/", self.prefix).into_bytes();
        let (counters, _) = self.client.range(&c, &prefix_end(&c))?;
        let solos: Vec<&Kv> = counters.iter().filter(|kv| solo_of(&kv.value).is_some()).collect();
        if !solos.is_empty() {
            let sk = format!("{}/s/", self.prefix).into_bytes();
            let alive = self.client.range(&sk, &prefix_end(&sk))?.0.into_iter().map(|kv| kv.key).collect();
            for kv in solos {
                let name = unescape(&String::from_utf8_lossy(&kv.key[c.len()..]));
                if let Some(e) = self.solo_entry(kv, Some(&alive))? {
                    by_name.entry(name).or_default().push(e);
                }
            }
        }
        let gets: Vec<Op> = by_name.keys().map(|n| Op::get(self.epoch_key(n))).collect();
        let epochs = if gets.is_empty() { Vec::new() } else { self.client.txn(&[], &gets, &[])?.responses };
        Ok(by_name
            .into_iter()
            .zip(
                epochs
                    .iter()
                    .map(|r| match r {
                        super::client::OpResult::Range(kvs) => epoch_of(kvs.first()).0,
                        _ => 0,
                    })
                    .chain(std::iter::repeat(0)),
            )
            .map(|((name, mut es), epoch)| {
                es.sort_by_key(|e| e.create_revision);
                (name, epoch, es)
            })
            .collect())
    }

    /// The epochs of `names` as etcd has them now (linearizable reads, one
    /// transaction per 64 names): no lower than any grant that completed
    /// anywhere before the call. Readers that come while a read is on its
    /// way share the next one (in rounds: `EpochRounds`).
    pub fn epochs(&self, names: &[&str]) -> Result<Vec<u64>> {
        let mut r = self.epoch_rounds.lock();
        // The round on its way may have been sent before this call: the
        // next one is this caller's.
        let mine = r.sent + 1;
        r.wanted.extend(names.iter().map(|n| n.to_string()));
        r.waiting += 1;
        let mut sent_one = false;
        loop {
            let answered = names.iter().all(|n| r.read.get(*n).is_some_and(|(round, _)| *round >= mine));
            if answered {
                r.waiting -= 1;
                if !sent_one {
                    r.shared += 1;
                }
                let out: Result<Vec<u64>> =
                    names.iter().map(|n| r.read.get(*n).map_or(Ok(0), |(_, v)| v.clone())).collect();
                if r.waiting == 0 && r.read.len() > 4096 {
                    r.read.clear();
                }
                return out;
            }
            if !r.on_its_way {
                r.sent += 1;
                r.on_its_way = true;
                let round = r.sent;
                let ask: Vec<String> = std::mem::take(&mut r.wanted).into_iter().collect();
                drop(r);
                sent_one = true;
                let refs: Vec<&str> = ask.iter().map(String::as_str).collect();
                let got = self.read_epochs(&refs);
                // Tests hold a round's answer back here (readers that come
                // meanwhile must not take it).
                crate::failpoints::pausepoint("epochs");
                r = self.epoch_rounds.lock();
                r.on_its_way = false;
                for (i, n) in ask.into_iter().enumerate() {
                    let v = got.as_ref().map(|es| es[i]).map_err(Clone::clone);
                    r.read.insert(n, (round, v));
                }
                self.epoch_done.notify_all();
                continue;
            }
            self.epoch_done.wait(&mut r);
        }
    }

    /// One round of [`Arbiter::epochs`]: linearizable reads, one
    /// transaction per 64 names.
    fn read_epochs(&self, names: &[&str]) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(names.len());
        for chunk in names.chunks(64) {
            if let [one] = chunk {
                out.push(self.epoch(one)?);
                continue;
            }
            let gets: Vec<Op> = chunk.iter().map(|n| Op::get(self.epoch_key(n))).collect();
            for r in self.client.txn(&[], &gets, &[])?.responses {
                out.push(match r {
                    super::client::OpResult::Range(kvs) => epoch_of(kvs.first()).0,
                    _ => 0,
                });
            }
        }
        Ok(out)
    }

    /// The epoch of `name` (0 if never held exclusively).
    pub fn epoch(&self, name: &str) -> Result<u64> {
        Ok(epoch_of(self.client.get(&self.epoch_key(name))?.0.as_ref()).0)
    }

    /// Decide once whether `t` can be granted now, and grant it if so.
    pub fn decide(&self, t: &Ticket) -> Result<Decision> {
        self.decide_from(t, None)
    }

    /// [`Arbiter::decide`], starting from a read already made: the counter,
    /// the queue and the revision they were read at.
    fn decide_from(&self, t: &Ticket, mut read: Option<(Option<Kv>, Vec<Kv>, i64)>) -> Result<Decision> {
        for _ in 0..16 {
            if self.session.alive() != Some(t.session) {
                return Ok(Decision::Gone);
            }
            let ek = self.epoch_key(&t.name);
            let (counter, queue, rev) = match read.take() {
                Some(r) => r,
                None => {
                    let q = self.queue(&t.name);
                    let r = self.client.txn(&[], &[Op::get(ek.clone()), Op::get_prefix(q)], &[])?;
                    counter_and_queue(&r, 0)
                        .ok_or_else(|| EtcdError::Server { code: 0, message: "unexpected read answer".into() })?
                }
            };
            if let Some(kv) = counter.as_ref().filter(|kv| solo_of(&kv.value).is_some()) {
                // Give the solo holder its entry first: then it stands in
                // the queue as any holder does.
                match self.unsolo(&t.name, kv) {
                    Ok(()) | Err(EtcdError::Indeterminate(_)) => continue,
                    Err(e) => return Err(e),
                }
            }
            let (epoch, holder, epoch_rev) = epoch_of(counter.as_ref());
            self.remember(&t.name, epoch, &holder, epoch_rev);
            let mut entries: Vec<(Entry, i64)> =
                queue.iter().filter_map(|kv| entry(kv).map(|e| (e, kv.mod_revision))).collect();
            entries.sort_by_key(|(e, _)| e.create_revision);
            let Some((mine, my_rev)) = entries.iter().find(|(e, _)| e.key == t.key).cloned() else {
                return Ok(Decision::Gone);
            };
            if mine.held {
                return Ok(Decision::Granted { epoch: mine.epoch, lost_holder: false });
            }
            // An earlier entry in the way, or a holder in the way whatever
            // its place (a solo holder's entry is written when a waiter
            // finds it, after that waiter's own).
            let blocker = entries
                .iter()
                .rfind(|(e, _)| (e.create_revision < mine.create_revision || e.held) && e.blocks(t, &self.host));
            if let Some((b, b_rev)) = blocker {
                let breakable = b.asker.ttl_ms.filter(|_| b.held).map(|ttl| (ttl, *b_rev));
                return Ok(Decision::Behind { predecessor: b.key.clone(), revision: rev, breakable });
            }
            // Record locks neither take the lease nor change its epoch.
            let lease_level = t.ranges.is_none();
            let lost_holder = lease_level
                && !holder.is_empty()
                && !entries.iter().any(|(e, _)| e.key == holder.as_bytes())
                && holder.as_bytes() != t.key;
            if lost_holder && t.delay_lost && t.served.as_deref() != Some(holder.as_str()) {
                // SPEC 5: no epoch is taken before the delay has passed.
                return Ok(Decision::HeldBack { holder });
            }
            let bumps = t.mode == Mode::Exclusive && lease_level;
            let new_epoch = if bumps { epoch + 1 } else { epoch };
            let mut success = vec![Op::put(t.key.clone(), held_value(t, new_epoch), t.session)];
            if bumps {
                success.push(Op::put(ek.clone(), counter_value(new_epoch, &t.key), 0));
            }
            // Decided at `rev`: my entry and the counter must be as read.
            let compares = [Compare::unchanged(t.key.clone(), my_rev), Compare::unchanged(ek, epoch_rev)];
            match self.client.txn(&compares, &success, &[]) {
                Ok(r) if r.succeeded => {
                    if bumps {
                        self.remember(&t.name, new_epoch, &String::from_utf8_lossy(&t.key), r.revision);
                    }
                    return Ok(Decision::Granted { epoch: new_epoch, lost_holder });
                }
                Ok(_) => continue,
                // Maybe applied: the next read tells (the entry says "held").
                Err(EtcdError::Indeterminate(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(EtcdError::Unavailable("the queue kept changing; try again".into()))
    }

    /// Queue `t` and decide it, in one transaction when nothing stands in
    /// the way: an exclusive lease-level request whose queue is empty and
    /// whose counter says the last holder this host knows of released it
    /// is granted epoch + 1 by the transaction that queues it. Otherwise
    /// that transaction queues it as a waiter and reads the queue and the
    /// counter, and the decision goes on from that read (one more
    /// transaction to confirm a grant). When this fails with
    /// [`EtcdError::Indeterminate`] the entry may be queued (see
    /// [`Arbiter::join`]).
    ///
    /// The counter is compared by value, `{epoch, no holder}`, not by
    /// revision: a value with an epoch is written once per epoch and a
    /// released one only by that epoch's holder, so the value alone says
    /// the epoch is `epoch` and nobody holds it, whoever released it and
    /// at whatever revision. The epoch guessed is the highest this host
    /// knows: its own last read or write, or a release its watch saw.
    pub fn join_and_decide(&self, t: &mut Ticket) -> Result<Decision> {
        let ek = self.epoch_key(&t.name);
        let q = self.queue(&t.name);
        let wait = Op::put(t.key.clone(), t.value.to_string(), t.session);
        let reads = [Op::get(ek.clone()), Op::get_prefix(q.clone())];
        let fast = t.mode == Mode::Exclusive && t.ranges.is_none();
        let Known { epoch: cached, rev, .. } = self.counters.lock().get(&t.name).cloned().unwrap_or_default();
        let seen = self.mirror.lock().as_ref().and_then(|m| m.last_release(&q)).map_or(0, |(e, _)| e);
        let epoch = cached.max(seen);
        let r = if fast {
            let free = if epoch == 0 && rev == 0 {
                // Never held, as far as this host knows: no counter yet.
                Compare::unchanged(ek.clone(), 0)
            } else {
                Compare::new(
                    ek.clone(),
                    super::client::CmpOp::Equal,
                    super::client::Target::Value(counter_value(epoch, b"").into_bytes()),
                )
            };
            let failure = [wait, reads[0].clone(), reads[1].clone()];
            if t.solo_ok {
                // The counter alone records the grant, on a live session.
                self.mark_session(t.session)?;
                let value = solo_value(epoch + 1, &t.key, t.session, &held_json(t, epoch + 1));
                let alive = Compare::new(
                    self.session_key(t.session),
                    super::client::CmpOp::Greater,
                    super::client::Target::Version(0),
                );
                let compares = [Compare::none_under(q), free, alive, Compare::none_under(self.listeners())];
                let r = self.client.txn(&compares, &[Op::put(ek, value.clone(), 0)], &failure)?;
                t.create_revision = r.revision;
                if r.succeeded {
                    let k = Known {
                        epoch: epoch + 1,
                        holder: String::from_utf8_lossy(&t.key).into_owned(),
                        rev: r.revision,
                        solo: Some(value.clone().into_bytes()),
                        lost: false,
                    };
                    self.know(&t.name, k);
                    self.solo.0.fetch_add(1, Ordering::Relaxed);
                    t.solo = Some(value);
                    return Ok(Decision::Granted { epoch: epoch + 1, lost_holder: false });
                }
                return self.decide_from(t, counter_and_queue(&r, 1));
            }
            let compares = [Compare::none_under(q), free];
            let success = [
                Op::put(t.key.clone(), held_value(t, epoch + 1), t.session),
                Op::put(ek, counter_value(epoch + 1, &t.key), 0),
            ];
            self.client.txn(&compares, &success, &failure)?
        } else {
            self.client.txn(&[], &[wait, reads[0].clone(), reads[1].clone()], &[])?
        };
        // Either way the entry was created by this transaction.
        t.create_revision = r.revision;
        if fast && r.succeeded {
            self.remember(&t.name, epoch + 1, &String::from_utf8_lossy(&t.key), r.revision);
            return Ok(Decision::Granted { epoch: epoch + 1, lost_holder: false });
        }
        // The failure branch queued the entry, then read.
        self.decide_from(t, counter_and_queue(&r, 1))
    }

    /// The key prefix of `name`'s queue.
    pub fn queue_prefix(&self, name: &str) -> Vec<u8> {
        self.queue(name)
    }

    /// Decide a waiter again after its predecessor left, in one
    /// transaction when it is an exclusive lease-level request now first
    /// in its queue and the counter is as `released` (the epoch and
    /// revision of a clean release the host's watch saw) or this host's
    /// last sight of it says: that transaction compares exactly that and
    /// grants epoch + 1. Otherwise its other branch reads the queue and the
    /// counter and the decision goes on from that read.
    pub fn decide_after(&self, t: &Ticket, released: Option<(u64, i64)>) -> Result<Decision> {
        if t.mode != Mode::Exclusive || t.ranges.is_some() || t.create_revision == 0 {
            return self.decide(t);
        }
        let cached = self.counters.lock().get(&t.name).cloned();
        let (epoch, holder, rev) = match (cached, released) {
            (Some(c), Some((e, r))) if r > c.rev => (e, String::new(), r),
            (Some(c), _) => (c.epoch, c.holder, c.rev),
            (None, Some((e, r))) => (e, String::new(), r),
            (None, None) => return self.decide(t),
        };
        if !holder.is_empty() {
            // A holder the counter still names: lost (the full decision
            // tells, and holds back under `--lock-delay`), or a solo
            // holder, or one whose entry a waiter wrote for it after
            // this one's (not older than it, so the comparison below
            // would not see it).
            return self.decide(t);
        }
        let ek = self.epoch_key(&t.name);
        let q = self.queue(&t.name);
        let first = Compare {
            range_end: prefix_end(&q),
            key: q.clone(),
            op: super::client::CmpOp::Greater,
            target: super::client::Target::Create(t.create_revision - 1),
        };
        let compares =
            [first, Compare::unchanged(t.key.clone(), t.create_revision), Compare::unchanged(ek.clone(), rev)];
        let success = [
            Op::put(t.key.clone(), held_value(t, epoch + 1), t.session),
            Op::put(ek.clone(), counter_value(epoch + 1, &t.key), 0),
        ];
        let r = match self.client.txn(&compares, &success, &[Op::get(ek), Op::get_prefix(q)]) {
            Ok(r) => r,
            // Maybe applied: a read tells (the entry says "held").
            Err(EtcdError::Indeterminate(_)) => return self.decide(t),
            Err(e) => return Err(e),
        };
        if r.succeeded {
            self.remember(&t.name, epoch + 1, &String::from_utf8_lossy(&t.key), r.revision);
            return Ok(Decision::Granted { epoch: epoch + 1, lost_holder: !holder.is_empty() });
        }
        self.decide_from(t, counter_and_queue(&r, 0))
    }

    /// Note the counter of `name` as read or written at `rev`.
    fn remember(&self, name: &str, epoch: u64, holder: &str, rev: i64) {
        self.know(name, Known { epoch, holder: holder.to_string(), rev, solo: None, lost: false });
    }

    /// Note the counter of `name` as read (`None`: absent).
    fn remember_kv(&self, name: &str, kv: Option<&Kv>) {
        let (epoch, holder, rev) = epoch_of(kv);
        let solo = kv.filter(|kv| solo_of(&kv.value).is_some()).map(|kv| kv.value.clone());
        self.know(name, Known { epoch, holder, rev, solo, lost: false });
    }

    fn know(&self, name: &str, k: Known) {
        let mut c = self.counters.lock();
        if c.len() >= COUNTERS && !c.contains_key(name) {
            c.clear();
        }
        c.insert(name.to_string(), k);
    }

    /// A renewal of the held entry `t` (granted with `epoch`): rewritten in
    /// place, so other hosts see it renewed (its mod revision moves). Never
    /// re-creates an entry that was broken meanwhile.
    pub fn touch(&self, t: &Ticket, epoch: u64) -> Result<bool> {
        let mut value = t.value.clone();
        value["state"] = json!("held");
        value["epoch"] = json!(epoch);
        self.rewrite(t, value)
    }

    /// Rewrite the held record-lock entry of `t` to the byte ranges `t`
    /// names now (fewer after an unlock of part of them, see
    /// [`Ticket::with_ranges`]; its place in the queue is kept). False when
    /// the entry is gone.
    pub fn shrink(&self, t: &Ticket) -> Result<bool> {
        self.rewrite(t, t.value.clone())
    }

    fn rewrite(&self, t: &Ticket, value: Value) -> Result<bool> {
        Ok(self.rewrite_read(t, value)?.is_some())
    }

    /// [`Arbiter::rewrite`], answering the entry's create revision. An
    /// entry this ticket never wrote (a solo holder's, written by a waiter
    /// that found it, or by [`Arbiter::retime`]) is known by the etcd
    /// lease it hangs on: only this session's holder has its key.
    fn rewrite_read(&self, t: &Ticket, value: Value) -> Result<Option<i64>> {
        use super::client::{CmpOp, OpResult, Target};
        let same = if t.solo.is_some() || t.create_revision == 0 {
            Compare::new(t.key.clone(), CmpOp::Equal, Target::Lease(t.session))
        } else {
            Compare::new(t.key.clone(), CmpOp::Equal, Target::Create(t.create_revision))
        };
        let r = self.client.txn(
            &[same],
            &[Op::put(t.key.clone(), value.to_string(), t.session), Op::get(t.key.clone())],
            &[],
        )?;
        if !r.succeeded {
            return Ok(None);
        }
        Ok(Some(match r.responses.get(1) {
            Some(OpResult::Range(kvs)) => kvs.first().map_or(t.create_revision, |kv| kv.create_revision),
            _ => t.create_revision,
        }))
    }

    /// The TTL of the lease the held `t` (granted with `epoch`) holds was
    /// set or removed after its grant: its entry shows it to other hosts
    /// from now on (their waiters break a holder by the TTL its entry
    /// shows). A holder granted solo has no entry yet: it is written here,
    /// as a waiter that found the holder would write it. The entry's
    /// create revision; `None` when the hold is gone in etcd.
    pub fn retime(&self, t: &Ticket, epoch: u64) -> Result<Option<i64>> {
        use super::client::{CmpOp, Target};
        let mut value = t.value.clone();
        value["state"] = json!("held");
        value["epoch"] = json!(epoch);
        if let Some(solo) = &t.solo {
            // The epoch the counter records (the grant's), not this
            // host's view of it: the counter is rewritten with it.
            let granted = serde_json::from_str::<Value>(solo).ok().and_then(|v| v["epoch"].as_u64()).unwrap_or(epoch);
            let mut value = value.clone();
            value["epoch"] = json!(granted);
            let ek = self.epoch_key(&t.name);
            let same = Compare::new(ek.clone(), CmpOp::Equal, Target::Value(solo.clone().into_bytes()));
            let alive = Compare::new(self.session_key(t.session), CmpOp::Greater, Target::Version(0));
            let r = self.client.txn(
                &[same, alive],
                &[Op::put(t.key.clone(), value.to_string(), t.session), Op::put(ek, counter_value(granted, &t.key), 0)],
                &[],
            )?;
            if r.succeeded {
                self.solo.1.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(r.revision));
            }
            // A waiter wrote the entry first (or the hold is gone): the
            // entry, if there, is rewritten below.
        }
        self.rewrite_read(t, value)
    }

    /// Break the holder entry `key` whose TTL passed unrenewed since
    /// revision `renewed` (its mod revision); false when it was renewed or
    /// left meanwhile.
    pub fn break_held(&self, key: &[u8], renewed: i64) -> Result<bool> {
        let same = Compare::unchanged(key.to_vec(), renewed);
        Ok(self.client.txn(&[same], &[Op::delete(key.to_vec())], &[])?.succeeded)
    }

    /// Block until `key` is deleted (or `deadline`); true if it was.
    pub fn wait_gone(&self, key: &[u8], after_revision: i64, deadline: Instant) -> Result<bool> {
        let mut w = self.client.watch(key, &[], after_revision + 1)?;
        loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                w.close();
                return Ok(false);
            };
            match w.next(left.min(Duration::from_millis(500)))? {
                Some(WatchMsg::Events { events, .. }) if events.iter().any(|e| e.deleted) => {
                    w.close();
                    return Ok(true);
                }
                // Compacted: re-deciding re-reads everything.
                Some(WatchMsg::Compacted(_)) | Some(WatchMsg::Canceled(_)) => {
                    w.close();
                    return Ok(true);
                }
                _ => {
                    // A lost session means the wait is over too (decide says Gone).
                    if self.session.alive().is_none() {
                        w.close();
                        return Ok(true);
                    }
                }
            }
        }
    }

    /// Take `name` in `mode`, waiting at most `timeout`; the epoch granted.
    /// Gives up (and leaves the queue) at the timeout.
    pub fn acquire(&self, name: &str, mode: Mode, asker: &Asker, timeout: Duration) -> Result<Option<(Ticket, u64)>> {
        self.acquire_ticket(self.ticket(name, mode, asker)?, timeout)
    }

    /// [`Arbiter::acquire`] with a ticket made by [`Arbiter::ticket`].
    pub fn acquire_ticket(&self, mut t: Ticket, timeout: Duration) -> Result<Option<(Ticket, u64)>> {
        let deadline = Instant::now() + timeout;
        let mut decided = match self.join_and_decide(&mut t) {
            Err(e @ EtcdError::Indeterminate(_)) => {
                let _ = self.client.delete(&t.key, &[]);
                return Err(e);
            }
            d => d,
        };
        loop {
            match decided {
                Ok(Decision::Granted { epoch, .. }) => {
                    t.mark_held(epoch);
                    return Ok(Some((t, epoch)));
                }
                Ok(Decision::Gone) => return Ok(None),
                // Not asked for (no `delay_lost` here): leave the queue.
                Ok(Decision::HeldBack { .. }) => {
                    let _ = self.release(&t);
                    return Ok(None);
                }
                Ok(Decision::Behind { predecessor, revision, .. }) => {
                    if !self.wait_gone(&predecessor, revision, deadline)? {
                        let _ = self.release(&t);
                        return Ok(None);
                    }
                    decided = self.decide(&t);
                }
                Err(e) => {
                    let _ = self.release(&t);
                    return Err(e);
                }
            }
        }
    }

    /// A new holder acquires `name` without the queue (a file created with
    /// `O_EXCL`, a name made by `link`) in the transaction that stores the
    /// change: the epoch it takes (one above the counter as this host last
    /// saw it) and the condition that writes it there, compared on that
    /// counter. When the counter had moved, the change is decided again on
    /// the counter as the failed transaction read it.
    ///
    /// Unless `always` (a `link`), a lease the counter shows held by a
    /// holder that is still there is re-attached instead (SPEC 4: a create
    /// of a live lease's name keeps its holders and epoch): the epoch as it
    /// is, and a condition that takes none (`false`: not acquired).
    pub fn claim(self: &Arc<Self>, name: &str, always: bool) -> (u64, Condition, bool) {
        let Known { epoch, holder, rev, solo, lost } = self.counters.lock().get(name).cloned().unwrap_or_default();
        let key = self.epoch_key(name);
        let me = Arc::downgrade(self);
        let n = name.to_string();
        if !always && !holder.is_empty() && !lost {
            let alive = match solo.as_deref().and_then(solo_of) {
                Some(s) => self.session_key(s.lease),
                None => holder.as_bytes().to_vec(),
            };
            let gone = alive.clone();
            let seen: Seen = Arc::new(move |kv: Option<(&[u8], i64)>| {
                let Some(a) = me.upgrade() else { return };
                match kv {
                    // The counter as decided on: was it the holder that went?
                    Some((_, r)) if r == rev => match a.client.get(&gone) {
                        Ok((None, _)) => {
                            if let Some(k) = a.counters.lock().get_mut(&n).filter(|k| k.rev == rev) {
                                k.lost = true;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => {
                            a.counters.lock().remove(&n);
                        }
                    },
                    Some((value, r)) => {
                        let kv = Kv { value: value.to_vec(), mod_revision: r, ..Default::default() };
                        a.remember_kv(&n, Some(&kv));
                    }
                    None => a.remember(&n, 0, "", 0),
                }
            });
            return (epoch, Condition::Reattach { key, mod_revision: rev, alive, seen }, false);
        }
        let seen: Seen = Arc::new(move |kv: Option<(&[u8], i64)>| {
            let Some(a) = me.upgrade() else { return };
            match kv {
                Some((value, rev)) => {
                    let kv = Kv { value: value.to_vec(), mod_revision: rev, ..Default::default() };
                    a.remember_kv(&n, Some(&kv));
                }
                None => a.remember(&n, 0, "", 0),
            }
        });
        // A solo holder stays one (its entry is not written here).
        let value = match solo.as_deref().and_then(solo_of) {
            Some(s) => solo_value(epoch + 1, holder.as_bytes(), s.lease, &s.entry),
            None => counter_value(epoch + 1, holder.as_bytes()),
        }
        .into_bytes();
        (epoch + 1, Condition::Claim { key, mod_revision: rev, value, seen }, true)
    }

    /// The condition that no solo holder holds `name` (for a change that
    /// found its queue empty), compared on the counter as this host last
    /// knew it; `busy` is told when the change's transaction finds one.
    pub fn no_solo(self: &Arc<Self>, name: &str, busy: crate::namespace::replica::Busy) -> Condition {
        let exists = self.counters.lock().get(name).is_some_and(|k| k.rev > 0);
        let me = Arc::downgrade(self);
        let n = name.to_string();
        let seen: Seen = Arc::new(move |kv: Option<(&[u8], i64)>| {
            let (Some(a), Some((value, rev))) = (me.upgrade(), kv) else { return };
            if solo_of(value).is_some() {
                busy();
            }
            a.remember_kv(&n, Some(&Kv { value: value.to_vec(), mod_revision: rev, ..Default::default() }));
        });
        Condition::NoSolo { key: self.epoch_key(name), exists, seen }
    }

    /// The host name other hosts see.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The key prefix of the mount's namespace.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The client every call goes through.
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// A waiter gives up (a signal, a `-w` timeout, its process killed):
    /// its entry leaves the queue in one transaction that compares it is
    /// still the wait it was queued as, so a hand-off can no longer grant
    /// it (SPEC 5: a wait that ends without a grant never takes an epoch).
    /// When the compare fails because another host's release handed it
    /// the lease meanwhile, the wait ended with that grant: the caller
    /// holds it ([`Withdrawn::Handed`]) rather than leave an epoch without
    /// a holder.
    pub fn withdraw(&self, t: &Ticket) -> Result<Withdrawn> {
        let mut known = t.create_revision;
        for _ in 0..4 {
            let waiting = Compare::unchanged(t.key.clone(), known);
            let r = self.client.txn(&[waiting], &[Op::delete(t.key.clone())], &[Op::get(t.key.clone())])?;
            if r.succeeded {
                return Ok(Withdrawn::Left);
            }
            let found = match r.responses.first() {
                Some(super::client::OpResult::Range(kvs)) => kvs.first().cloned(),
                _ => None,
            };
            let Some(kv) = found else { return Ok(Withdrawn::Left) };
            match entry(&kv) {
                Some(e) if e.held => return Ok(Withdrawn::Handed { epoch: e.epoch, rev: kv.mod_revision }),
                // Rewritten while still waiting: leave as it is now.
                _ => known = kv.mod_revision,
            }
        }
        self.client.delete(&t.key, &[])?;
        Ok(Withdrawn::Left)
    }

    /// Leave the queue (release a grant or cancel a wait), in one
    /// transaction: an exclusive holder also clears itself from the
    /// counter, compared on the counter's value, so a later holder's
    /// counter is never touched.
    ///
    /// **Hand-off.** When the next entry waits for the whole lease
    /// exclusively, the same transaction grants it instead: it deletes the
    /// holder's entry, writes the waiter's entry held with epoch + 1 and
    /// the counter naming it, compared on the counter's value and on the
    /// holder's and the waiter's entries being as the queue was known (the
    /// host's watch of the queues). Nothing else needs comparing: an entry
    /// created since has a later create revision, so it queues behind the
    /// waiter. The waiter's host learns of its grant from its watch,
    /// without a transaction of its own. When a compare fails the queue is
    /// read back and the decision taken again (twice at most), then
    /// the release only leaves the queue and the waiters decide.
    pub fn release(&self, t: &Ticket) -> Result<()> {
        let known = self.mirror.lock().as_ref().and_then(|m| m.queue(&self.queue(&t.name)));
        self.release_from(t, known)
    }

    /// [`Arbiter::release`], with the queue's entries as known at a
    /// revision (`None`: not known, no hand-off).
    pub fn release_from(&self, t: &Ticket, mut known: Option<(Vec<Kv>, i64)>) -> Result<()> {
        if t.mode != Mode::Exclusive || t.ranges.is_some() {
            self.client.delete(&t.key, &[])?;
            return Ok(());
        }
        let ek = self.epoch_key(&t.name);
        let epoch = match t.value["epoch"].as_u64().filter(|_| t.value["state"] == "held") {
            Some(e) => e,
            None => {
                // Not known to be granted (a wait, or a grant this ticket
                // was not marked with): read whether the counter names it.
                let (kv, _) = self.client.get(&ek)?;
                let (epoch, holder, _) = epoch_of(kv.as_ref());
                if holder.as_bytes() != t.key.as_slice() {
                    self.client.delete(&t.key, &[])?;
                    return Ok(());
                }
                epoch
            }
        };
        let q = self.queue(&t.name);
        if let Some(solo) = &t.solo {
            let same = Compare::new(
                ek.clone(),
                super::client::CmpOp::Equal,
                super::client::Target::Value(solo.clone().into()),
            );
            let reads = [Op::get(ek.clone()), Op::get_prefix(q.clone())];
            match self.client.txn(&[same], &[Op::put(ek.clone(), counter_value(epoch, b""), 0)], &reads) {
                Ok(r) if r.succeeded => {
                    self.remember(&t.name, epoch, "", r.revision);
                    return Ok(());
                }
                // A waiter gave this holder its entry (the queue as read
                // hands the lease on), or a claim moved the epoch on.
                Ok(r) => known = counter_and_queue(&r, 0).map(|(_, kvs, rev)| (kvs, rev)),
                // Maybe applied: the plain release below changes nothing
                // then, and clears the counter otherwise.
                Err(EtcdError::Indeterminate(_)) => known = None,
                Err(e) => return Err(e),
            }
        }
        let mine = Compare::new(
            ek.clone(),
            super::client::CmpOp::Equal,
            super::client::Target::Value(counter_value(epoch, &t.key).into_bytes()),
        );
        for _ in 0..HANDOFFS {
            let Some((kvs, _)) = known.take() else { break };
            let Some(next) = successor(&kvs, t, &self.host) else { break };
            let Some(me) = kvs.iter().find(|kv| kv.key == t.key) else { break };
            let compares = [
                mine.clone(),
                Compare::unchanged(t.key.clone(), me.mod_revision),
                Compare::unchanged(next.key.clone(), next.mod_revision),
            ];
            let mut value: Value = serde_json::from_slice(&next.value).unwrap_or(Value::Null);
            value["state"] = json!("held");
            value["epoch"] = json!(epoch + 1);
            // The holder's deletion comes first: the watch sees the
            // hand-off as that release and then the grant, in one revision.
            let success = [
                Op::delete(t.key.clone()),
                Op::put(next.key.clone(), value.to_string(), next.lease),
                Op::put(ek.clone(), counter_value(epoch + 1, &next.key), 0),
            ];
            let r = match self.client.txn(&compares, &success, &[Op::get(ek.clone()), Op::get_prefix(q.clone())]) {
                Ok(r) => r,
                // Maybe applied: the plain release below compares the
                // counter on this holder, so it changes nothing then.
                Err(EtcdError::Indeterminate(_)) => break,
                Err(e) => return Err(e),
            };
            if r.succeeded {
                self.handoffs.fetch_add(1, Ordering::Relaxed);
                self.remember(&t.name, epoch + 1, &String::from_utf8_lossy(&next.key), r.revision);
                return Ok(());
            }
            match counter_and_queue(&r, 0) {
                Some((counter, kvs, rev)) if epoch_of(counter.as_ref()).1.as_bytes() == t.key.as_slice() => {
                    known = Some((kvs, rev));
                }
                // No longer the holder named (broken, or a claim moved
                // the counter on): the plain release sorts it out.
                _ => break,
            }
        }
        let r = self.client.txn(
            &[mine],
            &[Op::delete(t.key.clone()), Op::put(ek.clone(), counter_value(epoch, b""), 0)],
            &[Op::delete(t.key.clone())],
        )?;
        if r.succeeded {
            self.remember(&t.name, epoch, "", r.revision);
            return Ok(());
        }
        self.counters.lock().remove(&t.name);
        // The counter moved on without a grant (an `O_EXCL` create bumped
        // it): clear this holder from it if it still names it.
        let (kv, _) = self.client.get(&ek)?;
        let (epoch, holder, _) = epoch_of(kv.as_ref());
        if let Some(kv) = kv.filter(|_| holder.as_bytes() == t.key.as_slice()) {
            let same = Compare::new(ek.clone(), super::client::CmpOp::Equal, super::client::Target::Value(kv.value));
            self.client.txn(&[same], &[Op::put(ek, counter_value(epoch, b""), 0)], &[])?;
        }
        Ok(())
    }
}

/// The entry the holder `t` hands its lease to on release, from the queue
/// `kvs`: the first waiter once `t` is gone, when it asks for the whole
/// lease exclusively and nothing else is in its way. `None`: nobody, or a
/// waiter the plain release lets decide for itself.
fn successor<'a>(kvs: &'a [Kv], t: &Ticket, host: &str) -> Option<&'a Kv> {
    let mut rest: Vec<(&Kv, Entry)> =
        kvs.iter().filter(|kv| kv.key != t.key).filter_map(|kv| entry(kv).map(|e| (kv, e))).collect();
    rest.sort_by_key(|(_, e)| e.create_revision);
    let (kv, first) = rest.first()?;
    let whole = first.mode == Mode::Exclusive && first.ranges.is_none() && !first.held;
    // Another entry of the same owner as the holder (same host) would
    // not block it, nor would it be handed over: left to decide.
    let own = first.host == host && first.asker.owner == t.value["owner"].as_str().unwrap_or("");
    (whole && !own).then_some(*kv)
}

/// The counter's value: the epoch and the holder entry's key (empty after
/// a clean release). Always spelled the same way: a release compares it.
fn counter_value(epoch: u64, holder: &[u8]) -> String {
    json!({"epoch": epoch, "holder": String::from_utf8_lossy(holder)}).to_string()
}

/// `t`'s entry once granted with `epoch`.
fn held_value(t: &Ticket, epoch: u64) -> String {
    held_json(t, epoch).to_string()
}

fn held_json(t: &Ticket, epoch: u64) -> Value {
    let mut value = t.value.clone();
    value["state"] = json!("held");
    value["epoch"] = json!(epoch);
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{LockKind, Owner};

    #[test]
    fn owners_are_written_in_words_of_their_own_and_read_back() {
        assert_eq!(owner_key(LockKind::Flock, Owner(0x1f)), "flock:1f");
        assert_eq!(owner_key(LockKind::Posix, Owner(0x2a)), "posix:2a");
        for kind in [LockKind::Flock, LockKind::Posix] {
            assert_eq!(owner_kind(&owner_key(kind, Owner(7))), kind);
        }
        // What hosts that wrote the Rust names put in etcd.
        assert_eq!(owner_kind("Flock:1f"), LockKind::Flock);
        assert_eq!(owner_kind("Posix:1f"), LockKind::Posix);
    }
}
