//! Operating leasefs like any Linux filesystem (SPEC 12): who may use a
//! mount, mount(8) and fstab through the `mount.fuse.leasefs` helper, and
//! systemd's readiness protocol.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{have, leasefs_bin, run_timeout, sh, sh_ok, wait_timeout, Mount, STEP};

/// The super-block options of the mount at `path` (`allow_other`, ...).
fn super_options(path: &Path) -> String {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_str().unwrap();
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(p))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_default()
        .to_string()
}

/// How many leasefs mounts are at `path`, and the last one's source.
fn leasefs_mounts(path: &Path) -> (usize, String) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let p = path.to_str().unwrap();
    let found: Vec<String> = info
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(p))
        .filter_map(|l| {
            let (_, rest) = l.split_once(" - ")?;
            let mut f = rest.split(' ');
            (f.next()? == "fuse.leasefs").then(|| f.next().unwrap_or_default().to_string())
        })
        .collect();
    (found.len(), found.last().cloned().unwrap_or_default())
}

const NOBODY: &str = "setpriv --reuid=65534 --regid=65534 --clear-groups";

#[test]
fn a_root_mount_is_shared_by_default_and_private_keeps_it_to_the_mounter() {
    let m = Mount::with_args(&[]);
    assert!(super_options(&m.path).contains("allow_other"), "{}", super_options(&m.path));
    assert!(sh_ok(&m.path, "cat .leasefs/status").contains("\"access\":\"shared\""));
    sh_ok(&m.path, "mkdir -m 1777 pub && mkdir -m 700 mine");
    sh_ok(&m.path, &format!("{NOBODY} sh -c 'flock pub/L true && echo x > pub/own'"));
    // The kernel's permission checks still apply to other users.
    let o = sh(&m.path, &format!("{NOBODY} ls mine"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"), "{o:?}");
    drop(m);

    let m = Mount::with_args(&["--private"]);
    assert!(!super_options(&m.path).contains("allow_other"), "{}", super_options(&m.path));
    assert!(sh_ok(&m.path, "cat .leasefs/status").contains("\"access\":\"private\""));
    sh_ok(&m.path, "mkdir -m 1777 pub && touch pub/L && flock pub/L true");
    let o = sh(m.path.parent().unwrap(), &format!("{NOBODY} stat mnt/pub/L"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"), "{o:?}");
    drop(m);

    let dir = tempfile::tempdir().unwrap();
    let o = run_timeout(
        Command::new(leasefs_bin()).args(["mount", dir.path().to_str().unwrap(), "--private", "--allow-other"]),
        STEP,
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be used with"), "{o:?}");
}

/// The tests that install `/sbin/mount.fuse.leasefs` take turns.
static SBIN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `/sbin/mount.fuse.leasefs` as a symlink to the binary under test, removed
/// on drop.
struct Helper(PathBuf, #[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Helper {
    fn install() -> Helper {
        let turn = SBIN.lock().unwrap_or_else(|e| e.into_inner());
        let p = PathBuf::from("/sbin/mount.fuse.leasefs");
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink(leasefs_bin(), &p).expect("install the mount helper");
        Helper(p, turn)
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Unmounts `path` on drop (a test that fails half-way leaves nothing).
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        while leasefs_mounts(&self.0).0 > 0 {
            let _ = run_timeout(Command::new("umount").arg("-l").arg(&self.0), STEP);
        }
    }
}

fn run_ok(cmd: &mut Command) -> String {
    let o = run_timeout(cmd, STEP);
    assert!(o.status.success(), "{cmd:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Wait until the daemon `pid` has exited (after an unmount).
fn wait_gone(pid: i32) {
    let deadline = Instant::now() + STEP;
    while Path::new(&format!("/proc/{pid}")).exists() {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')) {
            return;
        }
        assert!(Instant::now() < deadline, "daemon {pid} still running after unmount");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn daemon_pid(path: &Path) -> i32 {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path.join(".leasefs/status")).unwrap()).unwrap();
    v["pid"].as_i64().unwrap() as i32
}

#[test]
fn mount_t_and_fstab_lines_go_through_the_helper_and_mount_a_sees_them_mounted() {
    assert!(have("mount") && have("findmnt"), "util-linux mount and findmnt are needed");
    let _helper = Helper::install();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("leases");
    std::fs::create_dir(&dir).unwrap();
    let state = work.path().join("state");
    let _guard = Unmount(dir.clone());

    // mount -t with options mount(8) and fstab conventions add.
    let opts = format!("state_dir={},lease_ttl=5s,nofail,_netdev,x-systemd.device-timeout=5", state.display());
    run_ok(Command::new("mount").args(["-t", "fuse.leasefs", "leases"]).arg(&dir).args(["-o", &opts]));
    assert_eq!(leasefs_mounts(&dir), (1, "leases".to_string()));
    let shown = run_ok(Command::new("findmnt").args(["-n", "-o", "SOURCE,FSTYPE"]).arg(&dir));
    assert_eq!(shown.split_whitespace().collect::<Vec<_>>(), ["leases", "fuse.leasefs"]);
    sh_ok(&dir, "touch L && flock L true");
    let status = std::fs::read_to_string(dir.join(".leasefs/status")).unwrap();
    assert!(status.contains(&state.display().to_string()), "state_dir= reached the daemon: {status}");
    assert!(super_options(&dir).contains("allow_other"), "a root mount is shared");
    let pid = daemon_pid(&dir);
    run_ok(Command::new("umount").arg(&dir));
    wait_gone(pid);
    assert_eq!(leasefs_mounts(&dir).0, 0);

    // An unknown option is refused in one line and nothing is mounted.
    let o =
        run_timeout(Command::new("mount").args(["-t", "fuse.leasefs", "leases"]).arg(&dir).args(["-o", "bogus"]), STEP);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown mount option \"bogus\"") && err.trim().lines().count() == 1, "{err}");
    assert_eq!(leasefs_mounts(&dir).0, 0);

    // A private fstab: mount by mount point, then `mount -a` twice.
    let fstab = work.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# test\nleases {} fuse.leasefs state_dir={},private_access,nofail 0 0\n",
            dir.display(),
            state.display()
        ),
    )
    .unwrap();
    run_ok(Command::new("mount").arg("-T").arg(&fstab).arg(&dir));
    assert_eq!(leasefs_mounts(&dir), (1, "leases".to_string()));
    assert!(!super_options(&dir).contains("allow_other"), "private_access reached the daemon");
    assert_eq!(sh_ok(&dir, "ls"), "L\n", "the state directory was recovered");
    for _ in 0..2 {
        run_ok(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
        assert_eq!(leasefs_mounts(&dir).0, 1, "mount -a sees the mount as mounted");
    }
    let pid = daemon_pid(&dir);
    run_ok(Command::new("umount").arg(&dir));
    wait_gone(pid);
    run_ok(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
    assert_eq!(leasefs_mounts(&dir).0, 1, "mount -a mounts what is not mounted");
    let pid = daemon_pid(&dir);
    run_ok(Command::new("umount").arg(&dir));
    wait_gone(pid);
}

/// Receive datagrams until one contains `want` (or fail after `STEP`);
/// returns everything received.
fn recv_until(sock: &UnixDatagram, want: &str) -> Vec<String> {
    let deadline = Instant::now() + STEP;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.iter().any(|m: &String| m.lines().any(|l| l == want)) {
        let left = deadline.checked_duration_since(Instant::now()).unwrap_or_else(|| panic!("no {want}: {got:?}"));
        sock.set_read_timeout(Some(left)).unwrap();
        match sock.recv(&mut buf) {
            Ok(n) => got.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) => panic!("no {want} ({e}); got {got:?}"),
        }
    }
    got
}

/// A work directory with a datagram socket standing in for systemd's
/// `NOTIFY_SOCKET` and an empty mount point (unmounted on drop).
struct Notified {
    work: tempfile::TempDir,
    sock: UnixDatagram,
    dir: PathBuf,
    _guard: Unmount,
}

impl Notified {
    fn new() -> Notified {
        let work = tempfile::tempdir().unwrap();
        let sock = UnixDatagram::bind(work.path().join("notify")).unwrap();
        let dir = work.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        Notified { _guard: Unmount(dir.clone()), work, sock, dir }
    }

    /// `leasefs mount DIR --foreground` with `NOTIFY_SOCKET` set to `socket`.
    fn mount(&self, socket: &std::ffi::OsStr, extra: &[&str], env: &[(&str, &str)]) -> std::process::Child {
        Command::new(leasefs_bin())
            .args(["mount", self.dir.to_str().unwrap(), "--foreground", "--state-dir"])
            .arg(self.work.path().join("state"))
            .args(extra)
            .env("NOTIFY_SOCKET", socket)
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    }

    fn socket_path(&self) -> PathBuf {
        self.work.path().join("notify")
    }
}

#[test]
fn the_daemon_tells_systemd_it_is_ready_once_the_mount_is_live_and_when_it_stops() {
    let n = Notified::new();
    let (sock, dir) = (&n.sock, &n.dir);
    let mut child = n.mount(n.socket_path().as_os_str(), &[], &[]);
    let got = recv_until(sock, "READY=1");
    // Recovery asked for more start-up time before it was ready.
    assert!(got[0].contains("EXTEND_TIMEOUT_USEC=") && got[0].contains("STATUS=recovering"), "{got:?}");
    let ready = got.last().unwrap();
    assert!(ready.contains(&format!("MAINPID={}", child.id())), "{ready}");
    assert_eq!(leasefs_mounts(dir).0, 1, "READY=1 comes after the mount is live");
    assert!(dir.join(".leasefs/status").exists());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    recv_until(sock, "STOPPING=1");
    assert!(wait_timeout(&mut child, STEP, "daemon").success());

    // The abstract namespace (`@name`), as systemd uses it too.
    let name = format!("leasefs-test-{}", std::process::id());
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(&name).unwrap();
    let sock = UnixDatagram::bind_addr(&addr).unwrap();
    let mut child = n.mount(std::ffi::OsStr::new(&format!("@{name}")), &["--volatile"], &[]);
    recv_until(&sock, "READY=1");
    assert_eq!(leasefs_mounts(dir).0, 1);
    run_ok(Command::new(leasefs_bin()).arg("unmount").arg(dir));
    recv_until(&sock, "STOPPING=1");
    assert!(wait_timeout(&mut child, STEP, "daemon").success());
}

#[test]
fn a_long_recovery_keeps_asking_systemd_for_time_until_it_is_ready() {
    let n = Notified::new();
    let started = Instant::now();
    // Recovery that takes 10.5 s: longer than one extension interval (10 s).
    let mut child = n.mount(n.socket_path().as_os_str(), &[], &[("LEASEFS_PAUSE", "recovery:10500")]);
    let (sock, dir) = (&n.sock, &n.dir);
    let got = recv_until(sock, "READY=1");
    let extends = got.iter().filter(|m| m.contains("EXTEND_TIMEOUT_USEC=30000000")).count();
    assert!(extends >= 2, "one extension per 10 s of recovery: {got:?}");
    assert!(started.elapsed() >= Duration::from_millis(10_500), "READY=1 only after recovery");
    assert!(got.last().unwrap().contains("READY=1") && !got.last().unwrap().contains("EXTEND"), "{got:?}");
    assert_eq!(leasefs_mounts(dir).0, 1);
    run_ok(Command::new(leasefs_bin()).arg("unmount").arg(dir));
    assert!(wait_timeout(&mut child, STEP, "daemon").success());
}

#[test]
fn a_mount_that_is_not_live_within_the_ready_timeout_fails_and_leaves_no_daemon() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("mnt");
    let state = work.path().join("state");
    std::fs::create_dir(&dir).unwrap();
    let _guard = Unmount(dir.clone());
    let started = Instant::now();
    let o = run_timeout(
        Command::new(leasefs_bin())
            .args(["mount", dir.to_str().unwrap(), "--ready-timeout", "1", "--state-dir"])
            .arg(&state)
            .env("LEASEFS_PAUSE", "recovery:20000"),
        STEP,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(started.elapsed() < Duration::from_secs(15), "the wait is bounded by --ready-timeout");
    assert!(err.contains("did not report the mount live within 1s") && err.trim().lines().count() == 1, "{err}");
    assert_eq!(leasefs_mounts(&dir).0, 0, "nothing mounted");
    // The stopped daemon released the state directory: a new mount takes it at once.
    let m = run_timeout(
        Command::new(leasefs_bin()).args(["mount", dir.to_str().unwrap(), "--state-dir"]).arg(&state),
        STEP,
    );
    assert!(m.status.success(), "{}", String::from_utf8_lossy(&m.stderr));
    run_ok(Command::new(leasefs_bin()).arg("unmount").arg(&dir));
}

#[test]
fn the_shipped_unit_files_pass_systemd_analyze_verify() {
    assert!(have("systemd-analyze"), "systemd-analyze is needed to check the unit files");
    let work = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/dist/leasefs@.service")).unwrap();
    // An instance of the template, run from the binary under test.
    let unit = unit.replace("/usr/bin/leasefs", leasefs_bin().to_str().unwrap());
    let path = work.path().join("leasefs@run-leases.service");
    std::fs::write(&path, unit).unwrap();
    let o = run_timeout(Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&path), STEP);
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && !out.contains("leasefs@"), "{out}");
}

/// Removes the package on drop.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = run_timeout(Command::new("dpkg").args(["-r", "leasefs"]), STEP);
    }
}

