/// The checksum is the one the record format always used (CRC-32 IEEE,
/// reflected 0xEDB88320), bit by bit.
#[test]
fn crc32_matches_the_reference_definition() {
    fn reference(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }
    assert_eq!(crate::store::records::crc32(b"123456789"), 0xCBF4_3926);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for len in [0, 1, 7, 64, 4095, 4096, 100_000] {
        assert_eq!(crate::store::records::crc32(&data[..len]), reference(&data[..len]), "length {len}");
    }
}

use super::*;
use crate::namespace::{Ino, Kind, Namespace, NewInode};
use crate::store::encode::{CHECK, PIECE};
use crate::store::storage::MemStorage;
use std::ffi::OsStr;

fn file(ns: &mut Namespace, parent: Ino, name: &str, content: &[u8]) -> Ino {
    let now = SystemTime::now();
    let ino = ns.alloc(NewInode { kind: Kind::File, perm: 0o644, uid: 0, gid: 0, rdev: 0, symlink: None }, parent, now);
    ns.link(parent, OsStr::new(name), ino).unwrap();
    ns.get_mut(ino).unwrap().data_mut().unwrap().write(0, content).unwrap();
    ino
}

/// A canonical view of a namespace: every path with its kind and content.
fn view(ns: &Namespace) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![(Ino::ROOT, String::new())];
    while let Some((dir, path)) = stack.pop() {
        for (name, ino) in ns.get(dir).unwrap().dir().unwrap().iter() {
            let p = format!("{path}/{}", name.to_string_lossy());
            let i = ns.get(ino).unwrap();
            let what = match &i.body {
                Body::File(d) => {
                    format!("file {:?} nlink {}", String::from_utf8_lossy(&d.read(0, 1 << 20)), i.nlink)
                }
                Body::Dir(_) => {
                    stack.push((ino, p.clone()));
                    format!("dir nlink {}", i.nlink)
                }
                Body::Symlink(t) => format!("symlink {t:?}"),
                Body::Special => "special".into(),
            };
            let x: Vec<String> = i.xattrs.iter().map(|(k, v)| format!("{k:?}={v:?}")).collect();
            out.push((p, format!("{what} {x:?}")));
        }
    }
    out.sort();
    out
}

fn recover(storage: MemStorage) -> Namespace {
    let (_, rec) = Store::open(Box::new(storage)).unwrap();
    Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, Namespace::new(0o755, 0, 0, SystemTime::UNIX_EPOCH))
}

fn flush(ns: &mut Namespace, store: &mut Store) {
    let batch = encode_changes(ns, |_| Extra::default());
    store.commit(&batch).unwrap();
    ns.clear_dirty();
}

#[test]
fn records_round_trip_with_crc() {
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    let f = file(&mut ns, Ino::ROOT, "a", b"hello");
    ns.get_mut(f).unwrap().xattrs.insert("user.x".into(), b"1".to_vec());
    let img = encode_all(Enc::default(), &ns, |_| Extra { ttl_ms: Some(1500), guard: Some("lease".into()) });
    let mut seen = 0;
    assert!(matches!(scan(&img, |b| seen += b.len()), Ok(Scan::Clean(_))));
    assert!(seen >= 4);
    let mut bad = img.clone();
    bad[14] ^= 1;
    assert_eq!(scan(&bad, |_| {}).err(), Some(0), "a bad first record followed by more is corruption");
}

/// What [`view`] shows of a namespace.
type View = Vec<(String, String)>;

