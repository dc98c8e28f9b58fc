//! The durable namespace: a write-ahead journal of changed inodes, pages and
//! directory entries, compacted into a snapshot, in the state directory.
//!
//! **What is durable when.** The namespace tracks what changed since the last
//! flush (inodes, 4 KiB pages, directory names, dropped inodes). A flush
//! encodes those changes as one batch of checksummed records ending with a
//! commit record, appends it to `namespace.journal` and `fdatasync`s it.
//! Flushes happen on every `fsync`/`fdatasync`/`fsyncdir` of anything on the
//! mount (before the call returns: group commit, so one flush covers all
//! changes of all files) and at clean unmount. Hence the contract: the
//! namespace, contents, xattrs, TTLs and guards are durable as of the last
//! sync that returned. Epochs are not kept here (see [`crate::store`]).
//!
//! **Recovery.** The snapshot (if any) must be whole: it is written to a
//! temporary file, synced, renamed and the directory synced, so any damage
//! in it stops start-up with the file and offset. Journal batches are
//! replayed on top when the journal's generation matches the snapshot's (a
//! journal of an older generation was folded into the snapshot before the
//! crash). A torn or corrupt last record, zeros to the end of the file, or a
//! batch without its commit record is the trace of a crash mid-flush — never
//! acknowledged — and is cut off with a warning; a bad record followed by
//! good ones is corruption and stops start-up.
//!
//! **Compaction.** When the journal outgrows the snapshot (and at clean
//! unmount) the whole namespace is written as a new snapshot of the next
//! generation and the journal starts over. A crash at any step leaves either
//! the old snapshot with its journal, or the new snapshot (whose journal is
//! ignored or empty).
//!
//! **Failure.** A full disk makes a flush fail with `ENOSPC` (the partial
//! batch is cut away, the changes stay pending, and the next sync retries);
//! any other I/O error stops durability for good (fail-stop): every later
//! sync fails with `EIO` instead of pretending.
//!
//! Record frame: `u32 length, u32 crc32(length), u32 crc32(payload), payload`
//! (a torn append leaves a prefix, so a bad length is corruption); payload starts
//! with a tag byte. Integers are little-endian.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::namespace::{Body, Data, Ino, Inode, Kind, Namespace, PAGE};
use crate::storage::{Storage, Syncer};

/// The journal file in the state directory.
pub const JOURNAL: &str = "namespace.journal";
/// The snapshot file in the state directory.
pub const SNAPSHOT: &str = "namespace.snapshot";
const SNAPSHOT_TMP: &str = "namespace.snapshot.tmp";
const JOURNAL_TMP: &str = "namespace.journal.tmp";

/// A journal this large (and larger than the snapshot) is compacted.
pub const SNAPSHOT_MIN_BYTES: u64 = 1 << 20;

/// Frame header: payload length, CRC of the length, CRC of the payload.
const FRAME: usize = 12;

const T_HEADER: u8 = 0;
const T_INODE: u8 = 1;
const T_PAGE: u8 = 2;
const T_ENTRY: u8 = 3;
const T_FREE: u8 = 4;
const T_COMMIT: u8 = 5;

/// Lease settings that live outside the inode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extra {
    pub ttl_ms: Option<u64>,
    pub guard: Option<PathBuf>,
}

/// CRC-32 (IEEE, the zlib polynomial), SIMD-accelerated: a flush of a
/// large batch (a synced shared mapping) is bounded by the disk, not by a
/// byte-at-a-time checksum.
pub fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// Appends framed records to a buffer.
#[derive(Default)]
pub struct Enc {
    pub buf: Vec<u8>,
    start: usize,
}

