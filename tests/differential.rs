//! Differential test: seeded random namespace operations applied to a
//! leasefs mount and to tmpfs; every result, errno and the final trees must
//! match. A failure prints the seed and the operation that diverged.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::util::{Mount, Rng, Tmpfs};

const NAMES: &[&str] = &["a", "b", "c", "d1", "d2"];

fn rand_path(rng: &mut Rng) -> String {
    let depth = rng.below(3);
    let mut parts = Vec::new();
    for _ in 0..=depth {
        parts.push(*rng.pick(NAMES));
    }
    parts.join("/")
}

#[derive(Debug, Clone)]
enum Op {
    Create(String),
    Mkdir(String),
    Write(String, u64, Vec<u8>),
    Append(String, Vec<u8>),
    Truncate(String, u64),
    Link(String, String),
    Symlink(String, String),
    Rename(String, String),
    Unlink(String),
    Rmdir(String),
    Stat(String),
    Read(String),
    Chmod(String, u32),
    /// `flock` exclusive then unlock: the file was used as a lease, which
    /// must not change later POSIX behaviour once it is not live.
    Lock(String),
}

fn gen(rng: &mut Rng) -> Op {
    let p = rand_path(rng);
    let data: Vec<u8> = (0..rng.below(64)).map(|_| b'a' + rng.below(26) as u8).collect();
    match rng.below(14) {
        0 => Op::Create(p),
        1 => Op::Mkdir(p),
        2 => Op::Write(p, rng.below(10_000), data),
        3 => Op::Append(p, data),
        4 => Op::Truncate(p, rng.below(5_000)),
        5 => Op::Link(p, rand_path(rng)),
        6 => Op::Symlink(p, rand_path(rng)),
        7 => Op::Rename(p, rand_path(rng)),
        8 => Op::Unlink(p),
        9 => Op::Rmdir(p),
        10 => Op::Stat(p),
        11 => Op::Chmod(p, [0o600, 0o644, 0o751, 0o4755][rng.below(4) as usize]),
        12 => Op::Lock(p),
        _ => Op::Read(p),
    }
}

fn errno(e: std::io::Error) -> String {
    format!("errno {}", e.raw_os_error().unwrap_or(-1))
}

fn describe(m: &fs::Metadata) -> String {
    let size = if m.is_dir() { 0 } else { m.size() };
    format!("mode {:o} nlink {} size {size}", m.mode(), m.nlink())
}

fn apply(root: &Path, op: &Op) -> String {
    let r = |p: &str| root.join(p);
    let res: std::io::Result<String> = (|| match op {
        Op::Create(p) => {
            fs::OpenOptions::new().write(true).create_new(true).mode(0o640).open(r(p))?;
            Ok(String::new())
        }
        Op::Mkdir(p) => fs::create_dir(r(p)).map(|_| String::new()),
        Op::Write(p, off, d) => {
            let mut f = fs::OpenOptions::new().write(true).open(r(p))?;
            f.seek(SeekFrom::Start(*off))?;
            f.write_all(d)?;
            Ok(String::new())
        }
        Op::Append(p, d) => {
            let mut f = fs::OpenOptions::new().append(true).open(r(p))?;
            f.write_all(d)?;
            Ok(String::new())
        }
        Op::Truncate(p, n) => fs::OpenOptions::new().write(true).open(r(p))?.set_len(*n).map(|_| String::new()),
        Op::Link(a, b) => fs::hard_link(r(a), r(b)).map(|_| String::new()),
        Op::Symlink(target, p) => std::os::unix::fs::symlink(target, r(p)).map(|_| String::new()),
        Op::Rename(a, b) => {
            // The name must arrive with the source's inode (POSIX), which
            // can be compared across filesystems as "same inode as before".
            let before = fs::symlink_metadata(r(a)).ok().map(|m| m.ino());
            fs::rename(r(a), r(b))?;
            let after = fs::symlink_metadata(r(b)).ok().map(|m| m.ino());
            Ok(format!("source inode arrived: {}", before == after))
        }
        Op::Chmod(p, mode) => {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(r(p), fs::Permissions::from_mode(*mode)).map(|_| String::new())
        }
        Op::Lock(p) => {
            use std::os::fd::AsRawFd;
            let f = fs::File::open(r(p))?;
            // SAFETY: flock on a descriptor we own.
            let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) | libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(String::new())
        }
        Op::Unlink(p) => fs::remove_file(r(p)).map(|_| String::new()),
        Op::Rmdir(p) => fs::remove_dir(r(p)).map(|_| String::new()),
        Op::Stat(p) => fs::symlink_metadata(r(p)).map(|m| describe(&m)),
        Op::Read(p) => {
            let mut v = Vec::new();
            fs::File::open(r(p))?.read_to_end(&mut v)?;
            Ok(format!("{} bytes, sum {}", v.len(), v.iter().map(|&b| b as u64).sum::<u64>()))
        }
    })();
    res.unwrap_or_else(errno)
}

