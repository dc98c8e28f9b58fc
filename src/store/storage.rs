//! The state directory behind a small trait, so the namespace store can run
//! on a real directory ([`DirStorage`]) or in memory ([`MemStorage`]), where
//! tests take the image a crash would leave at every write and sync.
//!
//! The model is the one a careful program must assume of a POSIX disk:
//! appended bytes are durable only after `sync` of that file (and then only
//! as a whole prefix), a new name (create, rename, remove) only after
//! `sync_dir`, and a crash may keep any prefix of what was not synced.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::store::direct::{self, Deferred};

/// Files of one flat state directory, by name.
pub trait Storage: Send {
    /// The whole content of a file, or `None` when it does not exist.
    fn read(&mut self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// The bytes of a file from `offset` to `end` (empty when missing).
    fn read_range(&mut self, name: &str, offset: u64, end: u64) -> io::Result<Vec<u8>> {
        let all = self.read(name)?.unwrap_or_default();
        Ok(all.get(offset as usize..(end as usize).min(all.len())).unwrap_or_default().to_vec())
    }
    /// A second handle on the same files for another thread (a snapshot
    /// written off the request path). Backends that cannot share their
    /// files have none, and their snapshots are written in line.
    fn fork(&self) -> Option<Box<dyn Storage>> {
        None
    }
    /// Append to a file, creating it when missing.
    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()>;
    /// Write `data` at `offset` of a file, creating it when missing and
    /// growing it (with zeros up to `offset`) when shorter. Not durable
    /// until `sync`; until then a crash may keep any part of what it
    /// overwrote, not only a prefix.
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()>;
    /// [`Storage::write_at`] of `len` zeros, made ahead for later writes to
    /// overwrite in place.
    fn write_zeros(&mut self, name: &str, offset: u64, len: usize) -> io::Result<()> {
        self.write_at(name, offset, &vec![0; len])
    }
    /// Cut a file to `len` bytes.
    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()>;
    /// Make a file's content durable (`fdatasync`).
    fn sync(&mut self, name: &str) -> io::Result<()>;
    /// A `sync` of `name` that may run later on another thread, while this
    /// storage goes on appending: it covers everything appended before it
    /// runs. Backends without a separate handle sync now.
    fn syncer(&mut self, name: &str) -> io::Result<Syncer> {
        self.sync(name)?;
        Ok(Box::new(|| Ok(())))
    }
    /// Create or replace a file with `data` (not durable until `sync`).
    fn write_new(&mut self, name: &str, data: &[u8]) -> io::Result<()>;
    /// Rename within the directory, replacing `to`.
    fn rename(&mut self, from: &str, to: &str) -> io::Result<()>;
    /// Remove a file; missing files are fine.
    fn remove(&mut self, name: &str) -> io::Result<()>;
    /// Make the directory's names durable (`fsync` of the directory).
    fn sync_dir(&mut self) -> io::Result<()>;
    /// Size of a file (0 when missing).
    fn len(&mut self, name: &str) -> u64;
    /// For tests that look inside a backend.
    fn as_any(&self) -> &dyn std::any::Any;
    /// For tests that look inside a backend.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// A deferred `sync` (see [`Storage::syncer`]).
pub type Syncer = Box<dyn FnOnce() -> io::Result<()> + Send>;

/// Bytes written after which a sync also lets the file's cached pages go.
const DROP_CACHE_BYTES: u64 = 1 << 20;

/// A real directory.
pub struct DirStorage {
    dir: PathBuf,
    /// Files kept open for appending.
    open: HashMap<String, File>,
    /// What was written to each file since its cached pages were last let go.
    cached: HashMap<String, Cached>,
    /// Large writes waiting for their file's next sync (shared with the
    /// handles [`Storage::fork`] makes, whose syncs must cover them too).
    deferred: Arc<Mutex<HashMap<String, Arc<Deferred>>>>,
}

/// What [`DirStorage`] knows of a file's cached pages.
#[derive(Default)]
struct Cached {
    /// Bytes written since they were last let go.
    written: u64,
    /// Where the zeros written ahead begin: their pages stay cached, so
    /// the small writes over them do not read them back from the disk.
    zeros_from: Option<u64>,
}

impl DirStorage {
    pub fn new(dir: &Path) -> DirStorage {
        DirStorage { dir: dir.to_path_buf(), open: HashMap::new(), cached: HashMap::new(), deferred: Arc::default() }
    }

    /// Write out the deferred writes of `name` (a barrier before anything
    /// that reads, cuts, syncs or replaces it); `forget` also drops its
    /// queue (the name is replaced or removed).
    fn settle(&self, name: &str, forget: bool) -> io::Result<()> {
        let d = if forget { self.deferred.lock().remove(name) } else { self.deferred.lock().get(name).cloned() };
        d.map_or(Ok(()), |d| d.drain())
    }

    /// The deferred writer of `name`, made on first use.
    fn deferred(&mut self, name: &str) -> io::Result<Arc<Deferred>> {
        if let Some(d) = self.deferred.lock().get(name) {
            return Ok(d.clone());
        }
        let path = self.dir.join(name);
        let d = Arc::new(Deferred::open(&path, self.file(name)?)?);
        self.deferred.lock().insert(name.to_string(), d.clone());
        Ok(d)
    }

    fn file(&mut self, name: &str) -> io::Result<&mut File> {
        if !self.open.contains_key(name) {
            // Not O_APPEND: `write_at` writes where it is told.
            let f = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(self.dir.join(name))?;
            self.open.insert(name.to_string(), f);
        }
        Ok(self.open.get_mut(name).expect("just inserted"))
    }

    /// How much of `name` a sync should let go of from the page cache
    /// (see [`let_cache_go`]): none until a megabyte was written since the
    /// last time; then all of it (0: to the end) but the pages of the zeros
    /// written ahead.
    fn cache_to_drop(&mut self, name: &str) -> Option<u64> {
        let c = self.cached.get_mut(name)?;
        if c.written < DROP_CACHE_BYTES {
            return None;
        }
        c.written = 0;
        match c.zeros_from {
            Some(z) if z < 4096 => None,
            Some(z) => Some(z / 4096 * 4096),
            None => Some(0),
        }
    }

    /// Account for `len` bytes written at `offset` of `name`, `cached` of
    /// them through the page cache.
    fn wrote(&mut self, name: &str, offset: u64, len: u64, cached: u64) {
        let c = self.cached.entry(name.to_string()).or_default();
        c.written += cached;
        if let Some(z) = &mut c.zeros_from {
            *z = (*z).max(offset + len);
        }
    }
}

impl Storage for DirStorage {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn read(&mut self, name: &str) -> io::Result<Option<Vec<u8>>> {
        self.settle(name, false)?;
        let mut f = match File::open(self.dir.join(name)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(Some(v))
    }

    fn read_range(&mut self, name: &str, offset: u64, end: u64) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        self.settle(name, false)?;
        let f = match File::open(self.dir.join(name)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut v = vec![0; end.saturating_sub(offset) as usize];
        let mut got = 0;
        while got < v.len() {
            match f.read_at(&mut v[got..], offset + got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        v.truncate(got);
        Ok(v)
    }

    fn fork(&self) -> Option<Box<dyn Storage>> {
        let mut s = DirStorage::new(&self.dir);
        s.deferred = self.deferred.clone();
        Some(Box::new(s))
    }

    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        use std::io::{Seek, SeekFrom};
        let f = self.file(name)?;
        let at = f.seek(SeekFrom::End(0))?;
        f.write_all(data)?;
        self.wrote(name, at, data.len() as u64, data.len() as u64);
        Ok(())
    }

    /// Large writes (see [`direct`]): the unaligned ends through the page
    /// cache now, the aligned middle reserved now and written without the
    /// page cache by the file's next sync.
    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        if data.len() >= direct::DIRECT_MIN {
            let d = self.deferred(name)?;
            if d.direct() {
                let (head, mid, _) = direct::split(offset, data.len());
                d.queue(offset + head as u64, &data[head..head + mid])?;
                let f = self.file(name)?;
                f.write_all_at(&data[..head], offset)?;
                f.write_all_at(&data[head + mid..], offset + (head + mid) as u64)?;
                self.wrote(name, offset, data.len() as u64, (data.len() - mid) as u64);
                return Ok(());
            }
        }
        self.file(name)?.write_all_at(data, offset)?;
        self.wrote(name, offset, data.len() as u64, data.len() as u64);
        Ok(())
    }

    fn write_zeros(&mut self, name: &str, offset: u64, len: usize) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file(name)?.write_all_at(&vec![0; len], offset)?;
        self.cached.entry(name.to_string()).or_default().zeros_from = Some(offset);
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.settle(name, false)?;
        self.file(name)?.set_len(len)?;
        if let Some(c) = self.cached.get_mut(name) {
            c.zeros_from = c.zeros_from.filter(|&z| z < len);
        }
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.settle(name, false)?;
        self.file(name)?.sync_data()
    }

    fn syncer(&mut self, name: &str) -> io::Result<Syncer> {
        // A second descriptor of the same file: its fdatasync covers data
        // appended through the first.
        let f = self.file(name)?.try_clone()?;
        let drop_cache = self.cache_to_drop(name);
        let deferred = self.deferred.lock().get(name).cloned();
        Ok(Box::new(move || {
            if let Some(d) = deferred {
                d.drain()?;
            }
            f.sync_data()?;
            if let Some(len) = drop_cache {
                let_cache_go(&f, len);
            }
            Ok(())
        }))
    }

    fn write_new(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        self.settle(name, true)?;
        self.open.remove(name);
        self.cached.remove(name);
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).open(self.dir.join(name))?;
        f.write_all(data)?;
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.settle(from, true)?;
        self.settle(to, true)?;
        self.open.remove(from);
        self.open.remove(to);
        self.cached.remove(from);
        self.cached.remove(to);
        std::fs::rename(self.dir.join(from), self.dir.join(to))
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.settle(name, true)?;
        self.open.remove(name);
        self.cached.remove(name);
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn len(&mut self, name: &str) -> u64 {
        let _ = self.settle(name, false);
        std::fs::metadata(self.dir.join(name)).map(|m| m.len()).unwrap_or(0)
    }
}

/// One file of [`MemStorage`]: what a crash would keep and what it may lose.
#[derive(Debug, Clone, Default)]
struct MemFile {
    data: Vec<u8>,
    synced: Vec<u8>,
}

impl MemFile {
    /// The content a crash may leave (`keep` 0 to 3 picks one of these):
    /// the synced content and all of what was written since, and between
    /// them, for appends, the synced content plus half of what was
    /// appended (a torn tail); for writes within the file (over zeros
    /// written ahead), the first half of what changed (a torn tail) or only
    /// the second half (the pages written out of order: a hole, then data).
    fn crash_content(&self, keep: usize) -> Vec<u8> {
        let (data, synced) = (&self.data, &self.synced);
        if keep == 0 {
            return synced.clone();
        }
        if keep == 2 || data.len() < synced.len() {
            return data.clone();
        }
        if data.starts_with(synced) {
            let extra = data.len() - synced.len();
            return data[..synced.len() + extra * keep.min(2) / 2].to_vec();
        }
        let mut base = synced.clone();
        base.resize(data.len(), 0);
        let lo = (0..data.len()).find(|&i| data[i] != base[i]).unwrap_or(0);
        let hi = (0..data.len()).rfind(|&i| data[i] != base[i]).map_or(0, |i| i + 1);
        // Sectors of 512 bytes are written whole or not at all.
        let mid = ((lo + (hi - lo) / 2) / 512 * 512).clamp(lo, hi);
        let (from, to) = if keep == 1 { (lo, mid) } else { (mid, hi) };
        base[from..to].copy_from_slice(&data[from..to]);
        base
    }
}

/// An in-memory state directory that records, at every write and sync, the
/// images a crash at that instant could leave behind.
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    files: Vec<MemFile>,
    names: HashMap<String, usize>,
    durable_names: HashMap<String, usize>,
    /// Name changes since the last `sync_dir`, in order (`None`: removed).
    /// A crash may keep any subset of them: nothing orders directory
    /// updates that were not synced.
    name_ops: Vec<Vec<(String, Option<usize>)>>,
    /// Crash images recorded so far (when recording is on).
    pub images: Vec<MemStorage>,
    recording: bool,
    /// Fail the operation with this number (counting every call) with the
    /// given errno, once.
    pub fail_at: Option<(u64, i32)>,
    /// Operations so far.
    pub ops: u64,
    /// Syncs so far.
    pub syncs: u64,
}

impl MemStorage {
    /// Storage that records crash images at every operation.
    pub fn recording() -> MemStorage {
        MemStorage { recording: true, ..MemStorage::default() }
    }