impl Enc {
    fn begin(&mut self, tag: u8) {
        self.start = self.buf.len();
        self.buf.extend_from_slice(&[0u8; FRAME]);
        self.buf.push(tag);
    }
    fn end(&mut self) {
        let payload = &self.buf[self.start + FRAME..];
        let (len, crc) = (payload.len() as u32, crc32(payload));
        let at = self.start;
        self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
        self.buf[at + 4..at + 8].copy_from_slice(&crc32(&len.to_le_bytes()).to_le_bytes());
        self.buf[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
    }
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.buf.extend_from_slice(b);
    }
    fn time(&mut self, t: SystemTime) {
        let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                let extra = u32::from(d.subsec_nanos() != 0);
                (-(d.as_secs() as i64) - i64::from(extra), if extra == 1 { 1_000_000_000 - d.subsec_nanos() } else { 0 })
            }
        };
        self.u64(secs as u64);
        self.u32(nanos);
    }

    fn header(&mut self, generation: u64) {
        self.begin(T_HEADER);
        self.u64(generation);
        self.time(SystemTime::now());
        self.end();
    }

    /// An inode's attributes, xattrs, symlink target, size and settings.
    pub fn inode(&mut self, i: &Inode, extra: &Extra) {
        self.begin(T_INODE);
        self.u64(i.ino.0);
        self.u8(kind_code(i.kind));
        self.u32(u32::from(i.perm));
        self.u32(i.uid);
        self.u32(i.gid);
        self.u32(i.rdev);
        for t in [i.atime, i.mtime, i.ctime, i.crtime] {
            self.time(t);
        }
        self.u64(i.version);
        let (size, target): (u64, &[u8]) = match &i.body {
            Body::File(d) => (d.size(), b""),
            Body::Symlink(t) => (0, t.as_bytes()),
            _ => (0, b""),
        };
        self.u64(size);
        self.bytes(target);
        self.u32(i.xattrs.len() as u32);
        for (k, v) in &i.xattrs {
            self.bytes(k.as_bytes());
            self.bytes(v);
        }
        self.u64(extra.ttl_ms.map_or(0, |t| t + 1));
        self.bytes(extra.guard.as_ref().map_or(&b""[..], |g| g.as_os_str().as_bytes()));
        self.end();
    }

    /// One page of a file (`None`: a hole).
    pub fn page(&mut self, ino: Ino, idx: u64, page: Option<&[u8; PAGE]>) {
        self.begin(T_PAGE);
        self.u64(ino.0);
        self.u64(idx);
        self.bytes(page.map_or(&[][..], |p| &p[..]));
        self.end();
    }

    /// A directory entry (`None`: removed).
    pub fn entry(&mut self, dir: Ino, name: &[u8], ino: Option<Ino>) {
        self.begin(T_ENTRY);
        self.u64(dir.0);
        self.bytes(name);
        self.u64(ino.map_or(0, |i| i.0));
        self.end();
    }

    /// An inode dropped for good.
    pub fn free(&mut self, ino: Ino) {
        self.begin(T_FREE);
        self.u64(ino.0);
        self.end();
    }

    /// The end of a batch.
    pub fn commit(&mut self, next_ino: u64) {
        self.begin(T_COMMIT);
        self.u64(next_ino);
        self.end();
    }
}

fn kind_code(k: Kind) -> u8 {
    match k {
        Kind::File => 1,
        Kind::Dir => 2,
        Kind::Symlink => 3,
        Kind::Fifo => 4,
        Kind::Socket => 5,
        Kind::CharDev => 6,
        Kind::BlockDev => 7,
    }
}

fn kind_of(c: u8) -> Option<Kind> {
    Some(match c {
        1 => Kind::File,
        2 => Kind::Dir,
        3 => Kind::Symlink,
        4 => Kind::Fifo,
        5 => Kind::Socket,
        6 => Kind::CharDev,
        7 => Kind::BlockDev,
        _ => return None,
    })
}

struct Dec<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn time(&mut self) -> Option<SystemTime> {
        let secs = self.u64()? as i64;
        let nanos = self.u32()?;
        Some(if secs >= 0 {
            UNIX_EPOCH + Duration::new(secs as u64, nanos)
        } else {
            UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(u64::from(nanos))
        })
    }
}