/// A store on crash-recording storage, a tracked empty namespace, and the
/// acknowledged views so far (the empty one, before any image).
fn recording_workload() -> (Store, Namespace, Vec<View>, Vec<usize>) {
    let (store, _) = Store::open(Box::new(MemStorage::recording())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    let acked = vec![view(&ns)];
    (store, ns, acked, vec![0])
}

/// Every crash image taken at every write and sync of a workload
/// recovers to a state at least as new as the last acknowledged flush,
/// and never to something that was not there.
#[test]
fn every_crash_image_recovers_what_was_acknowledged() {
    let (mut store, mut ns, mut acked, mut images_at_ack) = recording_workload();
    store.snapshot_min = 600; // compact often
    for step in 0..12u32 {
        let name = format!("f{}", step % 5);
        match step % 4 {
            0 => {
                if let Ok(ino) = ns.child(Ino::ROOT, OsStr::new(&name)) {
                    let d = ns.get_mut(ino).unwrap().data_mut().unwrap();
                    d.truncate(0).unwrap();
                    d.write(0, format!("v{step}").as_bytes()).unwrap();
                } else {
                    file(&mut ns, Ino::ROOT, &name, format!("v{step}").as_bytes());
                }
            }
            1 => {
                let _ = ns.unlink(Ino::ROOT, OsStr::new(&name));
            }
            2 => {
                let big = vec![b'x'; 5000 + step as usize];
                file(&mut ns, Ino::ROOT, &format!("big{step}"), &big);
            }
            _ => {
                let ino = ns.child(Ino::ROOT, OsStr::new("big2")).ok();
                if let Some(ino) = ino {
                    ns.get_mut(ino).unwrap().data_mut().unwrap().truncate(10).unwrap();
                }
            }
        }
        flush(&mut ns, &mut store);
        if store.wants_snapshot() {
            let img = encode_all(store.head(), &ns, |_| Extra::default());
            store.snapshot(img).unwrap();
        }
        acked.push(view(&ns));
        images_at_ack.push(recording(&store).images.len());
    }
    every_image_recovers_an_acknowledged_state(&store, &acked, &images_at_ack);
}

/// Each crash image recorded by the store's backend recovers to the newest
/// namespace acknowledged before the image was taken, or the one after it
/// (the flush in flight). `images_at_ack[i]` is how many images existed
/// when `acked[i]` was acknowledged.
fn every_image_recovers_an_acknowledged_state(store: &Store, acked: &[Vec<(String, String)>], images_at_ack: &[usize]) {
    let images = recording(store).images.clone();
    assert!(images.len() > 100, "{} images", images.len());
    for (n, img) in images.into_iter().enumerate() {
        let last = images_at_ack.iter().rposition(|&at| at <= n).unwrap();
        let got = view(&recover(img));
        let ok = acked[last..].iter().take(2).any(|v| *v == got);
        assert!(ok, "image {n}: recovered {got:?}\nacknowledged {:?}", acked[last]);
    }
}

/// The same for a snapshot written off the request path: batches are
/// flushed after the image was taken and while it is written, and every
/// crash image (before, during and after the snapshot's rename and the new
/// journal) recovers to the last acknowledged namespace or the next one.
#[test]
fn every_crash_image_of_a_background_snapshot_recovers_what_was_acknowledged() {
    let (mut store, mut ns, mut acked, mut images_at_ack) = recording_workload();
    let (mut job, mut written) = (None, None);
    for step in 0..16u32 {
        let name = format!("f{}", step % 3);
        if step % 2 == 0 {
            if let Ok(ino) = ns.child(Ino::ROOT, OsStr::new(&name)) {
                let d = ns.get_mut(ino).unwrap().data_mut().unwrap();
                d.truncate(0).unwrap();
                d.write(0, format!("v{step}").as_bytes()).unwrap();
            } else {
                file(&mut ns, Ino::ROOT, &name, format!("v{step}").repeat(900).as_bytes());
            }
        } else {
            let _ = ns.unlink(Ino::ROOT, OsStr::new(&name));
        }
        flush(&mut ns, &mut store);
        // Every fourth step: take the image; the next step's flush lands
        // while it is being written; the one after, once it was renamed.
        match step % 4 {
            0 => {
                assert!(!store.compacting());
                job = Some(background_job(&mut store, &ns));
                assert!(store.compacting());
            }
            1 => {
                let j = job.take().unwrap();
                written = Some(write_snapshot(recording_mut(&mut store), &j));
            }
            2 => {
                store.finish_snapshot(written.take().unwrap()).unwrap();
                assert!(!store.compacting());
            }
            _ => {}
        }
        acked.push(view(&ns));
        images_at_ack.push(recording(&store).images.len());
    }
    assert!(store.generation() >= 4, "generation {}", store.generation());
    every_image_recovers_an_acknowledged_state(&store, &acked, &images_at_ack);
}

/// Move `name` from directory `from` to `to` (as rename does).
fn move_entry(ns: &mut Namespace, from: Ino, to: Ino, name: &str) {
    let ino = ns.get_mut(from).unwrap().dir_mut().unwrap().remove(OsStr::new(name)).unwrap();
    if ns.get(ino).unwrap().kind == Kind::Dir {
        ns.get_mut(from).unwrap().nlink -= 1;
    } else {
        ns.get_mut(ino).unwrap().nlink -= 1;
    }
    ns.link(to, OsStr::new(name), ino).unwrap();
}

/// A snapshot started off the request path, its image encoded at once.
fn background_job(store: &mut Store, ns: &Namespace) -> SnapshotJob {
    let head = store.begin_snapshot().unwrap();
    store.snapshot_job(vec![encode_all(head, ns, |_| Extra::default())])
}

/// A fuzzy image: encoded a slice at a time while files are created,
/// written, truncated, hard-linked, unlinked and moved between directories
/// (directories too, so that a slice taken before a move and one taken
/// after it both see the moved entry), each change flushed before the next
/// slice; then written while more batches land. Every crash image
/// recovers an acknowledged namespace, and the last one recovers whole.
#[test]
fn every_crash_image_of_a_snapshot_encoded_in_slices_recovers_what_was_acknowledged() {
    let (mut store, mut ns, mut acked, mut images_at_ack) = recording_workload();
    let now = SystemTime::now();
    let mkdir = |ns: &mut Namespace, parent: Ino, name: &str| {
        let new = NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None };
        let ino = ns.alloc(new, parent, now);
        ns.link(parent, OsStr::new(name), ino).unwrap();
        ino
    };
    let (a, b) = (mkdir(&mut ns, Ino::ROOT, "a"), mkdir(&mut ns, Ino::ROOT, "b"));
    let sub = mkdir(&mut ns, a, "sub");
    for i in 0..320 {
        file(&mut ns, [a, b, sub][i % 3], &format!("f{i}"), format!("v{i}").as_bytes());
    }
    let big = file(&mut ns, b, "big", &vec![b'x'; 40 * 4096]);
    flush(&mut ns, &mut store);
    acked.push(view(&ns));
    images_at_ack.push(recording(&store).images.len());
    let head = store.begin_snapshot().unwrap();
    let mut slices = Slices::new(head, &ns);
    // Pieces of a few records each (records never straddle two), and
    // directories and the large file encoded over several slices.
    slices.piece = 2048;
    slices.run = 8;
    slices.check = 8;
    let mut step = 0usize;
    let change = |ns: &mut Namespace, step: usize| {
        // The moved directory and the files are in both halves of the
        // image's key order whatever the hash order is.
        let (from, to) = if step.is_multiple_of(2) { (a, b) } else { (b, a) };
        move_entry(ns, from, to, "sub");
        let d = ns.get_mut(big).unwrap().data_mut().unwrap();
        d.write((step * 7 % 40) as u64 * 4096, format!("changed {step}").as_bytes()).unwrap();
        if step % 4 == 3 {
            d.truncate((40 - step as u64 % 30) * 4096 - 100).unwrap();
        }
        // Files of `a` (f0, f3, ...), re-created once gone.
        let name = format!("f{}", step * 3 % 320);
        let dir = a;
        if ns.child(dir, OsStr::new(&name)).is_err() {
            file(ns, dir, &name, b"again");
        }
        match step % 4 {
            0 => ns.unlink(dir, OsStr::new(&name)).map(drop).unwrap(),
            1 => {
                let ino = ns.child(dir, OsStr::new(&name)).unwrap();
                let d = ns.get_mut(ino).unwrap().data_mut().unwrap();
                d.truncate(1).unwrap();
                d.write(5000, b"tail").unwrap();
            }
            2 => {
                let ino = ns.child(dir, OsStr::new(&name)).unwrap();
                let _ = ns.link(sub, OsStr::new(&format!("link{step}")), ino);
            }
            _ => {
                if ns.child(sub, OsStr::new(&format!("new{step}"))).is_err() {
                    file(ns, sub, &format!("new{step}"), b"new");
                }
            }
        }
    };
    let mut n = 0;
    while !slices.step(&ns, |_| Extra::default(), std::time::Duration::ZERO) {
        n += 1;
        if n % 3 != 0 {
            continue;
        }
        change(&mut ns, step);
        step += 1;
        flush(&mut ns, &mut store);
        acked.push(view(&ns));
        images_at_ack.push(recording(&store).images.len());
    }
    assert!(step >= 8, "the image took {n} slices");
    let pieces = slices.finish(&ns);
    assert!(pieces.len() > 10, "{} pieces", pieces.len());
    let job = store.snapshot_job(pieces);
    change(&mut ns, step);
    flush(&mut ns, &mut store);
    acked.push(view(&ns));
    images_at_ack.push(recording(&store).images.len());
    let written = write_snapshot(recording_mut(&mut store), &job);
    store.finish_snapshot(written).unwrap();
    change(&mut ns, step + 1);
    flush(&mut ns, &mut store);
    acked.push(view(&ns));
    images_at_ack.push(recording(&store).images.len());
    every_image_recovers_an_acknowledged_state(&store, &acked, &images_at_ack);
    assert_eq!(view(&recover(recording(&store).clone())), view(&ns));
}