    fn step(&mut self) -> io::Result<()> {
        self.ops += 1;
        if let Some((at, errno)) = self.fail_at {
            if at == self.ops {
                self.fail_at = None;
                return Err(io::Error::from_raw_os_error(errno));
            }
        }
        if self.recording {
            let images = self.crash_images();
            self.images.extend(images);
        }
        Ok(())
    }

    /// What the directory could look like after a crash now: the durable
    /// names with any subset of the unsynced name changes applied (in
    /// order; only none or all of them beyond 4), and each file's content
    /// as `MemFile::crash_content` makes it.
    pub fn crash_images(&self) -> Vec<MemStorage> {
        let n = self.name_ops.len();
        let masks: Vec<u32> = if n <= 4 { (0..1u32 << n).collect() } else { vec![0, u32::MAX] };
        let mut variants = Vec::new();
        for mask in masks {
            let mut names = self.durable_names.clone();
            for (k, op) in self.name_ops.iter().enumerate() {
                if mask & (1 << k.min(31)) != 0 {
                    for (name, target) in op {
                        match target {
                            Some(i) => names.insert(name.clone(), *i),
                            None => names.remove(name),
                        };
                    }
                }
            }
            variants.push(names);
        }
        let mut out = Vec::new();
        for names in &variants {
            for keep in [0usize, 1, 2, 3] {
                let mut files = Vec::new();
                let mut map = HashMap::new();
                for (name, &idx) in names {
                    let content = self.files[idx].crash_content(keep);
                    map.insert(name.clone(), files.len());
                    files.push(MemFile { data: content.clone(), synced: content });
                }
                out.push(MemStorage { files, names: map.clone(), durable_names: map, ..MemStorage::default() });
            }
        }
        out
    }

