//! POSIX behaviour seen through the kernel from other processes.

use std::os::unix::fs::MetadataExt;

use crate::util::{py_ok, sh, sh_ok, Mount};

#[test]
fn files_dirs_links_and_nlink_through_every_name() {
    let m = Mount::new();
    let out = sh_ok(
        &m.path,
        "set -e; printf hello > a; printf ' world' >> a; cat a; echo; mkdir -p d/e; ln a d/b; \
         stat -c '%h %i' a d/b; ln -s ../a d/s; readlink d/s; cat d/s; echo; \
         stat -c '%h' d; stat -c '%h' .",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hello world");
    let (n1, i1) = lines[1].split_once(' ').unwrap();
    let (n2, i2) = lines[2].split_once(' ').unwrap();
    assert_eq!((n1, n2), ("2", "2"), "st_nlink through both names");
    assert_eq!(i1, i2);
    assert_eq!(lines[3], "../a");
    assert_eq!(lines[4], "hello world");
    assert_eq!(lines[5], "3", "d has . , d/.. of e");
    assert_eq!(lines[6], "3", "root: ., .., d/..");
    sh_ok(&m.path, "rm a");
    assert_eq!(std::fs::metadata(m.p("d/b")).unwrap().nlink(), 1);
    let o = sh(&m.path, "cat d/s");
    assert!(!o.status.success(), "dangling symlink must fail");
}

#[test]
fn holes_truncate_and_fallocate() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import os
fd = os.open("f", os.O_CREAT | os.O_RDWR, 0o644)
os.pwrite(fd, b"end", 1 << 20)
assert os.pread(fd, 4, 100) == b"\0\0\0\0"
st = os.fstat(fd)
assert st.st_size == (1 << 20) + 3, st.st_size
assert st.st_blocks < 64, st.st_blocks
os.ftruncate(fd, 10)
assert os.pread(fd, 100, 0) == b"\0" * 10
os.truncate("f", 1 << 40)
assert os.stat("f").st_size == 1 << 40
os.ftruncate(fd, 0)
os.posix_fallocate(fd, 0, 8192)
assert os.fstat(fd).st_size == 8192
os.fsync(fd)
os.close(fd)
print("ok")
"#,
    );
    assert_eq!(out.trim(), "ok");
}

#[test]
fn special_nodes_are_inert_and_fifos_work() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import os, stat, threading
os.mkfifo("p")
os.mknod("c", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
os.mknod("s", 0o600 | stat.S_IFSOCK)
assert stat.S_ISFIFO(os.stat("p").st_mode)
assert stat.S_ISCHR(os.stat("c").st_mode) and os.stat("c").st_rdev == os.makedev(1, 3)
assert stat.S_ISSOCK(os.stat("s").st_mode)
def writer():
    with open("p", "w") as f: f.write("through the fifo")
t = threading.Thread(target=writer); t.start()
with open("p") as f: data = f.read()
t.join()
print(data)
"#,
    );
    assert_eq!(out.trim(), "through the fifo");
}

#[test]
fn xattrs_user_and_trusted() {
    let m = Mount::new();
    sh_ok(&m.path, "touch f && setfattr -n user.colour -v blue f && setfattr -n trusted.t -v 1 f");
    assert_eq!(sh_ok(&m.path, "getfattr --only-values -n user.colour f"), "blue");
    let o = sh(&m.path, "getfattr -n user.missing f");
    assert!(String::from_utf8_lossy(&o.stderr).contains("No such attribute"), "ENODATA expected");
    let out = py_ok(
        &m.path,
        r#"
import os, errno
for call, want in [
    (lambda: os.setxattr("f", "user.colour", b"x", os.XATTR_CREATE), errno.EEXIST),
    (lambda: os.setxattr("f", "user.nope", b"x", os.XATTR_REPLACE), errno.ENODATA),
    (lambda: os.removexattr("f", "user.nope"), errno.ENODATA),
    (lambda: os.setxattr("f", "user." + "n" * 300, b"x"), errno.ERANGE),
]:
    try:
        call(); print("no error")
    except OSError as e:
        assert e.errno == want, (e, want)
print(sorted(os.listxattr("f")))
"#,
    );
    assert_eq!(out.trim(), "['trusted.t', 'user.colour']");
}

#[test]
fn rename_flags_and_errors() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
AT = -100
def renameat2(a, b, flags):
    if libc.renameat2(AT, a.encode(), AT, b.encode(), flags) != 0:
        return ctypes.get_errno()
    return 0
