//! One watch per host over every lease queue of the namespace, waking the
//! waiters queued right behind an entry when etcd deletes it, and turning
//! other hosts' grants (an entry becoming held) and releases (a held entry
//! deleted) into events for `.leasefs/events`, in revision order, so in
//! epoch order per lease.
//!
//! Why one watch and not one per waiter: etcd serves a watch opened from a
//! revision it has already passed ("unsynced") from a loop that runs every
//! 100 ms, and under contention the revision a waiter decided on is
//! usually passed by the time its own watch would open, so every handoff
//! waited tens of milliseconds. A watch opened once from the current
//! revision stays synced and reports each deletion as it commits.
//!
//! No deletion is missed: a waiter decided at revision `R` registers for
//! its predecessor's deletion; a deletion the watch already reported after
//! `R` (kept in a bounded recent list) wakes it at once, and so does any
//! doubt (the watch restarted after `R`, or the list forgot entries after
//! `R`): a waiter woken needlessly only decides again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::client::{prefix_end, Client, EtcdError, Kv, WatchMsg};
use super::entries::{entry, owner_kind, unescape, Mode};
use crate::events::{Event, Kind};
use crate::lease::authority::Wake;
use crate::lease::LockKind;

/// Deletions remembered for waiters that register after them.
const RECENT: usize = 4096;
/// Other hosts' events kept until the lease timer takes them (the oldest
/// go first when nobody takes them).
const REMOTE: usize = 4096;

/// A lock held on another host, as its queue entry says.
#[derive(Debug, Clone)]
struct Theirs {
    path: String,
    epoch: u64,
    pid: u32,
    comm: String,
    owner: &'static str,
    mode: &'static str,
    host: String,
}

impl Theirs {
    fn event(&self, kind: Kind) -> (Event, Option<String>) {
        let mut ev = Event::new(kind, self.path.clone(), self.epoch);
        ev.pid = Some(self.pid);
        ev.owner = Some(self.owner);
        ev.mode = Some(self.mode);
        ev.host = Some(self.host.clone());
        (ev, (!self.comm.is_empty()).then(|| self.comm.clone()))
    }
}

/// The held entry `kv` of a queue under `q` when another host than `me`
/// holds it.
fn theirs(q: &[u8], kv: &Kv, me: &str) -> Option<Theirs> {
    let e = entry(kv)?;
    if !e.held || e.host == me {
        return None;
    }
    let rest = String::from_utf8_lossy(kv.key.get(q.len()..)?).into_owned();
    let (name, _) = rest.split_once('/')?;
    Some(Theirs {
        path: format!("/{}", unescape(name)),
        epoch: e.epoch,
        pid: e.asker.pid,
        comm: e.asker.comm,
        owner: match owner_kind(&e.asker.owner) {
            LockKind::Flock => "flock",
            LockKind::Posix => "posix",
        },
        mode: if e.mode == Mode::Shared { "shared" } else { "exclusive" },
        host: e.host,
    })
}

#[derive(Debug, Default)]
struct Dispatch {
    /// Waiters by the key whose deletion they wait for.
    waiting: HashMap<Vec<u8>, Vec<Arc<AtomicBool>>>,
    /// Waiters by their own entry's key, woken when it is written held (a
    /// release handed them the lease).
    handed: HashMap<Vec<u8>, Vec<Arc<AtomicBool>>>,
    /// Recently deleted keys and the revision of their deletion.
    deleted: HashMap<Vec<u8>, i64>,
    order: VecDeque<Vec<u8>>,
    /// The newest revision of a deletion no longer remembered.
    forgotten: i64,
    /// The watch covers every change after this revision.
    covers_after: i64,
    stop: bool,
    /// This host's name: its own entries are its own events already.
    me: String,
    /// Entries other hosts hold, by key.
    theirs: HashMap<Vec<u8>, Theirs>,
    /// Their grants and releases not taken yet.
    remote: VecDeque<(Event, Option<String>)>,
    /// The last exclusive lease-level release seen per queue prefix: the
    /// epoch it held and the revision of its deletion (a clean release
    /// rewrote the counter in that same revision).
    released: HashMap<Vec<u8>, (u64, i64)>,
    /// Every queue entry as of revision `through`: what a releaser hands
    /// its lease on from ([`Mirror::queue`]).
    entries: BTreeMap<Vec<u8>, Kv>,
    /// Every change up to this revision is in `entries`; 0: none yet.
    through: i64,
}

