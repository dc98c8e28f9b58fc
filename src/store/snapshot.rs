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
//! **Compaction.** When what the journal superseded (rewritten pages and
//! inodes, removed content: [`Store::wants_snapshot`]) outweighs what is
//! live, and at clean unmount, the whole namespace is written as a new
//! snapshot of the next generation and a new journal starts. There are two journal files
//! ([`JOURNALS`]), each starting with the generation it belongs to; which
//! one is current is decided by that header, never by the name. While the
//! mount serves, the snapshot is written by another thread
//! ([`write_snapshot`]) while batches go on being appended to the current
//! journal; the snapshot records that journal's generation and the offset
//! it covers. Once the snapshot is durable, the same thread starts the new
//! journal in the other file (whose content the new snapshot made
//! obsolete) and makes it durable; [`Store::finish_snapshot`], under the
//! state lock, only switches appends to it: no disk sync ever happens
//! there. Recovery replays the old journal from the recorded offset, then
//! the new journal. A crash at any step leaves the old snapshot with its
//! journal, or the new snapshot with the old journal's tail (and the new
//! journal if it was created).
//!
//! **Failure.** A full disk makes a flush fail with `ENOSPC` (the partial
//! batch is cut away, the changes stay pending, and the next sync retries);
//! any other I/O error stops durability for good (fail-stop): every later
//! sync fails with `EIO` instead of pretending.
//!
//! The record codec is in [`crate::store::records`].

use std::io;
use std::time::SystemTime;

use crate::namespace::{Body, InoMap, InoSet, Inode, Kind};
use crate::store::storage::{Storage, Syncer};

pub use super::encode::*;
use super::records::{scan, scan_each, Rec, Scan};
pub use super::records::{Enc, Extra};
use crate::failpoints::{failpoint, injected, pausepoint};

/// The first journal file in the state directory (generation 0 starts there).
pub const JOURNAL: &str = "namespace.journal";
/// The two journal files: compaction starts the new journal in the one
/// that is not current.
pub const JOURNALS: [&str; 2] = [JOURNAL, "namespace.journal.2"];
/// The snapshot file in the state directory.
pub const SNAPSHOT: &str = "namespace.snapshot";
const SNAPSHOT_TMP: &str = "namespace.snapshot.tmp";

/// The journal file that is not `name`.
fn other_journal(name: &str) -> &'static str {
    if name == JOURNALS[0] {
        JOURNALS[1]
    } else {
        JOURNALS[0]
    }
}

/// A journal is compacted only past this size (and when its garbage
/// outweighs the live state, see [`Store::wants_snapshot`]).
pub const SNAPSHOT_MIN_BYTES: u64 = 1 << 20;

/// Zeros written (and synced with the batch) past the end of the journal
/// after a small batch, for the small batches after it to overwrite in
/// place: an `fdatasync` of data written within the file's size is one
/// write of the data, while one that grew the file also commits the
/// filesystem's journal (about 140 against 330 µs on ext4 here). Large
/// batches (content) are appended as they are, without zeros.
pub const ZERO_AHEAD: u64 = 512 << 10;

/// The state a store recovered.
#[derive(Debug, Default)]
pub struct Recovered {
    pub inodes: InoMap<Box<Inode>>,
    /// Which of them are directories (see [`Namespace::restore`](crate::namespace::Namespace::restore)).
    pub dirs: InoSet,
    pub extras: InoMap<Extra>,
    pub next_ino: u64,
    /// Bytes of a torn tail cut off the journal (zeros past its end are
    /// unused space, not counted).
    pub cut: u64,
    /// Committed batches replayed from the journal.
    pub batches: u64,
}

impl Recovered {
    /// Replay committed journal batches.
    fn replay(&mut self, batches: Vec<Vec<Rec>>) {
        for b in batches {
            self.batches += 1;
            for r in b {
                match r {
                    Rec::Commit(n) => self.next_ino = self.next_ino.max(n),
                    r => self.apply(r),
                }
            }
        }
    }