    fn idx(&mut self, name: &str) -> usize {
        if let Some(&i) = self.names.get(name) {
            return i;
        }
        self.files.push(MemFile::default());
        self.set_name(name, Some(self.files.len() - 1));
        self.files.len() - 1
    }

    fn set_name(&mut self, name: &str, target: Option<usize>) {
        self.set_names(&[(name, target)]);
    }

    /// One atomic directory update (a rename changes two names at once).
    fn set_names(&mut self, changes: &[(&str, Option<usize>)]) {
        for (name, target) in changes {
            match target {
                Some(i) => self.names.insert(name.to_string(), *i),
                None => self.names.remove(*name),
            };
        }
        self.name_ops.push(changes.iter().map(|(n, t)| (n.to_string(), *t)).collect());
    }
}

impl Storage for MemStorage {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn read(&mut self, name: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.names.get(name).map(|&i| self.files[i].data.clone()))
    }

    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        self.step()?;
        let i = self.idx(name);
        self.files[i].data.extend_from_slice(data);
        Ok(())
    }

    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        self.step()?;
        let i = self.idx(name);
        let f = &mut self.files[i].data;
        let end = offset as usize + data.len();
        if f.len() < end {
            f.resize(end, 0);
        }
        f[offset as usize..end].copy_from_slice(data);
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        self.step()?;
        let i = self.idx(name);
        self.files[i].data.truncate(len as usize);
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        self.step()?;
        self.syncs += 1;
        let i = self.idx(name);
        self.files[i].synced = self.files[i].data.clone();
        Ok(())
    }

    fn write_new(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        self.step()?;
        self.files.push(MemFile { data: data.to_vec(), synced: Vec::new() });
        self.set_name(name, Some(self.files.len() - 1));
        Ok(())
    }

    fn rename(&mut self, from: &str, to: &str) -> io::Result<()> {
        self.step()?;
        let i = *self.names.get(from).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        self.set_names(&[(from, None), (to, Some(i))]);
        Ok(())
    }

    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.step()?;
        if self.names.contains_key(name) {
            self.set_name(name, None);
        }
        Ok(())
    }

    fn sync_dir(&mut self) -> io::Result<()> {
        self.step()?;
        self.syncs += 1;
        self.durable_names = self.names.clone();
        self.name_ops.clear();
        Ok(())
    }

    fn len(&mut self, name: &str) -> u64 {
        self.names.get(name).map_or(0, |&i| self.files[i].data.len() as u64)
    }
}

