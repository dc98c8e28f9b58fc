//! The `leasefs` command line: mount refusals, detaching, signals, unmount,
//! stale mounts.

use std::process::Command;
use std::time::Duration;

use crate::util::{is_mounted, leasefs_bin, run_timeout, sh_ok, wait_timeout, Mount, STEP};

fn leasefs(args: &[&str]) -> (bool, String) {
    let o = run_timeout(Command::new(leasefs_bin()).args(args), STEP);
    (o.status.success(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn mount_refuses_with_a_one_line_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let state = dir.path().join("state");
    let sd = state.to_str().unwrap();
    let (ok, err) = leasefs(&["mount", missing.to_str().unwrap(), "--state-dir", sd]);
    assert!(!ok);
    assert!(err.contains("no such directory"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let (ok, err) = leasefs(&["mount", file.to_str().unwrap(), "--state-dir", sd]);
    assert!(!ok && err.contains("not a directory"), "{err}");

    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("x"), "x").unwrap();
    let (ok, err) = leasefs(&["mount", full.to_str().unwrap(), "--state-dir", sd]);
    assert!(!ok && err.contains("not empty"), "{err}");
    assert!(!is_mounted(&full));
}

#[test]
fn nonempty_and_already_mounted() {
    let m = Mount::new();
    let other_state = m.dir.path().join("other-state");
    let (ok, err) =
        leasefs(&["mount", m.path.to_str().unwrap(), "--nonempty", "--state-dir", other_state.to_str().unwrap()]);
    assert!(!ok && err.contains("already a mount point"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("hidden"), "x").unwrap();
    let ds = d.to_str().unwrap();
    let st = dir.path().join("state");
    let (ok, err) = leasefs(&["mount", ds, "--nonempty", "--state-dir", st.to_str().unwrap()]);
    assert!(ok, "{err}");
    let listed = std::fs::read_dir(&d).unwrap().count();
    let (ok, err) = leasefs(&["unmount", ds]);
    assert!(ok, "{err}");
    assert_eq!(listed, 0, "the mount hides the directory's own entries");
    assert!(d.join("hidden").exists());
}

#[test]
fn detached_mount_and_unmount_wait_for_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let mps = mp.to_str().unwrap();
    let st = dir.path().join("state");
    let (ok, err) = leasefs(&["mount", mps, "--state-dir", st.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(is_mounted(&mp), "mount must be live when `leasefs mount` returns");
    sh_ok(&mp, "echo hi > f && cat f");
    let (ok, err) = leasefs(&["unmount", mps]);
    assert!(ok, "{err}");
    assert!(!is_mounted(&mp));
    let (ok, err) = leasefs(&["unmount", mps]);
    assert!(!ok && err.contains("not a leasefs mount"), "{err}");
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut m = Mount::new();
        sh_ok(&m.path, "touch f");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(m.pid(), sig) };
        let mut child = m.child.take().unwrap();
        let st = wait_timeout(&mut child, STEP, "daemon after signal");
        assert!(st.success(), "signal {sig}: {st:?}");
        assert!(!is_mounted(&m.path), "signal {sig} left the mount behind");
    }
}

#[test]
fn stale_mount_of_a_dead_daemon_is_explained_and_cleaned() {
    let mut m = Mount::new();
    // SAFETY: killing our own child.
    unsafe { libc::kill(m.pid(), libc::SIGKILL) };
    let mut child = m.child.take().unwrap();
    wait_timeout(&mut child, STEP, "killed daemon");
    // Through io_uring the kernel answers ECONNABORTED or ECANCELED for a
    // moment while it tears the dead daemon's rings down (a request caught
    // in a ring entry whose task died is cancelled), then ENOTCONN.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let err = loop {
        let err = std::fs::metadata(&m.path).unwrap_err();
        let transient = matches!(err.raw_os_error(), Some(libc::ECONNABORTED | libc::ECANCELED));
        if !transient || std::time::Instant::now() > deadline {
            break err;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN));
    let other_state = m.dir.path().join("other-state");
    let (ok, err) = leasefs(&["mount", m.path.to_str().unwrap(), "--state-dir", other_state.to_str().unwrap()]);
    assert!(!ok && err.contains("Transport endpoint is not connected"), "{err}");
    let (ok, err) = leasefs(&["unmount", m.path.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(err.contains("Transport endpoint is not connected"), "{err}");
    assert!(!is_mounted(&m.path));
}

#[test]
fn help_reads_well_for_every_subcommand() {
    for args in [&["--help"][..], &["mount", "--help"], &["unmount", "--help"], &["break", "--help"]] {
        let o = run_timeout(Command::new(leasefs_bin()).args(args), Duration::from_secs(10));
        assert!(o.status.success());
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.contains("Usage:"), "{text}");
        assert!(!text.contains("in-memory POSIX"), "the help describes what the daemon does today: {text}");
    }
    let o = run_timeout(Command::new(leasefs_bin()).args(["mount", "--help"]), Duration::from_secs(10));
    let text = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--state-dir",
        "--foreground",
        "--nonempty",
        "--allow-other",
        "--private",
        "--source",
        "--ready-timeout",
        "--size",
    ] {
        assert!(text.contains(flag), "mount --help lacks {flag}");
    }
    let o = run_timeout(Command::new(leasefs_bin()).args(["--help"]), Duration::from_secs(10));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("mount.fuse.leasefs") && text.contains("Exit codes"), "{text}");
    let o = run_timeout(Command::new(leasefs_bin()).args(["mount"]), Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(2), "a usage error exits 2: {o:?}");
    let o = run_timeout(Command::new(leasefs_bin()).args(["mount", "/tmp", "--size", "12q"]), Duration::from_secs(10));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(2) && err.contains("unknown unit"), "a bad --size is a usage error: {err}");
}

