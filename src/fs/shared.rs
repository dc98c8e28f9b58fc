//! A namespace shared with other hosts (`--etcd`): reads caught up through
//! the replica's barrier, changes decided on the table and stored by the
//! replica in one compared step (decided again when another host won),
//! readers held back from what is on its way to the store, and what a
//! change that did not land must let go of. The store is never asked
//! under the state lock.

use std::collections::{HashMap, HashSet};

use super::*;

/// A namespace shared with other hosts, and what the change being decided
/// or on its way touches. Invariant: `in_flight` and `in_flight_names` are
/// empty unless a change is on its way to the store, and
/// `referenced_now`/`opened_now` are `Some` only while one is decided.
#[derive(Default)]
pub(super) struct Sharing {
    /// The store the namespace is shared through (an `--etcd` mount).
    pub(super) replica: Option<Box<dyn crate::namespace::replica::Replica>>,
    /// What the change in progress may be stored under only (guarded writes).
    pub(super) conditions: Vec<crate::namespace::replica::Condition>,
    /// Inodes the change being decided handed to the kernel (a lookup
    /// reference each), let go if it does not land.
    pub(super) referenced_now: Option<Vec<Ino>>,
    /// Handles the change being decided opened, let go if it does not land.
    pub(super) opened_now: Option<Vec<Handle>>,
    /// Inodes of this host's change on its way to the shared store: the
    /// table has the change already, so readers of these inodes wait until
    /// it is stored or undone ([`Fs::settled`]).
    pub(super) in_flight: HashSet<Ino>,
    /// Names (directory, name) that change with it: lookups of them wait
    /// too (lookups of other names in those directories do not).
    pub(super) in_flight_names: HashSet<(Ino, OsString)>,
    /// Names other hosts removed or re-pointed, counted as the watch
    /// brings them: the clock of [`Sharing::named_at`] and
    /// [`Sharing::renamed_at`].
    pub(super) names_seq: u64,
    /// When (in `names_seq`) the kernel was last given a name of each
    /// inode by a lookup. The kernel may keep that name (see
    /// `fuse/ttls.rs`) and `open` through it without asking.
    pub(super) named_at: HashMap<Ino, u64>,
    /// When (in `names_seq`) another host last removed or re-pointed a
    /// name of each file.
    pub(super) renamed_at: HashMap<Ino, u64>,
    /// When (in `names_seq`) another host last moved or removed a
    /// directory (any path through it may have gone stale), or
    /// `renamed_at` was emptied to stay small.
    pub(super) all_renamed_at: u64,
    /// Opens refused `ESTALE` because the name the kernel opened by, looked
    /// up from the copy, had gone stale by the open's read of the store.
    pub(super) stale_lookups: u64,
    /// Threads whose open was just refused `ESTALE` after its read of the
    /// store: the kernel is walking that same call's path again
    /// (`LOOKUP_REVAL`), and the open it sends next needs no read of its
    /// own ([`Retries::opened`]).
    pub(super) retrying: Retries,
    /// Reads answered from the copy without asking the store (SPEC 10;
    /// not counting the root's attributes and control files, which always
    /// are).
    pub(super) copy_reads: u64,
    /// Reads refused (`EIO`): the copy was too far behind and the store
    /// could not be read.
    pub(super) copy_refusals: u64,
    /// Lookups of a name the copy lacks answered without asking the
    /// store, for the call that makes it (an `O_CREAT` open, `mkdir`,
    /// `mknod`, `symlink`).
    pub(super) unconfirmed_creates: u64,
    /// Names the copy has that a call making that very name looked up:
    /// confirmed with the store (another host may have removed it).
    pub(super) confirmed_existing: u64,
}

/// How a read of a shared namespace is answered (SPEC 10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// Close-to-open: from the copy while it is within its lag of the
    /// store, else after a read of the store (`EIO` without one).
    Copy,
    /// From the copy, however far behind (the root's attributes, control
    /// files).
    CopyAlways,
    /// After a read of the store (`open`, a name the copy lacks).
    Store,
}