open("a", "w").write("A"); open("b", "w").write("B"); os.mkdir("d"); os.mkdir("e"); open("e/x", "w")
assert renameat2("a", "b", 1) == errno.EEXIST          # RENAME_NOREPLACE
assert renameat2("a", "b", 2) == 0                     # RENAME_EXCHANGE
assert open("a").read() == "B" and open("b").read() == "A"
assert renameat2("a", "zz", 2) == errno.ENOENT
assert renameat2("a", "b", 3) == errno.EINVAL
for src, dst, want in [("d", "a", errno.ENOTDIR), ("a", "d", errno.EISDIR),
                       ("d", "e", errno.ENOTEMPTY), ("e", "e/x/y", errno.ENOTDIR),
                       ("nope", "q", errno.ENOENT), ("d", "d2", 0)]:
    try:
        os.rename(src, dst); got = 0
    except OSError as ex:
        got = ex.errno
    assert got == want, (src, dst, got, want)
os.mkdir("f")
try:
    os.rename("f", "f/sub"); raise SystemExit("moved into itself")
except OSError as ex:
    assert ex.errno == errno.EINVAL
print("ok")
"#,
    );
    assert_eq!(out.trim(), "ok");
}

#[test]
fn long_names_fail_with_enametoolong() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import errno, os
open("x" * 255, "w").close()
for f in (lambda: open("y" * 256, "w"), lambda: os.mkdir("z" * 256), lambda: os.symlink("t", "s" * 256)):
    try:
        f(); print("created")
    except OSError as e:
        assert e.errno == errno.ENAMETOOLONG, e
print(len(os.listdir(".")))
"#,
    );
    assert_eq!(out.trim(), "1");
}

#[test]
fn readdir_offsets_stay_valid_while_entries_change() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import os
os.mkdir("d")
names = [f"f{i:04d}" for i in range(2000)]
for n in names: open("d/" + n, "w").close()
seen = []
it = os.scandir("d")
for i, e in enumerate(it):
    seen.append(e.name)
    if i == 100:
        # Remove entries not yet seen and add new ones mid-listing.
        for n in names[1500:]: os.unlink("d/" + n)
        for j in range(300): open(f"d/new{j}", "w").close()
assert len(seen) == len(set(seen)), "an entry was listed twice"
stable = set(names[:1500])
missing = stable - set(seen)
assert not missing, f"{len(missing)} entries present throughout were skipped"
print(len(os.listdir("d")))
"#,
    );
    assert_eq!(out.trim(), "1800");
}

#[test]
fn changes_are_never_stale_across_processes() {
    let m = Mount::new();
    // Each step is a separate process; none may see an old size, inode or target.
    sh_ok(&m.path, "printf 12345 > f");
    assert_eq!(sh_ok(&m.path, "stat -c %s f").trim(), "5");
    sh_ok(&m.path, "printf 1234567890 >> f");
    assert_eq!(sh_ok(&m.path, "stat -c %s f").trim(), "15");
    let old = sh_ok(&m.path, "stat -c %i f");
    sh_ok(&m.path, "printf new > t && mv t f");
    let new = sh_ok(&m.path, "stat -c %i f");
    assert_ne!(old, new, "rename over a plain file replaces the inode (POSIX)");
    assert_eq!(sh_ok(&m.path, "cat f"), "new");
    sh_ok(&m.path, "rm f && mkdir f");
    assert_eq!(sh_ok(&m.path, "stat -c %F f").trim(), "directory");
}

