//! `unmount`: unmount a lease directory and wait for its daemon to exit.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use leasefs::fuse::session::{self};

use crate::cli::*;

pub(crate) fn unmount(args: &UnmountArgs) -> ExitCode {
    let path = match session::absolute(&args.mountpoint) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("leasefs: {}: {e}", args.mountpoint.display());
            return ExitCode::FAILURE;
        }
    };
    let show = path.display();
    if session::find_mount(&path).is_none() {
        eprintln!("leasefs: {show}: not a leasefs mount");
        return ExitCode::FAILURE;
    }
    let pid = session::daemon_pid(&path);
    if let Err(e) = std::fs::metadata(&path) {
        if session::daemon_gone(&e) {
            eprintln!(
                "leasefs: {show}: the daemon is gone (Transport endpoint is not connected); removing the stale mount"
            );
            return match session::unmount(&path, true) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("leasefs: {show}: cannot remove the stale mount: {e}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    if let Err(e) = session::unmount(&path, false) {
        if e.raw_os_error() == Some(libc::EBUSY) {
            eprintln!("leasefs: {show}: busy (processes still use it); close them or detach with `umount -l {show}`");
        } else {
            eprintln!("leasefs: {show}: unmount failed: {e}");
        }
        return ExitCode::FAILURE;
    }
    let Some(pid) = pid else {
        return ExitCode::SUCCESS;
    };
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    while leasefs::procfs::exists(pid as u32) && !is_zombie(pid) {
        if Instant::now() > deadline {
            eprintln!("leasefs: {show}: unmounted, but daemon {pid} has not exited after {}s", args.timeout);
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    ExitCode::SUCCESS
}

/// True when the process has exited but is not reaped yet: a zombie leader
/// whose other threads are gone too (until then they hold its descriptors,
/// such as the state-directory lock).
pub(crate) fn is_zombie(pid: i32) -> bool {
    let pid = pid as u32;
    let zombie = leasefs::procfs::state(pid).is_none_or(|s| s == 'Z');
    zombie && leasefs::procfs::threads(pid) <= 1
}