fn tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let m = fs::symlink_metadata(&path).unwrap();
            let mut d = describe(&m);
            if m.file_type().is_symlink() {
                d += &format!(" -> {}", fs::read_link(&path).unwrap().display());
            } else if m.is_file() {
                d += &format!(" content {:?}", fs::read(&path).unwrap().iter().map(|&b| b as u64).sum::<u64>());
            }
            out.insert(rel, d);
            if m.is_dir() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn random_namespace_operations_match_tmpfs() {
    // SAFETY: umask only affects this test process.
    unsafe { libc::umask(0o022) };
    let m = Mount::new();
    let t = Tmpfs::new();
    let seeds: Vec<u64> = match std::env::var("LEASEFS_DIFF_SEED") {
        Ok(s) => vec![s.parse().expect("seed")],
        Err(_) => (1..=8).collect(),
    };
    for seed in seeds {
        let sub = format!("run{seed}");
        let (a, b) = (m.path.join(&sub), t.path.join(&sub));
        fs::create_dir(&a).unwrap();
        fs::create_dir(&b).unwrap();
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        for step in 0..400 {
            let op = gen(&mut rng);
            let (ra, rb) = (apply(&a, &op), apply(&b, &op));
            assert_eq!(ra, rb, "seed {seed} step {step}: {op:?} diverged (leasefs vs tmpfs)");
        }
        assert_eq!(tree(&a), tree(&b), "seed {seed}: final trees differ");
    }
}

/// Whether the fuse module lets daemons use io_uring here.
fn uring_allowed() -> bool {
    fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|s| s.trim() == "Y")
}

/// Run tests/helpers/modes.py as root or, for an actor, as its uid and gid
/// with no supplementary groups; its output.
fn modes_py(dir: &Path, args: &[&str], ids: Option<(u32, u32)>) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/helpers/modes.py");
    let mut cmd = match ids {
        None => std::process::Command::new("/usr/bin/python3"),
        Some((uid, gid)) => {
            let mut c = std::process::Command::new("setpriv");
            c.args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".into()]);
            c.arg("/usr/bin/python3");
            c
        }
    };
    cmd.arg(&script).args(args).current_dir(dir);
    let o = crate::util::run_timeout(&mut cmd, crate::util::STEP);
    assert!(o.status.success(), "modes.py {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every case's result and the mode, owner and group after it.
fn mode_rules(dir: &Path) -> BTreeMap<String, String> {
    let root = dir.to_str().unwrap();
    modes_py(dir, &["setup", root], None);
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for actor in modes_py(dir, &["actors"], None).lines() {
        let v: Vec<&str> = actor.split(' ').collect();
        let (uid, gid): (u32, u32) = (v[1].parse().unwrap(), v[2].parse().unwrap());
        let ids = (uid != 0).then_some((uid, gid));
        for line in modes_py(dir, &["act", root, v[0]], ids).lines() {
            let (case, result) = line.split_once(' ').expect("case result");
            out.insert(case.to_string(), result.to_string());
        }
    }
    for line in modes_py(dir, &["show", root], None).lines() {
        let (case, after) = line.split_once(' ').expect("case mode uid gid");
        let r = out.get_mut(case).unwrap_or_else(|| panic!("{case} was not run"));
        *r = format!("{r}, then {after}");
    }
    out
}

/// The kernel's rules for set-user-ID and set-group-ID bits, exhaustively:
/// {chown of uid, of gid, of both, of neither; chmod; write; truncate;
/// fallocate; `O_TRUNC` open} × {suid, sgid with group-execute, sgid
/// without, none} × {root, the owner in the file's group, the owner not in
/// it, another user with write permission} × {file, directory}, each actor
/// a process of its own, on both transports: the result and the mode,
/// owner and group after each case equal tmpfs's.
#[test]
fn set_id_bits_follow_the_kernels_rules_as_on_tmpfs() {
    let t = Tmpfs::new();
    let want = mode_rules(&t.path);
    assert_eq!(want.len(), 9 * 4 * 4 * 2);
    let mut transports = vec!["dev"];
    if uring_allowed() {
        transports.push("uring");
    } else {
        assert_ne!(std::env::var("LEASEFS_TRANSPORT").as_deref(), Ok("uring"), "io_uring asked for but not allowed");
    }
    for transport in transports {
        let m = Mount::with_args(&["--allow-other", "--transport", transport]);
        let got = mode_rules(&m.path);
        let diff: Vec<String> = want
            .iter()
            .filter(|(case, w)| got.get(*case) != Some(w))
            .map(|(case, w)| format!("{case}: tmpfs {w}, leasefs {}", got.get(case).map_or("-", |s| s.as_str())))
            .collect();
        assert!(
            diff.is_empty(),
            "{transport}: {} of {} cases differ from tmpfs:\n{}",
            diff.len(),
            want.len(),
            diff.join("\n")
        );
    }
}
