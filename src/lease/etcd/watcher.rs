//! One watch per host over every lease queue of the namespace, waking the
//! waiters queued right behind an entry when etcd deletes it.
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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::client::{prefix_end, Client, EtcdError, WatchMsg};
use crate::lease::authority::Wake;

/// Deletions remembered for waiters that register after them.
const RECENT: usize = 4096;

#[derive(Debug, Default)]
struct Dispatch {
    /// Waiters by the key whose deletion they wait for.
    waiting: HashMap<Vec<u8>, Vec<Arc<AtomicBool>>>,
    /// Recently deleted keys and the revision of their deletion.
    deleted: HashMap<Vec<u8>, i64>,
    order: VecDeque<Vec<u8>>,
    /// The newest revision of a deletion no longer remembered.
    forgotten: i64,
    /// The watch covers every change after this revision.
    covers_after: i64,
    stop: bool,
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

    /// The watch restarts: whoever waits decides again.
    fn wake_all(&mut self) {
        for (_, flags) in self.waiting.drain() {
            for f in flags {
                f.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// The host's watch over `PREFIX/q/`; `Drop` stops it.
#[derive(Debug)]
pub struct QueueWatcher {
    dispatch: Arc<Mutex<Dispatch>>,
}

impl QueueWatcher {
    /// Watch every queue under `prefix`, waking `wake` when a waiter is ready.
    pub fn start(client: Arc<Client>, prefix: &str, wake: Wake) -> QueueWatcher {
        let dispatch = Arc::new(Mutex::new(Dispatch { covers_after: i64::MAX, ..Dispatch::default() }));
        let d = dispatch.clone();
        let q = format!("{}/q/", prefix.trim_end_matches('/')).into_bytes();
        let _ = std::thread::Builder::new().name("etcd-watch".into()).spawn(move || run(&client, &q, &d, &wake));
        QueueWatcher { dispatch }
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

    /// The wait for `key` ended otherwise (granted, interrupted, failed).
    pub fn unregister(&self, key: &[u8], ready: &Arc<AtomicBool>) {
        let mut d = self.dispatch.lock();
        if let Some(flags) = d.waiting.get_mut(key) {
            flags.retain(|f| !Arc::ptr_eq(f, ready));
            if flags.is_empty() {
                d.waiting.remove(key);
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
            // (Re)start from now: learn the revision, watch after it.
            match client.range(q, &prefix_end(q)).map(|(_, rev)| rev) {
                Ok(rev) => through = rev,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
        }
        let mut w = match client.watch(q, &end, through + 1) {
            Ok(w) => w,
            Err(EtcdError::Server { code: 11, .. }) => {
                // Compacted past what was seen: start again from now.
                through = 0;
                d.lock().covers_after = i64::MAX;
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
                    for e in events.into_iter().filter(|e| e.deleted) {
                        woke |= dd.deleted(e.kv.key, e.kv.mod_revision.max(revision));
                    }
                    through = through.max(revision);
                    drop(dd);
                    if woke {
                        wake.wake();
                    }
                }
                Ok(Some(WatchMsg::Compacted(_))) | Ok(Some(WatchMsg::Canceled(_))) => {
                    through = 0;
                    d.lock().covers_after = i64::MAX;
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
