//! Encoding the namespace into journal batches and snapshots: what changed
//! since the last flush, everything at once (tests), or streamed in slices
//! a few milliseconds long, so a large snapshot never holds the state lock
//! for long.

use std::io;
use std::os::unix::ffi::OsStrExt;

use crate::namespace::{Body, Ino, Inode, Namespace};
use crate::store::records::{Enc, Extra};

/// Encode what changed in `ns` since the last flush as one batch.
pub fn encode_changes(ns: &Namespace, extra: impl Fn(Ino) -> Extra) -> Vec<u8> {
    encode_changes_into(ns, extra, Vec::new())
}

/// [`encode_changes`] into `buf` (emptied first): a flush reuses one
/// buffer, so a batch does not touch fresh memory every time.
pub fn encode_changes_into(ns: &Namespace, extra: impl Fn(Ino) -> Extra, mut buf: Vec<u8>) -> Vec<u8> {
    buf.clear();
    let mut e = Enc::with_buf(buf);
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

/// [`encode_streamed`] into one buffer (tests).
#[cfg(test)]
pub fn encode_all(e: Enc, ns: &Namespace, extra: impl Fn(Ino) -> Extra) -> Vec<u8> {
    let mut img = Vec::new();
    encode_streamed(e, ns, extra, &mut |piece| {
        img.extend_from_slice(piece);
        Ok(())
    })
    .expect("a Vec takes every piece");
    img
}

/// Encode the whole namespace after `e` (the snapshot's head), handing the
/// image to `out` a piece of about `PIECE` bytes at a time through one
/// reused buffer, so no buffer as large as the namespace is allocated (at a
/// million leases the image is over 200 MB, and touching that much fresh
/// memory costs more than encoding it). The lock is held throughout: the
/// image is exact, not fuzzy. Its size.
pub fn encode_streamed(
    mut e: Enc,
    ns: &Namespace,
    extra: impl Fn(Ino) -> Extra,
    out: &mut dyn FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<u64> {
    e.buf.reserve(PIECE + PIECE / 4);
    let mut bytes = 0;
    // After each record: hand over a full piece, keep the buffer.
    let mut cut = |e: &mut Enc, most: usize| -> io::Result<()> {
        if e.buf.len() >= most {
            out(&e.buf)?;
            bytes += e.buf.len() as u64;
            e.buf.clear();
        }
        Ok(())
    };
    // In the maps' order (looking a million numbers up one by one would
    // cost more than encoding them).
    for i in ns.inodes() {
        e.inode(i, &extra(i.ino));
        cut(&mut e, PIECE)?;
        match &i.body {
            Body::File(d) => {
                for idx in d.page_indices() {
                    e.page(i.ino, idx, d.page(idx));
                    cut(&mut e, PIECE)?;
                }
            }
            Body::Dir(d) => {
                for (n, c) in d.iter() {
                    e.entry(i.ino, n.as_bytes(), Some(c));
                    cut(&mut e, PIECE)?;
                }
            }
            _ => {}
        }
    }
    e.commit(ns.next_ino());
    cut(&mut e, 0)?;
    Ok(bytes)
}

/// A snapshot image encoded a slice at a time, the state lock released
/// between slices, so requests never wait for a whole image: a fuzzy
/// image. Each inode is encoded as it is when its slice runs, at some
/// moment after the image's base; inodes created later are not in it.
///
/// Why recovery still gets the namespace right: every slice runs when the
/// namespace holds nothing that is not appended to the journal (the caller
/// flushes first), so each inode's records in the image are its state after
/// some batch at or after the base; the journal after the base holds every
/// change since, as whole states (an inode, a page, one directory entry
/// set or unset, an inode freed), and replaying it over the image leaves
/// each of them as its last batch made it, and the rest as the image has
/// them, which is how they were at the base. [`write_snapshot`](super::snapshot::write_snapshot) syncs that
/// journal before installing the image.
pub struct Slices {
    pub(super) e: Enc,
    /// Full pieces of the image (a piece holds whole records).
    pub(super) pieces: Vec<Vec<u8>>,
    /// The next inode number to encode, and the first one allocated after
    /// the base (later inodes are in the journal only).
    pub(super) next: u64,
    pub(super) end: u64,
    /// A directory whose entries, or a file whose pages, are being encoded:
    /// the cookie or page index to go on from (a directory of a million
    /// leases takes many slices).
    pub(super) within: Option<(Ino, u64)>,
    /// Bytes in a piece ([`PIECE`]) and entries or pages in a run
    /// ([`RUN`]).
    pub(super) piece: usize,
    pub(super) run: usize,
    /// Records encoded between two looks at the clock ([`CHECK`]).
    pub(super) check: usize,
}

/// Bytes in one piece of an image encoded in slices: no buffer as large as
/// the namespace is allocated, grown or copied under the state lock.
pub(super) const PIECE: usize = 1 << 20;
/// Entries or pages of one inode encoded at a time.
pub(super) const RUN: usize = 1024;
/// Records (inodes, entries, pages) encoded between two looks at the
/// clock.
pub(super) const CHECK: usize = 64;

impl Slices {
    /// Start an image after `head` (from [`Store::begin_snapshot`](super::snapshot::Store::begin_snapshot)) of the
    /// inodes `ns` has now. Inode numbers are handed out in order and never
    /// reused, so the image walks the numbers below the next one rather
    /// than listing a million keys at once (a number whose inode is gone
    /// costs one failed lookup).
    pub fn new(head: Enc, ns: &Namespace) -> Slices {
        Slices {
            e: head,
            pieces: Vec::new(),
            next: Ino::ROOT.0,
            end: ns.next_ino(),
            within: None,
            piece: PIECE,
            run: RUN,
            check: CHECK,
        }
    }

    /// Encode for about `budget`; true once everything is.
    pub fn step(&mut self, ns: &Namespace, extra: impl Fn(Ino) -> Extra, budget: std::time::Duration) -> bool {
        let started = std::time::Instant::now();
        // Records encoded since the clock was last read: every inode, page
        // and entry counts (a slice of small directories is mostly entries).
        let mut work = 0;
        loop {
            if let Some((ino, from)) = self.within.take() {
                // Gone since its record was encoded: the journal frees it.
                if let Ok(i) = ns.get(ino) {
                    let (within, n) = self.run_within(i, from);
                    self.within = within;
                    work += n;
                }
                work += 1;
            } else if self.next < self.end {
                // Freed since the base: the journal frees it too.
                if let Ok(i) = ns.get(Ino(self.next)) {
                    self.e.inode(i, &extra(i.ino));
                    self.cut();
                    let (within, n) = self.run_within(i, 0);
                    self.within = within;
                    work += n;
                }
                self.next += 1;
                work += 1;
            } else {
                return true;
            }
            if work >= self.check {
                work = 0;
                if started.elapsed() >= budget {
                    return false;
                }
            }
        }
    }

    /// Encode up to [`RUN`] of the entries or pages of `i` from `from` on:
    /// where to go on, if there are more, and how many were encoded.
    pub(super) fn run_within(&mut self, i: &Inode, from: u64) -> (Option<(Ino, u64)>, usize) {
        let mut n = 0;
        match &i.body {
            Body::File(d) => {
                for (idx, page) in d.pages_from(from) {
                    if n == self.run {
                        return (Some((i.ino, idx)), n);
                    }
                    self.e.page(i.ino, idx, Some(page));
                    self.cut();
                    n += 1;
                }
            }
            Body::Dir(d) => {
                for (cookie, name, child) in d.from_cookie(from) {
                    if n == self.run {
                        return (Some((i.ino, cookie)), n);
                    }
                    self.e.entry(i.ino, name.as_bytes(), Some(child));
                    self.cut();
                    n += 1;
                }
            }
            _ => {}
        }
        (None, n)
    }

    /// Start a new piece once this one is full.
    pub(super) fn cut(&mut self) {
        if self.e.buf.len() >= self.piece {
            let full = std::mem::replace(&mut self.e.buf, Vec::with_capacity(self.piece + self.piece / 4));
            self.pieces.push(full);
        }
    }

    /// The image, in pieces, once [`Slices::step`] returned true.
    pub fn finish(mut self, ns: &Namespace) -> Vec<Vec<u8>> {
        self.e.commit(ns.next_ino());
        self.pieces.push(self.e.buf);
        self.pieces
    }
}
