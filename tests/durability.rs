//! Durable epochs (SPEC 5, 9): epochs never repeat or go backwards across
//! `kill -9` of the daemon; one daemon per state directory.

use std::process::Command;

use crate::util::{epoch, leasefs_bin, run_timeout, sh_ok, wait_timeout, Mount, STEP};

#[test]
fn epochs_survive_kill_9_and_the_next_grant_is_higher() {
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap();
    let mut m = Mount::with_args(&["--allow-other", "--state-dir", sd]);
    sh_ok(&m.path, "mkdir d && touch d/L && for i in 1 2 3 4 5; do flock d/L true; done");
    let before = epoch(&m.path, "d/L");
    assert_eq!(before, 5);
    // SAFETY: killing our own child.
    unsafe { libc::kill(m.pid(), libc::SIGKILL) };
    let mut child = m.child.take().unwrap();
    wait_timeout(&mut child, STEP, "killed daemon");
    let o = run_timeout(Command::new(leasefs_bin()).arg("unmount").arg(&m.path), STEP);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(m);
    let m2 = Mount::with_args(&["--allow-other", "--state-dir", sd]);
    sh_ok(&m2.path, "mkdir d && touch d/L");
    let floor = epoch(&m2.path, "d/L");
    assert!(floor >= before, "epoch went back across the crash: {floor} < {before}");
    sh_ok(&m2.path, "flock d/L true");
    let next = epoch(&m2.path, "d/L");
    assert!(next > before && next > floor, "next grant {next} not above {before}");
    let status = sh_ok(&m2.path, "cat .leasefs/status");
    assert!(status.contains("\"journal_commits\"") && status.contains(sd), "{status}");
}

#[test]
fn a_second_daemon_on_the_same_state_dir_is_refused() {
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap();
    let _m = Mount::with_args(&["--allow-other", "--state-dir", sd]);
    let other = tempfile::tempdir().unwrap();
    let mp = other.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let o = run_timeout(Command::new(leasefs_bin()).arg("mount").arg(&mp).args(["--state-dir", sd]), STEP);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("in use by another leasefs daemon"), "{o:?}");
}

#[test]
fn a_corrupt_journal_stops_start_up_with_file_and_offset() {
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join("epochs.journal"), "garbage line\nmore garbage\n").unwrap();
    let other = tempfile::tempdir().unwrap();
    let mp = other.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let o = run_timeout(
        Command::new(leasefs_bin()).arg("mount").arg(&mp).arg("--state-dir").arg(state.path()),
        STEP,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("epochs.journal") && err.contains("offset 0"), "{err}");
}

#[test]
fn a_full_state_disk_refuses_grants_with_enospc_and_recovers() {
    let root = tempfile::tempdir().unwrap();
    let sd = root.path().join("state");
    std::fs::create_dir(&sd).unwrap();
    let o = run_timeout(Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"]).arg(&sd), STEP);
    assert!(o.status.success(), "{o:?}");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _guard = Unmount(sd.clone());
    let m = Mount::with_args(&["--allow-other", "--state-dir", sd.to_str().unwrap()]);
    sh_ok(&m.path, "echo data > A && touch L && flock L true");
    let e1 = epoch(&m.path, "L");
    // Fill the state disk.
    let _ = Command::new("sh").arg("-c").arg(format!("cat /dev/zero > {}/filler 2>/dev/null", sd.display())).status();
    // New paths need new reservations; the journal's last page fills up.
    let o = crate::util::sh(
        &m.path,
        "for i in $(seq 400); do touch M$i; flock -n M$i true || { echo M$i; exit 0; }; done; exit 1",
    );
    assert!(o.status.success(), "no grant was refused on a full state disk: {o:?}");
    let refused = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(String::from_utf8_lossy(&o.stderr).contains("No space left on device"), "{o:?}");
    assert_eq!(sh_ok(&m.path, "cat A"), "data\n", "reads keep working");
    let journal = std::fs::read(sd.join("epochs.journal")).unwrap();
    assert!(journal.ends_with(b"\n"), "a refused reservation left a partial record behind");
    // Within the reserved range, grants on L need no sync and keep working.
    sh_ok(&m.path, "flock L true");
    assert_eq!(epoch(&m.path, "L"), e1 + 1);
    std::fs::remove_file(sd.join("filler")).unwrap();
    sh_ok(&m.path, &format!("flock -n {refused} true"));
    assert_eq!(epoch(&m.path, &refused), 1, "the daemon recovers when space returns");
    // Nothing durable was lost and the journal is intact: a restart on the
    // same state dir comes up and keeps the epochs.
    drop(m);
    let m2 = Mount::with_args(&["--allow-other", "--state-dir", sd.to_str().unwrap()]);
    sh_ok(&m2.path, &format!("touch L {refused}"));
    assert!(epoch(&m2.path, "L") >= e1 + 1);
    assert!(epoch(&m2.path, &refused) >= 1);
}
