//! How the daemon sets the filesystem up and reads its settings back:
//! bounds, where it is mounted, where metrics are served, whether the
//! kernel or the daemon caches names and checks permissions.

use super::*;

impl Fs {
    /// Whether the kernel may cache names (not on a shared namespace:
    /// names change through other hosts' kernels too).
    pub fn names_cached(&self) -> bool {
        self.state.lock().names_cached
    }

    /// True when the namespace is shared with other hosts (the kernel must
    /// then cache nothing: another host's change could not reach it in time).
    pub fn is_shared(&self) -> bool {
        self.state.lock().replica.is_some()
    }

    /// True when the daemon checks permissions itself: mount without
    /// `default_permissions` (a shared namespace, see `fs/access.rs`).
    pub fn checks_access(&self) -> bool {
        self.state.lock().checks_access
    }

    /// Check permissions in the daemon from now on (tests of a single-host
    /// table; [`Fs::set_replica`] does it for a shared namespace).
    #[cfg(test)]
    pub(crate) fn check_access_here(&self) {
        self.state.lock().checks_access = true;
    }

    /// Bound what callers may make the daemon keep.
    pub fn set_limits(&self, l: limits::Limits, locks: crate::lease::machine::LockLimits) {
        let mut st = self.state.lock();
        st.limits = l;
        st.lease.set_lock_limits(locks);
    }

    /// The bounds in force.
    pub fn limits(&self) -> (limits::Limits, crate::lease::machine::LockLimits) {
        let st = self.state.lock();
        (st.limits, st.lease.lock_limits())
    }

    /// What wakes the lease timer before its deadline.
    pub fn wake(&self) -> Wake {
        self.state.lock().wake.clone()
    }

    /// A file's path for debug logs (empty unless debug logging is on).
    pub fn describe(&self, ino: Ino) -> String {
        self.state.lock().path_for_log(ino)
    }

    /// Record where `/metrics` is served (for `.leasefs/status`).
    pub fn set_metrics_addr(&self, addr: String) {
        self.state.lock().metrics_addr = Some(addr);
    }

    /// Record where the filesystem is mounted (for `.leasefs/status`).
    pub fn set_mount_point(&self, p: PathBuf, source: &str, shared: bool) {
        let mut st = self.state.lock();
        st.mount_point = p;
        st.mount_source = source.to_string();
        st.shared = shared;
    }

    /// Replace how thread ids map to processes (tests).
    pub fn set_proc_resolver(&self, resolve: fn(u32) -> Option<Proc>) {
        let mut st = self.state.lock();
        st.lease.views().set_resolver(resolve);
    }
}