impl Dispatch {
    fn deleted(&mut self, key: Vec<u8>, rev: i64) -> bool {
        let woke = self.waiting.remove(&key).map(|flags| {
            for f in &flags {
                f.store(true, Ordering::Relaxed);
            }
        });
        if self.order.len() >= RECENT {
            if let Some(old) = self.order.pop_front() {
                if let Some(r) = self.deleted.remove(&old) {
                    self.forgotten = self.forgotten.max(r);
                }
            }
        }
        if self.deleted.insert(key.clone(), rev).is_none() {
            self.order.push_back(key);
        }
        woke.is_some()
    }

    /// An entry was written: another host's first write of it as held is
    /// a grant (later ones renew it).
    fn put(&mut self, q: &[u8], kv: &Kv) -> bool {
        let mut woke = false;
        let prev = self.entries.get(&kv.key).and_then(entry);
        if prev.as_ref().is_some_and(|p| !p.held) && entry(kv).is_some_and(|e| e.held) {
            // A waiter's own entry written held: a releaser handed it the
            // lease ([`super::arbiter::Arbiter::release`]).
            if let Some(flags) = self.handed.remove(&kv.key) {
                for f in &flags {
                    f.store(true, Ordering::Relaxed);
                }
                woke = true;
            }
            // That release rewrote the counter to the new holder, not to
            // an empty one: not a clean release to decide after.
            if let Some(queue) = queue_of(q, &kv.key) {
                if self.released.get(queue).is_some_and(|&(_, rev)| rev == kv.mod_revision) {
                    self.released.remove(queue);
                }
            }
        }
        // Another host's holder whose TTL was set, changed or removed after
        // its grant: the waiters behind it decide again, and so learn when
        // it may be broken (a renewal keeps the TTL and wakes nobody).
        if let (Some(p), Some(e)) = (prev.as_ref(), entry(kv)) {
            if e.held && e.host != self.me && p.asker.ttl_ms != e.asker.ttl_ms {
                if let Some(flags) = self.waiting.get(&kv.key) {
                    for f in flags {
                        f.store(true, Ordering::Relaxed);
                    }
                    woke = true;
                }
            }
        }
        let Some(t) = theirs(q, kv, &self.me) else { return woke };
        if self.theirs.contains_key(&kv.key) {
            return woke;
        }
        self.note(t.event(Kind::Grant));
        self.theirs.insert(kv.key.clone(), t);
        true
    }

    /// An entry was deleted: another host's held one is a release.
    fn gone(&mut self, key: &[u8]) -> bool {
        let Some(t) = self.theirs.remove(key) else { return false };
        self.note(t.event(Kind::Release));
        true
    }

    /// Remember the release of `key` (a held exclusive entry of epoch
    /// `epoch`) at revision `rev`, by its queue.
    fn released(&mut self, q: &[u8], key: &[u8], epoch: u64, rev: i64) {
        let Some(queue) = queue_of(q, key) else { return };
        if self.released.len() >= RECENT {
            self.released.clear();
        }
        self.released.insert(queue.to_vec(), (epoch, rev));
    }

    fn note(&mut self, ev: (Event, Option<String>)) {
        if self.remote.len() >= REMOTE {
            self.remote.pop_front();
        }
        self.remote.push_back(ev);
    }

