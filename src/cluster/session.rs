//! A host's session with etcd: one etcd lease, kept alive by a thread, to
//! which every key this host holds or waits with is attached.
//!
//! **Jeopardy.** The host must stop acting on its locks *before* the server
//! can have expired the lease, not when it finds out afterwards. A
//! keep-alive sent at local time `s` and answered with TTL `t` means the
//! server will not expire the lease before `s + t` in real time (it
//! processed the request after `s`). Clocks drift: with a rate error of at
//! most [`CLOCK_RATE_ERROR`] on each side, the lease is surely alive until
//! `s + t × (1 − 2ε)`. That instant is the session's *deadline*; the
//! keep-alive thread renews every `t / 3` so that two lost renewals in a
//! row still leave a margin, and once the deadline passes without a newer
//! answer the session is **lost**: [`HostSession::alive`] turns false at
//! the deadline itself (checked against the clock, not the thread), the
//! `on_lost` callback runs (the daemon fences every local holder), and the
//! thread registers a new lease (a new session: nothing of the old one is
//! carried over).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::client::{Client, EtcdError, Result};

/// The largest clock-rate error assumed between this host and the etcd
/// members (1 %; NTP-disciplined clocks are within 0.05 %).
pub const CLOCK_RATE_ERROR: f64 = 0.01;

/// What the keep-alive thread tells the host.
pub type OnLost = Box<dyn Fn(i64) + Send + Sync>;

#[derive(Debug)]
struct Lease {
    id: i64,
    /// Until when the lease is surely alive on the server.
    deadline: Instant,
    /// Sessions registered so far (1 for the first).
    generation: u64,
}

/// Deadline of a lease whose keep-alive was sent at `sent` and granted `ttl` seconds.
pub fn deadline_after(sent: Instant, ttl: i64) -> Instant {
    sent + Duration::from_secs_f64(ttl.max(0) as f64 * (1.0 - 2.0 * CLOCK_RATE_ERROR))
}

struct Shared {
    client: Arc<Client>,
    ttl: i64,
    lease: Mutex<Lease>,
    changed: Condvar,
    stop: AtomicBool,
    /// Renewals paused (tests: a host that cannot reach etcd).
    paused: AtomicBool,
    on_lost: Mutex<Option<OnLost>>,
    lost_count: AtomicI64,
}

/// One host's etcd lease and its keep-alive thread; `Drop` revokes it.
pub struct HostSession {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostSession {
    /// Register with a new lease of `ttl` seconds (at least 2: etcd's
    /// minimum TTL is larger than one election).
    pub fn start(client: Arc<Client>, ttl: i64) -> Result<HostSession> {
        let ttl = ttl.max(2);
        let sent = Instant::now();
        let (id, granted) = client.grant(ttl)?;
        let lease = Lease { id, deadline: deadline_after(sent, granted), generation: 1 };
        let shared = Arc::new(Shared {
            client,
            ttl,
            lease: Mutex::new(lease),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            on_lost: Mutex::new(None),
            lost_count: AtomicI64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("etcd-session".into())
            .spawn(move || keep_alive(&s))
            .map_err(|e| EtcdError::Unavailable(format!("starting the keep-alive thread: {e}")))?;
        Ok(HostSession { shared, thread: Some(thread) })
    }

    /// Run `f` with the old lease's id whenever a session is lost.
    pub fn on_lost(&self, f: OnLost) {
        *self.shared.on_lost.lock() = Some(f);
    }

    /// The current lease id, if the session is alive now.
    pub fn alive(&self) -> Option<i64> {
        let l = self.shared.lease.lock();
        (Instant::now() < l.deadline).then_some(l.id)
    }

    /// The current lease id and until when it is surely alive.
    pub fn lease(&self) -> (i64, Instant, u64) {
        let l = self.shared.lease.lock();
        (l.id, l.deadline, l.generation)
    }

    /// The TTL asked for, in seconds.
    pub fn ttl(&self) -> i64 {
        self.shared.ttl
    }

    /// How many sessions were lost so far.
    pub fn lost(&self) -> i64 {
        self.shared.lost_count.load(Ordering::Relaxed)
    }

    /// Stop (or resume) renewing, as a host cut off from etcd would.
    pub fn pause_renewals(&self, paused: bool) {
        self.shared.paused.store(paused, Ordering::Relaxed);
        self.shared.changed.notify_all();
    }

    /// Wait until a session other than generation `than` is alive, at most `timeout`.
    pub fn wait_newer(&self, than: u64, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut l = self.shared.lease.lock();
        while !(l.generation > than && Instant::now() < l.deadline) {
            if self.shared.changed.wait_until(&mut l, end).timed_out() {
                return false;
            }
        }
        true
    }
}

fn keep_alive(s: &Shared) {
    let every = Duration::from_secs_f64(s.ttl as f64 / 3.0);
    let mut next = Instant::now() + every;
    loop {
        {
            let mut l = s.lease.lock();
            loop {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                let wake = next.min(l.deadline);
                if Instant::now() >= wake {
                    break;
                }
                s.changed.wait_until(&mut l, wake);
            }
        }
        let (id, deadline) = {
            let l = s.lease.lock();
            (l.id, l.deadline)
        };
        if Instant::now() >= deadline {
            lose(s, id);
            next = Instant::now();
            continue;
        }
        if s.paused.load(Ordering::Relaxed) {
            next = Instant::now() + every.min(Duration::from_millis(200));
            continue;
        }
        let sent = Instant::now();
        match s.client.keep_alive(id) {
            Ok(ttl) if ttl > 0 => {
                let mut l = s.lease.lock();
                if l.id == id {
                    l.deadline = l.deadline.max(deadline_after(sent, ttl));
                }
                next = sent + every;
            }
            // The server says the lease is gone: lost now, whatever the clock says.
            Ok(_) => {
                s.lease.lock().deadline = Instant::now();
                lose(s, id);
                next = Instant::now();
            }
            // Unreachable: retry soon; the deadline decides when it is lost.
            Err(_) => next = Instant::now() + Duration::from_millis(200).min(every),
        }
    }
}

/// The session with `id` is lost: tell the host, then register anew.
fn lose(s: &Shared, id: i64) {
    if s.lease.lock().id == id {
        s.lost_count.fetch_add(1, Ordering::Relaxed);
        if let Some(f) = s.on_lost.lock().as_ref() {
            f(id);
        }
    }
    // Register a new lease; until then every grant is refused (alive() is None).
    while !s.stop.load(Ordering::Relaxed) {
        if s.paused.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        let sent = Instant::now();
        if let Ok((new, ttl)) = s.client.grant(s.ttl) {
            let mut l = s.lease.lock();
            l.id = new;
            l.deadline = deadline_after(sent, ttl);
            l.generation += 1;
            s.changed.notify_all();
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

impl Drop for HostSession {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Hand everything this host held to the next waiters at once.
        let id = self.shared.lease.lock().id;
        let _ = self.shared.client.revoke(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_before_the_earliest_server_expiry_by_the_clock_margin() {
        let sent = Instant::now();
        let d = deadline_after(sent, 10);
        assert_eq!(d - sent, Duration::from_millis(9800));
        assert!(d < sent + Duration::from_secs(10));
        assert_eq!(deadline_after(sent, 0), sent);
    }
}
