//! The event stream behind `.leasefs/events` (SPEC 8): every change of
//! holder, wait, cancellation, break, fence and compare-and-swap rejection,
//! one JSON object per line, to every reader that opened the file before it
//! happened.
//!
//! Publishing never waits for a reader and never allocates without bound:
//! each reader has a buffer of [`READER_BUFFER`] lines; a reader that falls
//! behind loses the oldest and is told how many with one
//! `{"event":"lost","count":N}` line before the next events. The number of
//! readers is bounded too ([`MAX_READERS`]; `ENFILE` beyond).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, OnceLock};

use serde_json::json;

use crate::error::{Error, Result};

/// Lines kept per reader before the oldest are dropped.
pub const READER_BUFFER: usize = 4096;

/// Readers at once.
pub const MAX_READERS: usize = 1024;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A holder was granted the lease (at once or after waiting).
    Grant,
    /// A holder released it (unlock or close).
    Release,
    /// A request started waiting.
    Wait,
    /// A waiting request ended without the lease (signal).
    Cancel,
    /// A holder's lease was broken (TTL passed with a contender, or an
    /// administrator); the holder is fenced from now on.
    Break,
    /// An operation of a fenced holder was refused (`ESTALE`).
    Fence,
    /// A rename or unlink was refused by compare-and-swap (`ESTALE`).
    CasReject,
    /// A lease's TTL ran out with nobody waiting (the holder keeps it until
    /// a contender comes, which breaks it).
    Expire,
    /// A fault rule fired on a request (SPEC 13).
    Fault,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Grant => "grant",
            Kind::Release => "release",
            Kind::Wait => "wait",
            Kind::Cancel => "cancel",
            Kind::Break => "break",
            Kind::Fence => "fence",
            Kind::CasReject => "cas_reject",
            Kind::Expire => "expire",
            Kind::Fault => "fault",
        }
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    /// The lease's mount-relative path (`/dir/file`), empty if unknown.
    pub path: String,
    pub epoch: u64,
    pub pid: Option<u32>,
    /// `flock`, `posix` or `ofd`.
    pub owner: Option<&'static str>,
    /// `shared` or `exclusive`.
    pub mode: Option<&'static str>,
    /// Why (`ttl`, `admin` for breaks; the operation for fences and CAS).
    pub reason: Option<String>,
    /// The host of a holder on another host of a shared namespace.
    pub host: Option<String>,
    /// What a fault rule did.
    pub fault: Option<Box<Fault>>,
}

/// A fault that fired: the rule, the operation and what was done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub rule: u64,
    /// Which of the rule's matches fired.
    pub matched: u64,
    pub op: &'static str,
    pub action: crate::bench::Action,
}

impl Event {
    pub fn new(kind: Kind, path: String, epoch: u64) -> Event {
        Event { kind, path, epoch, pid: None, owner: None, mode: None, reason: None, host: None, fault: None }
    }

    /// The JSON line (stable field names; absent fields are left out).
    pub fn line(&self, ts_ms: u64, comm: Option<&str>) -> String {
        let mut v = json!({"event": self.kind.name(), "ts_ms": ts_ms, "path": self.path, "epoch": self.epoch});
        if let Some(p) = self.pid {
            v["pid"] = json!(p);
        }
        if let Some(c) = comm {
            v["comm"] = json!(c);
        }
        if let Some(o) = self.owner {
            v["owner"] = json!(o);
        }
        if let Some(m) = self.mode {
            v["mode"] = json!(m);
        }
        if let Some(r) = &self.reason {
            v["reason"] = json!(r);
        }
        if let Some(h) = &self.host {
            v["host"] = json!(h);
        }
        if let Some(f) = &self.fault {
            use crate::bench::Action;
            v["rule"] = json!(f.rule);
            v["match"] = json!(f.matched);
            v["op"] = json!(f.op);
            match f.action {
                Action::Errno { errno, delay_ms } => {
                    v["action"] = json!("errno");
                    v["errno"] = json!(crate::bench::errnos::name_of(errno).unwrap_or("?"));
                    if delay_ms > 0 {
                        v["delay_ms"] = json!(delay_ms);
                    }
                }
                Action::Delay { ms } => {
                    v["action"] = json!("delay");
                    v["delay_ms"] = json!(ms);
                }
                Action::Hang => v["action"] = json!("hang"),
                Action::Short { bytes } => {
                    v["action"] = json!("short");
                    v["bytes"] = json!(bytes);
                }
                Action::LoseLease => v["action"] = json!("lose_lease"),
                Action::Crash => v["action"] = json!("crash"),
            }
        }
        let mut s = v.to_string();
        s.push('\n');
        s
    }
}

