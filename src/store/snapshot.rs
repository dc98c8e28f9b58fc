//! The durable namespace: a write-ahead journal of changed inodes, pages and
//! directory entries, compacted into a snapshot, in the state directory.
//!
//! **What is durable when.** The namespace tracks what changed since the last
//! flush (inodes, 4 KiB pages, directory names, dropped inodes). A flush
//! encodes those changes as one batch of checksummed records ending with a
//! commit record and appends it to `namespace.journal`; the caller is
//! answered once an `fdatasync` that started after the append returned
//! (group commit, [`crate::store::group`]: one flush covers all changes of
//! all files). Flushes happen on every `fsync`/`fdatasync`/`fsyncdir` of
//! anything on the mount and at clean unmount. Hence the contract: the
//! namespace, contents, xattrs, TTLs and guards are durable as of the last
//! sync that returned. Epochs are not kept here (see [`crate::store::epochs`]).
//!
//! **Recovery.** The snapshot (if any) must be whole: it is written to a
//! temporary file, synced, renamed and the directory synced, so any damage
//! in it stops start-up with the file and offset. Journal batches are
//! replayed on top when the journal's generation matches the snapshot's (a
//! journal of an older generation was folded into the snapshot before the
//! crash, except past the offset a background snapshot records, see below).
//! A torn or corrupt last record, zeros to the end of the file, or a batch
//! without its commit record is the trace of a crash mid-flush — never
//! acknowledged — and is cut off with a warning; a bad record followed by
//! good ones is corruption and stops start-up.
//!
//! **Compaction.** When the journal outgrows the snapshot (and at clean
//! unmount) the whole namespace is written as a new snapshot of the next
//! generation and the journal starts over. While the mount serves, the
//! snapshot is written by another thread ([`write_snapshot`]) while batches
//! go on being appended; it records the journal offset it covers, and
//! [`Store::finish_snapshot`] starts the new journal with the batches
//! appended since. A crash at any step leaves the old snapshot with its
//! journal, the new snapshot with the old journal (replayed from the
//! recorded offset), or the new snapshot with its journal.
//!
//! **Failure.** A full disk makes a flush fail with `ENOSPC` (the partial
//! batch is cut away, the changes stay pending, and the next sync retries);
//! any other I/O error stops durability for good (fail-stop): every later
//! sync fails with `EIO` instead of pretending.
//!
//! The record codec is in [`crate::store::records`].

use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime};

use crate::namespace::{Body, Ino, Inode, Namespace};
use crate::store::storage::{Storage, Syncer};

pub use super::records::{crc32, Enc, Extra};
use super::records::{scan, Rec, Scan};

/// The journal file in the state directory.
pub const JOURNAL: &str = "namespace.journal";
/// The snapshot file in the state directory.
pub const SNAPSHOT: &str = "namespace.snapshot";
const SNAPSHOT_TMP: &str = "namespace.snapshot.tmp";
const JOURNAL_TMP: &str = "namespace.journal.tmp";

/// A journal this large (and larger than the snapshot) is compacted.
pub const SNAPSHOT_MIN_BYTES: u64 = 1 << 20;

/// The state a store recovered.
#[derive(Debug, Default)]
pub struct Recovered {
    pub inodes: HashMap<Ino, Inode>,
    pub extras: HashMap<Ino, Extra>,
    pub next_ino: u64,
    /// Bytes cut off the journal's tail.
    pub cut: u64,
    /// Committed batches replayed from the journal.
    pub batches: u64,
}

impl Recovered {
    fn apply(&mut self, rec: Rec) {
        match rec {
            Rec::Header(..) | Rec::Commit(_) | Rec::Base(..) => {}
            Rec::Inode(new, size, extra) => {
                let ino = new.ino;
                let mut new = *new;
                match self.inodes.remove(&ino) {
                    // Keep what the inode holds besides its attributes.
                    Some(old) if old.kind == new.kind => match (old.body, &mut new.body) {
                        (Body::File(d), Body::File(n)) => *n = d,
                        (Body::Dir(d), Body::Dir(n)) => *n = d,
                        _ => {}
                    },
                    _ => {}
                }
                if let Body::File(d) = &mut new.body {
                    d.restore_size(size);
                }
                if extra == Extra::default() {
                    self.extras.remove(&ino);
                } else {
                    self.extras.insert(ino, extra);
                }
                self.inodes.insert(ino, new);
            }
            Rec::Page(ino, idx, bytes) => {
                if let Some(Inode { body: Body::File(d), .. }) = self.inodes.get_mut(&ino) {
                    d.restore_page(idx, &bytes);
                }
            }
            Rec::Entry(dir, name, ino) => {
                if let Some(Inode { body: Body::Dir(d), .. }) = self.inodes.get_mut(&dir) {
                    match ino {
                        Some(ino) => d.insert(name, ino),
                        None => {
                            d.remove(&name);
                        }
                    }
                }
            }
            Rec::Free(ino) => {
                self.inodes.remove(&ino);
                self.extras.remove(&ino);
            }
        }
    }
}

