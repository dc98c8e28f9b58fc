//! The lease questions operations ask through the state: which path a
//! lease is named by, whose view is current (compare-and-swap), who was
//! fenced, which epoch floor a path carries, whether a subtree holds a
//! live lease.

use super::*;

impl State {
    /// A file's mount-relative path (`/a/b`), empty if it has none.
    pub(super) fn lease_path(&self, ino: Ino) -> String {
        if let Some(p) = self.ns.path_hint(ino) {
            return format!("/{}", p.display());
        }
        let wanted = std::iter::once(ino).collect();
        Fs::paths_of(self, &wanted).get(&ino).map(|p| format!("/{}", p.display())).unwrap_or_default()
    }

    /// Tell an authority that arbitrates by name (etcd) which path `ino` is.
    pub(super) fn name_lease(&mut self, ino: Ino) {
        if self.lease.wants_paths() {
            let path = self.lease_path(ino);
            self.lease.bind_path(ino, &path);
        }
    }

    /// Ask `lease` every lease question from now on.
    pub(super) fn set_authority(&mut self, mut lease: LeaseAuthority) {
        lease.set_wake(self.wake.clone());
        self.lease = lease;
    }

    /// The process behind a request's thread id (cached unless `fresh`).
    pub(super) fn proc(&mut self, tid: u32, fresh: bool) -> Option<Proc> {
        self.lease.table_mut().views().proc(tid, fresh)
    }

    /// `tid` observed the regular file `ino` at its current version.
    pub(super) fn observe(&mut self, tid: u32, ino: Ino) {
        let Some(p) = self.proc(tid, false) else {
            return;
        };
        self.observe_as(p, ino);
    }

    /// The process `p` observed the regular file `ino` at its current version.
    pub(super) fn observe_as(&mut self, p: Proc, ino: Ino) {
        let Ok(i) = self.ns.get(ino) else { return };
        if i.kind == Kind::File {
            let version = i.version;
            self.lease.table_mut().views().observe(p, ino, version);
        }
    }

    /// Refuse with `ESTALE` when `tid` acts on an older view of the file at
    /// `ino` (SPEC 6; `content_counts` for a rename over, not for unlink).
    pub(super) fn check_current(&mut self, tid: u32, ino: Ino, content_counts: bool, what: &str) -> Result<()> {
        let Ok(i) = self.ns.get(ino) else {
            return Ok(());
        };
        if i.kind != Kind::File {
            return Ok(());
        }
        let version = i.version;
        let verdict = self.lease.table_mut().views().check(tid, ino, version, content_counts);
        verdict.map_err(|v| {
            debug!(path = %self.path_for_log(ino), pid = v.pid, ino = ino.0, seen = v.seen, current = v.current, epoch = self.lease.epoch(ino).0, op = what, "compare-and-swap rejected: stale view");
            self.report.metrics.cas_rejections += 1;
            let mut ev = crate::events::Event::new(crate::events::Kind::CasReject, String::new(), self.lease.epoch(ino).0);
            ev.pid = Some(v.pid);
            ev.reason = Some(what.to_string());
            self.emit(ev, ino);
            Error::Stale(Stale::View { seen: v.seen, current: v.current })
        })
    }

    /// The name leading to `ino` was re-pointed at it again (same inode):
    /// earlier observers of the name hold a stale view.
    pub(super) fn repoint(&mut self, ino: Ino) {
        if let Ok(i) = self.ns.get(ino) {
            let version = i.version;
            self.lease.table_mut().views().repoint(ino, version);
        }
    }

    /// The name now pointing at `new` pointed at `old` before.
    pub(super) fn succeed(&mut self, old: Ino, new: Ino) {
        self.lease.table_mut().views().succeed(old, new);
    }

    /// Milliseconds on the lease clock; also advances the lease table's clock.
    pub(super) fn clock(&mut self) -> u64 {
        self.lease.now()
    }

    /// The calling process and its ancestors (who acts for a holder).
    pub(super) fn lineage(&mut self, tid: u32) -> Vec<u32> {
        self.lease.table_mut().views().lineage(tid)
    }

    /// Refuse with `ESTALE` when the process was fenced off this lease.
    pub(super) fn check_fenced_pid(&mut self, tid: u32, ino: Ino, what: &str) -> Result<()> {
        if !self.lease.has_fenced(ino) {
            return Ok(());
        }
        let pids = self.lineage(tid);
        if let Some(f) = self.lease.fenced_pid(ino, &pids) {
            debug!(path = %self.path_for_log(ino), pid = f.pid, ino = ino.0, held = f.epoch.0, current = self.lease.epoch(ino).0, op = what, "fenced");
            self.report.metrics.fenced_operations += 1;
            self.emit_fence(ino, f.pid, f.epoch, what);
            return Err(Error::Stale(Stale::Fenced { held: f.epoch.0, current: self.lease.epoch(ino).0 }));
        }
        Ok(())
    }

    /// The token is a right (SPEC 5): a process whose hold on `ino` was
    /// lost (broken, expired, fenced, its host cut off) reads `ESTALE` for
    /// the lease's epoch and holders until it acquires the lease again. It
    /// never learns a token that is not its own: neither its old one, which
    /// a resource would still take for current, nor its successor's.
    pub(super) fn check_token(&mut self, tid: u32, ino: Ino) -> Result<()> {
        if !self.lease.has_fenced(ino) {
            return Ok(());
        }
        let pids = self.lineage(tid);
        match self.lease.fenced_pid(ino, &pids) {
            Some(f) => {
                debug!(path = %self.path_for_log(ino), pid = f.pid, held = f.epoch.0, "a lost holder asked for the epoch");
                Err(Error::Stale(Stale::Fenced { held: f.epoch.0, current: self.lease.epoch(ino).0 }))
            }
            None => Ok(()),
        }
    }

    /// Remember the epoch a path carried.
    pub(super) fn remember_epoch(&mut self, path: Option<PathBuf>, ino: Ino) {
        let e = self.lease.epoch(ino);
        self.lease.table_mut().floors().remember(path, e);
    }

    /// The lowest epoch an inode newly named by `path` may carry.
    pub(super) fn path_floor(&self, path: Option<&PathBuf>) -> Epoch {
        self.lease.table().floors_ref().floor(path)
    }

    /// Never let an inode named by `path` carry a lower epoch than the path did.
    pub(super) fn floor_epoch(&mut self, path: Option<&PathBuf>, ino: Ino) {
        let floor = self.path_floor(path);
        if floor.0 > 0 {
            self.lease.raise_epoch(ino, floor);
        }
    }

    /// True when `ino` or anything below it is a live lease.
    pub(super) fn holds_live_lease(&self, ino: Ino) -> bool {
        if self.lease.is_live(ino) {
            return true;
        }
        match self.ns.get(ino).map(|i| &i.body) {
            Ok(Body::Dir(d)) => d.iter().any(|(_, c)| self.holds_live_lease(c)),
            _ => false,
        }
    }
}