fn recording(store: &Store) -> &MemStorage {
    // SAFETY-free downcast: tests only ever put a MemStorage here.
    let any: &dyn std::any::Any = store.storage.as_any();
    any.downcast_ref::<MemStorage>().unwrap()
}

#[test]
fn corruption_before_the_tail_refuses_and_a_torn_tail_is_cut() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    file(&mut ns, Ino::ROOT, "a", b"1");
    flush(&mut ns, &mut store);
    file(&mut ns, Ino::ROOT, "b", b"2");
    flush(&mut ns, &mut store);
    let end = store.journal_bytes() as usize;
    let mem = recording_mut(&mut store);
    let mut j = mem.read(JOURNAL).unwrap().unwrap();
    assert!(j.len() > end && j[end..].iter().all(|&b| b == 0), "zeros written ahead");
    j.truncate(end);
    // Torn: drop the last 3 bytes: "b" is gone, "a" stays.
    let mut torn = MemStorage::default();
    torn.append(JOURNAL, &j[..j.len() - 3]).unwrap();
    let (_, rec) = Store::open(Box::new(torn)).unwrap();
    assert!(rec.cut > 0);
    let ns2 =
        Namespace::restore(rec.inodes, &rec.dirs, rec.next_ino, Namespace::new(0o755, 0, 0, SystemTime::UNIX_EPOCH));
    assert!(ns2.child(Ino::ROOT, OsStr::new("a")).is_ok());
    assert!(ns2.child(Ino::ROOT, OsStr::new("b")).is_err());
    // Zeros at the end (a crash after the size grew): also a tail.
    let mut zeros = MemStorage::default();
    zeros.append(JOURNAL, &j).unwrap();
    zeros.append(JOURNAL, &[0u8; 100]).unwrap();
    assert!(Store::open(Box::new(zeros)).is_ok());
    // A flipped byte in the first batch: corruption, refuse.
    let mut bad = MemStorage::default();
    let mut jb = j.clone();
    jb[30] ^= 0x40;
    bad.append(JOURNAL, &jb).unwrap();
    let err = Store::open(Box::new(bad)).unwrap_err();
    assert!(err.contains("namespace.journal") && err.contains("offset"), "{err}");
}

