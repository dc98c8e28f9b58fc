//! What the daemon serving a mount reports of itself (the transport from
//! the kernel, the pool running handlers of a shared mount), handed to the
//! filesystem core as numbers to show in `status` and `/metrics`.

use std::sync::Arc;

use super::uring::TransportReport;
use super::workers::Workers;

/// Threads running the request handlers of a shared mount (requests that
/// wait for etcd hold one each; a blocked lock wait holds none).
pub const HANDLER_THREADS: usize = 16;

/// Requests of a shared mount queued or running at most; past it a request
/// is answered `EAGAIN`.
pub const HANDLERS_HELD: usize = 4096;

/// The pool running the request handlers of a shared mount, so that a
/// request waiting for etcd holds up no other.
pub fn handler_pool() -> std::io::Result<Workers> {
    Workers::start(HANDLER_THREADS, HANDLERS_HELD)
}

/// The transport and handler pool of a mount, as the core shows them.
#[derive(Debug)]
pub struct ServingReport {
    pub transport: Arc<TransportReport>,
    pub handlers: Option<Workers>,
}

impl crate::fs::Serving for ServingReport {
    fn status(&self, status: &mut serde_json::Value) {
        status["transport"] = self.transport.status();
        if let Some(w) = &self.handlers {
            let s = w.stats(HANDLER_THREADS);
            status["handlers"] = serde_json::json!({
                "threads": s.threads, "bound": s.bound, "held": s.held, "peak": s.peak, "refused": s.refused,
            });
        }
    }

    fn metrics(&self, mount: &str) -> String {
        self.transport.metrics(mount)
    }
}
