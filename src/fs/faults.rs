//! The test bench's part of the filesystem (SPEC 13): the paths and callers
//! rules are matched against, the events of faults fired, breaking a lease
//! at a request, and `.leasefs/faults`, where rules are added, listed and
//! removed.

use super::*;
use crate::bench::{Action, Bench, RuleSpec};

/// A fault that fired, as the event stream shows it.
#[derive(Debug, Clone)]
pub struct FaultSeen {
    pub rule: u64,
    pub matched: u64,
    pub op: &'static str,
    /// Mount-relative, no leading `/`.
    pub path: Option<String>,
    pub ino: Option<Ino>,
    pub pid: u32,
    pub action: Action,
}

/// A power cut made: its report, what the broken leases answer, and the
/// inodes whose cached pages and attributes the kernel must drop.
#[derive(Debug)]
pub struct PowerCut {
    pub report: serde_json::Value,
    pub effects: Vec<Effect>,
    pub inval: Vec<Ino>,
}

/// Why a power cut (or a rule that would cut it) is refused.
const NOT_TRACKED: &str =
    "this mount does not track what was synced: mount it with --bench (fstab: bench; not with --etcd) to cut its power";

/// One command written to `.leasefs/faults`.
enum Command {
    Crash { kill: bool },
    Add(Box<RuleSpec>),
    Del(u64),
    Clear,
    Release(Option<u64>),
}

fn command(line: &str) -> std::result::Result<Command, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let id = |k: &str| obj[k].as_u64().ok_or(format!("\"{k}\" takes a rule id"));
    if obj.contains_key("del") {
        return Ok(Command::Del(id("del")?));
    }
    if obj.contains_key("clear") {
        return Ok(Command::Clear);
    }
    // `{"crash":{...}}` cuts the power; a rule's `"crash":true` is its action.
    if let Some(c) = obj.get("crash").filter(|c| c.is_object()) {
        let kill = c.get("kill").and_then(serde_json::Value::as_bool).unwrap_or(false);
        return Ok(Command::Crash { kill });
    }
    if let Some(r) = obj.get("release") {
        return match r {
            serde_json::Value::Bool(true) => Ok(Command::Release(None)),
            serde_json::Value::String(s) if s == "all" => Ok(Command::Release(None)),
            _ => Ok(Command::Release(Some(id("release")?))),
        };
    }
    let spec: RuleSpec = serde_json::from_value(v).map_err(|e| e.to_string())?;
    // Checked whole before anything is applied.
    crate::bench::Rules::check(&spec)?;
    Ok(Command::Add(Box::new(spec)))
}

impl Fs {
    /// `fsync` (`data_only`: `fdatasync`) of `ino` through handle `h`
    /// reached the daemon: what it makes durable is what a power cut
    /// keeps. `EIO` for a handle opened before a cut (which syncs nothing).
    pub fn power_synced(&self, ino: Ino, h: Handle, data_only: bool) -> Result<()> {
        let mut st = self.state.lock();
        if h.0 < st.open.cut_below {
            return Err(Error::Io);
        }
        if st.ns.power_tracked() {
            st.ns.power_synced(ino, data_only);
        }
        Ok(())
    }

    /// Start tracking what a power cut would leave (tests; `--bench`
    /// mounts track from the start).
    pub fn power_on(&self) {
        self.state.lock().ns.power_on();
    }

    /// The mount's test bench.
    pub fn bench(&self) -> &Arc<Bench> {
        &self.bench
    }

    /// The mount-relative path (no leading `/`) of `ino`, or of `name` in
    /// the directory `ino`; `None` for the control directory and its files
    /// (rules never reach them) and for a file with no name.
    pub fn fault_path(&self, ino: Ino, name: Option<&OsStr>) -> Option<String> {
        if control::is_control(ino) {
            return None;
        }
        let st = self.state.lock();
        let p = match name {
            Some(n) => st.path_of(ino, n)?,
            None if ino == Ino::ROOT => PathBuf::new(),
            None => {
                if let Some(p) = st.ns.path_hint(ino) {
                    p.to_path_buf()
                } else {
                    let wanted = std::iter::once(ino).collect();
                    Fs::paths_of(&st, &wanted).remove(&ino)?
                }
            }
        };
        Some(p.into_os_string().into_string().unwrap_or_else(|p| p.to_string_lossy().into_owned()))
    }

