//! Durability and compaction: epochs reserved before they are handed out,
//! changes appended to the namespace journal (synced by group commit, off
//! the request path), snapshots encoded a slice at a time and written on a
//! thread of their own, and the daemon's shutdown.

use super::*;

/// The durable namespace and its compaction.
#[derive(Debug)]
pub(super) struct Durable {
    /// The durable namespace (none: contents live in memory only).
    pub(super) store: Option<crate::store::snapshot::Store>,
    /// `--volatile`: the namespace is deliberately not kept.
    pub(super) volatile: bool,
    /// A snapshot being encoded between requests or written off the
    /// request path.
    pub(super) compaction: Option<Compaction>,
    /// How long one slice of a snapshot image may hold the state lock.
    pub(super) slice: std::time::Duration,
    /// The namespace's page churn at the last flush: pages added since
    /// are new records, pages removed since left garbage behind.
    pub(super) churn_at_flush: crate::namespace::PageChurn,
    /// Bytes of file content written since the last flush: past
    /// [`WRITEBACK_BYTES`] they are appended without waiting for an
    /// `fsync`.
    pub(super) unflushed: u64,
    /// The buffer journal batches are encoded into, kept between flushes.
    pub(super) batch: Vec<u8>,
}

impl Default for Durable {
    fn default() -> Durable {
        Durable {
            store: None,
            volatile: false,
            compaction: None,
            slice: SLICE,
            churn_at_flush: Default::default(),
            unflushed: 0,
            batch: Vec::new(),
        }
    }
}

impl State {
    /// Make the next epoch of `ino` durable before any operation can hand it
    /// out (SPEC 5).
    pub(super) fn reserve(&mut self, ino: Ino) -> Result<()> {
        let need = self.lease.epoch(ino).0 + 1;
        self.lease.table_mut().floors().reserve(need)
    }

    /// Lease settings of `ino` for the durable store.
    pub(super) fn extra(&self, ino: Ino) -> crate::store::snapshot::Extra {
        extra_of(&self.lease, ino)
    }

    /// Write what changed since the last flush to the journal and sync it.
    pub(super) fn flush(&mut self) -> Result<()> {
        match self.append_changes()? {
            Some(sync) => sync().map_err(|e| {
                tracing::error!("journal sync failed: {e}; durability is no longer promised (fail-stop)");
                if let Some(s) = &self.durable.store {
                    s.fail_flag().store(true, std::sync::atomic::Ordering::Release);
                }
                Error::Io
            }),
            None => Ok(()),
        }
    }

    /// Append what changed since the last flush to the journal; the
    /// returned sync makes it durable (none: nothing to write). Folds the
    /// journal into a snapshot when it has grown (the snapshot is durable
    /// when this returns).
    pub(super) fn append_changes(&mut self) -> Result<Option<crate::store::storage::Syncer>> {
        self.finish_compaction(false);
        let Some(store) = self.durable.store.as_ref() else {
            return Ok(None);
        };
        if store.failed() {
            return Err(Error::Io);
        }
        let (dirty, freed) = self.ns.dirty();
        if dirty.is_empty() && freed.is_empty() {
            return Ok(None);
        }
        let buf = std::mem::take(&mut self.durable.batch);
        let batch = crate::store::snapshot::encode_changes_into(&self.ns, |ino| self.extra(ino), buf);
        // The batch's records of pages added since the last flush are new
        // data; the rest rewrite what is stored.
        let (churn, then) = (self.ns.churn(), self.durable.churn_at_flush);
        let (added, removed) = (churn.added - then.added, churn.removed - then.removed);
        let fresh = added.saturating_mul(PAGE_RECORD).min(batch.len() as u64);
        let store = self.durable.store.as_mut().expect("checked above");
        let appended = store.append_fresh(&batch, fresh);
        // Kept for the next flush unless it was a rare large one.
        if batch.capacity() <= KEPT_BATCH {
            self.durable.batch = batch;
        }
        let sync = match appended {
            Ok(sync) => sync,
            Err(e) => return Err(Error::from(&e)),
        };
        let store = self.durable.store.as_mut().expect("checked above");
        self.ns.clear_dirty();
        self.durable.unflushed = 0;
        store.note_removed(removed.saturating_mul(PAGE as u64));
        self.durable.churn_at_flush = churn;
        let live = self.live_bytes();
        let store = self.durable.store.as_ref().expect("checked above");
        if !store.compacting() && store.wants_snapshot_for(|| live) {
            self.start_compaction();
        }
        Ok(Some(sync))
    }

    /// An estimate of the bytes a snapshot of the namespace would take now
    /// (the threshold the flush applies to a snapshot much larger than it).
    pub(super) fn live_bytes(&self) -> u64 {
        self.ns.usage().pages * PAGE as u64 + self.ns.len() as u64 * 128
    }

