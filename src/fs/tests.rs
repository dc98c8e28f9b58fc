//! Unit tests of the filesystem core, without the kernel.

use super::*;

fn fs() -> Fs {
    Fs::new(0, 0)
}
const C: Caller = Caller::ROOT;

/// Root, as thread `pid`.
fn by(pid: u32) -> Caller {
    Caller { pid, ..Caller::ROOT }
}

#[test]
fn hard_links_share_nlink_and_content() {
    let fs = fs();
    let (a, h) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0o022, libc::O_RDWR).unwrap();
    assert_eq!(a.perm, 0o644);
    fs.write(a.ino, h, 0, b"hello", WriteOpts::default()).unwrap();
    let b = fs.link(a.ino, Ino::ROOT, OsStr::new("b"), C).unwrap();
    assert_eq!(b.nlink, 2);
    fs.unlink(Ino::ROOT, OsStr::new("a"), by(0)).unwrap();
    assert_eq!(fs.lookup(Ino::ROOT, OsStr::new("b"), by(0)).unwrap().0.nlink, 1);
    assert_eq!(fs.read(a.ino, h, 0, 10, 0).unwrap(), b"hello");
    assert_eq!(fs.link(a.ino, Ino::ROOT, OsStr::new("b"), C), Err(Error::Exists));
}

#[test]
fn rename_error_cases() {
    let fs = fs();
    let d = fs.mkdir(C, Ino::ROOT, OsStr::new("d"), 0o755, 0).unwrap();
    let e = fs.mkdir(C, d.ino, OsStr::new("e"), 0o755, 0).unwrap();
    fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    fs.mknod(C, e.ino, OsStr::new("g"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    let r = Ino::ROOT;
    assert_eq!(fs.rename(r, OsStr::new("d"), e.ino, OsStr::new("x"), 0, by(0)), Err(Error::Invalid));
    assert_eq!(fs.rename(r, OsStr::new("d"), r, OsStr::new("f"), 0, by(0)), Err(Error::NotDir));
    assert_eq!(fs.rename(r, OsStr::new("f"), r, OsStr::new("d"), 0, by(0)), Err(Error::IsDir));
    fs.mkdir(C, r, OsStr::new("z"), 0o755, 0).unwrap();
    assert_eq!(fs.rename(r, OsStr::new("z"), d.ino, OsStr::new("e"), 0, by(0)), Err(Error::NotEmpty));
    assert_eq!(fs.rename(r, OsStr::new("f"), r, OsStr::new("z"), RENAME_NOREPLACE, by(0)), Err(Error::Exists));
    assert_eq!(fs.rename(r, OsStr::new("nope"), r, OsStr::new("q"), 0, by(0)), Err(Error::NotFound));
    // Moving a directory across parents moves the ".." link count.
    assert_eq!(fs.getattr(r, 0).unwrap().nlink, 4);
    fs.rename(d.ino, OsStr::new("e"), r, OsStr::new("e2"), 0, by(0)).unwrap();
    assert_eq!(fs.getattr(r, 0).unwrap().nlink, 5);
    assert_eq!(fs.getattr(d.ino, 0).unwrap().nlink, 2);
    fs.rename(r, OsStr::new("f"), r, OsStr::new("d"), RENAME_EXCHANGE, by(0)).unwrap();
    assert_eq!(fs.lookup(r, OsStr::new("f"), by(0)).unwrap().0.kind, Kind::Dir);
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
fn chown_drops_set_id_bits_as_the_kernel_does() {
    let fs = fs();
    let f = fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o6755, 0, 0).unwrap();
    let d = fs.mkdir(C, Ino::ROOT, OsStr::new("d"), 0o6755, 0).unwrap();
    let chmod = |ino: Ino, m: u32| fs.setattr(ino, &SetAttr { mode: Some(m), ..SetAttr::default() }, C).unwrap();
    chmod(f.ino, 0o6755);
    // Root's chown drops suid and group-executable sgid, even to the same owner.
    let a = fs.setattr(f.ino, &SetAttr { uid: Some(0), ..SetAttr::default() }, C).unwrap();
    assert_eq!(a.perm, 0o755);
    // Directories keep both.
    let a = fs.setattr(d.ino, &SetAttr { uid: Some(7), gid: Some(7), ..SetAttr::default() }, C).unwrap();
    assert_eq!(a.perm, 0o6755);
    // sgid without group-execute: root keeps it; an owner outside the group does not.
    chmod(f.ino, 0o6745);
    let a = fs.setattr(f.ino, &SetAttr { gid: Some(0), ..SetAttr::default() }, C).unwrap();
    assert_eq!(a.perm, 0o2745);
    fs.setattr(f.ino, &SetAttr { uid: Some(1000), gid: Some(50), ..SetAttr::default() }, C).unwrap();
    chmod(f.ino, 0o6745);
    let owner = Caller { uid: 1000, gid: 1000, pid: 1 };
    let a = fs.setattr(f.ino, &SetAttr { gid: Some(1000), ..SetAttr::default() }, owner).unwrap();
    assert_eq!(a.perm, 0o745);
    // A chown that sets the mode itself (a kernel without
    // FUSE_HANDLE_KILLPRIV_V2) gets that mode.
    let a = fs.setattr(f.ino, &SetAttr { uid: Some(0), mode: Some(0o4700), ..SetAttr::default() }, C).unwrap();
    assert_eq!(a.perm, 0o4700);
    // chown(f, -1, -1): nothing to set. The owner's drops the bits; someone
    // else's is refused while the file is not open (a writer's fallocate
    // with the file open is not).
    fs.setattr(f.ino, &SetAttr { uid: Some(1000), ..SetAttr::default() }, C).unwrap();
    chmod(f.ino, 0o4777);
    let other = Caller { uid: 1001, gid: 1001, pid: 1 };
    assert_eq!(fs.setattr(f.ino, &SetAttr::default(), other), Err(Error::NotPermitted));
    assert_eq!(fs.getattr(f.ino, 0).unwrap().perm, 0o4777);
    let h = fs.open(f.ino, libc::O_WRONLY, C).unwrap();
    assert_eq!(fs.setattr(f.ino, &SetAttr::default(), other).unwrap().perm, 0o777);
    fs.release(h, None).unwrap();
    chmod(f.ino, 0o4777);
    assert_eq!(fs.setattr(f.ino, &SetAttr::default(), owner).unwrap().perm, 0o777);
}

#[test]
fn xattr_flags_and_errors() {
    let fs = fs();
    let f = fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    let n = OsStr::new("user.k");
    assert_eq!(fs.setxattr(f.ino, n, b"v", XATTR_REPLACE, C), Err(Error::NoAttr));
    fs.setxattr(f.ino, n, b"v", XATTR_CREATE, C).unwrap();
    assert_eq!(fs.setxattr(f.ino, n, b"v", XATTR_CREATE, C), Err(Error::Exists));
    assert_eq!(fs.getxattr(f.ino, n, C).unwrap(), b"v");
    assert_eq!(fs.listxattr(f.ino).unwrap(), b"user.k\0");
    fs.removexattr(f.ino, n, by(0)).unwrap();
    assert_eq!(fs.getxattr(f.ino, n, C), Err(Error::NoAttr));
    assert_eq!(fs.setxattr(f.ino, OsStr::new("bogus.k"), b"v", 0, C), Err(Error::NotSupported));
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
    fs.state.lock().ns.get_mut(dst.ino).unwrap().crtime -= YOUNG;
    // Held: the content moves, the inode, epoch and holder stay. A source
    // the kernel only got from its create has no cached entry: renamed at
    // the first try.
    let (fresh, _) = fs.create(C, r, OsStr::new("fresh"), 0o640, 0, libc::O_RDWR).unwrap();
    assert!(!fs.lookup(r, OsStr::new("fresh"), by(7)).unwrap().1, "a young file's name is not cached");
    fs.rename(r, OsStr::new("fresh"), r, OsStr::new("dst"), 0, by(7)).unwrap();
    assert_eq!(fs.lookup(r, OsStr::new("dst"), by(7)).unwrap().0.ino, dst.ino);
    assert_ne!(fresh.ino, dst.ino);
    // A source the kernel looked up may have a cached entry. As the kernel
    // does it: the first try is refused with ESTALE, the kernel looks the
    // source up again (an entry it must not keep) and retries. A retry
    // without that lookup, or by another thread, is refused again.
    let (src, _) = fs.create(C, r, OsStr::new("src"), 0o640, 0, libc::O_RDWR).unwrap();
    assert!(!fs.lookup(r, OsStr::new("src"), by(9)).unwrap().1, "a young file's name is not cached");
    fs.state.lock().ns.get_mut(src.ino).unwrap().crtime -= YOUNG;
    assert!(fs.lookup(r, OsStr::new("src"), by(9)).unwrap().1, "an older one's is");
    assert_eq!(fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, by(7)), Err(Error::Stale(Stale::Lookup)));
    assert_eq!(fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, by(7)), Err(Error::Stale(Stale::Lookup)));
    assert!(!fs.lookup(r, OsStr::new("src"), by(8)).unwrap().1, "any lookup of a pending source expires at once");
    assert!(!fs.lookup(r, OsStr::new("src"), by(7)).unwrap().1, "the source of a pending rename");
    assert_eq!(fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, by(8)), Err(Error::Stale(Stale::Lookup)));
    assert!(!fs.lookup(r, OsStr::new("src"), by(8)).unwrap().1);
    fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, by(8)).unwrap();
    assert!(fs.lookup(r, OsStr::new("dst"), by(8)).unwrap().1, "nothing pending any more (and the lease is old)");
    assert_eq!(fs.lookup(r, OsStr::new("dst"), by(0)).unwrap().0.ino, dst.ino);
    assert_eq!(fs.epoch(dst.ino), Epoch(2));
    assert_ne!(src.ino, dst.ino);
    // Released: POSIX, the source's inode and mode arrive at the name.
    fs.setlk(dst.ino, flock(h, None), None).unwrap();
    let (src, _) = fs.create(C, r, OsStr::new("src"), 0o640, 0, libc::O_RDWR).unwrap();
    fs.rename(r, OsStr::new("src"), r, OsStr::new("dst"), 0, by(0)).unwrap();
    let now = fs.lookup(r, OsStr::new("dst"), by(0)).unwrap().0;
    assert_eq!((now.ino, now.perm), (src.ino, 0o640));
    assert!(fs.epoch(src.ino) >= Epoch(2), "the path's epoch never goes back");
}

