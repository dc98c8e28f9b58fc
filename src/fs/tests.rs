//! Unit tests of the filesystem core, without the kernel.

use super::*;

fn fs() -> Fs {
    Fs::new(0, 0)
}
const C: Caller = Caller::ROOT;

#[test]
fn hard_links_share_nlink_and_content() {
    let fs = fs();
    let (a, h) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0o022, libc::O_RDWR).unwrap();
    assert_eq!(a.perm, 0o644);
    fs.write(a.ino, h, 0, b"hello", WriteOpts::default()).unwrap();
    let b = fs.link(a.ino, Ino::ROOT, OsStr::new("b")).unwrap();
    assert_eq!(b.nlink, 2);
    fs.unlink(Ino::ROOT, OsStr::new("a"), 0).unwrap();
    assert_eq!(fs.lookup(Ino::ROOT, OsStr::new("b")).unwrap().nlink, 1);
    assert_eq!(fs.read(a.ino, h, 0, 10, 0).unwrap(), b"hello");
    assert_eq!(fs.link(a.ino, Ino::ROOT, OsStr::new("b")), Err(Error::Exists));
}

#[test]
fn rename_error_cases() {
    let fs = fs();
    let d = fs.mkdir(C, Ino::ROOT, OsStr::new("d"), 0o755, 0).unwrap();
    let e = fs.mkdir(C, d.ino, OsStr::new("e"), 0o755, 0).unwrap();
    fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    fs.mknod(C, e.ino, OsStr::new("g"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    let r = Ino::ROOT;
    assert_eq!(fs.rename(r, OsStr::new("d"), e.ino, OsStr::new("x"), 0, 0), Err(Error::Invalid));
    assert_eq!(fs.rename(r, OsStr::new("d"), r, OsStr::new("f"), 0, 0), Err(Error::NotDir));
    assert_eq!(fs.rename(r, OsStr::new("f"), r, OsStr::new("d"), 0, 0), Err(Error::IsDir));
    fs.mkdir(C, r, OsStr::new("z"), 0o755, 0).unwrap();
    assert_eq!(fs.rename(r, OsStr::new("z"), d.ino, OsStr::new("e"), 0, 0), Err(Error::NotEmpty));
    assert_eq!(fs.rename(r, OsStr::new("f"), r, OsStr::new("z"), RENAME_NOREPLACE, 0), Err(Error::Exists));
    assert_eq!(fs.rename(r, OsStr::new("nope"), r, OsStr::new("q"), 0, 0), Err(Error::NotFound));
    // Moving a directory across parents moves the ".." link count.
    assert_eq!(fs.getattr(r, 0).unwrap().nlink, 4);
    fs.rename(d.ino, OsStr::new("e"), r, OsStr::new("e2"), 0, 0).unwrap();
    assert_eq!(fs.getattr(r, 0).unwrap().nlink, 5);
    assert_eq!(fs.getattr(d.ino, 0).unwrap().nlink, 2);
    fs.rename(r, OsStr::new("f"), r, OsStr::new("d"), RENAME_EXCHANGE, 0).unwrap();
    assert_eq!(fs.lookup(r, OsStr::new("f")).unwrap().kind, Kind::Dir);
}

#[test]
fn setgid_directories_hand_down_group() {
    let fs = fs();
    let d = fs.mkdir(C, Ino::ROOT, OsStr::new("d"), 0o2775, 0).unwrap();
    fs.setattr(d.ino, &SetAttr { gid: Some(50), ..SetAttr::default() }, C).unwrap();
    let u = Caller { uid: 1000, gid: 1000, pid: 1 };
    let f = fs.mknod(u, d.ino, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    assert_eq!(f.gid, 50);
    let s = fs.mkdir(u, d.ino, OsStr::new("s"), 0o755, 0).unwrap();
    assert_eq!(s.perm & libc::S_ISGID as u16, libc::S_ISGID as u16);
}

#[test]
fn xattr_flags_and_errors() {
    let fs = fs();
    let f = fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    let n = OsStr::new("user.k");
    assert_eq!(fs.setxattr(f.ino, n, b"v", XATTR_REPLACE, 0), Err(Error::NoAttr));
    fs.setxattr(f.ino, n, b"v", XATTR_CREATE, 0).unwrap();
    assert_eq!(fs.setxattr(f.ino, n, b"v", XATTR_CREATE, 0), Err(Error::Exists));
    assert_eq!(fs.getxattr(f.ino, n).unwrap(), b"v");
    assert_eq!(fs.listxattr(f.ino).unwrap(), b"user.k\0");
    fs.removexattr(f.ino, n, 0).unwrap();
    assert_eq!(fs.getxattr(f.ino, n), Err(Error::NoAttr));
    assert_eq!(fs.setxattr(f.ino, OsStr::new("bogus.k"), b"v", 0, 0), Err(Error::NotSupported));
}

fn flock(h: Handle, mode: Option<crate::lease::Mode>) -> Request {
    Request {
        owner: Owner(h.0),
        kind: crate::lease::LockKind::Flock,
        mode,
        range: crate::lease::Range { start: 0, end: u64::MAX },
        pid: 1,
        handle: h.0,
    }
}

/// SPEC 4: rename over keeps the destination's inode only while it is
/// live; over a released lease it is POSIX, and the epoch floor holds.
#[test]
fn rename_over_keeps_identity_only_while_live() {
    use crate::lease::Mode;
    let fs = fs();
    let r = Ino::ROOT;
    let (dst, h) = fs.create(C, r, OsStr::new("dst"), 0o600, 0, libc::O_RDWR | libc::O_EXCL).unwrap();
    fs.setlk(dst.ino, flock(h, Some(Mode::Exclusive)), None).unwrap();
    assert_eq!(fs.epoch(dst.ino), Epoch(2));
    // Held: the content moves, the inode, epoch and holder stay.
    let (src, _) = fs.create(C, r, OsStr::new("src"), 0o640, 0, libc::O_RDWR).unwrap();
    fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, 0).unwrap();
    assert_eq!(fs.lookup(r, OsStr::new("dst")).unwrap().ino, dst.ino);
    assert_eq!(fs.epoch(dst.ino), Epoch(2));
    assert_ne!(src.ino, dst.ino);
    // Released: POSIX, the source's inode and mode arrive at the name.
    fs.setlk(dst.ino, flock(h, None), None).unwrap();
    let (src, _) = fs.create(C, r, OsStr::new("src"), 0o640, 0, libc::O_RDWR).unwrap();
    fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, 0).unwrap();
    let now = fs.lookup(r, OsStr::new("dst")).unwrap();
    assert_eq!((now.ino, now.perm), (src.ino, 0o640));
    assert!(fs.epoch(src.ino) >= Epoch(2), "the path's epoch never goes back");
}

#[test]
fn unlinked_open_file_lives_until_forget_and_release() {
    let fs = fs();
    let (a, h) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0, libc::O_RDWR).unwrap();
    fs.unlink(Ino::ROOT, OsStr::new("a"), 0).unwrap();
    fs.write(a.ino, h, 0, b"x", WriteOpts::default()).unwrap();
    fs.forget(a.ino, 1);
    assert_eq!(fs.getattr(a.ino, 0).unwrap().nlink, 0);
    fs.release(h, None).unwrap();
    assert_eq!(fs.getattr(a.ino, 0), Err(Error::NotFound));
    // A new file never reuses the number.
    let (b, _) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0, 0).unwrap();
    assert!(b.ino > a.ino);
}