    /// Whether `name` in `dir` is the control directory (rules never reach it).
    pub fn is_control_name(dir: Ino, name: &OsStr) -> bool {
        control::is_control(dir) || dir == Ino::ROOT && name == control::DIR_NAME
    }

    /// The inode named `name` in `dir` (or `dir` itself without a name).
    pub fn fault_target(&self, dir: Ino, name: Option<&OsStr>) -> Option<Ino> {
        match name {
            Some(n) => self.state.lock().ns.child(dir, n).ok(),
            None => Some(dir),
        }
    }

    /// A process's command name, for rules that match it.
    pub fn fault_comm(&self, pid: u32) -> Option<String> {
        self.state.lock().comm(pid)
    }

    /// Publish the event of a fault that fired (`"event":"fault"`).
    pub fn fault_fired(&self, seen: FaultSeen) {
        let mut st = self.state.lock();
        if !st.report.events.listening() {
            return;
        }
        let epoch = seen.ino.map_or(0, |i| st.lease.epoch(i).0);
        let path = seen.path.as_deref().map_or(String::new(), |p| format!("/{p}"));
        let mut ev = crate::events::Event::new(crate::events::Kind::Fault, path, epoch);
        ev.pid = Some(seen.pid);
        ev.fault = Some(Box::new(crate::events::Fault {
            rule: seen.rule,
            matched: seen.matched,
            op: seen.op,
            action: seen.action,
        }));
        st.emit_as_is(ev);
    }

    /// Break the lease of `ino` at a request a rule fired on (as `leasefs
    /// break` does; the break's reason is `fault`).
    pub fn fault_break(&self, ino: Ino) -> Vec<Effect> {
        self.break_for(ino, "fault")
    }

    /// The test bench's metric lines for the mount point `mount`.
    pub(super) fn bench_metrics(&self, mount: &str) -> String {
        let m = format!("mount=\"{}\"", crate::control::label_value(mount));
        let mut out = String::from(
            "# HELP leasefs_faults_total Faults fired by the test bench's rules, by action.\n\
             # TYPE leasefs_faults_total counter\n",
        );
        for (action, n) in crate::bench::ACTIONS.iter().zip(self.bench.fired()) {
            out.push_str(&format!("leasefs_faults_total{{action=\"{action}\",{m}}} {n}\n"));
        }
        out.push_str(&format!(
            "# HELP leasefs_fault_rules Fault rules in force.\n# TYPE leasefs_fault_rules gauge\n\
             leasefs_fault_rules{{{m}}} {}\n\
             # HELP leasefs_fault_requests_held Requests held by delays and hangs now.\n\
             # TYPE leasefs_fault_requests_held gauge\nleasefs_fault_requests_held{{{m}}} {}\n",
            self.bench.list().len(),
            self.bench.held()
        ));
        out
    }

    /// Who may add, remove and release rules: root, and on a private mount
    /// the user who mounted it.
    pub(super) fn may_set_faults(&self, caller: Caller) -> bool {
        caller.uid == 0 || !self.state.lock().mount.allow_other && caller.uid == self.bench_owner
    }

    /// The rules as `.leasefs/faults` lists them: one JSON object per line.
    pub(super) fn render_faults(&self) -> String {
        let mut out = String::new();
        for r in self.bench.list() {
            out.push_str(&serde_json::to_string(&r).unwrap_or_default());
            out.push('\n');
        }
        out
    }

