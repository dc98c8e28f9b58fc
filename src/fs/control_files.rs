//! The `.leasefs/` control files: lookup, attributes, rendering at open
//! (`status`, `leases`, `metrics`) and the commands written to them.

use super::*;

/// What a write to `.leasefs/break` says to break every lease held: one NUL
/// byte, which no path contains.
pub const BREAK_ALL: &[u8] = b"\0";

impl Fs {
    pub(super) fn control_lookup(&self, parent: Ino, name: &OsStr) -> Result<Option<Attr>> {
        if parent == Ino::ROOT && name == control::DIR_NAME {
            return Ok(Some(self.control_attr(control::DIR_INO)));
        }
        if parent == control::DIR_INO {
            let c = name.to_str().and_then(ControlFile::by_name).ok_or(Error::NotFound)?;
            return Ok(Some(self.control_attr(c.ino())));
        }
        Ok(None)
    }

    pub(super) fn control_attr(&self, ino: Ino) -> Attr {
        let st = self.state.lock();
        let root = st.ns.get(Ino::ROOT).map(|r| r.attr()).ok();
        let t = root.map_or_else(now, |r| r.ctime);
        let (kind, perm, nlink) = match ControlFile::by_ino(ino) {
            Some(c) => (Kind::File, c.perm(), 1),
            None => (Kind::Dir, 0o555, 2),
        };
        Attr { ino, kind, perm, nlink, atime: t, mtime: t, ctime: t, crtime: t, ..Attr::absent() }
    }

    pub(super) fn control_open(&self, ino: Ino, flags: i32) -> Result<Handle> {
        let content = match ControlFile::by_ino(ino) {
            None => None,
            Some(ControlFile::Events) => {
                let mut st = self.state.lock();
                st.room_for_handle(true)?;
                let next = st.open.next_handle;
                st.report.events.open(next)?;
                let h = st.new_handle();
                st.open
                    .handles
                    .insert(h, OpenFile { ino, opener: None, guard: None, control: None, listing: None, paged: false });
                if st.report.events.readers() == 1 {
                    // Other hosts' grants reach this host from now on:
                    // told before the open returns.
                    st.lease.listen(true);
                    Self::run_errands(st);
                }
                return Ok(h);
            }
            Some(ControlFile::Break) => {
                if flags & libc::O_ACCMODE == libc::O_RDONLY {
                    return Err(Error::Access);
                }
                Some(Vec::new())
            }
            // Read: the rules. Written: the answers to what was written.
            Some(ControlFile::Faults) => Some(self.render_faults().into_bytes()),
            // Rows are rendered as they are read; a path prefix written to
            // the descriptor narrows them.
            Some(ControlFile::Leases) => None,
            Some(c) => {
                if flags & libc::O_ACCMODE != libc::O_RDONLY {
                    return Err(Error::Access);
                }
                Some(self.render(c).into_bytes())
            }
        };
        let mut st = self.state.lock();
        let mut listing =
            (ControlFile::by_ino(ino) == Some(ControlFile::Leases)).then(|| Box::new(Listing::of(&st, "/")));
        if let Some(l) = &mut listing {
            st = self.refreshed_listing(st, l)?;
        }
        st.room_for_handle(true)?;
        let h = st.new_handle();
        st.open.handles.insert(h, OpenFile { ino, opener: None, guard: None, control: content, listing, paged: false });
        Ok(h)
    }

    /// A write to `.leasefs/break`: the mount-relative path of the lease to
    /// break at once, or [`BREAK_ALL`] for every lease held on the mount.
    /// Root only.
    /// Read the event stream on `h` (see [`crate::events::Hub::read`]).
    pub fn events_read(&self, h: Handle, max: u32, nonblock: bool, id: u64) -> Result<crate::events::Read> {
        self.state.lock().report.events.read(h.0, max, nonblock, id)
    }

    /// Filter the event stream on `h` to a path prefix.
    pub fn events_filter(&self, h: Handle, data: &[u8]) -> Result<u32> {
        let text = std::str::from_utf8(data).map_err(|_| Error::Invalid)?;
        self.state.lock().report.events.filter(h.0, text)?;
        Ok(data.len() as u32)
    }

    /// Whether the event stream on `h` has data; remember `kh` to wake otherwise.
    pub fn events_poll(&self, h: Handle, kh: Option<u64>) -> Result<bool> {
        self.state.lock().report.events.poll(h.0, kh)
    }

    /// A parked read of the event stream was interrupted.
    pub fn events_interrupt(&self, id: u64) -> bool {
        self.state.lock().report.events.interrupt(id)
    }

