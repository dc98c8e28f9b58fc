//! `status`, `leases` and `break`: what the `.leasefs/` files of a mount
//! say, as tables (or the daemon's JSON), and the administrator's break.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use leasefs::fuse::session::{self};

use crate::cli::*;

/// Read a control file of the leasefs mount at `mountpoint`, with a clear
/// message when it is not one or its daemon is dead.
pub(crate) fn control_file(mountpoint: &Path, name: &str) -> Result<PathBuf, String> {
    let path = session::absolute(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let show = path.display();
    if session::find_mount(&path).is_none() {
        return Err(format!("{show}: not a leasefs mount"));
    }
    if let Err(e) = std::fs::metadata(&path) {
        if session::daemon_gone(&e) {
            return Err(format!(
                "{show}: the daemon is gone (Transport endpoint is not connected); run `leasefs unmount {show}`"
            ));
        }
        return Err(format!("{show}: {e}"));
    }
    Ok(path.join(".leasefs").join(name))
}

pub(crate) fn read_control(mountpoint: &Path, name: &str) -> Result<String, String> {
    let p = control_file(mountpoint, name)?;
    std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// The control file's text for a table, or `Err(exit code)` once it was
/// printed (`--json`) or its error reported.
pub(crate) fn show(args: &ShowArgs, name: &str) -> Result<String, ExitCode> {
    match read_control(&args.mountpoint, name) {
        Ok(text) if args.json => {
            print!("{text}");
            Err(ExitCode::SUCCESS)
        }
        Ok(text) => Ok(text),
        Err(e) => {
            eprintln!("leasefs: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

pub(crate) fn status(args: &ShowArgs) -> ExitCode {
    let text = match show(args, "status") {
        Ok(t) => t,
        Err(code) => return code,
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let l = &v["leases"];
    println!("mount point  {}", v["mount_point"].as_str().unwrap_or("?"));
    println!("source       {}", v["source"].as_str().unwrap_or("?"));
    println!("access       {}", v["access"].as_str().unwrap_or("?"));
    println!("version      {}", v["version"].as_str().unwrap_or("?"));
    println!("backend      {}", v["backend"].as_str().unwrap_or("?"));
    let etcd = &v["etcd"];
    if etcd.is_object() {
        let eps: Vec<&str> =
            etcd["endpoints"].as_array().map(|a| a.iter().filter_map(|e| e.as_str()).collect()).unwrap_or_default();
        let session = &etcd["session"];
        println!("etcd         {} (prefix {})", eps.join(","), etcd["prefix"].as_str().unwrap_or("?"));
        println!("host         {}", etcd["host"].as_str().unwrap_or("?"));
        println!(
            "session      lease {} ({}, ttl {}s, {} lost so far)",
            session["lease"].as_str().unwrap_or("?"),
            if session["alive"].as_bool() == Some(true) { "alive" } else { "LOST, re-registering" },
            session["ttl_secs"],
            session["lost"]
        );
    }
    println!("daemon pid   {}", v["pid"]);
    println!("uptime       {}", age((v["uptime_secs"].as_f64().unwrap_or(0.0) * 1000.0) as u64));
    println!("leases       {} held, {} awaited, {} with a TTL", l["held"], l["awaited"], l["with_ttl"]);
    let lim = &v["limits"];
    let size = &lim["size"];
    println!(
        "space        {} of {} used",
        bytes(size["used"].as_u64().unwrap_or(0)),
        bytes(size["max"].as_u64().unwrap_or(0))
    );
    println!("inodes       {} of {}", v["inodes"], lim["inodes"]["max"]);
    let refused: Vec<String> = lim
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, l)| l["refused"].as_u64().unwrap_or(0) > 0)
                .map(|(k, l)| format!("{k} {}", l["refused"]))
                .collect()
        })
        .unwrap_or_default();
    if !refused.is_empty() {
        println!("limits hit   {}", refused.join(", "));
    }
    let state = v["state_dir"].as_str().unwrap_or("?");
    println!("state dir    {state} ({})", v["durability"].as_str().unwrap_or("?"));
    println!(
        "epochs       ceiling {}, journal {}, {} commits",
        v["epoch_ceiling"],
        bytes(v["journal_bytes"].as_u64().unwrap_or(0)),
        v["journal_commits"]
    );
    if let Some(n) = v["namespace_journal_bytes"].as_u64() {
        let snap = &v["snapshot"];
        println!(
            "namespace    journal {}, snapshot {} (generation {}), {} compactions",
            bytes(n),
            bytes(snap["bytes"].as_u64().unwrap_or(0)),
            snap["generation"],
            v["journal_compactions"]
        );
    }
    let t = &v["transport"];
    match t["kind"].as_str() {
        Some("uring") => {
            let queues = t["queues"].as_array().cloned().unwrap_or_default();
            let sum = |k: &str| queues.iter().map(|q| q[k].as_u64().unwrap_or(0)).sum::<u64>();
            println!(
                "transport    io_uring, {} queues: {} requests served, {} ring entries, {} held",
                queues.len(),
                sum("served"),
                sum("entries"),
                sum("held")
            );
        }
        Some(kind) => println!("transport    /dev/fuse ({})", t["why"].as_str().unwrap_or(kind)),
        None => {}
    }
    match v["metrics_addr"].as_str() {
        Some(a) => println!("metrics      http://{a}/metrics"),
        None => println!("metrics      {}/.leasefs/metrics", v["mount_point"].as_str().unwrap_or("?")),
    }
    ExitCode::SUCCESS
}

/// A byte count in the largest unit that keeps it at least 1 (`512 B`,
/// `4.0 KiB`, `1.5 MiB`).
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

pub(crate) fn leases(args: &LeasesArgs) -> ExitCode {
    let lines = match lease_lines(args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("leasefs: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.show.json {
        lines.iter().for_each(|l| println!("{l}"));
        return ExitCode::SUCCESS;
    }
    let mut rows = vec![leases_header(args.wide)];
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        rows.push(lease_row(&v, args.wide));
    }
    print!("{}", table(&rows));
    ExitCode::SUCCESS
}

/// The lines of `.leasefs/leases`, read as a stream: under `prefix` (the
/// daemon filters), at most `limit` of them (reading stops there).
pub(crate) fn lease_lines(args: &LeasesArgs) -> Result<Vec<String>, String> {
    use std::io::{BufRead, Write};
    let p = control_file(&args.show.mountpoint, "leases")?;
    let err = |e: std::io::Error| format!("{}: {e}", p.display());
    let mut f = std::fs::OpenOptions::new().read(true).write(args.prefix.is_some()).open(&p).map_err(err)?;
    if let Some(prefix) = &args.prefix {
        let prefix = format!("/{}", prefix.trim_start_matches('/'));
        f.write_all(prefix.as_bytes()).map_err(err)?;
    }
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        if args.limit.is_some_and(|n| lines.len() >= n) {
            break;
        }
        lines.push(line.map_err(err)?);
    }
    Ok(lines)
}

pub(crate) fn leases_header(wide: bool) -> Vec<String> {
    let mut h = vec!["PATH", "HOLDER", "MODE", "API", "EPOCH", "HELD", "WAITERS", "EXPIRES"];
    if wide {
        h.extend(["INODE", "VERSION", "TTL"]);
    }
    h.into_iter().map(String::from).collect()
}

/// One lease as table cells (`-` for an empty one).
pub(crate) fn lease_row(v: &serde_json::Value, wide: bool) -> Vec<String> {
    let holders = v["holders"].as_array().cloned().unwrap_or_default();
    let or_dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
    let num = |n: &serde_json::Value| if n.is_null() { "-".to_string() } else { n.to_string() };
    let who: Vec<String> = holders
        .iter()
        .map(|h| {
            let who = match h["comm"].as_str() {
                Some(c) => format!("{}/{c}", h["pid"]),
                None => h["pid"].to_string(),
            };
            // A holder on another host of an etcd namespace.
            match h["host"].as_str() {
                Some(host) => format!("{who}@{host}"),
                None => who,
            }
        })
        .collect();
    let first = holders.first();
    let field = |k: &str| first.and_then(|h| h[k].as_str()).unwrap_or("").to_string();
    let held = holders.iter().filter_map(|h| h["since_ms_ago"].as_u64()).max();
    let mut row = vec![
        or_dash(v["path"].as_str().unwrap_or("").to_string()),
        or_dash(who.join(",")),
        or_dash(field("mode")),
        or_dash(field("kind")),
        num(&v["epoch"]),
        held.map_or("-".to_string(), age),
        num(&v["waiters"]),
        v["expires_in_ms"].as_i64().map_or("-".to_string(), |ms| format!("in {}", age(ms.max(0) as u64))),
    ];
    if wide {
        row.push(num(&v["inode"]));
        row.push(num(&v["version"]));
        row.push(v["ttl_ms"].as_u64().map_or("-".to_string(), age));
    }
    row
}

/// A duration for people: `850ms`, `4.2s`, `3m05s`, `2h10m`, `3d4h`.
pub(crate) fn age(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{}h", s / 86_400, s / 3600 % 24),
    }
}

/// Left-aligned columns separated by two spaces.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = width[i])).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

pub(crate) fn break_lease(args: &BreakArgs) -> ExitCode {
    let p = match control_file(&args.mountpoint, "break") {
        Ok(p) => p,
        Err(e) => {
            eprintln!("leasefs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(path) = &args.path else {
        return match std::fs::write(&p, leasefs::fs::BREAK_ALL) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("leasefs: break --all: {e}");
                ExitCode::FAILURE
            }
        };
    };
    let mount = session::absolute(&args.mountpoint).unwrap_or_else(|_| args.mountpoint.clone());
    let rel = path.strip_prefix(&mount).unwrap_or(path);
    match std::fs::write(&p, rel.as_os_str().as_encoded_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasefs: break {}: {e}", rel.display());
            ExitCode::FAILURE
        }
    }
}
