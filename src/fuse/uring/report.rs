//! What `status` and `/metrics` say about the transport in use, and the
//! daemon's report of itself that the filesystem core shows.

use super::*;

/// What `status` and `/metrics` say about the transport in use.
#[derive(Default)]
pub struct TransportReport {
    /// The transport asked for.
    pub(super) wanted: Mutex<Transport>,
    /// io_uring was accepted at INIT.
    pub(super) offered: AtomicBool,
    pub(super) uring: AtomicBool,
    /// The running queues, for [`TransportReport::settle`].
    pub(super) running: OnceLock<Arc<Queues>>,
    /// Why `/dev/fuse` serves everything, when it does.
    pub(super) why: Mutex<String>,
    pub(super) queues: Mutex<Vec<Arc<QueueStats>>>,
}

/// One queue's counters.
#[derive(Default)]
pub struct QueueStats {
    /// Requests served through this queue.
    pub served: AtomicU64,
    /// Entries registered with the kernel.
    pub entries: AtomicU32,
    /// Entries holding a request not yet answered (parked waits included).
    pub held: AtomicU32,
    /// The most ever held at once.
    pub peak: AtomicU32,
    /// Lock conflicts found on this queue, decided again after the
    /// queues served what they held ([`Queues::settle`]).
    pub fenced: AtomicU64,
    /// Rounds whose answers were committed as an idle-policy thread, for
    /// clients that may run on another CPU (see `client_may_move`).
    pub woken_here: AtomicU64,
}

impl std::fmt::Debug for TransportReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransportReport").field("uring", &self.is_uring()).finish_non_exhaustive()
    }
}

impl TransportReport {
    /// `status`'s `transport` object.
    pub fn status(&self) -> serde_json::Value {
        let queues = self.queues.lock();
        let uring = self.uring.load(Ordering::Relaxed);
        serde_json::json!({
            "kind": if uring { "uring" } else { "dev" },
            "why": if uring { None } else { Some(self.why.lock().clone()).filter(|w| !w.is_empty()) },
            "queues": queues.iter().enumerate().map(|(q, s)| serde_json::json!({
                "queue": q,
                "served": s.served.load(Ordering::Relaxed),
                "entries": s.entries.load(Ordering::Relaxed),
                "held": s.held.load(Ordering::Relaxed),
                "peak": s.peak.load(Ordering::Relaxed),
                "fenced": s.fenced.load(Ordering::Relaxed),
                "woken_here": s.woken_here.load(Ordering::Relaxed),
            })).collect::<Vec<_>>(),
        })
    }

    /// Whether io_uring serves the mount.
    pub fn is_uring(&self) -> bool {
        self.uring.load(Ordering::Relaxed)
    }

    /// The transport's lines of `/metrics` (Prometheus text format) for
    /// the mount labelled `mount`.
    pub fn metrics(&self, mount: &str) -> String {
        let m = format!("mount=\"{}\"", mount.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"));
        let kind = if self.is_uring() { "uring" } else { "dev" };
        let mut out = format!(
            "# HELP leasefs_transport The transport serving the mount.\n# TYPE leasefs_transport gauge\n\
             leasefs_transport{{kind=\"{kind}\",{m}}} 1\n"
        );
        let queues = self.queues.lock();
        if queues.is_empty() {
            return out;
        }
        let mut family = |name: &str, kind: &str, help: &str, get: &dyn Fn(&QueueStats) -> u64| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (q, s) in queues.iter().enumerate() {
                out.push_str(&format!("{name}{{queue=\"{q}\",{m}}} {}\n", get(s)));
            }
        };
        family("leasefs_uring_requests_total", "counter", "Requests served through each io_uring queue.", &|s| {
            s.served.load(Ordering::Relaxed)
        });
        family("leasefs_uring_entries", "gauge", "Ring entries registered on each queue.", &|s| {
            u64::from(s.entries.load(Ordering::Relaxed))
        });
        family("leasefs_uring_held", "gauge", "Ring entries holding a request not yet answered.", &|s| {
            u64::from(s.held.load(Ordering::Relaxed))
        });
        out
    }

    /// The transport the mount asks for; set before the mount.
    pub fn set_wanted(&self, wanted: Transport) {
        *self.wanted.lock() = wanted;
    }

    /// At INIT: whether to accept the kernel's offer of io_uring (`offered`)
    /// for the transport asked for. Not for `dev`, and not when this
    /// process cannot make a ring (`io_uring_disabled`, seccomp): the
    /// reason is kept for [`TransportReport::why_not`].
    pub fn accept(&self, offered: bool) -> bool {
        let why = if *self.wanted.lock() == Transport::Dev {
            Some("--transport dev".to_string())
        } else if !offered {
            Some(if kernel_allows() {
                "the kernel did not offer FUSE-over-io_uring at INIT".to_string()
            } else {
                "FUSE-over-io_uring is off (/sys/module/fuse/parameters/enable_uring is not Y, or the kernel lacks it)"
                    .to_string()
            })
        } else {
            Ring::new(2).err().map(|e| format!("io_uring_setup: {e}"))
        };
        let accepted = why.is_none();
        self.offered.store(accepted, Ordering::Relaxed);
        *self.why.lock() = why.unwrap_or_default();
        accepted
    }

    /// Whether io_uring was accepted at INIT (the queues must then start).
    pub fn accepted(&self) -> bool {
        self.offered.load(Ordering::Relaxed)
    }

    /// Why io_uring was not accepted at INIT.
    pub fn why_not(&self) -> String {
        self.why.lock().clone()
    }

    /// The queues that serve the mount.
    pub fn set_queues(&self, queues: Arc<Queues>) {
        let _ = self.running.set(queues);
    }

    /// Count a lock conflict found by the calling queue thread, to be
    /// decided again after [`TransportReport::settle`].
    pub fn note_conflict(&self) {
        if let (Some(q), Some(all)) = (QUEUE.with(|q| q.get()), self.running.get().and_then(|r| r.all.get())) {
            if let Some(s) = all.get(q as usize) {
                s.stats.fenced.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// [`Queues::settle`] when io_uring serves the mount; false otherwise
    /// (one `/dev/fuse` reader delivers requests in the kernel's order).
    pub fn settle(&self) -> bool {
        self.running.get().is_some_and(|q| q.settle())
    }

    /// Record that `/dev/fuse` serves everything, and why.
    pub fn set_dev(&self, why: &str) {
        self.uring.store(false, Ordering::Relaxed);
        *self.why.lock() = why.to_string();
    }
}
