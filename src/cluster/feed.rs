//! The host's one long-lived watch over the shared namespace (`P/ns/`).
//!
//! A thread keeps a watch open from the revision after the one the host's
//! table was last read at, and queues every change as it commits, grouped
//! by revision. A read barrier then costs one linearizable read (the
//! namespace's revision) and, when another host changed something, a wait
//! for this queue to reach that revision: no watch is opened per read
//! (etcd serves a watch opened from a past revision from a loop that runs
//! every 100 ms; one opened once and kept stays synced and sends each
//! change as it commits). This is the "consistent read from cache" of
//! Kubernetes' watch cache.
//!
//! The queue is bounded: past `MAX_QUEUED` events or `MAX_BYTES` of
//! values it is dropped and marked broken, and so is a watch whose next
//! revision etcd compacted away. A broken feed tells the table to read the
//! namespace whole and restart the feed after that read.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::client::{prefix_end, Client, Event, WatchMsg};

/// Events queued at most before the feed gives up and asks for a re-read.
const MAX_QUEUED: usize = 65_536;
/// Bytes of keys and values queued at most.
const MAX_BYTES: usize = 64 << 20;
/// How long the thread blocks on the stream before it looks at its
/// instructions (a restart, a stop).
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
struct State {
    /// Changes not taken yet: (revision, that revision's events).
    queue: VecDeque<(i64, Vec<Event>)>,
    events: usize,
    bytes: usize,
    /// The highest revision queued (or the start revision - 1).
    seen: i64,
    /// Events were lost (compaction, overflow): the table must re-read.
    broken: bool,
    /// Bumped by each restart: the thread reopens its watch from `seen + 1`.
    generation: u64,
}

/// The feed of one host's namespace table.
#[derive(Debug)]
pub struct Feed {
    state: Mutex<State>,
    moved: Condvar,
    stop: AtomicBool,
}

impl Feed {
    /// Start watching `base` (the namespace's key prefix) from the revision
    /// after `read_at`.
    pub fn start(client: Arc<Client>, base: Vec<u8>, read_at: i64) -> Arc<Feed> {
        let feed = Arc::new(Feed {
            state: Mutex::new(State { seen: read_at, ..State::default() }),
            moved: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let f = feed.clone();
        let _ = std::thread::Builder::new().name("etcd-ns-watch".into()).spawn(move || f.run(&client, &base));
        feed
    }

    /// Stop the thread (at its next poll).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Drop what is queued and follow from the revision after `read_at`
    /// (the table was just read whole at `read_at`).
    pub fn restart(&self, read_at: i64) {
        let mut s = self.state.lock();
        s.queue.clear();
        s.events = 0;
        s.bytes = 0;
        s.seen = read_at;
        s.broken = false;
        s.generation += 1;
    }

    /// Whether changes were lost since the last restart.
    pub fn broken(&self) -> bool {
        self.state.lock().broken
    }

    /// Wait until every change up to `revision` is queued (or `deadline`),
    /// then take the queue. `None`: the feed is broken or too slow.
    pub fn take_through(&self, revision: i64, deadline: Instant) -> Option<Vec<(i64, Vec<Event>)>> {
        let mut s = self.state.lock();
        while s.seen < revision && !s.broken {
            if self.moved.wait_until(&mut s, deadline).timed_out() {
                break;
            }
        }
        if s.broken || s.seen < revision {
            return None;
        }
        s.bytes = 0;
        s.events = 0;
        Some(s.queue.drain(..).collect())
    }

    /// Wait until every change up to `revision` is queued (or `deadline`,
    /// or the feed broke), taking nothing.
    pub fn wait_through(&self, revision: i64, deadline: Instant) {
        let mut s = self.state.lock();
        if s.seen >= revision || s.broken {
            return;
        }
        let started = Instant::now();
        while s.seen < revision && !s.broken {
            if self.moved.wait_until(&mut s, deadline).timed_out() {
                break;
            }
        }
        tracing::trace!(revision, us = started.elapsed().as_micros() as u64, "waited for the watch");
    }

    /// Whether every change up to `revision` is queued and none was lost.
    pub fn through(&self, revision: i64) -> bool {
        let s = self.state.lock();
        !s.broken && s.seen >= revision
    }

    /// Take what is queued now, without waiting. `None`: the feed is broken.
    pub fn take_ready(&self) -> Option<Vec<(i64, Vec<Event>)>> {
        let mut s = self.state.lock();
        if s.broken {
            return None;
        }
        s.bytes = 0;
        s.events = 0;
        Some(s.queue.drain(..).collect())
    }

    fn run(&self, client: &Client, base: &[u8]) {
        let end = prefix_end(base);
        while !self.stop.load(Ordering::Relaxed) {
            let (from, generation, broken) = {
                let s = self.state.lock();
                (s.seen + 1, s.generation, s.broken)
            };
            if broken {
                std::thread::sleep(POLL);
                continue;
            }
            let mut w = match client.watch_changes(base, &end, from) {
                Ok(w) => w,
                Err(e) => {
                    if matches!(e, super::client::EtcdError::Server { code: 11, .. }) {
                        self.lose(generation, "the namespace watch's revision was compacted");
                    }
                    std::thread::sleep(POLL * 2);
                    continue;
                }
            };
            loop {
                if self.stop.load(Ordering::Relaxed) || self.state.lock().generation != generation {
                    break;
                }
                match w.next(POLL) {
                    Ok(Some(WatchMsg::Events { events, .. })) => {
                        // Tests hold the events back here (a slow watch).
                        crate::failpoints::pausepoint("feed");
                        if !self.push(generation, events) {
                            break;
                        }
                    }
                    Ok(Some(WatchMsg::Compacted(_))) => {
                        self.lose(generation, "the namespace watch's revision was compacted");
                        break;
                    }
                    Ok(Some(WatchMsg::Canceled(why))) => {
                        tracing::debug!("namespace watch canceled: {why}; reopening");
                        break;
                    }
                    Ok(Some(WatchMsg::Created)) | Ok(None) => {}
                    // Reopened from the revision after the last one queued.
                    Err(e) => {
                        tracing::debug!("namespace watch: {e}; reopening");
                        break;
                    }
                }
            }
            w.close();
        }
    }

    /// Queue one message's events by revision; false when the feed broke.
    fn push(&self, generation: u64, events: Vec<Event>) -> bool {
        let mut s = self.state.lock();
        if s.generation != generation {
            return false;
        }
        for e in events {
            let rev = e.kv.mod_revision;
            if rev <= s.seen && s.queue.back().is_none_or(|(r, _)| *r != rev) {
                // Already queued before a reconnect.
                continue;
            }
            s.bytes += e.kv.key.len() + e.kv.value.len();
            s.events += 1;
            match s.queue.back_mut() {
                Some((r, evs)) if *r == rev => evs.push(e),
                _ => s.queue.push_back((rev, vec![e])),
            }
            s.seen = s.seen.max(rev);
        }
        let over = s.events > MAX_QUEUED || s.bytes > MAX_BYTES;
        drop(s);
        if over {
            self.lose(generation, "more namespace changes queued than kept");
            return false;
        }
        self.moved.notify_all();
        true
    }

    fn lose(&self, generation: u64, why: &str) {
        let mut s = self.state.lock();
        if s.generation != generation {
            return;
        }
        tracing::debug!("{why}: the namespace is read again");
        s.queue.clear();
        s.events = 0;
        s.bytes = 0;
        s.broken = true;
        drop(s);
        self.moved.notify_all();
    }
}