#[test]
fn entry_deadlines_expire_and_are_pruned() {
    let mut d = EntryDeadlines::default();
    let t0 = Instant::now();
    d.given(Ino(5), t0);
    assert!(d.cached(Ino(5), t0 + FILE_ENTRY_TTL), "the margin covers a late start of the kernel's timeout");
    assert!(!d.cached(Ino(5), t0 + FILE_ENTRY_TTL + ENTRY_MARGIN));
    assert!(!d.cached(Ino(6), t0));
    // Lookups of many files: the expired ones go as the map grows.
    for i in 0..5000 {
        d.given(Ino(100 + i), t0 + Duration::from_millis(i));
    }
    assert!(d.until.len() < 5000, "{}", d.until.len());
    assert!(d.cached(Ino(100 + 4999), t0 + Duration::from_millis(4999)));
}

#[test]
fn unlinked_open_file_lives_until_forget_and_release() {
    let fs = fs();
    let (a, h) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0, libc::O_RDWR).unwrap();
    fs.unlink(Ino::ROOT, OsStr::new("a"), by(0)).unwrap();
    fs.write(a.ino, h, 0, b"x", WriteOpts::default()).unwrap();
    fs.forget(a.ino, 1);
    assert_eq!(fs.getattr(a.ino, 0).unwrap().nlink, 0);
    fs.release(h, None).unwrap();
    assert_eq!(fs.getattr(a.ino, 0), Err(Error::NotFound));
    // A new file never reuses the number.
    let (b, _) = fs.create(C, Ino::ROOT, OsStr::new("a"), 0o644, 0, 0).unwrap();
    assert!(b.ino > a.ino);
}

/// A mount of 100 pages and 20 inodes, with a user (uid 1000) and that
/// user's writes.
fn limited_fs() -> (Fs, Caller, WriteOpts) {
    let fs = fs();
    fs.set_limits(
        limits::Limits { size: 100 * 4096, inodes: 20, ..limits::Limits::with_size(100 * 4096) },
        Default::default(),
    );
    (fs, Caller { uid: 1000, gid: 1000, pid: 1 }, WriteOpts { uid: 1000, ..WriteOpts::default() })
}