impl std::fmt::Debug for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sharing").field("shared", &self.replica.is_some()).finish_non_exhaustive()
    }
}

/// A thread's open refused `ESTALE` after a read of the store (see
/// [`Sharing::retrying`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Retry {
    at: Instant,
    /// The regular file the walk's last lookup found, if it ended on one.
    found: Option<Ino>,
    /// Whether the refusal came after a read of the store made during the
    /// call (an open's), or from a change decided on the copy (a create
    /// that found the name made by another host).
    read: bool,
}

/// What [`Retries::opened`] found of a thread's open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Walk {
    /// The call's first walk (as far as this host knows).
    First,
    /// The kernel's second walk after a refusal: its open needs a read.
    Again,
    /// The second walk after an open refused following its read: the
    /// open is answered from that read.
    AgainAfterRead,
}

/// How soon after its `ESTALE` the retried open must come to be answered
/// from the refused open's read (the kernel retries at once; a thread
/// scheduled out longer simply reads the store again).
const RETRY_WINDOW: Duration = Duration::from_millis(250);

/// Threads whose open was just refused `ESTALE` (see
/// [`Sharing::retrying`]), and how many opens of the kernel's second walk
/// were answered from the read that refused the first.
#[derive(Debug, Default)]
pub(super) struct Retries {
    map: HashMap<u32, Retry>,
    pub(super) reopened: u64,
}

impl Retries {
    pub(super) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Thread `tid`'s open was refused `ESTALE`: the kernel walks the same
    /// call's path again (`LOOKUP_REVAL`, fresh lookups, from the same
    /// thread, before the call can return) and opens what the walk finds.
    /// `read`: the refusal came after a read of the store made during the
    /// call (see [`Retry::read`]).
    pub(super) fn refused(&mut self, tid: u32, read: bool) {
        self.refused_at(tid, read, Instant::now());
    }

    /// [`Retries::refused`] at `now`.
    fn refused_at(&mut self, tid: u32, read: bool, now: Instant) {
        // A caller the kernel could not name in the daemon's pid namespace
        // comes as pid 0, shared by every such thread.
        if tid == 0 {
            return;
        }
        let r = &mut self.map;
        if r.len() >= 1024 {
            r.retain(|_, m| now.duration_since(m.at) < RETRY_WINDOW);
        }
        r.insert(tid, Retry { at: now, found: None, read });
    }

    /// A lookup by thread `tid` was answered (`found`: the inode and its
    /// kind; `None`: no such name, or an error). While the thread walks a
    /// path again after a refused open, the walk's regular file is the one
    /// its open may take without a read; a walk that ends without a file
    /// ends the retry (its call returns, and the next call reads).
    pub(super) fn looked_up_by(&mut self, tid: u32, found: Option<(Ino, Kind)>) {
        let Some(m) = self.map.get_mut(&tid) else { return };
        match found {
            Some((ino, Kind::File)) => m.found = Some(ino),
            // A directory or a symlink on the way to the file.
            Some((_, Kind::Dir | Kind::Symlink)) => m.found = None,
            _ => {
                self.map.remove(&tid);
            }
        }
    }

    /// Whether thread `tid`'s open of `ino` is the kernel's retry of an
    /// open refused `ESTALE` after a read of the store, within the same
    /// call: its walk looked `ino` up afresh since, from the copy that read
    /// brought up to date, so the open sees every change that completed
    /// before the call began without reading again. Any open of the
    /// thread ends the retry.
    pub(super) fn opened(&mut self, tid: u32, ino: Ino) -> Walk {
        self.opened_at(tid, ino, Instant::now())
    }

    /// [`Retries::opened`] at `now`.
    fn opened_at(&mut self, tid: u32, ino: Ino, now: Instant) -> Walk {
        let Some(m) = self.map.remove(&tid) else { return Walk::First };
        if m.read && m.found == Some(ino) && now.saturating_duration_since(m.at) < RETRY_WINDOW {
            self.reopened += 1;
            Walk::AgainAfterRead
        } else {
            Walk::Again
        }
    }
}

