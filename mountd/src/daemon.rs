//! `mount`: the daemon (logging, signals, readiness, serving the mount)
//! and the parent that starts it in the background and waits for it.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasefs::cluster::authority::{EtcdArbitration, EtcdConfig};
use leasefs::fs::{Fs, Keep, Setup};
use leasefs::fuse::serving::{self, ServingReport};
use leasefs::fuse::session::{self, MountOptions, Served};
use leasefs::fuse::LeaseFs;
use tracing::{error, info};

use crate::cli::*;

/// Environment variable naming the pipe fd on which a daemon started by
/// `leasefs mount` reports readiness (`READY`) or its failure to its parent.
pub(crate) const READY_FD_ENV: &str = "LEASEFS_READY_FD";

/// This host as other hosts of the etcd namespace see it.
pub(crate) fn host_name(mountpoint: &Path) -> String {
    format!("{}:{}", leasefs::procfs::hostname(), mountpoint.display())
}

pub(crate) fn init_logging(log_file: Option<&Path>) {
    let level = match std::env::var("RUST_LOG").unwrap_or_default().to_ascii_lowercase().as_str() {
        "error" => tracing::Level::ERROR,
        "warn" => tracing::Level::WARN,
        "debug" => tracing::Level::DEBUG,
        "trace" => tracing::Level::TRACE,
        _ => tracing::Level::INFO,
    };
    let builder = tracing_subscriber::fmt().with_max_level(level).with_target(false);
    match log_file.and_then(|p| session::open_append(p).ok()) {
        Some(f) => builder.with_ansi(false).with_writer(std::sync::Mutex::new(f)).init(),
        None => builder.with_writer(std::io::stderr).init(),
    }
}

/// Block the termination signals in this thread and every thread started
/// after it (call before starting any thread).
pub(crate) fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset manipulation on a local, zero-initialised set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        set
    }
}

/// Turn the blocked termination signals into an unmount, so the session
/// loop ends and the daemon exits cleanly.
pub(crate) fn handle_signals(set: libc::sigset_t, mountpoint: PathBuf) {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: set is a valid signal set; sig is a valid out pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                continue;
            }
            info!(signal = sig, "unmounting on signal");
            if session::unmount(&mountpoint, false).is_err() {
                let _ = session::unmount(&mountpoint, true);
            }
        })
        .expect("spawn signal thread");
}

/// The one way a daemon that cannot serve ends: the reason to the waiting
/// parent (as `ERR ...`), to the log and to stderr; then the exit code.
fn not_ready(why: impl std::fmt::Display) -> ExitCode {
    report_ready(&format!("ERR {why}\n"));
    error!("{why}");
    eprintln!("leasefs: {why}");
    ExitCode::FAILURE
}

pub(crate) fn report_ready(msg: &str) {
    if let Some(fd) = std::env::var(READY_FD_ENV).ok().and_then(|v| v.parse::<RawFd>().ok()) {
        std::env::remove_var(READY_FD_ENV);
        // SAFETY: the parent passed us this fd for exactly this message; we own it now.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let _ = f.write_all(msg.as_bytes());
    }
}

