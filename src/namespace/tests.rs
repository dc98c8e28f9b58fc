use super::dir::{NAME_SHARDS, SPLIT_NAMES_AT};
use super::*;

#[test]
fn sparse_data_reads_holes_as_zeros() {
    let mut d = Data::default();
    d.write(10_000, b"abc").unwrap();
    assert_eq!(d.size(), 10_003);
    assert_eq!(d.pages(), 1);
    assert_eq!(d.read(9_998, 10), b"\0\0abc");
    d.truncate(10_001).unwrap();
    d.truncate(20_000).unwrap();
    assert_eq!(d.read(10_000, 3), b"a\0\0");
    d.truncate(1 << 40).unwrap();
    assert_eq!(d.size(), 1 << 40);
    assert_eq!(d.truncate(MAX_FILE_SIZE + 1), Err(Error::FileTooBig));
    d.zero_range(10_000, 1);
    assert_eq!(d.read(10_000, 1), b"\0");
}

/// A reused read buffer holds exactly the bytes read: holes, short pages
/// and the end of file read as zeros or stop the read, never as what the
/// buffer held before.
#[test]
fn reads_into_a_reused_buffer_hold_only_the_bytes_read() {
    let mut d = Data::default();
    d.write(0, b"head").unwrap();
    d.write(3 * PAGE as u64 + 1, b"xy").unwrap();
    let mut buf = vec![0xAA; 5 * PAGE];
    d.read_into(2, 3 * PAGE, &mut buf);
    let mut want = vec![0u8; 3 * PAGE];
    want[..2].copy_from_slice(b"ad");
    want[3 * PAGE - 1] = b'x';
    assert_eq!(buf, want);
    d.read_into(3 * PAGE as u64, 100, &mut buf);
    assert_eq!(buf, b"\0xy");
    d.read_into(3 * PAGE as u64 + 3, 100, &mut buf);
    assert!(buf.is_empty(), "at the end of file");
    d.read_into(1, 2, &mut buf);
    assert_eq!(buf, b"ea");
    // Starting in a hole, with a buffer full of other bytes.
    buf = vec![0xAA; 5 * PAGE];
    d.read_into(PAGE as u64, 2 * PAGE + 3, &mut buf);
    assert_eq!(buf.len(), 2 * PAGE + 3);
    assert_eq!(&buf[..2 * PAGE + 1], &vec![0u8; 2 * PAGE + 1][..]);
    assert_eq!(&buf[2 * PAGE + 1..], b"xy");
}

fn new_file(ns: &mut Namespace, parent: Ino, name: &str) -> Ino {
    let new = NewInode { kind: Kind::File, perm: 0o644, uid: 0, gid: 0, rdev: 0, symlink: None };
    let ino = ns.alloc(new, parent, SystemTime::now());
    ns.link(parent, OsStr::new(name), ino).unwrap();
    ino
}

#[test]
fn path_hints_follow_the_last_name_and_are_verified() {
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    let d = ns.alloc(
        NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None },
        Ino::ROOT,
        SystemTime::now(),
    );
    ns.link(Ino::ROOT, OsStr::new("d"), d).unwrap();
    let f = new_file(&mut ns, d, "a");
    assert_eq!(ns.path_hint(f), Some(std::path::PathBuf::from("d/a")));
    ns.link(Ino::ROOT, OsStr::new("b"), f).unwrap();
    assert_eq!(ns.path_hint(f), Some(std::path::PathBuf::from("b")), "the last name given wins");
    ns.unlink(Ino::ROOT, OsStr::new("b")).unwrap();
    assert_eq!(ns.path_hint(f), None, "a removed name is not trusted (callers walk the tree)");
    assert_eq!(ns.path_hint(d), Some(std::path::PathBuf::from("d")), "directories have one too");
    // A directory's path comes from its hint, checked, and from a walk of
    // its parent when the hint is stale.
    let e = ns.alloc(
        NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None },
        d,
        SystemTime::now(),
    );
    ns.link(d, OsStr::new("e"), e).unwrap();
    assert_eq!(ns.dir_path(e), Some(vec![OsString::from("d"), OsString::from("e")]));
    ns.hint(e, d, OsStr::new("stale"));
    assert_eq!(ns.dir_path(e), Some(vec![OsString::from("d"), OsString::from("e")]));
}

