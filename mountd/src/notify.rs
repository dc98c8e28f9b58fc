//! systemd's readiness protocol (`sd_notify`): one datagram per message to
//! the socket named by `NOTIFY_SOCKET` (a path, or `@name` for the abstract
//! namespace). Without the variable every call does nothing.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where to send notifications, if systemd (or anyone) asked for them.
#[derive(Debug)]
pub struct Notifier {
    sock: Option<(UnixDatagram, std::os::unix::net::SocketAddr)>,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` asks for (the variable is removed so
    /// that processes the daemon starts do not inherit it).
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET");
        std::env::remove_var("NOTIFY_SOCKET");
        let sock = target.and_then(|t| {
            let addr = address(t.as_encoded_bytes())?;
            Some((UnixDatagram::unbound().ok()?, addr))
        });
        Notifier { sock }
    }

    /// Send `state` (newline-separated `KEY=VALUE` lines); failures are
    /// ignored, as `sd_notify` callers do.
    pub fn send(&self, state: &str) {
        if let Some((sock, addr)) = &self.sock {
            if let Err(e) = sock.send_to_addr(state.as_bytes(), addr) {
                tracing::debug!("sd_notify: {e}");
            }
        }
    }
}

/// While alive, keeps telling the service manager that start-up goes on.
#[derive(Debug)]
pub struct KeepStarting {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for KeepStarting {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How often a long start-up asks for more time, and how much.
const EXTEND_EVERY: Duration = Duration::from_secs(10);
const EXTEND_BY: Duration = Duration::from_secs(30);

impl Notifier {
    /// Report `what` as the status and, until the guard is dropped, extend
    /// the start-up timeout (`EXTEND_TIMEOUT_USEC`) every few seconds, so a
    /// long recovery is not killed as a hung start.
    pub fn keep_starting(&self, what: &str) -> KeepStarting {
        let Some((sock, addr)) = &self.sock else {
            return KeepStarting { stop: None, thread: None };
        };
        let (Ok(sock), addr) = (sock.try_clone(), addr.clone()) else {
            return KeepStarting { stop: None, thread: None };
        };
        let msg = format!("STATUS={what}\nEXTEND_TIMEOUT_USEC={}", EXTEND_BY.as_micros());
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sd-notify".into())
            .spawn(move || loop {
                let _ = sock.send_to_addr(msg.as_bytes(), &addr);
                if rx.recv_timeout(EXTEND_EVERY) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                    return;
                }
            })
            .ok();
        KeepStarting { stop: Some(tx), thread }
    }
}

/// A socket address from `NOTIFY_SOCKET`: `@name` is abstract.
fn address(t: &[u8]) -> Option<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    match t.split_first() {
        Some((b'@', name)) => std::os::unix::net::SocketAddr::from_abstract_name(name).ok(),
        Some((b'/', _)) => {
            std::os::unix::net::SocketAddr::from_pathname(std::path::Path::new(std::ffi::OsStr::from_bytes(t))).ok()
        }
        _ => None,
    }
}

use std::os::unix::ffi::OsStrExt;