pub(crate) fn serve(args: &MountArgs) -> ExitCode {
    leasefs::fs::tune_allocator();
    let signals = block_signals();
    init_logging(args.log_file.as_deref());
    let notify = crate::notify::Notifier::from_env();
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // A root mount is a host's lock directory: every user may use it (with
    // the kernel's permission checks) unless --private.
    let allow_other = args.allow_other || (uid == 0 && !args.private);
    let mut opts = MountOptions {
        nonempty: args.nonempty,
        allow_other,
        source: args.source.clone(),
        handlers: None,
        kernel_permissions: true,
        transport: args.transport.parse().unwrap_or_default(),
        report: Default::default(),
    };
    let started = (|| {
        let mountpoint =
            session::absolute(&args.mountpoint).map_err(|e| format!("{}: {e}", args.mountpoint.display()))?;
        let metrics = match &args.metrics_addr {
            Some(addr) => Some(crate::metrics_http::bind(addr).map_err(|e| format!("--metrics-addr {addr}: {e}"))?),
            None => None,
        };
        let setup =
            setup(args, uid, gid, &mountpoint, allow_other, metrics.as_ref().map(|(_, a)| a.to_string()), &notify)?;
        let shared = !args.etcd.is_empty();
        let fs = Arc::new(Fs::start(setup).map_err(|e| {
            if shared {
                format!("etcd at {}: reading the shared namespace: {e}", args.etcd.join(","))
            } else {
                e.to_string()
            }
        })?);
        if shared {
            info!(endpoints = %args.etcd.join(","), prefix = %args.etcd_prefix, "leases and namespace shared through etcd");
        }
        if let Some((listener, bound)) = metrics {
            crate::metrics_http::serve(listener, &fs).map_err(|e| format!("--metrics-addr {bound}: {e}"))?;
            info!(addr = %bound, "serving /metrics over HTTP");
        }
        handle_signals(signals, mountpoint.clone());
        // On a shared namespace the daemon checks permissions (see fs/access.rs),
        // and requests that wait for etcd must not hold up the others.
        opts.kernel_permissions = !fs.checks_access();
        if fs.is_shared() {
            let pool = serving::handler_pool().map_err(|e| format!("starting request handlers: {e}"))?;
            opts.handlers = Some(pool);
        }
        opts.report.set_wanted(opts.transport);
        let report = ServingReport { transport: opts.report.clone(), handlers: opts.handlers.clone() };
        fs.show_serving(Arc::new(report));
        let (lease_fs, interceptor) = LeaseFs::new(fs.clone(), opts.report.clone());
        let served = Served::start(lease_fs, &mountpoint, &opts, interceptor).map_err(|e| e.to_string())?;
        Ok::<_, String>((fs, mountpoint, served))
    })();
    let (fs, mountpoint, served) = match started {
        Ok(started) => started,
        Err(why) => return not_ready(why),
    };
    report_ready("READY\n");
    notify.send(&format!("READY=1\nSTATUS=serving {}\nMAINPID={}", mountpoint.display(), std::process::id()));
    served.run();
    notify.send("STOPPING=1\nSTATUS=unmounted");
    // The state is on disk: leave its memory to the exit instead of
    // freeing a million inodes one by one (a second at a million).
    std::mem::forget(fs);
    ExitCode::SUCCESS
}