    /// The live state the state directory is bounded by: contents (in
    /// pages), extended attributes, and 256 bytes for each inode (its
    /// record and its name; a snapshot takes ~220 bytes for a small file
    /// with a short name, at most about three times that with the longest
    /// names).
    pub(crate) fn live_state(&self) -> u64 {
        self.ns.usage().bytes() + self.ns.len() as u64 * 256
    }

    /// True when the state directory holds far more than the live state:
    /// large files were removed, or churn left a journal of what no longer
    /// exists, and nothing appended since made a flush look at it (an
    /// `fsync`, a write-back). Past 4 x the live state + 2 MiB it is
    /// compacted, to about one snapshot (at most ~3 x the live state, so a
    /// compaction never retriggers itself) and a short journal: within 6 x
    /// live + 4 MiB a few seconds after the last change (SPEC 9). The
    /// journal that compaction continues from stays behind it; when that
    /// is large, the next check compacts once more to replace it.
    pub(super) fn outgrown(&self) -> bool {
        let Some(store) = self.durable.store.as_ref() else { return false };
        if self.durable.compaction.is_some() || store.compacting() || store.failed() {
            return false;
        }
        let (dirty, freed) = self.ns.dirty();
        // The old journal a background snapshot continues from can hold
        // everything appended since the snapshot before (as much as that
        // snapshot): a snapshot now replaces it with an empty journal.
        let old_journal = store.other_bytes() > store.snapshot_min;
        if dirty.is_empty() && freed.is_empty() && !store.changed_since_snapshot() && !old_journal {
            return false;
        }
        store.disk_bytes() > self.live_state().saturating_mul(4).saturating_add(2 * store.snapshot_min)
    }

    /// Fold the journal into a snapshot: the image is encoded a slice at a
    /// time by the lease timer ([`State::compaction_step`]), then written,
    /// synced and renamed on a thread of its own while requests (and
    /// journal appends) go on; [`State::finish_compaction`] then starts the
    /// new journal. Backends without a second handle write it in line.
    pub(super) fn start_compaction(&mut self) {
        use crate::store::snapshot::{encode_streamed, Slices};
        let Some(store) = self.durable.store.as_mut() else { return };
        if store.fork_storage().is_none() {
            let (head, ns, lease) = (store.head(), &self.ns, &self.lease);
            // Failures are logged by the store; a full disk postpones it.
            let _ = store.snapshot_streamed(|out| encode_streamed(head, ns, |ino| extra_of(lease, ino), out));
            return;
        }
        let Some(head) = store.begin_snapshot() else { return };
        self.durable.compaction = Some(Compaction::Encoding(Slices::new(head, &self.ns)));
        // The timer encodes the slices.
        self.wake.wake();
    }

    /// What a compaction in progress is doing, for `status`.
    pub(super) fn compaction_phase(&self) -> Option<&'static str> {
        self.durable.compaction.as_ref().map(Compaction::phase)
    }

    /// True while a snapshot image is being encoded: the lease timer calls
    /// [`State::compaction_step`] once the namespace is all in the journal.
    pub(super) fn encoding(&self) -> bool {
        matches!(self.durable.compaction, Some(Compaction::Encoding(_)))
    }

    /// Encode the next slice of the snapshot image (the caller appended
    /// every change to the journal first: see [`Slices`]); once the image
    /// is whole, write it on a thread of its own.
    pub(super) fn compaction_step(&mut self) {
        debug_assert!(self.ns.dirty().0.is_empty() && self.ns.dirty().1.is_empty());
        let Some(Compaction::Encoding(slices)) = &mut self.durable.compaction else { return };
        let lease = &self.lease;
        if !slices.step(&self.ns, |ino| extra_of(lease, ino), self.durable.slice) {
            return;
        }
        let Some(Compaction::Encoding(slices)) = self.durable.compaction.take() else { unreachable!("matched above") };
        let img = slices.finish(&self.ns);
        let Some(store) = self.durable.store.as_mut() else { return };
        let Some(mut storage) = store.fork_storage() else {
            store.abandon_snapshot();
            return;
        };
        let job = store.snapshot_job(img);
        let wake = self.wake.clone();
        let spawned = std::thread::Builder::new().name("snapshot".into()).spawn(move || {
            // Background work: requests come first when the CPUs are busy.
            // SAFETY: setpriority on this thread's own id.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
            }
            let written = crate::store::snapshot::write_snapshot(&mut *storage, &job);
            // The timer finishes the compaction.
            wake.wake();
            written
        });
        match spawned {
            Ok(t) => self.durable.compaction = Some(Compaction::Writing(t)),
            Err(e) => {
                tracing::warn!("cannot start the snapshot thread: {e}; compaction postponed");
                store.abandon_snapshot();
            }
        }
    }

    /// Finish a snapshot written off the request path once it is written
    /// (`wait`: block until it is; an image still being encoded is
    /// dropped).
    pub(super) fn finish_compaction(&mut self, wait: bool) {
        match &self.durable.compaction {
            Some(Compaction::Writing(t)) if wait || t.is_finished() => {}
            Some(Compaction::Encoding(_)) if wait => {
                self.durable.compaction = None;
                if let Some(store) = self.durable.store.as_mut() {
                    store.abandon_snapshot();
                }
                return;
            }
            _ => return,
        }
        let Some(Compaction::Writing(t)) = self.durable.compaction.take() else { unreachable!("matched above") };
        let written = t.join().unwrap_or_else(|_| Err(std::io::Error::from_raw_os_error(libc::EIO)));
        if let Some(store) = self.durable.store.as_mut() {
            // Failures are logged by the store.
            let _ = store.finish_snapshot(written);
        }
    }
}

