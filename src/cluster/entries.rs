//! How holders and waiters are written into etcd and read back: an entry's
//! mode, asker and ranges, the lock owner's spelling, and the escaping of
//! lease names in keys. Shared by the arbiter (which writes and decides)
//! and the watcher (which mirrors what other hosts wrote).

use serde_json::Value;

use super::client::Kv;
use crate::lease::{LockKind, Owner};

/// Shared or exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

impl Mode {
    pub(super) fn tag(self) -> &'static str {
        match self {
            Mode::Shared => "s",
            Mode::Exclusive => "x",
        }
    }

    /// Whether a holder in one mode blocks a request in the other.
    pub fn conflicts(self, other: Mode) -> bool {
        self == Mode::Exclusive || other == Mode::Exclusive
    }
}

/// Who asks, as shown to operators on every host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Asker {
    pub pid: u32,
    pub comm: String,
    /// The lock owner on its host ([`owner_key`]: `flock:…`, `posix:…`).
    pub owner: String,
    /// The lease's TTL when it has one: other hosts may break this holder
    /// once they saw its entry unrenewed that long.
    pub ttl_ms: Option<u64>,
}

/// A holder or waiter as stored in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
    pub create_revision: i64,
    pub mode: Mode,
    pub held: bool,
    pub epoch: u64,
    pub host: String,
    pub asker: Asker,
    /// Byte ranges (first and last byte); `None`: the whole lease.
    pub ranges: Option<Vec<(u64, u64)>>,
}

fn ranges_of(v: &Value) -> Option<Vec<(u64, u64)>> {
    let a = v["ranges"].as_array()?;
    Some(a.iter().filter_map(|r| Some((r[0].as_u64()?, r[1].as_u64()?))).collect())
}

pub fn overlap(a: &Option<Vec<(u64, u64)>>, b: &Option<Vec<(u64, u64)>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.iter().any(|x| b.iter().any(|y| x.0 <= y.1 && y.0 <= x.1)),
        // The whole lease overlaps any range (even none left: an empty
        // list never stays in the queue).
        _ => true,
    }
}

/// A queue entry as stored in etcd, read back.
pub(super) fn entry(kv: &Kv) -> Option<Entry> {
    let v: Value = serde_json::from_slice(&kv.value).ok()?;
    Some(Entry {
        key: kv.key.clone(),
        create_revision: kv.create_revision,
        mode: if v["mode"] == "s" { Mode::Shared } else { Mode::Exclusive },
        held: v["state"] == "held",
        epoch: v["epoch"].as_u64().unwrap_or(0),
        host: v["host"].as_str().unwrap_or("").to_string(),
        asker: Asker {
            pid: v["pid"].as_u64().unwrap_or(0) as u32,
            comm: v["comm"].as_str().unwrap_or("").to_string(),
            owner: v["owner"].as_str().unwrap_or("").to_string(),
            ttl_ms: v["ttl_ms"].as_u64(),
        },
        ranges: ranges_of(&v),
    })
}

/// How a lock owner is written into its queue entry (`flock:1f`,
/// `posix:2a`): spelled out here, not derived from the Rust names, so
/// what other hosts read never changes with a rename.
pub fn owner_key(kind: LockKind, owner: Owner) -> String {
    let kind = match kind {
        LockKind::Flock => "flock",
        LockKind::Posix => "posix",
    };
    format!("{kind}:{:x}", owner.0)
}

/// The kind of lock an entry's owner took, from [`owner_key`]'s text (and
/// from the `Flock:`/`Posix:` of hosts that wrote the Rust names).
pub fn owner_kind(owner: &str) -> LockKind {
    if owner.starts_with("flock:") || owner.starts_with("Flock:") {
        LockKind::Flock
    } else {
        LockKind::Posix
    }
}

/// `%` and `/` escaped, so one lease's key range never contains another's.
pub fn escape(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The name [`escape`] turned into `s`.
pub fn unescape(s: &str) -> String {
    s.replace("%2F", "/").replace("%25", "%")
}