    fn apply(&mut self, rec: Rec) {
        match rec {
            Rec::Header(..) | Rec::Commit(_) | Rec::Base(..) => {}
            Rec::Inode(new, size, extra) => {
                let ino = new.ino;
                let mut new = new;
                // Almost always absent (one inode record per inode).
                match self.inodes.remove(&ino) {
                    // Keep what the inode holds besides its attributes.
                    Some(old) if old.kind == new.kind => match (*old, &mut new.body) {
                        (Inode { body: Body::File(d), .. }, Body::File(n)) => *n = d,
                        (Inode { body: Body::Dir(d), .. }, Body::Dir(n)) => *n = d,
                        _ => {}
                    },
                    // A directory first seen: room for the entries it had
                    // (capped: it is a hint, and entries may follow or not).
                    _ => {
                        if let Body::Dir(d) = &mut new.body {
                            d.reserve(size.min(1 << 24) as usize);
                        }
                    }
                }
                if let Body::File(d) = &mut new.body {
                    d.restore_size(size);
                }
                if new.kind == Kind::Dir {
                    self.dirs.insert(ino);
                }
                if extra == Extra::default() {
                    self.extras.remove(&ino);
                } else {
                    self.extras.insert(ino, extra);
                }
                self.inodes.insert(ino, new);
            }
            Rec::Page(ino, idx, bytes) => {
                if let Some(Inode { body: Body::File(d), .. }) = self.inodes.get_mut(&ino).map(|i| &mut **i) {
                    d.restore_page(idx, (!bytes.is_empty()).then_some(&bytes[..]));
                }
            }
            Rec::Entry(dir, name, ino) => {
                if let Some(Inode { body: Body::Dir(d), .. }) = self.inodes.get_mut(&dir).map(|i| &mut **i) {
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
                self.dirs.remove(&ino);
                self.extras.remove(&ino);
            }
        }
    }
}

/// The namespace journal and snapshot of a state directory.
pub struct Store {
    storage: Box<dyn Storage>,
    /// The snapshot's generation.
    generation: u64,
    /// The journal batches are appended to, and its generation (the
    /// snapshot's, except after a new journal could not be started).
    journal: &'static str,
    journal_gen: u64,
    /// Where the next batch goes: the journal's records end here.
    journal_bytes: u64,
    /// The journal file's size: past `journal_bytes` it holds zeros written
    /// ahead (see [`ZERO_AHEAD`]).
    journal_end: u64,
    snapshot_bytes: u64,
    /// Bytes in the other journal file: the journal a background snapshot
    /// continues from (recovery replays its tail), kept until the next
    /// snapshot starts its journal there. It counts towards the state
    /// directory's bound like the rest.
    other_bytes: u64,
    /// When the last snapshot was written (by this daemon or before).
    pub last_snapshot: Option<SystemTime>,
    /// Set after the first I/O error, also by a group sync that failed on
    /// another thread: durability is no longer promised.
    failed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Batches committed since start.
    pub flushes: u64,
    /// Compact only when the journal and its garbage exceed this many bytes.
    pub snapshot_min: u64,
    /// An estimate of the bytes of the snapshot and the current journal
    /// that later records superseded (rewritten pages and inodes, removed
    /// files): what a compaction would reclaim. Data appended once (a
    /// large file written and left alone) is not garbage, so it is written
    /// to the state directory once, not again into a snapshot soon after.
    garbage: u64,
    /// A snapshot is being written off the request path.
    compacting: bool,
    /// Recovery replayed batches of an older journal the snapshot
    /// continues from (a new snapshot would make them unnecessary).
    replayed_older: bool,
}

/// A snapshot image waiting to be written by [`write_snapshot`].
pub struct SnapshotJob {
    /// The image, in pieces written one after the other.
    data: Vec<Vec<u8>>,
    generation: u64,
    /// The journal file to start once the snapshot is durable.
    journal: &'static str,
    /// The journal the snapshot continues from: synced before the
    /// snapshot is installed, because an image encoded a slice at a time
    /// ([`Slices`]) holds changes of batches appended while it was encoded.
    continues: &'static str,
}

/// What [`write_snapshot`] wrote: the snapshot, and the new journal (its
/// size) unless starting it failed.
#[derive(Debug)]
pub struct SnapshotWritten {
    generation: u64,
    bytes: u64,
    journal: io::Result<u64>,
}

/// Write a snapshot started by [`Store::begin_snapshot`]: temp file, sync,
/// rename, sync the directory; then start the new journal in the other
/// journal file and make it durable. Runs on any thread, on a second
/// storage handle, while the store appends to the current journal. `Err`:
/// the snapshot was not installed.
pub fn write_snapshot(storage: &mut dyn Storage, job: &SnapshotJob) -> io::Result<SnapshotWritten> {
    let r = storage
        .sync(job.continues)
        .and_then(|()| storage.write_new(SNAPSHOT_TMP, job.data.first().map_or(&[][..], |p| &p[..])))
        .and_then(|()| job.data.iter().skip(1).try_for_each(|p| storage.append(SNAPSHOT_TMP, p)))
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
    let journal = start_journal(storage, job.journal, job.generation);
    let bytes = job.data.iter().map(|p| p.len() as u64).sum();
    Ok(SnapshotWritten { generation: job.generation, bytes, journal })
}

/// Remove the durable namespace from `storage` (`--volatile`): the journals
/// first, so that no crash between the steps leaves a journal newer than
/// what remains.
pub fn discard(storage: &mut dyn Storage) -> io::Result<()> {
    for f in JOURNALS {
        storage.remove(f)?;
    }
    storage.sync_dir()?;
    storage.remove(SNAPSHOT_TMP)?;
    storage.remove(SNAPSHOT)?;
    storage.sync_dir()
}

/// Start an empty journal of `generation` in the file `name` (replacing
/// what it held) and make it durable; its size.
fn start_journal(storage: &mut dyn Storage, name: &str, generation: u64) -> io::Result<u64> {
    let mut e = Enc::default();
    e.header(generation);
    e.commit(0);
    storage.write_new(name, &e.buf)?;
    storage.sync(name)?;
    failpoint("journal-replaced");
    storage.sync_dir()?;
    Ok(e.buf.len() as u64)
}

/// One journal file as found at start-up.
struct Found {
    name: &'static str,
    data: Vec<u8>,
    generation: Option<u64>,
    batches: Vec<Vec<Rec>>,
    /// Length of the clean part (a torn tail is cut).
    keep: u64,
    /// Corruption before the tail: refuses start-up if the file is needed.
    corrupt: Option<String>,
}

/// Read and check one journal file.
fn read_journal(storage: &mut dyn Storage, name: &'static str) -> Result<Option<Found>, String> {
    let Some(data) = storage.read(name).map_err(|e| format!("{name}: {e}"))? else {
        return Ok(None);
    };
    let mut batches = Vec::new();
    let (keep, mut corrupt) = match scan(&data, |b| batches.push(b)) {
        Ok(Scan::Clean(n)) | Ok(Scan::Torn(n)) => (n, None),
        Err(off) => (0, Some(format!("{name}: corrupt record at offset {off}; refusing to start"))),
    };
    let generation = match batches.first().map(|b| b.first()) {
        Some(Some(Rec::Header(g, _))) => Some(*g),
        _ if data.is_empty() || keep == 0 && corrupt.is_none() => None,
        _ => {
            corrupt.get_or_insert_with(|| format!("{name}: no header at offset 0; refusing to start"));
            None
        }
    };
    Ok(Some(Found { name, data, generation, batches, keep, corrupt }))
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("generation", &self.generation).finish_non_exhaustive()
    }
}