    /// Parked event reads that can be answered, and polls to wake.
    pub fn events_ready(&self) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
        self.state.lock().report.events.take_ready()
    }

    /// Whether `ino` is the event stream.
    pub fn is_events(ino: Ino) -> bool {
        ControlFile::by_ino(ino) == Some(ControlFile::Events)
    }

    pub fn control_write(&self, ino: Ino, data: &[u8], caller: Caller) -> Result<(u32, Vec<Effect>)> {
        if ControlFile::by_ino(ino) != Some(ControlFile::Break) {
            return Err(Error::NotPermitted);
        }
        if caller.uid != 0 {
            return Err(Error::NotPermitted);
        }
        if data == BREAK_ALL {
            let (fenced, effects) = self.fence_all()?;
            tracing::info!(holders = fenced, pid = caller.pid, "every lease broken by administrator");
            return Ok((data.len() as u32, effects));
        }
        let text = std::str::from_utf8(data).map_err(|_| Error::Invalid)?.trim();
        let rel = text.trim_start_matches('/');
        let mut st = self.state.lock();
        let target = if rel.is_empty() { None } else { st.resolve_path(std::path::Path::new(rel)) };
        let lease = target.or_else(|| st.lease.table().detached(std::path::Path::new(rel))).ok_or(Error::NotFound)?;
        st.clock();
        st.reserve(lease)?;
        let effects = st.lease.break_now(lease);
        st.report.breaking = "admin";
        st.account(&effects);
        st.report.breaking = "ttl";
        tracing::info!(path = %format!("/{rel}"), ino = lease.0, epoch = st.lease.epoch(lease).0, pid = caller.pid, "lease broken by administrator");
        Ok((data.len() as u32, effects))
    }

    /// Read `.leasefs/leases` on `h`: rows are rendered from the state at
    /// the time they are read, a few at a time, so a listing of a mount
    /// with a million held leases is never built as one string.
    pub(super) fn listing_read(st: &mut State, h: Handle, offset: u64, size: u32) -> Result<Vec<u8>> {
        let mut l = st.open.handles.get_mut(&h).and_then(|f| f.listing.take()).ok_or(Error::BadHandle)?;
        let now = st.lease.now();
        let out = l.read(st, now, offset, size as usize);
        if let Some(f) = st.open.handles.get_mut(&h) {
            f.listing = Some(l);
        }
        Ok(out)
    }

    /// A path prefix written to `.leasefs/leases` at `offset`: list only
    /// leases under it, from the start, which is where the write left the
    /// descriptor's offset.
    pub fn listing_filter(&self, h: Handle, offset: u64, data: &[u8]) -> Result<u32> {
        let text = std::str::from_utf8(data).map_err(|_| Error::Invalid)?;
        let p = control::path_prefix(text)?;
        let st = self.state.lock();
        let mut fresh = Listing::of(&st, p);
        let mut st = self.refreshed_listing(st, &mut fresh)?;
        fresh.base = offset + data.len() as u64;
        fresh.at = fresh.base;
        let f = st.open.handles.get_mut(&h).filter(|f| f.listing.is_some()).ok_or(Error::BadHandle)?;
        f.listing = Some(Box::new(fresh));
        Ok(data.len() as u32)
    }

    /// Whether writes to `ino` set a path filter (the event stream and the
    /// leases listing).
    pub fn is_filtered(ino: Ino) -> bool {
        matches!(ControlFile::by_ino(ino), Some(ControlFile::Events | ControlFile::Leases))
    }

    /// Every file's paths that currently lead to `ino`s of interest.
    pub(super) fn paths_of(st: &State, wanted: &std::collections::HashSet<Ino>) -> HashMap<Ino, PathBuf> {
        let mut out = HashMap::new();
        let mut stack = vec![(Ino::ROOT, PathBuf::new())];
        while let Some((dir, path)) = stack.pop() {
            let Ok(d) = st.ns.get(dir).and_then(|i| i.dir()) else {
                continue;
            };
            for (name, child) in d.iter() {
                let p = path.join(name);
                if wanted.contains(&child) {
                    out.entry(child).or_insert_with(|| p.clone());
                }
                if st.ns.get(child).is_ok_and(|c| c.kind == Kind::Dir) {
                    stack.push((child, p));
                }
            }
        }
        for (p, ino) in &st.lease.table().detached_all() {
            out.entry(*ino).or_insert_with(|| p.clone());
        }
        out
    }

    /// The metrics in Prometheus text format (what `.leasefs/metrics` shows).
    pub fn metrics(&self) -> String {
        self.render(ControlFile::Metrics)
    }

    /// Render a read-only control file.
    pub(super) fn render(&self, c: ControlFile) -> String {
        let mut st = self.state.lock();
        let leases = st.lease.table().leases();
        match c {
            ControlFile::Status => {
                let held = leases.iter().filter(|(_, l)| !l.locks().is_empty()).count();
                // Also waits parked in a remote arbiter's queue.
                let awaited = st.lease.waited().len();
                let ttl = leases.iter().filter(|(i, _)| st.lease.table().effective_ttl(*i).is_some()).count();
                let (backend, remote) = st.lease.backend();
                let mut status = serde_json::json!({
                    "version": crate::VERSION,
                    "backend": backend,
                    "pid": std::process::id(),
                    "mount_point": st.mount.point.to_string_lossy(),
                    "source": st.mount.source,
                    "access": if st.mount.allow_other { "shared" } else { "private" },
                    "metrics_addr": st.mount.metrics_addr,
                    "uptime_secs": st.lease.table().uptime(),
                    "leases": { "held": held, "awaited": awaited, "with_ttl": ttl, "known": st.lease.table().known() },
                    "inodes": st.ns.len(),
                    "limits": st.limit_rows().iter().map(|l| (l.name.to_string(), serde_json::json!({
                        "used": l.used, "max": l.max, "refused": l.refused,
                    }))).collect::<serde_json::Map<String, serde_json::Value>>(),
                    "observations": st.lease.table().observations(),
                    "state_dir": st.lease.table().floors_ref().journal().and_then(|j| j.path().parent()).map(|p| p.to_string_lossy().into_owned()),
                    "journal_bytes": st.lease.table().floors_ref().journal().map(|j| j.size()),
                    "journal_commits": st.lease.table().floors_ref().journal().map(|j| j.commits()),
                    "epoch_ceiling": st.lease.table().floors_ref().journal().map(|j| j.ceiling()),
                    "journal_compactions": st.lease.table().floors_ref().journal().map(|j| j.compactions()),
                    "durability": match &st.durable.store {
                        Some(s) if s.failed() => "failed",
                        Some(_) => "durable",
                        None if st.sharing.replica.is_some() => "etcd",
                        None if st.durable.volatile => "volatile",
                        None => "memory",
                    },
                    "namespace_journal_bytes": st.durable.store.as_ref().map(|s| s.journal_bytes()),
                    "namespace_flushes": st.durable.store.as_ref().map(|s| s.flushes),
                    "snapshot": st.durable.store.as_ref().map(|s| serde_json::json!({
                        "generation": s.generation(),
                        "bytes": s.snapshot_bytes(),
                        "older_journal_bytes": s.other_bytes(),
                        "written_at": s.last_snapshot.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs()),
                        "compaction": st.compaction_phase(),
                    })),
                });
                if let Some(serving) = self.serving.get() {
                    serving.status(&mut status);
                }
                if let Some(mut remote) = remote {
                    if let Some(r) = &st.sharing.replica {
                        remote["namespace"] = r.status();
                    }
                    remote["namespace"]["copy"] = self.copy_status(&st);
                    status["etcd"] = remote;
                }
                format!(
                    "{status}
"
                )
            }
            ControlFile::Metrics => {
                let journal = st.lease.table().floors_ref().journal();
                let g = crate::control::Gauges {
                    live: leases.iter().filter(|(_, l)| l.is_live()).count(),
                    held: leases.iter().filter(|(_, l)| !l.locks().is_empty()).count(),
                    awaited: st.lease.waited().len(),
                    with_ttl: leases.iter().filter(|(i, _)| st.lease.table().effective_ttl(*i).is_some()).count(),
                    journal_commits: journal.map_or(0, |j| j.commits()),
                    epoch_journal_bytes: journal.map(|j| j.size()),
                    namespace_journal_bytes: st.durable.store.as_ref().map(|s| s.journal_bytes()),
                    snapshot_bytes: st.durable.store.as_ref().map(|s| s.snapshot_bytes()),
                };
                drop(leases);
                st.report.metrics.limits = st.limit_rows();
                let mount = st.mount.point.to_string_lossy().into_owned();
                let mut out = st.report.metrics.render(&g, &mount);
                if let Some(serving) = self.serving.get() {
                    out.push_str(&serving.metrics(&mount));
                }
                if self.reads_a_copy() {
                    out.push_str(&self.copy_metrics(&st, &mount));
                }
                drop(st);
                out.push_str(&self.bench_metrics(&mount));
                out
            }
            // Read through state of their own handles (`Listing`, events).
            ControlFile::Leases | ControlFile::Break | ControlFile::Events | ControlFile::Faults => String::new(),
        }
    }
}

