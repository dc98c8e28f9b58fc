//! The kernel caches names of files (entries) for a second; the daemon
//! makes them stale whenever its view and the kernel's could differ. Each
//! test has a second process that looked at the name before the change (so
//! its entry is cached) and requires that it sees the change at once.

use crate::util::*;

/// FUSE requests of the opcodes `ops` the daemon has received so far (its
/// counters in `.leasefs/metrics`).
fn requests(m: &Mount, ops: &[&str]) -> u64 {
    let metrics = std::fs::read_to_string(m.path.join(".leasefs/metrics")).unwrap();
    ops.iter()
        .filter_map(|op| {
            let label = format!("leasefs_fuse_requests_total{{op=\"{op}\"");
            metrics.lines().find(|l| l.starts_with(&label))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// Rename over a live lease keeps the lease's inode at the name while the
/// kernel moves the source's entry there: the renaming process itself and
/// a reader that loops over the name must never reach the source's inode,
/// not even right after the rename returns; also when the source has
/// another hard link (whose own name keeps working).
#[test]
fn rename_over_a_live_lease_is_seen_at_once_by_every_process() {
    let m = Mount::new();
    sh_ok(&m.path, "printf v0 > lease");
    let _holder = Bg::ready(&m.path, "exec 9<lease; flock 9; echo ready; exec sleep 60");
    let out = py_ok(
        &m.path,
        r#"
import os, sys
D = os.stat("lease").st_ino
epoch = os.getxattr("lease", "user.leasefs.epoch")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    # The reader: the name must always lead to the lease's inode.
    os.close(w)
    os.set_blocking(r, False)
    seen = 0
    while True:
        st = os.stat("lease")
        if st.st_ino != D:
            print("reader saw inode", st.st_ino, "not", D, flush=True)
            os._exit(1)
        seen += 1
        try:
            if os.read(r, 1) == b"":
                break
        except BlockingIOError:
            pass
    os._exit(0 if seen > 0 else 2)
os.close(r)
# Sources: fresh files, and files old enough to have their names cached.
import time
for i in range(1, 300, 3):
    open("tmp%d" % i, "w").close()
time.sleep(1.2)
bad = []
for i in range(300):
    t = "tmp%d" % i
    with open(t, "w") as f:
        f.write("v%d" % i)
    if i % 2:
        os.link(t, t + ".other")
    if i % 3:
        os.stat(t)  # an old source's entry is cached now
    os.rename(t, "lease")
    st = os.stat("lease")
    with open("lease") as f:
        body = f.read()
    if st.st_ino != D or body != "v%d" % i or os.getxattr("lease", "user.leasefs.epoch") != epoch:
        bad.append((i, st.st_ino, body))
    if i % 2:
        o = os.stat(t + ".other")
        assert o.st_ino != D and o.st_nlink == 1, (i, o)
        with open(t + ".other") as f:
            assert f.read() == "v%d" % i
        os.unlink(t + ".other")
    try:
        os.stat(t)
        bad.append((i, "source name still there"))
    except FileNotFoundError:
        pass
os.close(w)
_, status = os.waitpid(pid, 0)
print("bad", bad[:5], "reader", os.waitstatus_to_exitcode(status))
"#,
    );
    assert_eq!(out.trim().lines().last().unwrap(), "bad [] reader 0", "{out}");
}

/// Unlink and re-create: of a live lease (the name comes back with the
/// lease's inode) and of a plain file (a new inode); another process that
/// had the name cached sees each step at once.
#[test]
fn unlink_and_recreate_are_seen_at_once_by_a_process_that_cached_the_name() {
    let m = Mount::new();
    sh_ok(&m.path, "printf a > live && printf b > plain");
    let _holder = Bg::ready(&m.path, "exec 9<live; flock 9; echo ready; exec sleep 60");
    let out = py_ok(
        &m.path,
        r#"
import os
def ask(to, frm, what):
    os.write(to, what.encode() + b"\n")
    return os.read(frm, 100).decode().strip()
p2c_r, p2c_w = os.pipe()
c2p_r, c2p_w = os.pipe()
pid = os.fork()
if pid == 0:
    # The observer: answers "stat NAME" with the inode or ENOENT.
    os.close(p2c_w)
    while True:
        line = os.read(p2c_r, 100)
        if not line:
            break
        name = line.split()[1].decode()
        try:
            ans = str(os.stat(name).st_ino)
        except FileNotFoundError:
            ans = "ENOENT"
        os.write(c2p_w, ans.encode() + b"\n")
    os._exit(0)
live, plain = os.stat("live").st_ino, os.stat("plain").st_ino
out = []
for name, ino in (("live", live), ("plain", plain)):
    out.append(ask(p2c_w, c2p_r, "stat " + name) == str(ino))
    os.unlink(name)
    out.append(ask(p2c_w, c2p_r, "stat " + name))
    with open(name, "w") as f:
        f.write("again")
    new = os.stat(name).st_ino
    out.append(ask(p2c_w, c2p_r, "stat " + name) == str(new))
    out.append(new == ino)
os.close(p2c_w)
os.waitpid(pid, 0)
print(out)
"#,
    );
    // The live lease keeps its inode; the plain file gets a new one.
    assert_eq!(out.trim(), "[True, 'ENOENT', True, True, True, 'ENOENT', True, False]", "{out}");
}

/// A break changes no name, and what it changes (the epoch, the fence)
/// is never cached: a process that cached the name reads the epoch of the
/// grant after the break at once, and the broken holder's next write is
/// refused.
#[test]
fn a_break_is_seen_at_once_by_a_process_that_cached_the_name() {
    let m = Mount::new();
    sh_ok(&m.path, "touch L");
    let h = Bg::ready(
        &m.path,
        "exec 9<>L; flock 9; echo ready; while [ ! -e go ]; do sleep 0.02; done; \
         if echo more >&9 2>/dev/null; then echo wrote; else echo refused; fi; exec sleep 60",
    );
    let before = epoch(&m.path, "L");
    let out = py_ok(
        &m.path,
        r#"
import os, subprocess
os.stat("L")
e0 = int(os.getxattr("L", "user.leasefs.epoch"))
with open(".leasefs/break", "w") as f:
    f.write("/L")
# Broken: the next contender gets it, at epoch + 1.
assert subprocess.run(["flock", "-n", "L", "true"]).returncode == 0
print(int(os.getxattr("L", "user.leasefs.epoch")) - e0)
"#,
    );
    assert_eq!(out.trim(), "1", "the epoch after a break, seen through a cached name");
    assert_eq!(epoch(&m.path, "L"), before + 1);
    sh_ok(&m.path, "touch go");
    assert_eq!(h.first_line(STEP, "the holder's write"), "refused", "the broken holder's write must be fenced");
}

/// The kernel caches names of files older than a second: repeated `stat`s
/// of one file cost a GETATTR each (an observation the daemon must see)
/// and no LOOKUP; a name's first use costs one LOOKUP. The daemon counts the requests it
/// gets by opcode in `.leasefs/metrics`.
#[test]
fn names_are_cached_and_requests_are_counted() {
    let m = Mount::new();
    sh_ok(&m.path, "touch f");
    let count = |op: &str| requests(&m, &[op]);
    let (lookups, getattrs) = (count("lookup"), count("getattr"));
    // The name of a file younger than a second is not cached.
    py_ok(&m.path, "import os, time\ntime.sleep(1.1)\nfor _ in range(1000): os.stat('f')");
    let (lookups, getattrs) = (count("lookup") - lookups, count("getattr") - getattrs);
    assert!(getattrs >= 1000, "every stat reaches the daemon: {getattrs} getattrs");
    // One per second of the entry's lifetime at most (and the python
    // start-up's own lookups of names that do not exist).
    assert!(lookups < 100, "1000 stats of a cached name sent {lookups} lookups");
}

/// Renewal by rename: the name of a file younger than a second is never
/// cached, and its rename over the live lease goes through at the first
/// try (one RENAME request); an older source that was looked up (its
/// entry may be cached) is refused once and retried (two).
#[test]
fn a_renewal_by_rename_of_a_fresh_file_needs_no_retry() {
    let m = Mount::new();
    sh_ok(&m.path, "touch lease");
    let _holder = Bg::ready(&m.path, "exec 9<lease; flock 9; echo ready; exec sleep 60");
    let renames = || requests(&m, &["rename", "rename2"]);
    let renew = |old: bool| -> u64 {
        let before = renames();
        py_ok(
            &m.path,
            &format!(
                r#"
import os, time
old = {}
if old:
    for i in range(20):
        open("tmp%d" % i, "w").close()
    time.sleep(1.2)
for i in range(20):
    with open("tmp%d" % i, "w") as f:
        f.write(str(i))
    os.stat("tmp%d" % i)
    os.rename("tmp%d" % i, "lease")
assert open("lease").read() == "19"
"#,
                if old { "True" } else { "False" }
            ),
        );
        renames() - before
    };
    assert_eq!(renew(false), 20, "fresh sources are renamed at the first try");
    assert_eq!(renew(true), 40, "sources whose names may be cached are retried once");
}

/// Making the moved entry look its name up again touches no other entry:
/// a filesystem mounted on a directory inside the mount stays mounted
/// across a rename over a live lease (an invalidation of every cached entry
/// would detach it at the next walk through it).
#[test]
fn a_rename_over_a_live_lease_leaves_other_mounts_inside_alone() {
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let m = Mount::new();
    sh_ok(&m.path, "mkdir sub && mount -t tmpfs tmpfs sub && touch sub/inside && printf v0 > lease");
    let _sub = Unmount(m.path.join("sub"));
    let _holder = Bg::ready(&m.path, "exec 9<lease; flock 9; echo ready; exec sleep 60");
    sh_ok(&m.path, "printf v1 > tmp && mv tmp lease");
    assert_eq!(sh_ok(&m.path, "cat lease; ls sub"), "v1inside\n");
    assert!(sh_ok(&m.path, "cat /proc/self/mountinfo").contains(&format!("{} ", m.path.join("sub").display())));
}

/// A regular file that is not used as a lease is read through the page
/// cache, which is kept across opens: a second process reading it again
/// sends no reads to the daemon. A lease (here: a file that was locked) is
/// opened with direct I/O, so each of its reads reaches the daemon (an
/// observation, SPEC 6).
#[test]
fn data_files_keep_their_page_cache_across_opens_and_leases_do_not() {
    let m = Mount::new();
    sh_ok(
        &m.path,
        "head -c 4194304 /dev/urandom > data && cp data lease && flock lease true && cat data lease > /dev/null",
    );
    // Reading the metrics costs reads of their own (a control file):
    // measured first, and taken off each count.
    let first = requests(&m, &["read"]);
    let before = requests(&m, &["read"]);
    let metrics = before - first;
    sh_ok(&m.path, "cat data > /dev/null; cat data > /dev/null");
    let data_again = requests(&m, &["read"]) - before - metrics;
    let between = requests(&m, &["read"]);
    sh_ok(&m.path, "cat lease > /dev/null");
    let lease_again = requests(&m, &["read"]) - between - metrics;
    assert_eq!(data_again, 0, "the data file read twice more, from the cache");
    // 4 MiB in reads of at most 1 MiB.
    assert!(lease_again >= 4, "each read of the lease reaches the daemon: {lease_again} reads");
    assert_eq!(sh_ok(&m.path, "cmp data lease && echo same").trim(), "same");
    // As root the daemon raised the mount's readahead to 1 MiB.
    let dev = sh_ok(&m.path, "mountpoint -d .");
    let knob = format!("/sys/class/bdi/{}/read_ahead_kb", dev.trim());
    assert_eq!(std::fs::read_to_string(knob).unwrap().trim(), "1024");
}

/// Pages the kernel keeps of a data file are dropped before a write that
/// did not go through them is answered: a process that read the file
/// through the cache and kept it open reads the new bytes at once after
/// the file became a lease and another process wrote it (with direct I/O),
/// and after a rename over the live lease replaced its content.
#[test]
fn content_changed_past_the_page_cache_is_read_at_once_through_old_descriptors() {
    let m = Mount::new();
    let out = py_ok(
        &m.path,
        r#"
import os, subprocess, time
open("d", "wb").write(b"o" * 8192)
fd = os.open("d", os.O_RDONLY)
assert os.pread(fd, 8192, 0) == b"o" * 8192
holder = subprocess.Popen(["python3", "-c", "import fcntl, time; f = open('d'); fcntl.flock(f, fcntl.LOCK_EX); time.sleep(30)"])
try:
    deadline = time.time() + 10
    while os.getxattr("d", "user.leasefs.epoch") == b"0":
        assert time.time() < deadline, "the holder never got the lock"
        time.sleep(0.01)
    subprocess.run(["sh", "-c", "printf new | dd of=d conv=notrunc status=none"], check=True, timeout=10)
    first = os.pread(fd, 4, 0)
    subprocess.run(["sh", "-c", "printf renamed > tmp && mv tmp d"], check=True, timeout=10)
    second = os.pread(fd, 8, 0)
    print(first, second, os.fstat(fd).st_ino == os.stat("d").st_ino)
finally:
    holder.kill()
    holder.wait()
"#,
    );
    assert_eq!(out.trim(), "b'newo' b'renamed' True");
}

/// On a mount with nothing to sync (`--volatile`) the first `fsync` is
/// answered `ENOSYS`, which the kernel takes as "no request needed": every
/// `fsync`, `fdatasync` and directory `fsync` succeeds, and only the first
/// of each kind reaches the daemon. A durable mount's reach it every time.
#[test]
fn a_volatile_mount_lets_the_kernel_answer_fsync() {
    let program = r#"
import os
fd = os.open("f", os.O_CREAT | os.O_RDWR, 0o644)
for i in range(20):
    os.write(fd, b"x"); os.fsync(fd); os.fdatasync(fd)
d = os.open(".", os.O_RDONLY)
for i in range(5):
    os.fsync(d)
print("ok")
"#;
    let volatile = Mount::with_args(&["--allow-other", "--volatile"]);
    assert_eq!(py_ok(&volatile.path, program).trim(), "ok");
    assert_eq!(requests(&volatile, &["fsync"]), 1, "the kernel answered the rest");
    assert_eq!(requests(&volatile, &["fsyncdir"]), 1);
    let durable = Mount::new();
    assert_eq!(py_ok(&durable.path, program).trim(), "ok");
    assert_eq!(requests(&durable, &["fsync"]), 40, "a durable mount syncs every time");
    assert_eq!(requests(&durable, &["fsyncdir"]), 5);
}

/// The daemon clears suid/sgid itself (`FUSE_HANDLE_KILLPRIV_V2`), so the
/// kernel does not ask for `security.capability` before each write of a
/// file without privileges: writes through the page cache and direct I/O
/// cost one request each, not two.
#[test]
fn writes_do_not_ask_for_file_capabilities_each_time() {
    let m = Mount::new();
    let before = requests(&m, &["getxattr"]);
    py_ok(
        &m.path,
        r#"
import fcntl, os
for name, lock in [("data", False), ("lease", True)]:
    fd = os.open(name, os.O_CREAT | os.O_RDWR, 0o644)
    if lock:
        fcntl.flock(fd, fcntl.LOCK_EX)
    for i in range(100):
        os.pwrite(fd, b"x", i)
    os.close(fd)
"#,
    );
    let asked = requests(&m, &["getxattr"]) - before;
    assert!(asked <= 4, "{asked} getxattr requests for 200 writes");
}