#[test]
fn size_and_inode_limits_refuse_with_enospc_change_nothing_and_free_up() {
    let (fs, user, as_user) = limited_fs();
    let (a, h) = fs.create(user, Ino::ROOT, OsStr::new("a"), 0o644, 0, libc::O_RDWR).unwrap();
    // Users may fill 95 pages: a write needing the 96th changes nothing.
    fs.write(a.ino, h, 0, &vec![7u8; 95 * 4096], as_user).unwrap();
    assert_eq!(fs.write(a.ino, h, 95 * 4096, b"x", as_user), Err(Error::NoSpace));
    assert_eq!(fs.getattr(a.ino, 0).unwrap().size, 95 * 4096, "the refused write changed nothing");
    // Overwriting stored pages needs no room.
    fs.write(a.ino, h, 10, b"over", as_user).unwrap();
    assert_eq!(fs.fallocate(a.ino, 95 * 4096, 4096, 0, user), Err(Error::NoSpace));
    assert_eq!(fs.setxattr(a.ino, OsStr::new("user.k"), &[1; 100], 0, user), Err(Error::NoSpace));
    // Growing by truncate is sparse, as on tmpfs.
    fs.setattr(a.ino, &SetAttr { size: Some(1 << 30), ..SetAttr::default() }, user).unwrap();
    // Root keeps the reserve.
    fs.write(a.ino, h, 95 * 4096, &[1u8; 5 * 4096], WriteOpts::default()).unwrap();
    assert_eq!(fs.write(a.ino, h, 100 * 4096, b"x", WriteOpts::default()), Err(Error::NoSpace));
    let s = fs.statfs();
    assert_eq!((s.blocks, s.bfree, s.bavail), (100, 0, 0));
    // Inodes: the root and `a` exist; users may have 19 (95 % of 20).
    for i in 0..17 {
        fs.mknod(user, Ino::ROOT, OsStr::new(&format!("f{i}")), libc::S_IFREG | 0o644, 0, 0).unwrap();
    }
    assert_eq!(fs.mkdir(user, Ino::ROOT, OsStr::new("d"), 0o755, 0), Err(Error::NoSpace));
    assert_eq!(fs.lookup(Ino::ROOT, OsStr::new("d"), by(0)).map(|a| a.0), Err(Error::NotFound));
    fs.mkdir(C, Ino::ROOT, OsStr::new("d"), 0o755, 0).unwrap();
    assert_eq!(fs.statfs().ffree, 0);
    // Freeing makes room again, and the running count matches a recount.
    fs.setattr(a.ino, &SetAttr { size: Some(4096), ..SetAttr::default() }, user).unwrap();
    fs.write(a.ino, h, 8192, &[2u8; 8192], as_user).unwrap();
    fs.fallocate(a.ino, 0, 40 * 4096, libc::FALLOC_FL_KEEP_SIZE, user).unwrap();
    fs.fallocate(a.ino, 4096, 4096, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, user).unwrap();
    fs.setxattr(a.ino, OsStr::new("user.k"), &[1; 100], 0, user).unwrap();
    fs.setxattr(a.ino, OsStr::new("user.k"), &[1; 10], 0, user).unwrap();
    let st = fs.state.lock();
    assert_eq!(st.ns.usage().pages, st.ns.pages());
    assert_eq!(st.ns.usage().xattr_bytes, 16);
}

/// `rm` of a file nobody has open frees its room at once, as on tmpfs,
/// though the kernel's FORGET of it may reach the daemon after later
/// requests; a removed file still open keeps its room until its release.
#[test]
fn removed_files_free_their_room_before_the_kernel_forgets_them() {
    let (fs, user, as_user) = limited_fs();
    // Users may fill 95 pages and 19 inodes: the root, `a` and 17 more.
    let (a, h) = fs.create(user, Ino::ROOT, OsStr::new("a"), 0o644, 0, libc::O_RDWR).unwrap();
    fs.write(a.ino, h, 0, &vec![7u8; 90 * 4096], as_user).unwrap();
    fs.setxattr(a.ino, OsStr::new("user.k"), &[1; 100], 0, user).unwrap();
    let f: Vec<Ino> = (0..17)
        .map(|i| fs.mknod(user, Ino::ROOT, OsStr::new(&format!("f{i}")), libc::S_IFREG | 0o644, 0, 0).unwrap().ino)
        .collect();
    let mknod = |name: &str| fs.mknod(user, Ino::ROOT, OsStr::new(name), libc::S_IFREG | 0o644, 0, 0);
    assert_eq!(mknod("n").map(|a| a.ino), Err(Error::NoSpace));
    // Five names removed, none forgotten yet: their inodes are room.
    for i in 0..5 {
        fs.unlink(Ino::ROOT, OsStr::new(&format!("f{i}")), by(0)).unwrap();
    }
    let n = mknod("n").unwrap();
    let hn = fs.open(n.ino, libc::O_RDWR, user).unwrap();
    // `a` removed while open keeps its pages until its release.
    fs.unlink(Ino::ROOT, OsStr::new("a"), by(0)).unwrap();
    assert_eq!(fs.write(n.ino, hn, 0, &[1u8; 10 * 4096], as_user), Err(Error::NoSpace));
    fs.release(h, None).unwrap();
    fs.write(n.ino, hn, 0, &[1u8; 10 * 4096], as_user).unwrap();
    let gone = fs.getattr(a.ino, 0).unwrap();
    assert_eq!((gone.nlink, gone.size), (0, 0), "kept until the FORGET, its content let go");
    {
        let st = fs.state.lock();
        assert_eq!(st.ns.usage().pages, st.ns.pages(), "the running count matches a recount");
        let rows = st.limit_rows();
        let used = |name: &str| rows.iter().find(|r| r.name == name).unwrap().used.unwrap();
        // The root, `n`, f5..f16; `a` and f0..f4 wait for their FORGET.
        assert_eq!((used("inodes"), st.ns.len()), (14, 20));
        assert_eq!(used("size"), 10 * 4096);
    }
    fs.forget(a.ino, 1);
    for ino in &f[..5] {
        fs.forget(*ino, 1);
    }
    assert_eq!(fs.getattr(a.ino, 0), Err(Error::NotFound));
    assert_eq!(fs.state.lock().ns.len(), 14);
}