/// How far within its lag the copy must be for a read to be answered on
/// the thread that received it ([`Fs::answers_from_the_copy_now`]): a read
/// that found the copy past its lag after all would wait for the store
/// there.
const INLINE_MARGIN: Duration = Duration::from_millis(100);

/// `Sharing::renamed_at` is emptied (every name counts as moved) past
/// this many files.
const RENAMED_KEPT: usize = 1 << 16;

impl State {
    /// The kernel was just given a name of `ino` by a lookup.
    pub(super) fn named(&mut self, ino: Ino) {
        if self.sharing.replica.is_some() {
            self.sharing.named_at.insert(ino, self.sharing.names_seq);
        }
    }

    /// Whether the name the kernel opens `ino` by may have gone stale:
    /// another host removed or re-pointed a name of the file, or moved a
    /// directory, after the kernel last looked the file up. The open is
    /// refused `ESTALE`; the kernel walks the path again with fresh
    /// lookups (`LOOKUP_REVAL`) and opens what it names now.
    pub(super) fn opened_by_a_stale_name(&self, ino: Ino) -> bool {
        let s = &self.sharing;
        let named = s.named_at.get(&ino).copied().unwrap_or(0);
        s.all_renamed_at > named || s.renamed_at.get(&ino).is_some_and(|&r| r > named)
    }

    /// Another host removed `name` from `dir`, which led to `ino`.
    fn renamed(&mut self, dir: Ino, name: &OsStr, ino: Ino) {
        let s = &mut self.sharing;
        s.names_seq += 1;
        let seq = s.names_seq;
        if self.ns.get(ino).is_ok_and(|i| i.kind == Kind::Dir) {
            s.all_renamed_at = seq;
        } else if !s.named_at.contains_key(&ino) {
            // The kernel holds no name of it: any name it gets later is
            // newer than this change.
        } else if s.renamed_at.len() >= RENAMED_KEPT {
            s.renamed_at.clear();
            s.all_renamed_at = seq;
        } else {
            s.renamed_at.insert(ino, seq);
        }
        // The kernel is told to drop the name (with the next lookup's
        // answer); until then what it kept expires within the copy's lag.
        if self.cache.refs.drop.len() < 4096 {
            self.cache.refs.drop.push((dir, name.to_owned()));
        }
    }

    /// Directory `dir` may no longer be searched by everyone: on a shared
    /// namespace, where the kernel keeps names only in directories everyone
    /// may search (it does not check search permission on the walk), it is
    /// told to drop the names it kept in `dir` (with the next answer that
    /// sends drops), and until then every open through a name it kept
    /// answers `ESTALE`, so the walk is made again with lookups, which
    /// check search permission.
    pub(super) fn unsearchable(&mut self, dir: Ino) {
        if !self.mount.checks_access {
            return;
        }
        self.sharing.names_seq += 1;
        self.sharing.all_renamed_at = self.sharing.names_seq;
        if let Ok(d) = self.ns.get(dir).and_then(|i| i.dir()) {
            let names: Vec<(Ino, OsString)> = d.iter().map(|(n, _)| (dir, n.clone())).collect();
            self.cache.refs.drop.extend(names);
        }
    }

    /// The kernel forgot `ino`: no name of it is cached any more.
    pub(super) fn unnamed(&mut self, ino: Ino) {
        self.sharing.named_at.remove(&ino);
        self.sharing.renamed_at.remove(&ino);
    }

    /// Apply what the watch delivered so far (close-to-open reads).
    pub(super) fn catch_up_quick(&mut self) {
        let Some(r) = self.sharing.replica.as_mut() else { return };
        match r.catch_up_quick(&mut self.ns) {
            Ok(c) => self.caught(c),
            Err(e) => tracing::debug!("answering from the local copy of the namespace: {e:?}"),
        }
    }

