//! Large journal writes without the page cache, off the request path.
//!
//! A batch of file content appended to the journal (megabytes at a time
//! while a large file is written) would otherwise be copied into the page
//! cache under the state lock, only to be written out by the next sync
//! and dropped. On a VM that copy dominates a large durable write: each
//! batch lands in freshly allocated page-cache pages (the guest hands
//! freed pages back to the host, so they are fresh to it again); perf put
//! 48 % of the daemon in `copy_folio_from_iter_atomic` during a 256 MiB
//! `dd ... conv=fsync` written that way.
//!
//! `Deferred` keeps the aligned middle of such a write (whole 4 KiB
//! blocks at 4 KiB-aligned offsets) in a page-aligned buffer it reuses,
//! after reserving the bytes on disk with `fallocate` (so a full disk is
//! still `ENOSPC` at the write, not a failed sync later). The bytes reach
//! the file with `O_DIRECT` (the disk reads them from that buffer), written
//! by whichever comes first:
//! - the file's next sync, on the group-commit thread, before its
//!   `fdatasync` (so what a sync promises was written first), or
//! - any other operation on the file (a drain is a barrier:
//!   reads, truncates, renames and removals see every write before them).
//!
//! Writes go to disjoint ranges, so their order among themselves does not
//! matter; a crash before one is written leaves zeros (the space
//! `fallocate` reserved), which recovery takes as a torn tail, as it takes
//! the zeros written ahead. Queued bytes are bounded (32 MiB a file): past
//! it the writer writes them itself. A file system that refuses `O_DIRECT`
//! (or its alignment) gets the same bytes through the page cache.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;

use parking_lot::Mutex;

use crate::failpoints::injected_errno;

/// Direct I/O alignment of offsets, lengths and memory: 4 KiB covers the
/// logical block size of every disk (512 B or 4 KiB) and a whole
/// file-system block, so no write shares a block with a buffered one.
pub(crate) const ALIGN: usize = 4096;

/// Writes at least this large take the direct path.
pub(crate) const DIRECT_MIN: usize = 2 << 20;

/// The most bytes queued for one file before its writer writes them itself.
const MAX_QUEUED: usize = 32 << 20;

/// Spare buffers kept for reuse (write-back batches are 8 MiB, one or two
/// queued at a time: what a large write leaves resident stays small).
const SPARE: usize = 2;

/// A page-aligned heap buffer.
struct Aligned {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: the buffer owns its allocation; nothing else points into it.
unsafe impl Send for Aligned {}

impl Aligned {
    /// A buffer holding a copy of `data`, reusing `spare` when it is large
    /// enough.
    fn copy_of(data: &[u8], spare: Option<Aligned>) -> Aligned {
        let mut buf = match spare {
            Some(b) if b.cap >= data.len() => b,
            _ => Aligned::with_capacity(data.len().next_multiple_of(1 << 20)),
        };
        // SAFETY: `buf` has room for `data.len()` bytes, which do not
        // overlap `data` (a separate allocation).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr.as_ptr(), data.len()) };
        buf.len = data.len();
        buf
    }