    /// A write to `.leasefs/faults` on `h`: one command per line (a rule to
    /// add; `{"del":ID}`, `{"clear":true}`, `{"release":ID|"all"}`). Every
    /// line is checked before any is applied; the descriptor then reads
    /// back one answer per line (`{"id":N}`...), or `{"error":"..."}` with
    /// the write failing `EINVAL` (`ENOENT` for a rule that is not there).
    pub fn faults_write(&self, h: Handle, data: &[u8], caller: Caller) -> Result<(u32, Option<PowerCut>)> {
        if !self.may_set_faults(caller) {
            return Err(Error::NotPermitted);
        }
        let text = std::str::from_utf8(data).map_err(|_| Error::Invalid)?;
        let mut cmds = Vec::new();
        let mut failed = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            match command(line) {
                Ok(c) => cmds.push(c),
                Err(e) => {
                    failed = Some((e, Error::Invalid));
                    break;
                }
            }
        }
        let mut answers = String::new();
        let mut made: Option<PowerCut> = None;
        if failed.is_none() {
            for c in cmds {
                let answer = match c {
                    Command::Crash { kill } => match self.power_cut(kill) {
                        Ok(mut cut) => {
                            let report = cut.report.clone();
                            if let Some(earlier) = made.take() {
                                cut.effects.extend(earlier.effects);
                                cut.inval.extend(earlier.inval);
                            }
                            made = Some(cut);
                            report
                        }
                        Err(e) => {
                            failed = Some((e, Error::Invalid));
                            break;
                        }
                    },
                    Command::Add(spec) if spec.crash && !self.state.lock().ns.power_tracked() => {
                        failed = Some((NOT_TRACKED.into(), Error::Invalid));
                        break;
                    }
                    Command::Add(spec) => match self.bench.add(*spec) {
                        Ok(id) => serde_json::json!({ "id": id }),
                        Err(e) => {
                            failed = Some((e, Error::Invalid));
                            break;
                        }
                    },
                    Command::Del(id) => {
                        if !self.bench.remove(id) {
                            failed = Some((format!("no rule {id}"), Error::NotFound));
                            break;
                        }
                        serde_json::json!({ "deleted": id })
                    }
                    Command::Clear => {
                        let n = self.bench.list().len();
                        self.bench.clear();
                        serde_json::json!({ "cleared": n })
                    }
                    Command::Release(id) => {
                        if id.is_some_and(|i| !self.bench.list().iter().any(|r| r.id == Some(i))) {
                            failed = Some((format!("no rule {}", id.unwrap_or_default()), Error::NotFound));
                            break;
                        }
                        serde_json::json!({ "released": self.bench.release(id) })
                    }
                };
                answers.push_str(&answer.to_string());
                answers.push('\n');
            }
        }
        if let Some((why, _)) = &failed {
            answers.push_str(&serde_json::json!({ "error": why }).to_string());
            answers.push('\n');
            tracing::debug!(pid = caller.pid, "fault rule refused: {why}");
        }
        if let Some(f) = self.state.lock().open.handles.get_mut(&h) {
            f.control = Some(answers.into_bytes());
        }
        match failed {
            Some((_, e)) => Err(e),
            None => Ok((data.len() as u32, made)),
        }
    }

    /// Cut the power (SPEC 13): the namespace goes back to what was synced,
    /// descriptors opened before answer `EIO`, every lease is broken
    /// (epochs never go back), and the kernel drops what it cached of what
    /// changed. `kill`: SIGKILL the processes that opened those
    /// descriptors. Returns the report (what was lost) and what the broken
    /// leases answer.
    pub fn power_cut(&self, kill: bool) -> std::result::Result<PowerCut, String> {
        let mut st = self.state.lock();
        if !st.ns.power_tracked() {
            return Err(NOT_TRACKED.into());
        }
        st.clock();
        // A compaction in progress would install an image of before the cut.
        st.finish_compaction(true);
        let mut pids = std::collections::HashSet::new();
        let mut dead = 0u64;
        for f in st.open.handles.values() {
            if control::is_control(f.ino) || f.ino == control::DIR_INO {
                continue;
            }
            dead += 1;
            if let Some(p) = f.opener {
                pids.insert(p);
            }
        }
        let everything: std::collections::HashSet<Ino> = st.ns.inodes().map(|i| i.ino).collect();
        let before = Fs::paths_of(&st, &everything);
        let cut = st.ns.power_cut();
        let after = Fs::paths_of(&st, &everything);
        let path = |ino: Ino| before.get(&ino).or_else(|| after.get(&ino)).map(|p| p.to_string_lossy().into_owned());
        let mark = st.open.next_handle;
        st.open.cut_below = mark;
        self.bench.cut_handles_below(mark);
        // A name never gets an epoch back (SPEC 5): what its inode held
        // before the cut is remembered under it, and whatever it names
        // now carries at least that.
        for ino in &cut.gone {
            if let Some(p) = before.get(ino) {
                st.remember_epoch(Some(p.clone()), *ino);
            }
        }
        for n in &cut.names {
            let Some(dir) = before.get(&n.dir).cloned().or_else(|| (n.dir == Ino::ROOT).then(PathBuf::new)) else {
                continue;
            };
            let p = dir.join(&n.name);
            if let Some(was) = n.was {
                st.remember_epoch(Some(p.clone()), was);
            }
            if let Some(now) = n.now {
                st.floor_epoch(Some(&p), now);
            }
        }
        for ino in &cut.gone {
            st.collect(*ino);
        }
        let mut effects = Vec::new();
        let held = st.lease.held();
        if held.iter().all(|ino| st.reserve(*ino).is_ok()) {
            effects = st.lease.fence_all();
            st.report.breaking = "power_cut";
            st.account(&effects);
            st.report.breaking = "ttl";
        } else {
            tracing::error!("cannot make the next epochs durable: leases stay with their holders");
        }
        // What the kernel may hold of what changed: names dropped by the
        // entry thread; pages and attributes by the notices the caller
        // sends, which no request's answer may wait for (a writer cut off
        // in the middle of a write holds the pages they drop).
        let mut inval: Vec<Ino> = cut.files.iter().map(|f| f.ino).collect();
        inval.extend(cut.names.iter().map(|n| n.dir).filter(|d| st.ns.get(*d).is_ok()));
        inval.sort();
        inval.dedup();
        st.cache.refs.drop.extend(cut.names.iter().map(|n| (n.dir, n.name.clone())));
        // Only the processes that opened the descriptors, not ones that
        // took their pids since (the start time tells them apart).
        let me = std::process::id();
        let mut doomed: Vec<u32> = pids
            .into_iter()
            .filter(|p| kill && p.tgid != me && crate::procfs::start_time(p.tgid) == Some(p.start))
            .map(|p| p.tgid)
            .collect();
        doomed.sort_unstable();
        let report = serde_json::json!({
            "crash": {
                "files": cut.files.iter().map(|f| serde_json::json!({
                    "path": path(f.ino),
                    "ino": f.ino.0,
                    "size": {"before": f.size.0, "after": f.size.1},
                    "lost": f.lost.iter().map(|(o, l)| [o, l]).collect::<Vec<_>>(),
                    "attrs": f.attrs,
                })).collect::<Vec<_>>(),
                "names": cut.names.iter().map(|n| serde_json::json!({
                    "dir": path(n.dir),
                    "name": n.name.to_string_lossy(),
                    "before": n.was.map(|i| i.0),
                    "after": n.now.map(|i| i.0),
                })).collect::<Vec<_>>(),
                "gone": cut.gone.len(),
                "descriptors": dead,
                "killed": doomed,
            }
        });
        // The state directory holds what a restart shows: the cut state.
        if let Err(e) = st.snapshot_in_line() {
            tracing::error!("the state directory could not be set to the cut state: {e}");
        }
        tracing::info!(files = cut.files.len(), names = cut.names.len(), gone = cut.gone.len(), "power cut");
        drop(st);
        for pid in report["crash"]["killed"].as_array().into_iter().flatten().filter_map(|p| p.as_i64()) {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        Ok(PowerCut { report, effects, inval })
    }
}