    /// Apply what the watch delivered, never re-reading (the lease timer).
    pub(super) fn catch_up_queued(&mut self) {
        let Some(r) = self.sharing.replica.as_mut() else { return };
        match r.catch_up_queued(&mut self.ns) {
            Ok(c) => self.caught(c),
            Err(e) => tracing::debug!("applying what the watch delivered: {e:?}"),
        }
    }

    /// Bring a shared namespace up to `target` (from its barrier): every
    /// change other hosts committed before the barrier was asked. A failed
    /// barrier marks the copy stale (`status`: `"stale": true`).
    pub(super) fn catch_up_to(&mut self, target: Result<i64>) {
        let Some(r) = self.sharing.replica.as_mut() else { return };
        match r.catch_up_to(&mut self.ns, target) {
            Ok(c) => self.caught(c),
            Err(e) => tracing::debug!("answering from the local copy of the namespace: {e:?}"),
        }
    }

    /// The files and the names in directories a change touches: readers
    /// wait for them while it is on its way. A directory's own attributes
    /// (times, link count) are not waited for: every lookup walks through
    /// them.
    fn touched(
        &self,
        dirty: &crate::namespace::InoSet,
        freed: &crate::namespace::InoSet,
    ) -> (HashSet<Ino>, HashSet<(Ino, OsString)>) {
        let mut files = HashSet::new();
        let mut names = HashSet::new();
        for &ino in dirty.iter().chain(freed.iter()) {
            match self.ns.get(ino).map(|i| &i.body) {
                Ok(Body::Dir(d)) => names.extend(d.dirty_names().map(|n| (ino, n.clone()))),
                _ => {
                    files.insert(ino);
                }
            }
        }
        (files, names)
    }

    /// Undo what a change that did not land opened and made: its handles
    /// and the references it handed to the kernel (which never heard of
    /// either).
    pub(super) fn let_go(&mut self, opened: Vec<Handle>, referenced: Vec<Ino>) {
        for h in opened {
            if let Some(f) = self.open.handles.remove(&h) {
                let _ = self.lease.release_handle(f.ino, h.0, None);
                if let Ok(i) = self.ns.get_mut(f.ino) {
                    i.opens = i.opens.saturating_sub(1);
                }
            }
        }
        for ino in referenced {
            self.ns.forget(ino, 1);
            self.collect(ino);
        }
    }

    /// Lease settings and names another host changed.
    pub(super) fn caught(&mut self, c: crate::namespace::replica::Caught) {
        for (ino, x) in c.extras {
            if self.lease.table().lease(ino).and_then(|l| l.ttl()) != x.ttl_ms {
                // Effects of a changed TTL reach waiters at the next tick.
                let _ = self.lease.set_ttl(ino, x.ttl_ms);
            }
            match x.guard {
                Some(g) if self.lease.table().guard(ino).as_ref() != Some(&g) => {
                    self.lease.table_mut().set_guard(ino, g)
                }
                Some(_) => {}
                None => {
                    self.lease.table_mut().remove_guard(ino);
                }
            }
        }
        for (dir, name, ino) in c.removed_names {
            self.renamed(dir, &name, ino);
            if let Some(p) = self.path_of(dir, &name) {
                self.lease.table_mut().views().name_removed(p, ino);
            }
        }
        for (dir, name, ino) in c.added_names {
            if let Some(old) = self.path_of(dir, &name).and_then(|p| self.lease.table_mut().views().take_removed(&p)) {
                if old != ino {
                    self.succeed(old, ino);
                }
            }
        }
        for dir in c.unsearchable {
            self.unsearchable(dir);
        }
        for ino in c.unlinked {
            self.collect(ino);
        }
    }
}

