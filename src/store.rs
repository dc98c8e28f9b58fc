//! Durable epochs: a checksummed append-only journal of epoch reservations
//! in the state directory.
//!
//! Safety argument (SPEC 5, "epochs never repeat or go backwards, across
//! `kill -9`"): before the daemon lets any process see an epoch `e` for a
//! path, the journal durably holds a reservation `r >= e` for that path
//! (`write` + `fdatasync` returned). Reservations run ahead by
//! [`RESERVE_AHEAD`], so only one grant in that many pays for a sync; a path
//! that uses up its reservation within a second gets twice the stride next
//! time (up to [`MAX_STRIDE`]), so a hot lease syncs a few times a second at
//! most. On start-up every path's epoch floor is its highest reservation, so
//! the next grant is strictly above anything handed out before the crash (it
//! may jump forward by up to the stride in use).
//!
//! Format: one record per line, `<crc32 hex> <epoch> <path hex>\n`. A torn
//! or corrupt *last* record (a crash mid-append) is cut off with a warning;
//! corruption before the tail stops start-up with the file and offset, since
//! serving wrong epochs is worse than not serving.
//!
//! The journal lives behind the [`Storage`] trait, so unit tests check the
//! image a crash would leave at every write and sync. The namespace,
//! contents, xattrs, TTLs and guards are kept by [`crate::persist`].

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::storage::{DirStorage, Storage};

/// How far a reservation runs ahead of the epoch that needed it.
pub const RESERVE_AHEAD: u64 = 1024;

/// The largest stride a hot path's reservation grows to.
pub const MAX_STRIDE: u64 = 1 << 20;

/// Name of the journal in the state directory.
pub const JOURNAL: &str = "epochs.journal";

