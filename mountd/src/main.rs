//! The `leasefs` command: mount (and serve) a lease directory, unmount it,
//! show and break its leases. Run as `mount.fuse.leasefs` it is the mount
//! helper of mount(8) and fstab (see [`helper`]).

mod docs;
mod helper;
mod lock;
mod metrics_http;
mod notify;
mod top;
mod tree;
mod wakeup;
mod watch;

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use leasefs::cluster::authority::{EtcdAuthority, EtcdConfig};
use leasefs::fs::Fs;
use leasefs::fuse::session::{self, MountOptions, Served};
use leasefs::fuse::LeaseFs;
use leasefs::lease::local::LocalAuthority;
use tracing::{error, info};

/// Environment variable naming the pipe fd on which a daemon started by
/// `leasefs mount` reports readiness (`READY`) or its failure to its parent.
const READY_FD_ENV: &str = "LEASEFS_READY_FD";

#[derive(Parser, Debug)]
#[command(
    name = "leasefs",
    version,
    about = "A FUSE filesystem that turns a directory into a fenced lock service",
    long_about = "leasefs mounts a POSIX filesystem whose files are leases: flock, fcntl and OFD \
                  locks are held by the daemon, every new holder gets a higher epoch (a fencing \
                  token), a lease keeps its identity across unlink and rename-over, and a holder \
                  that lost its lease cannot write through it. Contents live in the daemon's \
                  memory and are journaled to --state-dir (durable as of the last fsync); epochs \
                  are always durable.\n\n\
                  As mount.fuse.leasefs (a symlink to this binary) it is the helper mount(8) runs \
                  for `mount -t fuse.leasefs SOURCE DIR -o OPTS` and fstab lines of that type.\n\n\
                  Exit codes: 0 success, 1 refused or failed (the reason is printed), 2 usage error.\n\
                  Logs go to stderr (or --log-file); set the level with RUST_LOG=error|warn|info|debug|trace."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

// Parsed once at start: the size of the mount arguments does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Mount a lease directory; returns once the mount is live.
    Mount(MountArgs),
    /// Unmount a lease directory and wait for its daemon to exit.
    Unmount(UnmountArgs),
    /// Show the daemon's status (version, pid, uptime, lease counts).
    Status(ShowArgs),
    /// List leases that are held, awaited or have a TTL.
    Leases(LeasesArgs),
    /// Break a lease at once: its holder is fenced, the next grant gets epoch + 1 (root only).
    ///
    /// With --all, every lease held on the mount is broken: use it before handing the
    /// leases of a host to another (every holder here is fenced at once).
    Break(BreakArgs),
    /// Follow lease events (grant, release, wait, cancel, break, fence,
    /// cas_reject) as they happen, until Ctrl-C.
    ///
    /// With PATHs, only events of those files and of files under those
    /// directories. Lines show the time, event, path, epoch, holder pid/comm,
    /// mode, lock API and reason; --json prints the daemon's JSON lines.
    Watch(WatchArgs),
    /// Hold a lease while a command runs, and never let the command or anything it
    /// started outlive it.
    ///
    /// Takes PATH's lease like flock(1) (created if missing), runs COMMAND with
    /// LEASEFS_EPOCH (the fencing token) and LEASEFS_PATH set, and renews a --ttl lease
    /// while it runs. When the lease is broken, taken over or fenced, or its host is cut
    /// off, the command's whole process tree is ended (SIGTERM and SIGCONT, then SIGKILL
    /// after --grace), every process of it is reaped, and leasefs lock exits 75.
    /// Otherwise it exits with the command's status (128+N when killed by signal N), or
    /// 1 (-E) when the lease was not taken (-n, -w).
    ///
    /// The tree is every process the command starts, also those that leave its process
    /// group or session (setsid, double fork) and those that ignore SIGTERM:
    /// the command runs in a process group of its own; leasefs lock is a child
    /// subreaper, so orphaned descendants are re-parented to it and stay in the tree;
    /// and where a cgroup v2 directory can be made under its own cgroup (root, or a
    /// subtree delegated by systemd) the command runs in a cgroup of its own that
    /// cgroup.kill ends at once, so not even a process that re-parents itself elsewhere
    /// escapes. -v says which of these was used.
    ///
    /// When the command exits, whatever it left running is ended the same way before
    /// leasefs lock returns (the lease is held until then), unless --keep-children.
    /// SIGINT, SIGTERM and SIGHUP sent to leasefs lock are passed on to the whole tree.
    /// With a terminal, the command's group gets the terminal (Ctrl-C reaches it).
    /// If leasefs lock itself is killed with SIGKILL, the command gets SIGKILL
    /// (PR_SET_PDEATHSIG); its descendants are then left to the lease's TTL and fencing.
    #[command(override_usage = "leasefs lock [OPTIONS] <PATH> -- <COMMAND> [ARGS]...")]
    Lock(LockArgs),
    /// Block until a lease is free (default) or held; exits 1 at the -w timeout.
    Wait(WaitArgs),
    /// A live, full-screen view of the leases (like top).
    ///
    /// One row per lease that is held, awaited or has a TTL: PATH, HOLDER (pid/comm of
    /// the first holder, +N for more), MODE, EPOCH, HELD (how long), WAITERS and TTL
    /// (time left), most waiters first, then the longest held. The header shows the
    /// leases held and awaited and the rate of grants, breaks and fences per second
    /// over the last ~2 s.
    /// It refreshes every -d SECS and at once when an event happens. Keys: q quits, /
    /// filters by path (Enter applies, Esc cancels, an empty filter shows all).
    /// When stdout is not a terminal it prints each refresh as plain text (a header
    /// line, the column names, the rows, a blank line), like top -b.
    Top(TopArgs),
    /// Print a lease's epoch, its fencing token (what `getfattr -n user.leasefs.epoch` shows).
    ///
    /// The epoch rises by one with every new exclusive holder and never goes back.
    /// Exits 1 with a one-line reason when PATH is missing or not on a leasefs mount.
    Epoch {
        /// A file on a leasefs mount.
        path: PathBuf,
    },
    /// Write man pages and shell completions into DIR (for packaging).
    #[command(hide = true)]
    GenerateDocs {
        /// Output directory (man/ and completions/ are created in it).
        dir: PathBuf,
    },
}