impl Fs {
    /// The state for a read of `inos` (`stat`, `read`, xattrs, `access`):
    /// close-to-open (SPEC 10). It answers from this host's copy, as the
    /// watch brought it, while the copy is known to be at most
    /// `--etcd-copy-lag` (1 s) behind the store; past that it asks the
    /// store first (one read, shared by the readers that come together)
    /// and fails with `EIO` when it cannot. A change of this host on its way to the
    /// store that touches one of `inos` is waited for.
    pub(super) fn fresh(&self, inos: &[Ino]) -> Result<parking_lot::MutexGuard<'_, State>> {
        self.fresh_unless(Read::Copy, |st| inos.iter().any(|i| st.sharing.in_flight.contains(i)))
    }

    /// As [`Fs::fresh`] for the attributes of the mount's root, which
    /// always exists, and for control files: answered from the copy
    /// however far behind it is, so a process can still `cd` into the
    /// mount, walk it and read `.leasefs/status` while etcd cannot be
    /// reached (what it then opens fails with `EIO`).
    pub(super) fn fresh_root(&self) -> Result<parking_lot::MutexGuard<'_, State>> {
        self.fresh_unless(Read::CopyAlways, |st| st.sharing.in_flight.contains(&Ino::ROOT))
    }

    /// As [`Fs::fresh`] for an `open`: it sees every change that completed
    /// anywhere before it began (one read of the store, shared).
    pub(super) fn fresh_open(&self, inos: &[Ino]) -> Result<parking_lot::MutexGuard<'_, State>> {
        self.fresh_unless(Read::Store, |st| inos.iter().any(|i| st.sharing.in_flight.contains(i)))
    }

    /// As [`Fs::fresh`], for a listing of directory `dir`: it waits for
    /// changes of the directory's names.
    pub(super) fn fresh_listing(&self, dir: Ino) -> Result<parking_lot::MutexGuard<'_, State>> {
        self.fresh_unless(Read::Copy, |st| st.sharing.in_flight_names.iter().any(|(d, _)| *d == dir))
    }

    /// As [`Fs::fresh`], for a lookup of `name` in `dir`: it waits for a
    /// change of that name or of the inode it leads to, not of other names
    /// of the directory. `confirm`: ask the store first (a name the copy
    /// lacks is confirmed before `ENOENT` is answered).
    pub(super) fn fresh_name(
        &self,
        dir: Ino,
        name: &OsStr,
        confirm: bool,
    ) -> Result<parking_lot::MutexGuard<'_, State>> {
        self.fresh_unless(if confirm { Read::Store } else { Read::Copy }, |st| {
            (!st.sharing.in_flight.is_empty() || !st.sharing.in_flight_names.is_empty())
                && (st.sharing.in_flight_names.contains(&(dir, name.to_owned()))
                    || st.ns.child(dir, name).is_ok_and(|c| st.sharing.in_flight.contains(&c)))
        })
    }

    /// How long the kernel may keep a name it is given now: on a shared
    /// namespace, for what is left of the copy's lag (SPEC 10), so what the
    /// kernel answers by itself is never older than what the daemon may
    /// answer from its copy (none once the copy is past its lag, or its
    /// feed broke); unbounded elsewhere.
    pub fn entry_budget(&self) -> Duration {
        match self.barrier.get() {
            None => Duration::MAX,
            Some(b) => b.lag().map_or(Duration::ZERO, |l| b.max_lag().saturating_sub(l)),
        }
    }

    /// Whether a read of the copy would be answered now without a round
    /// trip or a wait: the copy is well within its lag (by
    /// `INLINE_MARGIN`) and no change of this host is on its way to the
    /// store. Never blocks (false when the state is busy).
    pub fn answers_from_the_copy_now(&self) -> bool {
        let Some(b) = self.barrier.get() else { return false };
        if b.lag().is_none_or(|l| l + INLINE_MARGIN >= b.max_lag()) {
            return false;
        }
        self.state.try_lock().is_some_and(|st| st.sharing.in_flight.is_empty() && st.sharing.in_flight_names.is_empty())
    }

    /// Whether reads on this mount may answer from a copy that can lag
    /// (a shared namespace): a name the copy lacks must then be confirmed.
    pub(super) fn reads_a_copy(&self) -> bool {
        self.barrier.get().is_some()
    }

    /// The state caught up, once `waits` says nothing the caller reads is
    /// on its way to the store, as `read` says. After a wait it catches up
    /// again: a change that did not land leaves the table to be brought up
    /// to the target (another host's change that won may have been held
    /// back meanwhile).
    pub(super) fn fresh_unless(
        &self,
        read: Read,
        waits: impl Fn(&State) -> bool,
    ) -> Result<parking_lot::MutexGuard<'_, State>> {
        let Some(barrier) = self.barrier.get() else { return Ok(self.state.lock()) };
        let recent = match read {
            Read::CopyAlways => true,
            Read::Copy => barrier.lag().is_some_and(|l| l < barrier.max_lag()),
            Read::Store => false,
        };
        let target = if recent { None } else { Some(barrier.target()) };
        let mut st = self.state.lock();
        if recent && read == Read::Copy {
            st.sharing.copy_reads += 1;
        }
        loop {
            match target {
                None => st.catch_up_quick(),
                Some(t) => st.catch_up_to(t),
            }
            // Too far behind to answer from the copy, and the store cannot
            // be read: nothing is shown that could not be checked.
            if let Some(Err(e)) = target {
                st.sharing.copy_refusals += 1;
                return Err(e);
            }
            if !waits(&st) {
                return Ok(st);
            }
            while waits(&st) {
                self.settled.wait(&mut st);
            }
        }
    }

    /// Run `op`, which changes the namespace. On a shared namespace it runs
    /// on a table caught up with every other host, and its change is stored
    /// before its caller is answered (`EIO` when it could not be; the change
    /// is then undone). When another host changed what `op` decided on
    /// first, nothing was stored: what `op` opened and made is let go, and
    /// `op` runs again on the fresh copy (at most [`CONFLICT_TRIES`] times),
    /// so it answers as if it had come after the other host's change.
    ///
    /// The state lock is not held while etcd is asked (the barrier of a
    /// retry, the check of an answer that stores nothing, the store step):
    /// other requests are served meanwhile; this host's changes wait for
    /// each other ([`Fs::changing`]).
    pub(super) fn change<T>(&self, mut op: impl FnMut(&mut State) -> Result<T>) -> Result<T> {
        let Some(barrier) = self.barrier.get() else {
            let mut st = self.state.lock();
            let out = op(&mut st);
            self.write_back(&mut st);
            return out;
        };
        let _one_at_a_time = self.changing.lock();
        let mut tries = 0;
        loop {
            tries += 1;
            // The first attempt is decided on what this host knows (its
            // watch applied): what it stores is compared anyway.
            let fresh = tries > 1;
            let target = fresh.then(|| barrier.target_now());
            let mut st = self.state.lock();
            let Some(mut r) = st.sharing.replica.take() else { return Err(Error::Unreachable) };
            let c = match r.begin(&mut st.ns, target) {
                Ok(c) => c,
                Err(e) => {
                    st.sharing.replica = Some(r);
                    return Err(e);
                }
            };
            st.caught(c);
            st.sharing.referenced_now = Some(Vec::new());
            st.sharing.opened_now = Some(Vec::new());
            let out = op(&mut st);
            let claims = st.lease.take_claims();
            st.sharing.conditions.extend(claims);
            let referenced = st.sharing.referenced_now.take().unwrap_or_default();
            let opened = st.sharing.opened_now.take().unwrap_or_default();
            let (dirty, freed) = st.ns.dirty();
            if !fresh && dirty.is_empty() && freed.is_empty() && st.sharing.conditions.is_empty() {
                // Nothing to store, so nothing compared: an answer that
                // changes nothing (an error, an existing file opened) stands
                // only if the namespace had not moved on before the call.
                let before = r.applied();
                st.sharing.replica = Some(r);
                drop(st);
                match self.still_current(barrier.as_ref(), before, opened, referenced) {
                    Ok(true) => return out,
                    Ok(false) => continue,
                    Err(e) => return Err(e),
                }
            }
            let (in_flight, in_flight_names) = st.touched(dirty, freed);
            let conditions = std::mem::take(&mut st.sharing.conditions);
            let st_ref = &mut *st;
            let lease = &st_ref.lease;
            let prepared = r.prepare(&mut st_ref.ns, &|ino| extra_of(lease, ino), &conditions);
            let mut publication = match prepared {
                Ok(Some(p)) => p,
                Ok(None) => {
                    st.sharing.replica = Some(r);
                    return out;
                }
                Err(e) => {
                    st.let_go(opened, referenced);
                    st.sharing.replica = Some(r);
                    return Err(e);
                }
            };
            st.sharing.in_flight = in_flight;
            st.sharing.in_flight_names = in_flight_names;
            st.sharing.replica = Some(r);
            drop(st);
            if !conditions.is_empty() {
                crate::failpoints::pausepoint("guarded-publish");
            }
            if tries == 1 {
                crate::failpoints::pausepoint("publish");
            }
            // Whatever happens while it is sent, the change settles below
            // (a panic is taken as no answer: the change is undone), or its
            // readers would wait for ever.
            let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| publication.send()));
            if sent.is_err() {
                tracing::error!("sending a change to the shared store panicked; it is undone");
            }
            let mut st = self.state.lock();
            st.sharing.in_flight.clear();
            st.sharing.in_flight_names.clear();
            self.settled.notify_all();
            let Some(mut r) = st.sharing.replica.take() else { return Err(Error::Unreachable) };
            let published = r.settle(&mut st.ns, publication);
            st.sharing.replica = Some(r);
            match (out, published) {
                (Ok(v), Ok(())) => return Ok(v),
                (_, Err(Error::Conflict)) if tries < CONFLICT_TRIES => st.let_go(opened, referenced),
                (_, Err(e)) => {
                    st.let_go(opened, referenced);
                    return Err(e);
                }
                (Err(e), Ok(())) => return Err(e),
            }
        }
    }

    /// Whether an answer decided on the namespace at revision `before`,
    /// which stored nothing, still stands: true when the namespace had not
    /// moved on by the time of a fresh read barrier (brought up to it
    /// either way). When it had, or on an error, the handles and kernel
    /// references the attempt made are let go.
    fn still_current(
        &self,
        barrier: &dyn crate::namespace::replica::Barrier,
        before: i64,
        opened: Vec<Handle>,
        referenced: Vec<Ino>,
    ) -> Result<bool> {
        let target = barrier.target_now();
        let mut st = self.state.lock();
        let Some(mut r) = st.sharing.replica.take() else { return Err(Error::Unreachable) };
        let caught = r.catch_up_to(&mut st.ns, target);
        let moved = r.applied() != before;
        st.sharing.replica = Some(r);
        match caught {
            Ok(c) if !moved => {
                st.caught(c);
                Ok(true)
            }
            Ok(c) => {
                st.let_go(opened, referenced);
                st.caught(c);
                Ok(false)
            }
            Err(e) => {
                st.let_go(opened, referenced);
                Err(e)
            }
        }
    }

    /// The state with the epochs of `inos` brought up to what the whole
    /// namespace knows (see [`LeaseAuthority::refresh_epochs`]), read
    /// without the state lock: the lock is let go and taken again, so the
    /// caller looks up what it needs after this.
    pub(super) fn refreshed<'a>(
        &'a self,
        mut st: parking_lot::MutexGuard<'a, State>,
        inos: &[Ino],
    ) -> Result<parking_lot::MutexGuard<'a, State>> {
        let Some(read) = st.lease.begin_refresh(inos) else { return Ok(st) };
        drop(st);
        let answer = read.send();
        let mut st = self.state.lock();
        st.lease.finish_refresh(answer)?;
        Ok(st)
    }

    /// On a shared namespace, `check` before the change asks etcd anything:
    /// a refusal that needs no other host (a fenced holder) is answered
    /// even while the shared store cannot be reached.
    pub(super) fn precheck(&self, check: impl FnOnce(&mut State) -> Result<()>) -> Result<()> {
        let mut st = self.state.lock();
        if st.sharing.replica.is_some() {
            check(&mut st)?;
        }
        Ok(())
    }

    /// Share the namespace through `replica`: the table is replaced by the
    /// shared namespace as it is now.
    pub(super) fn share(&self, mut replica: Box<dyn crate::namespace::replica::Replica>) -> Result<()> {
        let _ = self.barrier.set(replica.barrier());
        let mut st = self.state.lock();
        st.ns.set_tracking();
        let c = replica.catch_up(&mut st.ns)?;
        st.caught(c);
        st.bounds.max_file = replica.max_file_size();
        st.bounds.removed_are_room = false;
        st.sharing.replica = Some(replica);
        st.mount.checks_access = true;
        Ok(())
    }
}