#[test]
fn xattrs_are_bounded_per_file_in_count_and_bytes() {
    let fs = fs();
    let l = limits::Limits { xattrs_per_file: 3, xattr_bytes_per_file: 100, ..limits::Limits::with_size(1 << 20) };
    fs.set_limits(l, Default::default());
    let f = fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    for k in ["user.a", "user.b", "user.c"] {
        fs.setxattr(f.ino, OsStr::new(k), b"v", 0, C).unwrap();
    }
    assert_eq!(fs.setxattr(f.ino, OsStr::new("user.d"), b"v", 0, C), Err(Error::NoSpace));
    fs.setxattr(f.ino, OsStr::new("user.a"), b"replaced", 0, C).unwrap();
    assert_eq!(fs.setxattr(f.ino, OsStr::new("user.b"), &[0; 90], 0, C), Err(Error::NoSpace));
    assert_eq!(fs.getxattr(f.ino, OsStr::new("user.b"), C).unwrap(), b"v", "refused, unchanged");
    fs.removexattr(f.ino, OsStr::new("user.c"), by(0)).unwrap();
    fs.setxattr(f.ino, OsStr::new("user.d"), b"v", 0, C).unwrap();
}

/// A small deterministic generator (xorshift) for the parser property test.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn control_and_xattr_parsers_never_panic_and_refuse_only_with_known_errnos() {
    let fs = fs();
    let f = fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    let names =
        [XATTR_TTL, XATTR_RENEW, XATTR_GUARD, XATTR_EPOCH, XATTR_VERSION, XATTR_HOLDER, "user.leasefs.x", "user.k"];
    let allowed = [
        Error::Invalid,
        Error::NotPermitted,
        Error::NotFound,
        Error::NoAttr,
        Error::TooBig,
        Error::NoLock,
        Error::NoSpace,
        Error::NotSupported,
        Error::Exists,
    ];
    let pieces: [&[u8]; 12] =
        [b"", b"0", b"30s", b"500ms", b"off", b"-1", b"99999999999999999999", b"/", b"..", b"a/b", b"\0", b"\xff\xfe"];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..20_000 {
        let mut value = Vec::new();
        for _ in 0..rng(&mut seed) % 4 {
            if rng(&mut seed).is_multiple_of(2) {
                value.extend_from_slice(pieces[(rng(&mut seed) % pieces.len() as u64) as usize]);
            } else {
                value.push(rng(&mut seed) as u8);
            }
        }
        if rng(&mut seed).is_multiple_of(50) {
            value = vec![b'9'; 70_000];
        }
        let name = names[(rng(&mut seed) % names.len() as u64) as usize];
        let flags = [0, 1, 2, 3][(rng(&mut seed) % 4) as usize];
        if let Err(e) = fs.setxattr(f.ino, OsStr::new(name), &value, flags, C) {
            assert!(allowed.contains(&e), "setxattr {name} {value:?}: {e:?}");
        }
        let user = Caller { uid: 1000, gid: 1000, pid: 1 };
        for who in [C, user] {
            if let Err(e) = fs.control_write(control::ControlFile::Break.ino(), &value, who) {
                assert!(allowed.contains(&e), "break {value:?}: {e:?}");
            }
        }
    }
}

#[test]
fn open_handles_are_bounded_with_enfile_and_control_files_keep_a_few() {
    let fs = fs();
    fs.set_limits(limits::Limits { handles: 2, ..limits::Limits::with_size(1 << 20) }, Default::default());
    let f = fs.mknod(C, Ino::ROOT, OsStr::new("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
    let a = fs.open(f.ino, libc::O_RDONLY, by(0)).unwrap();
    fs.open(f.ino, libc::O_RDONLY, by(0)).unwrap();
    let refused = fs.open(f.ino, libc::O_RDONLY, by(0));
    assert_eq!(refused.map_err(Error::errno), Err(libc::ENFILE));
    // `.leasefs/` stays readable for the administrator.
    let status = fs.open(control::ControlFile::Status.ino(), libc::O_RDONLY, by(0)).unwrap();
    // Closing frees room (the control file's handle counts too).
    fs.release(a, None).unwrap();
    fs.release(status, None).unwrap();
    fs.open(f.ino, libc::O_RDONLY, by(0)).unwrap();
}

/// Every path with its kind, inode and link count (a directory reachable
/// twice shows twice).
fn paths(ns: &Namespace) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![(Ino::ROOT, String::new())];
    while let Some((dir, path)) = stack.pop() {
        for (name, ino) in ns.get(dir).unwrap().dir().unwrap().iter() {
            let p = format!("{path}/{}", name.to_string_lossy());
            let i = ns.get(ino).unwrap();
            if i.kind == Kind::Dir {
                stack.push((ino, p.clone()));
            }
            out.push(format!("{p} {:?} {} nlink {}", i.kind, ino.0, i.nlink));
        }
    }
    out.sort();
    out
}

/// Changes without an fsync are appended to the journal every
/// WRITEBACK inodes, so an fsync never has more than that to append under
/// the state lock; what was appended is in the journal for recovery.
#[test]
fn changes_without_fsync_are_written_back_in_bounded_batches() {
    use crate::store::snapshot::Store;
    use crate::store::storage::DirStorage;
    let dir = tempfile::tempdir().unwrap();
    let fs = fs();
    let (store, rec) = Store::open(Box::new(DirStorage::new(dir.path()))).unwrap();
    fs.restore(store, rec);
    let n = 3 * WRITEBACK + 10;
    for i in 0..n {
        fs.mknod(C, Ino::ROOT, OsStr::new(&format!("f{i}")), libc::S_IFREG | 0o644, 0, 0).unwrap();
        let st = fs.state.lock();
        assert!(st.ns.dirty().0.len() < WRITEBACK, "{} unsynced at {i}", st.ns.dirty().0.len());
    }
    // What the journal holds now, without any fsync: every batch written back.
    let (_, rec) = Store::open(Box::new(DirStorage::new(dir.path()))).unwrap();
    let got = paths(&Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, Namespace::new(0o755, 0, 0, now())));
    assert!(got.len() > n - WRITEBACK && got.len() <= n + 1, "{} of {n} files in the journal", got.len());
}