/// One decoded record.
enum Rec {
    Header(u64, SystemTime),
    Inode(Box<Inode>, u64, Extra),
    Page(Ino, u64, Vec<u8>),
    Entry(Ino, OsString, Option<Ino>),
    Free(Ino),
    Commit(u64),
}

fn decode(payload: &[u8]) -> Option<Rec> {
    let mut d = Dec { b: payload, pos: 0 };
    let rec = match d.u8()? {
        T_HEADER => Rec::Header(d.u64()?, d.time()?),
        T_INODE => {
            let ino = Ino(d.u64()?);
            let kind = kind_of(d.u8()?)?;
            let perm = d.u32()? as u16;
            let (uid, gid, rdev) = (d.u32()?, d.u32()?, d.u32()?);
            let (atime, mtime, ctime, crtime) = (d.time()?, d.time()?, d.time()?, d.time()?);
            let version = d.u64()?;
            let size = d.u64()?;
            let target = OsString::from_vec(d.bytes()?.to_vec());
            let mut xattrs = std::collections::BTreeMap::new();
            for _ in 0..d.u32()? {
                let k = OsString::from_vec(d.bytes()?.to_vec());
                xattrs.insert(k, d.bytes()?.to_vec());
            }
            let ttl = d.u64()?;
            let guard = d.bytes()?;
            let extra = Extra {
                ttl_ms: ttl.checked_sub(1),
                guard: (!guard.is_empty()).then(|| PathBuf::from(OsString::from_vec(guard.to_vec()))),
            };
            let body = match kind {
                Kind::File => Body::File(Data::default()),
                Kind::Dir => Body::Dir(crate::namespace::Dir::empty(ino)),
                Kind::Symlink => Body::Symlink(target),
                _ => Body::Special,
            };
            let inode = Inode {
                ino,
                kind,
                perm,
                nlink: 0,
                uid,
                gid,
                rdev,
                atime,
                mtime,
                ctime,
                crtime,
                lookups: 0,
                opens: 0,
                version,
                xattrs,
                body,
            };
            Rec::Inode(Box::new(inode), size, extra)
        }
        T_PAGE => Rec::Page(Ino(d.u64()?), d.u64()?, d.bytes()?.to_vec()),
        T_ENTRY => {
            let dir = Ino(d.u64()?);
            let name = OsString::from_vec(d.bytes()?.to_vec());
            let ino = d.u64()?;
            Rec::Entry(dir, name, (ino != 0).then_some(Ino(ino)))
        }
        T_FREE => Rec::Free(Ino(d.u64()?)),
        T_COMMIT => Rec::Commit(d.u64()?),
        _ => return None,
    };
    (d.pos == payload.len()).then_some(rec)
}

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
            Rec::Header(..) | Rec::Commit(_) => {}
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

/// How a file's records end.
enum Scan {
    /// Every record good; the offset just past the last commit.
    Clean(u64),
    /// A torn tail from this offset (records after the last commit, a
    /// partial or bad last record, zeros to the end).
    Torn(u64),
}