#[cfg(test)]
mod retry_tests {
    use super::*;

    #[test]
    fn only_the_open_of_the_file_the_second_walk_found_after_a_read_skips_its_read() {
        let (f, g) = (Ino(10), Ino(11));
        let mut r = Retries::default();
        assert_eq!(r.opened(1, f), Walk::First);
        // Refused after a read; the walk goes through a directory to f.
        r.refused(1, true);
        r.looked_up_by(1, Some((Ino(5), Kind::Dir)));
        r.looked_up_by(1, Some((f, Kind::File)));
        assert_eq!(r.opened(1, f), Walk::AgainAfterRead);
        assert_eq!(r.reopened, 1);
        // Any open ends the retry: the next one is a new call.
        assert_eq!(r.opened(1, f), Walk::First);
        // Another file than the walk found, or another thread.
        r.refused(1, true);
        r.looked_up_by(1, Some((f, Kind::File)));
        assert_eq!(r.opened(2, f), Walk::First);
        assert_eq!(r.opened(1, g), Walk::Again);
        // A walk that ended on no file ends the retry.
        r.refused(1, true);
        r.looked_up_by(1, None);
        assert_eq!(r.opened(1, f), Walk::First);
        // An open whose walk looked nothing up (the name came from the
        // first walk) reads.
        r.refused(1, true);
        assert_eq!(r.opened(1, f), Walk::Again);
        // A refusal without a read during the call (a create that found
        // the name made elsewhere) never spares the read.
        r.refused(1, false);
        r.looked_up_by(1, Some((f, Kind::File)));
        assert_eq!(r.opened(1, f), Walk::Again);
        assert_eq!(r.reopened, 1);
        assert!(r.is_empty());
        // Pid 0 (a caller outside the daemon's pid namespace) names no one thread.
        r.refused(0, true);
        r.looked_up_by(0, Some((f, Kind::File)));
        assert_eq!(r.opened(0, f), Walk::First);
    }

    #[test]
    fn a_second_walk_later_than_the_window_reads_again() {
        let f = Ino(10);
        let t0 = Instant::now();
        let mut r = Retries::default();
        let just_inside = RETRY_WINDOW - Duration::from_millis(1);
        for (after, walk) in [(just_inside, Walk::AgainAfterRead), (RETRY_WINDOW, Walk::Again)] {
            r.refused_at(7, true, t0);
            r.looked_up_by(7, Some((f, Kind::File)));
            assert_eq!(r.opened_at(7, f, t0 + after), walk, "{after:?} after the refusal");
        }
        assert_eq!(r.reopened, 1);
        // A full table drops the refusals older than the window.
        for tid in 1..=1024 {
            r.refused_at(tid, true, t0);
        }
        r.refused_at(2000, true, t0 + RETRY_WINDOW);
        assert_eq!(r.map.len(), 1, "only the newest refusal is kept");
    }
}