/// What the snapshot says of itself, its contents applied to a recovery.
struct SnapshotHead {
    /// Its generation (0: no snapshot).
    generation: u64,
    bytes: u64,
    written_at: Option<SystemTime>,
    /// The older journal it continues from, and from which offset.
    base: Option<(u64, u64)>,
}

/// Apply the snapshot, if there is one, to `rec`: whole or refused (a
/// corrupt record or a missing header stops start-up).
fn read_snapshot(storage: &mut dyn Storage, rec: &mut Recovered) -> Result<SnapshotHead, String> {
    let mut generation = 0;
    let snapshot = storage.read(SNAPSHOT).map_err(|e| format!("{SNAPSHOT}: {e}"))?;
    let bytes = snapshot.as_ref().map_or(0, |s| s.len() as u64);
    let mut written_at = None;
    let mut base = None;
    if let Some(img) = &snapshot {
        let mut header = None;
        // Applied as decoded: a snapshot is whole or refused.
        let scanned = scan_each(img, |r| match r {
            Rec::Header(g, t) => {
                header = Some(g);
                written_at = Some(t);
            }
            Rec::Base(g, offset) => base = Some((g, offset)),
            Rec::Commit(n) => rec.next_ino = rec.next_ino.max(n),
            r => rec.apply(r),
        });
        match scanned {
            Ok(Scan::Clean(_)) => {}
            Ok(Scan::Torn(off)) | Err(off) => {
                return Err(format!("{SNAPSHOT}: corrupt record at offset {off}; refusing to start"));
            }
        }
        generation = header.ok_or_else(|| format!("{SNAPSHOT}: no header; refusing to start"))?;
    }
    Ok(SnapshotHead { generation, bytes, written_at, base })
}

