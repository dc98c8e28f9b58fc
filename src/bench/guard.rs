//! A mount for a test (SPEC 13, "for test frameworks"): [`TestMount`]
//! mounts a volatile leasefs with `--bench` in a temporary directory, adds
//! fault rules, reads the fault events, and always unmounts when dropped,
//! also when the test panics.
//!
//! ```no_run
//! use leasefs::bench::{RuleSpec, TestMount};
//!
//! let m = TestMount::new().expect("mount");
//! std::fs::create_dir(m.path().join("wal")).unwrap();
//! m.add(RuleSpec::on(&["write"]).path("wal/*").errno("ENOSPC").after(2).count(1)).unwrap();
//! // ... run the program under test against m.path() ...
//! let faults = m.fault_events();
//! assert_eq!(faults.len(), 1);
//! assert_eq!(faults[0]["errno"], "ENOSPC");
//! ```
//!
//! The daemon is the `leasefs` binary: `$LEASEFS_BIN`, else the one next
//! to the test's target directory (`target/debug/leasefs`), else the first
//! on `PATH`. Root mounts directly; other users mount through
//! `fusermount3` (as `leasefs mount` does).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::rules::RuleSpec;

/// How long the daemon may take to report the mount live, and to exit.
const READY: Duration = Duration::from_secs(30);

/// A volatile leasefs mounted for one test; unmounted on drop.
pub struct TestMount {
    dir: PathBuf,
    path: PathBuf,
    daemon: Option<Child>,
    /// `.leasefs/events`, opened as the mount went live (non-blocking).
    events: Option<std::fs::File>,
    seen: Mutex<(Vec<serde_json::Value>, Vec<u8>)>,
}

impl std::fmt::Debug for TestMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestMount").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Why a command written to `.leasefs/faults` was not carried out.
#[derive(Debug)]
pub enum Refused {
    /// The daemon's one-line reason (the write failed `EINVAL` or `ENOENT`).
    Reason(String),
    /// The file could not be opened or written (`EPERM` for a caller who
    /// may not set faults).
    Io(std::io::Error),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Reason(why) => f.write_str(why),
            Refused::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Write one command (a rule, `{"del":ID}`, ...) to the control file
/// `faults` and read the daemon's answer back from the same descriptor.
pub fn send(faults: &Path, line: &str) -> Result<serde_json::Value, Refused> {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(faults).map_err(Refused::Io)?;
    let written = f.write_at(format!("{line}\n").as_bytes(), 0);
    // The whole answer (a power cut's report can be long).
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = f.read_at(&mut chunk, buf.len() as u64) {
        buf.extend_from_slice(&chunk[..n]);
    }
    let answer: serde_json::Value =
        String::from_utf8_lossy(&buf).lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_default();
    if let Some(why) = answer.get("error").and_then(|e| e.as_str()) {
        return Err(Refused::Reason(why.to_string()));
    }
    written.map_err(Refused::Io)?;
    Ok(answer)
}

/// The `leasefs` binary a test mount runs.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os("LEASEFS_BIN") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        // target/debug/deps/test-abc -> target/debug/leasefs
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("leasefs");
            if p.is_file() {
                return p;
            }
        }
    }
    PathBuf::from("leasefs")
}

fn temp_dir() -> std::io::Result<PathBuf> {
    let template = std::env::temp_dir().join("leasefs-test.XXXXXX");
    let mut bytes = template.into_os_string().into_encoded_bytes();
    bytes.push(0);
    // SAFETY: `bytes` is a NUL-terminated template mkdtemp may rewrite in place.
    if unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) }.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    bytes.pop();
    // SAFETY: the bytes came from an OsString and mkdtemp wrote ASCII into them.
    Ok(PathBuf::from(unsafe { std::ffi::OsString::from_encoded_bytes_unchecked(bytes) }))
}

impl TestMount {
    /// Mount with the defaults: `--volatile --bench`.
    pub fn new() -> std::io::Result<TestMount> {
        TestMount::with_args(&[])
    }

