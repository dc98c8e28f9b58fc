//! Durable epochs: a checksummed append-only journal of epoch reservations
//! in the state directory.
//!
//! Safety argument (SPEC 5, "epochs never repeat or go backwards, across
//! `kill -9`"): the journal holds one mount-wide **ceiling**. Before the
//! daemon lets any process see an epoch `e` for any path, the journal
//! durably holds a ceiling `c >= e` (`write` + `fdatasync` returned). On
//! start-up every path, present or not, resumes at the recovered ceiling, so
//! the next grant is strictly above anything handed out before the crash (it
//! may jump forward by up to the stride in use). A single ceiling is what
//! keeps the state bounded by what is live (SPEC 5): a path that was removed
//! needs no record of its own, and a new name costs no sync of its own as
//! long as the ceiling covers it.
//!
//! The ceiling runs ahead by [`RESERVE_AHEAD`], so only one grant in that
//! many pays for a sync; a ceiling used up within a second gets twice the
//! stride next time (up to [`MAX_STRIDE`]), and the daemon extends it in the
//! background when it is half used, so a hot lease rarely waits for the disk.
//! When the journal outgrows [`COMPACT_AT`] it is replaced by a single
//! record (temp file, sync, rename, directory sync): a crash at any point
//! leaves the old or the new journal, each with a ceiling at or above every
//! epoch handed out.
//!
//! Format: one record per line, `<crc32 hex> <epoch> <path hex>\n`; the
//! ceiling is written with an empty path. Records of earlier versions name a
//! path; recovery folds every record into the ceiling, which is never lower
//! than what any of them promised. A torn or corrupt *last* record (a crash
//! mid-append) is cut off with a warning; corruption before the tail stops
//! start-up with the file and offset, since serving wrong epochs is worse than
//! not serving.
//!
//! The journal lives behind the [`Storage`] trait, so unit tests check the
//! image a crash would leave at every write and sync. The namespace,
//! contents, xattrs, TTLs and guards are kept by [`crate::store::snapshot`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::store::storage::{DirStorage, Storage};

/// How far a reservation runs ahead of the epoch that needed it.
pub const RESERVE_AHEAD: u64 = 1024;

/// The largest stride a hot path's reservation grows to.
pub const MAX_STRIDE: u64 = 1 << 20;

/// Name of the journal in the state directory.
pub const JOURNAL: &str = "epochs.journal";
/// The compacted journal before it replaces [`JOURNAL`].
pub const JOURNAL_TMP: &str = "epochs.journal.tmp";
/// Journal size past which it is rewritten as one record.
pub const COMPACT_AT: u64 = 64 * 1024;

use super::records::crc32;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

fn record(path: &Path, epoch: u64) -> String {
    let body = format!("{epoch} {}", hex(path.as_os_str().as_encoded_bytes()));
    format!("{:08x} {body}\n", crc32(body.as_bytes()))
}

fn parse(line: &str) -> Option<(PathBuf, u64)> {
    let (crc, body) = line.split_once(' ')?;
    if u32::from_str_radix(crc, 16).ok()? != crc32(body.as_bytes()) {
        return None;
    }
    let (epoch, path) = body.split_once(' ')?;
    let bytes = unhex(path)?;
    let path = {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(bytes))
    };
    Some((path, epoch.parse().ok()?))
}

/// What recovery found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The highest epoch any record reserved: every path resumes above it.
    pub ceiling: u64,
    /// Whole records read.
    pub records: u64,
    /// Bytes of a torn tail that were cut off.
    pub cut: u64,
}

/// Read a journal image: every complete, valid record; a bad last record is
/// a torn tail, a bad earlier record is corruption (`Err(offset)`).
pub fn recover(image: &[u8]) -> Result<Recovered, u64> {
    let mut out = Recovered::default();
    let mut offset = 0usize;
    while offset < image.len() {
        let rest = &image[offset..];
        let (line, next) = match rest.iter().position(|b| *b == b'\n') {
            Some(n) => (&rest[..n], offset + n + 1),
            None => {
                out.cut = rest.len() as u64;
                break;
            }
        };
        match std::str::from_utf8(line).ok().and_then(parse) {
            Some((_, e)) => {
                out.ceiling = out.ceiling.max(e);
                out.records += 1;
            }
            None if next == image.len() => {
                out.cut = (image.len() - offset) as u64;
                break;
            }
            None => return Err(offset as u64),
        }
        offset = next;
    }
    Ok(out)
}

