//! pjdfstest (the POSIX conformance suite) inside a leasefs mount and on
//! tmpfs in the same run: leasefs may not fail anything tmpfs passes.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::util::{run_timeout, Mount, Tmpfs};

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Summary {
    failed: u32,
    skipped: u32,
    passed: u32,
}

fn pjdfstest(dir: &Path, secondary: &Path) -> (Summary, String) {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/pjdfstest.toml");
    let o = run_timeout(
        Command::new("pjdfstest").arg("-c").arg(&config).arg("-p").arg(dir).arg("-s").arg(secondary).current_dir(dir),
        Duration::from_secs(900),
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let line = out.lines().find(|l| l.starts_with("Summary:")).unwrap_or_else(|| panic!("no summary:\n{out}"));
    let num = |key: &str| -> u32 {
        let before = line.split(key).next().unwrap();
        before.rsplit(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty()).unwrap().parse().unwrap()
    };
    (Summary { failed: num(" failed"), skipped: num(" skipped"), passed: num(" passed") }, out)
}

#[test]
fn pjdfstest_passes_everything_tmpfs_passes() {
    let have = Command::new("pjdfstest").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have {
        assert!(std::env::var_os("CI").is_none(), "CI must install pjdfstest (cargo install pjdfstest --locked)");
        eprintln!("pjdfstest not installed: skipping (scripts/test.sh installs it)");
        return;
    }
    let secondary = tempfile::tempdir().unwrap();
    let tmpfs = Tmpfs::new();
    let (base, _) = pjdfstest(&tmpfs.path, secondary.path());
    let m = Mount::new();
    let (ours, out) = pjdfstest(&m.path, secondary.path());
    eprintln!("pjdfstest tmpfs: {base:?}\npjdfstest leasefs: {ours:?}");
    let failures: Vec<&str> = out.lines().filter(|l| l.trim_end().ends_with("FAILED")).collect();
    assert!(ours.failed <= base.failed, "leasefs fails more than tmpfs: {failures:#?}");
    assert!(ours.passed >= base.passed, "leasefs {ours:?} vs tmpfs {base:?}\n{out}");
    assert!(ours.passed > 300, "the suite did not really run: {ours:?}");
}
