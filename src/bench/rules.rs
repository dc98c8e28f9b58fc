//! Fault rules as data (SPEC 13): a *match* (operations, a path glob, the
//! caller), a *when* (a seeded probability, `after` matches that pass,
//! `count` firings at most) and an *action* (an errno, a delay, a hang, a
//! short transfer, losing the lease).
//!
//! Invariants:
//! - A rule's decisions depend only on its seed and the sequence of
//!   requests it matched: each match draws the next number of the rule's
//!   own generator (splitmix64), whatever other rules and requests do, so
//!   the same seed and the same requests give the same firings.
//! - Deciding takes no time beyond matching: nothing sleeps or waits here
//!   (a delay or a hang is carried out by the caller, with no lock held).
//! - A rule that does not parse changes nothing: [`Rules::add`] checks it
//!   whole first and says why in one line.

use serde::{Deserialize, Serialize};

use super::errnos;
use super::glob::Glob;

/// The operations a rule may name, as users know the system calls, each
/// with what it covers.
pub const OPS: &[(&str, &str)] = &[
    ("open", "open, openat, creat (a file's or a directory's open)"),
    ("create", "open with O_CREAT that creates the file, mknod"),
    ("read", "read, pread, readv"),
    ("write", "write, pwrite, writev"),
    ("fsync", "fsync"),
    ("fdatasync", "fdatasync"),
    ("close", "close (the flush each close sends; close(2) returns its error)"),
    ("stat", "stat, fstat, lstat, statx"),
    ("lookup", "each name of a path looked up"),
    ("readdir", "getdents (readdir)"),
    ("readlink", "readlink"),
    ("access", "access, faccessat, chdir (asked of the daemon on shared mounts only)"),
    ("truncate", "truncate, ftruncate, O_TRUNC"),
    ("chmod", "chmod, fchmod"),
    ("chown", "chown, fchown, lchown"),
    ("utimes", "utimensat, futimens, utime"),
    ("fallocate", "fallocate, posix_fallocate"),
    ("lseek", "lseek with SEEK_DATA or SEEK_HOLE"),
    ("rename", "rename, renameat2"),
    ("unlink", "unlink"),
    ("mkdir", "mkdir"),
    ("rmdir", "rmdir"),
    ("link", "link"),
    ("symlink", "symlink"),
    ("flock", "flock"),
    ("fcntl", "fcntl record locks (F_SETLK, F_SETLKW, F_GETLK, OFD locks)"),
    ("getxattr", "getxattr, fgetxattr, lgetxattr"),
    ("setxattr", "setxattr, fsetxattr, lsetxattr"),
    ("listxattr", "listxattr"),
    ("removexattr", "removexattr"),
    ("statfs", "statfs, statvfs"),
];

/// The bit of operation `op` in [`Rules::ops_mask`] (none for a name that
/// is not in [`OPS`]).
pub fn op_bit(op: &str) -> u64 {
    OPS.iter().position(|(n, _)| *n == op).map_or(0, |i| 1 << i)
}

/// What a rule does to a request it fires on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Fail with this errno (after `delay_ms`, if any).
    Errno { errno: i32, delay_ms: u64 },
    /// Carry the request out after this many milliseconds.
    Delay { ms: u64 },
    /// Hold the request until the rule is released or removed, or the
    /// caller is signalled (`EINTR`).
    Hang,
    /// A read returns, a write accepts, at most this many bytes.
    Short { bytes: u64 },
    /// Break the lease of the path at this request, before it is carried
    /// out (as `leasefs break`).
    LoseLease,
    /// Cut the power at this request, before it is carried out (as
    /// `leasefs crash`); the request, opened before the cut, fails `EIO`.
    Crash,
}

/// A rule as written to `.leasefs/faults` (one JSON object per line) and
/// shown by `fault list`. Every field but the action is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Given when the rule was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// Operations (names of [`OPS`]); none: every operation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub op: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// A cgroup path (as in /proc/PID/cgroup); the caller's cgroup is it
    /// or below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The first `after` matches pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// At most `count` firings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hang: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lose_lease: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub crash: bool,
    /// Requests matched so far (shown, ignored when written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<u64>,
    /// Firings so far (shown, ignored when written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fired: Option<u64>,
}

impl RuleSpec {
    /// A rule on these operations (none: every one); add the rest with the
    /// methods below, e.g. `RuleSpec::on(&["fsync"]).delay_ms(2000)`.
    pub fn on(ops: &[&str]) -> RuleSpec {
        RuleSpec { op: ops.iter().map(|o| o.to_string()).collect(), ..RuleSpec::default() }
    }