impl Store {
    /// Recover the namespace from `storage`. `Err` names the file and offset
    /// of corruption that is not a torn tail.
    pub fn open(mut storage: Box<dyn Storage>) -> Result<(Store, Recovered), String> {
        let io = |f: &str, e: io::Error| format!("{f}: {e}");
        let mut rec = Recovered { next_ino: 2, ..Recovered::default() };
        let SnapshotHead { generation, bytes: snapshot_bytes, written_at, base } =
            read_snapshot(&mut *storage, &mut rec)?;
        let mut found = Vec::new();
        for name in JOURNALS {
            if let Some(f) = read_journal(&mut *storage, name)? {
                if let Some(g) = f.generation.filter(|&g| g > generation) {
                    return Err(format!(
                        "{}: generation {g} is newer than the snapshot's ({generation}); refusing to start",
                        f.name
                    ));
                }
                found.push(f);
            }
        }
        // The snapshot's own journal, and the older one it continues from
        // `offset` (batches appended while the snapshot was written, or
        // after its new journal could not be started).
        let current = found.iter().position(|f| f.generation == Some(generation));
        let older = base.and_then(|(b, offset)| {
            let i = found.iter().position(|f| b < generation && f.generation == Some(b))?;
            Some((i, offset))
        });
        // A damaged journal that is needed stops start-up; so does one
        // whose generation cannot be read (it might be needed).
        for (i, f) in found.iter().enumerate() {
            if let Some(e) = &f.corrupt {
                if Some(i) == current || older.is_some_and(|(o, _)| o == i) || f.generation.is_none() {
                    return Err(e.clone());
                }
            }
        }
        let mut replayed_older = false;
        if let Some((i, offset)) = older {
            let f = &found[i];
            if offset <= f.keep {
                let mut batches = Vec::new();
                if !matches!(scan(&f.data[offset as usize..f.keep as usize], |b| batches.push(b)), Ok(Scan::Clean(_))) {
                    return Err(format!("{}: no batch boundary at offset {offset}; refusing to start", f.name));
                }
                replayed_older = !batches.is_empty();
                rec.replay(batches);
            }
            if f.data[f.keep as usize..].iter().any(|&b| b != 0) {
                tracing::warn!(file = f.name, bytes = f.data.len() as u64 - f.keep, "ignoring a torn journal tail");
            }
        }
        let mut journal = None;
        if let Some(i) = current {
            let f = &mut found[i];
            let tail = f.data.len() as u64 - f.keep;
            // Zeros written ahead (or left by a crash before anything went
            // past them) are unused space, not a torn tail.
            let unused = f.data[f.keep as usize..].iter().all(|&b| b == 0);
            rec.cut = if unused { 0 } else { tail };
            rec.replay(std::mem::take(&mut f.batches));
            if rec.cut > 0 {
                tracing::warn!(file = f.name, bytes = rec.cut, offset = f.keep, "cutting off a torn journal tail");
            }
            if tail > 0 {
                storage.truncate(f.name, f.keep).and_then(|()| storage.sync(f.name)).map_err(|e| io(f.name, e))?;
            }
            journal = Some((f.name, f.keep));
        }
        // Without a journal of its own, the snapshot gets a new one in a
        // file the older journal it continues from does not use.
        let (journal, keep) = match journal {
            Some(j) => j,
            None => {
                let name = older.map_or(JOURNAL, |(i, _)| other_journal(found[i].name));
                (name, start_journal(&mut *storage, name, generation).map_err(|e| io(name, e))?)
            }
        };
        let other_bytes = found.iter().find(|f| f.name == other_journal(journal)).map_or(0, |f| f.keep);
        let store = Store {
            storage,
            generation,
            journal,
            journal_gen: generation,
            journal_bytes: keep,
            journal_end: keep,
            snapshot_bytes,
            other_bytes,
            last_snapshot: written_at,
            failed: Default::default(),
            flushes: 0,
            snapshot_min: SNAPSHOT_MIN_BYTES,
            // What the journal found at start-up replaced is unknown: all
            // of it counts, as if every record superseded one.
            garbage: keep,
            compacting: false,
            replayed_older,
        };
        Ok((store, rec))
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

    /// Bytes of the namespace in the state directory: the snapshot, the
    /// journal and the other journal file (see [`Store::other_bytes`]);
    /// besides, each journal file may end in up to [`ZERO_AHEAD`] zeros.
    pub fn disk_bytes(&self) -> u64 {
        self.snapshot_bytes + self.journal_bytes + self.other_bytes
    }

    /// Bytes in the journal file appends do not go to: the one the last
    /// background snapshot continues from, which only the next snapshot
    /// replaces (0 after a snapshot written in line, which removes it).
    pub fn other_bytes(&self) -> u64 {
        self.other_bytes
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
        self.append_fresh(batch, 0)
    }

    /// [`Store::append`] of a batch of which `fresh` bytes are new content
    /// (pages that did not exist before): the rest supersedes records
    /// already stored, and counts as garbage once appended.
    pub fn append_fresh(&mut self, batch: &[u8], fresh: u64) -> io::Result<Syncer> {
        if self.failed() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let (journal, at, end) = (self.journal, self.journal_bytes, self.journal_bytes + batch.len() as u64);
        // A small batch past the zeros written ahead brings more with it
        // (unless the disk has no room for them: they are only an aid).
        let mut ahead = end > self.journal_end && batch.len() as u64 <= ZERO_AHEAD / 4;
        let r = injected("journal-eio").and_then(|()| self.storage.write_at(journal, at, batch)).and_then(|()| {
            if ahead {
                if let Err(e) = self.storage.write_zeros(journal, end, ZERO_AHEAD as usize) {
                    if e.raw_os_error() != Some(libc::ENOSPC) {
                        return Err(e);
                    }
                    ahead = false;
                    self.storage.truncate(journal, end)?;
                }
            }
            failpoint("journal-appended");
            self.storage.syncer(journal)
        });
        match r {
            Ok(sync) => {
                self.journal_bytes = end;
                self.journal_end = self.journal_end.max(end + if ahead { ZERO_AHEAD } else { 0 });
                self.garbage += (batch.len() as u64).saturating_sub(fresh);
                self.flushes += 1;
                Ok(sync)
            }
            Err(e) => {
                self.journal_end = self.journal_bytes;
                let undo = self.storage.truncate(journal, self.journal_bytes).and_then(|()| self.storage.sync(journal));
                if e.raw_os_error() == Some(libc::ENOSPC) && undo.is_ok() {
                    tracing::warn!(file = journal, "state disk full: sync refused until space returns");
                    return Err(e);
                }
                self.fail("journal write", &e);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }

    /// Content removed since the last snapshot (freed pages): its records
    /// are garbage.
    pub fn note_removed(&mut self, bytes: u64) {
        self.garbage = self.garbage.saturating_add(bytes);
    }

    /// The estimate of superseded bytes (see the field).
    pub fn garbage(&self) -> u64 {
        self.garbage
    }

    /// True when the journal should be folded into a snapshot: it has
    /// grown past the minimum and what is superseded outweighs what is
    /// live (so a compaction writes at most about as much as it reclaims,
    /// and the snapshot plus journal stay within about twice the live
    /// state plus the minimum).
    pub fn wants_snapshot(&self) -> bool {
        let stored = self.journal_bytes + self.snapshot_bytes;
        let live = stored.saturating_sub(self.garbage);
        self.journal_bytes > self.snapshot_min && self.garbage > self.snapshot_min.max(live)
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
        self.compacting
    }

    /// A second handle on the store's files for [`write_snapshot`] on
    /// another thread (none: write snapshots with `Store::snapshot`).
    pub fn fork_storage(&self) -> Option<Box<dyn Storage>> {
        self.storage.fork()
    }

    /// Start a snapshot written off the request path: returns the start of
    /// its image (the head of [`Store::head`] and where in the journal
    /// recovery continues from it); encode the namespace after it a slice
    /// at a time with [`Slices`], while batches go on being appended, then hand it to [`Store::snapshot_job`] and
    /// [`write_snapshot`], then [`Store::finish_snapshot`]. None while one
    /// is in progress or after a failure.
    pub fn begin_snapshot(&mut self) -> Option<Enc> {
        if self.failed() || self.compacting {
            return None;
        }
        self.compacting = true;
        let mut e = self.head();
        // Recovery replays what the journal gains after this offset.
        e.base(self.journal_gen, self.journal_bytes);
        Some(e)
    }

    /// The image of the snapshot [`Store::begin_snapshot`] started (in
    /// pieces), ready for [`write_snapshot`].
    pub fn snapshot_job(&self, data: Vec<Vec<u8>>) -> SnapshotJob {
        SnapshotJob {
            data,
            generation: self.generation + 1,
            journal: other_journal(self.journal),
            continues: self.journal,
        }
    }

    /// The snapshot started by [`Store::begin_snapshot`] will not be
    /// written after all (its thread could not start).
    pub fn abandon_snapshot(&mut self) {
        self.compacting = false;
    }

    /// The snapshot started by [`Store::begin_snapshot`] was written (or
    /// not): start the journal of its generation with the batches appended
    /// since. A full disk postpones the compaction; other errors are
    /// fail-stop.
    pub fn finish_snapshot(&mut self, written: io::Result<SnapshotWritten>) -> io::Result<()> {
        if !std::mem::take(&mut self.compacting) {
            return Ok(());
        }
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
        self.generation = w.generation;
        self.replayed_older = false;
        self.snapshot_bytes = w.bytes;
        // The snapshot holds what was live when it began; what the old
        // journal gained since is counted by `other_bytes`.
        self.garbage = 0;
        self.last_snapshot = Some(SystemTime::now());
        match w.journal {
            Ok(bytes) => {
                // The new journal is durable: appends go there from now on.
                // The old one stays until the next snapshot: recovery
                // replays what was appended to it while this one was written.
                self.other_bytes = self.journal_bytes;
                self.journal = other_journal(self.journal);
                self.journal_gen = w.generation;
                (self.journal_bytes, self.journal_end) = (bytes, bytes);
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                // The snapshot continues from the current journal, which
                // goes on; the next compaction tries again.
                tracing::warn!(file = other_journal(self.journal), "state disk full: new journal postponed");
                Err(e)
            }
            Err(e) => {
                self.fail("starting a new journal", &e);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }

    /// The start of a snapshot image: the header of the next generation;
    /// encode the namespace after it ([`encode_streamed`]).
    pub fn head(&self) -> Enc {
        let mut e = Enc::default();
        e.header(self.generation + 1);
        e
    }

    /// True when the state directory holds something a new snapshot would
    /// fold in: batches in the journal, or an older journal's that
    /// recovery replayed.
    pub fn changed_since_snapshot(&self) -> bool {
        let mut empty = Enc::default();
        empty.header(0);
        empty.commit(0);
        self.replayed_older || self.journal_bytes != empty.buf.len() as u64 || self.journal_gen != self.generation
    }

    /// [`Store::snapshot_streamed`] of an image in one buffer (tests).
    #[cfg(test)]
    pub fn snapshot(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.snapshot_streamed(|out| {
            out(&data)?;
            Ok(data.len() as u64)
        })
    }

    /// Write an image (begun with [`Store::head`], then every record of the
    /// namespace, ending with a commit) as the snapshot of the next
    /// generation, then start a new journal. `write` hands the image to its
    /// argument a piece at a time ([`encode_streamed`]) and returns its size.
    pub fn snapshot_streamed(
        &mut self,
        write: impl FnOnce(&mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<u64>,
    ) -> io::Result<()> {
        if self.failed() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let generation = self.generation + 1;
        let storage = &mut *self.storage;
        let mut bytes = 0;
        let r = storage
            .write_new(SNAPSHOT_TMP, &[])
            .and_then(|()| write(&mut |piece| storage.append(SNAPSHOT_TMP, piece)))
            .and_then(|n| {
                bytes = n;
                storage.sync(SNAPSHOT_TMP)
            })
            .and_then(|()| {
                failpoint("snapshot-written");
                storage.rename(SNAPSHOT_TMP, SNAPSHOT)
            })
            .and_then(|()| {
                failpoint("snapshot-renamed");
                storage.sync_dir()
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
        self.replayed_older = false;
        self.snapshot_bytes = bytes;
        self.garbage = 0;
        self.last_snapshot = Some(SystemTime::now());
        let journal = other_journal(self.journal);
        match start_journal(&mut *self.storage, journal, generation) {
            Ok(bytes) => {
                let old = std::mem::replace(&mut self.journal, journal);
                (self.journal_gen, self.journal_bytes, self.journal_end) = (generation, bytes, bytes);
                // The snapshot names no older journal: the old one is
                // obsolete (a crash that keeps it keeps an ignored file).
                self.other_bytes = match self.storage.remove(old) {
                    Ok(()) => 0,
                    Err(e) => {
                        tracing::warn!(file = old, "cannot remove the obsolete journal: {e}");
                        self.storage.len(old)
                    }
                };
                Ok(())
            }
            Err(e) => {
                // The snapshot holds everything and names no older journal:
                // appending to the current one would not be recovered.
                self.fail("starting a new journal", &e);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
        }
    }
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