impl Fs {
    /// Changes without a sync are appended to the journal once
    /// [`WRITEBACK`] inodes have changed or [`WRITEBACK_BYTES`] of content
    /// were written (their sync runs on the
    /// group-commit thread, answering nobody), so no `fsync` has to encode
    /// and append more than that while it holds the state lock: an `fsync`
    /// after a million leases created without one would stop every request
    /// for seconds. A failure here is met again, and reported, by the next
    /// `fsync`.
    pub(super) fn write_back(&self, st: &mut State) {
        let (dirty, freed) = st.ns.dirty();
        if st.durable.store.is_none()
            || (dirty.len() + freed.len() < WRITEBACK && st.durable.unflushed < WRITEBACK_BYTES)
        {
            return;
        }
        let _ = self.append_unsynced(st);
    }

    /// Append what changed since the last flush to the journal; its sync
    /// runs on the group-commit thread and answers nobody, so no disk sync
    /// lands on the request path.
    pub(super) fn append_unsynced(&self, st: &mut State) -> Result<()> {
        let (dirty, freed) = st.ns.dirty();
        if dirty.is_empty() && freed.is_empty() {
            return Ok(());
        }
        let sync = st.append_changes()?;
        let failed = st.durable.store.as_ref().map(|s| s.fail_flag()).unwrap_or_default();
        self.group.submit(sync, &failed, Box::new(|_| {}));
        Ok(())
    }

    /// Keep the namespace durable in `store`, starting from what it
    /// recovered (restored files resume above the epoch journal's
    /// ceiling, which [`Fs::start`] set first).
    pub(crate) fn restore(&self, store: crate::store::snapshot::Store, rec: crate::store::snapshot::Recovered) {
        let mut st = self.state.lock();
        let root = st.ns.get(Ino::ROOT).map(|r| (r.perm, r.uid, r.gid)).unwrap_or((0o755, 0, 0));
        let fresh = std::mem::replace(&mut st.ns, Namespace::new(root.0, root.1, root.2, now()));
        st.ns = Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, fresh);
        for (ino, x) in rec.extras {
            if st.ns.get(ino).is_err() {
                continue;
            }
            if let Some(t) = x.ttl_ms {
                st.lease.table_mut().set_ttl(ino, Some(t));
            }
            if let Some(g) = x.guard {
                st.lease.table_mut().set_guard(ino, g);
            }
        }
        // Restored files resume above the recovered epoch ceiling: any epoch
        // up to it may have been handed out before the restart.
        let floor = st.lease.table_mut().floors().new_path_floor();
        st.lease.raise_all(floor);
        st.ns.set_tracking();
        st.durable.churn_at_flush = st.ns.churn();
        st.durable.store = Some(store);
    }

    /// `fsync`, `fdatasync`, `fsyncdir`: make every change so far durable
    /// (one flush covers all files), then call `done`: at once when there is
    /// nothing to wait for, otherwise from the group-commit thread while
    /// other requests go on. `ENOSPC` on a full state disk, `EIO` for good
    /// after any other state-disk error.
    pub fn sync_then(&self, done: crate::store::group::Done) {
        let mut st = self.state.lock();
        match st.append_changes() {
            Err(e) => {
                drop(st);
                done(Err(e));
            }
            Ok(None) if !self.group.busy() => {
                drop(st);
                done(Ok(()));
            }
            Ok(sync) => {
                // Queued under the state lock: callers are answered in the
                // order their changes were appended.
                let failed = st.durable.store.as_ref().map(|s| s.fail_flag()).unwrap_or_default();
                self.group.submit(sync, &failed, done);
            }
        }
    }

    /// True when nothing of the namespace is kept on disk (`--volatile`, or
    /// a shared namespace, where every change is stored before it is
    /// answered): a sync has nothing to do.
    pub fn nothing_to_sync(&self) -> bool {
        self.state.lock().durable.store.is_none()
    }

    /// [`Fs::sync_then`], waiting for the answer.
    pub fn sync(&self) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.sync_then(Box::new(move |r| {
            let _ = tx.send(r);
        }));
        rx.recv().unwrap_or(Err(Error::Io))
    }

    /// Clean unmount: fold everything into a snapshot. Changes never
    /// synced (at most `WRITEBACK` inodes) are flushed to the journal
    /// first, so a crash during the snapshot keeps them too. Nothing is
    /// written when nothing changed since the last snapshot.
    pub fn shutdown(&self) {
        self.group.stop();
        let mut st = self.state.lock();
        st.lease.shutdown();
        st.finish_compaction(true);
        let Some(store) = st.durable.store.as_ref() else { return };
        let (dirty, freed) = st.ns.dirty();
        let pending = dirty.len() + freed.len();
        if pending == 0 && !store.changed_since_snapshot() {
            tracing::info!("nothing changed since the last snapshot");
            return;
        }
        if let Err(e) = st.flush() {
            tracing::error!("final flush failed: {e:?}");
            return;
        }
        if let Err(e) = st.snapshot_in_line() {
            tracing::error!("snapshot at unmount failed: {e}");
        }
    }
}