    /// Only paths matching this mount-relative glob.
    pub fn path(mut self, glob: &str) -> RuleSpec {
        self.path = Some(glob.into());
        self
    }

    /// Only requests of this process.
    pub fn pid(mut self, pid: u32) -> RuleSpec {
        self.pid = Some(pid);
        self
    }

    /// Only requests of processes with this command name.
    pub fn comm(mut self, comm: &str) -> RuleSpec {
        self.comm = Some(comm.into());
        self
    }

    /// Fire with probability `p`, drawn from the sequence seeded by `seed`.
    pub fn probability(mut self, p: f64, seed: u64) -> RuleSpec {
        self.probability = Some(p);
        self.seed = Some(seed);
        self
    }

    /// The first `n` matches pass.
    pub fn after(mut self, n: u64) -> RuleSpec {
        self.after = Some(n);
        self
    }

    /// Fire at most `n` times.
    pub fn count(mut self, n: u64) -> RuleSpec {
        self.count = Some(n);
        self
    }

    /// Fail with this errno (`"ENOSPC"`).
    pub fn errno(mut self, name: &str) -> RuleSpec {
        self.errno = Some(name.into());
        self
    }

    /// Delay the request (with [`RuleSpec::errno`]: fail after the delay).
    pub fn delay_ms(mut self, ms: u64) -> RuleSpec {
        self.delay_ms = Some(ms);
        self
    }

    /// Hold the request until released, removed or signalled.
    pub fn hang(mut self) -> RuleSpec {
        self.hang = true;
        self
    }

    /// A read returns, a write accepts, at most `bytes`.
    pub fn short(mut self, bytes: u64) -> RuleSpec {
        self.short = Some(bytes);
        self
    }

    /// Break the path's lease at the request.
    pub fn lose_lease(mut self) -> RuleSpec {
        self.lose_lease = true;
        self
    }

    /// Cut the power at the request.
    pub fn crash(mut self) -> RuleSpec {
        self.crash = true;
        self
    }
}

/// The request a rule is asked about.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// A name of [`OPS`].
    pub op: &'a str,
    /// Mount-relative, `/`-separated, no leading `/`; `None` when the file
    /// has no name.
    pub path: Option<&'a str>,
    /// The other path of a rename (the new name) or a link (the new link).
    pub to: Option<&'a str>,
    pub pid: u32,
    pub uid: u32,
    pub comm: &'a str,
    /// The caller's cgroup (`/proc/PID/cgroup`'s path), when a rule asks.
    pub cgroup: Option<&'a str>,
}

/// A fault that fired: which rule, and what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fired {
    pub rule: u64,
    /// Which of the rule's matches fired (1 for its first match): with the
    /// seed, what makes a run's record comparable with another's.
    pub matched: u64,
    pub action: Action,
}

/// A checked rule with its generator and counts.
#[derive(Debug, Clone)]
struct Rule {
    /// The operations it matches, as [`op_bit`]s (every bit: all); with
    /// `prefix`, what most requests are turned away by, first.
    mask: u64,
    /// Its path glob's literal start (empty: none).
    prefix: Box<str>,
    id: u64,
    spec: RuleSpec,
    ops: Vec<&'static str>,
    path: Option<Glob>,
    /// Fire when the draw is below this (`u64::MAX` with probability 1).
    threshold: u64,
    state: u64,
    action: Action,
    matches: u64,
    fired: u64,
}

/// The mount's fault rules.
#[derive(Debug, Default)]
pub struct Rules {
    rules: Vec<Rule>,
    /// One small entry per rule, in the same order: its operation mask and
    /// the first byte of its glob's literal prefix (`NO_PREFIX`: none).
    /// Most requests are turned away by these alone, reading a few cache
    /// lines for a hundred rules instead of each rule and its prefix.
    screen: Vec<(u64, u16)>,
    next: u64,
}

/// A screen entry's rule has no literal path prefix.
const NO_PREFIX: u16 = 0x100;