#[test]
fn the_debian_package_installs_mounts_from_fstab_and_removes_cleanly() {
    assert!(have("dpkg") && have("dpkg-deb"), "dpkg is needed to test the package");
    let _turn = SBIN.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/package.sh");
    let deb = run_ok(Command::new("bash").arg(script).arg(work.path()).env("LEASEFS_BIN", leasefs_bin()));
    let deb = deb.trim();
    let listing = run_ok(Command::new("dpkg-deb").args(["-c", deb]));
    for f in [
        "./usr/bin/leasefs",
        "./usr/sbin/mount.fuse.leasefs -> ../bin/leasefs",
        "./usr/lib/systemd/system/leasefs@.service",
        "./usr/lib/tmpfiles.d/leasefs.conf",
        "./usr/share/man/man1/leasefs.1.gz",
        "./usr/share/man/man1/leasefs-mount.1.gz",
        "./usr/share/man/man8/mount.fuse.leasefs.8.gz",
        "./usr/share/bash-completion/completions/leasefs",
        "./usr/share/zsh/vendor-completions/_leasefs",
        "./usr/share/fish/vendor_completions.d/leasefs.fish",
        "./usr/share/doc/leasefs/fstab.example",
        "./usr/share/doc/leasefs/grafana-leasefs.json",
        "./usr/share/doc/leasefs/examples/cron-singleton.sh",
    ] {
        assert!(listing.contains(f), "the package lacks {f}:\n{listing}");
    }
    assert!(!run_ok(Command::new("dpkg-deb").args(["-I", deb])).contains("postinst"), "no maintainer scripts");
    let _ = std::fs::remove_file("/sbin/mount.fuse.leasefs");
    let installed = Installed;
    run_ok(Command::new("dpkg").args(["-i", deb]));
    let dir = work.path().join("leases");
    std::fs::create_dir(&dir).unwrap();
    let _guard = Unmount(dir.clone());
    let fstab = work.path().join("fstab");
    let line =
        format!("leasefs {} fuse.leasefs state_dir={},nofail 0 0\n", dir.display(), work.path().join("s").display());
    std::fs::write(&fstab, line).unwrap();
    run_ok(Command::new("mount").arg("-T").arg(&fstab).arg(&dir));
    assert_eq!(leasefs_mounts(&dir), (1, "leasefs".to_string()));
    assert!(run_ok(Command::new("/usr/bin/leasefs").arg("status").arg(&dir)).contains("access       shared"));
    let pid = daemon_pid(&dir);
    run_ok(Command::new("umount").arg(&dir));
    wait_gone(pid);
    drop(installed);
    assert!(!Path::new("/usr/bin/leasefs").exists() && !Path::new("/usr/sbin/mount.fuse.leasefs").exists());
    assert!(!run_timeout(Command::new("dpkg").args(["-s", "leasefs"]), STEP).status.success(), "removed");
}

