//! `leasefs watch`: follow `.leasefs/events`, as human lines or JSON lines.

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// End a blocked read with EINTR on SIGINT/SIGTERM (no SA_RESTART), so
/// Ctrl-C ends the watch cleanly.
fn catch_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
        // SAFETY: a zeroed sigaction with a plain handler that only stores an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// A mount-relative lease path (`/a/b`) for PATH given relative to the
/// mount or absolute inside it.
pub fn lease_path(mount: &Path, path: &Path) -> Result<String, String> {
    let rel = if path.is_absolute() {
        path.strip_prefix(mount).map_err(|_| format!("{}: not inside {}", path.display(), mount.display()))?
    } else {
        path
    };
    let mut out = String::new();
    for c in rel.components() {
        match c {
            std::path::Component::Normal(n) => {
                out.push('/');
                out.push_str(&String::from_utf8_lossy(n.as_bytes()));
            }
            std::path::Component::CurDir => {}
            _ => return Err(format!("{}: use a path inside the mount, without ..", path.display())),
        }
    }
    Ok(if out.is_empty() { "/".into() } else { out })
}

/// One event as a line a person reads.
pub fn human(v: &serde_json::Value) -> String {
    let ts = v["ts_ms"].as_u64().unwrap_or(0);
    let (s, ms) = (ts / 1000, ts % 1000);
    let clock = format!("{:02}:{:02}:{:02}.{ms:03}", s / 3600 % 24, s / 60 % 60, s % 60);
    let mut line = format!("{clock}  {:<10}  {}", v["event"].as_str().unwrap_or("?"), v["path"].as_str().unwrap_or(""));
    if v["event"] == "lost" {
        return format!("{clock}  lost        {} events (this reader fell behind)", v["count"]);
    }
    line += &format!("  epoch {}", v["epoch"]);
    if let Some(pid) = v["pid"].as_u64() {
        match v["comm"].as_str() {
            Some(c) => line += &format!("  {pid}/{c}"),
            None => line += &format!("  {pid}"),
        }
        // A holder on another host of an etcd namespace.
        if let Some(h) = v["host"].as_str() {
            line += &format!("@{h}");
        }
    }
    for k in ["mode", "owner", "reason"] {
        if let Some(x) = v[k].as_str() {
            line += &format!("  {x}");
        }
    }
    // A fault rule fired: which rule and match, on what, and what it did.
    if v["event"] == "fault" {
        line += &format!("  rule {} match {}  {}", v["rule"], v["match"], v["op"].as_str().unwrap_or("?"));
        line += &match v["action"].as_str().unwrap_or("?") {
            "errno" if v["delay_ms"].is_u64() => {
                format!("  errno {} after {}ms", v["errno"].as_str().unwrap_or("?"), v["delay_ms"])
            }
            "errno" => format!("  errno {}", v["errno"].as_str().unwrap_or("?")),
            "delay" => format!("  delay {}ms", v["delay_ms"]),
            "short" => format!("  short {}", v["bytes"]),
            other => format!("  {other}"),
        };
    }
    line
}

/// Follow the stream at `events` until a signal or the daemon goes.
pub fn watch(events: &Path, mount: &Path, paths: &[PathBuf], json: bool) -> ExitCode {
    let prefixes: Vec<String> = match paths.iter().map(|p| lease_path(mount, p)).collect() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("leasefs: {e}");
            return ExitCode::from(2);
        }
    };
    let mut f = match std::fs::OpenOptions::new().read(true).write(prefixes.len() == 1).open(events) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("leasefs: {}: {e}", events.display());
            return ExitCode::FAILURE;
        }
    };
    // One path: the daemon filters; several: this side does.
    if let [one] = prefixes.as_slice() {
        if let Err(e) = f.write_all(one.as_bytes()) {
            eprintln!("leasefs: {}: {e}", events.display());
            return ExitCode::FAILURE;
        }
    }
    catch_stop_signals();
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending = Vec::new();
    let out = std::io::stdout();
    loop {
        if STOP.load(Ordering::Relaxed) {
            return ExitCode::SUCCESS;
        }
        let n = match f.read(&mut buf) {
            Ok(0) => {
                eprintln!("leasefs: {}: the stream ended (daemon gone)", events.display());
                return ExitCode::FAILURE;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("leasefs: {}: {e}", events.display());
                return ExitCode::FAILURE;
            }
        };
        pending.extend_from_slice(&buf[..n]);
        let mut lock = out.lock();
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let v: serde_json::Value = serde_json::from_slice(&line).unwrap_or_default();
            let path = v["path"].as_str().unwrap_or("");
            let wanted = v["event"] == "lost"
                || prefixes.is_empty()
                || prefixes.iter().any(|p| p == "/" || path == p || path.starts_with(&format!("{p}/")));
            if !wanted {
                continue;
            }
            let written = if json { lock.write_all(&line) } else { writeln!(lock, "{}", human(&v)) };
            if written.and_then(|()| lock.flush()).is_err() {
                // The reader of our output went away (a closed pipe).
                return ExitCode::SUCCESS;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_taken_relative_to_the_mount_or_absolute_inside_it() {
        let m = Path::new("/run/leases");
        assert_eq!(lease_path(m, Path::new("jobs/a")).unwrap(), "/jobs/a");
        assert_eq!(lease_path(m, Path::new("/run/leases/jobs")).unwrap(), "/jobs");
        assert_eq!(lease_path(m, Path::new("/run/leases")).unwrap(), "/");
        assert!(lease_path(m, Path::new("/etc/x")).is_err());
        assert!(lease_path(m, Path::new("../x")).is_err());
    }

    #[test]
    fn events_read_as_one_line_each() {
        let v = serde_json::json!({"event":"grant","ts_ms":3_723_004u64,"path":"/a","epoch":3,"pid":7,"comm":"flock","mode":"exclusive","owner":"flock"});
        assert_eq!(human(&v), "01:02:03.004  grant       /a  epoch 3  7/flock  exclusive  flock");
        let mut remote = v.clone();
        remote["host"] = serde_json::json!("b:/run/leases");
        assert_eq!(human(&remote), "01:02:03.004  grant       /a  epoch 3  7/flock@b:/run/leases  exclusive  flock");
        let fault = serde_json::json!({"event":"fault","ts_ms":3_723_004u64,"path":"/wal/1","epoch":0,"pid":7,
            "comm":"app","rule":2,"match":3,"op":"write","action":"errno","errno":"ENOSPC"});
        assert_eq!(
            human(&fault),
            "01:02:03.004  fault       /wal/1  epoch 0  7/app  rule 2 match 3  write  errno ENOSPC"
        );
        let lost = serde_json::json!({"event":"lost","count":5,"ts_ms":0});
        assert!(human(&lost).contains("lost        5 events"));
    }
}
