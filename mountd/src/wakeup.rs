//! What wakes the main loop of `leasefs lock` and `leasefs top`: signals,
//! delivered through a pipe (the self-pipe trick), and readable
//! descriptors.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // SIGCHLD and SIGALRM only wake the loop; others are asked for.
    if sig != libc::SIGCHLD && sig != libc::SIGALRM {
        LAST_SIGNAL.store(sig, Ordering::Relaxed);
    }
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; a full pipe loses nothing
        // that matters (one byte already wakes the loop).
        unsafe { libc::write(fd, [sig as u8].as_ptr().cast(), 1) };
    }
}

/// Catch `signals`: each makes the returned descriptor readable, and ends
/// a blocking call with `EINTR` (no `SA_RESTART`).
pub fn catch(signals: &[libc::c_int]) -> std::io::Result<RawFd> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array for pipe2.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    SIGNAL_PIPE.store(fds[1], Ordering::Relaxed);
    for &sig in signals {
        // SAFETY: a handler that only writes to a pipe and stores an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
    Ok(fds[0])
}

/// The last signal caught other than SIGCHLD and SIGALRM (0: none).
pub fn last_signal() -> libc::c_int {
    LAST_SIGNAL.load(Ordering::Relaxed)
}

/// [`last_signal`], cleared.
pub fn take_signal() -> libc::c_int {
    LAST_SIGNAL.swap(0, Ordering::Relaxed)
}

/// Empty the signal pipe `fd`.
pub fn drain(fd: RawFd) {
    let mut buf = [0u8; 64];
    // SAFETY: reading into a local buffer from our non-blocking pipe.
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

/// Which of `fds` can be read (or hung up) within `timeout` (None: wait
/// for ever).
pub fn readable(fds: &[RawFd], timeout: Option<Duration>) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: p is a valid array of pollfd.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter().map(|x| x.revents != 0).collect()
}