/// Content written without an fsync is appended to the journal every
/// WRITEBACK_BYTES, so an fsync after a large write appends only the last
/// of it (and no batch as large as the file is encoded at once).
#[test]
fn content_written_without_fsync_is_written_back_in_bounded_batches() {
    use crate::store::snapshot::Store;
    use crate::store::storage::DirStorage;
    let dir = tempfile::tempdir().unwrap();
    let fs = fs();
    let (store, rec) = Store::open(Box::new(DirStorage::new(dir.path()))).unwrap();
    fs.restore(store, rec);
    let (f, h) = fs.create(C, Ino::ROOT, OsStr::new("big"), 0o644, 0o022, libc::O_RDWR).unwrap();
    let chunk = vec![5u8; 1 << 20];
    let total = 3 * WRITEBACK_BYTES + (1 << 20);
    for at in (0..total).step_by(chunk.len()) {
        fs.write(f.ino, h, at, &chunk, WriteOpts::default()).unwrap();
        let st = fs.state.lock();
        assert!(st.durable.unflushed < WRITEBACK_BYTES, "{} bytes unflushed at {at}", st.durable.unflushed);
        assert!(st.durable.batch.capacity() <= 2 * WRITEBACK_BYTES as usize + (1 << 20));
    }
    // What the journal holds now, without any fsync, once the group-commit
    // thread appended the batches handed to it (it answers nobody for them).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fs.group.busy() {
        assert!(std::time::Instant::now() < deadline, "the writeback batches were never appended");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (_, rec) = Store::open(Box::new(DirStorage::new(dir.path()))).unwrap();
    let ns = Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, Namespace::new(0o755, 0, 0, now()));
    let size = ns.get(f.ino).unwrap().data().unwrap().size();
    assert_eq!(size, 3 * WRITEBACK_BYTES, "written back in whole batches: {size}");
}

/// A filesystem kept in a state directory that compacts past 4 KiB, with
/// snapshot images encoded in the smallest slices.
fn fs_compacting_often() -> (tempfile::TempDir, Fs) {
    use crate::store::snapshot::Store;
    use crate::store::storage::DirStorage;
    let dir = tempfile::tempdir().unwrap();
    let fs = fs();
    let (mut store, rec) = Store::open(Box::new(DirStorage::new(dir.path()))).unwrap();
    store.snapshot_min = 4096;
    fs.restore(store, rec);
    fs.state.lock().durable.slice = std::time::Duration::ZERO;
    (dir, fs)
}

/// The lease timer encodes a snapshot image a slice at a time while a
/// directory moves back and forth and files are renamed between the
/// slices without any fsync: it appends those changes to the journal
/// before each slice, so what recovery makes of the installed snapshot and
/// the journal (a crash right after it) is a namespace that existed, never
/// a directory in two places or in none.
#[test]
fn a_snapshot_encoded_between_unsynced_changes_recovers_a_namespace_that_existed() {
    use crate::store::snapshot::Store;
    use crate::store::storage::DirStorage;
    let (dir, fs) = fs_compacting_often();
    let mkdir = |parent: Ino, name: &str| fs.mkdir(C, parent, OsStr::new(name), 0o755, 0).unwrap().ino;
    let (a, b) = (mkdir(Ino::ROOT, "a"), mkdir(Ino::ROOT, "b"));
    let sub = mkdir(a, "sub");
    for i in 0..400 {
        fs.mknod(C, [a, b, sub][i % 3], OsStr::new(&format!("f{i}")), libc::S_IFREG | 0o644, 0, 0).unwrap();
    }
    fs.sync().unwrap();
    assert!(fs.state.lock().encoding(), "the sync started a compaction");
    let mut seen = vec![paths(&fs.state.lock().ns)];
    let mut slices = 0;
    while fs.state.lock().encoding() {
        let (from, to) = if slices % 2 == 0 { (a, b) } else { (b, a) };
        fs.rename(from, OsStr::new("sub"), to, OsStr::new("sub"), 0, by(1)).unwrap();
        let name = format!("f{}", slices * 3);
        fs.rename(a, OsStr::new(&name), sub, OsStr::new(&format!("g{slices}")), 0, by(1)).unwrap();
        seen.push(paths(&fs.state.lock().ns));
        fs.tick();
        slices += 1;
        assert!(slices < 1000, "the image never finished");
    }
    assert!(slices >= 3, "the image took {slices} slices");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fs.state.lock().durable.compaction.is_some() {
        assert!(std::time::Instant::now() < deadline, "the snapshot was not written in 30 s");
        fs.tick();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(fs.state.lock().durable.store.as_ref().unwrap().generation(), 1, "the snapshot was installed");
    // What a crash now leaves: the files as they are.
    let (_, rec) = Store::open(Box::new(DirStorage::new(dir.path()))).unwrap();
    let got = paths(&Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, Namespace::new(0o755, 0, 0, now())));
    let last = seen.last().unwrap();
    let extra: Vec<_> = got.iter().filter(|p| !last.contains(p)).collect();
    let missing: Vec<_> = last.iter().filter(|p| !got.contains(p)).collect();
    assert!(seen.contains(&got), "recovered a namespace that never existed: {extra:?} but not {missing:?}");
}