/// Small batches are written over zeros written ahead of the journal's
/// records, and a crash may leave those writes' sectors out of order: a
/// sector of zeros inside a batch, with later batches after it, is a torn
/// tail (cut, with what follows it); a damaged sector without zeros is
/// corruption and stops start-up.
#[test]
fn a_hole_of_zeros_over_the_space_written_ahead_is_a_torn_tail() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    file(&mut ns, Ino::ROOT, "a", b"1");
    flush(&mut ns, &mut store);
    let after_a = store.journal_bytes() as usize;
    file(&mut ns, Ino::ROOT, "b", &[2; 3 * 4096]);
    flush(&mut ns, &mut store);
    let after_b = store.journal_bytes() as usize;
    file(&mut ns, Ino::ROOT, "c", b"3");
    flush(&mut ns, &mut store);
    let j = recording_mut(&mut store).read(JOURNAL).unwrap().unwrap();
    assert!(j.len() > store.journal_bytes() as usize, "b and c were written over zeros written ahead");
    let open = |img: &[u8]| {
        let mut m = MemStorage::default();
        m.append(JOURNAL, img).unwrap();
        Store::open(Box::new(m))
    };
    let names = |rec: crate::store::snapshot::Recovered| {
        let ns = Namespace::restore(
            rec.inodes,
            &rec.dirs,
            rec.next_ino,
            Namespace::new(0o755, 0, 0, SystemTime::UNIX_EPOCH),
        );
        ["a", "b", "c"].into_iter().filter(|n| ns.child(Ino::ROOT, OsStr::new(n)).is_ok()).collect::<Vec<_>>()
    };
    // A sector in the middle of b's batch never reached the disk.
    let sector = (after_a + after_b) / 2 / 512 * 512;
    assert!(sector > after_a + 512 && sector + 512 < after_b);
    let mut hole = j.clone();
    hole[sector..sector + 512].fill(0);
    let (_, rec) = open(&hole).expect("a hole over zeros written ahead is a torn tail");
    assert!(rec.cut > 0, "the torn tail is reported");
    assert_eq!(names(rec), ["a"], "b and everything after the hole is cut");
    // The same sector damaged instead: corruption.
    let mut rot = j.clone();
    rot[sector + 100] ^= 0x40;
    let err = open(&rot).unwrap_err();
    assert!(err.contains("namespace.journal") && err.contains("corrupt"), "{err}");
    // Whole, with its zeros: everything, nothing cut.
    let (_, rec) = open(&j).unwrap();
    assert_eq!(rec.cut, 0);
    assert_eq!(names(rec), ["a", "b", "c"]);
}