/// A published event, shared by every reader that gets it and rendered
/// once, when the first of them reads it (a reader that never reads costs
/// no rendering).
#[derive(Debug)]
pub struct Item {
    pub event: Event,
    pub ts_ms: u64,
    pub comm: Option<String>,
    line: OnceLock<String>,
}

impl Item {
    pub fn new(event: Event, ts_ms: u64, comm: Option<String>) -> Item {
        Item { event, ts_ms, comm, line: OnceLock::new() }
    }

    fn line(&self) -> &str {
        self.line.get_or_init(|| self.event.line(self.ts_ms, self.comm.as_deref()))
    }
}

#[derive(Debug, Default)]
struct Reader {
    lines: VecDeque<Arc<Item>>,
    lost: u64,
    /// Only events whose path starts with this.
    prefix: String,
    /// A read waiting for events (the request's id).
    parked: Option<(u64, u32)>,
    /// A poll waiting for readability (the kernel's poll handle).
    polled: Option<u64>,
    /// In [`Hub::ready`]: its parked read is answered at the next delivery.
    queued: bool,
}

impl Reader {
    fn ready(&self) -> bool {
        self.lost > 0 || !self.lines.is_empty()
    }

    /// Whole lines, at most `max` bytes (at least one line however long).
    fn take(&mut self, max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        if self.lost > 0 {
            out.extend_from_slice(format!("{{\"event\":\"lost\",\"count\":{}}}\n", self.lost).as_bytes());
            self.lost = 0;
        }
        while let Some(item) = self.lines.front() {
            let l = item.line();
            if !out.is_empty() && out.len() + l.len() > max {
                break;
            }
            out.extend_from_slice(l.as_bytes());
            self.lines.pop_front();
        }
        out
    }
}

/// Every reader of the stream, by handle.
#[derive(Debug, Default)]
pub struct Hub {
    readers: HashMap<u64, Reader>,
    /// Readers whose parked read can be answered. The answer is taken when
    /// it is delivered, so events published in between go with it (one
    /// wake-up per burst, not per event).
    ready: Vec<u64>,
    /// Polls to wake (kernel poll handles).
    polls: Vec<u64>,
    published: u64,
}

/// What a read of the stream gets.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    Data(Vec<u8>),
    /// Nothing yet: the read is parked until an event comes.
    Parked,
}

impl Hub {
    /// Whether anyone listens (publishing is skipped otherwise).
    pub fn listening(&self) -> bool {
        !self.readers.is_empty()
    }

    /// Events published since the start.
    pub fn published(&self) -> u64 {
        self.published
    }

    /// Readers now.
    pub fn readers(&self) -> usize {
        self.readers.len()
    }

    /// A new reader on `handle`, seeing events from now on.
    pub fn open(&mut self, handle: u64) -> Result<()> {
        if self.readers.len() >= MAX_READERS {
            return Err(Error::TooManyOpen);
        }
        self.readers.insert(handle, Reader::default());
        Ok(())
    }