#[test]
fn metrics_are_served_over_http_for_prometheus() {
    let m = Mount::with_args(&["--allow-other", "--metrics-addr", "127.0.0.1:0"]);
    let status: serde_json::Value = serde_json::from_str(&sh_ok(&m.path, "cat .leasefs/status")).unwrap();
    let addr = status["metrics_addr"].as_str().expect("status shows where /metrics is served").to_string();
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{addr}");
    sh_ok(&m.path, "touch L && flock L true && flock L true");
    let got = crate::util::py_ok(
        &m.path,
        &format!(
            r#"
import urllib.request, urllib.error
r = urllib.request.urlopen("http://{addr}/metrics", timeout=10)
print(r.status, r.headers["Content-Type"])
print(r.read().decode())
try:
    urllib.request.urlopen("http://{addr}/other", timeout=10)
except urllib.error.HTTPError as e:
    print("other", e.code)
"#
        ),
    );
    assert!(got.starts_with("200 text/plain; version=0.0.4"), "{got}");
    let mount = format!("mount=\"{}\"", m.path.display());
    assert!(got.contains(&format!("leasefs_acquisitions_total{{{mount}}} 2")), "{got}");
    assert!(got.contains("# TYPE leasefs_build_info gauge") && got.contains("other 404"), "{got}");
    drop(m);
    let dir = tempfile::tempdir().unwrap();
    let o = run_timeout(
        Command::new(leasefs_bin())
            .args(["mount", dir.path().to_str().unwrap(), "--volatile", "--metrics-addr", "256.0.0.1:1"])
            .args(["--state-dir", dir.path().join("s").to_str().unwrap()]),
        STEP,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--metrics-addr 256.0.0.1:1") && err.trim().lines().count() == 1,
        "{err}"
    );
    assert_eq!(leasefs_mounts(dir.path()).0, 0);
}