fn recording_mut(store: &mut Store) -> &mut MemStorage {
    store.storage.as_any_mut().downcast_mut::<MemStorage>().unwrap()
}

#[test]
fn a_clean_reopen_cuts_nothing_and_replays_every_batch() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    file(&mut ns, Ino::ROOT, "a", b"1");
    flush(&mut ns, &mut store);
    let img = recording_mut(&mut store).clone();
    let (store2, rec) = Store::open(Box::new(img)).unwrap();
    assert_eq!((rec.cut, rec.batches), (0, 2), "header batch + one flush");
    assert_eq!(store2.journal_bytes(), store.journal_bytes());
}

#[test]
fn a_journal_newer_than_its_snapshot_refuses_to_start() {
    // A journal of generation 1 without the snapshot that began it: the
    // snapshot's rename was lost, so replaying would serve a wrong tree.
    let mut e = Enc::default();
    e.header(1);
    e.commit(0);
    let mut mem = MemStorage::default();
    mem.append(JOURNAL, &e.buf).unwrap();
    let err = Store::open(Box::new(mem)).unwrap_err();
    assert!(err.contains("generation 1 is newer than the snapshot's (0)"), "{err}");
}

/// The zeros written ahead are only an aid: a disk without room for them
/// still takes the batch, without zeros, and the next small batch tries
/// again.
#[test]
fn a_full_disk_skips_the_zeros_ahead_but_keeps_the_batch() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    file(&mut ns, Ino::ROOT, "a", b"1");
    let ops = recording_mut(&mut store).ops;
    // The batch's write, then the zeros' write: that one finds the disk full.
    recording_mut(&mut store).fail_at = Some((ops + 2, libc::ENOSPC));
    flush(&mut ns, &mut store);
    assert!(!store.failed());
    assert_eq!(recording_mut(&mut store).len(JOURNAL), store.journal_bytes(), "no zeros ahead");
    file(&mut ns, Ino::ROOT, "b", b"2");
    flush(&mut ns, &mut store);
    assert_eq!(recording_mut(&mut store).len(JOURNAL), store.journal_bytes() + ZERO_AHEAD, "tried again");
    let names = view(&recover(recording_mut(&mut store).clone()));
    assert_eq!(names, view(&ns));
}

#[test]
fn enospc_keeps_changes_pending_and_other_errors_are_fail_stop() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    file(&mut ns, Ino::ROOT, "a", b"1");
    let ops = recording_mut(&mut store).ops;
    recording_mut(&mut store).fail_at = Some((ops + 1, libc::ENOSPC));
    let batch = encode_changes(&ns, |_| Extra::default());
    assert_eq!(store.commit(&batch).unwrap_err().raw_os_error(), Some(libc::ENOSPC));
    assert!(!store.failed());
    store.commit(&batch).unwrap();
    ns.clear_dirty();
    let ops = recording_mut(&mut store).ops;
    recording_mut(&mut store).fail_at = Some((ops + 2, libc::EIO));
    file(&mut ns, Ino::ROOT, "b", b"2");
    let batch = encode_changes(&ns, |_| Extra::default());
    assert_eq!(store.commit(&batch).unwrap_err().raw_os_error(), Some(libc::EIO));
    assert!(store.failed());
    assert_eq!(store.commit(&batch).unwrap_err().raw_os_error(), Some(libc::EIO), "fail-stop");
    let img = recording_mut(&mut store).clone();
    let ns2 = recover(img);
    assert!(ns2.child(Ino::ROOT, OsStr::new("a")).is_ok());
}