impl Fs {
    /// What `status` shows of the copy of a shared namespace (SPEC 10):
    /// how far behind etcd it may be now, up to which lag reads answer
    /// from it, and how many did.
    fn copy_status(&self, st: &State) -> serde_json::Value {
        let b = self.barrier.get();
        serde_json::json!({
            "lag_ms": b.and_then(|b| b.lag()).map(|l| l.as_millis() as u64),
            "max_lag_ms": b.map(|b| b.max_lag().as_millis() as u64),
            "reads": st.sharing.copy_reads,
            "refused": st.sharing.copy_refusals,
            "stale_lookups": st.sharing.stale_lookups,
            "stale_lookups_reopened_without_read": st.sharing.retrying.reopened,
            "unconfirmed_creates": st.sharing.unconfirmed_creates,
            "confirmed_existing": st.sharing.confirmed_existing,
        })
    }

    /// The copy's lag and reads as Prometheus metrics.
    fn copy_metrics(&self, st: &State, mount: &str) -> String {
        let m = format!("mount=\"{}\"", crate::control::label_value(mount));
        let lag = self.barrier.get().and_then(|b| b.lag()).map_or(-1.0, |l| l.as_secs_f64());
        let mut out = format!(
            "# HELP leasefs_etcd_copy_lag_seconds How far behind etcd this host's copy of the namespace may be (-1: not known).\n\
             # TYPE leasefs_etcd_copy_lag_seconds gauge\nleasefs_etcd_copy_lag_seconds{{{m}}} {lag}\n"
        );
        for (name, help, v) in [
            (
                "leasefs_etcd_copy_reads_total",
                "Reads answered from the copy without asking etcd.",
                st.sharing.copy_reads,
            ),
            (
                "leasefs_etcd_copy_refusals_total",
                "Reads refused with EIO: the copy was too far behind and etcd could not be read.",
                st.sharing.copy_refusals,
            ),
            (
                "leasefs_etcd_stale_lookups_total",
                "Opens answered ESTALE (looked up again) because their lookup from the copy had gone stale.",
                st.sharing.stale_lookups,
            ),
            (
                "leasefs_etcd_unconfirmed_creates_total",
                "Lookups of a name the copy lacks answered without asking etcd, for the call that makes it (O_CREAT open, mkdir, mknod, symlink).",
                st.sharing.unconfirmed_creates,
            ),
            (
                "leasefs_etcd_confirmed_existing_total",
                "Lookups of a name the copy has, for a call that makes that very name (O_EXCL open, mkdir, mknod, symlink), confirmed with etcd.",
                st.sharing.confirmed_existing,
            ),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{m}}} {v}\n"));
        }
        out
    }

    /// The epochs of the leases `l` lists, brought up to what the whole
    /// namespace knows (one quorum read across hosts, without the state
    /// lock; see [`crate::lease::LeaseAuthority::refresh_epochs`]), and
    /// other hosts' leases added after them (one more read, also without
    /// the state lock).
    fn refreshed_listing<'a>(
        &'a self,
        mut st: parking_lot::MutexGuard<'a, State>,
        l: &mut Listing,
    ) -> Result<parking_lot::MutexGuard<'a, State>> {
        if let Some(list) = st.lease.remote_leases() {
            drop(st);
            let prefix = if l.prefix.is_empty() { "/" } else { l.prefix.as_str() };
            l.remote = list(prefix).into_iter().rev().map(|r| serde_json::to_string(&r).unwrap_or_default()).collect();
            st = self.state.lock();
        }
        if !st.lease.wants_paths() || l.rows.is_empty() {
            return Ok(st);
        }
        for (path, ino) in &l.rows {
            st.lease.bind_path(*ino, path);
        }
        let inos: Vec<Ino> = l.rows.iter().map(|(_, i)| *i).collect();
        self.refreshed(st, &inos)
    }
}