/// CRC-32 (IEEE).
pub fn crc32(data: &[u8]) -> u32 {
    crate::persist::crc32(data)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
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
    /// Highest reservation per path.
    pub floors: HashMap<PathBuf, u64>,
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
            Some((p, e)) => {
                let slot = out.floors.entry(p).or_insert(0);
                *slot = (*slot).max(e);
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
/// Reservations are made on the caller's thread when needed, and ahead of
/// need by a background thread (so a hot lease rarely waits for a sync).
pub struct EpochJournal {
    inner: std::sync::Arc<parking_lot::Mutex<Journal>>,
    path: PathBuf,
    /// Reservations asked of the background thread, by path.
    asked: HashMap<PathBuf, u64>,
    ahead: Option<std::sync::mpsc::Sender<(PathBuf, u64)>>,
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
    /// Highest durable reservation per path.
    reserved: HashMap<PathBuf, u64>,
    /// Set after the first I/O error: durability is no longer promised.
    failed: bool,
    /// Records committed since start.
    commits: u64,
    /// When each path last reserved, and with which stride.
    strides: HashMap<PathBuf, (std::time::Instant, u64)>,
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
        let reserved = rec.floors.clone();
        let journal = Journal {
            storage,
            len,
            path: path.clone(),
            _lock: lock,
            reserved,
            failed: false,
            commits: 0,
            strides: HashMap::new(),
        };
        let inner = std::sync::Arc::new(parking_lot::Mutex::new(journal));
        let (ahead, rx) = std::sync::mpsc::channel::<(PathBuf, u64)>();
        let bg = inner.clone();
        let thread = std::thread::Builder::new()
            .name("epoch-reserve".into())
            .spawn(move || {
                for (p, epoch) in rx {
                    // Errors surface on the next reservation that is needed.
                    let _ = bg.lock().ensure(&p, epoch);
                }
            })
            .map_err(|e| format!("starting the reservation thread: {e}"))?;
        Ok((EpochJournal { inner, path, asked: HashMap::new(), ahead: Some(ahead), thread: Some(thread) }, rec))
    }

    /// Run `f` on the storage (tests look inside the in-memory backend).
    pub fn with_storage<R>(&self, f: impl FnOnce(&mut dyn Storage) -> R) -> R {
        f(&mut *self.inner.lock().storage)
    }

    /// Make `epoch` safe to hand out for `path`: durable before it returns,
    /// with an fsync only when the reservation is used up. Returns the
    /// highest epoch now reserved for `path`.
    pub fn ensure(&mut self, path: &Path, epoch: u64) -> io::Result<u64> {
        let mut j = self.inner.lock();
        j.ensure(path, epoch)?;
        Ok(j.reserved(path))
    }

    /// Ask the background thread to extend `path`'s reservation beyond
    /// `epoch` before a grant needs it.
    pub fn reserve_ahead(&mut self, path: &Path, epoch: u64) {
        if self.asked.get(path).is_some_and(|e| *e >= epoch) {
            return;
        }
        if self.asked.len() > 4096 {
            self.asked.clear();
        }
        self.asked.insert(path.to_path_buf(), epoch);
        if let Some(tx) = &self.ahead {
            let _ = tx.send((path.to_path_buf(), epoch));
        }
    }

    /// The highest durable reservation for a path.
    pub fn reserved(&self, path: &Path) -> u64 {
        self.inner.lock().reserved(path)
    }

    /// Bytes in the journal.
    pub fn size(&self) -> u64 {
        self.inner.lock().len
    }

    /// Reservation records committed since start.
    pub fn commits(&self) -> u64 {
        self.inner.lock().commits
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Journal {
    fn ensure(&mut self, path: &Path, epoch: u64) -> io::Result<()> {
        if self.reserved.get(path).is_some_and(|r| *r >= epoch) {
            return Ok(());
        }
        if self.failed {
            return Err(io::Error::other("state directory failed earlier; durability no longer promised"));
        }
        let now = std::time::Instant::now();
        let stride = match self.strides.get(path) {
            Some((at, stride)) if now.duration_since(*at).as_secs() < 1 => (stride * 2).min(MAX_STRIDE),
            _ => RESERVE_AHEAD,
        };
        let upto = epoch + stride;
        let rec = record(path, upto);
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
        self.reserved.insert(path.to_path_buf(), upto);
        if self.strides.len() > 4096 {
            self.strides.clear();
        }
        self.strides.insert(path.to_path_buf(), (now, stride));
        Ok(())
    }

    fn reserved(&self, path: &Path) -> u64 {
        self.reserved.get(path).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At every write and sync of a stream of grants, the image a crash
    /// would leave recovers a floor at or above every epoch that was made
    /// visible before it (ensure returned), for every path.
    #[test]
    fn every_crash_image_keeps_every_visible_epoch() {
        use crate::storage::MemStorage;
        let (mut j, _) =
            EpochJournal::open_on(Box::new(MemStorage::recording()), None, Path::new("mem/epochs.journal")).unwrap();
        let images = |j: &EpochJournal| {
            j.with_storage(|s| s.as_any_mut().downcast_mut::<MemStorage>().unwrap().images.len())
        };
        // (path, epoch, images taken before it became visible)
        let mut visible: Vec<(&str, u64, usize)> = Vec::new();
        for e in 1..=5000u64 {
            for p in ["a", "b/c"] {
                if p == "b/c" && e % 7 != 0 {
                    continue;
                }
                j.ensure(Path::new(p), e).unwrap();
                visible.push((p, e, images(&j)));
            }
        }
        let all = j.with_storage(|s| s.as_any_mut().downcast_mut::<MemStorage>().unwrap().images.clone());
        assert!(all.len() > 20, "{} images", all.len());
        drop(j);
        for (n, mut img) in all.into_iter().enumerate() {
            let bytes = img.read(JOURNAL).unwrap().unwrap_or_default();
            let rec = recover(&bytes).unwrap_or_else(|off| panic!("image {n}: corrupt at {off}"));
            for (p, e, at) in &visible {
                if *at <= n {
                    let floor = rec.floors.get(Path::new(p)).copied().unwrap_or(0);
                    assert!(floor >= *e, "image {n}: {p} was handed {e}, recovered floor {floor}");
                }
            }
        }
    }

    #[test]
    fn a_refused_reservation_leaves_no_partial_record() {
        use crate::storage::MemStorage;
        let (mut j, _) =
            EpochJournal::open_on(Box::new(MemStorage::default()), None, Path::new("mem/epochs.journal")).unwrap();
        j.ensure(Path::new("a"), 1).unwrap();
        let ops = j.with_storage(|s| s.as_any_mut().downcast_mut::<MemStorage>().unwrap().ops);
        // The append goes through, its sync fails with ENOSPC.
        j.with_storage(|s| s.as_any_mut().downcast_mut::<MemStorage>().unwrap().fail_at = Some((ops + 2, libc::ENOSPC)));
        assert_eq!(j.ensure(Path::new("b"), 1).unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        j.ensure(Path::new("b"), 1).unwrap();
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
        image += &record(Path::new("a/L"), 1024);
        image += &record(Path::new("a/L"), 2048);
        image += &record(Path::new("b"), 1024);
        let full = image.clone().into_bytes();
        let rec = recover(&full).unwrap();
        assert_eq!(rec.floors[Path::new("a/L")], 2048);
        assert_eq!(rec.cut, 0);
        // Every crash point inside the last record: the rest survives.
        let last = record(Path::new("b"), 1024).len();
        for cut in 1..last {
            let rec = recover(&full[..full.len() - cut]).unwrap();
            assert_eq!(rec.floors[Path::new("a/L")], 2048);
            assert!(!rec.floors.contains_key(Path::new("b")), "cut {cut}");
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
            assert!(rec.floors.is_empty());
            assert!(EpochJournal::open(dir.path()).unwrap_err().contains("in use"));
            j.ensure(Path::new("L"), 1).unwrap();
            j.ensure(Path::new("L"), 500).unwrap();
            assert_eq!(j.commits(), 1, "one sync per reservation, not per epoch");
            j.ensure(Path::new("L"), 1026).unwrap();
            assert_eq!(j.commits(), 2);
            // Used up within a second: the next stride is twice as long.
            assert_eq!(j.reserved(Path::new("L")), 1026 + 2 * RESERVE_AHEAD);
            j.reserve_ahead(Path::new("L"), 1026 + 2 * RESERVE_AHEAD + 1);
        }
        // Dropping the journal waited for the background reservation.
        let (_, rec) = EpochJournal::open(dir.path()).unwrap();
        assert!(rec.floors[Path::new("L")] > 1026 + 2 * RESERVE_AHEAD + 1, "{:?}", rec.floors);
    }
}
