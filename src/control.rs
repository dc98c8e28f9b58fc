//! The hidden `.leasefs/` control directory at the mount root (SPEC 8).
//!
//! Reachable by name, left out of `readdir` (like ZFS's `.zfs`). Read-only
//! `status` (JSON), `leases` (JSON lines), `metrics` (Prometheus text), and
//! `break` (root only: write a mount-relative path to break that lease),
//! `events` (the event stream, see [`crate::events`]), `faults` (the test
//! bench's rules, see [`crate::bench`]).
//! Contents are rendered when the file is opened, so every read of one
//! descriptor sees one consistent snapshot.

use crate::namespace::Ino;

/// Name of the control directory in the mount root.
pub const DIR_NAME: &str = ".leasefs";
/// Inode of the control directory (outside the range the counter reaches).
pub const DIR_INO: Ino = Ino(u64::MAX - 16);

/// A file in the control directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlFile {
    Status,
    Leases,
    Metrics,
    Break,
    Events,
    Faults,
}

impl ControlFile {
    /// All control files.
    pub const ALL: [ControlFile; 6] = [
        ControlFile::Status,
        ControlFile::Leases,
        ControlFile::Metrics,
        ControlFile::Break,
        ControlFile::Events,
        ControlFile::Faults,
    ];

    /// Its name in `.leasefs/`.
    pub fn name(self) -> &'static str {
        match self {
            ControlFile::Status => "status",
            ControlFile::Leases => "leases",
            ControlFile::Metrics => "metrics",
            ControlFile::Break => "break",
            ControlFile::Events => "events",
            ControlFile::Faults => "faults",
        }
    }

    /// Its inode number.
    pub fn ino(self) -> Ino {
        Ino(DIR_INO.0 + 1 + self as u64)
    }

    /// The control file with this name.
    pub fn by_name(name: &str) -> Option<ControlFile> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The control file with this inode number.
    pub fn by_ino(ino: Ino) -> Option<ControlFile> {
        Self::ALL.into_iter().find(|c| c.ino() == ino)
    }

    /// Permission bits: read-only files for everyone, `break` for root.
    pub fn perm(self) -> u16 {
        match self {
            ControlFile::Break => 0o200,
            // Read them; write a path prefix to filter them.
            ControlFile::Events | ControlFile::Leases => 0o666,
            // Read the rules; write one to add it (the daemon checks who).
            ControlFile::Faults => 0o666,
            _ => 0o444,
        }
    }
}

/// A path prefix written to `.leasefs/events` or `.leasefs/leases`: a
/// mount-relative path (`/jobs`), a trailing newline or NUL allowed;
/// anything else is `EINVAL`.
pub fn path_prefix(text: &str) -> crate::error::Result<&str> {
    let p = text.trim_end_matches(['\n', '\0']).trim();
    if !p.starts_with('/') || p.len() > 4096 {
        return Err(crate::error::Error::Invalid);
    }
    Ok(p)
}

/// True for the control directory and its files.
pub fn is_control(ino: Ino) -> bool {
    ino == DIR_INO || ControlFile::by_ino(ino).is_some()
}

/// FUSE requests received, by opcode (every request the kernel sent, counted
/// before it is handled; `metrics` shows them as
/// `leasefs_fuse_requests_total{op=...}`). One mount per daemon process.
pub static FUSE_REQUESTS: [std::sync::atomic::AtomicU64; 64] = [const { std::sync::atomic::AtomicU64::new(0) }; 64];

/// Requests answered with an error, by errno name (`metrics` shows them as
/// `leasefs_refusals_total{errno=...}`). One mount per daemon process.
static REFUSALS: parking_lot::Mutex<std::collections::BTreeMap<&'static str, u64>> =
    parking_lot::Mutex::new(std::collections::BTreeMap::new());

/// Count one request answered with `errno` (its symbolic name).
pub fn count_refusal(errno: &'static str) {
    *REFUSALS.lock().entry(errno).or_insert(0) += 1;
}