/// Restores `/dev/fuse`'s mode on drop. Distributions make it 0666 so that
/// fusermount3 (which opens it with the user's rights) works; a container
/// may not.
struct DevFuseMode(u32);

impl Drop for DevFuseMode {
    fn drop(&mut self) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(self.0));
    }
}

#[test]
fn a_user_mounts_through_fusermount3_and_interrupts_and_flock_still_work() {
    use std::os::unix::fs::PermissionsExt;
    assert!(have("fusermount3"), "fusermount3 (package fuse3) is needed");
    let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777;
    let _restore = DevFuseMode(mode);
    std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666)).unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    std::fs::set_permissions(w, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = w.join("leasefs");
    std::fs::copy(leasefs_bin(), &bin).unwrap();
    std::fs::create_dir(w.join("mnt")).unwrap();
    let dir = w.join("mnt");
    let _guard = Unmount(dir.clone());
    sh_ok(w, "mkdir state && chown -R tests:tests mnt state");
    let user = |script: &str| {
        sh(w, &format!("setpriv --reuid=tests --regid=tests --init-groups env -i PATH=/usr/bin:/bin sh -c '{script}'"))
    };
    let o = user(&format!("./leasefs mount mnt --state-dir {}/state", w.display()));
    assert!(o.status.success(), "{o:?}");
    assert_eq!(leasefs_mounts(&dir).0, 1);
    assert!(!super_options(&dir).contains("allow_other"), "a user's mount is private");
    // Root cannot look into another user's private mount: ask as the user.
    let status = String::from_utf8_lossy(&user("cat mnt/.leasefs/status").stdout).into_owned();
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["access"], "private");
    let pid = v["pid"].as_i64().unwrap() as i32;
    let uid = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = uid.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let tests_uid = sh_ok(w, "id -u tests");
    assert_eq!(uid_line.split_whitespace().nth(1), Some(tests_uid.trim()), "the daemon runs as the user: {uid_line}");
    let o =
        user("cd mnt && touch L && flock L true && getfattr --absolute-names --only-values -n user.leasefs.epoch L");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1", "{o:?}");
    // A blocked lock wait ends with EINTR when a signal arrives: the
    // request hook sees FUSE_INTERRUPT on a descriptor fusermount3 opened.
    let o = user(
        "cd mnt && python3 -c \"
import fcntl, signal, subprocess, time
h = subprocess.Popen([\\\"flock\\\", \\\"L\\\", \\\"sleep\\\", \\\"2\\\"])
time.sleep(0.3)
class Out(Exception): pass
def ring(*a): raise Out()
signal.signal(signal.SIGALRM, ring)
signal.alarm(1)
try:
    fcntl.flock(open(\\\"L\\\"), fcntl.LOCK_EX)
    print(\\\"granted while held\\\")
except Out:
    print(\\\"interrupted\\\")
h.wait()
\"",
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "interrupted\n", "{o:?}");
    let o = user("./leasefs unmount mnt");
    assert!(o.status.success(), "{o:?}");
    wait_gone(pid);
    assert_eq!(leasefs_mounts(&dir).0, 0);
}