    /// The watch restarts: whoever waits decides again.
    fn wake_all(&mut self) {
        for (_, flags) in self.waiting.drain().chain(self.handed.drain()) {
            for f in flags {
                f.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// The prefix `PREFIX/q/NAME/` of the queue an entry `key` is in.
fn queue_of<'k>(q: &[u8], key: &'k [u8]) -> Option<&'k [u8]> {
    let rest = key.get(q.len()..)?;
    let slash = rest.iter().position(|&b| b == b'/')?;
    Some(&key[..q.len() + slash + 1])
}

/// What the host's watch knows of the queues, for a releaser to hand its
/// lease on without reading them first.
#[derive(Debug, Clone)]
pub struct Mirror(Arc<Mutex<Dispatch>>);

impl Mirror {
    /// The entries of the queue `queue` (its key prefix) and the revision
    /// they are complete as of; `None` while the watch does not run.
    pub fn queue(&self, queue: &[u8]) -> Option<(Vec<Kv>, i64)> {
        let d = self.0.lock();
        if d.through == 0 || d.covers_after == i64::MAX {
            return None;
        }
        let end = prefix_end(queue);
        let kvs = d.entries.range(queue.to_vec()..end).map(|(_, kv)| kv.clone()).collect();
        Some((kvs, d.through))
    }

    /// The epoch and revision of the last exclusive release the watch saw
    /// in the queue `queue`.
    pub fn last_release(&self, queue: &[u8]) -> Option<(u64, i64)> {
        self.0.lock().released.get(queue).copied()
    }

    /// The entry `key` as the watch last saw it.
    pub fn entry(&self, key: &[u8]) -> Option<Kv> {
        let d = self.0.lock();
        if d.through == 0 || d.covers_after == i64::MAX {
            return None;
        }
        d.entries.get(key).cloned()
    }
}

/// The host's watch over `PREFIX/q/`; `Drop` stops it.
#[derive(Debug)]
pub struct QueueWatcher {
    dispatch: Arc<Mutex<Dispatch>>,
}

impl QueueWatcher {
    /// Watch every queue under `prefix`, waking `wake` when a waiter is ready.
    pub fn start(client: Arc<Client>, prefix: &str, me: &str, wake: Wake) -> QueueWatcher {
        let dispatch =
            Arc::new(Mutex::new(Dispatch { covers_after: i64::MAX, me: me.to_string(), ..Dispatch::default() }));
        let d = dispatch.clone();
        let q = format!("{}/q/", prefix.trim_end_matches('/')).into_bytes();
        let _ = std::thread::Builder::new().name("etcd-watch".into()).spawn(move || run(&client, &q, &d, &wake));
        QueueWatcher { dispatch }
    }

    /// What the watch knows of the queues.
    pub fn mirror(&self) -> Mirror {
        Mirror(self.dispatch.clone())
    }

    /// Set `ready` once the waiter's own entry `key` is written held (a
    /// release handed it the lease; at once when the watch already saw
    /// that); true when it is set. Only a change from waiting to held
    /// counts: a holder's renewal rewrites its entry held again.
    pub fn register_handed(&self, key: &[u8], ready: &Arc<AtomicBool>) -> bool {
        let mut d = self.dispatch.lock();
        if d.entries.get(key).and_then(entry).is_some_and(|e| e.held) {
            ready.store(true, Ordering::Relaxed);
            return true;
        }
        d.handed.entry(key.to_vec()).or_default().push(ready.clone());
        false
    }

    /// Set `ready` once `key`, seen alive at revision `decided`, is deleted
    /// (at once when that may already have happened); true when it is set.
    pub fn register(&self, key: &[u8], decided: i64, ready: &Arc<AtomicBool>) -> bool {
        let mut d = self.dispatch.lock();
        let gone = d.deleted.get(key).is_some_and(|&rev| rev > decided);
        // While no watch runs (covers_after is MAX) the next one wakes every
        // waiter when it starts.
        let gap = d.covers_after != i64::MAX && decided < d.covers_after;
        if gone || gap || decided < d.forgotten {
            ready.store(true, Ordering::Relaxed);
            return true;
        }
        d.waiting.entry(key.to_vec()).or_default().push(ready.clone());
        false
    }

    /// The epoch and revision of the last exclusive release seen in the
    /// queue `queue` (its key prefix, `PREFIX/q/NAME/`).
    pub fn last_release(&self, queue: &[u8]) -> Option<(u64, i64)> {
        self.dispatch.lock().released.get(queue).copied()
    }

    /// Other hosts' grants and releases since the last call, oldest first.
    pub fn take_remote(&self) -> Vec<(Event, Option<String>)> {
        self.dispatch.lock().remote.drain(..).collect()
    }

    /// The wait for `key` ended otherwise (granted, interrupted, failed).
    pub fn unregister(&self, key: &[u8], ready: &Arc<AtomicBool>) {
        let mut guard = self.dispatch.lock();
        let d = &mut *guard;
        for map in [&mut d.waiting, &mut d.handed] {
            if let Some(flags) = map.get_mut(key) {
                flags.retain(|f| !Arc::ptr_eq(f, ready));
                if flags.is_empty() {
                    map.remove(key);
                }
            }
        }
    }
}

impl Drop for QueueWatcher {
    fn drop(&mut self) {
        self.dispatch.lock().stop = true;
    }
}

fn run(client: &Client, q: &[u8], d: &Mutex<Dispatch>, wake: &Wake) {
    let end = prefix_end(q);
    // The last revision whose changes were all applied; 0: none yet.
    let mut through = 0i64;
    while !d.lock().stop {
        if through == 0 {
            // (Re)start from now: learn the revision and what other hosts
            // hold then (their grants before it are not news), watch after it.
            match client.range(q, &prefix_end(q)) {
                Ok((kvs, rev)) => {
                    through = rev;
                    let mut dd = d.lock();
                    let me = dd.me.clone();
                    dd.theirs = kvs.iter().filter_map(|kv| theirs(q, kv, &me).map(|t| (kv.key.clone(), t))).collect();
                    dd.entries = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
                    dd.through = rev;
                }
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
        }
        let mut w = match client.watch_changes(q, &end, through + 1) {
            Ok(w) => w,
            Err(EtcdError::Server { code: 11, .. }) => {
                // Compacted past what was seen: start again from now.
                through = 0;
                let mut dd = d.lock();
                dd.covers_after = i64::MAX;
                dd.through = 0;
                drop(dd);
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        {
            let mut dd = d.lock();
            if dd.covers_after > through {
                // A gap since the last watch (first start or after a
                // compaction): earlier decisions must be taken again.
                dd.covers_after = through;
                dd.wake_all();
                wake.wake();
            }
        }
        loop {
            if d.lock().stop {
                w.close();
                return;
            }
            match w.next(Duration::from_millis(500)) {
                Ok(Some(WatchMsg::Events { revision, events })) => {
                    let mut dd = d.lock();
                    let mut woke = false;
                    for e in events {
                        if e.deleted {
                            // The value before the change: from the copy
                            // (the watch does not send it).
                            let before = dd.entries.remove(&e.kv.key);
                            if let Some(prev) = before.as_ref().and_then(entry) {
                                if prev.held && prev.mode == Mode::Exclusive && prev.ranges.is_none() {
                                    dd.released(q, &e.kv.key, prev.epoch, e.kv.mod_revision.max(revision));
                                }
                            }
                            woke |= dd.gone(&e.kv.key);
                            woke |= dd.deleted(e.kv.key, e.kv.mod_revision.max(revision));
                        } else {
                            woke |= dd.put(q, &e.kv);
                            dd.entries.insert(e.kv.key.clone(), e.kv);
                        }
                    }
                    through = through.max(revision);
                    dd.through = through;
                    drop(dd);
                    if woke {
                        wake.wake();
                    }
                }
                Ok(Some(WatchMsg::Compacted(_))) | Ok(Some(WatchMsg::Canceled(_))) => {
                    through = 0;
                    let mut dd = d.lock();
                    dd.covers_after = i64::MAX;
                    dd.through = 0;
                    drop(dd);
                    w.close();
                    break;
                }
                Ok(Some(WatchMsg::Created)) | Ok(None) => {}
                // The stream broke: watch again after the last revision seen.
                Err(_) => break,
            }
        }
    }
}