    /// Mount with more `leasefs mount` options (`--lease-ttl 1s`, `--transport dev`...).
    pub fn with_args(args: &[&str]) -> std::io::Result<TestMount> {
        let dir = temp_dir()?;
        let path = dir.join("mnt");
        std::fs::create_dir(&path)?;
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds is a valid array for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both ends were just created and are owned here.
        let (mut rd, wr) = unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
        let w = wr.as_raw_fd();
        let mut cmd = Command::new(binary());
        cmd.arg("mount")
            .arg(&path)
            .args(["--foreground", "--volatile", "--bench", "--state-dir"])
            .arg(dir.join("state"))
            .args(args)
            .env("LEASEFS_READY_FD", w.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only fcntl (async-signal-safe) between fork and exec: the
        // daemon inherits the write end.
        unsafe {
            cmd.pre_exec(move || {
                libc::fcntl(w, libc::F_SETFD, 0);
                Ok(())
            });
        }
        let spawned = cmd.spawn();
        drop(wr);
        let mut m = TestMount { dir, path, daemon: None, events: None, seen: Mutex::new((Vec::new(), Vec::new())) };
        m.daemon = Some(spawned.map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", binary().display())))?);
        // The daemon writes READY, or ERR and why, then closes the pipe.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut msg = String::new();
            let _ = rd.read_to_string(&mut msg);
            let _ = tx.send(msg);
        });
        let msg = rx.recv_timeout(READY).unwrap_or_default();
        if !msg.starts_with("READY") {
            return Err(std::io::Error::other(format!("leasefs did not mount: {}", msg.trim())));
        }
        m.events = Some(
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(m.path.join(".leasefs/events"))?,
        );
        Ok(m)
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.daemon.as_ref().map_or(0, Child::id)
    }

    /// Write one command to `.leasefs/faults`; the daemon's answer.
    fn command(&self, line: &str) -> Result<serde_json::Value, String> {
        send(&self.path.join(".leasefs/faults"), line).map_err(|e| e.to_string())
    }

    /// Put a rule in force for the next request; its id, or why it was refused.
    pub fn add(&self, rule: RuleSpec) -> Result<u64, String> {
        let line = serde_json::to_string(&rule).map_err(|e| e.to_string())?;
        self.command(&line)?["id"].as_u64().ok_or_else(|| "no id in the answer".to_string())
    }

    /// Remove a rule (requests it holds go on).
    pub fn remove(&self, id: u64) -> Result<(), String> {
        self.command(&format!("{{\"del\":{id}}}")).map(|_| ())
    }

    /// Cut the power (SPEC 13): the mount keeps only what was synced,
    /// descriptors opened before answer `EIO`, leases are broken; `kill`
    /// SIGKILLs the processes that opened them (this one too, if it did).
    /// Returns the report: `files` (`path`, `size` before and after, `lost`
    /// byte ranges, `attrs`), `names` (`dir`, `name`, the inode `before`
    /// and `after`), `gone`, `descriptors`, `killed`.
    pub fn crash(&self, kill: bool) -> Result<serde_json::Value, String> {
        Ok(self.command(&serde_json::json!({ "crash": { "kill": kill } }).to_string())?["crash"].take())
    }

    /// Remove every rule.
    pub fn clear(&self) -> Result<(), String> {
        self.command("{\"clear\":true}").map(|_| ())
    }

    /// Let requests hung by rule `id` (every rule: `None`) go on; how many.
    pub fn release(&self, id: Option<u64>) -> Result<u64, String> {
        let what = id.map_or("\"all\"".to_string(), |i| i.to_string());
        Ok(self.command(&format!("{{\"release\":{what}}}"))?["released"].as_u64().unwrap_or(0))
    }

    /// The rules in force, with their counts of matches and firings.
    pub fn rules(&self) -> Vec<RuleSpec> {
        std::fs::read_to_string(self.path.join(".leasefs/faults"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Every event since the mount went live (JSON objects as in
    /// `.leasefs/events`), in order.
    pub fn events(&self) -> Vec<serde_json::Value> {
        let mut seen = self.seen.lock();
        if let Some(f) = &self.events {
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = (&*f).read(&mut buf) {
                seen.1.extend_from_slice(&buf[..n]);
            }
            while let Some(i) = seen.1.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = seen.1.drain(..=i).collect();
                if let Ok(v) = serde_json::from_slice(&line) {
                    seen.0.push(v);
                }
            }
        }
        seen.0.clone()
    }

    /// The `fault` events since the mount went live.
    pub fn fault_events(&self) -> Vec<serde_json::Value> {
        self.events().into_iter().filter(|e| e["event"] == "fault").collect()
    }

    /// Unmount and wait for the daemon (also what dropping does).
    pub fn unmount(&mut self) {
        self.events = None;
        let Some(mut daemon) = self.daemon.take() else { return };
        if crate::fuse::session::unmount(&self.path, false).is_err() {
            let _ = crate::fuse::session::unmount(&self.path, true);
        }
        let deadline = Instant::now() + READY;
        while matches!(daemon.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if matches!(daemon.try_wait(), Ok(None)) {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        self.unmount();
    }
}