/// Let the lease timer run `ticks` times, each time until any compaction
/// it started is written; returns the snapshot generation then.
fn run_timer(fs: &Fs, ticks: usize) -> u64 {
    for _ in 0..ticks {
        fs.tick();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while fs.state.lock().durable.compaction.is_some() {
            assert!(std::time::Instant::now() < deadline, "the snapshot was not written in 30 s");
            fs.tick();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    fs.state.lock().durable.store.as_ref().unwrap().generation()
}

/// The timer compacts a state directory that outgrew the live state
/// (files removed without an fsync), once more to replace the journal
/// the first compaction continues from, and neither a compaction nor a
/// small change after that starts another, even where a snapshot holds more than
/// the live state counts (the longest names).
#[test]
fn the_timer_compacts_once_what_was_removed_without_fsync_and_then_rests() {
    use crate::store::snapshot::Store;
    use crate::store::storage::DirStorage;
    let (dir, fs) = fs_compacting_often();
    let mut inos = Vec::new();
    for i in 0..400 {
        let name = format!("{i:0>255}");
        let a = fs.mknod(C, Ino::ROOT, OsStr::new(&name), libc::S_IFREG | 0o644, 0, 0).unwrap();
        inos.push(a.ino);
    }
    fs.sync().unwrap();
    let settled = run_timer(&fs, 3);
    let disk = |fs: &Fs| {
        let st = fs.state.lock();
        let store = st.durable.store.as_ref().unwrap();
        (store.disk_bytes(), st.live_state())
    };
    let (before, live) = disk(&fs);
    assert!(before > live, "the snapshot holds more than the live state counts: {before} on disk, {live} live");
    assert_eq!(run_timer(&fs, 20), settled, "nothing changed: no compaction");
    // Small changes do not compact either (the journal is far below the
    // snapshot), however low the estimate.
    for i in 0..20 {
        fs.setxattr(inos[399], OsStr::new("user.small"), format!("{i}").as_bytes(), 0, C).unwrap();
        assert_eq!(run_timer(&fs, 1), settled, "a small change {i} compacted");
    }
    for (i, ino) in inos.iter().enumerate().take(390) {
        fs.unlink(Ino::ROOT, OsStr::new(&format!("{i:0>255}")), by(0)).unwrap();
        // The kernel lets go of the inode.
        fs.forget(*ino, 1);
    }
    // Twice: the journal the first compaction continues from holds the
    // removals, more than the live state; the second replaces it.
    assert_eq!(run_timer(&fs, 1), settled + 2, "the removals were compacted without an fsync");
    let (after, live) = disk(&fs);
    assert!(after * 10 < before && after <= 6 * live + (4 << 20), "{after} bytes after, {before} before, {live} live");
    assert_eq!(run_timer(&fs, 20), settled + 2, "and then it rests");
    for i in 0..20 {
        fs.setxattr(inos[399], OsStr::new("user.small"), format!("{i}").as_bytes(), 0, C).unwrap();
        assert_eq!(run_timer(&fs, 1), settled + 2, "a small change {i} compacted");
    }
    // The compaction kept what was not synced: a crash now recovers it.
    let (_, rec) = Store::open(Box::new(DirStorage::new(dir.path()))).unwrap();
    let got = paths(&Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, Namespace::new(0o755, 0, 0, now())));
    assert_eq!(got.len(), 10, "{got:?}");
}

#[test]
fn the_kernel_is_asked_to_drop_the_oldest_unopened_names_past_the_bound() {
    let fs = fs();
    let (mut l, locks) = fs.limits();
    l.kernel_inodes = 16; // batches of 2; right away past 32
    fs.set_limits(l, locks);
    let name = |i: usize| OsString::from(format!("f{i}"));
    // What the kernel does with the drops: drop each entry, then FORGET
    // the inode.
    let forget_dropped = |dropped: &mut Vec<OsString>| {
        let drops = fs.take_entry_drops();
        for (parent, n) in &drops {
            let ino = fs.state.lock().ns.child(*parent, n).unwrap();
            fs.forget(ino, 1);
            dropped.push(n.clone());
        }
        !drops.is_empty()
    };
    // f0 stays open all along; f1 is renamed before its turn comes (the
    // kernel moved its entry too: it is dropped under its new name).
    let (f0, _h) = fs.create(C, Ino::ROOT, &name(0), 0o644, 0, libc::O_RDWR).unwrap();
    let mut dropped = Vec::new();
    let mut batches = 0;
    for i in 1..60 {
        fs.mknod(C, Ino::ROOT, &name(i), libc::S_IFREG | 0o644, 0, 0).unwrap();
        if i == 2 {
            fs.rename(Ino::ROOT, &name(1), Ino::ROOT, OsStr::new("moved"), 0, by(0)).unwrap();
        }
        batches += usize::from(forget_dropped(&mut dropped));
        let held = fs.state.lock().ns.held();
        assert!(held <= 32 + 2, "{held} held after f{i}");
        if i <= 32 {
            assert!(dropped.is_empty(), "nothing dropped below twice the bound: {dropped:?}");
        }
    }
    let mut want = vec![OsString::from("moved")];
    want.extend((2..dropped.len() + 1).map(name));
    assert_eq!(dropped, want, "oldest first, never the open f0");
    assert!(dropped.len() >= 60 - 34, "{} dropped", dropped.len());
    assert!(batches * 2 <= dropped.len() + 1, "{batches} batches for {} drops", dropped.len());

    // Back to the bound once new references stop: not while they come,
    // then a batch per call of the timer.
    let trim = |at: Instant| {
        let mut st = fs.state.lock();
        let st = &mut *st;
        st.cache.refs.trim(&st.ns, 16, at)
    };
    let wait = trim(Instant::now()).expect("past the bound");
    assert!(wait <= TRIM_AFTER && fs.take_entry_drops().is_empty(), "{wait:?}");
    let later = Instant::now() + TRIM_AFTER;
    let before = dropped.len();
    let mut calls = 0;
    while trim(later).is_some() {
        calls += 1;
        assert!(calls < 100, "the trim never ends");
        assert!(forget_dropped(&mut dropped), "a batch was picked");
    }
    assert!(fs.take_entry_drops().is_empty());
    assert_eq!(fs.state.lock().ns.held(), 16, "trimmed to the bound");
    assert!(dropped.len() - before >= 16, "{} more dropped", dropped.len() - before);
    let mut want = vec![OsString::from("moved")];
    want.extend((2..dropped.len() + 1).map(name));
    assert_eq!(dropped, want, "still oldest first");
    assert!(fs.state.lock().ns.get(f0.ino).unwrap().lookups > 0);
    assert_eq!(trim(later), None, "nothing more to do");
}

/// Files that come and go (a lease renewed by `rename`, one new file per
/// renewal, the old one forgotten) leave the queue of kernel references
/// near what the kernel holds, not near the bound: its memory does not
/// grow with the renewals.
#[test]
fn the_queue_of_kernel_references_stays_near_what_is_held_as_files_come_and_go() {
    let fs = fs();
    let bound = fs.limits().0.kernel_inodes;
    assert!(bound >= 65_536, "{bound}");
    let (json, tmp) = (OsStr::new("r.json"), OsStr::new("r.tmp"));
    let mut old = None;
    for i in 0..20_000 {
        let a = fs.mknod(C, Ino::ROOT, tmp, libc::S_IFREG | 0o644, 0, 0).unwrap();
        fs.rename(Ino::ROOT, tmp, Ino::ROOT, json, 0, by(0)).unwrap();
        // The kernel forgets the file the rename replaced.
        if let Some(o) = old.replace(a.ino) {
            fs.forget(o, 1);
        }
        let st = fs.state.lock();
        let (held, queued) = (st.ns.held(), st.cache.refs.queued());
        assert!(held <= 2, "{held} held after renewal {i}");
        // Held at the last reference: this one and the one it replaced.
        assert!(queued <= 4 * 2 + 1024 + 1, "{queued} slots for {held} held after renewal {i}");
    }
    // One file forgotten and looked up again, over and over: one slot for
    // it once the queue is rebuilt, not one per lookup.
    fs.forget(old.unwrap(), 1);
    assert_eq!(fs.state.lock().ns.held(), 0);
    for i in 0..5_000 {
        let a = fs.lookup(Ino::ROOT, json, C).unwrap().0;
        let queued = fs.state.lock().cache.refs.queued();
        assert!(queued <= 4 + 1024 + 1, "{queued} slots after lookup {i}");
        fs.forget(a.ino, 1);
    }
}

/// Where the daemon checks permissions (a shared namespace), it refuses
/// what the kernel's `default_permissions` would: search, write and read
/// of directories and files, the sticky bit, chmod/chown/times by others,
/// truncation by path, `user.` xattrs, moving another's directory, and
/// `access`. Where the kernel checks, the daemon refuses none of it.
#[test]
fn the_daemon_checks_permissions_as_the_kernel_would_where_it_is_asked_to() {
    let u = Caller { uid: 1000, gid: 1000, pid: 0 };
    let v = Caller { uid: 1001, gid: 1001, pid: 0 };
    let name = OsStr::new;
    let setup = |fs: &Fs| {
        let private = fs.mkdir(C, Ino::ROOT, name("private"), 0o700, 0).unwrap();
        fs.mknod(C, private.ino, name("f"), libc::S_IFREG | 0o644, 0, 0).unwrap();
        let shared = fs.mkdir(C, Ino::ROOT, name("tmp"), 0o1777, 0).unwrap();
        let secret = fs.mknod(C, Ino::ROOT, name("secret"), libc::S_IFREG | 0o600, 0, 0).unwrap();
        let public = fs.mknod(C, Ino::ROOT, name("public"), libc::S_IFREG | 0o644, 0, 0).unwrap();
        (private.ino, shared.ino, secret.ino, public.ino)
    };
    let checked = fs();
    checked.check_access_here();
    let (private, tmp, secret, public) = setup(&checked);
    let fs = &checked;
    assert_eq!(fs.lookup(private, name("f"), u).map(|_| ()), Err(Error::Access));
    assert_eq!(fs.lookup(private, name("none"), u).map(|_| ()), Err(Error::Access), "search comes first");
    assert!(fs.lookup(private, name("f"), C).is_ok());
    assert_eq!(fs.mknod(u, Ino::ROOT, name("x"), libc::S_IFREG | 0o644, 0, 0).map(|_| ()), Err(Error::Access));
    assert_eq!(fs.mkdir(u, Ino::ROOT, name("public"), 0o755, 0).map(|_| ()), Err(Error::Exists), "EEXIST first");
    assert_eq!(fs.create(u, Ino::ROOT, name("x"), 0o644, 0, libc::O_RDWR).map(|_| ()), Err(Error::Access));
    assert_eq!(fs.create(u, Ino::ROOT, name("secret"), 0o644, 0, libc::O_RDONLY).map(|_| ()), Err(Error::Access));
    assert_eq!(fs.unlink(Ino::ROOT, name("public"), u), Err(Error::Access));
    let protected = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks").map_or(true, |s| s.trim() != "0");
    let linked = fs.link(public, tmp, name("l"), u).map(|_| ());
    assert_eq!(linked, if protected { Err(Error::NotPermitted) } else { Ok(()) }, "protected hard links");
    // The sticky directory: anyone creates, only the owner removes.
    let mine = fs.mknod(v, tmp, name("mine"), libc::S_IFREG | 0o666, 0, 0).unwrap();
    assert_eq!(fs.unlink(tmp, name("mine"), u), Err(Error::NotPermitted));
    assert_eq!(fs.rename(tmp, name("mine"), tmp, name("yours"), 0, u), Err(Error::NotPermitted));
    assert!(fs.rename(tmp, name("mine"), tmp, name("still-mine"), 0, v).is_ok());
    // Moving one's own directory needs write permission on it.
    fs.mkdir(v, tmp, name("d"), 0o555, 0).unwrap();
    let d2 = fs.mkdir(v, tmp, name("d2"), 0o777, 0).unwrap();
    assert_eq!(fs.rename(tmp, name("d"), d2.ino, name("d"), 0, v), Err(Error::Access));
    assert!(fs.rename(tmp, name("d"), tmp, name("e"), 0, v).is_ok(), "same parent: no '..' to change");
    // Opening.
    assert_eq!(fs.open(secret, libc::O_RDONLY, u).map(|_| ()), Err(Error::Access));
    assert!(fs.open(public, libc::O_RDONLY, u).is_ok());
    assert_eq!(fs.open(public, libc::O_WRONLY, u).map(|_| ()), Err(Error::Access));
    assert_eq!(fs.open(public, libc::O_RDONLY | libc::O_TRUNC, u).map(|_| ()), Err(Error::Access));
    assert_eq!(fs.open(private, libc::O_RDONLY | libc::O_DIRECTORY, u).map(|_| ()), Err(Error::Access));
    // Attributes.
    let set = |s: SetAttr, who| fs.setattr(public, &s, who).map(|_| ());
    assert_eq!(set(SetAttr { mode: Some(0o777), ..SetAttr::default() }, u), Err(Error::NotPermitted));
    assert_eq!(set(SetAttr { uid: Some(1000), ..SetAttr::default() }, u), Err(Error::NotPermitted));
    assert_eq!(set(SetAttr { size: Some(0), ..SetAttr::default() }, u), Err(Error::Access));
    let at = SetTime::At(SystemTime::UNIX_EPOCH);
    assert_eq!(set(SetAttr { mtime: Some(at), ..SetAttr::default() }, u), Err(Error::NotPermitted));
    assert_eq!(set(SetAttr { mtime: Some(SetTime::Now), ..SetAttr::default() }, u), Err(Error::Access));
    assert_eq!(
        fs.setattr(mine.ino, &SetAttr { mtime: Some(SetTime::Now), ..SetAttr::default() }, u).map(|_| ()),
        Ok(()),
        "touch with write permission"
    );
    assert_eq!(
        fs.setattr(mine.ino, &SetAttr { gid: Some(0), ..SetAttr::default() }, v).map(|_| ()),
        Err(Error::NotPermitted),
        "chgrp to a group it is not in"
    );
    let sgid = fs
        .setattr(mine.ino, &SetAttr { mode: Some(0o2755), gid: None, ..SetAttr::default() }, Caller { gid: 1001, ..v })
        .unwrap();
    assert_eq!(sgid.perm, 0o2755, "its own group");
    fs.setattr(mine.ino, &SetAttr { gid: Some(5), ..SetAttr::default() }, C).unwrap();
    let sgid = fs.setattr(mine.ino, &SetAttr { mode: Some(0o2755), ..SetAttr::default() }, v).unwrap();
    assert_eq!(sgid.perm, 0o755, "setgid dropped outside the file's group");
    // Extended attributes and access(2).
    assert_eq!(fs.setxattr(public, name("user.a"), b"1", 0, u), Err(Error::Access));
    fs.setxattr(secret, name("user.a"), b"1", 0, C).unwrap();
    assert_eq!(fs.getxattr(secret, name("user.a"), u), Err(Error::Access));
    assert_eq!(fs.getxattr(public, name("user.none"), u), Err(Error::NoAttr));
    assert_eq!(fs.access(secret, libc::R_OK, u), Err(Error::Access));
    assert_eq!(fs.access(secret, libc::F_OK, u), Ok(()));
    assert_eq!(fs.access(public, libc::R_OK, u), Ok(()));
    assert_eq!(fs.access(public, libc::X_OK, C), Err(Error::Access), "root executes only with an x bit");
    // user. xattrs only on files and directories; in a sticky directory
    // only its owner changes them.
    let fifo = fs.mknod(C, Ino::ROOT, name("fifo"), libc::S_IFIFO | 0o666, 0, 0).unwrap();
    assert_eq!(fs.getxattr(fifo.ino, name("user.a"), u), Err(Error::NoAttr));
    assert_eq!(fs.setxattr(fifo.ino, name("user.a"), b"1", 0, u), Err(Error::NotPermitted));
    assert_eq!(fs.setxattr(tmp, name("user.a"), b"1", 0, u), Err(Error::NotPermitted));
    // rmdir needs write and search on the parent.
    fs.mkdir(C, private, name("sub"), 0o777, 0).unwrap();
    assert_eq!(fs.rmdir(private, name("sub"), u), Err(Error::Access));
    // An exchange across parents needs write permission on a directory it moves.
    fs.mkdir(v, d2.ino, name("ro"), 0o555, 0).unwrap();
    fs.mkdir(v, tmp, name("x"), 0o777, 0).unwrap();
    assert_eq!(fs.rename(tmp, name("x"), d2.ino, name("ro"), RENAME_EXCHANGE, v), Err(Error::Access));

    // The kernel checks: the daemon refuses none of these.
    let kernel = super::tests::fs();
    let (private, _, secret, public) = setup(&kernel);
    assert!(kernel.lookup(private, name("f"), u).is_ok());
    assert!(kernel.open(secret, libc::O_RDWR, u).is_ok());
    assert!(kernel.setattr(public, &SetAttr { mode: Some(0o600), ..SetAttr::default() }, u).is_ok());
    assert!(kernel.unlink(Ino::ROOT, name("public"), u).is_ok());
}

/// A large file written once is written to the state directory once: its
/// pages are new records, not garbage, so no snapshot copies them again
/// (SPEC 9's bound holds: the journal is the live state). Rewriting it
/// leaves garbage, and once that outweighs the live state a compaction
/// reclaims it.
#[test]
fn data_written_once_is_not_compacted_again_and_rewrites_are() {
    let (_dir, fs) = fs_compacting_often();
    let (f, h) = fs.create(C, Ino::ROOT, OsStr::new("big"), 0o644, 0, libc::O_RDWR).unwrap();
    let chunk = vec![7u8; 16 * 1024];
    let write_all = || {
        for i in 0..16u64 {
            fs.write(f.ino, h, i * chunk.len() as u64, &chunk, WriteOpts::default()).unwrap();
            fs.sync().unwrap();
        }
    };
    let store = |fs: &Fs| {
        let st = fs.state.lock();
        let s = st.durable.store.as_ref().unwrap();
        (s.generation(), s.journal_bytes(), s.garbage(), st.durable.compaction.is_some() || s.compacting())
    };
    write_all();
    let (generation, journal, garbage, compacting) = store(&fs);
    assert_eq!((generation, compacting), (0, false), "256 KiB written once started no compaction");
    assert!((256 * 1024..300 * 1024).contains(&journal), "the journal holds the data once: {journal} bytes");
    assert!(garbage < 16 * 1024, "new pages are not garbage: {garbage} bytes");
    write_all();
    write_all();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while store(&fs).0 == 0 || store(&fs).3 {
        assert!(std::time::Instant::now() < deadline, "rewrites never compacted: {:?}", store(&fs));
        fs.tick();
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(store(&fs).2 < 256 * 1024, "the compaction reclaimed the garbage: {:?}", store(&fs));
}

/// A data file goes through the page cache, a lease or set-id file does
/// not; a write through a direct descriptor drops the file's cached pages
/// (every time while a cached descriptor is open, once after), and the
/// write-back of cached pages never does.
#[test]
fn direct_writes_drop_cached_pages_until_no_cached_descriptor_can_refill_them() {
    let fs = fs();
    let (f, cached) = fs.create(C, Ino::ROOT, OsStr::new("data"), 0o644, 0, libc::O_RDWR).unwrap();
    assert!(fs.page_cache(f.ino, cached), "a data file is cached");
    let (s, h) = fs.create(C, Ino::ROOT, OsStr::new("setid"), 0o2767, 0, libc::O_RDWR).unwrap();
    assert!(!fs.page_cache(s.ino, h), "a set-id file is not");
    let direct = fs.open(f.ino, libc::O_RDWR, C).unwrap();
    let write = |h: Handle, writeback: bool| {
        fs.write(f.ino, h, 0, b"x", WriteOpts { writeback, ..WriteOpts::default() }).unwrap();
        fs.take_invalidations()
    };
    assert_eq!(write(direct, false), vec![f.ino], "dropped while a cached descriptor is open");
    assert_eq!(write(direct, false), vec![f.ino], "and again");
    assert!(write(cached, false).is_empty(), "a write through the cache keeps it");
    assert!(write(direct, true).is_empty(), "write-back never waits for a drop");
    fs.release(cached, None).unwrap();
    assert_eq!(write(direct, false), vec![f.ino], "once more after the last cached descriptor closed");
    assert!(write(direct, false).is_empty(), "then nothing can have refilled them");
    // Locked once, the file is a lease: later opens are direct.
    fs.state.lock().lease.raise_all(Epoch(1));
    let again = fs.open(f.ino, libc::O_RDWR, C).unwrap();
    assert!(!fs.page_cache(f.ino, again), "a file with an epoch is not cached");
}