/// What is appended is only read again at start-up: once written out, its
/// pages (the first `len` bytes; 0: all) are let go, a megabyte or more at
/// a time, so a large write does not leave a second copy in the page
/// cache, and later appends reuse that memory instead of taking fresh
/// memory.
fn let_cache_go(f: &File, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: an advisory call on a descriptor the caller owns.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, len as libc::off_t, libc::POSIX_FADV_DONTNEED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of the file at `path` in the page cache: before 2 MiB, and from there.
    fn resident_pages(path: &Path) -> (usize, usize) {
        use std::os::fd::AsRawFd;
        let f = File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        let pages = len.div_ceil(4096);
        // SAFETY: a read-only shared mapping of a file this test owns,
        // unmapped below; mincore only reports on it.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
            assert_ne!(p, libc::MAP_FAILED);
            let mut v = vec![0u8; pages];
            assert_eq!(libc::mincore(p, len, v.as_mut_ptr()), 0);
            libc::munmap(p, len);
            let count = |v: &[u8]| v.iter().filter(|&&b| b & 1 != 0).count();
            let split = v.len().min(512);
            (count(&v[..split]), count(&v[split..]))
        }
    }

    /// The journal is only read again at start-up: a sync after a
    /// megabyte or more was written lets its cached pages go, except those
    /// of the zeros written ahead (later small writes go there), and what
    /// was written stays readable.
    #[test]
    fn a_sync_lets_the_written_pages_go_but_not_the_zeros_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = DirStorage::new(dir.path());
        let chunk = vec![7u8; 1 << 20];
        s.append("j", &chunk).unwrap();
        s.write_at("j", 1 << 20, &chunk).unwrap();
        s.write_zeros("j", 2 << 20, 512 << 10).unwrap();
        let path = dir.path().join("j");
        assert_eq!(resident_pages(&path), (512, 128), "written pages start out cached");
        s.syncer("j").unwrap()().unwrap();
        assert_eq!(resident_pages(&path), (0, 128), "synced pages were let go, the zeros ahead were not");
        assert_eq!(s.read("j").unwrap().unwrap().len(), (2 << 20) + (512 << 10));
        // Without zeros ahead, all of it goes.
        s.write_at("j", 2 << 20, &chunk).unwrap();
        s.truncate("j", 3 << 20).unwrap();
        s.syncer("j").unwrap()().unwrap();
        assert_eq!(resident_pages(&path), (0, 0));
    }

    /// A large write reaches the file without the page cache (but for
    /// its unaligned ends) and is seen by every later read, by the sync of
    /// a forked handle, and by a truncate.
    #[test]
    fn a_large_write_is_written_by_the_next_sync_or_read_and_skips_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let mut s = DirStorage::new(dir.path());
        let pattern =
            |seed: u32, len: usize| -> Vec<u8> { (0..len as u32).map(|i| ((i + seed) % 251) as u8).collect() };
        let mib = 1 << 20;
        s.append("j", b"head").unwrap();
        let big = pattern(0, 5 * mib);
        s.write_at("j", 4, &big).unwrap();
        s.syncer("j").unwrap()().unwrap();
        let (before, after) = resident_pages(&path);
        assert!(before + after <= 2, "only the unaligned ends went through the page cache: {before} + {after}");
        assert!(std::fs::read(&path).unwrap()[4..] == big[..], "written by the sync");
        // A read is a barrier.
        let other = pattern(7, 5 * mib);
        s.write_at("j", 4, &other).unwrap();
        assert_eq!(s.len("j"), 4 + other.len() as u64);
        let got = s.read("j").unwrap().unwrap();
        assert!(got[..4] == *b"head" && got[4..] == other[..], "a read sees the deferred write");
        // A forked handle's sync (the snapshot thread's) covers the main
        // handle's deferred writes.
        let third = pattern(11, 3 * mib);
        s.write_at("j", 4, &third).unwrap();
        let mut fork = s.fork().unwrap();
        fork.sync("j").unwrap();
        assert!(std::fs::read(&path).unwrap()[4..4 + 3 * mib] == third[..], "written before the forked sync returned");
        // No deferred write lands after a truncate.
        s.write_at("j", 4, &big[..3 * mib]).unwrap();
        s.truncate("j", 100).unwrap();
        s.sync("j").unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len(), 100);
        assert!(on_disk[4..] == big[..96], "the write went before the cut");
    }

    #[test]
    fn crash_images_keep_synced_data_and_durable_names_only() {
        let mut s = MemStorage::default();
        s.append("j", b"aaaa").unwrap();
        s.sync("j").unwrap();
        s.sync_dir().unwrap();
        s.append("j", b"bbbb").unwrap();
        s.write_new("t", b"snap").unwrap();
        s.rename("t", "snapshot").unwrap();
        let images = s.crash_images();
        // Durable names: the journal with its synced prefix (plus some of
        // the unsynced tail), and no snapshot.
        let mut seen = Vec::new();
        for mut img in images {
            let j = img.read("j").unwrap().unwrap();
            assert!(j.starts_with(b"aaaa") && b"aaaabbbb".starts_with(&j[..]), "{j:?}");
            seen.push((j.len(), img.read("snapshot").unwrap()));
        }
        assert!(seen.contains(&(4, None)), "a crash may lose everything unsynced");
        assert!(seen.contains(&(6, Some(b"sn".to_vec()))), "torn tails are possible");
        assert!(seen.contains(&(8, Some(b"snap".to_vec()))));
    }

    #[test]
    fn injected_failures_fire_once_at_the_numbered_operation() {
        let mut s = MemStorage { fail_at: Some((2, libc::ENOSPC)), ..MemStorage::default() };
        s.append("j", b"a").unwrap();
        assert_eq!(s.append("j", b"b").unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        s.append("j", b"c").unwrap();
        assert_eq!(s.read("j").unwrap().unwrap(), b"ac");
    }

    #[test]
    fn dir_storage_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let mut s = DirStorage::new(d.path());
        assert_eq!(s.read("j").unwrap(), None);
        s.append("j", b"abc").unwrap();
        s.sync("j").unwrap();
        s.truncate("j", 2).unwrap();
        s.write_new("t", b"x").unwrap();
        s.sync("t").unwrap();
        s.rename("t", "u").unwrap();
        s.sync_dir().unwrap();
        assert_eq!(s.read("j").unwrap().unwrap(), b"ab");
        assert_eq!(s.read("u").unwrap().unwrap(), b"x");
        assert_eq!(s.len("u"), 1);
        s.remove("u").unwrap();
        s.remove("u").unwrap();
        assert_eq!(s.read("u").unwrap(), None);
    }
}
