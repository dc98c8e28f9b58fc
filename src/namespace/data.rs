//! Contents of regular files: sparse 4 KiB pages (holes and huge sizes cost
//! nothing, a page stores only its bytes up to the last one written), with
//! the pages changed since the last flush.

use super::pages::{Page, PageMap};
use super::*;
use std::collections::BTreeMap;

/// Content pages freed (truncated, punched, replaced or dropped with their
/// file) since the memory was last handed back to the system.
pub(super) static FREED_PAGES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(super) fn freed(pages: usize) {
    FREED_PAGES.fetch_add(pages as u64, std::sync::atomic::Ordering::Relaxed);
}

/// Contents of a regular file: sparse pages, so holes and huge sizes cost
/// nothing.
#[derive(Debug, Default, Clone)]
pub struct Data {
    pub(super) size: u64,
    pub(super) pages: PageMap,
    /// Pages changed since the last flush, when the namespace is durable.
    pub(super) dirty: Option<DirtyPages>,
    /// What a power cut would leave (the size and the pages changed since
    /// the last `fsync`/`fdatasync`), while the test bench tracks it.
    pub(super) synced: Option<Box<Synced>>,
}

/// A file's contents as of its last sync, kept as the pages changed since
/// (cost in proportion to what changed, not to the file).
#[derive(Debug, Default, Clone)]
pub(super) struct Synced {
    pub(super) size: u64,
    /// Each page changed since, as it was then (`None`: a hole).
    pub(super) pages: BTreeMap<u64, Option<Page>>,
}

/// Indices of pages changed since the last flush. The one page of a small
/// file is kept inline: a namespace of a million leases written since the
/// last flush allocates (and, once flushed, frees) nothing per file, which
/// would leave the allocator a million small chunks to sort out on the
/// request path.
#[derive(Debug, Default, Clone)]
pub enum DirtyPages {
    #[default]
    Clean,
    One(u64),
    Many(BTreeSet<u64>),
}

impl DirtyPages {
    pub fn insert(&mut self, idx: u64) {
        match self {
            DirtyPages::Clean => *self = DirtyPages::One(idx),
            DirtyPages::One(i) if *i == idx => {}
            DirtyPages::One(i) => *self = DirtyPages::Many(BTreeSet::from([*i, idx])),
            DirtyPages::Many(set) => {
                set.insert(idx);
            }
        }
    }

    pub fn extend(&mut self, idx: impl IntoIterator<Item = u64>) {
        for i in idx {
            self.insert(i);
        }
    }