/// What the filesystem starts with, from the command line and the state
/// directory: its lease authority (this host alone, or shared through etcd
/// with the shared namespace), its bounds, the epoch ceiling (refusing to
/// start when another daemon holds the directory or its journal is
/// corrupt), and the namespace unless it lives in etcd: recovered, or
/// (`--volatile`) kept in memory with any earlier durable namespace
/// discarded, so a later durable mount cannot resurrect stale contents.
fn setup(
    args: &MountArgs,
    uid: u32,
    gid: u32,
    mountpoint: &std::path::Path,
    allow_other: bool,
    metrics_addr: Option<String>,
    notify: &crate::notify::Notifier,
) -> Result<Setup, String> {
    let mut limits = match args.size {
        Some(size) => leasefs::fs::limits::Limits::with_size(size),
        None => leasefs::fs::limits::Limits::for_this_machine(),
    };
    if let Some(n) = args.max_inodes {
        limits.inodes = n;
    }
    if let Some(n) = args.kernel_inodes {
        limits.kernel_inodes = n as usize;
    }
    let mut lock_limits = leasefs::lease::machine::LockLimits::default();
    if let Some(n) = args.max_locks {
        lock_limits.locks_total = n as usize;
        lock_limits.ranges_per_owner = lock_limits.ranges_per_owner.min(n as usize);
    }
    if let Some(n) = args.max_waiters {
        lock_limits.waiters_total = n as usize;
        lock_limits.waiters_per_lease = lock_limits.waiters_per_lease.min(n as usize);
    }
    // The namespace: shared through etcd (a durable namespace of earlier
    // single-host mounts stays untouched in the state directory), or this
    // host's own, recovered after the epoch journal.
    let shared = if args.etcd.is_empty() {
        None
    } else {
        let config = EtcdConfig {
            endpoints: args.etcd.clone(),
            prefix: args.etcd_prefix.clone(),
            host_ttl: args.host_ttl as i64,
            lock_delay: Duration::from_millis(args.lock_delay.and_then(|t| t.0).unwrap_or(0)),
            request_timeout: Duration::from_millis(args.etcd_timeout.0.unwrap_or(2000)),
            copy_lag: Duration::from_millis(args.etcd_copy_lag.0.unwrap_or(0)),
            host: host_name(&args.mountpoint),
        };
        let a = EtcdArbitration::connect(config)?;
        let namespace = a.namespace();
        Some(Keep::Shared(Box::new(a), Box::new(namespace)))
    };
    let (journal, recovered) =
        leasefs::store::epochs::EpochJournal::open(&args.state_dir).map_err(|e| e.to_string())?;
    info!(state_dir = %args.state_dir.display(), ceiling = recovered.ceiling, records = recovered.records, "epochs recovered");
    let keep = match shared {
        Some(keep) => keep,
        None => recover_namespace(args, notify)?,
    };
    Ok(Setup {
        uid,
        gid,
        lease_ttl: args.lease_ttl.and_then(|t| t.0),
        limits,
        lock_limits,
        journal: Some((journal, recovered.ceiling)),
        keep,
        mount_point: mountpoint.to_path_buf(),
        source: args.source.clone(),
        allow_other,
        metrics_addr,
        bench: args.bench,
    })
}

/// The single-host namespace: recovered from the state directory, or
/// (`--volatile`) discarded there and kept in memory.
fn recover_namespace(args: &MountArgs, notify: &crate::notify::Notifier) -> Result<Keep, String> {
    let mut storage = leasefs::store::storage::DirStorage::new(&args.state_dir);
    if args.volatile {
        leasefs::store::snapshot::discard(&mut storage)
            .map_err(|e| format!("{}: discarding the durable namespace: {e}", args.state_dir.display()))?;
        return Ok(Keep::Memory { volatile: true });
    }
    let started = std::time::Instant::now();
    let _keepalive = notify.keep_starting("recovering the state directory");
    leasefs::failpoints::pausepoint("recovery");
    let (store, recovered) = leasefs::store::snapshot::Store::open(Box::new(storage))
        .map_err(|e| format!("{}/{e}", args.state_dir.display()))?;
    let (inodes, batches, cut) = (recovered.inodes.len(), recovered.batches, recovered.cut);
    info!(inodes, batches, cut, ms = started.elapsed().as_millis() as u64, "namespace recovered");
    Ok(Keep::Durable(store, recovered))
}

/// Start the daemon detached and wait until it reports the mount live.
pub(crate) fn spawn_daemon(args: &MountArgs) -> ExitCode {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array for pipe to fill.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        eprintln!("leasefs: pipe: {}", std::io::Error::last_os_error());
        return ExitCode::FAILURE;
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: rd was just created by pipe and is owned here.
    let mut reader = unsafe { std::fs::File::from_raw_fd(rd) };
    // SAFETY: fcntl on our own fd; the read end must not leak into the daemon.
    unsafe { libc::fcntl(rd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("leasefs: cannot find own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cmd = foreground_command(exe, args);
    cmd.env(READY_FD_ENV, wr.to_string()).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from our session.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn();
    // SAFETY: closing our copy of the write end so EOF means the daemon is gone.
    unsafe { libc::close(wr) };
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasefs: starting the daemon: {e}");
            return ExitCode::FAILURE;
        }
    };
    let msg = match read_bounded(&mut reader, Duration::from_secs(args.ready_timeout)) {
        Some(m) => m,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "leasefs: {}: the daemon did not report the mount live within {}s; stopped it (raise --ready-timeout)",
                args.mountpoint.display(),
                args.ready_timeout
            );
            return ExitCode::FAILURE;
        }
    };
    if msg.starts_with("READY") {
        // The daemon lives on; nobody waits for it here.
        std::mem::forget(child);
        return ExitCode::SUCCESS;
    }
    let _ = child.wait();
    let why = msg.strip_prefix("ERR ").unwrap_or("the daemon exited before the mount was live").trim();
    eprintln!("leasefs: {why}");
    ExitCode::FAILURE
}