/// Directory names and attributes may be cached by the kernel (one round
/// trip per path instead of one per component); every change made by one
/// process must still show in the next process's `stat`, permission check
/// and lookup, as on tmpfs.
#[test]
fn cached_directories_are_never_stale_across_processes() {
    let m = Mount::new();
    let t = crate::util::Tmpfs::new();
    let script = |dir: &std::path::Path| {
        let mut seen = Vec::new();
        let mut step = |s: &str| seen.push(sh(dir, s));
        step("mkdir -p d/e && stat -c '%h %a' d d/e");
        let before = sh_ok(dir, "stat -c %y d");
        step("mkdir d/g && stat -c '%h' d");
        assert_ne!(sh_ok(dir, "stat -c %y d"), before, "mtime after mkdir inside");
        step("touch d/f && stat -c '%h' d");
        step("chmod 700 d && stat -c %a d");
        step("setpriv --reuid=65534 --regid=65534 --clear-groups ls d 2>&1; echo rc=$?");
        step("chmod 755 d && setpriv --reuid=65534 --regid=65534 --clear-groups ls d; echo rc=$?");
        step("chown 65534:65534 d && stat -c '%u %g' d");
        step("touch -d @1000000000 d && stat -c %Y d");
        step("rmdir d/g && stat -c %h d");
        step("mv d/e d/e2 && stat -c %F d/e 2>&1; stat -c %F d/e2");
        let ino = sh_ok(dir, "mkdir x && stat -c %i x");
        step("mkdir y && mv -T x y && stat -c %h y");
        assert_eq!(sh_ok(dir, "stat -c %i y"), ino, "rename over an empty directory moves the source");
        step("stat x 2>&1 | sed 's/.*: //'");
        // A cached "no such name" gives way to the name as soon as it exists.
        step("stat -c %n d/new 2>&1 | sed 's/.*: //'; mkdir d/new && stat -c %F d/new");
        step("stat -c %n d/new2 2>&1 | sed 's/.*: //'; ln -s x d/new2 && stat -c %F d/new2");
        let old = sh_ok(dir, "stat -c %i d");
        sh_ok(dir, "rm -r d && mkdir d");
        assert_ne!(sh_ok(dir, "stat -c %i d"), old, "a re-created directory is a new inode");
        step("stat -c '%h %a %u' d; ls d | wc -l");
        seen.into_iter()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
            .map(|o| o.replace(&dir.display().to_string(), "ROOT"))
            .collect::<Vec<_>>()
    };
    let ours = script(&m.path);
    let theirs = script(&t.path);
    assert_eq!(ours, theirs, "leasefs vs tmpfs");
    assert!(ours[4].contains("Permission denied") && ours[4].contains("rc=2"), "{ours:?}");
}

#[test]
fn timestamps_utime_now_omit_and_nanoseconds() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import os, time
open("f", "w").close()
os.utime("f", ns=(1_000_000_123, 2_000_000_456))
st = os.stat("f")
assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_123, 2_000_000_456), st
c0 = st.st_ctime_ns
time.sleep(0.01)
with open("f", "a") as f: f.write("x")
st = os.stat("f")
assert st.st_mtime_ns > 2_000_000_456 and st.st_ctime_ns > c0
assert st.st_atime_ns == 1_000_000_123
os.chmod("f", 0o600)
assert os.stat("f").st_ctime_ns >= st.st_ctime_ns
print("ok")
"#,
    );
    assert_eq!(out.trim(), "ok");
    // UTIME_OMIT / UTIME_NOW through touch.
    sh_ok(&m.path, "touch -d @1000 f && touch -m f");
    let out = sh_ok(&m.path, "stat -c '%X %Y' f");
    let (a, mt) = out.trim().split_once(' ').unwrap();
    assert_eq!(a, "1000", "atime untouched by touch -m (UTIME_OMIT)");
    assert!(mt.parse::<u64>().unwrap() > 1_600_000_000, "mtime set to now");
}

#[test]
fn other_users_use_the_mount_and_kernel_enforces_permissions() {
    let m = Mount::new();
    sh_ok(&m.path, "mkdir -m 1777 shared && printf secret > private && chmod 600 private");
    let out = py_ok(
        &m.path,
        r#"
import errno, os
pid = os.fork()
if pid == 0:
    os.setgid(65534); os.setuid(65534)
    try:
        open("private").read(); os._exit(3)
    except PermissionError:
        pass
    open("shared/mine", "w").write("hi")
    os._exit(0)
_, st = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(st) == 0, st
s = os.stat("shared/mine")
print(s.st_uid, s.st_gid)
"#,
    );
    assert_eq!(out.trim(), "65534 65534");
    // Sticky directory: root's file there cannot be removed by nobody.
    sh_ok(&m.path, "touch shared/roots");
    let o = sh(&m.path, "setpriv --reuid=65534 --regid=65534 --clear-groups rm -f shared/roots");
    assert!(!o.status.success(), "sticky bit must protect other users' files");
    assert!(m.p("shared/roots").exists());
}

#[test]
fn statfs_reports_name_limit() {
    let m = Mount::new();
    assert_eq!(sh_ok(&m.path, "stat -f -c %l .").trim(), "255");
}

#[test]
fn inode_numbers_are_not_reused() {
    let m = Mount::new();
    let out = sh_ok(&m.path, "for i in 1 2 3 4 5; do touch f; stat -c %i f; rm f; done");
    let inos: Vec<&str> = out.lines().collect();
    let uniq: std::collections::HashSet<_> = inos.iter().collect();
    assert_eq!(uniq.len(), inos.len(), "inode numbers reused: {inos:?}");
}