/// Count one request of this opcode.
pub fn count_request(opcode: u32) {
    if let Some(c) = FUSE_REQUESTS.get(opcode as usize) {
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The name of a FUSE opcode as `metrics` labels it.
pub fn opcode_name(op: usize) -> Option<&'static str> {
    const NAMES: [&str; 53] = [
        "",
        "lookup",
        "forget",
        "getattr",
        "setattr",
        "readlink",
        "symlink",
        "",
        "mknod",
        "mkdir",
        "unlink",
        "rmdir",
        "rename",
        "link",
        "open",
        "read",
        "write",
        "statfs",
        "release",
        "",
        "fsync",
        "setxattr",
        "getxattr",
        "listxattr",
        "removexattr",
        "flush",
        "init",
        "opendir",
        "readdir",
        "releasedir",
        "fsyncdir",
        "getlk",
        "setlk",
        "setlkw",
        "access",
        "create",
        "interrupt",
        "bmap",
        "destroy",
        "ioctl",
        "poll",
        "notify_reply",
        "batch_forget",
        "fallocate",
        "readdirplus",
        "rename2",
        "lseek",
        "copy_file_range",
        "setupmapping",
        "removemapping",
        "syncfs",
        "tmpfile",
        "statx",
    ];
    NAMES.get(op).filter(|n| !n.is_empty()).copied()
}

/// Wait-time histogram bucket bounds in seconds.
pub const WAIT_BUCKETS: [f64; 10] = [0.0001, 0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0];

/// Gauges read from the state when `metrics` is rendered.
#[derive(Debug, Default, Clone, Copy)]
pub struct Gauges {
    /// Leases with a holder or a waiter.
    pub live: usize,
    pub held: usize,
    pub awaited: usize,
    pub with_ttl: usize,
    /// Epoch reservations made durable.
    pub journal_commits: u64,
    /// Bytes in the state directory's files (none when not kept there).
    pub epoch_journal_bytes: Option<u64>,
    pub namespace_journal_bytes: Option<u64>,
    pub snapshot_bytes: Option<u64>,
}

/// Counters behind `metrics`.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    /// Lock requests granted (at once or after waiting).
    pub acquisitions: u64,
    /// Lock requests that found the lease taken (parked or refused).
    pub contention: u64,
    /// Waits, by bucket of [`WAIT_BUCKETS`] (last slot: +Inf).
    pub wait_buckets: [u64; 11],
    pub wait_sum_secs: f64,
    pub wait_count: u64,
    /// Leases broken (TTL or administrator).
    pub breaks: u64,
    /// Operations refused because the caller was fenced.
    pub fenced_operations: u64,
    /// Renames and unlinks refused by compare-and-swap.
    pub cas_rejections: u64,
    /// Each limit: name, in use, bound, refusals so far (filled in before
    /// rendering).
    pub limits: Vec<LimitRow>,
}

/// One bound as the metrics and the status show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitRow {
    pub name: &'static str,
    /// In use now (none for per-file bounds).
    pub used: Option<u64>,
    pub max: u64,
    pub refused: u64,
}

impl Metrics {
    /// Account a completed wait.
    pub fn waited(&mut self, secs: f64) {
        let slot = WAIT_BUCKETS.iter().position(|b| secs <= *b).unwrap_or(WAIT_BUCKETS.len());
        self.wait_buckets[slot] += 1;
        self.wait_sum_secs += secs;
        self.wait_count += 1;
    }

    /// Prometheus text exposition; every sample carries the `mount` label
    /// (the mount point), so one scrape config can collect many mounts.
    pub fn render(&self, g: &Gauges, mount: &str) -> String {
        let m = format!("mount=\"{}\"", label_value(mount));
        let mut out = format!(
            "# HELP leasefs_build_info The running leasefs build.\n# TYPE leasefs_build_info gauge\n\
             leasefs_build_info{{version=\"{}\",backend=\"local\",{m}}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        let mut counter = |name: &str, help: &str, v: u64| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{m}}} {v}\n"));
        };
        counter("leasefs_acquisitions_total", "Lock requests granted.", self.acquisitions);
        counter("leasefs_contention_total", "Lock requests that found the lease taken.", self.contention);
        counter("leasefs_breaks_total", "Leases broken by TTL expiry or by an administrator.", self.breaks);
        counter(
            "leasefs_fenced_operations_total",
            "Operations refused because the caller was fenced.",
            self.fenced_operations,
        );
        counter(
            "leasefs_cas_rejections_total",
            "Renames and unlinks refused by compare-and-swap.",
            self.cas_rejections,
        );
        counter("leasefs_journal_commits_total", "Epoch reservations made durable in the journal.", g.journal_commits);
        out.push_str("# HELP leasefs_wait_seconds Time lock requests waited before being granted.\n");
        out.push_str("# TYPE leasefs_wait_seconds histogram\n");
        let mut cumulative = 0;
        for (i, b) in WAIT_BUCKETS.iter().enumerate() {
            cumulative += self.wait_buckets[i];
            out.push_str(&format!("leasefs_wait_seconds_bucket{{le=\"{b}\",{m}}} {cumulative}\n"));
        }
        cumulative += self.wait_buckets[WAIT_BUCKETS.len()];
        out.push_str(&format!("leasefs_wait_seconds_bucket{{le=\"+Inf\",{m}}} {cumulative}\n"));
        out.push_str(&format!("leasefs_wait_seconds_sum{{{m}}} {}\n", self.wait_sum_secs));
        out.push_str(&format!("leasefs_wait_seconds_count{{{m}}} {}\n", self.wait_count));
        out.push_str(
            "# HELP leasefs_fuse_requests_total FUSE requests received from the kernel, by opcode.\n\
             # TYPE leasefs_fuse_requests_total counter\n",
        );
        for (op, c) in FUSE_REQUESTS.iter().enumerate() {
            let n = c.load(std::sync::atomic::Ordering::Relaxed);
            if n > 0 {
                let name = opcode_name(op).map_or_else(|| format!("op{op}"), str::to_string);
                out.push_str(&format!("leasefs_fuse_requests_total{{op=\"{name}\",{m}}} {n}\n"));
            }
        }
        out.push_str(
            "# HELP leasefs_refusals_total Requests answered with an error, by errno.\n\
             # TYPE leasefs_refusals_total counter\n",
        );
        for (errno, n) in REFUSALS.lock().iter() {
            out.push_str(&format!("leasefs_refusals_total{{errno=\"{errno}\",{m}}} {n}\n"));
        }
        out.push_str(&format!(
            "# HELP leasefs_live_leases Leases with a holder or a waiter.\n# TYPE leasefs_live_leases gauge\nleasefs_live_leases{{{m}}} {}\n",
            g.live
        ));
        out.push_str("# HELP leasefs_leases Leases held, awaited, and with a TTL.\n# TYPE leasefs_leases gauge\n");
        for (state, n) in [("held", g.held), ("awaited", g.awaited), ("with_ttl", g.with_ttl)] {
            out.push_str(&format!("leasefs_leases{{state=\"{state}\",{m}}} {n}\n"));
        }
        let files = [
            ("epoch_journal", g.epoch_journal_bytes),
            ("namespace_journal", g.namespace_journal_bytes),
            ("snapshot", g.snapshot_bytes),
        ];
        if files.iter().any(|(_, b)| b.is_some()) {
            out.push_str(
                "# HELP leasefs_state_bytes Bytes in the state directory's files.\n# TYPE leasefs_state_bytes gauge\n",
            );
            for (file, b) in files.iter().filter_map(|(f, b)| b.map(|b| (f, b))) {
                out.push_str(&format!("leasefs_state_bytes{{file=\"{file}\",{m}}} {b}\n"));
            }
        }
        if !self.limits.is_empty() {
            out.push_str(
                "# HELP leasefs_limit The bound of each limit (bytes for size).\n# TYPE leasefs_limit gauge\n",
            );
            for l in &self.limits {
                out.push_str(&format!("leasefs_limit{{limit=\"{}\",{m}}} {}\n", l.name, l.max));
            }
            out.push_str(
                "# HELP leasefs_limit_used What each limit counts, in use now.\n# TYPE leasefs_limit_used gauge\n",
            );
            for l in self.limits.iter().filter(|l| l.used.is_some()) {
                out.push_str(&format!("leasefs_limit_used{{limit=\"{}\",{m}}} {}\n", l.name, l.used.unwrap_or(0)));
            }
            out.push_str(
                "# HELP leasefs_limit_refusals_total Requests refused because a limit was reached.\n\
                 # TYPE leasefs_limit_refusals_total counter\n",
            );
            for l in &self.limits {
                out.push_str(&format!("leasefs_limit_refusals_total{{limit=\"{}\",{m}}} {}\n", l.name, l.refused));
            }
        }
        out
    }
}