impl State {
    /// Write the whole namespace as a snapshot now, under the lock (at
    /// unmount, and after a power cut): recovery then starts from it and
    /// nothing journaled before it. Nothing to do on a volatile mount.
    pub(super) fn snapshot_in_line(&mut self) -> std::io::Result<()> {
        let Some(store) = self.durable.store.as_mut() else { return Ok(()) };
        let started = std::time::Instant::now();
        // Streamed to the file as it is encoded (see `encode_streamed`).
        let (ns, lease) = (&self.ns, &self.lease);
        let head = store.head();
        store.snapshot_streamed(|out| {
            crate::store::snapshot::encode_streamed(head, ns, |ino| extra_of(lease, ino), out)
        })?;
        let bytes = store.snapshot_bytes();
        tracing::info!(bytes, ms = started.elapsed().as_millis() as u64, "snapshot written");
        Ok(())
    }
}

/// Changed inodes (and dropped ones) that are appended to the journal
/// without waiting for an `fsync` (a millisecond or two of encoding under
/// the state lock; 2 048 took up to 17 ms, traced, when each also
/// re-encoded a directory).
pub(super) const WRITEBACK: usize = 1024;

/// File content written without an `fsync` that is appended to the
/// journal as it comes (in batches of about this size): an `fsync` after a
/// large write then appends only the last of it, and no batch as large as
/// the file is encoded, copied and written at once.
pub(super) const WRITEBACK_BYTES: u64 = 8 << 20;

/// The largest batch buffer kept between flushes.
const KEPT_BATCH: usize = 2 * WRITEBACK_BYTES as usize;

/// The most a journal record of one new page takes (the page and its
/// record's frame, tag, inode, index and length).
const PAGE_RECORD: u64 = PAGE as u64 + 64;

/// How long one slice of a snapshot image holds the state lock.
pub(super) const SLICE: std::time::Duration = std::time::Duration::from_millis(2);

/// A compaction in progress.
pub(super) enum Compaction {
    /// The image, encoded a slice at a time between requests.
    Encoding(crate::store::snapshot::Slices),
    /// The image is being written by this thread.
    Writing(std::thread::JoinHandle<std::io::Result<crate::store::snapshot::SnapshotWritten>>),
}

impl Compaction {
    pub(super) fn phase(&self) -> &'static str {
        match self {
            Compaction::Encoding(_) => "encoding",
            Compaction::Writing(_) => "writing",
        }
    }
}

impl std::fmt::Debug for Compaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.phase())
    }
}

/// Have the allocator map buffers of a MiB or more on their own (journal
/// batches and snapshot images as large as the namespace, the sets and
/// tables of a million leases): they go back to the system when freed and
/// grow by remapping, not copying, so neither a trim nor a copy of one runs
/// under the state lock. Without this, glibc raises its threshold to the
/// largest buffer freed so far (up to 32 MiB) and serves later ones from
/// the heap.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

pub(super) fn give_memory_back() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Lease settings of `ino` for the durable store.
pub(super) fn extra_of(lease: &LeaseAuthority, ino: Ino) -> crate::store::snapshot::Extra {
    crate::store::snapshot::Extra {
        ttl_ms: lease.table().lease(ino).and_then(|l| l.ttl()),
        guard: lease.table().guard(ino),
    }
}