/// Crash here when the named failpoint is armed (`LEASEFS_FAILPOINT`), to
/// test recovery from every step of a flush or compaction. Compiled out of
/// release builds.
pub fn failpoint(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("LEASEFS_FAILPOINT").is_ok_and(|v| v == name) {
        tracing::warn!(failpoint = name, "failpoint: killing the daemon");
        // SAFETY: sending SIGKILL to ourselves, as `kill -9` would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// Stall here for a while when `LEASEFS_PAUSE=NAME:MILLISECONDS` names this
/// point (debug builds only): tests widen a window (appends landing while a
/// snapshot is written) that is otherwise too short to hit.
pub fn pausepoint(name: &str) {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("LEASEFS_PAUSE")
        .ok()
        .and_then(|v| v.strip_prefix(name).and_then(|r| r.strip_prefix(':')).and_then(|ms| ms.parse().ok()))
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// An injected I/O error for a named failpoint (debug builds only).
fn injected(name: &str) -> io::Result<()> {
    #[cfg(debug_assertions)]
    if std::env::var("LEASEFS_FAILPOINT").is_ok_and(|v| v == name) {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    let _ = name;
    Ok(())
}

/// The namespace journal and snapshot of a state directory.
pub struct Store {
    storage: Box<dyn Storage>,
    generation: u64,
    journal_bytes: u64,
    snapshot_bytes: u64,
    /// When the last snapshot was written (by this daemon or before).
    pub last_snapshot: Option<SystemTime>,
    /// Set after the first I/O error, also by a group sync that failed on
    /// another thread: durability is no longer promised.
    failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Batches committed since start.
    pub flushes: u64,
    /// Compact when the journal exceeds this many bytes (and the snapshot).
    pub snapshot_min: u64,
    /// While a snapshot is written off the request path: the journal
    /// offset it covers.
    compacting: Option<u64>,
}

/// A snapshot image waiting to be written by [`write_snapshot`].
pub struct SnapshotJob {
    data: Vec<u8>,
    generation: u64,
}

/// What [`write_snapshot`] wrote.
#[derive(Debug)]
pub struct SnapshotWritten {
    generation: u64,
    bytes: u64,
}

/// Write a snapshot started by [`Store::begin_snapshot`]: temp file, sync,
/// rename, sync the directory. Runs on any thread, on a second storage
/// handle, while the store appends.
pub fn write_snapshot(storage: &mut dyn Storage, job: &SnapshotJob) -> io::Result<SnapshotWritten> {
    let r = storage
        .write_new(SNAPSHOT_TMP, &job.data)
        .and_then(|()| storage.sync(SNAPSHOT_TMP))
        .and_then(|()| {
            pausepoint("snapshot-written");
            failpoint("snapshot-written");
            storage.rename(SNAPSHOT_TMP, SNAPSHOT)
        })
        .and_then(|()| {
            failpoint("snapshot-renamed");
            storage.sync_dir()
        });
    if let Err(e) = r {
        let _ = storage.remove(SNAPSHOT_TMP);
        return Err(e);
    }
    Ok(SnapshotWritten { generation: job.generation, bytes: job.data.len() as u64 })
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("generation", &self.generation).finish_non_exhaustive()
    }
}

impl Store {
    /// Recover the namespace from `storage`. `Err` names the file and offset
    /// of corruption that is not a torn tail.
    pub fn open(mut storage: Box<dyn Storage>) -> Result<(Store, Recovered), String> {
        let io = |f: &str, e: io::Error| format!("{f}: {e}");
        let mut rec = Recovered { next_ino: 2, ..Recovered::default() };
        let mut generation = 0;
        let snapshot = storage.read(SNAPSHOT).map_err(|e| io(SNAPSHOT, e))?;
        let snapshot_bytes = snapshot.as_ref().map_or(0, |s| s.len() as u64);
        let mut written_at = None;
        let mut base = None;
        if let Some(img) = &snapshot {
            let mut header = None;
            let mut batches = Vec::new();
            match scan(img, |b| batches.push(b)) {
                Ok(Scan::Clean(_)) => {}
                Ok(Scan::Torn(off)) | Err(off) => {
                    return Err(format!("{SNAPSHOT}: corrupt record at offset {off}; refusing to start"));
                }
            }
            for b in batches {
                for r in b {
                    match r {
                        Rec::Header(g, t) => {
                            header = Some(g);
                            written_at = Some(t);
                        }
                        Rec::Base(g, offset) => base = Some((g, offset)),
                        Rec::Commit(n) => rec.next_ino = rec.next_ino.max(n),
                        r => rec.apply(r),
                    }
                }
            }
            generation = header.ok_or_else(|| format!("{SNAPSHOT}: no header; refusing to start"))?;
        }
        let journal = storage.read(JOURNAL).map_err(|e| io(JOURNAL, e))?.unwrap_or_default();
        let mut journal_gen = None;
        let mut batches = Vec::new();
        let keep = match scan(&journal, |b| batches.push(b)) {
            Ok(Scan::Clean(n)) => n,
            Ok(Scan::Torn(n)) => {
                rec.cut = journal.len() as u64 - n;
                tracing::warn!(file = JOURNAL, bytes = rec.cut, offset = n, "cutting off a torn journal tail");
                n
            }
            Err(off) => return Err(format!("{JOURNAL}: corrupt record at offset {off}; refusing to start")),
        };
        if let Some(Some(Rec::Header(g, _))) = batches.first().map(|b| b.first()) {
            journal_gen = Some(*g);
        }
        // A snapshot written while the journal went on holds the older
        // journal up to `offset`: when that journal is still the one on
        // disk (a crash before it was replaced), what follows `offset` is
        // replayed and becomes the new journal.
        let mut rebase = None;
        if let (Some(g), Some((b, offset))) = (journal_gen, base) {
            if g == b && g + 1 == generation && offset <= keep {
                let tail = journal[offset as usize..keep as usize].to_vec();
                batches.clear();
                if !matches!(scan(&tail, |b| batches.push(b)), Ok(Scan::Clean(_))) {
                    return Err(format!("{JOURNAL}: no batch boundary at offset {offset}; refusing to start"));
                }
                journal_gen = Some(generation);
                rebase = Some(tail);
            }
        }
        let fresh_journal = match journal_gen {
            Some(g) if g == generation => {
                for b in batches {
                    rec.batches += 1;
                    for r in b {
                        match r {
                            Rec::Commit(n) => rec.next_ino = rec.next_ino.max(n),
                            r => rec.apply(r),
                        }
                    }
                }
                if rec.cut > 0 && rebase.is_none() {
                    storage.truncate(JOURNAL, keep).and_then(|()| storage.sync(JOURNAL)).map_err(|e| io(JOURNAL, e))?;
                }
                false
            }
            // Folded into the snapshot before a crash: start over.
            Some(g) if g < generation => true,
            Some(g) => {
                return Err(format!(
                    "{JOURNAL}: generation {g} is newer than the snapshot's ({generation}); refusing to start"
                ))
            }
            None if keep == 0 => true,
            None => return Err(format!("{JOURNAL}: no header at offset 0; refusing to start")),
        };
        let mut store = Store {
            storage,
            generation,
            journal_bytes: keep,
            snapshot_bytes,
            last_snapshot: written_at,
            failed: Default::default(),
            flushes: 0,
            snapshot_min: SNAPSHOT_MIN_BYTES,
            compacting: None,
        };
        if fresh_journal {
            store.new_journal().map_err(|e| io(JOURNAL, e))?;
        }
        if let Some(tail) = rebase {
            store.new_journal_with(&tail).map_err(|e| io(JOURNAL, e))?;
        }
        Ok((store, rec))
    }

    /// Replace the journal with an empty one of the current generation.
    fn new_journal(&mut self) -> io::Result<()> {
        self.new_journal_with(&[])
    }

    /// Replace the journal with one of the current generation holding
    /// `batches` (whole committed batches).
    fn new_journal_with(&mut self, batches: &[u8]) -> io::Result<()> {
        let mut e = Enc::default();
        e.header(self.generation);
        e.commit(0);
        e.buf.extend_from_slice(batches);
        self.storage.write_new(JOURNAL_TMP, &e.buf)?;
        self.storage.sync(JOURNAL_TMP)?;
        self.storage.rename(JOURNAL_TMP, JOURNAL)?;
        failpoint("journal-replaced");
        self.storage.sync_dir()?;
        self.journal_bytes = e.buf.len() as u64;
        Ok(())
    }

    /// True after an I/O error: durability is no longer promised.
    pub fn failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The flag a group sync running elsewhere sets when it fails.
    pub fn fail_flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.failed.clone()
    }

    /// Bytes in the journal.
    pub fn journal_bytes(&self) -> u64 {
        self.journal_bytes
    }

    /// Bytes in the last snapshot.
    pub fn snapshot_bytes(&self) -> u64 {
        self.snapshot_bytes
    }

    /// Snapshot generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn fail(&mut self, what: &str, e: &io::Error) {
        tracing::error!("{what} failed: {e}; durability is no longer promised (fail-stop)");
        self.failed.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Append one committed batch and make it durable. `ENOSPC` leaves the
    /// journal as it was (retry later); other errors are fail-stop.
    pub fn commit(&mut self, batch: &[u8]) -> io::Result<()> {
        let sync = self.append(batch)?;
        match sync() {
            Ok(()) => {
                failpoint("journal-synced");
                Ok(())
            }
            Err(e) => {
                self.fail("journal sync", &e);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }

    /// Append one committed batch; it is durable once the returned sync has
    /// run (on any thread, while later batches are appended). `ENOSPC`
    /// leaves the journal as it was (retry later); other errors are
    /// fail-stop.
    pub fn append(&mut self, batch: &[u8]) -> io::Result<Syncer> {
        if self.failed() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let r = injected("journal-eio").and_then(|()| self.storage.append(JOURNAL, batch)).and_then(|()| {
            failpoint("journal-appended");
            self.storage.syncer(JOURNAL)
        });
        match r {
            Ok(sync) => {
                self.journal_bytes += batch.len() as u64;
                self.flushes += 1;
                Ok(sync)
            }
            Err(e) => {
                let undo = self.storage.truncate(JOURNAL, self.journal_bytes).and_then(|()| self.storage.sync(JOURNAL));
                if e.raw_os_error() == Some(libc::ENOSPC) && undo.is_ok() {
                    tracing::warn!(file = JOURNAL, "state disk full: sync refused until space returns");
                    return Err(e);
                }
                self.fail("journal write", &e);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }

    /// True when the journal should be folded into a snapshot.
    pub fn wants_snapshot(&self) -> bool {
        self.journal_bytes > self.snapshot_min.max(self.snapshot_bytes)
    }

    /// Also compact when the snapshot holds far more than is live (large
    /// files were removed): the state directory stays within about twice
    /// the live state plus the journal limit. `live` estimates the bytes a
    /// snapshot of the namespace would take now (called only when the
    /// snapshot is large).
    pub fn wants_snapshot_for(&self, live: impl FnOnce() -> u64) -> bool {
        self.wants_snapshot()
            || self.snapshot_bytes > 2 * self.snapshot_min && self.snapshot_bytes > 2 * live() + self.snapshot_min
    }

    /// True while a snapshot is being written off the request path.
    pub fn compacting(&self) -> bool {
        self.compacting.is_some()
    }

    /// A second handle on the store's files for [`write_snapshot`] on
    /// another thread (none: write snapshots with [`Store::snapshot`]).
    pub fn fork_storage(&self) -> Option<Box<dyn Storage>> {
        self.storage.fork()
    }

    /// Start a snapshot of `image` (the namespace as of the journal's
    /// current end) that [`write_snapshot`] writes while batches go on
    /// being appended; then [`Store::finish_snapshot`]. None while one is
    /// in progress or after a failure.
    pub fn begin_snapshot(&mut self, image: &[u8]) -> Option<SnapshotJob> {
        if self.failed() || self.compacting.is_some() {
            return None;
        }
        let generation = self.generation + 1;
        let mut e = Enc::default();
        e.header(generation);
        // Recovery replays what the journal gained after this offset when
        // the journal was not replaced yet.
        e.base(self.generation, self.journal_bytes);
        let mut data = e.buf;
        data.extend_from_slice(image);
        self.compacting = Some(self.journal_bytes);
        Some(SnapshotJob { data, generation })
    }

    /// The snapshot started by [`Store::begin_snapshot`] will not be
    /// written after all (its thread could not start).
    pub fn abandon_snapshot(&mut self) {
        self.compacting = None;
    }

    /// The snapshot started by [`Store::begin_snapshot`] was written (or
    /// not): start the journal of its generation with the batches appended
    /// since. A full disk postpones the compaction; other errors are
    /// fail-stop.
    pub fn finish_snapshot(&mut self, written: io::Result<SnapshotWritten>) -> io::Result<()> {
        let Some(offset) = self.compacting.take() else {
            return Ok(());
        };
        let w = match written {
            Ok(w) => w,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                tracing::warn!(file = SNAPSHOT, "state disk full: snapshot postponed");
                return Err(e);
            }
            Err(e) => {
                self.fail("snapshot", &e);
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        };
        if self.failed() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let tail = match self.storage.read_range(JOURNAL, offset, self.journal_bytes) {
            Ok(t) => t,
            Err(e) => {
                self.fail("reading the journal", &e);
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        };
        self.generation = w.generation;
        self.snapshot_bytes = w.bytes;
        self.last_snapshot = Some(SystemTime::now());
        if let Err(e) = self.new_journal_with(&tail) {
            // The snapshot and the old journal still recover everything
            // (its base offset); appending to the old one now would not.
            self.fail("starting a new journal", &e);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    /// Write `image` (every record of the namespace, ending with a commit)
    /// as the snapshot of the next generation, then start a new journal.
    pub fn snapshot(&mut self, image: &[u8]) -> io::Result<()> {
        if self.failed() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let generation = self.generation + 1;
        let mut e = Enc::default();
        e.header(generation);
        let mut data = e.buf;
        data.extend_from_slice(image);
        let r = self
            .storage
            .write_new(SNAPSHOT_TMP, &data)
            .and_then(|()| self.storage.sync(SNAPSHOT_TMP))
            .and_then(|()| {
                failpoint("snapshot-written");
                self.storage.rename(SNAPSHOT_TMP, SNAPSHOT)
            })
            .and_then(|()| {
                failpoint("snapshot-renamed");
                self.storage.sync_dir()
            });
        if let Err(e) = r {
            let _ = self.storage.remove(SNAPSHOT_TMP);
            if e.raw_os_error() == Some(libc::ENOSPC) {
                tracing::warn!(file = SNAPSHOT, "state disk full: snapshot postponed");
                return Err(e);
            }
            self.fail("snapshot", &e);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.generation = generation;
        self.snapshot_bytes = data.len() as u64;
        self.last_snapshot = Some(SystemTime::now());
        if let Err(e) = self.new_journal() {
            // The snapshot holds everything; the stale journal is ignored
            // on recovery (older generation). Appending to it now would not
            // be, so stop promising.
            self.fail("starting a new journal", &e);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

/// Encode what changed in `ns` since the last flush as one batch.
pub fn encode_changes(ns: &Namespace, extra: impl Fn(Ino) -> Extra) -> Vec<u8> {
    let mut e = Enc::default();
    let (dirty, freed) = ns.dirty();
    let mut entries = Vec::new();
    for &ino in dirty {
        let Ok(i) = ns.get(ino) else { continue };
        e.inode(i, &extra(ino));
        match &i.body {
            Body::File(d) => {
                for idx in d.dirty_pages() {
                    e.page(ino, idx, d.page(idx));
                }
            }
            Body::Dir(d) => {
                for name in d.dirty_names() {
                    entries.push((ino, name.as_bytes(), d.get(name)));
                }
            }
            _ => {}
        }
    }
    for (dir, name, ino) in entries {
        e.entry(dir, name, ino);
    }
    for &ino in freed {
        e.free(ino);
    }
    e.commit(ns.next_ino());
    e.buf
}

/// Encode the whole namespace (for a snapshot).
pub fn encode_all(ns: &Namespace, extra: impl Fn(Ino) -> Extra) -> Vec<u8> {
    let mut e = Enc::default();
    let mut entries = Vec::new();
    for i in ns.inodes() {
        e.inode(i, &extra(i.ino));
        match &i.body {
            Body::File(d) => {
                for idx in d.page_indices() {
                    e.page(i.ino, idx, d.page(idx));
                }
            }
            Body::Dir(d) => entries.extend(d.iter().map(|(n, c)| (i.ino, n.as_bytes(), c))),
            _ => {}
        }
    }
    for (dir, name, ino) in entries {
        e.entry(dir, name, Some(ino));
    }
    e.commit(ns.next_ino());
    e.buf
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