/// Whether `.leasefs/leases` lists a lease: held, awaited, or with a TTL.
fn listed(st: &State, ino: Ino) -> bool {
    st.lease.table().lease(ino).is_some_and(|l| {
        l.is_live() || l.ttl().is_some() || st.lease.table().effective_ttl(ino).is_some() && !l.locks().is_empty()
    })
}

/// An open `.leasefs/leases`: the listed leases in path order, found at
/// open (from the lease table, not by walking the tree), and the rows
/// rendered so far that the reader has not passed yet.
#[derive(Debug)]
pub(crate) struct Listing {
    rows: Vec<(String, Ino)>,
    next: usize,
    /// Rendered bytes from offset `at` on.
    buf: Vec<u8>,
    at: u64,
    /// The offset of the listing's first byte (after a filter written).
    base: u64,
    prefix: String,
    /// Rows of other hosts' leases, rendered, last first.
    remote: Vec<String>,
}

impl Listing {
    /// The leases listed under `prefix` (`/` for all).
    fn of(st: &State, prefix: &str) -> Listing {
        let wanted: Vec<Ino> =
            st.lease.table().leases().into_iter().map(|(i, _)| i).filter(|i| listed(st, *i)).collect();
        let mut rows = Vec::with_capacity(wanted.len());
        let mut unnamed = std::collections::HashSet::new();
        for ino in wanted {
            let path = match st.ns.get(ino).map(|i| i.kind) {
                Ok(Kind::Dir) => st.ns.dir_path(ino).map(|p| p.into_iter().collect::<PathBuf>()),
                _ => st.ns.path_hint(ino),
            };
            match path {
                Some(p) => rows.push((format!("/{}", p.display()), ino)),
                None => {
                    unnamed.insert(ino);
                }
            }
        }
        // Detached leases, and files whose name hint went stale (one walk
        // for all of them, only when there are any).
        if !unnamed.is_empty() {
            let found = Fs::paths_of(st, &unnamed);
            rows.extend(
                unnamed
                    .into_iter()
                    .map(|i| (found.get(&i).map(|p| format!("/{}", p.display())).unwrap_or_default(), i)),
            );
        }
        let prefix = prefix.trim_end_matches('/').to_string();
        if !prefix.is_empty() {
            rows.retain(|(p, _)| {
                p.strip_prefix(prefix.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            });
        }
        rows.sort();
        // Leases held or awaited on other hosts (etcd) come after this
        // host's, read by `refreshed_listing` without the state lock.
        Listing { rows, next: 0, buf: Vec::new(), at: 0, base: 0, prefix, remote: Vec::new() }
    }

    /// Render the next row still listed into `out`; false at the end.
    fn more(&mut self, st: &State, now: u64, out: &mut Vec<u8>) -> bool {
        while let Some((path, ino)) = self.rows.get(self.next) {
            self.next += 1;
            let Some(l) = st.lease.table().lease(*ino).filter(|_| listed(st, *ino)) else { continue };
            let row = LeaseRow {
                epoch: l.epoch().0,
                expires_in_ms: Some(l.expires().map(|e| e as i64 - now as i64)),
                holders: l.locks().iter().map(|k| HolderRow::local(k, now)).collect(),
                hosts: None,
                inode: Some(ino.0),
                path: path.clone(),
                ttl_ms: Some(st.lease.table().effective_ttl(*ino)),
                version: Some(st.ns.get(*ino).map(|i| i.version).unwrap_or(0)),
                waiters: l.waiters(),
            };
            out.extend_from_slice(serde_json::to_string(&row).unwrap_or_default().as_bytes());
            out.push(b'\n');
            return true;
        }
        if let Some(row) = self.remote.pop() {
            out.extend_from_slice(row.as_bytes());
            out.push(b'\n');
            return true;
        }
        false
    }

    /// Up to `size` bytes from `offset`. Reading on from where the last
    /// read ended renders only what is new; reading from earlier starts
    /// the listing over.
    fn read(&mut self, st: &State, now: u64, offset: u64, size: usize) -> Vec<u8> {
        let offset = offset.max(self.base);
        if offset < self.at {
            let (prefix, base) = (std::mem::take(&mut self.prefix), self.base);
            *self = Listing::of(st, if prefix.is_empty() { "/" } else { &prefix });
            (self.base, self.at) = (base, base);
        }
        let skip = ((offset - self.at) as usize).min(self.buf.len());
        self.buf.drain(..skip);
        self.at += skip as u64;
        let mut buf = std::mem::take(&mut self.buf);
        while (self.at + buf.len() as u64) < offset + size as u64 && self.more(st, now, &mut buf) {
            // Rows the reader skipped over are not kept.
            let behind = (offset.saturating_sub(self.at) as usize).min(buf.len());
            buf.drain(..behind);
            self.at += behind as u64;
        }
        self.buf = buf;
        let from = (offset.saturating_sub(self.at) as usize).min(self.buf.len());
        let to = (from + size).min(self.buf.len());
        self.buf[from..to].to_vec()
    }
}
