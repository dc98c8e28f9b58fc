//! The JSON users read about a lease, defined once: a row of
//! `.leasefs/leases` (for this host's leases and, on a shared namespace,
//! for leases held or awaited on other hosts) and its holders, also in
//! `user.leasefs.holder`. Fields are declared in the order they are
//! written (alphabetical); those a row of the other kind does not have are
//! left out rather than written empty.

use serde::Serialize;

use super::machine::{Lock, LockKind, Mode};

/// One lease in `.leasefs/leases`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeaseRow {
    pub epoch: u64,
    /// Milliseconds until the TTL runs out (this host's rows; `null`
    /// without a TTL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<Option<i64>>,
    pub holders: Vec<HolderRow>,
    /// `"other"` on rows of leases of other hosts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    pub waiters: usize,
}

/// One holder of a lease.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HolderRow {
    /// `null` when the process is gone.
    pub comm: Option<String>,
    /// The byte range held (this host's holders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
    /// The host holding it (other hosts' holders).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub kind: &'static str,
    pub mode: &'static str,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since_ms_ago: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
}

/// How a lock kind is written.
pub fn kind_name(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Flock => "flock",
        LockKind::Posix => "posix",
    }
}

/// How a lock mode is written.
pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Shared => "shared",
        Mode::Exclusive => "exclusive",
    }
}

impl HolderRow {
    /// A holder on this host, at lease-clock time `now`.
    pub fn local(k: &Lock, now: u64) -> HolderRow {
        HolderRow {
            comm: crate::procfs::comm(k.pid),
            end: Some(k.range.end),
            host: None,
            kind: kind_name(k.kind),
            mode: mode_name(k.mode),
            pid: k.pid,
            since_ms_ago: Some(now.saturating_sub(k.since)),
            start: Some(k.range.start),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_write_the_fields_of_their_kind_in_alphabetical_order() {
        let local = LeaseRow {
            epoch: 3,
            expires_in_ms: Some(None),
            holders: vec![HolderRow {
                comm: Some("sh".into()),
                end: Some(9),
                kind: "flock",
                mode: "exclusive",
                pid: 7,
                since_ms_ago: Some(2),
                start: Some(0),
                host: None,
            }],
            inode: Some(5),
            path: "/a".into(),
            ttl_ms: Some(Some(100)),
            version: Some(1),
            waiters: 0,
            hosts: None,
        };
        assert_eq!(
            serde_json::to_string(&local).unwrap(),
            r#"{"epoch":3,"expires_in_ms":null,"holders":[{"comm":"sh","end":9,"kind":"flock","mode":"exclusive","pid":7,"since_ms_ago":2,"start":0}],"inode":5,"path":"/a","ttl_ms":100,"version":1,"waiters":0}"#
        );
        let remote = LeaseRow {
            epoch: 4,
            holders: vec![HolderRow {
                comm: Some("flock".into()),
                host: Some("h:/m".into()),
                kind: "posix",
                mode: "shared",
                pid: 8,
                ..HolderRow::default()
            }],
            hosts: Some("other"),
            path: "/b".into(),
            waiters: 2,
            ..LeaseRow::default()
        };
        assert_eq!(
            serde_json::to_string(&remote).unwrap(),
            r#"{"epoch":4,"holders":[{"comm":"flock","host":"h:/m","kind":"posix","mode":"shared","pid":8}],"hosts":"other","path":"/b","waiters":2}"#
        );
    }
}