/// The command line of the daemon `spawn_daemon` starts: this mount's
/// settings, in the foreground.
fn foreground_command(exe: std::path::PathBuf, args: &MountArgs) -> Command {
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg(&args.mountpoint).arg("--foreground").arg("--state-dir").arg(&args.state_dir);
    if args.nonempty {
        cmd.arg("--nonempty");
    }
    if args.volatile {
        cmd.arg("--volatile");
    }
    if args.bench {
        cmd.arg("--bench");
    }
    if args.allow_other {
        cmd.arg("--allow-other");
    }
    if args.private {
        cmd.arg("--private");
    }
    cmd.arg("--source").arg(&args.source);
    if let Some(a) = &args.metrics_addr {
        cmd.arg("--metrics-addr").arg(a);
    }
    cmd.arg("--ready-timeout").arg(args.ready_timeout.to_string());
    if let Some(n) = args.size {
        cmd.arg("--size").arg(n.to_string());
    }
    if let Some(n) = args.max_inodes {
        cmd.arg("--max-inodes").arg(n.to_string());
    }
    if let Some(n) = args.kernel_inodes {
        cmd.arg("--kernel-inodes").arg(n.to_string());
    }
    if let Some(n) = args.max_locks {
        cmd.arg("--max-locks").arg(n.to_string());
    }
    if let Some(n) = args.max_waiters {
        cmd.arg("--max-waiters").arg(n.to_string());
    }
    cmd.arg("--transport").arg(&args.transport);
    if let Some(l) = &args.log_file {
        cmd.arg("--log-file").arg(l);
    }
    if let Some(TtlArg(ttl)) = args.lease_ttl {
        cmd.arg("--lease-ttl").arg(ttl.map_or_else(|| "off".to_string(), |ms| format!("{ms}ms")));
    }
    if !args.etcd.is_empty() {
        cmd.arg("--etcd").arg(args.etcd.join(",")).arg("--etcd-prefix").arg(&args.etcd_prefix);
        cmd.arg("--host-ttl").arg(format!("{}s", args.host_ttl));
        cmd.arg("--etcd-timeout").arg(format!("{}ms", args.etcd_timeout.0.unwrap_or(2000)));
        cmd.arg("--etcd-copy-lag").arg(format!("{}ms", args.etcd_copy_lag.0.unwrap_or(0)));
        if let Some(TtlArg(Some(ms))) = args.lock_delay {
            cmd.arg("--lock-delay").arg(format!("{ms}ms"));
        }
    }
    cmd
}

/// Everything `reader` gives until end of file, or none after `timeout`.
pub(crate) fn read_bounded(reader: &mut std::fs::File, timeout: Duration) -> Option<String> {
    use std::os::fd::AsRawFd;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let mut pfd = libc::pollfd { fd: reader.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            return if n == 0 { None } else { Some(String::from_utf8_lossy(&out).into_owned()) };
        }
        let mut buf = [0u8; 512];
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => return Some(String::from_utf8_lossy(&out).into_owned()),
            Ok(k) => out.extend_from_slice(&buf[..k]),
        }
    }
}
