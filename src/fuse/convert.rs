//! Conversions between fuser's types and the core's, and the reply of
//! the xattr requests (size probe or value).

use super::*;

pub(super) fn caller(req: &Request) -> Caller {
    Caller { uid: req.uid(), gid: req.gid(), pid: req.pid() }
}

pub(super) fn kind(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

pub(super) fn attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.crtime,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

pub(super) fn set_time(t: Option<TimeOrNow>) -> Option<SetTime> {
    t.map(|t| match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    })
}

pub(super) fn reply_xattr(op: &str, r: crate::error::Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(refuse(op, Error::Range)),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(refuse(op, e)),
    }
}

/// A FUSE lock request's fields, as fuser passes them, in one value.
#[allow(clippy::too_many_arguments)] // the fields of a FUSE lock request, gathered once
pub(super) fn lock_call(
    req: &Request,
    ino: INodeNo,
    fh: FileHandle,
    owner: LockOwner,
    start: u64,
    end: u64,
    typ: i32,
    pid: u32,
) -> LockCall {
    LockCall { unique: req.unique().0, tid: req.pid(), ino: ino.0, fh, owner, start, end, typ, pid }
}
