//! What the operations make known: events for the readers of
//! `.leasefs/events` (with each process's command name), and the metrics
//! of what the lease core decided.

use super::*;

/// What the operations make known, and what they need to say it.
#[derive(Debug)]
pub(super) struct Reporting {
    pub(super) metrics: Metrics,
    /// When each parked lock request started waiting (lease clock, ms).
    pub(super) parked_at: HashMap<WaitId, u64>,
    /// Parked lock requests, for the events of their grant or cancellation.
    pub(super) parked_req: HashMap<WaitId, (Ino, Request)>,
    /// Readers of `.leasefs/events`.
    pub(super) events: crate::events::Hub,
    /// Why holders are being broken (`ttl` unless an administrator does it).
    pub(super) breaking: &'static str,
    /// Command names of processes named in events (bounded).
    pub(super) comms: HashMap<Proc, String>,
}

impl Default for Reporting {
    fn default() -> Reporting {
        Reporting {
            metrics: Metrics::default(),
            parked_at: HashMap::new(),
            parked_req: HashMap::new(),
            events: crate::events::Hub::default(),
            breaking: "ttl",
            comms: HashMap::new(),
        }
    }
}

impl State {
    /// Publish `ev` with the path it carries.
    pub(super) fn emit_as_is(&mut self, ev: crate::events::Event) {
        let ts = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let comm = ev.pid.and_then(|p| self.comm(p));
        if self.report.events.publish(crate::events::Item::new(ev, ts, comm)) {
            self.wake.wake();
        }
    }

    /// Publish `ev` about the lease at `ino` to the readers of
    /// `.leasefs/events` (nothing is computed when nobody reads).
    pub(super) fn emit(&mut self, mut ev: crate::events::Event, ino: Ino) {
        if !self.report.events.listening() {
            return;
        }
        ev.path = self.lease_path(ino);
        let ts = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let comm = ev.pid.and_then(|p| self.comm(p));
        if self.report.events.publish(crate::events::Item::new(ev, ts, comm)) {
            self.wake.wake();
        }
    }

    /// Publish events of holders on other hosts (their path, pid and
    /// command name come with them).
    pub(super) fn emit_remote(&mut self, events: Vec<(crate::events::Event, Option<String>)>) {
        if !self.report.events.listening() {
            return;
        }
        let ts = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut woke = false;
        for (ev, comm) in events {
            woke |= self.report.events.publish(crate::events::Item::new(ev, ts, comm));
        }
        if woke {
            self.wake.wake();
        }
    }

    /// A process's command name, cached by its identity (pid and start
    /// time, so a reused pid is not given an old name).
    pub(super) fn comm(&mut self, pid: u32) -> Option<String> {
        let p = self.proc(pid, false)?;
        if let Some(c) = self.report.comms.get(&p) {
            return Some(c.clone());
        }
        let c = crate::procfs::comm(pid)?;
        if self.report.comms.len() >= 4096 {
            self.report.comms.clear();
        }
        self.report.comms.insert(p, c.clone());
        Some(c)
    }

    /// The event of `req` (pid, lock API, mode).
    pub(super) fn lock_event(kind: crate::events::Kind, req: &Request, epoch: Epoch) -> crate::events::Event {
        let mut ev = crate::events::Event::new(kind, String::new(), epoch.0);
        ev.pid = Some(req.pid);
        ev.owner = Some(match req.kind {
            crate::lease::LockKind::Flock => "flock",
            crate::lease::LockKind::Posix => "posix",
        });
        ev.mode = req.mode.map(|m| match m {
            crate::lease::Mode::Shared => "shared",
            crate::lease::Mode::Exclusive => "exclusive",
        });
        ev
    }

    /// Release events for the locks of `ino` that `gone` selects, before
    /// they go.
    pub(super) fn releases(&mut self, ino: Ino, gone: impl Fn(&Lock) -> bool) -> Vec<crate::events::Event> {
        if !self.report.events.listening() {
            return Vec::new();
        }
        let epoch = self.lease.epoch(ino);
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for k in self.lease.table().lease(ino).map(|l| l.locks().to_vec()).unwrap_or_default() {
            if gone(&k) && !seen.contains(&k.owner) {
                seen.push(k.owner);
                let req = Request {
                    owner: k.owner,
                    kind: k.kind,
                    mode: Some(k.mode),
                    range: k.range,
                    pid: k.pid,
                    handle: k.handle,
                };
                out.push(Self::lock_event(crate::events::Kind::Release, &req, epoch));
            }
        }
        out
    }

    /// Count what the lease core decided (grants, waits, breaks).
    pub(super) fn account(&mut self, effects: &[Effect]) {
        let now = self.lease.now();
        for e in effects {
            match e {
                Effect::Grant(id) => {
                    self.report.metrics.acquisitions += 1;
                    if let Some(t) = self.report.parked_at.remove(id) {
                        self.report.metrics.waited(now.saturating_sub(t) as f64 / 1000.0);
                    }
                    if let Some((ino, req)) = self.report.parked_req.remove(id) {
                        let ev = Self::lock_event(crate::events::Kind::Grant, &req, self.lease.epoch(ino));
                        self.emit(ev, ino);
                    }
                }
                Effect::Refuse(id, err) => {
                    self.report.parked_at.remove(id);
                    if let Some((ino, req)) = self.report.parked_req.remove(id) {
                        let mut ev = Self::lock_event(crate::events::Kind::Cancel, &req, self.lease.epoch(ino));
                        ev.reason = Some(if *err == Error::Interrupted { "signal".into() } else { format!("{err}") });
                        self.emit(ev, ino);
                    }
                }
                Effect::Expired(ino, epoch, pid) => {
                    let mut ev = crate::events::Event::new(crate::events::Kind::Expire, String::new(), epoch.0);
                    ev.pid = Some(*pid);
                    self.emit(ev, *ino);
                }
                Effect::Broken(ino, f) => {
                    self.report.metrics.breaks += 1;
                    let mut ev = crate::events::Event::new(crate::events::Kind::Break, String::new(), f.epoch.0);
                    ev.pid = Some(f.pid);
                    ev.reason = Some(self.lease.break_reason(*ino, f).unwrap_or(self.report.breaking).to_string());
                    self.emit(ev, *ino);
                }
                Effect::Epoch(..) => {}
            }
        }
    }

    /// A fenced holder's operation was refused.
    pub(super) fn emit_fence(&mut self, ino: Ino, pid: u32, epoch: Epoch, what: &str) {
        let mut ev = crate::events::Event::new(crate::events::Kind::Fence, String::new(), epoch.0);
        ev.pid = Some(pid);
        ev.reason = Some(what.to_string());
        self.emit(ev, ino);
    }
}
