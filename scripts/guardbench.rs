//! Mounting for tests (scripts/guardbench.sh): how long a `--volatile`
//! mount takes to be ready and to unmount, through `leasefs mount` /
//! `leasefs unmount` and through the Rust guard (`TestMount`), medians of
//! REPEATS; then N tests in a row, each with its own mount through the
//! guard (mount, create and write a file, add and fire a rule, unmount).
//!   guardbench LEASEFS_BIN [REPEATS] [N]

use std::process::Command;
use std::time::Instant;

use leasefs::bench::{RuleSpec, TestMount};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args.get(1).expect("usage: guardbench LEASEFS_BIN [REPEATS] [N]");
    std::env::set_var("LEASEFS_BIN", bin);
    let repeats: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(15);
    let n: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(100);
    let dir = std::env::temp_dir().join(format!("leasefs-guardbench.{}", std::process::id()));
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for i in 0..repeats {
        let mnt = dir.join(format!("cli{i}"));
        std::fs::create_dir_all(&mnt).unwrap();
        let t = Instant::now();
        let ok = Command::new(bin)
            .arg("mount")
            .arg(&mnt)
            .args(["--volatile", "--state-dir"])
            .arg(dir.join(format!("state{i}")))
            .status()
            .unwrap();
        assert!(ok.success(), "leasefs mount failed");
        up.push(ms(t));
        let t = Instant::now();
        assert!(Command::new(bin).arg("unmount").arg(&mnt).status().unwrap().success(), "leasefs unmount failed");
        down.push(ms(t));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (cli_up, cli_down) = (median(up), median(down));
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        let t = Instant::now();
        let mut m = TestMount::new().expect("mount");
        up.push(ms(t));
        let t = Instant::now();
        m.unmount();
        down.push(ms(t));
    }
    let (guard_up, guard_down) = (median(up), median(down));
    let t = Instant::now();
    for _ in 0..n {
        let m = TestMount::new().expect("mount");
        std::fs::write(m.path().join("f"), b"data").unwrap();
        m.add(RuleSpec::on(&["read"]).path("f").errno("EIO")).unwrap();
        assert!(std::fs::read(m.path().join("f")).is_err());
        assert_eq!(m.fault_events().len(), 1);
    }
    let total = t.elapsed().as_secs_f64();
    println!("# medians of {repeats}; {n} tests in a row, each with its own mount through the guard");
    println!("{:<34}{:>10}{:>10}{:>10}", "volatile mount", "ready_ms", "unmnt_ms", "sum_ms");
    println!("{:<34}{:>10.1}{:>10.1}{:>10.1}", "leasefs mount / leasefs unmount", cli_up, cli_down, cli_up + cli_down);
    println!(
        "{:<34}{:>10.1}{:>10.1}{:>10.1}",
        "TestMount::new / drop (--bench)",
        guard_up,
        guard_down,
        guard_up + guard_down
    );
    println!("{n} tests, own mount each: {total:.2} s ({:.1} ms per test)", total * 1000.0 / n as f64);
}
