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
//! carried over). A keep-alive answered after the deadline does not revive
//! the old lease: the host has already let its entries go with it.

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
        let answer = s.client.keep_alive(id);
        crate::failpoints::pausepoint("keep-alive-answer");
        match answer {
            Ok(ttl) if ttl > 0 => {
                if renew(&mut s.lease.lock(), id, sent, ttl, Instant::now()) {
                    next = sent + every;
                } else {
                    lose(s, id);
                    next = Instant::now();
                }
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

/// Apply a keep-alive answer for lease `id` (sent at `sent`, granting
/// `ttl`) at `now`: the deadline moves on only while the session is still
/// alive. An answer that comes after the deadline is too late to keep it:
/// from the deadline on the host acts on the loss (fences its holders and
/// drops its waiters and entries, which go with the lease), so reviving the
/// lease would leave those entries in etcd under a lease that lives on,
/// granted or queued for requests nobody answers, in every other host's
/// way for good. False: the session is lost (the old lease, renewed no
/// more, expires on the server and takes its entries with it).
fn renew(l: &mut Lease, id: i64, sent: Instant, ttl: i64, now: Instant) -> bool {
    if l.id != id {
        return true;
    }
    if now >= l.deadline {
        return false;
    }
    l.deadline = l.deadline.max(deadline_after(sent, ttl));
    true
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

    /// A keep-alive answered after the deadline does not revive the
    /// session the host has already given up (its entries would stay in
    /// etcd under a live lease: a Jepsen run hung on one).
    #[test]
    fn a_keep_alive_answered_after_the_deadline_does_not_revive_the_session() {
        let t0 = Instant::now();
        let mut l = Lease { id: 7, deadline: t0 + Duration::from_secs(1), generation: 1 };
        let sent = t0 + Duration::from_millis(900);
        assert!(renew(&mut l, 7, sent, 2, t0 + Duration::from_millis(950)), "in time");
        assert_eq!(l.deadline, deadline_after(sent, 2));
        let was = l.deadline;
        let late = was + Duration::from_millis(1);
        assert!(!renew(&mut l, 7, was - Duration::from_millis(10), 2, late), "too late: lost");
        assert_eq!(l.deadline, was, "the deadline stays passed");
        assert!(renew(&mut l, 8, sent, 2, late), "an answer for an older lease changes nothing");
        assert_eq!(l.deadline, was);
    }

    #[test]
    fn the_deadline_is_before_the_earliest_server_expiry_by_the_clock_margin() {
        let sent = Instant::now();
        let d = deadline_after(sent, 10);
        assert_eq!(d - sent, Duration::from_millis(9800));
        assert!(d < sent + Duration::from_secs(10));
        assert_eq!(deadline_after(sent, 0), sent);
    }
}