#[test]
fn man_pages_and_completions_are_generated_from_the_command_line() {
    let out = tempfile::tempdir().unwrap();
    let o = run_timeout(Command::new(leasefs_bin()).arg("generate-docs").arg(out.path()), Duration::from_secs(10));
    assert!(o.status.success(), "{o:?}");
    let man = |name: &str| std::fs::read_to_string(out.path().join("man").join(name)).unwrap();
    let top = man("leasefs.1");
    assert!(top.contains(".TH leasefs 1") && top.contains("mount.fuse.leasefs"), "{top}");
    for sub in ["mount", "unmount", "status", "leases", "break", "lock", "top", "epoch"] {
        assert!(man(&format!("leasefs-{sub}.1")).contains(&format!(".TH leasefs-{sub} 1")));
    }
    assert!(man("leasefs-mount.1").contains("private"));
    // leasefs-lock(1) states the process-tree guarantee.
    let lock = man("leasefs-lock.1").replace("\\-", "-");
    for words in ["whole process tree", "setsid", "subreaper", "cgroup.kill", "--keep-children", "exits 75"] {
        assert!(lock.contains(words), "leasefs-lock(1) lacks {words:?}: {lock}");
    }
    assert!(!out.path().join("man/leasefs-generate-docs.1").exists(), "hidden commands get no page");
    let bash = out.path().join("completions/leasefs.bash");
    assert!(std::fs::read_to_string(&bash).unwrap().contains("--private"));
    let o = run_timeout(Command::new("bash").arg("-n").arg(&bash), Duration::from_secs(10));
    assert!(o.status.success(), "bash completion has a syntax error: {o:?}");
    for f in ["_leasefs", "leasefs.fish"] {
        assert!(out.path().join("completions").join(f).exists(), "{f}");
    }
}

#[test]
fn epoch_prints_the_fencing_token_and_explains_what_has_none() {
    let m = Mount::new();
    let epoch = |p: &std::path::Path| run_timeout(Command::new(leasefs_bin()).arg("epoch").arg(p), STEP);
    sh_ok(&m.path, "touch job");
    let o = epoch(&m.p("job"));
    assert_eq!((o.status.code(), String::from_utf8_lossy(&o.stdout).as_ref()), (Some(0), "0\n"), "{o:?}");
    sh_ok(&m.path, "flock job true; flock job true");
    assert_eq!(String::from_utf8_lossy(&epoch(&m.p("job")).stdout), "2\n", "two new holders");
    assert_eq!(sh_ok(&m.path, "getfattr --only-values -n user.leasefs.epoch job"), "2", "the xattr agrees");
    let o = epoch(&m.p("missing"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && err.contains("No such file"), "{o:?}");
    let elsewhere = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    let o = epoch(elsewhere.path());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && err.contains("not a file on a leasefs mount"), "{o:?}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// A `PATH` of links to every program on ours but the `attr` package's.
fn path_without_attr(dir: &std::path::Path) -> String {
    for d in std::env::var("PATH").unwrap_or_default().split(':') {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let name = e.file_name();
            if ["getfattr", "setfattr", "attr"].iter().any(|n| name == *n) {
                continue;
            }
            // The first on PATH wins, as it would.
            let _ = std::os::unix::fs::symlink(e.path(), dir.join(&name));
        }
    }
    dir.display().to_string()
}

#[test]
fn the_demo_shows_the_epoch_without_getfattr_and_leaves_no_mount() {
    let bin = tempfile::tempdir().unwrap();
    let path = path_without_attr(bin.path());
    let o = run_timeout(Command::new("sh").args(["-c", "command -v getfattr"]).env("PATH", &path), STEP);
    assert!(!o.status.success(), "getfattr is hidden from the demo");
    let demo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/demo.sh");
    let o = run_timeout(Command::new(&demo).env("PATH", &path).env("LEASEFS_BIN", leasefs_bin()), STEP);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{o:?}");
    assert!(!err.contains("not found"), "the demo needs nothing missing: {err}");
    let lines: Vec<&str> = out.lines().collect();
    let mnt = lines[0].split(' ').nth(2).expect("the mount line");
    assert!(lines[0].starts_with("mounted: leasefs ") && lines[0].contains("fuse.leasefs"), "{out}");
    assert_eq!(lines[1], "holding db.lease, epoch 1; a second flock -n says:", "{out}");
    assert_eq!(lines[2], "  busy (exit 1)", "{out}");
    assert!(
        lines[3].starts_with("PATH ") && lines[4].starts_with("/db.lease ") && lines[4].contains("/flock"),
        "{out}"
    );
    assert_eq!(lines.last(), Some(&"after the next holder: epoch 2"), "{out}");
    assert!(!is_mounted(std::path::Path::new(mnt)) && !std::path::Path::new(mnt).exists(), "{mnt} was cleaned up");
}