    /// The reader on `handle` went away; returns a parked read to end.
    pub fn close(&mut self, handle: u64) -> Option<u64> {
        self.readers.remove(&handle).and_then(|r| r.parked.map(|(id, _)| id))
    }

    /// Only events under `prefix` (a mount-relative path, `/` for all)
    /// for this reader from now on.
    pub fn filter(&mut self, handle: u64, prefix: &str) -> Result<()> {
        let r = self.readers.get_mut(&handle).ok_or(Error::BadHandle)?;
        r.prefix = crate::control::path_prefix(prefix)?.to_string();
        Ok(())
    }

    /// Read up to `max` bytes of whole lines; with nothing buffered,
    /// `EAGAIN` if `nonblock`, else the read parks as request `id`.
    pub fn read(&mut self, handle: u64, max: u32, nonblock: bool, id: u64) -> Result<Read> {
        let r = self.readers.get_mut(&handle).ok_or(Error::BadHandle)?;
        if r.ready() {
            return Ok(Read::Data(r.take(max as usize)));
        }
        if nonblock {
            return Err(Error::WouldBlock);
        }
        if r.parked.is_some() {
            // One read at a time per descriptor, as a pipe serialises them.
            return Err(Error::Busy);
        }
        r.parked = Some((id, max));
        Ok(Read::Parked)
    }

    /// A parked read was interrupted: true if it was parked here.
    pub fn interrupt(&mut self, id: u64) -> bool {
        for r in self.readers.values_mut() {
            if r.parked.is_some_and(|(p, _)| p == id) {
                r.parked = None;
                return true;
            }
        }
        false
    }

    /// Whether a read would return data now; otherwise remember `kh` and
    /// wake it when there is.
    pub fn poll(&mut self, handle: u64, kh: Option<u64>) -> Result<bool> {
        let r = self.readers.get_mut(&handle).ok_or(Error::BadHandle)?;
        if r.ready() {
            return Ok(true);
        }
        if kh.is_some() {
            r.polled = kh;
        }
        Ok(false)
    }

    /// Hand `item` to every reader whose filter matches. True when a parked
    /// read or a poll became ready (the caller wakes the delivery).
    pub fn publish(&mut self, item: Item) -> bool {
        self.published += 1;
        let item = Arc::new(item);
        let mut woke = false;
        for (h, r) in self.readers.iter_mut() {
            if !item.event.path.starts_with(&r.prefix) {
                continue;
            }
            if r.lines.len() >= READER_BUFFER {
                r.lines.pop_front();
                r.lost += 1;
            }
            r.lines.push_back(item.clone());
            if r.parked.is_some() && !r.queued {
                r.queued = true;
                self.ready.push(*h);
                woke = true;
            }
            if let Some(kh) = r.polled.take() {
                self.polls.push(kh);
                woke = true;
            }
        }
        woke
    }

