//! A power cut against a model of what POSIX makes durable, written apart
//! from the daemon's tracking: a log of namespace changes replayed in
//! order, keeping each change once every directory it touched was synced
//! after it; each file's contents as of its last fsync/fdatasync (empty
//! when never synced); its extended attributes as of its last fsync.

use super::*;
use std::collections::{BTreeMap, HashMap, HashSet};

const C: Caller = Caller::ROOT;

/// Path -> (a directory, contents, extended attributes).
type Tree = BTreeMap<String, (bool, Vec<u8>, BTreeMap<OsString, Vec<u8>>)>;

/// `fsync` (`data_only`: `fdatasync`) of `ino` through a handle of its own.
fn sync(fs: &Fs, ino: Ino, data_only: bool) {
    let h = fs.open(ino, libc::O_RDONLY, C).unwrap();
    fs.power_synced(ino, h, data_only).unwrap();
    fs.release(h, None).unwrap();
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One change of names: what it wrote, and the directories not synced since.
struct Op {
    writes: Vec<(Ino, OsString, Option<Ino>)>,
    waiting: HashSet<Ino>,
}

#[derive(Default)]
struct Model {
    log: Vec<Op>,
    /// Contents and extended attributes as last synced.
    data: HashMap<Ino, Vec<u8>>,
    xattrs: HashMap<Ino, BTreeMap<OsString, Vec<u8>>>,
    dirs: HashSet<Ino>,
}

impl Model {
    fn change(&mut self, writes: Vec<(Ino, OsString, Option<Ino>)>) {
        let waiting = writes.iter().map(|w| w.0).collect();
        self.log.push(Op { writes, waiting });
    }

    fn sync_dir(&mut self, d: Ino) {
        for op in &mut self.log {
            op.waiting.remove(&d);
        }
    }

    /// The tree after a cut: path -> (is a directory, contents, xattrs).
    fn tree(&self) -> Tree {
        let mut entries: HashMap<Ino, BTreeMap<OsString, Ino>> = HashMap::new();
        for op in self.log.iter().filter(|op| op.waiting.is_empty()) {
            for (d, n, v) in &op.writes {
                let e = entries.entry(*d).or_default();
                match v {
                    Some(i) => e.insert(n.clone(), *i),
                    None => e.remove(n),
                };
            }
        }
        let mut out = BTreeMap::new();
        let mut stack = vec![(Ino::ROOT, String::new(), vec![Ino::ROOT])];
        while let Some((d, path, on_path)) = stack.pop() {
            for (n, i) in entries.get(&d).into_iter().flatten() {
                let p = format!("{path}/{}", n.to_string_lossy());
                let is_dir = self.dirs.contains(i);
                let x = self.xattrs.get(i).cloned().unwrap_or_default();
                if is_dir {
                    out.insert(p.clone(), (true, Vec::new(), x));
                    if !on_path.contains(i) {
                        let mut next = on_path.clone();
                        next.push(*i);
                        stack.push((*i, p, next));
                    }
                } else {
                    out.insert(p, (false, self.data.get(i).cloned().unwrap_or_default(), x));
                }
            }
        }
        out
    }
}

/// The tree the filesystem shows, walked the same way.
fn shown(fs: &Fs) -> Tree {
    let mut out = BTreeMap::new();
    let mut stack = vec![(Ino::ROOT, String::new(), vec![Ino::ROOT])];
    while let Some((d, path, on_path)) = stack.pop() {
        for e in fs.readdir(d, 0, 10_000).unwrap() {
            if e.name == "." || e.name == ".." || d == Ino::ROOT && e.name == control::DIR_NAME {
                continue;
            }
            let p = format!("{path}/{}", e.name.to_string_lossy());
            let x = xattrs_of(fs, e.ino);
            if e.kind == Kind::Dir {
                out.insert(p.clone(), (true, Vec::new(), x));
                if !on_path.contains(&e.ino) {
                    let mut next = on_path.clone();
                    next.push(e.ino);
                    stack.push((e.ino, p, next));
                }
            } else {
                let h = fs.open(e.ino, libc::O_RDONLY, C).unwrap();
                let data = fs.read(e.ino, h, 0, 1 << 20, 0).unwrap();
                fs.release(h, None).unwrap();
                out.insert(p, (false, data, x));
            }
        }
    }
    out
}

fn xattrs_of(fs: &Fs, ino: Ino) -> BTreeMap<OsString, Vec<u8>> {
    let list = fs.listxattr(ino).unwrap();
    list.split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| {
            let name = <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n).to_os_string();
            let v = fs.getxattr(ino, &name, C).unwrap();
            (name, v)
        })
        .collect()
}