/// A full disk just after a background snapshot was installed, when its new
/// journal is started: the snapshot continues from the current journal,
/// appends go on there, and the next compaction starts the new journal.
/// Every crash image of both rounds recovers what was acknowledged.
#[test]
fn a_full_disk_when_the_new_journal_starts_keeps_the_current_one() {
    let (mut store, mut ns, mut acked, mut images_at_ack) = recording_workload();
    let mut step = 0u32;
    let mut work = |ns: &mut Namespace, store: &mut Store, acked: &mut Vec<_>, at: &mut Vec<usize>| {
        step += 1;
        let name = format!("f{}", step % 3);
        if step.is_multiple_of(3) {
            let _ = ns.unlink(Ino::ROOT, OsStr::new(&name));
        } else if let Ok(ino) = ns.child(Ino::ROOT, OsStr::new(&name)) {
            ns.get_mut(ino).unwrap().data_mut().unwrap().write(0, format!("v{step}").as_bytes()).unwrap();
        } else {
            file(ns, Ino::ROOT, &name, format!("v{step}").repeat(500).as_bytes());
        }
        flush(ns, store);
        acked.push(view(ns));
        at.push(recording(store).images.len());
    };
    work(&mut ns, &mut store, &mut acked, &mut images_at_ack);
    let first = store.journal;
    let job = background_job(&mut store, &ns);
    work(&mut ns, &mut store, &mut acked, &mut images_at_ack);
    // write_snapshot: sync the journal, write, sync, rename, sync the
    // directory, then the new journal's write fails.
    let mem = recording_mut(&mut store);
    mem.fail_at = Some((mem.ops + 6, libc::ENOSPC));
    let written = write_snapshot(recording_mut(&mut store), &job);
    let e = store.finish_snapshot(written).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    assert_eq!((store.generation(), store.journal_gen, store.journal), (1, 0, first));
    for _ in 0..3 {
        work(&mut ns, &mut store, &mut acked, &mut images_at_ack);
    }
    let job = background_job(&mut store, &ns);
    work(&mut ns, &mut store, &mut acked, &mut images_at_ack);
    let written = write_snapshot(recording_mut(&mut store), &job);
    store.finish_snapshot(written).unwrap();
    assert_eq!((store.generation(), store.journal_gen), (2, 2));
    assert_ne!(store.journal, first);
    for _ in 0..3 {
        work(&mut ns, &mut store, &mut acked, &mut images_at_ack);
    }
    every_image_recovers_an_acknowledged_state(&store, &acked, &images_at_ack);
}

#[test]
fn small_files_are_stored_compactly_and_reserved_pages_survive_recovery() {
    use crate::namespace::PAGE;
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    let small = file(&mut ns, Ino::ROOT, "lease.json", b"{\"holder\":42}\n");
    let reserved = file(&mut ns, Ino::ROOT, "reserved", b"");
    ns.get_mut(reserved).unwrap().data_mut().unwrap().allocate(0, 2 * PAGE as u64);
    let big = file(&mut ns, Ino::ROOT, "big", &vec![7u8; 3 * PAGE + 5]);
    flush(&mut ns, &mut store);
    // The journal holds the 14 bytes, not a 4 KiB page per small file.
    let journal = encode_changes(&ns, |_| Extra::default());
    assert!(journal.len() < 256, "nothing is pending after a flush: {} bytes", journal.len());
    let image = encode_all(Enc::default(), &ns, |_| Extra::default());
    assert!(image.len() < 3 * PAGE + 1024, "image of {} bytes stores whole pages of small files", image.len());
    let check = |ns: &Namespace| {
        let d = ns.get(small).unwrap().data().unwrap();
        assert_eq!(d.read(0, 100), b"{\"holder\":42}\n");
        assert_eq!(d.page(0).unwrap().len(), 14);
        let r = ns.get(reserved).unwrap().data().unwrap();
        assert_eq!((r.size(), r.pages()), (0, 2), "fallocate's pages stay reserved");
        let b = ns.get(big).unwrap().data().unwrap();
        assert_eq!(b.read(0, 4 * PAGE), vec![7u8; 3 * PAGE + 5]);
    };
    check(&ns);
    // From the journal, then from a snapshot.
    check(&recover(recording_mut(&mut store).clone()));
    store.snapshot(encode_all(store.head(), &ns, |_| Extra::default())).unwrap();
    assert!(store.snapshot_bytes() < 3 * PAGE as u64 + 1024);
    check(&recover(recording_mut(&mut store).clone()));
}

/// A clean unmount skips the snapshot when nothing changed since the last
/// one: not after a flush, and not when recovery had to replay an older
/// journal the snapshot continues from (a snapshot makes it unneeded).
#[test]
fn only_a_store_that_changed_since_its_snapshot_wants_one_at_unmount() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    assert!(!store.changed_since_snapshot(), "a fresh state directory");
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    file(&mut ns, Ino::ROOT, "a", b"1");
    flush(&mut ns, &mut store);
    assert!(store.changed_since_snapshot(), "a batch in the journal");
    let img = encode_all(store.head(), &ns, |_| Extra::default());
    store.snapshot(img).unwrap();
    assert!(!store.changed_since_snapshot(), "just compacted");
    let (reopened, _) = Store::open(Box::new(recording_mut(&mut store).clone())).unwrap();
    assert!(!reopened.changed_since_snapshot(), "reopened after a snapshot");
    assert_eq!(view(&recover(recording_mut(&mut store).clone())), view(&ns));

    // A background snapshot whose new journal was never started: recovery
    // replays the batch appended meanwhile from the older journal.
    let job = background_job(&mut store, &ns);
    file(&mut ns, Ino::ROOT, "b", b"2");
    flush(&mut ns, &mut store);
    let storage = recording_mut(&mut store);
    let written = write_snapshot(storage, &job).unwrap();
    drop(written);
    let mut img = storage.clone();
    let new_journal = other_journal(store.journal);
    img.remove(new_journal).unwrap();
    let (reopened, _) = Store::open(Box::new(img.clone())).unwrap();
    assert!(reopened.changed_since_snapshot(), "an older journal was replayed");
    assert_eq!(view(&recover(img)), view(&ns));
}