    fn with_capacity(cap: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(cap.max(ALIGN), ALIGN).expect("a valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Aligned { ptr, cap: layout.size(), len: 0 }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the first `len` bytes were written by `copy_of`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.cap, ALIGN).expect("made by with_capacity");
        // SAFETY: allocated by `with_capacity` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// The parts of a write of `len` bytes at `offset`: the bytes before the
/// first aligned block, the aligned blocks, and the rest (lengths).
pub(crate) fn split(offset: u64, len: usize) -> (usize, usize, usize) {
    let head = ((ALIGN as u64 - offset % ALIGN as u64) % ALIGN as u64).min(len as u64) as usize;
    let mid = (len - head) / ALIGN * ALIGN;
    (head, mid, len - head - mid)
}

#[derive(Default)]
struct Queue {
    writes: VecDeque<(u64, Aligned)>,
    queued: usize,
    spare: Vec<Aligned>,
    /// The errno of the first write that failed: every later drain
    /// reports it (the sync that covers the write must see it, whatever
    /// drained first).
    failed: Option<i32>,
}

/// The deferred direct writes of one file (shared with its syncers).
pub(crate) struct Deferred {
    /// Opened with `O_DIRECT` (none: the file system refused it).
    direct: Option<File>,
    /// The same file through the page cache (the fallback).
    buffered: File,
    queue: Mutex<Queue>,
    /// Held for a whole drain, so a drain that returns has seen every
    /// write queued before it complete (not merely taken by another).
    draining: Mutex<()>,
}

impl Deferred {
    /// For the file at `path`, opened as `buffered` by its storage.
    pub(crate) fn open(path: &Path, buffered: &File) -> io::Result<Deferred> {
        // Failpoint `direct-open`: a file system that refuses O_DIRECT.
        let direct = injected_errno("direct-open", libc::EINVAL)
            .and_then(|()| OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path))
            .ok();
        Ok(Deferred { direct, buffered: buffered.try_clone()?, queue: Mutex::default(), draining: Mutex::new(()) })
    }

    /// True when the file takes direct writes.
    pub(crate) fn direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Queue `data` (aligned: see [`split`]) for `offset`, after reserving
    /// its blocks. Writes the queue out first when it is full.
    pub(crate) fn queue(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        debug_assert!(offset.is_multiple_of(ALIGN as u64) && data.len().is_multiple_of(ALIGN));
        reserve(&self.buffered, offset, data.len())?;
        if self.queue.lock().queued + data.len() > MAX_QUEUED {
            self.drain()?;
        }
        let mut q = self.queue.lock();
        let spare = q.spare.pop();
        let buf = Aligned::copy_of(data, spare);
        q.queued += data.len();
        q.writes.push_back((offset, buf));
        Ok(())
    }

    /// Write everything queued and wait for writes another thread took;
    /// an error once any write failed.
    pub(crate) fn drain(&self) -> io::Result<()> {
        let _whole = self.draining.lock();
        loop {
            let Some((offset, buf)) = self.queue.lock().writes.pop_front() else { break };
            let r = self.write(offset, buf.bytes());
            let mut q = self.queue.lock();
            q.queued -= buf.len;
            if q.spare.len() < SPARE {
                q.spare.push(buf);
            }
            if let Err(e) = r {
                q.failed.get_or_insert(e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
        match self.queue.lock().failed {
            Some(errno) => Err(io::Error::from_raw_os_error(errno)),
            None => Ok(()),
        }
    }

    fn write(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        if let Some(f) = &self.direct {
            // Failpoint `direct-write`: every direct write refused.
            match injected_errno("direct-write", libc::EINVAL).and_then(|()| f.write_all_at(bytes, offset)) {
                // Alignment the file system does not take: through the
                // page cache instead (written over whatever part went).
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                r => return r,
            }
        }
        self.buffered.write_all_at(bytes, offset)
    }
}

/// Allocate `len` bytes of `f` at `offset` (growing the file), so writing
/// them later cannot meet a full disk. File systems without `fallocate`
/// reserve nothing.
fn reserve(f: &File, offset: u64, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor the caller owns.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, offset as libc::off_t, len as libc::off_t) };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Ok(()),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_splits_into_its_unaligned_ends_and_aligned_blocks() {
        assert_eq!(split(0, 3 * ALIGN), (0, 3 * ALIGN, 0));
        assert_eq!(split(100, 3 * ALIGN), (ALIGN - 100, 2 * ALIGN, 100));
        assert_eq!(split(100, 50), (50, 0, 0));
        assert_eq!(split(ALIGN as u64, ALIGN + 7), (0, ALIGN, 7));
        assert_eq!(split(1, ALIGN - 1), (ALIGN - 1, 0, 0));
    }

    #[test]
    fn queued_writes_reach_the_file_on_drain_and_reuse_their_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let f = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).unwrap();
        let d = Deferred::open(&path, &f).unwrap();
        let a = vec![1u8; 3 * ALIGN];
        let b = vec![2u8; 2 * ALIGN];
        d.queue(ALIGN as u64, &a).unwrap();
        d.queue(5 * ALIGN as u64, &b).unwrap();
        // Reserved (so the size is right) but not written yet.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 7 * ALIGN as u64);
        assert!(std::fs::read(&path).unwrap().iter().all(|&x| x == 0));
        d.drain().unwrap();
        let got = std::fs::read(&path).unwrap();
        assert!(got[..ALIGN].iter().all(|&x| x == 0));
        assert!(got[ALIGN..4 * ALIGN].iter().all(|&x| x == 1));
        assert!(got[5 * ALIGN..].iter().all(|&x| x == 2));
        assert_eq!(d.queue.lock().spare.len(), 2, "both buffers are kept for reuse");
        d.queue(0, &b).unwrap();
        assert_eq!(d.queue.lock().spare.len(), 1, "a spare buffer was reused");
        d.drain().unwrap();
        assert!(std::fs::read(&path).unwrap()[..2 * ALIGN].iter().all(|&x| x == 2));
    }

    /// Whatever drains first (a read's barrier, another sync), the sync
    /// that covers a failed write must fail too.
    #[test]
    fn a_failed_write_fails_every_later_drain() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j");
        let f = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(&path).unwrap();
        // A direct descriptor that cannot write: EBADF.
        let d = Deferred {
            direct: Some(File::open(&path).unwrap()),
            buffered: f,
            queue: Mutex::default(),
            draining: Mutex::new(()),
        };
        d.queue(0, &[1u8; ALIGN]).unwrap();
        assert_eq!(d.drain().unwrap_err().raw_os_error(), Some(libc::EBADF));
        assert_eq!(d.drain().unwrap_err().raw_os_error(), Some(libc::EBADF), "still failed");
    }
}