/// splitmix64: the next number of a rule's own sequence.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rules {
    /// True when no rule is in force (the request path then asks nothing).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether `spec` would be accepted (the reason when not), changing
    /// nothing.
    pub fn check(spec: &RuleSpec) -> Result<(), String> {
        Rules::default().add(spec.clone()).map(|_| ())
    }

    /// Check `spec` whole and put it in force; its id. A rule that does not
    /// parse is refused with a one-line reason and changes nothing.
    pub fn add(&mut self, spec: RuleSpec) -> Result<u64, String> {
        let mut ops = Vec::new();
        for o in &spec.op {
            let known = OPS.iter().find(|(n, _)| n.eq_ignore_ascii_case(o)).map(|(n, _)| *n);
            ops.push(known.ok_or_else(|| {
                format!(
                    "unknown operation {o:?} (known: {})",
                    OPS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                )
            })?);
        }
        // Paths are mount-relative; a leading `/` says the same.
        let path = spec.path.as_deref().map(|p| Glob::new(p.trim_start_matches('/'))).transpose()?;
        let p = spec.probability.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("probability {p} is outside [0, 1]"));
        }
        let threshold = if p >= 1.0 { u64::MAX } else { (p * u64::MAX as f64) as u64 };
        let errno = match &spec.errno {
            Some(n) => {
                Some(errnos::by_name(n).ok_or_else(|| format!("unknown errno {n:?} (try EIO, ENOSPC, ESTALE)"))?)
            }
            None => None,
        };
        // The kernel takes ENOSYS from these as "not implemented" and stops
        // sending them for the rest of the mount: one firing would silently
        // turn the operation off instead of failing one call.
        const ENOSYS_IS_FOREVER: [&str; 12] = [
            "open",
            "create",
            "fsync",
            "fdatasync",
            "close",
            "getxattr",
            "setxattr",
            "listxattr",
            "removexattr",
            "access",
            "lseek",
            "fallocate",
        ];
        if errno == Some(libc::ENOSYS) {
            if let Some(o) = ENOSYS_IS_FOREVER.iter().find(|o| ops.is_empty() || ops.contains(o)) {
                return Err(format!(
                    "ENOSYS would make the kernel stop sending {o} to this mount for good; use another errno \
                     (EOPNOTSUPP, EIO)"
                ));
            }
        }
        let actions = usize::from(errno.is_some() || spec.delay_ms.is_some())
            + usize::from(spec.hang)
            + usize::from(spec.short.is_some())
            + usize::from(spec.lose_lease)
            + usize::from(spec.crash);
        if actions != 1 {
            return Err("a rule needs exactly one action: --errno (with or without --delay), --delay, --hang, \
                        --short, --lose-lease or --crash"
                .into());
        }
        let action = match (errno, spec.delay_ms, spec.short) {
            (Some(errno), delay, _) => Action::Errno { errno, delay_ms: delay.unwrap_or(0) },
            (None, Some(ms), _) => Action::Delay { ms },
            (None, None, Some(bytes)) => Action::Short { bytes },
            _ if spec.hang => Action::Hang,
            _ if spec.crash => Action::Crash,
            _ => Action::LoseLease,
        };
        if let Action::Short { .. } = action {
            if ops.is_empty() || ops.iter().any(|o| *o != "read" && *o != "write") {
                return Err("--short applies to --op read and --op write only".into());
            }
        }
        self.next += 1;
        let id = self.next;
        let state = spec.seed.unwrap_or(0);
        let mut shown = spec.clone();
        shown.id = Some(id);
        let mask = if ops.is_empty() {
            u64::MAX
        } else {
            let open = if ops.contains(&"open") { op_bit("create") } else { 0 };
            ops.iter().fold(open, |m, o| m | op_bit(o))
        };
        let prefix: Box<str> = path.as_ref().map_or("", Glob::prefix).into();
        self.screen.push((mask, prefix.as_bytes().first().map_or(NO_PREFIX, |b| u16::from(*b))));
        self.rules.push(Rule {
            mask,
            prefix,
            id,
            spec: shown,
            ops,
            path,
            threshold,
            state,
            action,
            matches: 0,
            fired: 0,
        });
        Ok(id)
    }

    /// Remove rule `id`; false when there is none.
    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.rules.len();
        self.rules.retain(|r| r.id != id);
        self.screen = self.rules.iter().map(Rule::screen).collect();
        self.rules.len() != before
    }

    /// Remove every rule.
    pub fn clear(&mut self) {
        self.rules.clear();
        self.screen.clear();
    }

    /// Whether rule `id` is in force.
    pub fn holds(&self, id: u64) -> bool {
        self.rules.iter().any(|r| r.id == id)
    }

    /// Every rule as written, with its counts.
    pub fn list(&self) -> Vec<RuleSpec> {
        self.rules
            .iter()
            .map(|r| RuleSpec { matches: Some(r.matches), fired: Some(r.fired), ..r.spec.clone() })
            .collect()
    }

    /// Whether any rule asks about the caller's cgroup (read from /proc
    /// only then).
    pub fn wants_cgroup(&self) -> bool {
        self.rules.iter().any(|r| r.spec.cgroup.is_some())
    }

    /// The operations some rule may match, as bits of their index in
    /// [`OPS`] (every bit when a rule names none).
    pub fn ops_mask(&self) -> u64 {
        self.rules.iter().fold(0, |m, r| m | r.mask)
    }

    /// Whether any rule asks about the path.
    pub fn wants_path(&self) -> bool {
        self.rules.iter().any(|r| r.path.is_some())
    }

    /// Whether any rule asks about the caller's process id.
    pub fn wants_pid(&self) -> bool {
        self.rules.iter().any(|r| r.spec.pid.is_some())
    }

    /// Whether any rule asks about the caller's command name.
    pub fn wants_comm(&self) -> bool {
        self.rules.iter().any(|r| r.spec.comm.is_some())
    }

    /// Whether any rule may match reads or writes of file contents.
    pub fn names_data(&self) -> bool {
        self.rules.iter().any(|r| r.ops.is_empty() || r.ops.iter().any(|o| *o == "read" || *o == "write"))
    }

    /// The first rule, in the order they were added, that matches `call`
    /// and fires. Every rule that matches counts the match and draws its
    /// next number, fired or not, so each rule's decisions depend on its
    /// own seed and the requests it matched only.
    pub fn decide<'a>(&mut self, call: &Call<'a>) -> Option<Fired> {
        let mut out = None;
        let bit = op_bit(call.op);
        let strip = |p: &'a str| p.trim_start_matches('/');
        let (path, to) = (call.path.map(strip), call.to.map(strip));
        let first = |p: Option<&str>| p.and_then(|p| p.as_bytes().first()).map_or(NO_PREFIX + 1, |b| u16::from(*b));
        let (f1, f2) = (first(path), first(to));
        for (i, (mask, start)) in self.screen.iter().enumerate() {
            if mask & bit == 0 || *start != NO_PREFIX && *start != f1 && *start != f2 {
                continue;
            }
            let r = &mut self.rules[i];
            if !r.prefix.is_empty()
                && !path.is_some_and(|p| p.starts_with(&*r.prefix))
                && !to.is_some_and(|p| p.starts_with(&*r.prefix))
            {
                continue;
            }
            if !r.matches(call) {
                continue;
            }
            r.matches += 1;
            let draw = next(&mut r.state);
            let passed = r.matches <= r.spec.after.unwrap_or(0);
            let spent = r.spec.count.is_some_and(|c| r.fired >= c);
            if out.is_none() && !passed && !spent && (r.threshold == u64::MAX || draw < r.threshold) {
                r.fired += 1;
                out = Some(Fired { rule: r.id, matched: r.matches, action: r.action });
            }
        }
        out
    }
}

