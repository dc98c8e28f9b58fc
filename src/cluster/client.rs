//! A synchronous client for etcd's v3 API through its JSON gateway
//! (`/v3/kv/*`, `/v3/lease/*`, `/v3/watch` on the client port; on by
//! default in etcd 3.4).
//!
//! Why the gateway and not gRPC: the daemon's FUSE session is synchronous
//! and a gRPC client brings an async runtime, code generation (`protoc`)
//! and a large dependency tree; the gateway speaks the same API as JSON
//! over HTTP/1.1, which [`super::http`] does with std alone.
//!
//! Every call is bounded by the client's request timeout, across all
//! endpoints tried. An endpoint that refuses connections or times out is
//! left for the next one (failover). A request whose answer was lost after
//! it was sent may or may not have been applied: reads are retried on the
//! next endpoint, writes are reported as [`EtcdError::Indeterminate`] so
//! the caller re-reads before deciding (a transaction guarded by the
//! revisions it was decided on can never apply twice).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::{json, Value};

use super::b64;
use super::http::{Conn, LineStream};

/// Why an etcd call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdError {
    /// No endpoint answered before the deadline; nothing was applied.
    Unavailable(String),
    /// A write was sent and its answer lost: it may have been applied.
    Indeterminate(String),
    /// The server refused the request (gRPC status code and message).
    Server { code: i64, message: String },
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Unavailable(m) => write!(f, "etcd unreachable: {m}"),
            EtcdError::Indeterminate(m) => write!(f, "etcd answer lost: {m}"),
            EtcdError::Server { code, message } => write!(f, "etcd refused ({code}): {message}"),
        }
    }
}

pub type Result<T> = std::result::Result<T, EtcdError>;

/// A key-value pair with its revisions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

/// What a comparison looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Number of writes since creation (0: the key does not exist).
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Vec<u8>),
    Lease(i64),
}

/// How a comparison compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Equal,
    Greater,
    Less,
    NotEqual,
}

/// One comparison of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    /// When not empty, every key of `[key, range_end)` must pass (an
    /// empty range compares as one absent key).
    pub range_end: Vec<u8>,
    pub op: CmpOp,
    pub target: Target,
}

impl Compare {
    pub fn new(key: impl Into<Vec<u8>>, op: CmpOp, target: Target) -> Compare {
        Compare { key: key.into(), range_end: Vec::new(), op, target }
    }

    /// No key starts with `prefix`.
    pub fn none_under(prefix: impl Into<Vec<u8>>) -> Compare {
        let key = prefix.into();
        Compare { range_end: prefix_end(&key), key, op: CmpOp::Equal, target: Target::Version(0) }
    }

    /// The key does not exist.
    pub fn absent(key: impl Into<Vec<u8>>) -> Compare {
        Compare::new(key, CmpOp::Equal, Target::Version(0))
    }

    /// The key was last written at `rev` (0: it does not exist).
    pub fn unchanged(key: impl Into<Vec<u8>>, rev: i64) -> Compare {
        Compare::new(key, CmpOp::Equal, Target::Mod(rev))
    }

    fn to_json(&self) -> Value {
        let result = match self.op {
            CmpOp::Equal => "EQUAL",
            CmpOp::Greater => "GREATER",
            CmpOp::Less => "LESS",
            CmpOp::NotEqual => "NOT_EQUAL",
        };
        let mut v = json!({"key": b64::encode(&self.key), "result": result});
        if !self.range_end.is_empty() {
            v["range_end"] = json!(b64::encode(&self.range_end));
        }
        let (target, field, value) = match &self.target {
            Target::Version(n) => ("VERSION", "version", json!(n.to_string())),
            Target::Create(n) => ("CREATE", "create_revision", json!(n.to_string())),
            Target::Mod(n) => ("MOD", "mod_revision", json!(n.to_string())),
            Target::Value(b) => ("VALUE", "value", json!(b64::encode(b))),
            Target::Lease(n) => ("LEASE", "lease", json!(n.to_string())),
        };
        v["target"] = json!(target);
        v[field] = value;
        v
    }
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Write `value` at `key`, attached to `lease` (0: none).
    Put { key: Vec<u8>, value: Vec<u8>, lease: i64 },
    /// Read `key`, or `[key, range_end)` when `range_end` is not empty.
    Get { key: Vec<u8>, range_end: Vec<u8> },
    /// Delete `key`, or `[key, range_end)`.
    Delete { key: Vec<u8>, range_end: Vec<u8> },
}