#[test]
fn dirty_tracking_records_pages_names_and_drops() {
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    let f = new_file(&mut ns, Ino::ROOT, "f");
    ns.get_mut(f).unwrap().data_mut().unwrap().write(5000, b"x").unwrap();
    assert!(ns.dirty().0.contains(&f) && ns.dirty().0.contains(&Ino::ROOT));
    assert_eq!(ns.get(f).unwrap().data().unwrap().dirty_pages().collect::<Vec<_>>(), vec![1]);
    ns.clear_dirty();
    assert!(ns.dirty().0.is_empty());
    ns.get_mut(f).unwrap().data_mut().unwrap().truncate(0).unwrap();
    assert_eq!(
        ns.get(f).unwrap().data().unwrap().dirty_pages().collect::<Vec<_>>(),
        vec![1],
        "dropped pages are dirty"
    );
    ns.unlink(Ino::ROOT, OsStr::new("f")).unwrap();
    let names: Vec<_> = ns.get(Ino::ROOT).unwrap().dir().unwrap().dirty_names().cloned().collect();
    assert_eq!(names, vec![OsString::from("f")]);
    assert!(ns.dirty().1.contains(&f) && !ns.dirty().0.contains(&f), "a dropped inode is recorded as freed");
}

#[test]
fn seek_data_and_hole_follow_stored_pages() {
    let mut d = Data::default();
    assert_eq!((d.seek_data(0), d.seek_hole(0)), (None, None), "empty file: ENXIO");
    d.write(0, b"a").unwrap();
    d.write(3 * PAGE as u64 + 10, b"b").unwrap();
    d.truncate(8 * PAGE as u64).unwrap();
    assert_eq!(d.seek_data(0), Some(0));
    assert_eq!(d.seek_hole(0), Some(PAGE as u64));
    assert_eq!(d.seek_data(1), Some(1));
    assert_eq!(d.seek_data(PAGE as u64), Some(3 * PAGE as u64));
    assert_eq!(d.seek_hole(3 * PAGE as u64 + 5), Some(4 * PAGE as u64));
    assert_eq!(d.seek_data(4 * PAGE as u64), None, "only holes follow");
    assert_eq!(d.seek_hole(5 * PAGE as u64 + 1), Some(5 * PAGE as u64 + 1));
    assert_eq!(d.seek_hole(8 * PAGE as u64), None, "at the end: ENXIO");
    // A data page running to the end: the hole is the end of file.
    let mut e = Data::default();
    e.write(0, &[1u8; 100]).unwrap();
    assert_eq!(e.seek_hole(0), Some(100));
}

/// A file created and removed between two flushes leaves nothing to
/// record (churn of unique names must not grow the journal), while
/// removing a name the last flush saw is recorded.
#[test]
fn churn_between_flushes_records_nothing() {
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    let kept = new_file(&mut ns, Ino::ROOT, "kept");
    ns.clear_dirty();
    for i in 0..100 {
        let name = format!("t{i}");
        new_file(&mut ns, Ino::ROOT, &name);
        ns.unlink(Ino::ROOT, OsStr::new(&name)).unwrap();
    }
    assert!(ns.dirty().1.is_empty(), "never-flushed inodes need no free record");
    assert_eq!(ns.get(Ino::ROOT).unwrap().dir().unwrap().dirty_names().count(), 0);
    ns.unlink(Ino::ROOT, OsStr::new("kept")).unwrap();
    let names: Vec<_> = ns.get(Ino::ROOT).unwrap().dir().unwrap().dirty_names().cloned().collect();
    assert_eq!(names, vec![OsString::from("kept")]);
    assert!(ns.dirty().1.contains(&kept));
    // Re-created under the same name before the next flush: recorded.
    new_file(&mut ns, Ino::ROOT, "kept");
    assert_eq!(ns.get(Ino::ROOT).unwrap().dir().unwrap().dirty_names().count(), 1);
}