impl Rule {
    fn screen(&self) -> (u64, u16) {
        (self.mask, self.prefix.as_bytes().first().map_or(NO_PREFIX, |b| u16::from(*b)))
    }

    fn matches(&self, call: &Call) -> bool {
        let s = &self.spec;
        // A create is also an open (open with O_CREAT), as users see it.
        (self.ops.is_empty() || self.ops.contains(&call.op) || call.op == "create" && self.ops.contains(&"open"))
            && self
                .path
                .as_ref()
                .is_none_or(|g| call.path.is_some_and(|p| g.matches(p)) || call.to.is_some_and(|p| g.matches(p)))
            && s.pid.is_none_or(|p| p == call.pid)
            && s.uid.is_none_or(|u| u == call.uid)
            && s.comm.as_deref().is_none_or(|c| c == call.comm)
            && s.cgroup.as_deref().is_none_or(|c| {
                call.cgroup.is_some_and(|g| {
                    let c = c.trim_end_matches('/');
                    g == c || g.starts_with(c) && g.as_bytes().get(c.len()) == Some(&b'/')
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(op: &'a str, path: &'a str) -> Call<'a> {
        Call { op, path: Some(path), to: None, pid: 10, uid: 1000, comm: "app", cgroup: Some("/user.slice/test.scope") }
    }

    fn spec(json: &str) -> RuleSpec {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_rule_fires_on_what_it_matches_after_its_first_matches_and_at_most_count_times() {
        let mut r = Rules::default();
        let id = r.add(spec(r#"{"op":["write"],"path":"wal/*","errno":"ENOSPC","after":2,"count":2}"#)).unwrap();
        let fired =
            |matched| Some(Fired { rule: id, matched, action: Action::Errno { errno: libc::ENOSPC, delay_ms: 0 } });
        assert_eq!(r.decide(&call("read", "wal/1")), None, "another operation");
        assert_eq!(r.decide(&call("write", "data/1")), None, "another path");
        assert_eq!(r.decide(&call("write", "wal/1")), None, "the first match passes");
        assert_eq!(r.decide(&call("write", "wal/1")), None, "the second too");
        assert_eq!(r.decide(&call("write", "wal/1")), fired(3), "the third fires");
        assert_eq!(r.decide(&call("write", "wal/2")), fired(4));
        assert_eq!(r.decide(&call("write", "wal/3")), None, "count spent");
        let l = r.list();
        assert_eq!((l[0].matches, l[0].fired), (Some(5), Some(2)));
    }

    #[test]
    fn the_caller_is_matched_by_pid_uid_comm_and_cgroup() {
        let mut r = Rules::default();
        r.add(spec(r#"{"pid":10,"uid":1000,"comm":"app","cgroup":"/user.slice","hang":true}"#)).unwrap();
        assert!(r.decide(&call("open", "f")).is_some());
        for other in [
            Call { pid: 11, ..call("open", "f") },
            Call { uid: 0, ..call("open", "f") },
            Call { comm: "sh", ..call("open", "f") },
            Call { cgroup: Some("/user.slicer"), ..call("open", "f") },
            Call { cgroup: None, ..call("open", "f") },
        ] {
            assert_eq!(r.decide(&other), None, "{other:?}");
        }
    }

    #[test]
    fn the_same_seed_and_requests_give_the_same_firings_and_another_seed_others() {
        let run = |seed: u64, noise: bool| {
            let mut r = Rules::default();
            r.add(spec(&format!(r#"{{"op":["write"],"probability":0.3,"seed":{seed},"errno":"EIO"}}"#))).unwrap();
            // Another rule and requests it does not match change nothing.
            r.add(spec(r#"{"op":["read"],"probability":0.5,"seed":1,"delay_ms":5}"#)).unwrap();
            (0..1000)
                .map(|i| {
                    if noise {
                        r.decide(&call("read", "x"));
                    }
                    r.decide(&call("write", &format!("f{i}"))).is_some()
                })
                .collect::<Vec<bool>>()
        };
        let a = run(42, false);
        assert_eq!(a, run(42, true), "the same seed and the same matched requests");
        let n = a.iter().filter(|f| **f).count();
        assert!((230..370).contains(&n), "probability 0.3 fired {n} of 1000");
        assert_ne!(a, run(43, false), "another seed");
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason_and_change_nothing() {
        let mut r = Rules::default();
        for (bad, why) in [
            (r#"{"op":["wirte"],"errno":"EIO"}"#, "unknown operation \"wirte\""),
            (r#"{"errno":"ENOPE"}"#, "unknown errno \"ENOPE\""),
            (r#"{"path":"a[b","errno":"EIO"}"#, "never closed"),
            (r#"{"probability":1.5,"errno":"EIO"}"#, "outside [0, 1]"),
            (r#"{"probability":-0.1,"errno":"EIO"}"#, "outside [0, 1]"),
            (r#"{"op":["write"]}"#, "exactly one action"),
            (r#"{"hang":true,"lose_lease":true}"#, "exactly one action"),
            (r#"{"op":["fsync"],"short":3}"#, "--short applies"),
        ] {
            let e = r.add(spec(bad)).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
        assert!(r.is_empty());
        assert!(serde_json::from_str::<RuleSpec>(r#"{"errno":"EIO","colour":1}"#).is_err(), "unknown fields");
    }

    #[test]
    fn errnos_are_known_by_every_linux_name_and_the_aliases() {
        assert_eq!(errnos::by_name("ESTALE"), Some(libc::ESTALE));
        assert_eq!(errnos::by_name("enospc"), Some(libc::ENOSPC));
        assert_eq!(errnos::by_name("EWOULDBLOCK"), Some(libc::EAGAIN));
        assert_eq!(errnos::name_of(libc::EAGAIN), Some("EAGAIN"));
        assert!(errnos::ERRNOS.len() > 130);
    }

    #[test]
    fn rules_are_listed_with_ids_and_removed_by_id() {
        let mut r = Rules::default();
        let a = r.add(spec(r#"{"op":["fsync"],"delay_ms":2000}"#)).unwrap();
        let b = r.add(spec(r#"{"op":["read"],"short":1}"#)).unwrap();
        assert_eq!(r.list().iter().map(|s| s.id).collect::<Vec<_>>(), [Some(a), Some(b)]);
        let line = serde_json::to_string(&r.list()[0]).unwrap();
        assert_eq!(line, format!(r#"{{"id":{a},"op":["fsync"],"delay_ms":2000,"matches":0,"fired":0}}"#));
        assert!(r.remove(a) && !r.remove(a));
        assert!(r.holds(b) && !r.holds(a));
        r.clear();
        assert!(r.is_empty());
    }
}
