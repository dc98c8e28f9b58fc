//! Named points where debug builds misbehave on request, for tests that
//! must hit a window otherwise too short (or a failure otherwise too rare)
//! to reach: crash here (`LEASEFS_FAILPOINT=NAME`), fail this I/O with
//! `EIO` or another errno (the same variable), or stall here
//! (`LEASEFS_PAUSE=NAME:MILLISECONDS`, with `LEASEFS_PAUSE_MARK` a file
//! written when the stall begins). Release builds compile them out.

/// Crash here when the named failpoint is armed (`LEASEFS_FAILPOINT`), to
/// test recovery from every step of a flush or compaction. Compiled out of
/// release builds.
pub fn failpoint(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("LEASEFS_FAILPOINT").is_ok_and(|v| v == name) {
        tracing::warn!(failpoint = name, "failpoint: killing the daemon");
        // SAFETY: sending SIGKILL to ourselves, as `kill -9` would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// Stall here for a while when `LEASEFS_PAUSE=NAME:MILLISECONDS` names this
/// point (debug builds only; several points comma-separated): tests widen a
/// window (appends landing while a snapshot is written) that is otherwise
/// too short to hit.
pub fn pausepoint(name: &str) {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("LEASEFS_PAUSE").ok().and_then(|v| {
        v.split(',').find_map(|p| p.strip_prefix(name).and_then(|r| r.strip_prefix(':')).and_then(|ms| ms.parse().ok()))
    }) {
        // A test waits for this file to know the pause began.
        if let Some(mark) = std::env::var_os("LEASEFS_PAUSE_MARK") {
            let _ = std::fs::write(mark, name);
        }
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// An injected I/O error for a named failpoint (debug builds only).
pub fn injected(name: &str) -> std::io::Result<()> {
    injected_errno(name, libc::EIO)
}

/// An injected failure with `errno` for a named failpoint (debug builds
/// only): the refusals of a file system the tests cannot mount here.
pub fn injected_errno(name: &str, errno: i32) -> std::io::Result<()> {
    #[cfg(debug_assertions)]
    if std::env::var("LEASEFS_FAILPOINT").is_ok_and(|v| v == name) {
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    let _ = (name, errno);
    Ok(())
}
