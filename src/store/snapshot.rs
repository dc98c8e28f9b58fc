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
use crate::store::storage::{Storage, Syncer};

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
/// In a snapshot written while the journal went on: which journal
/// (generation) it includes, up to which byte offset.
const T_BASE: u8 = 6;

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
                (
                    -(d.as_secs() as i64) - i64::from(extra),
                    if extra == 1 { 1_000_000_000 - d.subsec_nanos() } else { 0 },
                )
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

    /// The snapshot holds journal `generation` up to byte `offset`.
    pub fn base(&mut self, generation: u64, offset: u64) {
        self.begin(T_BASE);
        self.u64(generation);
        self.u64(offset);
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
    Base(u64, u64),
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
        T_BASE => Rec::Base(d.u64()?, d.u64()?),
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