/// Run `steps` random changes and syncs from `seed`, cut, and compare.
fn run(seed: u64, steps: usize) {
    let trace = std::env::var_os("LEASEFS_POWER_TRACE").is_some();
    macro_rules! t { ($($a:tt)*) => { if trace { eprintln!($($a)*); } } }
    let fs = Fs::new(0, 0);
    fs.power_on();
    let mut m = Model::default();
    m.dirs.insert(Ino::ROOT);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut current: HashMap<Ino, Vec<u8>> = HashMap::new();
    let mut cur_x: HashMap<Ino, BTreeMap<OsString, Vec<u8>>> = HashMap::new();
    let names = ["a", "b", "c", "d"];
    for _ in 0..steps {
        // Everything reachable now: (dir, name, ino, is a dir).
        let mut here = vec![];
        let mut dirs = vec![Ino::ROOT];
        let mut stack = vec![Ino::ROOT];
        while let Some(d) = stack.pop() {
            for e in fs.readdir(d, 0, 10_000).unwrap() {
                if e.name == "." || e.name == ".." || d == Ino::ROOT && e.name == control::DIR_NAME {
                    continue;
                }
                here.push((d, e.name.clone(), e.ino, e.kind == Kind::Dir));
                if e.kind == Kind::Dir {
                    dirs.push(e.ino);
                    stack.push(e.ino);
                }
            }
        }
        let files: Vec<Ino> = here.iter().filter(|h| !h.3).map(|h| h.2).collect();

        let dir = dirs[rng.below(dirs.len())];
        let name = OsString::from(names[rng.below(names.len())]);
        match rng.below(13) {
            0 => {
                if let Ok((a, h)) = fs.create(C, dir, &name, 0o644, 0, libc::O_RDWR | libc::O_EXCL) {
                    fs.release(h, None).unwrap();
                    t!("create {dir:?}/{name:?} -> {:?}", a.ino);
                    m.change(vec![(dir, name, Some(a.ino))]);
                    current.insert(a.ino, Vec::new());
                }
            }
            1 => {
                if let Ok(a) = fs.mkdir(C, dir, &name, 0o755, 0) {
                    m.dirs.insert(a.ino);
                    m.change(vec![(dir, name, Some(a.ino))]);
                }
            }
            2 | 3 if !files.is_empty() => {
                let f = files[rng.below(files.len())];
                let off = rng.below(6000);
                let len = 1 + rng.below(5000);
                let byte = b'a' + rng.below(26) as u8;
                let h = fs.open(f, libc::O_RDWR, C).unwrap();
                fs.write(f, h, off as u64, &vec![byte; len], WriteOpts::default()).unwrap();
                fs.release(h, None).unwrap();
                t!("write {f:?} {off}+{len}");
                let c = current.entry(f).or_default();
                if c.len() < off + len {
                    c.resize(off + len, 0);
                }
                c[off..off + len].fill(byte);
            }
            4 if !files.is_empty() => {
                let f = files[rng.below(files.len())];
                let size = rng.below(8000);
                fs.setattr(f, &SetAttr { size: Some(size as u64), ..SetAttr::default() }, C).unwrap();
                t!("truncate {f:?} {size}");
                current.entry(f).or_default().resize(size, 0);
            }
            5 if !here.is_empty() => {
                let (d, n, ino, _) = here[rng.below(here.len())].clone();
                let (to, to_name) = (dirs[rng.below(dirs.len())], name);
                if d == to && n == to_name {
                    continue;
                }
                let replaced = fs.lookup(to, &to_name, C).ok().map(|(a, _)| a.ino);
                if fs.rename(d, &n, to, &to_name, 0, C).is_ok() && replaced != Some(ino) {
                    // (Between two links of one file, rename does nothing.)
                    t!("rename {d:?}/{n:?} -> {to:?}/{to_name:?} ({ino:?} over {replaced:?})");
                    m.change(vec![(d, n, None), (to, to_name, Some(ino))]);
                }
            }
            6 if !here.is_empty() => {
                let (d, n, _, is_dir) = here[rng.below(here.len())].clone();
                let done = if is_dir { fs.rmdir(d, &n, C) } else { fs.unlink(d, &n, C) };
                if done.is_ok() {
                    t!("remove {d:?}/{n:?}");
                    m.change(vec![(d, n, None)]);
                }
            }
            7 if !files.is_empty() => {
                let f = files[rng.below(files.len())];
                if fs.link(f, dir, &name, C).is_ok() {
                    t!("link {f:?} {dir:?}/{name:?}");
                    m.change(vec![(dir, name, Some(f))]);
                }
            }
            8 if !here.is_empty() => {
                let ino = here[rng.below(here.len())].2;
                let k = OsString::from(format!("user.{}", names[rng.below(2)]));
                let v = vec![b'0' + rng.below(10) as u8; 3];
                fs.setxattr(ino, &k, &v, 0, C).unwrap();
                cur_x.entry(ino).or_default().insert(k, v);
            }
            9 | 10 if !files.is_empty() => {
                let f = files[rng.below(files.len())];
                let data_only = rng.below(2) == 0;
                t!("sync {f:?} data_only={data_only} len={:?}", current.get(&f).map(Vec::len));
                sync(&fs, f, data_only);
                m.data.insert(f, current.get(&f).cloned().unwrap_or_default());
                if !data_only {
                    m.xattrs.insert(f, cur_x.get(&f).cloned().unwrap_or_default());
                }
            }
            _ => {
                t!("syncdir {dir:?}");
                sync(&fs, dir, false);
                m.sync_dir(dir);
                m.xattrs.insert(dir, cur_x.get(&dir).cloned().unwrap_or_default());
            }
        }
    }
    fs.power_cut(false).unwrap();
    let (got, want) = (shown(&fs), m.tree());
    if got != want {
        let brief = |t: &Tree| {
            t.iter()
                .map(|(p, (d, c, x))| format!("{p}:{}:{}:{}", if *d { "dir" } else { "file" }, c.len(), x.len()))
                .collect::<Vec<_>>()
        };
        panic!(
            "seed {seed}: the tree after the cut differs from the model\n got {:?}\nwant {:?}",
            brief(&got),
            brief(&want)
        );
    }
}