/// The journal a background snapshot continues from stays on disk and
/// counts in `disk_bytes` until the next snapshot replaces it; an in-line
/// snapshot names no older journal and removes it; a reopened store finds
/// its size again.
#[test]
fn the_old_journal_counts_until_the_next_snapshot_replaces_it() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    file(&mut ns, Ino::ROOT, "a", &[7; 3 * 4096]);
    flush(&mut ns, &mut store);
    let old = store.journal_bytes();
    assert_eq!(store.other_bytes(), 0);
    let job = background_job(&mut store, &ns);
    let written = write_snapshot(recording_mut(&mut store), &job);
    store.finish_snapshot(written).unwrap();
    assert_eq!(store.other_bytes(), old, "the journal the snapshot continues from");
    let (journal, other) = (store.journal, other_journal(store.journal));
    assert_eq!(store.disk_bytes(), store.snapshot_bytes() + store.journal_bytes() + old);
    assert_eq!(recording_mut(&mut store).len(other), old + ZERO_AHEAD, "its records and the zeros ahead");
    let (reopened, _) = Store::open(Box::new(recording_mut(&mut store).clone())).unwrap();
    assert_eq!((reopened.journal, reopened.other_bytes()), (journal, old), "found again at start-up");
    // The next (background) snapshot starts its journal in that file.
    let job = background_job(&mut store, &ns);
    let written = write_snapshot(recording_mut(&mut store), &job);
    let records = store.journal_bytes();
    store.finish_snapshot(written).unwrap();
    assert_eq!(store.journal, other);
    assert_eq!(store.other_bytes(), records);
    assert!(store.other_bytes() < old);
    // In line: the other file is gone.
    file(&mut ns, Ino::ROOT, "b", b"2");
    flush(&mut ns, &mut store);
    let img = encode_all(store.head(), &ns, |_| Extra::default());
    store.snapshot(img).unwrap();
    assert_eq!(store.other_bytes(), 0);
    let other = other_journal(store.journal);
    assert_eq!(recording_mut(&mut store).len(other), 0);
    assert_eq!(view(&recover(recording_mut(&mut store).clone())), view(&ns));
}

/// A slice reads the clock after every few dozen records, entries and
/// pages included: a run of small directories (each encoded whole right
/// after its inode) must not make one slice of thousands of records.
#[test]
fn a_slice_stops_after_a_bounded_number_of_records_of_any_kind() {
    let now = SystemTime::now();
    let mut ns = Namespace::new(0o755, 0, 0, now);
    let dirs: Vec<Ino> = (0..100)
        .map(|d| {
            let new = NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None };
            let ino = ns.alloc(new, Ino::ROOT, now);
            ns.link(Ino::ROOT, OsStr::new(&format!("d{d}")), ino).unwrap();
            ino
        })
        .collect();
    for (d, dir) in dirs.iter().enumerate() {
        for f in 0..50 {
            file(&mut ns, *dir, &format!("f{d}-{f}"), b"x");
        }
    }
    // The root and its 100 entries; each directory and its 50 entries;
    // each file and its page.
    let records = 1 + 100 + 100 * (1 + 50) + 5000 * 2;
    let mut slices = Slices::new(Enc::default(), &ns);
    slices.run = 64;
    let mut steps = 1;
    while !slices.step(&ns, |_| Extra::default(), std::time::Duration::ZERO) {
        steps += 1;
    }
    // A slice ends once CHECK records went by, after at most one more run.
    let most = CHECK + 64 + 1;
    assert!(steps * most >= records, "{steps} slices for {records} records");
}