impl Op {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: i64) -> Op {
        Op::Put { key: key.into(), value: value.into(), lease }
    }

    pub fn get(key: impl Into<Vec<u8>>) -> Op {
        Op::Get { key: key.into(), range_end: Vec::new() }
    }

    pub fn get_prefix(prefix: impl Into<Vec<u8>>) -> Op {
        let key = prefix.into();
        Op::Get { range_end: prefix_end(&key), key }
    }

    pub fn delete(key: impl Into<Vec<u8>>) -> Op {
        Op::Delete { key: key.into(), range_end: Vec::new() }
    }

    fn to_json(&self) -> Value {
        match self {
            Op::Put { key, value, lease } => {
                let mut p = json!({"key": b64::encode(key), "value": b64::encode(value)});
                if *lease != 0 {
                    p["lease"] = json!(lease.to_string());
                }
                json!({ "request_put": p })
            }
            Op::Get { key, range_end } => json!({ "request_range": range_json(key, range_end) }),
            Op::Delete { key, range_end } => json!({ "request_delete_range": range_json(key, range_end) }),
        }
    }
}

fn range_json(key: &[u8], range_end: &[u8]) -> Value {
    let mut r = json!({"key": b64::encode(key)});
    if !range_end.is_empty() {
        r["range_end"] = json!(b64::encode(range_end));
    }
    r
}

/// The answer to one operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    Put,
    Range(Vec<Kv>),
    /// How many keys were deleted.
    Delete(i64),
}

/// A transaction's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnResult {
    /// Whether every comparison held (the success branch ran).
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
    pub responses: Vec<OpResult>,
}

/// The smallest key greater than every key starting with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: the range runs to the end of the keyspace.
    vec![0]
}

/// Whether a retry on another endpoint is safe.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Reads and lease keep-alives: applying twice changes nothing.
    Safe,
    /// Writes: retried only when nothing was sent.
    WriteOnce,
}

/// A client of one etcd cluster.
pub struct Client {
    endpoints: Vec<String>,
    /// Index of the endpoint requests go to first.
    preferred: AtomicUsize,
    idle: Mutex<Vec<Conn>>,
    timeout: Duration,
    /// Requests sent, by kind ([`CALLS`]), for `status`.
    calls: [AtomicU64; CALLS.len()],
    /// Answers received from any member (see [`Client::answered`]).
    answered: AtomicU64,
}

/// The kinds of request counted: the gateway paths, and watches opened.
pub const CALLS: [&str; 6] = ["range", "txn", "put", "deleterange", "lease", "watch"];

fn call_kind(path: &str) -> usize {
    let last = path.rsplit('/').next().unwrap_or("");
    CALLS.iter().position(|k| *k == last).unwrap_or(4)
}

/// `http://127.0.0.1:2379/` → `127.0.0.1:2379`.
fn host_of(url: &str) -> String {
    let s = url.trim();
    let s = s.strip_prefix("http://").unwrap_or(s);
    s.trim_end_matches('/').to_string()
}

fn num(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    v.as_str().and_then(b64::decode).unwrap_or_default()
}

fn kv(v: &Value) -> Kv {
    Kv {
        key: bytes(&v["key"]),
        value: bytes(&v["value"]),
        create_revision: num(&v["create_revision"]),
        mod_revision: num(&v["mod_revision"]),
        version: num(&v["version"]),
        lease: num(&v["lease"]),
    }
}

fn kvs(v: &Value) -> Vec<Kv> {
    v["kvs"].as_array().map(|a| a.iter().map(kv).collect()).unwrap_or_default()
}

fn revision(v: &Value) -> i64 {
    num(&v["header"]["revision"])
}

/// gRPC status codes that mean "this member cannot serve now, another may".
fn member_unavailable(code: i64, message: &str) -> bool {
    code == 14 || message.contains("no leader") || message.contains("leader changed")
}

impl Client {
    /// A client of the cluster at `endpoints` (`http://HOST:PORT` or
    /// `HOST:PORT`) whose every call ends within `timeout`.
    pub fn new(endpoints: &[String], timeout: Duration) -> Client {
        Client {
            endpoints: endpoints.iter().map(|e| host_of(e)).collect(),
            preferred: AtomicUsize::new(0),
            idle: Mutex::new(Vec::new()),
            timeout,
            calls: Default::default(),
            answered: AtomicU64::new(0),
        }
    }

    /// The endpoints, as `HOST:PORT`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many answers any member has given so far: when it moved since a
    /// failure, etcd is reachable again.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// The endpoint requests go to first now.
    pub fn current(&self) -> &str {
        &self.endpoints[self.preferred.load(Ordering::Relaxed) % self.endpoints.len()]
    }