#[derive(Args, Debug)]
struct LockArgs {
    /// The lease file, on a leasefs mount (absolute or relative to the current directory).
    path: PathBuf,
    /// Take a shared lease.
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    shared: bool,
    /// Take an exclusive lease (the default).
    #[arg(short = 'x', long)]
    exclusive: bool,
    /// Fail (exit 1, or -E) instead of waiting when the lease is taken.
    #[arg(short = 'n', long)]
    nonblock: bool,
    /// Wait at most SECS for the lease (fractions allowed), then fail like -n.
    #[arg(short = 'w', long = "timeout", value_name = "SECS")]
    timeout: Option<f64>,
    /// Exit code when the lease was not taken.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "CODE", default_value_t = 1)]
    conflict_exit_code: u8,
    /// Give the lease a TTL (`30s`); it is renewed while the command runs.
    #[arg(long, value_name = "DUR")]
    ttl: Option<String>,
    /// Time between SIGTERM and SIGKILL when the lease is lost.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = parse_ttl_arg)]
    grace: TtlArg,
    /// When the command exits normally, leave what it started running (it no longer
    /// holds the lease). Processes are still ended if the lease is lost first.
    #[arg(long)]
    keep_children: bool,
    /// Do not use a cgroup: contain the tree by process group and subreaper only.
    #[arg(long)]
    no_cgroup: bool,
    /// Print the epoch, the command's pid and how its tree is contained
    /// (cgroup or process group and subreaper) to stderr.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// The command and its arguments (after --).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<std::ffi::OsString>,
}

#[derive(Args, Debug)]
struct TopArgs {
    /// Mount point of a leasefs mount.
    mountpoint: PathBuf,
    /// Seconds between refreshes (fractions allowed).
    #[arg(short = 'd', long, value_name = "SECS", default_value_t = 1.0)]
    delay: f64,
    /// Stop after N refreshes.
    #[arg(short = 'n', long, value_name = "N")]
    iterations: Option<u64>,
    /// Start with this path filter (only leases whose path contains it).
    #[arg(long, value_name = "TEXT", default_value = "")]
    filter: String,
}

#[derive(Args, Debug)]
struct WaitArgs {
    /// Mount point of a leasefs mount.
    mountpoint: PathBuf,
    /// The lease (relative to the mount point or absolute inside it).
    path: PathBuf,
    /// Until nobody holds it (the default).
    #[arg(long, conflicts_with = "held")]
    free: bool,
    /// Until somebody holds it.
    #[arg(long)]
    held: bool,
    /// Wait at most SECS, then exit 1.
    #[arg(short = 'w', long = "timeout", value_name = "SECS")]
    timeout: Option<f64>,
}

#[derive(Args, Debug)]
struct WatchArgs {
    /// Mount point of a leasefs mount.
    mountpoint: PathBuf,
    /// Only these files, and files under these directories (relative to the
    /// mount point or absolute inside it).
    paths: Vec<PathBuf>,
    /// Print JSON lines (the `.leasefs/events` schema) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct LeasesArgs {
    #[command(flatten)]
    show: ShowArgs,
    /// Only leases at or under this mount-relative path (`/jobs`).
    #[arg(value_name = "PATH")]
    prefix: Option<String>,
    /// Show at most N leases (in path order); the daemon renders no more
    /// than it is asked for.
    #[arg(long, short = 'n', value_name = "N")]
    limit: Option<usize>,
    /// Also show each lease's inode, version and TTL.
    #[arg(long)]
    wide: bool,
}

