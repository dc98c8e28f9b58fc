//! Mounting without root: `fusermount3` (setuid root, from libfuse's
//! `fuse3` package) opens `/dev/fuse`, mounts it on a directory the user
//! may write to, and hands the open device back over a socket
//! (`_FUSE_COMMFD`, one descriptor in an `SCM_RIGHTS` message). From then
//! on the daemon serves that descriptor exactly as one it opened itself, so
//! the raw-request hook (interrupts, lock flags) works the same. Unmounting
//! is `fusermount3 -u`.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};

/// The helper's name (found on `PATH`).
pub const FUSERMOUNT: &str = "fusermount3";

/// Why a mount failed, worded for a one-line message.
#[derive(Debug)]
pub struct MountError(pub String);

impl std::fmt::Display for MountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MountError {}

/// Mount `path` through `fusermount3` with the kernel mount options
/// `options` (`fsname=`, `subtype=`, `allow_other`, ...); the device.
pub fn mount(path: &Path, options: &str) -> Result<OwnedFd, MountError> {
    let show = path.display();
    let mut sv = [0; 2];
    // SAFETY: sv is a valid array for socketpair to fill.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, sv.as_mut_ptr()) } != 0 {
        return Err(MountError(format!("{show}: socketpair: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: both fds were just created and are owned here.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg("-o").arg(options).arg("--").arg(path);
    cmd.env("_FUSE_COMMFD", theirs_fd.to_string()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: only fcntl (async-signal-safe) between fork and exec: the
    // helper inherits its end of the socket.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            libc::fcntl(theirs_fd, libc::F_SETFD, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        MountError(if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "{show}: not root, and no {FUSERMOUNT} to mount as a user (install the fuse3 package, or run as root)"
            )
        } else {
            format!("{show}: starting {FUSERMOUNT}: {e}")
        })
    })?;
    drop(theirs);
    let received = receive_fd(&ours);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = child.wait().map_err(|e| MountError(format!("{show}: {FUSERMOUNT}: {e}")))?;
    match received {
        Some(fd) if status.success() => Ok(fd),
        _ => {
            let why = err.lines().last().unwrap_or("").trim();
            let why = why.strip_prefix(&format!("{FUSERMOUNT}: ")).unwrap_or(why);
            Err(MountError(format!(
                "{show}: {FUSERMOUNT} could not mount: {}",
                if why.is_empty() { "no reason given" } else { why }
            )))
        }
    }
}

/// The one descriptor `fusermount3` sends (none if it sent nothing).
fn receive_fd(sock: &OwnedFd) -> Option<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    // Room for one int in a control message, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: zeroed msghdr is valid; the pointers set below outlive recvmsg.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    loop {
        // SAFETY: msg describes valid buffers.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            return None;
        }
        break;
    }
    // SAFETY: CMSG_FIRSTHDR/CMSG_DATA walk the control buffer recvmsg filled.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS {
            return None;
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
        Some(OwnedFd::from_raw_fd(fd))
    }
}

/// Unmount a mount made by `fusermount3` (`lazy`: detach it even if busy).
pub fn unmount(path: &Path, lazy: bool) -> std::io::Result<()> {
    let mut cmd = Command::new(FUSERMOUNT);
    cmd.arg(if lazy { "-uz" } else { "-u" }).arg("--").arg(path).stdin(Stdio::null()).stdout(Stdio::null());
    let out = cmd.stderr(Stdio::piped()).output()?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(if err.contains("busy") {
        std::io::Error::from_raw_os_error(libc::EBUSY)
    } else {
        std::io::Error::other(format!("{FUSERMOUNT} -u: {}", err.trim()))
    })
}