/// Every way a name can change between two flushes is listed exactly once
/// (the flush records each listed name as it is then), without copying the
/// names of new entries; pages of a small file are tracked inline.
#[test]
fn dirty_names_list_each_changed_name_once() {
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    for n in ["old", "gone", "back", "again", "moved"] {
        new_file(&mut ns, Ino::ROOT, n);
    }
    ns.clear_dirty();
    let names = |ns: &Namespace| {
        let mut v: Vec<String> =
            ns.get(Ino::ROOT).unwrap().dir().unwrap().dirty_names().map(|n| n.to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert!(names(&ns).is_empty());
    new_file(&mut ns, Ino::ROOT, "new");
    ns.unlink(Ino::ROOT, OsStr::new("gone")).unwrap();
    // Removed and created again: once (as it is now).
    ns.unlink(Ino::ROOT, OsStr::new("back")).unwrap();
    new_file(&mut ns, Ino::ROOT, "back");
    // Removed, created, removed again: once (gone).
    ns.unlink(Ino::ROOT, OsStr::new("again")).unwrap();
    new_file(&mut ns, Ino::ROOT, "again");
    ns.unlink(Ino::ROOT, OsStr::new("again")).unwrap();
    // Pointed at another inode in place (a rename over it).
    let other = new_file(&mut ns, Ino::ROOT, "tmp");
    ns.unlink(Ino::ROOT, OsStr::new("tmp")).unwrap();
    ns.get_mut(Ino::ROOT).unwrap().dir_mut().unwrap().insert("moved".into(), other);
    assert_eq!(names(&ns), ["again", "back", "gone", "moved", "new"]);
    let root = ns.get(Ino::ROOT).unwrap().dir().unwrap();
    let now: Vec<_> =
        ["again", "back", "gone", "moved", "new"].iter().map(|n| root.get(OsStr::new(n)).is_some()).collect();
    assert_eq!(now, [false, true, false, true, true]);
    ns.clear_dirty();
    assert!(names(&ns).is_empty());
    // Pages: one inline, more in a set, each once, in order.
    let f = new_file(&mut ns, Ino::ROOT, "pages");
    let d = ns.get_mut(f).unwrap().data_mut().unwrap();
    d.write(0, b"a").unwrap();
    d.write(1, b"b").unwrap();
    assert_eq!(d.dirty_pages().collect::<Vec<_>>(), vec![0]);
    d.write(3 * PAGE as u64, b"c").unwrap();
    d.write(PAGE as u64, b"d").unwrap();
    assert_eq!(d.dirty_pages().collect::<Vec<_>>(), vec![0, 1, 3]);
}

#[test]
fn readdir_cookies_survive_removal_and_insertion() {
    let mut d = Dir::new(Ino::ROOT);
    for (n, i) in [("a", 2), ("b", 3), ("c", 4)] {
        d.insert(n.into(), Ino(i));
    }
    let first = d.after(0, 2);
    assert_eq!(first.len(), 2);
    let resume = first[1].0;
    d.remove(OsStr::new("a"));
    d.insert("d".into(), Ino(5));
    let rest: Vec<_> = d.after(resume, 10).into_iter().map(|e| e.1).collect();
    assert_eq!(rest, vec![OsString::from("c"), OsString::from("d")]);
}

#[test]
fn names_are_checked() {
    assert_eq!(check_name(OsStr::new(&"x".repeat(256))), Err(Error::NameTooLong));
    assert!(check_name(OsStr::new(&"x".repeat(255))).is_ok());
    assert_eq!(check_name(OsStr::new("a/b")), Err(Error::Invalid));
}

#[test]
fn a_large_directory_splits_its_names_and_finds_every_one() {
    let mut d = Dir::new(Ino::ROOT);
    let n = SPLIT_NAMES_AT + 5000;
    for i in 0..n {
        d.insert(OsString::from(format!("lease-{i}")), Ino(i as u64 + 10));
    }
    assert_eq!(d.by_name.shards.len(), NAME_SHARDS);
    assert_eq!(d.len(), n);
    // Replace some, remove some: lookups, the count and the listing agree.
    for i in (0..n).step_by(3) {
        d.insert(OsString::from(format!("lease-{i}")), Ino(7));
    }
    for i in (1..n).step_by(3) {
        assert_eq!(d.remove(OsStr::new(&format!("lease-{i}"))), Some(Ino(i as u64 + 10)));
    }
    assert_eq!(d.remove(OsStr::new("lease-1")), None);
    for i in 0..n {
        let want = match i % 3 {
            0 => Some(Ino(7)),
            1 => None,
            _ => Some(Ino(i as u64 + 10)),
        };
        assert_eq!(d.get(OsStr::new(&format!("lease-{i}"))), want, "lease-{i}");
    }
    assert_eq!(d.len(), (0..n).filter(|i| i % 3 != 1).count());
    assert_eq!(d.iter().count(), d.len());
    assert!(d.by_name.shards.iter().all(|s| s.len() < 2 * n / NAME_SHARDS), "names spread over the tables");
}

/// Recovery rebuilds what is not stored: link counts (a file under two
/// names, a directory's subdirectories), each directory's parent, path
/// hints; it drops inodes no name leads to (with what only they name) and
/// entries naming an inode that is gone.
#[test]
fn restore_counts_links_and_drops_what_no_name_reaches() {
    let now = SystemTime::now();
    let dir = NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None };
    let mut ns = Namespace::new(0o755, 0, 0, now);
    let twice = new_file(&mut ns, Ino::ROOT, "a");
    ns.link(Ino::ROOT, OsStr::new("b"), twice).unwrap();
    let d = ns.alloc(dir.clone(), Ino::ROOT, now);
    ns.link(Ino::ROOT, OsStr::new("d"), d).unwrap();
    let x = new_file(&mut ns, d, "x");
    ns.link(d, OsStr::new("also-a"), twice).unwrap();
    let gone = new_file(&mut ns, d, "ghost");
    // Not named anywhere: a file, and a directory with a file of its own.
    let lost = ns.alloc(NewInode { kind: Kind::File, perm: 0o644, uid: 0, gid: 0, rdev: 0, symlink: None }, d, now);
    let lost_dir = ns.alloc(dir, Ino::ROOT, now);
    let in_lost = new_file(&mut ns, lost_dir, "f");
    let next = ns.next_ino();
    let mut inodes = std::mem::take(&mut ns.inodes);
    inodes.remove(&gone);
    for i in inodes.values_mut() {
        i.nlink = 0;
    }
    let dirs = [Ino::ROOT, d, lost_dir].into_iter().collect();
    let ns = Namespace::restore(inodes, &dirs, next, Namespace::new(0o755, 0, 0, now));
    for ino in [gone, lost, lost_dir, in_lost] {
        assert!(ns.get(ino).is_err(), "{ino:?} is not reachable");
    }
    assert_eq!(ns.len(), 4, "the root, a/b/also-a, d and x");
    assert_eq!(ns.get(twice).unwrap().nlink, 3);
    assert_eq!(ns.get(x).unwrap().nlink, 1);
    assert_eq!(ns.get(d).unwrap().nlink, 2);
    assert_eq!(ns.get(Ino::ROOT).unwrap().nlink, 3);
    assert_eq!(ns.get(d).unwrap().dir().unwrap().parent, Ino::ROOT);
    assert_eq!(ns.child(d, OsStr::new("ghost")), Err(Error::NotFound));
    assert_eq!(ns.get(d).unwrap().dir().unwrap().len(), 2);
    assert_eq!(ns.path_hint(x), Some(std::path::PathBuf::from("d/x")));
    assert_eq!(ns.next_ino(), next, "numbers of dropped inodes are not handed out again");
}

/// A directory told how many names it will get (recovery reads the count
/// from its record) allocates its tables once, split already when that many
/// would split them, and every name lands and is found.
#[test]
fn a_directory_reserved_for_its_names_allocates_its_tables_once() {
    let n = 3 * SPLIT_NAMES_AT;
    let mut d = Dir::new(Ino::ROOT);
    d.reserve(n);
    assert_eq!(d.by_name.shards.len(), NAME_SHARDS, "split from the start");
    let room: usize = d.by_name.shards.iter().map(|s| s.capacity()).sum();
    assert!(room >= n, "room for {room} names");
    for i in 0..n {
        d.insert(format!("lease-{i}").into(), Ino(i as u64 + 2));
    }
    let after: usize = d.by_name.shards.iter().map(|s| s.capacity()).sum();
    assert_eq!(after, room, "no table grew");
    assert_eq!(d.len(), n);
    assert!((0..n).all(|i| d.get(OsStr::new(&format!("lease-{i}"))) == Some(Ino(i as u64 + 2))));
    // A small directory keeps one table; a reserve after names came is ignored.
    let mut small = Dir::new(Ino::ROOT);
    small.reserve(10);
    assert_eq!(small.by_name.shards.len(), 1);
    small.insert("a".into(), Ino(5));
    small.reserve(n);
    assert_eq!((small.by_name.shards.len(), small.get(OsStr::new("a"))), (1, Some(Ino(5))));
}