#[derive(Args, Debug)]
struct ShowArgs {
    /// Mount point of a leasefs mount.
    mountpoint: PathBuf,
    /// Print the daemon's JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
#[command(
    group(clap::ArgGroup::new("what").required(true).multiple(false)),
    override_usage = "leasefs break <MOUNTPOINT> <PATH|--all>"
)]
struct BreakArgs {
    /// Mount point of a leasefs mount.
    mountpoint: PathBuf,
    /// Path of the lease, relative to the mount point (or absolute inside it).
    #[arg(group = "what")]
    path: Option<PathBuf>,
    /// Break every lease held on the mount.
    #[arg(long, group = "what")]
    all: bool,
}

#[derive(Args, Debug, Clone)]
struct MountArgs {
    /// Empty directory to mount on.
    mountpoint: PathBuf,
    /// Directory for durable state: the epoch journal, the namespace journal
    /// and its snapshot (one daemon per directory).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/leasefs")]
    state_dir: PathBuf,
    /// Keep names, contents, xattrs, TTLs and guards in memory only (epochs
    /// stay durable). Discards a namespace kept in the state directory.
    #[arg(long)]
    volatile: bool,
    /// Stay in the foreground instead of detaching the daemon.
    #[arg(long)]
    foreground: bool,
    /// Mount even if the directory is not empty (its entries are hidden while mounted).
    #[arg(long)]
    nonempty: bool,
    /// Let users other than the one who mounted use the mount (the default
    /// when root mounts; the kernel still checks permissions).
    #[arg(long, conflicts_with = "private")]
    allow_other: bool,
    /// Only the user who mounted may use the mount (the default for other users).
    #[arg(long)]
    private: bool,
    /// The mount's source in /proc/mounts and findmnt (fstab's first field).
    #[arg(long, value_name = "NAME", default_value = session::DEFAULT_SOURCE)]
    source: String,
    /// Seconds `mount` waits for the daemon to report the mount live
    /// (recovering a large state directory may need more).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    ready_timeout: u64,
    /// Serve the metrics over HTTP at http://ADDR/metrics for Prometheus
    /// (e.g. 127.0.0.1:9464; port 0 picks one, shown in `status`).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<String>,
    /// Default lease TTL (`500ms`, `30s`, `2m`, plain seconds; `0`/`off` for none).
    /// Past it, a lease whose holder did not renew goes to the next contender.
    #[arg(long, value_name = "DUR", value_parser = parse_ttl_arg)]
    lease_ttl: Option<TtlArg>,
    /// Append daemon logs to FILE (a detached daemon otherwise discards them).
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// Bytes of file contents and extended attributes the mount may hold
    /// (`64m`, `2g`, `10%` of memory; default 10 % of memory). Beyond it,
    /// writes, fallocate, creates of xattrs fail with ENOSPC; root keeps 5 %.
    #[arg(long, value_name = "SIZE", value_parser = leasefs::fs::limits::parse_size)]
    size: Option<u64>,
    /// Files, directories and symlinks the mount may hold (default one per
    /// KiB of --size). Beyond it, creates fail with ENOSPC; root keeps 5 %.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(16..))]
    max_inodes: Option<u64>,
    /// Files whose inodes the kernel may keep cached (default 65536; about
    /// 1 KiB of kernel memory each, all evicted by a clean unmount). Past
    /// it, the least recently first-used names that are not open are
    /// dropped from the kernel's cache once new names pause for 50 ms, and
    /// right away past twice it; using one again costs a lookup.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(16..))]
    kernel_inodes: Option<u64>,
    /// Locks (flock and byte ranges) held on the whole mount (default
    /// 1048576; one owner holds at most 16384 ranges per file). Beyond it,
    /// lock requests fail with ENOLCK.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(4..))]
    max_locks: Option<u64>,
    /// Lock requests waiting on the whole mount (default 65536; at most
    /// 4096 per lease). Beyond it, blocking lock requests fail with ENOLCK.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_waiters: Option<u64>,
    /// Share the namespace and its leases across hosts through etcd: client
    /// URLs of the cluster's members, comma-separated
    /// (http://10.0.0.1:2379,...). Files, locks and epochs are then the same
    /// on every mount of the same cluster and --etcd-prefix (files up to
    /// 1 MiB).
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',')]
    etcd: Vec<String>,
    /// Key prefix of the shared lease namespace in etcd.
    #[arg(long, value_name = "NAME", default_value = "leasefs", requires = "etcd")]
    etcd_prefix: String,
    /// TTL of this host's etcd lease: a host cut off from etcd fences its
    /// holders before it runs out (at 98 %), and other hosts' waiters are
    /// served once etcd expires it.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_secs_arg, requires = "etcd")]
    host_ttl: u64,
    /// Do not grant a lease whose previous holder's host was lost until
    /// this long after (for resources that never check fencing tokens).
    #[arg(long, value_name = "DUR", value_parser = parse_ttl_arg, requires = "etcd")]
    lock_delay: Option<TtlArg>,
    /// Deadline of one etcd call across all endpoints; calls that need etcd
    /// fail with EIO after at most twice this.
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = parse_ttl_arg, requires = "etcd")]
    etcd_timeout: TtlArg,
}