/// A Prometheus label value: backslash, double quote and newline escaped.
pub(crate) fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_inodes_are_distinct_and_named() {
        for c in ControlFile::ALL {
            assert_eq!(ControlFile::by_name(c.name()), Some(c));
            assert_eq!(ControlFile::by_ino(c.ino()), Some(c));
            assert!(is_control(c.ino()));
        }
        assert!(is_control(DIR_INO));
        assert!(!is_control(Ino(2)));
    }

    #[test]
    fn metrics_render_prometheus_text() {
        let mut m = Metrics { acquisitions: 3, ..Metrics::default() };
        count_request(1);
        m.waited(0.02);
        m.waited(7.0);
        let g = Gauges { live: 1, held: 1, snapshot_bytes: Some(9), ..Gauges::default() };
        let text = m.render(&g, "/run/a \"b\"");
        let l = "mount=\"/run/a \\\"b\\\"\"";
        assert!(text.contains(&format!("leasefs_acquisitions_total{{{l}}} 3\n")), "{text}");
        assert!(text.contains(&format!("leasefs_wait_seconds_bucket{{le=\"0.05\",{l}}} 1\n")));
        assert!(text.contains(&format!("leasefs_wait_seconds_bucket{{le=\"+Inf\",{l}}} 2\n")));
        assert!(text.contains(&format!("leasefs_wait_seconds_count{{{l}}} 2\n")));
        assert!(text.contains(&format!("leasefs_leases{{state=\"held\",{l}}} 1\n")), "{text}");
        assert!(text.contains(&format!("leasefs_state_bytes{{file=\"snapshot\",{l}}} 9\n")), "{text}");
        assert!(!text.contains("namespace_journal"), "files not kept are not shown: {text}");
        assert!(text.contains(&format!("leasefs_fuse_requests_total{{op=\"lookup\",{l}}} ")), "{text}");
        assert_eq!(opcode_name(35), Some("create"));
        assert_eq!(opcode_name(52), Some("statx"));
        assert!(text.contains(&format!(
            "leasefs_build_info{{version=\"{}\",backend=\"local\",{l}}} 1\n",
            env!("CARGO_PKG_VERSION")
        )));
        // Every sample line belongs to a family announced with HELP and TYPE.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            let family = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
            assert!(text.contains(&format!("# TYPE {family} ")), "{name} has no TYPE");
            assert!(text.contains(&format!("# HELP {family} ")), "{name} has no HELP");
        }
    }
}