    /// The indices, each once, in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        let (one, many) = match self {
            DirtyPages::Clean => (None, None),
            DirtyPages::One(i) => (Some(*i), None),
            DirtyPages::Many(set) => (None, Some(set.iter().copied())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

impl Data {
    /// Keep page `idx` as it was at the last sync before it changes.
    fn keep(&mut self, idx: u64) {
        if let Some(s) = &mut self.synced {
            s.pages.entry(idx).or_insert_with(|| self.pages.get(idx).cloned());
        }
    }

    /// Current size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Pages actually stored (for `st_blocks` and `statfs`).
    pub fn pages(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Pages a write or allocation of `len` bytes at `offset` would add.
    pub fn new_pages(&self, offset: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let first = offset / PAGE as u64;
        let last = offset.saturating_add(len - 1) / PAGE as u64;
        let span = last - first + 1;
        // Counting what is stored is bounded by what the file has, not by the span.
        span - self.pages.range(first..=last).count() as u64
    }

    /// Store zero pages for every hole in `[offset, offset + len)` (what
    /// `fallocate` reserves), without changing the size.
    pub fn allocate(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = offset / PAGE as u64;
        let last = offset.saturating_add(len - 1) / PAGE as u64;
        for idx in first..=last {
            if !self.pages.contains(idx) {
                self.keep(idx);
                self.pages.insert(idx, Page::default());
                if let Some(d) = &mut self.dirty {
                    d.insert(idx);
                }
            }
        }
    }

    /// Read up to `len` bytes at `offset`; holes read as zeros.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.read_into(offset, len, &mut out);
        out
    }

    /// [`Data::read`] into `out` (cleared first), so a caller that keeps
    /// one buffer for its reads touches no fresh memory per read: a large
    /// read into a new allocation costs a page fault per 4 KiB, more than
    /// the copy.
    pub fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) {
        out.clear();
        if offset >= self.size {
            return;
        }
        let end = self.size.min(offset.saturating_add(len as u64));
        out.reserve((end - offset) as usize);
        let first = offset / PAGE as u64;
        let last = (end - 1) / PAGE as u64;
        // Holes and the bytes past a page's stored length read as zeros.
        for (idx, page) in self.pages.range(first..=last) {
            let page_start = idx * PAGE as u64;
            let from = offset.max(page_start);
            let to = end.min(page_start + page.len() as u64);
            if from < to {
                out.resize((from - offset) as usize, 0);
                out.extend_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
            }
        }
        out.resize((end - offset) as usize, 0);
    }

    /// Write `buf` at `offset`, growing the file as needed.
    pub fn write(&mut self, offset: u64, buf: &[u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset.checked_add(buf.len() as u64).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let mut pos = offset;
        let mut rest = buf;
        while !rest.is_empty() {
            let idx = pos / PAGE as u64;
            let in_page = (pos % PAGE as u64) as usize;
            let n = rest.len().min(PAGE - in_page);
            if let Some(d) = &mut self.dirty {
                d.insert(idx);
            }
            self.keep(idx);
            let page = self.pages.page_mut(idx, in_page + n);
            page[in_page..in_page + n].copy_from_slice(&rest[..n]);
            pos += n as u64;
            rest = &rest[n..];
        }
        self.size = self.size.max(end);
        Ok(())
    }

    /// Set the size; bytes beyond a shrink are gone and read as zeros if the
    /// file grows again.
    pub fn truncate(&mut self, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        if size < self.size {
            let keep = size.div_ceil(PAGE as u64);
            if self.synced.is_some() {
                let changed: Vec<u64> = self.pages.range(size / PAGE as u64..=u64::MAX).map(|(i, _)| i).collect();
                for idx in changed {
                    self.keep(idx);
                }
            }
            let gone = self.pages.split_off(keep);
            freed(gone.len());
            if let Some(d) = &mut self.dirty {
                d.extend(gone);
                if !size.is_multiple_of(PAGE as u64) {
                    d.insert(size / PAGE as u64);
                }
            }
            let tail = (size % PAGE as u64) as usize;
            if tail != 0 {
                if let Some(page) = self.pages.get_mut(size / PAGE as u64) {
                    if page.len() > tail {
                        // Keep only the bytes below the new end.
                        *page = page[..tail].into();
                    }
                }
            }
        }
        self.size = size;
        Ok(())
    }

    /// Zero a range without changing the size (punch hole).
    pub fn zero_range(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.size);
        let mut pos = offset;
        while pos < end {
            let idx = pos / PAGE as u64;
            let in_page = (pos % PAGE as u64) as usize;
            let n = ((end - pos) as usize).min(PAGE - in_page);
            if let Some(d) = &mut self.dirty {
                d.insert(idx);
            }
            self.keep(idx);
            if in_page == 0 && n == PAGE {
                if self.pages.remove(idx) {
                    freed(1);
                }
            } else if let Some(page) = self.pages.get_mut(idx) {
                let stored = page.len();
                page[in_page.min(stored)..(in_page + n).min(stored)].fill(0);
            }
            pos += n as u64;
        }
    }

    /// `SEEK_DATA`: the first offset at or after `from` inside a stored
    /// page; `None` (ENXIO) at or past the end or when only holes follow.
    pub fn seek_data(&self, from: u64) -> Option<u64> {
        if from >= self.size {
            return None;
        }
        let (idx, _) = self.pages.range(from / PAGE as u64..=u64::MAX).next()?;
        let off = (idx * PAGE as u64).max(from);
        (off < self.size).then_some(off)
    }

    /// `SEEK_HOLE`: the first offset at or after `from` in a hole (the end
    /// of the file counts as one); `None` (ENXIO) at or past the end.
    pub fn seek_hole(&self, from: u64) -> Option<u64> {
        if from >= self.size {
            return None;
        }
        let mut idx = from / PAGE as u64;
        for (i, _) in self.pages.range(idx..=u64::MAX) {
            if i != idx {
                break;
            }
            idx += 1;
        }
        Some((idx * PAGE as u64).max(from).min(self.size))
    }

    /// Replace the whole content with `other`'s.
    pub fn replace_with(&mut self, other: Data) {
        if self.synced.is_some() {
            let changed: Vec<u64> = self.pages.keys().chain(other.pages.keys()).collect();
            for idx in changed {
                self.keep(idx);
            }
        }
        let mut dirty = self.dirty.take();
        if let Some(d) = &mut dirty {
            d.extend(self.pages.keys());
            d.extend(other.pages.keys());
        }
        freed(self.pages.len());
        self.size = other.size;
        self.pages = other.pages;
        self.dirty = dirty;
    }

    /// The stored bytes of the page at `idx` (the rest of the page reads as
    /// zeros), if stored (for persisting).
    pub fn page(&self, idx: u64) -> Option<&[u8]> {
        self.pages.get(idx).map(|p| &**p)
    }

    /// Stored pages from index `idx` on (an image encoded a slice at a
    /// time resumes there).
    pub fn pages_from(&self, idx: u64) -> impl Iterator<Item = (u64, &[u8])> {
        self.pages.range(idx..=u64::MAX).map(|(i, p)| (i, &**p))
    }

    /// Stored page indices (for persisting).
    pub fn page_indices(&self) -> impl Iterator<Item = u64> + '_ {
        self.pages.keys()
    }

    /// Put a recovered page back (`None` makes a hole). Trailing zeros are
    /// not kept: they read as zeros anyway.
    pub fn restore_page(&mut self, idx: u64, bytes: Option<&[u8]>) {
        match bytes {
            None => {
                self.pages.remove(idx);
            }
            Some(b) => {
                let b = &b[..b.len().min(PAGE)];
                let n = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
                self.pages.insert(idx, b[..n].into());
            }
        }
    }

    /// Set a recovered size: pages beyond it are dropped.
    pub fn restore_size(&mut self, size: u64) {
        let keep = size.div_ceil(PAGE as u64);
        self.pages.split_off(keep);
        self.size = size;
    }

    /// Pages changed since the last flush.
    pub fn dirty_pages(&self) -> impl Iterator<Item = u64> + '_ {
        self.dirty.iter().flat_map(DirtyPages::iter)
    }
}