#[derive(Args, Debug)]
struct UnmountArgs {
    /// Mount point of a leasefs mount.
    mountpoint: PathBuf,
    /// Seconds to wait for the daemon to exit.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
}

#[derive(Debug, Clone, Copy)]
struct TtlArg(Option<u64>);

fn parse_ttl_arg(v: &str) -> Result<TtlArg, String> {
    leasefs::fs::parse_ttl(v).map(TtlArg).map_err(|_| format!("not a duration: {v:?} (try 500ms, 30s, 2m)"))
}

/// Whole seconds, at least 2 (etcd's smallest lease TTL).
fn parse_secs_arg(v: &str) -> Result<u64, String> {
    match leasefs::fs::parse_ttl(v) {
        Ok(Some(ms)) if ms >= 2000 && ms % 1000 == 0 => Ok(ms / 1000),
        _ => Err(format!("not a whole number of seconds of at least 2: {v:?} (try 10s)")),
    }
}

/// This host as other hosts of the etcd namespace see it.
fn host_name(mountpoint: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}:{}", host.trim(), mountpoint.display())
}

fn init_logging(log_file: Option<&Path>) {
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

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let name = argv.next().map(PathBuf::from).and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    if name.as_deref().is_some_and(|n| helper::NAMES.contains(&n)) {
        return mount_helper(&argv.collect::<Vec<_>>());
    }
    let cli = Cli::parse();
    match cli.command {
        Cmd::Mount(args) if args.foreground => serve(&args),
        Cmd::Mount(args) => spawn_daemon(&args),
        Cmd::Unmount(args) => unmount(&args),
        Cmd::Status(args) => status(&args),
        Cmd::Leases(args) => leases(&args),
        Cmd::Break(args) => break_lease(&args),
        Cmd::Lock(args) => lock::lock(&lock::LockSpec {
            path: args.path,
            shared: args.shared,
            nonblock: args.nonblock,
            wait: args.timeout,
            conflict_exit: args.conflict_exit_code,
            ttl: args.ttl,
            grace: Duration::from_millis(args.grace.0.unwrap_or(0)),
            keep_children: args.keep_children,
            no_cgroup: args.no_cgroup,
            verbose: args.verbose,
            command: args.command,
        }),
        Cmd::Epoch { path } => lock::epoch(&path),
        Cmd::Top(args) => match control_file(&args.mountpoint, "leases") {
            Ok(leases) => {
                let mount = leases.parent().and_then(Path::parent).unwrap_or(Path::new("/")).to_path_buf();
                top::top(&top::TopSpec {
                    mount: &mount,
                    delay: Duration::from_secs_f64(args.delay.clamp(0.05, 3600.0)),
                    iterations: args.iterations,
                    filter: args.filter,
                })
            }
            Err(e) => {
                eprintln!("leasefs: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Wait(args) => match control_file(&args.mountpoint, "events") {
            Ok(events) => {
                let mount = events.parent().and_then(Path::parent).unwrap_or(Path::new("/")).to_path_buf();
                lock::wait(&mount, &args.path, args.held, args.timeout)
            }
            Err(e) => {
                eprintln!("leasefs: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Watch(args) => match control_file(&args.mountpoint, "events") {
            Ok(events) => {
                let mount = events.parent().and_then(Path::parent).unwrap_or(Path::new("/")).to_path_buf();
                watch::watch(&events, &mount, &args.paths, args.json)
            }
            Err(e) => {
                eprintln!("leasefs: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::GenerateDocs { dir } => match docs::generate(<Cli as clap::CommandFactory>::command(), &dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("leasefs: {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        },
    }
}

/// `mount.fuse.leasefs SOURCE DIR [-sfnv] [-o OPTS]`: mount as `leasefs
/// mount` would with the options mapped.
fn mount_helper(argv: &[std::ffi::OsString]) -> ExitCode {
    let h = match helper::parse(argv) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("mount.fuse.leasefs: {e}");
            return ExitCode::from(2);
        }
    };
    if h.verbose {
        let shown: Vec<String> = h.args.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        eprintln!("mount.fuse.leasefs: leasefs {}", shown.join(" "));
    }
    let cli = match Cli::try_parse_from(std::iter::once("leasefs".into()).chain(h.args)) {
        Ok(c) => c,
        Err(e) => {
            let first = e.to_string();
            eprintln!(
                "mount.fuse.leasefs: {}",
                first.lines().next().unwrap_or("bad options").trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Cmd::Mount(args) if args.foreground => serve(&args),
        Cmd::Mount(args) => spawn_daemon(&args),
        _ => ExitCode::from(2),
    }
}

/// Read a control file of the leasefs mount at `mountpoint`, with a clear
/// message when it is not one or its daemon is dead.
fn control_file(mountpoint: &Path, name: &str) -> Result<PathBuf, String> {
    let path = session::absolute(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let show = path.display();
    if session::find_mount(&path).is_none() {
        return Err(format!("{show}: not a leasefs mount"));
    }
    if let Err(e) = std::fs::metadata(&path) {
        if e.raw_os_error() == Some(libc::ENOTCONN) {
            return Err(format!(
                "{show}: the daemon is gone (Transport endpoint is not connected); run `leasefs unmount {show}`"
            ));
        }
        return Err(format!("{show}: {e}"));
    }
    Ok(path.join(".leasefs").join(name))
}

fn read_control(mountpoint: &Path, name: &str) -> Result<String, String> {
    let p = control_file(mountpoint, name)?;
    std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// The control file's text for a table, or `Err(exit code)` once it was
/// printed (`--json`) or its error reported.
fn show(args: &ShowArgs, name: &str) -> Result<String, ExitCode> {
    match read_control(&args.mountpoint, name) {
        Ok(text) if args.json => {
            print!("{text}");
            Err(ExitCode::SUCCESS)
        }
        Ok(text) => Ok(text),
        Err(e) => {
            eprintln!("leasefs: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

fn status(args: &ShowArgs) -> ExitCode {
    let text = match show(args, "status") {
        Ok(t) => t,
        Err(code) => return code,
    };
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let l = &v["leases"];
    println!("mount point  {}", v["mount_point"].as_str().unwrap_or("?"));
    println!("source       {}", v["source"].as_str().unwrap_or("?"));
    println!("access       {}", v["access"].as_str().unwrap_or("?"));
    println!("version      {}", v["version"].as_str().unwrap_or("?"));
    println!("backend      {}", v["backend"].as_str().unwrap_or("?"));
    let etcd = &v["etcd"];
    if etcd.is_object() {
        let eps: Vec<&str> =
            etcd["endpoints"].as_array().map(|a| a.iter().filter_map(|e| e.as_str()).collect()).unwrap_or_default();
        let session = &etcd["session"];
        println!("etcd         {} (prefix {})", eps.join(","), etcd["prefix"].as_str().unwrap_or("?"));
        println!("host         {}", etcd["host"].as_str().unwrap_or("?"));
        println!(
            "session      lease {} ({}, ttl {}s, {} lost so far)",
            session["lease"].as_str().unwrap_or("?"),
            if session["alive"].as_bool() == Some(true) { "alive" } else { "LOST, re-registering" },
            session["ttl_secs"],
            session["lost"]
        );
    }
    println!("daemon pid   {}", v["pid"]);
    println!("uptime       {}", age((v["uptime_secs"].as_f64().unwrap_or(0.0) * 1000.0) as u64));
    println!("leases       {} held, {} awaited, {} with a TTL", l["held"], l["awaited"], l["with_ttl"]);
    let lim = &v["limits"];
    let size = &lim["size"];
    println!(
        "space        {} of {} used",
        bytes(size["used"].as_u64().unwrap_or(0)),
        bytes(size["max"].as_u64().unwrap_or(0))
    );
    println!("inodes       {} of {}", v["inodes"], lim["inodes"]["max"]);
    let refused: Vec<String> = lim
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, l)| l["refused"].as_u64().unwrap_or(0) > 0)
                .map(|(k, l)| format!("{k} {}", l["refused"]))
                .collect()
        })
        .unwrap_or_default();
    if !refused.is_empty() {
        println!("limits hit   {}", refused.join(", "));
    }
    let state = v["state_dir"].as_str().unwrap_or("?");
    println!("state dir    {state} ({})", v["durability"].as_str().unwrap_or("?"));
    println!(
        "epochs       ceiling {}, journal {}, {} commits",
        v["epoch_ceiling"],
        bytes(v["journal_bytes"].as_u64().unwrap_or(0)),
        v["journal_commits"]
    );
    if let Some(n) = v["namespace_journal_bytes"].as_u64() {
        let snap = &v["snapshot"];
        println!(
            "namespace    journal {}, snapshot {} (generation {}), {} compactions",
            bytes(n),
            bytes(snap["bytes"].as_u64().unwrap_or(0)),
            snap["generation"],
            v["journal_compactions"]
        );
    }
    match v["metrics_addr"].as_str() {
        Some(a) => println!("metrics      http://{a}/metrics"),
        None => println!("metrics      {}/.leasefs/metrics", v["mount_point"].as_str().unwrap_or("?")),
    }
    ExitCode::SUCCESS
}

/// A byte count in the largest unit that keeps it at least 1 (`512 B`,
/// `4.0 KiB`, `1.5 MiB`).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

fn leases(args: &LeasesArgs) -> ExitCode {
    let lines = match lease_lines(args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("leasefs: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.show.json {
        lines.iter().for_each(|l| println!("{l}"));
        return ExitCode::SUCCESS;
    }
    let mut rows = vec![leases_header(args.wide)];
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        rows.push(lease_row(&v, args.wide));
    }
    print!("{}", table(&rows));
    ExitCode::SUCCESS
}

/// The lines of `.leasefs/leases`, read as a stream: under `prefix` (the
/// daemon filters), at most `limit` of them (reading stops there).
fn lease_lines(args: &LeasesArgs) -> Result<Vec<String>, String> {
    use std::io::{BufRead, Write};
    let p = control_file(&args.show.mountpoint, "leases")?;
    let err = |e: std::io::Error| format!("{}: {e}", p.display());
    let mut f = std::fs::OpenOptions::new().read(true).write(args.prefix.is_some()).open(&p).map_err(err)?;
    if let Some(prefix) = &args.prefix {
        let prefix = format!("/{}", prefix.trim_start_matches('/'));
        f.write_all(prefix.as_bytes()).map_err(err)?;
    }
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        if args.limit.is_some_and(|n| lines.len() >= n) {
            break;
        }
        lines.push(line.map_err(err)?);
    }
    Ok(lines)
}

fn leases_header(wide: bool) -> Vec<String> {
    let mut h = vec!["PATH", "HOLDER", "MODE", "API", "EPOCH", "HELD", "WAITERS", "EXPIRES"];
    if wide {
        h.extend(["INODE", "VERSION", "TTL"]);
    }
    h.into_iter().map(String::from).collect()
}

/// One lease as table cells (`-` for an empty one).
fn lease_row(v: &serde_json::Value, wide: bool) -> Vec<String> {
    let holders = v["holders"].as_array().cloned().unwrap_or_default();
    let or_dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
    let num = |n: &serde_json::Value| if n.is_null() { "-".to_string() } else { n.to_string() };
    let who: Vec<String> = holders
        .iter()
        .map(|h| {
            let who = match h["comm"].as_str() {
                Some(c) => format!("{}/{c}", h["pid"]),
                None => h["pid"].to_string(),
            };
            // A holder on another host of an etcd namespace.
            match h["host"].as_str() {
                Some(host) => format!("{who}@{host}"),
                None => who,
            }
        })
        .collect();
    let first = holders.first();
    let field = |k: &str| first.and_then(|h| h[k].as_str()).unwrap_or("").to_string();
    let held = holders.iter().filter_map(|h| h["since_ms_ago"].as_u64()).max();
    let mut row = vec![
        or_dash(v["path"].as_str().unwrap_or("").to_string()),
        or_dash(who.join(",")),
        or_dash(field("mode")),
        or_dash(field("kind")),
        num(&v["epoch"]),
        held.map_or("-".to_string(), age),
        num(&v["waiters"]),
        v["expires_in_ms"].as_i64().map_or("-".to_string(), |ms| format!("in {}", age(ms.max(0) as u64))),
    ];
    if wide {
        row.push(num(&v["inode"]));
        row.push(num(&v["version"]));
        row.push(v["ttl_ms"].as_u64().map_or("-".to_string(), age));
    }
    row
}

/// A duration for people: `850ms`, `4.2s`, `3m05s`, `2h10m`, `3d4h`.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{}d{}h", s / 86_400, s / 3600 % 24),
    }
}

/// Left-aligned columns separated by two spaces.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = width[i])).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn break_lease(args: &BreakArgs) -> ExitCode {
    let p = match control_file(&args.mountpoint, "break") {
        Ok(p) => p,
        Err(e) => {
            eprintln!("leasefs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(path) = &args.path else {
        return match std::fs::write(&p, leasefs::fs::BREAK_ALL) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("leasefs: break --all: {e}");
                ExitCode::FAILURE
            }
        };
    };
    let mount = session::absolute(&args.mountpoint).unwrap_or_else(|_| args.mountpoint.clone());
    let rel = path.strip_prefix(&mount).unwrap_or(path);
    match std::fs::write(&p, rel.as_os_str().as_encoded_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasefs: break {}: {e}", rel.display());
            ExitCode::FAILURE
        }
    }
}

/// Block the termination signals in this thread and every thread started
/// after it (call before starting any thread).
fn block_signals() -> libc::sigset_t {
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
fn handle_signals(set: libc::sigset_t, mountpoint: PathBuf) {
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

fn report_ready(msg: &str) {
    if let Some(fd) = std::env::var(READY_FD_ENV).ok().and_then(|v| v.parse::<RawFd>().ok()) {
        std::env::remove_var(READY_FD_ENV);
        // SAFETY: the parent passed us this fd for exactly this message; we own it now.
        let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
        let _ = f.write_all(msg.as_bytes());
    }
}

fn serve(args: &MountArgs) -> ExitCode {
    leasefs::fs::tune_allocator();
    let signals = block_signals();
    init_logging(args.log_file.as_deref());
    let notify = notify::Notifier::from_env();
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // A root mount is a host's lock directory: every user may use it (with
    // the kernel's permission checks) unless --private.
    let allow_other = args.allow_other || (uid == 0 && !args.private);
    let mut opts = MountOptions { nonempty: args.nonempty, allow_other, source: args.source.clone(), handlers: None };
    let ttl = args.lease_ttl.and_then(|t| t.0);
    let fs = if args.etcd.is_empty() {
        Arc::new(Fs::with_lease_ttl(uid, gid, ttl))
    } else {
        let config = EtcdConfig {
            endpoints: args.etcd.clone(),
            prefix: args.etcd_prefix.clone(),
            host_ttl: args.host_ttl as i64,
            lock_delay: Duration::from_millis(args.lock_delay.and_then(|t| t.0).unwrap_or(0)),
            request_timeout: Duration::from_millis(args.etcd_timeout.0.unwrap_or(2000)),
            host: host_name(&args.mountpoint),
        };
        match EtcdAuthority::connect(config, LocalAuthority::new(ttl)) {
            Ok(a) => {
                let shared = a.namespace();
                let fs = Arc::new(Fs::with_authority(uid, gid, Box::new(a)));
                if let Err(e) = fs.set_replica(Box::new(shared)) {
                    let e = format!("etcd at {}: reading the shared namespace: {e:?}", args.etcd.join(","));
                    report_ready(&format!("ERR {e}\n"));
                    eprintln!("leasefs: {e}");
                    return ExitCode::FAILURE;
                }
                info!(endpoints = %args.etcd.join(","), prefix = %args.etcd_prefix, "leases and namespace shared through etcd");
                fs
            }
            Err(e) => {
                report_ready(&format!("ERR {e}\n"));
                eprintln!("leasefs: {e}");
                return ExitCode::FAILURE;
            }
        }
    };
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
    let mut locks = leasefs::lease::machine::LockLimits::default();
    if let Some(n) = args.max_locks {
        locks.locks_total = n as usize;
        locks.ranges_per_owner = locks.ranges_per_owner.min(n as usize);
    }
    if let Some(n) = args.max_waiters {
        locks.waiters_total = n as usize;
        locks.waiters_per_lease = locks.waiters_per_lease.min(n as usize);
    }
    fs.set_limits(limits, locks);
    // Epochs are durable in the state directory: refuse to start when it is
    // locked by another daemon or its journal is corrupt.
    match leasefs::store::epochs::EpochJournal::open(&args.state_dir) {
        Ok((journal, recovered)) => {
            info!(state_dir = %args.state_dir.display(), ceiling = recovered.ceiling, records = recovered.records, "epochs recovered");
            fs.set_journal(journal, recovered.ceiling);
        }
        Err(e) => {
            report_ready(&format!("ERR {e}\n"));
            eprintln!("leasefs: {e}");
            return ExitCode::FAILURE;
        }
    }
    // The namespace: recovered from the state directory, or (`--volatile`)
    // kept in memory, with any earlier durable namespace discarded so a
    // later durable mount cannot resurrect stale contents.
    let mut storage = leasefs::store::storage::DirStorage::new(&args.state_dir);
    if !args.etcd.is_empty() {
        // The namespace lives in etcd; a durable namespace of earlier
        // single-host mounts stays untouched in the state directory.
    } else if args.volatile {
        if let Err(e) = leasefs::store::snapshot::discard(&mut storage) {
            eprintln!("leasefs: {}: discarding the durable namespace: {e}", args.state_dir.display());
            return ExitCode::FAILURE;
        }
        fs.set_volatile();
    } else {
        let started = std::time::Instant::now();
        let _keepalive = notify.keep_starting("recovering the state directory");
        leasefs::store::snapshot::pausepoint("recovery");
        match leasefs::store::snapshot::Store::open(Box::new(storage)) {
            Ok((store, recovered)) => {
                let (inodes, batches, cut) = (recovered.inodes.len(), recovered.batches, recovered.cut);
                fs.set_store(store, recovered);
                info!(inodes, batches, cut, ms = started.elapsed().as_millis() as u64, "namespace recovered");
            }
            Err(e) => {
                let e = format!("{}/{e}", args.state_dir.display());
                report_ready(&format!("ERR {e}\n"));
                eprintln!("leasefs: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let mountpoint = match session::absolute(&args.mountpoint) {
        Ok(p) => p,
        Err(e) => {
            report_ready(&format!("ERR {}: {e}\n", args.mountpoint.display()));
            eprintln!("leasefs: {}: {e}", args.mountpoint.display());
            return ExitCode::FAILURE;
        }
    };
    if let Some(addr) = &args.metrics_addr {
        match metrics_http::serve(addr, &fs) {
            Ok(bound) => {
                info!(addr = %bound, "serving /metrics over HTTP");
                fs.set_metrics_addr(bound.to_string());
            }
            Err(e) => {
                let e = format!("--metrics-addr {addr}: {e}");
                report_ready(&format!("ERR {e}\n"));
                eprintln!("leasefs: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    handle_signals(signals, mountpoint.clone());
    fs.set_mount_point(mountpoint.clone(), &args.source, allow_other);
    if fs.is_shared() {
        // Requests that wait for etcd must not hold up the others.
        match fs.start_handlers() {
            Ok(w) => opts.handlers = Some(w),
            Err(e) => {
                report_ready(&format!("ERR starting request handlers: {e}\n"));
                eprintln!("leasefs: starting request handlers: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let (lease_fs, interceptor) = LeaseFs::new(fs.clone());
    let served = match Served::start(lease_fs, &mountpoint, &opts, interceptor) {
        Ok(s) => s,
        Err(e) => {
            report_ready(&format!("ERR {e}\n"));
            error!("{e}");
            eprintln!("leasefs: {e}");
            return ExitCode::FAILURE;
        }
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

/// Start the daemon detached and wait until it reports the mount live.
fn spawn_daemon(args: &MountArgs) -> ExitCode {
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
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg(&args.mountpoint).arg("--foreground").arg("--state-dir").arg(&args.state_dir);
    if args.nonempty {
        cmd.arg("--nonempty");
    }
    if args.volatile {
        cmd.arg("--volatile");
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
        if let Some(TtlArg(Some(ms))) = args.lock_delay {
            cmd.arg("--lock-delay").arg(format!("{ms}ms"));
        }
    }
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

/// Everything `reader` gives until end of file, or none after `timeout`.
fn read_bounded(reader: &mut std::fs::File, timeout: Duration) -> Option<String> {
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

fn unmount(args: &UnmountArgs) -> ExitCode {
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
        if e.raw_os_error() == Some(libc::ENOTCONN) {
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
    while Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid) {
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
fn is_zombie(pid: i32) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
    zombie && threads <= 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_inodes_below_16_are_refused() {
        let parse = |n: &str| Cli::try_parse_from(["leasefs", "mount", "/d", "--kernel-inodes", n]);
        assert!(parse("15").is_err());
        match parse("16").map(|c| c.command) {
            Ok(Cmd::Mount(a)) => assert_eq!(a.kernel_inodes, Some(16)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ages_read_like_a_person_would_say_them() {
        let got: Vec<String> = [0, 850, 4_200, 185_000, 7_800_000, 277_200_000].into_iter().map(age).collect();
        assert_eq!(got, ["0ms", "850ms", "4.2s", "3m05s", "2h10m", "3d5h"]);
    }

    #[test]
    fn lease_rows_fill_empty_cells_with_a_dash_and_tables_align() {
        let v = serde_json::json!({"path": "/L", "epoch": 3, "waiters": 0, "holders": [], "inode": 9, "version": 2});
        assert_eq!(lease_row(&v, false), ["/L", "-", "-", "-", "3", "-", "0", "-"]);
        let v = serde_json::json!({"path": "/a/L", "epoch": 1, "waiters": 2, "expires_in_ms": 1500, "ttl_ms": 30000,
            "holders": [{"pid": 7, "comm": "sh", "mode": "shared", "kind": "posix", "since_ms_ago": 61000},
                        {"pid": 8, "mode": "shared", "kind": "posix", "since_ms_ago": 10}]});
        assert_eq!(
            lease_row(&v, true),
            ["/a/L", "7/sh,8", "shared", "posix", "1", "1m01s", "2", "in 1.5s", "-", "-", "30.0s"]
        );
        let t = table(&[vec!["A".into(), "BB".into()], vec!["ccc".into(), "d".into()]]);
        assert_eq!(t, "A    BB\nccc  d\n");
    }
}
