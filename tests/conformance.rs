//! pjdfstest (the POSIX conformance suite) inside a leasefs mount and on
//! tmpfs in the same run: leasefs may not fail anything tmpfs passes. Once
//! on a single host, where the kernel checks permissions, and once on a
//! namespace shared through etcd, where the daemon does.

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

/// The suite's result on tmpfs and the secondary directory it used; none
/// when pjdfstest is not installed (never in CI).
fn on_tmpfs() -> Option<(Summary, String, tempfile::TempDir)> {
    let have = Command::new("pjdfstest").arg("--version").output().is_ok_and(|o| o.status.success());
    if !have {
        assert!(std::env::var_os("CI").is_none(), "CI must install pjdfstest (cargo install pjdfstest --locked)");
        eprintln!("pjdfstest not installed: skipping (scripts/test.sh installs it)");
        return None;
    }
    let secondary = tempfile::tempdir().unwrap();
    let tmpfs = Tmpfs::new();
    let (base, out) = pjdfstest(&tmpfs.path, secondary.path());
    Some((base, out, secondary))
}

#[test]
fn pjdfstest_passes_everything_tmpfs_passes() {
    let Some((base, _, secondary)) = on_tmpfs() else { return };
    let m = Mount::new();
    let (ours, out) = pjdfstest(&m.path, secondary.path());
    eprintln!("pjdfstest tmpfs: {base:?}\npjdfstest leasefs: {ours:?}");
    let failures: Vec<&str> = out.lines().filter(|l| l.trim_end().ends_with("FAILED")).collect();
    assert!(ours.failed <= base.failed, "leasefs fails more than tmpfs: {failures:#?}");
    assert!(ours.passed >= base.passed, "leasefs {ours:?} vs tmpfs {base:?}\n{out}");
    assert!(ours.passed > 300, "the suite did not really run: {ours:?}");
}

/// The tests of the suite that fail: their names.
fn failed(out: &str) -> std::collections::BTreeSet<String> {
    out.lines()
        .filter(|l| l.trim_end().ends_with("FAILED"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Tests that need files over 1 MiB, the size limit of a shared namespace
/// (`EFBIG` there, documented in docs/hosts.md).
const OVER_ONE_MIB: [&str; 3] =
    ["ftruncate::extend_file_shrink_sparse", "truncate::extend_file_shrink_sparse", "open::interact_2gb"];

#[test]
fn pjdfstest_on_a_shared_namespace_passes_what_tmpfs_passes_but_files_over_one_mib() {
    let Some((base, base_out, secondary)) = on_tmpfs() else { return };
    let cluster = crate::etcd::Cluster::start();
    let eps = cluster.endpoints().join(",");
    let prefix = format!("pjdfstest-{}", std::process::id());
    let m = Mount::with_args(&["--allow-other", "--volatile", "--etcd", &eps, "--etcd-prefix", &prefix]);
    let (ours, out) = pjdfstest(&m.path, secondary.path());
    eprintln!("pjdfstest tmpfs: {base:?}\npjdfstest shared: {ours:?}");
    let tmpfs_failed = failed(&base_out);
    let extra: Vec<String> =
        failed(&out).into_iter().filter(|t| !tmpfs_failed.contains(t) && !OVER_ONE_MIB.contains(&t.as_str())).collect();
    assert!(extra.is_empty(), "the shared namespace fails what tmpfs passes: {extra:#?}\n{out}");
    assert!(ours.passed + OVER_ONE_MIB.len() as u32 >= base.passed, "shared {ours:?} vs tmpfs {base:?}\n{out}");
    assert!(ours.passed > 300, "the suite did not really run: {ours:?}");
}