#[test]
fn a_power_cut_leaves_what_the_posix_model_says_was_synced() {
    let n: u64 = std::env::var("LEASEFS_POWER_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let first: u64 = std::env::var("LEASEFS_POWER_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for seed in first..=n.max(first) {
        run(seed, 60);
    }
}

#[test]
fn a_write_then_rename_without_fsync_loses_the_file_and_with_fsyncs_keeps_it() {
    for synced in [false, true] {
        let fs = Fs::new(0, 0);
        fs.power_on();
        let (a, h) = fs.create(C, Ino::ROOT, OsStr::new("f.tmp"), 0o644, 0, libc::O_RDWR).unwrap();
        fs.write(a.ino, h, 0, b"new config", WriteOpts::default()).unwrap();
        if synced {
            sync(&fs, a.ino, false);
        }
        fs.release(h, None).unwrap();
        fs.rename(Ino::ROOT, OsStr::new("f.tmp"), Ino::ROOT, OsStr::new("f"), 0, C).unwrap();
        if synced {
            sync(&fs, Ino::ROOT, false);
        }
        let report = fs.power_cut(false).unwrap().report;
        let names: Vec<String> = shown(&fs).into_keys().collect();
        if synced {
            assert_eq!(names, vec!["/f".to_string()]);
            assert_eq!(shown(&fs)["/f"].1, b"new config");
        } else {
            assert!(names.is_empty(), "{names:?}");
            assert_eq!(report["crash"]["names"][0]["name"], "f", "{report}");
        }
    }
}

/// A create, then a rename away that waits for its other directory: the
/// first directory's sync makes the create durable, not the rename, so the
/// file is back at its first name after the cut (a change that cancels
/// out may not drop the name's record in the middle of a rename).
#[test]
fn a_rename_waiting_for_its_other_directory_leaves_the_synced_create() {
    let fs = Fs::new(0, 0);
    fs.power_on();
    let r = Ino::ROOT;
    let b = fs.mkdir(C, r, OsStr::new("b"), 0o755, 0).unwrap().ino;
    sync(&fs, r, false);
    let (a, h) = fs.create(C, r, OsStr::new("c"), 0o644, 0, libc::O_RDWR | libc::O_EXCL).unwrap();
    fs.release(h, None).unwrap();
    fs.rename(r, OsStr::new("c"), b, OsStr::new("c"), 0, C).unwrap();
    sync(&fs, r, false);
    fs.link(a.ino, b, OsStr::new("b"), C).unwrap();
    fs.rename(b, OsStr::new("c"), r, OsStr::new("a"), 0, C).unwrap();
    sync(&fs, r, false);
    let report = fs.power_cut(false).unwrap().report;
    assert_eq!(shown(&fs).into_keys().collect::<Vec<_>>(), vec!["/b", "/c"], "{report}");
    // Once the other directory is synced too, both renames count.
    let (a, h) = fs.create(C, r, OsStr::new("x"), 0o644, 0, libc::O_RDWR | libc::O_EXCL).unwrap();
    fs.release(h, None).unwrap();
    sync(&fs, r, false);
    fs.rename(r, OsStr::new("x"), b, OsStr::new("y"), 0, C).unwrap();
    sync(&fs, r, false);
    sync(&fs, b, false);
    fs.power_cut(false).unwrap();
    assert_eq!(shown(&fs).into_keys().collect::<Vec<_>>(), vec!["/b", "/b/y", "/c"]);
    assert_eq!(fs.lookup(b, OsStr::new("y"), C).unwrap().0.ino, a.ino);
}

/// A removed file no kept name leads to is not kept, however large (ghosts
/// are sorted out by pages as well as by count); one a kept name leads to
/// is, and comes back at the cut.
#[test]
fn a_removed_large_file_is_kept_only_while_a_kept_name_leads_to_it() {
    let fs = Fs::new(0, 0);
    fs.power_on();
    let r = Ino::ROOT;
    let mib = vec![b'x'; 1 << 20];
    let make = |name: &str| {
        let (a, h) = fs.create(C, r, OsStr::new(name), 0o644, 0, libc::O_RDWR | libc::O_EXCL).unwrap();
        for i in 0..65u64 {
            fs.write(a.ino, h, i << 20, &mib, WriteOpts::default()).unwrap();
        }
        fs.release(h, None).unwrap();
        a.ino
    };
    // Never named durably: dropped with its 65 MiB.
    // (The kernel's FORGET of its reference from the create drops it.)
    let big = make("big");
    fs.unlink(r, OsStr::new("big"), C).unwrap();
    fs.forget(big, 1);
    assert!(fs.state.lock().ns.get(big).is_err(), "the file was dropped");
    assert_eq!(fs.state.lock().ns.power_kept().1, 0, "a removed file nothing durable names was kept");
    // Synced with its name, then removed without a sync of the directory.
    let kept = make("kept");
    sync(&fs, kept, false);
    sync(&fs, r, false);
    fs.unlink(r, OsStr::new("kept"), C).unwrap();
    fs.forget(kept, 1);
    assert_eq!(fs.state.lock().ns.power_kept().1, 1);
    fs.power_cut(false).unwrap();
    let (a, _) = fs.lookup(r, OsStr::new("kept"), C).unwrap();
    assert_eq!((a.ino, a.size), (kept, 65 << 20));
}
