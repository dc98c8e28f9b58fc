//! The record codec of the namespace journal and snapshot.
//!
//! Record frame: `u32 length, u32 crc32(length), u32 crc32(payload), payload`
//! (a torn append leaves a prefix, so a bad length is corruption); the
//! payload starts with a tag byte. Integers are little-endian. A batch is a
//! run of records ending with a commit record; only whole batches count.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::namespace::{Body, Data, Ino, Inode, Kind};

/// Frame header: payload length, CRC of the length, CRC of the payload.
pub(super) const FRAME: usize = 12;

pub(super) const T_HEADER: u8 = 0;
pub(super) const T_INODE: u8 = 1;
pub(super) const T_PAGE: u8 = 2;
pub(super) const T_ENTRY: u8 = 3;
pub(super) const T_FREE: u8 = 4;
pub(super) const T_COMMIT: u8 = 5;
/// In a snapshot written while the journal went on: which journal
/// (generation) it includes, up to which byte offset.
pub(super) const T_BASE: u8 = 6;

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
    /// An encoder appending to `buf`.
    pub fn with_buf(buf: Vec<u8>) -> Enc {
        Enc { buf, start: 0 }
    }
    pub(super) fn begin(&mut self, tag: u8) {
        self.start = self.buf.len();
        self.buf.extend_from_slice(&[0u8; FRAME]);
        self.buf.push(tag);
    }
    pub(super) fn end(&mut self) {
        let payload = &self.buf[self.start + FRAME..];
        let (len, crc) = (payload.len() as u32, crc32(payload));
        let at = self.start;
        self.buf[at..at + 4].copy_from_slice(&len.to_le_bytes());
        self.buf[at + 4..at + 8].copy_from_slice(&crc32(&len.to_le_bytes()).to_le_bytes());
        self.buf[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
    }
    pub(super) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.buf.extend_from_slice(b);
    }
    pub(super) fn time(&mut self, t: SystemTime) {
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

    pub(super) fn header(&mut self, generation: u64) {
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
        // A directory's size is its number of entries: recovery sizes its
        // name tables once instead of growing them a name at a time.
        let (size, target): (u64, &[u8]) = match &i.body {
            Body::File(d) => (d.size(), b""),
            Body::Dir(d) => (d.len() as u64, b""),
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

    /// One page of a file: its stored bytes (the rest of the page reads as
    /// zeros); `None` is a hole, and a stored page without bytes (reserved
    /// by `fallocate`) is written as one zero byte so it is not one.
    pub fn page(&mut self, ino: Ino, idx: u64, page: Option<&[u8]>) {
        self.begin(T_PAGE);
        self.u64(ino.0);
        self.u64(idx);
        self.bytes(match page {
            None => &[][..],
            Some([]) => &[0][..],
            Some(p) => p,
        });
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

pub(super) fn kind_code(k: Kind) -> u8 {
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

pub(super) fn kind_of(c: u8) -> Option<Kind> {
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

pub(super) struct Dec<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    pub(super) fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    pub(super) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(super) fn time(&mut self) -> Option<SystemTime> {
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
pub(super) enum Rec {
    Header(u64, SystemTime),
    Inode(Box<Inode>, u64, Extra),
    Page(Ino, u64, Vec<u8>),
    Entry(Ino, OsString, Option<Ino>),
    Free(Ino),
    Commit(u64),
    Base(u64, u64),
}

pub(super) fn decode(payload: &[u8]) -> Option<Rec> {
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
                Kind::Dir => Body::Dir(Box::new(crate::namespace::Dir::empty(ino))),
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

/// How a file's records end.
pub(super) enum Scan {
    /// Every record good; the offset just past the last commit.
    Clean(u64),
    /// A torn tail from this offset (records after the last commit, a
    /// partial or bad last record, zeros to the end).
    Torn(u64),
}

/// Walk the framed records of `image`, handing each committed batch to
/// `batch`. `Err(offset)` for corruption before the tail.
pub(super) fn scan(image: &[u8], mut batch: impl FnMut(Vec<Rec>)) -> Result<Scan, u64> {
    let mut pending = Vec::new();
    scan_each(image, |rec| {
        let end = matches!(rec, Rec::Commit(_));
        pending.push(rec);
        if end {
            batch(std::mem::take(&mut pending));
        }
    })
}

/// [`scan`], handing over each record as it is decoded, before the commit
/// that ends its batch is seen: for an image that must be whole (a
/// snapshot), which is refused altogether unless this returns
/// `Scan::Clean`.
pub(super) fn scan_each(image: &[u8], mut each: impl FnMut(Rec)) -> Result<Scan, u64> {
    let mut pos = 0usize;
    let mut committed = 0usize;
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
            // A torn append leaves a prefix, never a wrong length; a write
            // over zeros written ahead may leave the zeros.
            return if unwritten_sector(image, pos, pos + FRAME) { torn(()) } else { Err(pos as u64) };
        }
        if len > rest.len() - FRAME {
            return torn(());
        }
        let payload = &rest[FRAME..FRAME + len];
        let is_last = FRAME + len == rest.len();
        let rec = if crc32(payload) == crc { decode(payload) } else { None };
        let Some(rec) = rec else {
            let torn_here = is_last || unwritten_sector(image, pos, pos + FRAME + len);
            return if torn_here { torn(()) } else { Err(pos as u64) };
        };
        pos += FRAME + len;
        let end = matches!(rec, Rec::Commit(_));
        each(rec);
        if end {
            committed = pos;
        }
    }
    Ok(if committed == image.len() { Scan::Clean(committed as u64) } else { Scan::Torn(committed as u64) })
}

/// True when a 512-byte sector of `image` overlapping the record at
/// `pos..end` holds only zeros from `pos` on: a sector a crash did not let
/// reach the disk, over zeros written ahead of the journal's end (disks
/// write a sector whole or not at all; a record that fails its checksum
/// without such a sector is corruption). Like the torn-write check of
/// etcd's write-ahead log, which also writes over space made ahead.
fn unwritten_sector(image: &[u8], pos: usize, end: usize) -> bool {
    const SECTOR: usize = 512;
    let end = end.min(image.len());
    let mut at = pos / SECTOR * SECTOR;
    while at < end.max(pos + 1) {
        let chunk = &image[at.max(pos)..(at + SECTOR).min(image.len())];
        if !chunk.is_empty() && chunk.iter().all(|&b| b == 0) {
            return true;
        }
        at += SECTOR;
    }
    false
}

/// One inode as a self-contained value (the etcd backend stores each
/// inode under a key of its own): its inode record, then its pages.
/// Directory entries are not included.
pub fn encode_object(i: &Inode, extra: &Extra) -> Vec<u8> {
    let mut e = Enc::default();
    e.inode(i, extra);
    if let Body::File(d) = &i.body {
        for idx in d.page_indices() {
            e.page(i.ino, idx, d.page(idx));
        }
    }
    e.buf
}

/// Decode what [`encode_object`] wrote (`None`: not such a value). The
/// inode's number and link count are meaningless to the reader.
pub fn decode_object(image: &[u8]) -> Option<(Box<Inode>, Extra)> {
    let mut pos = 0usize;
    let mut inode: Option<(Box<Inode>, u64, Extra)> = None;
    while pos < image.len() {
        let rest = &image[pos..];
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let crc = u32::from_le_bytes(rest.get(8..12)?.try_into().ok()?);
        let payload = rest.get(FRAME..FRAME.checked_add(len)?)?;
        if crc32(payload) != crc {
            return None;
        }
        match (decode(payload)?, &mut inode) {
            (Rec::Inode(i, size, x), None) => inode = Some((i, size, x)),
            (Rec::Page(_, idx, bytes), Some((i, _, _))) => match &mut i.body {
                Body::File(d) => d.restore_page(idx, Some(&bytes)),
                _ => return None,
            },
            _ => return None,
        }
        pos += FRAME + len;
    }
    let (mut i, size, x) = inode?;
    if let Body::File(d) = &mut i.body {
        d.restore_size(size);
    }
    Some((i, x))
}

/// The inode record of what [`encode_object`] wrote, without its pages
/// (a directory's value is that record alone; a file's pages are not
/// checked or decoded).
pub fn decode_object_head(image: &[u8]) -> Option<(Box<Inode>, Extra)> {
    let len = u32::from_le_bytes(image.get(..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(image.get(8..12)?.try_into().ok()?);
    let payload = image.get(FRAME..FRAME.checked_add(len)?)?;
    if crc32(payload) != crc {
        return None;
    }
    match decode(payload)? {
        Rec::Inode(i, _, x) => Some((i, x)),
        _ => None,
    }
}

#[cfg(test)]
mod object_tests {
    use super::*;

    #[test]
    fn an_inode_round_trips_as_one_value() {
        let mut d = Data::default();
        d.write(5000, b"hello").unwrap();
        let mut xattrs = std::collections::BTreeMap::new();
        xattrs.insert(OsString::from("user.a"), b"1".to_vec());
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 42);
        let i = Inode {
            ino: Ino(7),
            kind: Kind::File,
            perm: 0o640,
            nlink: 1,
            uid: 3,
            gid: 4,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            lookups: 0,
            opens: 0,
            version: 9,
            xattrs,
            body: Body::File(d),
        };
        let x = Extra { ttl_ms: Some(1500), guard: Some(PathBuf::from("/l")) };
        let v = encode_object(&i, &x);
        let (back, bx) = decode_object(&v).expect("decodes");
        assert_eq!(bx, x);
        assert_eq!((back.perm, back.uid, back.gid, back.mtime, back.xattrs.len()), (0o640, 3, 4, t, 1));
        let Body::File(d) = &back.body else { panic!("not a file") };
        assert_eq!(d.size(), 5005);
        assert_eq!(d.read(4998, 10), b"\0\0hello".to_vec());
        // A flipped byte or a cut value is refused, not half-applied.
        let mut bad = v.clone();
        let at = bad.len() - 2;
        bad[at] ^= 1;
        assert!(decode_object(&bad).is_none());
        assert!(decode_object(&v[..v.len() - 3]).is_none());
        // The head alone: the attributes, whatever follows.
        let (head, hx) = decode_object_head(&bad).expect("head decodes");
        assert_eq!((head.kind, head.perm, head.mtime, hx), (Kind::File, 0o640, t, x));
        assert!(decode_object_head(&v[..10]).is_none());
        let mut bad_head = v.clone();
        bad_head[FRAME + 2] ^= 1;
        assert!(decode_object_head(&bad_head).is_none());
    }
}