/// Walk the framed records of `image`, handing each committed batch to
/// `batch`. `Err(offset)` for corruption before the tail.
fn scan(image: &[u8], mut batch: impl FnMut(Vec<Rec>)) -> Result<Scan, u64> {
    let mut pos = 0usize;
    let mut committed = 0usize;
    let mut pending = Vec::new();
    while pos < image.len() {
        let rest = &image[pos..];
        let torn = |_: ()| -> Result<Scan, u64> { Ok(Scan::Torn(committed as u64)) };
        if rest.len() < FRAME || rest.iter().all(|b| *b == 0) {
            return torn(());
        }
        let len_bytes: [u8; 4] = rest[..4].try_into().expect("4 bytes");
        let len_crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(len_bytes) as usize;
        if len == 0 || crc32(&len_bytes) != len_crc {
            // A torn append leaves a prefix, never a wrong length.
            return Err(pos as u64);
        }
        if len > rest.len() - FRAME {
            return torn(());
        }
        let payload = &rest[FRAME..FRAME + len];
        let is_last = FRAME + len == rest.len();
        let rec = if crc32(payload) == crc { decode(payload) } else { None };
        let Some(rec) = rec else {
            return if is_last { torn(()) } else { Err(pos as u64) };
        };
        pos += FRAME + len;
        let end = matches!(rec, Rec::Commit(_));
        pending.push(rec);
        if end {
            batch(std::mem::take(&mut pending));
            committed = pos;
        }
    }
    Ok(if committed == image.len() { Scan::Clean(committed as u64) } else { Scan::Torn(committed as u64) })
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
                if rec.cut > 0 {
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
        };
        if fresh_journal {
            store.new_journal().map_err(|e| io(JOURNAL, e))?;
        }
        Ok((store, rec))
    }

    /// Replace the journal with an empty one of the current generation.
    fn new_journal(&mut self) -> io::Result<()> {
        let mut e = Enc::default();
        e.header(self.generation);
        e.commit(0);
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
mod tests {
    /// The checksum is the one the record format always used (CRC-32 IEEE,
    /// reflected 0xEDB88320), bit by bit.
    #[test]
    fn crc32_matches_the_reference_definition() {
        fn reference(data: &[u8]) -> u32 {
            let mut crc = !0u32;
            for &b in data {
                crc ^= u32::from(b);
                for _ in 0..8 {
                    crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
                }
            }
            !crc
        }
        assert_eq!(super::crc32(b"123456789"), 0xCBF4_3926);
        let data: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 64, 4095, 4096, 100_000] {
            assert_eq!(super::crc32(&data[..len]), reference(&data[..len]), "length {len}");
        }
    }

    use super::*;
    use crate::namespace::NewInode;
    use crate::storage::MemStorage;
    use std::ffi::OsStr;

    fn file(ns: &mut Namespace, parent: Ino, name: &str, content: &[u8]) -> Ino {
        let now = SystemTime::now();
        let ino = ns.alloc(
            NewInode { kind: Kind::File, perm: 0o644, uid: 0, gid: 0, rdev: 0, symlink: None },
            parent,
            now,
        );
        ns.link(parent, OsStr::new(name), ino).unwrap();
        ns.get_mut(ino).unwrap().data_mut().unwrap().write(0, content).unwrap();
        ino
    }

    /// A canonical view of a namespace: every path with its kind and content.
    fn view(ns: &Namespace) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut stack = vec![(Ino::ROOT, String::new())];
        while let Some((dir, path)) = stack.pop() {
            for (name, ino) in ns.get(dir).unwrap().dir().unwrap().iter() {
                let p = format!("{path}/{}", name.to_string_lossy());
                let i = ns.get(ino).unwrap();
                let what = match &i.body {
                    Body::File(d) => format!("file {:?} nlink {}", String::from_utf8_lossy(&d.read(0, 1 << 20)), i.nlink),
                    Body::Dir(_) => {
                        stack.push((ino, p.clone()));
                        format!("dir nlink {}", i.nlink)
                    }
                    Body::Symlink(t) => format!("symlink {t:?}"),
                    Body::Special => "special".into(),
                };
                let x: Vec<String> = i.xattrs.iter().map(|(k, v)| format!("{k:?}={v:?}")).collect();
                out.push((p, format!("{what} {x:?}")));
            }
        }
        out.sort();
        out
    }

    fn recover(storage: MemStorage) -> Namespace {
        let (_, rec) = Store::open(Box::new(storage)).unwrap();
        Namespace::restore(rec.inodes, rec.next_ino, Namespace::new(0o755, 0, 0, SystemTime::UNIX_EPOCH))
    }

    fn flush(ns: &mut Namespace, store: &mut Store) {
        let batch = encode_changes(ns, |_| Extra::default());
        store.commit(&batch).unwrap();
        ns.clear_dirty();
    }

    #[test]
    fn records_round_trip_with_crc() {
        let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
        ns.set_tracking();
        let f = file(&mut ns, Ino::ROOT, "a", b"hello");
        ns.get_mut(f).unwrap().xattrs.insert("user.x".into(), b"1".to_vec());
        let img = encode_all(&ns, |_| Extra { ttl_ms: Some(1500), guard: Some("lease".into()) });
        let mut seen = 0;
        assert!(matches!(scan(&img, |b| seen += b.len()), Ok(Scan::Clean(_))));
        assert!(seen >= 4);
        let mut bad = img.clone();
        bad[14] ^= 1;
        assert_eq!(scan(&bad, |_| {}).err(), Some(0), "a bad first record followed by more is corruption");
    }

    /// Every crash image taken at every write and sync of a workload
    /// recovers to a state at least as new as the last acknowledged flush,
    /// and never to something that was not there.
    #[test]
    fn every_crash_image_recovers_what_was_acknowledged() {
        let (mut store, _) = Store::open(Box::new(MemStorage::recording())).unwrap();
        store.snapshot_min = 600; // compact often
        let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
        ns.set_tracking();
        let mut acked: Vec<Vec<(String, String)>> = vec![view(&ns)];
        let mut images_at_ack: Vec<usize> = vec![0];
        for step in 0..12u32 {
            let name = format!("f{}", step % 5);
            match step % 4 {
                0 => {
                    if let Ok(ino) = ns.child(Ino::ROOT, OsStr::new(&name)) {
                        let d = ns.get_mut(ino).unwrap().data_mut().unwrap();
                        d.truncate(0).unwrap();
                        d.write(0, format!("v{step}").as_bytes()).unwrap();
                    } else {
                        file(&mut ns, Ino::ROOT, &name, format!("v{step}").as_bytes());
                    }
                }
                1 => {
                    let _ = ns.unlink(Ino::ROOT, OsStr::new(&name));
                }
                2 => {
                    let big = vec![b'x'; 5000 + step as usize];
                    file(&mut ns, Ino::ROOT, &format!("big{step}"), &big);
                }
                _ => {
                    let ino = ns.child(Ino::ROOT, OsStr::new("big2")).ok();
                    if let Some(ino) = ino {
                        ns.get_mut(ino).unwrap().data_mut().unwrap().truncate(10).unwrap();
                    }
                }
            }
            flush(&mut ns, &mut store);
            if store.wants_snapshot() {
                let img = encode_all(&ns, |_| Extra::default());
                store.snapshot(&img).unwrap();
            }
            acked.push(view(&ns));
            images_at_ack.push(recording(&store).images.len());
        }
        let images = recording(&store).images.clone();
        assert!(images.len() > 100, "{} images", images.len());
        for (n, img) in images.into_iter().enumerate() {
            // The newest flush acknowledged before this image was taken.
            let last = images_at_ack.iter().rposition(|&at| at <= n).unwrap();
            let got = view(&recover(img));
            let ok = acked[last..].iter().take(2).any(|v| *v == got);
            assert!(ok, "image {n}: recovered {got:?}\nacknowledged {:?}", acked[last]);
        }
    }

    fn recording(store: &Store) -> &MemStorage {
        // SAFETY-free downcast: tests only ever put a MemStorage here.
        let any: &dyn std::any::Any = store.storage.as_any();
        any.downcast_ref::<MemStorage>().unwrap()
    }

    #[test]
    fn corruption_before_the_tail_refuses_and_a_torn_tail_is_cut() {
        let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
        let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
        ns.set_tracking();
        file(&mut ns, Ino::ROOT, "a", b"1");
        flush(&mut ns, &mut store);
        file(&mut ns, Ino::ROOT, "b", b"2");
        flush(&mut ns, &mut store);
        let mem = recording_mut(&mut store);
        let j = mem.read(JOURNAL).unwrap().unwrap();
        // Torn: drop the last 3 bytes: "b" is gone, "a" stays.
        let mut torn = MemStorage::default();
        torn.append(JOURNAL, &j[..j.len() - 3]).unwrap();
        let (_, rec) = Store::open(Box::new(torn)).unwrap();
        assert!(rec.cut > 0);
        let ns2 = Namespace::restore(rec.inodes, rec.next_ino, Namespace::new(0o755, 0, 0, SystemTime::UNIX_EPOCH));
        assert!(ns2.child(Ino::ROOT, OsStr::new("a")).is_ok());
        assert!(ns2.child(Ino::ROOT, OsStr::new("b")).is_err());
        // Zeros at the end (a crash after the size grew): also a tail.
        let mut zeros = MemStorage::default();
        zeros.append(JOURNAL, &j).unwrap();
        zeros.append(JOURNAL, &[0u8; 100]).unwrap();
        assert!(Store::open(Box::new(zeros)).is_ok());
        // A flipped byte in the first batch: corruption, refuse.
        let mut bad = MemStorage::default();
        let mut jb = j.clone();
        jb[30] ^= 0x40;
        bad.append(JOURNAL, &jb).unwrap();
        let err = Store::open(Box::new(bad)).unwrap_err();
        assert!(err.contains("namespace.journal") && err.contains("offset"), "{err}");
    }

    fn recording_mut(store: &mut Store) -> &mut MemStorage {
        store.storage.as_any_mut().downcast_mut::<MemStorage>().unwrap()
    }

    #[test]
    fn a_clean_reopen_cuts_nothing_and_replays_every_batch() {
        let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
        let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
        ns.set_tracking();
        file(&mut ns, Ino::ROOT, "a", b"1");
        flush(&mut ns, &mut store);
        let img = recording_mut(&mut store).clone();
        let (store2, rec) = Store::open(Box::new(img)).unwrap();
        assert_eq!((rec.cut, rec.batches), (0, 2), "header batch + one flush");
        assert_eq!(store2.journal_bytes(), store.journal_bytes());
    }

    #[test]
    fn a_journal_newer_than_its_snapshot_refuses_to_start() {
        // A journal of generation 1 without the snapshot that began it: the
        // snapshot's rename was lost, so replaying would serve a wrong tree.
        let mut e = Enc::default();
        e.header(1);
        e.commit(0);
        let mut mem = MemStorage::default();
        mem.append(JOURNAL, &e.buf).unwrap();
        let err = Store::open(Box::new(mem)).unwrap_err();
        assert!(err.contains("generation 1 is newer than the snapshot's (0)"), "{err}");
    }

    #[test]
    fn enospc_keeps_changes_pending_and_other_errors_are_fail_stop() {
        let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
        let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
        ns.set_tracking();
        file(&mut ns, Ino::ROOT, "a", b"1");
        let ops = recording_mut(&mut store).ops;
        recording_mut(&mut store).fail_at = Some((ops + 1, libc::ENOSPC));
        let batch = encode_changes(&ns, |_| Extra::default());
        assert_eq!(store.commit(&batch).unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        assert!(!store.failed());
        store.commit(&batch).unwrap();
        ns.clear_dirty();
        let ops = recording_mut(&mut store).ops;
        recording_mut(&mut store).fail_at = Some((ops + 2, libc::EIO));
        file(&mut ns, Ino::ROOT, "b", b"2");
        let batch = encode_changes(&ns, |_| Extra::default());
        assert_eq!(store.commit(&batch).unwrap_err().raw_os_error(), Some(libc::EIO));
        assert!(store.failed());
        assert_eq!(store.commit(&batch).unwrap_err().raw_os_error(), Some(libc::EIO), "fail-stop");
        let img = recording_mut(&mut store).clone();
        let ns2 = recover(img);
        assert!(ns2.child(Ino::ROOT, OsStr::new("a")).is_ok());
    }
}