/// A clean unmount streams its image to the file a piece at a time: the
/// pieces hold whole records and stay near [`PIECE`] bytes however large the
/// namespace (a directory of thousands of entries spans several), the
/// snapshot recovers the namespace, and a piece that cannot be written
/// leaves the previous snapshot and journal as they were, with no
/// temporary file.
#[test]
fn an_image_is_streamed_in_pieces_and_a_failed_piece_keeps_the_old_snapshot() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    let mkdir = |ns: &mut Namespace, parent: Ino, name: &str| {
        let new = NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None };
        let ino = ns.alloc(new, parent, SystemTime::now());
        ns.link(parent, OsStr::new(name), ino).unwrap();
        ino
    };
    let big = mkdir(&mut ns, Ino::ROOT, "big");
    for i in 0..9000 {
        file(&mut ns, big, &format!("lease-{i:06}.json"), format!("{{\"holder\":{i}}}\n").as_bytes());
    }
    for d in 0..20 {
        let dir = mkdir(&mut ns, Ino::ROOT, &format!("d{d}"));
        for i in 0..150 {
            file(&mut ns, dir, &format!("f{i}"), &vec![b'a' + (i % 26) as u8; 100 + i * 40]);
        }
    }
    flush(&mut ns, &mut store);
    store.snapshot(encode_all(store.head(), &ns, |_| Extra::default())).unwrap();
    let before = view(&ns);
    file(&mut ns, big, "after-the-snapshot", b"journal");
    flush(&mut ns, &mut store);
    let with_journal = view(&ns);

    // The third piece fails: nothing of the new image is installed.
    let head = store.head();
    let mut n = 0;
    let r = store.snapshot_streamed(|out| {
        encode_streamed(head, &ns, |_| Extra::default(), &mut |piece| {
            n += 1;
            if n == 3 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            out(piece)
        })
    });
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
    assert!(!store.failed(), "a full disk postpones the snapshot");
    assert!(recording_mut(&mut store).read(SNAPSHOT_TMP).unwrap().is_none(), "the temporary file is removed");
    assert_eq!(view(&recover(recording_mut(&mut store).clone())), with_journal);
    assert_ne!(before, with_journal);

    // Streamed whole: several pieces, each of whole records near PIECE.
    let head = store.head();
    let mut pieces = Vec::new();
    store
        .snapshot_streamed(|out| {
            encode_streamed(head, &ns, |_| Extra::default(), &mut |piece| {
                pieces.push(piece.len());
                assert!(scan_each(piece, |_| ()).is_ok(), "a piece of whole records");
                out(piece)
            })
        })
        .unwrap();
    assert!(pieces.len() >= 3, "pieces {pieces:?}");
    assert!(pieces.iter().all(|&p| p <= PIECE + 2 * crate::namespace::PAGE), "pieces {pieces:?}");
    assert!(pieces[..pieces.len() - 1].iter().all(|&p| p >= PIECE), "pieces {pieces:?}");
    assert_eq!(store.snapshot_bytes(), pieces.iter().sum::<usize>() as u64);
    assert!(!store.changed_since_snapshot());
    assert_eq!(view(&recover(recording_mut(&mut store).clone())), with_journal);
}

/// A directory's record carries its number of entries (recovery sizes its
/// name tables from it), and the directory recovers with every name.
#[test]
fn a_directory_record_carries_its_number_of_entries() {
    let (mut store, _) = Store::open(Box::new(MemStorage::default())).unwrap();
    let mut ns = Namespace::new(0o755, 0, 0, SystemTime::now());
    ns.set_tracking();
    let mkdir = |ns: &mut Namespace, name: &str| {
        let new = NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None };
        let ino = ns.alloc(new, Ino::ROOT, SystemTime::now());
        ns.link(Ino::ROOT, OsStr::new(name), ino).unwrap();
        ino
    };
    let (big, empty) = (mkdir(&mut ns, "big"), mkdir(&mut ns, "empty"));
    for i in 0..5000 {
        file(&mut ns, big, &format!("f{i}"), b"x");
    }
    let img = encode_all(Enc::default(), &ns, |_| Extra::default());
    let mut sizes = std::collections::HashMap::new();
    assert!(scan_each(&img, |r| {
        if let Rec::Inode(i, size, _) = r {
            if i.kind == Kind::Dir {
                sizes.insert(i.ino, size);
            }
        }
    })
    .is_ok());
    assert_eq!((sizes[&big], sizes[&empty], sizes[&Ino::ROOT]), (5000, 0, 2));
    // Through the journal and through a snapshot.
    flush(&mut ns, &mut store);
    assert_eq!(view(&recover(recording_mut(&mut store).clone())), view(&ns));
    store.snapshot(encode_all(store.head(), &ns, |_| Extra::default())).unwrap();
    let back = recover(recording_mut(&mut store).clone());
    assert_eq!(back.get(big).unwrap().dir().unwrap().len(), 5000);
    assert_eq!(view(&back), view(&ns));
}
