//! How the daemon sets the filesystem up, once ([`Setup`], [`Fs::start`]),
//! and reads its settings back: bounds, where it is mounted, where metrics
//! are served, whether the kernel or the daemon caches names and checks
//! permissions.

use super::*;

/// Where the namespace lives.
#[allow(clippy::large_enum_variant)] // one per mount, moved once
pub enum Keep {
    /// In memory only: deliberately (`--volatile`: any earlier durable
    /// namespace was discarded), or a filesystem for tests.
    Memory { volatile: bool },
    /// In the state directory: its store and what it recovered.
    Durable(crate::store::snapshot::Store, crate::store::snapshot::Recovered),
    /// Shared with other hosts: the arbitration of their leases and the
    /// store their namespace is kept in (etcd).
    Shared(Box<dyn Arbitration>, Box<dyn crate::namespace::replica::Replica>),
}

/// Everything a filesystem starts with, built once by the daemon from its
/// command line and state directory. Nothing is set on the filesystem
/// afterwards, so there is no order of calls to remember: [`Fs::start`]
/// applies it in the one order that is right (the epoch journal before
/// restored files, which resume above its ceiling; the lease arbitration
/// before the namespace shared with it).
pub struct Setup {
    /// Who owns the root of a new namespace.
    pub uid: u32,
    pub gid: u32,
    /// The mount's lease TTL (a file may set its own).
    pub lease_ttl: Option<u64>,
    pub limits: limits::Limits,
    pub lock_limits: crate::lease::machine::LockLimits,
    /// The epoch journal and the ceiling it recovered (none: epochs are
    /// not kept, for tests).
    pub journal: Option<(crate::store::epochs::EpochJournal, u64)>,
    pub keep: Keep,
    /// Where it is mounted and its source, for `.leasefs/status`.
    pub mount_point: PathBuf,
    pub source: String,
    /// Other users may use the mount.
    pub allow_other: bool,
    /// Where `/metrics` is served over HTTP, if it is.
    pub metrics_addr: Option<String>,
    /// Serve as a test bench (`--bench`): every `fsync` reaches the daemon.
    pub bench: bool,
}

/// What the daemon serving a mount reports of itself: the transport from
/// the kernel and the pool running handlers, as the FUSE adapter knows
/// them. The core only shows it (`status`, `/metrics`).
pub trait Serving: Send + Sync + std::fmt::Debug {
    /// Its part of `status` (`transport`, and `handlers` where a pool runs
    /// them).
    fn status(&self, status: &mut serde_json::Value);
    /// Its metric lines for the mount point `mount`.
    fn metrics(&self, mount: &str) -> String;
}

impl Fs {
    /// The filesystem `setup` describes. A shared namespace is read from
    /// its store first (the error when it cannot be).
    pub fn start(setup: Setup) -> Result<Fs> {
        let Setup {
            uid,
            gid,
            lease_ttl,
            limits,
            lock_limits,
            journal,
            keep,
            mount_point,
            source,
            allow_other,
            metrics_addr,
            bench,
        } = setup;
        let mut fs = Fs::new(uid, gid);
        fs.bench = crate::bench::Bench::new(bench);
        let table = LocalAuthority::new(lease_ttl);
        // The namespace's own part of `keep`, once the leases have theirs.
        #[allow(clippy::large_enum_variant)]
        enum Kept {
            Memory(bool),
            Durable(crate::store::snapshot::Store, crate::store::snapshot::Recovered),
            Shared(Box<dyn crate::namespace::replica::Replica>),
        }
        let (lease, namespace) = match keep {
            Keep::Memory { volatile } => (LeaseAuthority::single_host(table), Kept::Memory(volatile)),
            Keep::Durable(store, rec) => (LeaseAuthority::single_host(table), Kept::Durable(store, rec)),
            Keep::Shared(arbitration, replica) => (LeaseAuthority::shared(table, arbitration), Kept::Shared(replica)),
        };
        {
            let mut st = fs.state.lock();
            st.set_authority(lease);
            st.bounds.limits = limits;
            st.lease.table_mut().set_lock_limits(lock_limits);
            if let Some((journal, ceiling)) = journal {
                st.lease.table_mut().floors().set_journal(journal, ceiling);
            }
            st.mount = MountInfo { point: mount_point, source, allow_other, metrics_addr, ..MountInfo::default() };
        }
        match namespace {
            Kept::Memory(volatile) => fs.state.lock().durable.volatile = volatile,
            Kept::Durable(store, recovered) => fs.restore(store, recovered),
            Kept::Shared(replica) => fs.share(replica)?,
        }
        if bench && !fs.is_shared() {
            // What a power cut would leave: tracked from here (SPEC 13).
            fs.state.lock().ns.power_on();
        }
        Ok(fs)
    }

    /// What the daemon serving the mount shows of itself from now on.
    pub fn show_serving(&self, serving: Arc<dyn Serving>) {
        let _ = self.serving.set(serving);
    }

    /// Whether the kernel may cache names (on a shared namespace, for what
    /// is left of the copy's lag: see `fuse/ttls.rs`).
    pub fn names_cached(&self) -> bool {
        self.state.lock().cache.names_cached
    }

    /// True when the namespace is shared with other hosts (the kernel then
    /// keeps names only for what is left of the copy's lag, and no
    /// attributes).
    pub fn is_shared(&self) -> bool {
        self.state.lock().sharing.replica.is_some()
    }

    /// True when the daemon checks permissions itself: mount without
    /// `default_permissions` (a shared namespace, see `fs/access.rs`).
    pub fn checks_access(&self) -> bool {
        self.state.lock().mount.checks_access
    }

    /// Check permissions in the daemon from now on (tests of a single-host
    /// table; [`Fs::set_replica`] does it for a shared namespace).
    #[cfg(test)]
    pub(crate) fn check_access_here(&self) {
        self.state.lock().mount.checks_access = true;
    }

    /// Bound what callers may make the daemon keep.
    #[cfg(test)]
    pub(crate) fn set_limits(&self, l: limits::Limits, locks: crate::lease::machine::LockLimits) {
        let mut st = self.state.lock();
        st.bounds.limits = l;
        st.lease.table_mut().set_lock_limits(locks);
    }

    /// The bounds in force.
    pub fn limits(&self) -> (limits::Limits, crate::lease::machine::LockLimits) {
        let st = self.state.lock();
        (st.bounds.limits, st.lease.table().lock_limits())
    }

    /// What wakes the lease timer before its deadline.
    pub fn wake(&self) -> Wake {
        self.state.lock().wake.clone()
    }

    /// A file's path for debug logs (empty unless debug logging is on).
    pub fn describe(&self, ino: Ino) -> String {
        self.state.lock().path_for_log(ino)
    }
}