    fn fail_over(&self, from: usize) {
        let _ = self.preferred.compare_exchange(
            from,
            (from + 1) % self.endpoints.len(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Requests sent so far, by kind.
    pub fn calls(&self) -> Value {
        let m: serde_json::Map<String, Value> =
            CALLS.iter().zip(&self.calls).map(|(k, n)| (k.to_string(), json!(n.load(Ordering::Relaxed)))).collect();
        Value::Object(m)
    }

    fn call(&self, path: &str, body: &Value, retry: Retry) -> Result<Value> {
        self.calls[call_kind(path)].fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let deadline = started + self.timeout;
        let body = body.to_string();
        tracing::trace!(path, %body, "etcd request");
        let mut why = String::from("no endpoint");
        for _ in 0..self.endpoints.len() * 2 {
            if Instant::now() >= deadline {
                break;
            }
            let at = self.preferred.load(Ordering::Relaxed) % self.endpoints.len();
            let host = &self.endpoints[at];
            let pooled = {
                let mut idle = self.idle.lock();
                let i = idle.iter().position(|c| c.host() == host);
                i.map(|i| idle.swap_remove(i))
            };
            let mut conn = match pooled {
                Some(c) => c,
                None => match Conn::connect(host, deadline) {
                    Ok(c) => c,
                    Err(e) => {
                        why = format!("{host}: {e}");
                        self.fail_over(at);
                        continue;
                    }
                },
            };
            match conn.post(path, body.as_bytes(), deadline) {
                Err(e) => {
                    why = format!("{host}: {e}");
                    self.fail_over(at);
                    if retry == Retry::WriteOnce {
                        return Err(EtcdError::Indeterminate(why));
                    }
                }
                Ok(r) => {
                    self.answered.fetch_add(1, Ordering::Relaxed);
                    self.idle.lock().push(conn);
                    let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                    tracing::trace!(path, us = started.elapsed().as_micros() as u64, status = r.status, "etcd answer");
                    if r.status == 200 {
                        return Ok(v);
                    }
                    let code = num(&v["code"]);
                    let message = v["message"].as_str().unwrap_or("").to_string();
                    if member_unavailable(code, &message) && retry == Retry::Safe {
                        why = format!("{host}: {message}");
                        self.fail_over(at);
                        continue;
                    }
                    return Err(EtcdError::Server { code, message });
                }
            }
        }
        Err(EtcdError::Unavailable(why))
    }

    /// `[key, range_end)` (just `key` when `range_end` is empty),
    /// linearizable; also the store's revision of the read.
    pub fn range(&self, key: &[u8], range_end: &[u8]) -> Result<(Vec<Kv>, i64)> {
        let v = self.call("/v3/kv/range", &range_json(key, range_end), Retry::Safe)?;
        Ok((kvs(&v), revision(&v)))
    }

    /// One key.
    pub fn get(&self, key: &[u8]) -> Result<(Option<Kv>, i64)> {
        let (mut found, rev) = self.range(key, &[])?;
        Ok((found.pop(), rev))
    }

    /// Write `value` at `key` (attached to `lease`, 0: none); the new revision.
    pub fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<i64> {
        let Value::Object(mut o) = Op::put(key, value, lease).to_json() else { unreachable!() };
        let p = o.remove("request_put").unwrap_or_default();
        Ok(revision(&self.call("/v3/kv/put", &p, Retry::WriteOnce)?))
    }

    /// Delete `[key, range_end)`; how many keys went.
    pub fn delete(&self, key: &[u8], range_end: &[u8]) -> Result<i64> {
        Ok(num(&self.call("/v3/kv/deleterange", &range_json(key, range_end), Retry::WriteOnce)?["deleted"]))
    }

    /// If every comparison holds run `success`, else `failure`, atomically.
    pub fn txn(&self, compares: &[Compare], success: &[Op], failure: &[Op]) -> Result<TxnResult> {
        let body = json!({
            "compare": compares.iter().map(Compare::to_json).collect::<Vec<_>>(),
            "success": success.iter().map(Op::to_json).collect::<Vec<_>>(),
            "failure": failure.iter().map(Op::to_json).collect::<Vec<_>>(),
        });
        let v = self.call("/v3/kv/txn", &body, Retry::WriteOnce)?;
        let responses = v["responses"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| {
                        if let Some(g) = r.get("response_range") {
                            OpResult::Range(kvs(g))
                        } else if let Some(d) = r.get("response_delete_range") {
                            OpResult::Delete(num(&d["deleted"]))
                        } else {
                            OpResult::Put
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(TxnResult { succeeded: v["succeeded"].as_bool().unwrap_or(false), revision: revision(&v), responses })
    }

    /// A new lease of `ttl` seconds; its id and the TTL granted.
    pub fn grant(&self, ttl: i64) -> Result<(i64, i64)> {
        // A lost answer leaves an orphan lease that expires by itself.
        let v = self.call("/v3/lease/grant", &json!({"TTL": ttl.to_string()}), Retry::Safe)?;
        if let Some(e) = v["error"].as_str().filter(|e| !e.is_empty()) {
            return Err(EtcdError::Server { code: 0, message: e.to_string() });
        }
        Ok((num(&v["ID"]), num(&v["TTL"])))
    }

    /// Renew `lease`; the TTL it has again, or 0 when it already expired.
    pub fn keep_alive(&self, lease: i64) -> Result<i64> {
        let v = self.call("/v3/lease/keepalive", &json!({"ID": lease.to_string()}), Retry::Safe)?;
        Ok(num(&v["result"]["TTL"]))
    }

    /// End `lease` now, deleting every key attached to it.
    pub fn revoke(&self, lease: i64) -> Result<()> {
        match self.call("/v3/lease/revoke", &json!({"ID": lease.to_string()}), Retry::Safe) {
            Ok(_) => Ok(()),
            // Already gone: what revoking wanted.
            Err(EtcdError::Server { message, .. }) if message.contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Watch `[key, range_end)` from `start_revision` (0: from now). Returns
    /// once etcd confirmed the watch, so every change after this call is
    /// reported.
    pub fn watch(&self, key: &[u8], range_end: &[u8], start_revision: i64) -> Result<Watch> {
        self.open_watch(key, range_end, start_revision, true)
    }

    /// [`Client::watch`] without the previous values of changed keys (each
    /// costs etcd a read per event; a watcher that keeps its own copy of
    /// the keys does not need them).
    pub fn watch_changes(&self, key: &[u8], range_end: &[u8], start_revision: i64) -> Result<Watch> {
        self.open_watch(key, range_end, start_revision, false)
    }

    fn open_watch(&self, key: &[u8], range_end: &[u8], start_revision: i64, prev_kv: bool) -> Result<Watch> {
        self.calls[5].fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + self.timeout;
        let mut req = range_json(key, range_end);
        if prev_kv {
            req["prev_kv"] = json!(true);
        }
        if start_revision > 0 {
            req["start_revision"] = json!(start_revision.to_string());
        }
        let body = json!({ "create_request": req }).to_string();
        let mut why = String::from("no endpoint");
        for _ in 0..self.endpoints.len() {
            let at = self.preferred.load(Ordering::Relaxed) % self.endpoints.len();
            let host = self.endpoints[at].clone();
            let opened = Conn::connect(&host, deadline).and_then(|c| c.stream("/v3/watch", body.as_bytes(), deadline));
            let mut stream = match opened {
                Ok(s) => s,
                Err(e) => {
                    why = format!("{host}: {e}");
                    self.fail_over(at);
                    continue;
                }
            };
            let mut w = Watch { stream: None, host: host.clone(), pending: Vec::new() };
            // The first answer confirms (or refuses) the watch.
            loop {
                let Some(wait) = deadline.checked_duration_since(Instant::now()) else {
                    return Err(EtcdError::Unavailable(format!("{host}: watch not confirmed in time")));
                };
                match stream.next_line(wait) {
                    Ok(Some(line)) => match parse_watch(&line) {
                        Some(WatchMsg::Created) => {
                            w.stream = Some(stream);
                            return Ok(w);
                        }
                        Some(WatchMsg::Compacted(rev)) => return Err(compacted(rev)),
                        Some(WatchMsg::Canceled(why)) => {
                            return Err(EtcdError::Server { code: 0, message: format!("watch canceled: {why}") })
                        }
                        // Events may come in the same burst as the confirmation.
                        Some(m @ WatchMsg::Events { .. }) => w.pending.push(m),
                        None => {}
                    },
                    Ok(None) => {}
                    Err(e) => {
                        why = format!("{host}: {e}");
                        self.fail_over(at);
                        break;
                    }
                }
            }
        }
        Err(EtcdError::Unavailable(why))
    }
}

fn compacted(rev: i64) -> EtcdError {
    EtcdError::Server { code: 11, message: format!("required revision has been compacted (oldest kept: {rev})") }
}

/// An event of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `false` for a put, `true` for a delete.
    pub deleted: bool,
    pub kv: Kv,
    /// The key's value before the event, when etcd still had it.
    pub prev: Option<Kv>,
}

/// What a watch delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMsg {
    Created,
    /// Changes, all at `revision` or before it.
    Events {
        revision: i64,
        events: Vec<Event>,
    },
    /// The start revision is gone; re-read and watch from `compact_revision`.
    Compacted(i64),
    Canceled(String),
}

fn parse_watch(line: &[u8]) -> Option<WatchMsg> {
    let v: Value = serde_json::from_slice(line).ok()?;
    let r = &v["result"];
    if r.is_null() {
        return Some(WatchMsg::Canceled(v["error"]["message"].as_str().unwrap_or("stream error").to_string()));
    }
    let compact = num(&r["compact_revision"]);
    if compact > 0 {
        return Some(WatchMsg::Compacted(compact));
    }
    if r["canceled"].as_bool() == Some(true) {
        return Some(WatchMsg::Canceled(r["cancel_reason"].as_str().unwrap_or("").to_string()));
    }
    if r["created"].as_bool() == Some(true) {
        return Some(WatchMsg::Created);
    }
    let events: Vec<Event> = r["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| Event {
                    deleted: e["type"].as_str() == Some("DELETE"),
                    kv: kv(&e["kv"]),
                    prev: e.get("prev_kv").map(kv),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(WatchMsg::Events { revision: revision(r), events })
}

/// A stream of changes under a key range, from one member.
pub struct Watch {
    stream: Option<LineStream>,
    host: String,
    pending: Vec<WatchMsg>,
}

impl Watch {
    /// The member this watch streams from.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The next message, waiting at most `wait` (`Ok(None)`: nothing yet).
    /// An error means the stream is gone: watch again from the revision
    /// after the last one seen.
    pub fn next(&mut self, wait: Duration) -> Result<Option<WatchMsg>> {
        if !self.pending.is_empty() {
            return Ok(Some(self.pending.remove(0)));
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(EtcdError::Unavailable(format!("{}: watch closed", self.host)));
        };
        let deadline = Instant::now() + wait;
        loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return Ok(None) };
            match stream.next_line(left) {
                Ok(Some(line)) => match parse_watch(&line) {
                    Some(WatchMsg::Created) | None => continue,
                    Some(m) => return Ok(Some(m)),
                },
                Ok(None) => return Ok(None),
                Err(e) => {
                    self.stream = None;
                    return Err(EtcdError::Unavailable(format!("{}: {e}", self.host)));
                }
            }
        }
    }

    /// Stop watching.
    pub fn close(mut self) {
        if let Some(s) = self.stream.take() {
            s.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_first_key_past_the_prefix() {
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn watch_messages_parse_with_proto3_defaults_omitted() {
        let created = br#"{"result":{"header":{"revision":"2"},"created":true}}"#;
        assert_eq!(parse_watch(created), Some(WatchMsg::Created));
        let ev = br#"{"result":{"header":{"revision":"5"},"events":[{"kv":{"key":"YQ==","mod_revision":"5","version":"1","value":"eA=="}},{"type":"DELETE","kv":{"key":"Yg==","mod_revision":"5"},"prev_kv":{"key":"Yg==","value":"eQ=="}}]}}"#;
        let Some(WatchMsg::Events { revision, events }) = parse_watch(ev) else { panic!() };
        assert_eq!(revision, 5);
        assert!(
            !events[0].deleted && events[0].kv.key == b"a" && events[0].kv.value == b"x" && events[0].prev.is_none()
        );
        assert!(events[1].deleted && events[1].prev.as_ref().unwrap().value == b"y");
        let gone = br#"{"result":{"header":{},"compact_revision":"9","canceled":true}}"#;
        assert_eq!(parse_watch(gone), Some(WatchMsg::Compacted(9)));
    }

    #[test]
    fn comparisons_and_operations_encode_as_the_gateway_expects() {
        let c = Compare::unchanged(&b"k"[..], 7).to_json();
        assert_eq!(c, json!({"key":"aw==","result":"EQUAL","target":"MOD","mod_revision":"7"}));
        let p = Op::put(&b"k"[..], &b"v"[..], 3).to_json();
        assert_eq!(p, json!({"request_put":{"key":"aw==","value":"dg==","lease":"3"}}));
        assert_eq!(Op::get_prefix(&b"p/"[..]).to_json(), json!({"request_range":{"key":"cC8=","range_end":"cDA="}}));
    }

    #[test]
    fn an_unreachable_cluster_is_reported_within_the_timeout() {
        // A port nothing listens on: bind one, learn its number, close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let c = Client::new(&[format!("http://127.0.0.1:{port}")], Duration::from_millis(300));
        let started = Instant::now();
        assert!(matches!(c.get(b"k"), Err(EtcdError::Unavailable(_))));
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