/// The journal file of a state directory, locked against a second daemon.
/// The ceiling is raised on the caller's thread when a grant needs it, and
/// ahead of need by a background thread (so a hot lease rarely waits for a
/// sync).
pub struct EpochJournal {
    inner: std::sync::Arc<parking_lot::Mutex<Journal>>,
    path: PathBuf,
    /// The durable ceiling and the counters, readable without waiting for a
    /// sync in progress (`status` reads them under the state lock).
    shown: std::sync::Arc<Shown>,
    /// The highest ceiling asked of the background thread.
    asked: u64,
    ahead: Option<std::sync::mpsc::Sender<u64>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for EpochJournal {
    /// Stop the reservation thread, so the directory lock is released when
    /// the journal is dropped.
    fn drop(&mut self) {
        self.ahead.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for EpochJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochJournal").field("path", &self.path).finish_non_exhaustive()
    }
}

struct Journal {
    storage: Box<dyn Storage>,
    /// Bytes of whole records in the journal.
    len: u64,
    path: PathBuf,
    _lock: Option<File>,
    /// The durable ceiling: every epoch up to it may be handed out.
    ceiling: u64,
    /// The same and the counters below, published after each sync.
    shown: std::sync::Arc<Shown>,
    /// Set after the first I/O error: durability is no longer promised.
    failed: bool,
    /// Records committed since start.
    commits: u64,
    /// Compactions since start.
    compactions: u64,
    /// Journal size past which it is compacted.
    compact_at: u64,
    /// When the ceiling was last raised, and with which stride.
    stride: Option<(std::time::Instant, u64)>,
}

/// What the journal publishes for readers that must not wait for its lock.
#[derive(Default)]
struct Shown {
    ceiling: std::sync::atomic::AtomicU64,
    len: std::sync::atomic::AtomicU64,
    commits: std::sync::atomic::AtomicU64,
    compactions: std::sync::atomic::AtomicU64,
}

impl EpochJournal {
    /// Open (creating) the state directory, take its lock, and recover.
    pub fn open(dir: &Path) -> Result<(EpochJournal, Recovered), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?;
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(format!("{}: state directory in use by another leasefs daemon", dir.display()));
        }
        EpochJournal::open_on(Box::new(DirStorage::new(dir)), Some(lock), &dir.join(JOURNAL))
    }

    /// Recover the journal kept in `storage` (named `path` in messages) and
    /// start the reservation thread. `lock` is held for the journal's life.
    pub fn open_on(
        mut storage: Box<dyn Storage>,
        lock: Option<File>,
        path: &Path,
    ) -> Result<(EpochJournal, Recovered), String> {
        let path = path.to_path_buf();
        let err = |e: io::Error| format!("{}: {e}", path.display());
        // A compaction that did not reach its rename left the old journal
        // whole; its temp file is garbage.
        storage.remove(JOURNAL_TMP).map_err(err)?;
        let image = storage.read(JOURNAL).map_err(err)?;
        let fresh = image.is_none();
        let image = image.unwrap_or_default();
        let rec = recover(&image).map_err(|off| {
            format!("{}: corrupt record at offset {off}; refusing to serve possibly wrong epochs", path.display())
        })?;
        let len = image.len() as u64 - rec.cut;
        if rec.cut > 0 {
            tracing::warn!(file = %path.display(), bytes = rec.cut, "cutting off a torn journal tail");
            storage.truncate(JOURNAL, len).and_then(|()| storage.sync(JOURNAL)).map_err(err)?;
        }
        if fresh {
            // Create it, and make its directory entry durable.
            storage.append(JOURNAL, b"").and_then(|()| storage.sync(JOURNAL)).map_err(err)?;
            storage.sync_dir().map_err(err)?;
        }
        let shown = std::sync::Arc::new(Shown::default());
        shown.ceiling.store(rec.ceiling, std::sync::atomic::Ordering::Release);
        shown.len.store(len, std::sync::atomic::Ordering::Release);
        let journal = Journal {
            storage,
            len,
            path: path.clone(),
            _lock: lock,
            ceiling: rec.ceiling,
            shown: shown.clone(),
            failed: false,
            commits: 0,
            compactions: 0,
            compact_at: COMPACT_AT,
            stride: None,
        };
        let inner = std::sync::Arc::new(parking_lot::Mutex::new(journal));
        let (ahead, rx) = std::sync::mpsc::channel::<u64>();
        let bg = inner.clone();
        let thread = std::thread::Builder::new()
            .name("epoch-reserve".into())
            .spawn(move || {
                for epoch in rx {
                    // Errors surface on the next reservation that is needed.
                    let _ = bg.lock().ensure(epoch);
                }
            })
            .map_err(|e| format!("starting the reservation thread: {e}"))?;
        Ok((EpochJournal { inner, path, shown, asked: 0, ahead: Some(ahead), thread: Some(thread) }, rec))
    }

    /// Run `f` on the storage (tests look inside the in-memory backend).
    pub fn with_storage<R>(&self, f: impl FnOnce(&mut dyn Storage) -> R) -> R {
        f(&mut *self.inner.lock().storage)
    }

    /// Make `epoch` safe to hand out (for any path): durable before it
    /// returns, with an fsync only when the ceiling is used up. Returns the
    /// ceiling now durable.
    pub fn ensure(&mut self, epoch: u64) -> io::Result<u64> {
        let mut j = self.inner.lock();
        j.ensure(epoch)?;
        Ok(j.ceiling)
    }

    /// Ask the background thread to raise the ceiling beyond `epoch` before
    /// a grant needs it.
    pub fn reserve_ahead(&mut self, epoch: u64) {
        if self.asked >= epoch {
            return;
        }
        self.asked = epoch;
        if let Some(tx) = &self.ahead {
            let _ = tx.send(epoch);
        }
    }

    /// The durable ceiling (never waits for a sync in progress).
    pub fn ceiling(&self) -> u64 {
        self.shown.ceiling.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Bytes in the journal (as of the last reservation; never waits).
    pub fn size(&self) -> u64 {
        self.shown.len.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Reservation records committed since start (never waits).
    pub fn commits(&self) -> u64 {
        self.shown.commits.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Compactions since start (never waits).
    pub fn compactions(&self) -> u64 {
        self.shown.compactions.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Compact past `bytes` instead of [`COMPACT_AT`] (tests).
    pub fn set_compact_at(&mut self, bytes: u64) {
        self.inner.lock().compact_at = bytes;
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Journal {
    fn ensure(&mut self, epoch: u64) -> io::Result<()> {
        let r = self.raise(epoch);
        use std::sync::atomic::Ordering::Release;
        self.shown.len.store(self.len, Release);
        self.shown.commits.store(self.commits, Release);
        self.shown.compactions.store(self.compactions, Release);
        r
    }

    fn raise(&mut self, epoch: u64) -> io::Result<()> {
        if self.ceiling >= epoch {
            return Ok(());
        }
        if self.failed {
            return Err(io::Error::other("state directory failed earlier; durability no longer promised"));
        }
        let now = std::time::Instant::now();
        let stride = match self.stride {
            Some((at, stride)) if now.duration_since(at).as_secs() < 1 => (stride * 2).min(MAX_STRIDE),
            _ => RESERVE_AHEAD,
        };
        let upto = epoch.max(self.ceiling) + stride;
        let rec = record(Path::new(""), upto);
        let before = self.len;
        let r = self.storage.append(JOURNAL, rec.as_bytes()).and_then(|()| self.storage.sync(JOURNAL));
        if let Err(e) = r {
            // Never leave a partial record in the middle of the journal: a
            // later append would turn a torn tail into corruption.
            let undo = self.storage.truncate(JOURNAL, before).and_then(|()| self.storage.sync(JOURNAL));
            if e.raw_os_error() == Some(libc::ENOSPC) && undo.is_ok() {
                // A full disk is refused, not fatal: the next reservation
                // retries once space returns.
                tracing::warn!(file = %self.path.display(), "journal full: refusing grants until space returns");
                return Err(e);
            }
            tracing::error!(file = %self.path.display(), "journal write failed: {e}; stopping durable grants");
            self.failed = true;
            return Err(e);
        }
        self.commits += 1;
        self.len += rec.len() as u64;
        self.ceiling = upto;
        self.shown.ceiling.store(upto, std::sync::atomic::Ordering::Release);
        self.stride = Some((now, stride));
        if self.len > self.compact_at {
            self.compact();
        }
        Ok(())
    }

    /// Replace the journal by its one record that matters (the ceiling).
    /// Failure is harmless: the old journal stays whole and in use.
    fn compact(&mut self) {
        let rec = record(Path::new(""), self.ceiling);
        let s = &mut self.storage;
        let r = s
            .write_new(JOURNAL_TMP, rec.as_bytes())
            .and_then(|()| s.sync(JOURNAL_TMP))
            .and_then(|()| s.rename(JOURNAL_TMP, JOURNAL))
            .and_then(|()| s.sync_dir());
        match r {
            Ok(()) => {
                self.len = rec.len() as u64;
                self.compactions += 1;
            }
            Err(e) => {
                tracing::warn!(file = %self.path.display(), "journal compaction failed: {e}; keeping the old journal");
                let _ = self.storage.remove(JOURNAL_TMP);
                self.len = self.storage.len(JOURNAL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::storage::MemStorage;

    fn mem(j: &EpochJournal) -> usize {
        j.with_storage(|s| s.as_any_mut().downcast_mut::<MemStorage>().unwrap().images.len())
    }

    /// At every write and sync of a stream of grants (long enough to compact
    /// the journal several times), the image a crash would leave recovers a
    /// ceiling at or above every epoch that was made visible before it
    /// (ensure returned).
    #[test]
    fn every_crash_image_keeps_every_visible_epoch() {
        let (mut j, _) =
            EpochJournal::open_on(Box::new(MemStorage::recording()), None, Path::new("mem/epochs.journal")).unwrap();
        j.set_compact_at(512);
        // (epoch, images taken before it became visible)
        let mut visible: Vec<(u64, usize)> = Vec::new();
        let mut e = 0;
        // Steps past the stride force a sync every time; enough records to
        // pass COMPACT_AT several times.
        while j.compactions() < 3 {
            e += 1 + RESERVE_AHEAD * (1 << 12);
            j.ensure(e).unwrap();
            visible.push((e, mem(&j)));
            assert!(visible.len() < 100_000, "never compacted");
        }
        let all = j.with_storage(|s| s.as_any_mut().downcast_mut::<MemStorage>().unwrap().images.clone());
        assert!(all.len() > 20, "{} images", all.len());
        drop(j);
        for (n, mut img) in all.into_iter().enumerate() {
            assert!(img.read(JOURNAL_TMP).is_ok());
            let bytes = img.read(JOURNAL).unwrap().unwrap_or_default();
            let rec = recover(&bytes).unwrap_or_else(|off| panic!("image {n}: corrupt at {off}"));
            for (e, at) in &visible {
                if *at <= n {
                    assert!(rec.ceiling >= *e, "image {n}: {e} was handed out, recovered ceiling {}", rec.ceiling);
                }
            }
        }
    }

    /// The journal stays small however many grants it covered: compaction
    /// rewrites it as one record, and a re-opened journal resumes there.
    #[test]
    fn compaction_keeps_the_journal_bounded_and_the_ceiling() {
        let dir = tempfile::tempdir().unwrap();
        let mut last = 0;
        {
            let (mut j, _) = EpochJournal::open(dir.path()).unwrap();
            j.set_compact_at(1024);
            for i in 1..=300u64 {
                last = j.ensure(i * (MAX_STRIDE + 1)).unwrap();
                assert!(j.size() <= 1024 + 64, "journal grew to {}", j.size());
            }
            assert!(j.compactions() > 0);
        }
        assert!(!dir.path().join(JOURNAL_TMP).exists());
        let (j, rec) = EpochJournal::open(dir.path()).unwrap();
        assert_eq!(rec.ceiling, last);
        assert_eq!(j.ceiling(), last);
    }

    /// A crash between writing the compacted journal and renaming it leaves
    /// a temp file: it is removed and the old journal is used.
    #[test]
    fn a_left_over_compaction_temp_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _) = EpochJournal::open(dir.path()).unwrap();
            j.ensure(5000).unwrap();
        }
        std::fs::write(dir.path().join(JOURNAL_TMP), record(Path::new(""), 1)).unwrap();
        let (_, rec) = EpochJournal::open(dir.path()).unwrap();
        assert!(rec.ceiling >= 5000);
        assert!(!dir.path().join(JOURNAL_TMP).exists());
    }

    #[test]
    fn a_refused_reservation_leaves_no_partial_record() {
        let (mut j, _) =
            EpochJournal::open_on(Box::new(MemStorage::default()), None, Path::new("mem/epochs.journal")).unwrap();
        j.ensure(1).unwrap();
        let ops = j.with_storage(|s| s.as_any_mut().downcast_mut::<MemStorage>().unwrap().ops);
        // The append goes through, its sync fails with ENOSPC.
        j.with_storage(|s| {
            s.as_any_mut().downcast_mut::<MemStorage>().unwrap().fail_at = Some((ops + 2, libc::ENOSPC))
        });
        assert_eq!(j.ensure(RESERVE_AHEAD + 2).unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        j.ensure(RESERVE_AHEAD + 2).unwrap();
        let bytes = j.with_storage(|s| s.read(JOURNAL).unwrap().unwrap());
        let rec = recover(&bytes).unwrap();
        assert_eq!(rec.cut, 0);
        assert_eq!(bytes.iter().filter(|b| **b == b'\n').count(), 2, "one record per successful reservation");
    }

    #[test]
    fn crc_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn torn_tail_is_cut_and_earlier_corruption_refused() {
        let mut image = String::new();
        // Records of earlier versions name their path; they still count.
        image += &record(Path::new("a/L"), 1024);
        image += &record(Path::new("a/L"), 2048);
        image += &record(Path::new(""), 4096);
        let full = image.clone().into_bytes();
        let rec = recover(&full).unwrap();
        assert_eq!((rec.ceiling, rec.records, rec.cut), (4096, 3, 0));
        // Every crash point inside the last record: the rest survives.
        let last = record(Path::new(""), 4096).len();
        for cut in 1..last {
            let rec = recover(&full[..full.len() - cut]).unwrap();
            assert_eq!(rec.ceiling, 2048, "cut {cut}");
        }
        // A flipped byte in the first record is corruption, not a tail.
        let mut bad = full.clone();
        bad[12] ^= 1;
        assert_eq!(recover(&bad).unwrap_err(), 0);
    }

    #[test]
    fn reservations_are_durable_and_the_directory_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, rec) = EpochJournal::open(dir.path()).unwrap();
            assert_eq!(rec.ceiling, 0);
            assert!(EpochJournal::open(dir.path()).unwrap_err().contains("in use"));
            j.ensure(1).unwrap();
            j.ensure(500).unwrap();
            assert_eq!(j.commits(), 1, "one sync per stride, not per epoch");
            j.ensure(1026).unwrap();
            assert_eq!(j.commits(), 2);
            // Used up within a second: the next stride is twice as long.
            assert_eq!(j.ceiling(), 1026 + 2 * RESERVE_AHEAD);
            j.reserve_ahead(1026 + 2 * RESERVE_AHEAD + 1);
        }
        // Dropping the journal waited for the background reservation.
        let (_, rec) = EpochJournal::open(dir.path()).unwrap();
        assert!(rec.ceiling > 1026 + 2 * RESERVE_AHEAD + 1, "{rec:?}");
    }
}