    /// Parked reads that can be answered, with everything buffered for
    /// them now, and polls to wake.
    pub fn take_ready(&mut self) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
        let mut answers = Vec::new();
        for h in std::mem::take(&mut self.ready) {
            if let Some(r) = self.readers.get_mut(&h) {
                r.queued = false;
                if let Some((id, max)) = r.parked.take() {
                    answers.push((id, r.take(max as usize)));
                }
            }
        }
        (answers, std::mem::take(&mut self.polls))
    }

    /// Whether answers or wake-ups are waiting to be delivered.
    pub fn has_ready(&self) -> bool {
        !self.ready.is_empty() || !self.polls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: Kind, path: &str, epoch: u64) -> Event {
        Event::new(kind, path.to_string(), epoch)
    }

    fn publish(h: &mut Hub, e: Event) -> bool {
        h.publish(Item::new(e, 0, None))
    }

    #[test]
    fn readers_see_events_after_they_opened_in_order_as_whole_lines() {
        let mut h = Hub::default();
        publish(&mut h, ev(Kind::Grant, "/before", 1));
        h.open(1).unwrap();
        publish(&mut h, ev(Kind::Grant, "/a", 1));
        publish(&mut h, ev(Kind::Release, "/a", 1));
        let Read::Data(d) = h.read(1, 4096, false, 9).unwrap() else { panic!() };
        let text = String::from_utf8(d).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[0]["event"].as_str(), lines[0]["path"].as_str()), (Some("grant"), Some("/a")));
        assert_eq!(lines[1]["event"], "release");
        // A short buffer still gets whole lines (at least one).
        publish(&mut h, ev(Kind::Grant, "/a", 2));
        publish(&mut h, ev(Kind::Grant, "/a", 3));
        let Read::Data(d) = h.read(1, 10, false, 9).unwrap() else { panic!() };
        assert_eq!(d.iter().filter(|&&b| b == b'\n').count(), 1);
    }

    #[test]
    fn an_empty_stream_blocks_or_says_eagain_and_a_parked_read_is_answered_by_the_next_event() {
        let mut h = Hub::default();
        h.open(1).unwrap();
        assert_eq!(h.read(1, 4096, true, 5), Err(Error::WouldBlock));
        assert_eq!(h.read(1, 4096, false, 5).unwrap(), Read::Parked);
        assert!(!h.has_ready());
        assert!(!h.poll(1, Some(77)).unwrap());
        assert!(publish(&mut h, ev(Kind::Wait, "/a", 0)), "the first event wakes the delivery");
        assert!(!publish(&mut h, ev(Kind::Grant, "/a", 1)), "later ones of the burst do not");
        let (answers, polls) = h.take_ready();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].1.iter().filter(|&&b| b == b'\n').count(), 2, "the burst goes in one answer");
        assert_eq!(answers[0].0, 5);
        assert!(String::from_utf8_lossy(&answers[0].1).contains("\"event\":\"wait\""));
        assert_eq!(polls, [77]);
        // An interrupted read leaves the reader usable.
        assert_eq!(h.read(1, 4096, false, 6).unwrap(), Read::Parked);
        assert!(h.interrupt(6));
        assert!(!h.interrupt(6));
        assert_eq!(h.close(1), None);
    }

    #[test]
    fn a_slow_reader_loses_the_oldest_and_is_told_how_many() {
        let mut h = Hub::default();
        h.open(1).unwrap();
        for i in 0..READER_BUFFER as u64 + 10 {
            publish(&mut h, ev(Kind::Grant, "/a", i));
        }
        let Read::Data(d) = h.read(1, u32::MAX, false, 1).unwrap() else { panic!() };
        let text = String::from_utf8(d).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("{\"event\":\"lost\",\"count\":10}"));
        let first: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(first["epoch"], 10, "the oldest went");
        assert_eq!(lines.count(), READER_BUFFER - 1);
    }

    #[test]
    fn readers_are_bounded_with_enfile() {
        let mut h = Hub::default();
        for i in 0..MAX_READERS as u64 {
            h.open(i).unwrap();
        }
        assert_eq!(h.open(u64::MAX).map_err(Error::errno), Err(libc::ENFILE));
        h.close(0);
        h.open(u64::MAX).unwrap();
    }

    #[test]
    fn a_filter_keeps_only_paths_under_its_prefix() {
        let mut h = Hub::default();
        h.open(1).unwrap();
        h.open(2).unwrap();
        h.filter(1, "/jobs/\n").unwrap();
        assert_eq!(h.filter(1, "relative"), Err(Error::Invalid));
        publish(&mut h, ev(Kind::Grant, "/jobs/a", 1));
        publish(&mut h, ev(Kind::Grant, "/other", 1));
        let Read::Data(one) = h.read(1, 4096, true, 1).unwrap() else { panic!() };
        let Read::Data(two) = h.read(2, 4096, true, 2).unwrap() else { panic!() };
        assert_eq!(one.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(two.iter().filter(|&&b| b == b'\n').count(), 2);
    }
}
