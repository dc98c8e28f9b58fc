//! The command line: every subcommand and option, as clap parses them
//! (the man pages and completions are generated from these types).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use leasefs::fuse::session::{self};

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
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

// Parsed once at start: the size of the mount arguments does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
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
    /// cas_reject, fault) as they happen, until Ctrl-C.
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
    /// Fault rules on a live mount, for tests (the test bench).
    ///
    /// A rule matches requests by operation (--op, as the system calls are known:
    /// open, create, read, write, fsync, fdatasync, close, stat, lookup, readdir,
    /// readlink, access, truncate, chmod, chown, utimes, fallocate, lseek, rename,
    /// unlink, mkdir, rmdir, link, symlink, flock, fcntl, getxattr, setxattr,
    /// listxattr, removexattr, statfs), path glob (*, ?, [..], ** across
    /// directories) and caller; fires by a seeded probability, after N matches, at
    /// most N times; and acts: fail with an errno, delay, hang until released or
    /// signalled (EINTR), shorten a read or write, break the path's lease, or cut
    /// the power (as `leasefs crash`).
    /// Every firing is an event (`leasefs watch`). Root only, or the user who
    /// mounted a private mount.
    #[command(subcommand)]
    Fault(FaultCmd),
    /// Cut the power of a test mount: keep only what was synced.
    ///
    /// Afterwards each file shows its contents and size as of its last fsync or
    /// fdatasync, its attributes as of its last fsync, and each directory its
    /// entries as of its last fsync; a rename stays only once both directories
    /// were synced after it. Descriptors opened before the cut answer EIO, every
    /// lease is broken (epochs never go back); a durable mount's state directory
    /// then holds the cut state. Only on a mount mounted with --bench; root only,
    /// or the user who mounted a private mount. Prints how much was lost, or with
    /// --report the whole report as JSON.
    Crash {
        /// Mount point of a leasefs mount.
        mountpoint: PathBuf,
        /// SIGKILL the processes holding descriptors opened before the cut.
        #[arg(long)]
        kill: bool,
        /// Print every file range and directory entry lost, as JSON.
        #[arg(long)]
        report: bool,
    },
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

#[derive(Subcommand, Debug)]
pub(crate) enum FaultCmd {
    /// Add a rule; prints its id. It is in force for the next request.
    Add(Box<FaultAddArgs>),
    /// List the rules with their counts of matches and firings.
    List {
        /// Mount point of a leasefs mount.
        mountpoint: PathBuf,
        /// Print the rules as JSON lines (the `.leasefs/faults` format).
        #[arg(long)]
        json: bool,
    },
    /// Remove a rule (requests it holds go on).
    Del {
        /// Mount point of a leasefs mount.
        mountpoint: PathBuf,
        /// The rule's id.
        id: u64,
    },
    /// Remove every rule (requests held go on).
    Clear {
        /// Mount point of a leasefs mount.
        mountpoint: PathBuf,
    },
    /// Let requests hung by a rule (by every rule without ID) go on; prints how many.
    Release {
        /// Mount point of a leasefs mount.
        mountpoint: PathBuf,
        /// The rule's id.
        id: Option<u64>,
    },
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("action").required(true).multiple(true)))]
pub(crate) struct FaultAddArgs {
    /// Mount point of a leasefs mount.
    pub(crate) mountpoint: PathBuf,
    /// Operations to match (repeat or comma-separate; default: every one).
    #[arg(long, value_name = "OP")]
    pub(crate) op: Vec<String>,
    /// Mount-relative path glob (`wal/*`, `**/*.db`); rename and link match either name.
    #[arg(long, value_name = "GLOB")]
    pub(crate) path: Option<String>,
    /// Only requests of this process.
    #[arg(long)]
    pub(crate) pid: Option<u32>,
    /// Only requests of this user.
    #[arg(long)]
    pub(crate) uid: Option<u32>,
    /// Only requests of processes with this command name (as in /proc/PID/comm).
    #[arg(long)]
    pub(crate) comm: Option<String>,
    /// Only requests of processes in this cgroup (v2 path) or below it.
    #[arg(long)]
    pub(crate) cgroup: Option<String>,
    /// Fire on a match with this probability (0 to 1), drawn from the rule's own seeded sequence.
    #[arg(long, value_name = "P")]
    pub(crate) probability: Option<f64>,
    /// Seed of the rule's sequence: the same seed and requests give the same firings.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// The first N matches pass.
    #[arg(long, value_name = "N")]
    pub(crate) after: Option<u64>,
    /// Fire at most N times.
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Fail with this errno (ENOSPC, EIO, ESTALE, ... any Linux name).
    #[arg(long, value_name = "NAME", group = "action")]
    pub(crate) errno: Option<String>,
    /// Delay the request (`500ms`, `2s`); with --errno, fail after the delay.
    #[arg(long, value_name = "DUR", group = "action")]
    pub(crate) delay: Option<String>,
    /// Hold the request until `fault release`, the rule's removal, or a signal to the caller (EINTR).
    #[arg(long, group = "action")]
    pub(crate) hang: bool,
    /// A read returns, a write accepts, at most N bytes (--op read, write).
    #[arg(long, value_name = "N", group = "action")]
    pub(crate) short: Option<u64>,
    /// Break the lease of the path at the request, before it is carried out.
    #[arg(long, group = "action")]
    pub(crate) lose_lease: bool,
    /// Cut the power at the request, before it is carried out; the request fails EIO.
    #[arg(long, group = "action")]
    pub(crate) crash: bool,
}

#[derive(Args, Debug)]
pub(crate) struct LockArgs {
    /// The lease file, on a leasefs mount (absolute or relative to the current directory).
    pub(crate) path: PathBuf,
    /// Take a shared lease.
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    pub(crate) shared: bool,
    /// Take an exclusive lease (the default).
    #[arg(short = 'x', long)]
    pub(crate) exclusive: bool,
    /// Fail (exit 1, or -E) instead of waiting when the lease is taken.
    #[arg(short = 'n', long)]
    pub(crate) nonblock: bool,
    /// Wait at most SECS for the lease (fractions allowed), then fail like -n.
    #[arg(short = 'w', long = "timeout", value_name = "SECS")]
    pub(crate) timeout: Option<f64>,
    /// Exit code when the lease was not taken.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "CODE", default_value_t = 1)]
    pub(crate) conflict_exit_code: u8,
    /// Give the lease a TTL (`30s`); it is renewed while the command runs.
    #[arg(long, value_name = "DUR")]
    pub(crate) ttl: Option<String>,
    /// Time between SIGTERM and SIGKILL when the lease is lost.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = parse_ttl_arg)]
    pub(crate) grace: TtlArg,
    /// When the command exits normally, leave what it started running (it no longer
    /// holds the lease). Processes are still ended if the lease is lost first.
    #[arg(long)]
    pub(crate) keep_children: bool,
    /// Do not use a cgroup: contain the tree by process group and subreaper only.
    #[arg(long)]
    pub(crate) no_cgroup: bool,
    /// Print the epoch, the command's pid and how its tree is contained
    /// (cgroup or process group and subreaper) to stderr.
    #[arg(short = 'v', long)]
    pub(crate) verbose: bool,
    /// The command and its arguments (after --).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub(crate) command: Vec<std::ffi::OsString>,
}

#[derive(Args, Debug)]
pub(crate) struct TopArgs {
    /// Mount point of a leasefs mount.
    pub(crate) mountpoint: PathBuf,
    /// Seconds between refreshes (fractions allowed).
    #[arg(short = 'd', long, value_name = "SECS", default_value_t = 1.0)]
    pub(crate) delay: f64,
    /// Stop after N refreshes.
    #[arg(short = 'n', long, value_name = "N")]
    pub(crate) iterations: Option<u64>,
    /// Start with this path filter (only leases whose path contains it).
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub(crate) filter: String,
}

#[derive(Args, Debug)]
pub(crate) struct WaitArgs {
    /// Mount point of a leasefs mount.
    pub(crate) mountpoint: PathBuf,
    /// The lease (relative to the mount point or absolute inside it).
    pub(crate) path: PathBuf,
    /// Until nobody holds it (the default).
    #[arg(long, conflicts_with = "held")]
    pub(crate) free: bool,
    /// Until somebody holds it.
    #[arg(long)]
    pub(crate) held: bool,
    /// Wait at most SECS, then exit 1.
    #[arg(short = 'w', long = "timeout", value_name = "SECS")]
    pub(crate) timeout: Option<f64>,
}

#[derive(Args, Debug)]
pub(crate) struct WatchArgs {
    /// Mount point of a leasefs mount.
    pub(crate) mountpoint: PathBuf,
    /// Only these files, and files under these directories (relative to the
    /// mount point or absolute inside it).
    pub(crate) paths: Vec<PathBuf>,
    /// Print JSON lines (the `.leasefs/events` schema) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct LeasesArgs {
    #[command(flatten)]
    pub(crate) show: ShowArgs,
    /// Only leases at or under this mount-relative path (`/jobs`).
    #[arg(value_name = "PATH")]
    pub(crate) prefix: Option<String>,
    /// Show at most N leases (in path order); the daemon renders no more
    /// than it is asked for.
    #[arg(long, short = 'n', value_name = "N")]
    pub(crate) limit: Option<usize>,
    /// Also show each lease's inode, version and TTL.
    #[arg(long)]
    pub(crate) wide: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ShowArgs {
    /// Mount point of a leasefs mount.
    pub(crate) mountpoint: PathBuf,
    /// Print the daemon's JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
#[command(
    group(clap::ArgGroup::new("what").required(true).multiple(false)),
    override_usage = "leasefs break <MOUNTPOINT> <PATH|--all>"
)]
pub(crate) struct BreakArgs {
    /// Mount point of a leasefs mount.
    pub(crate) mountpoint: PathBuf,
    /// Path of the lease, relative to the mount point (or absolute inside it).
    #[arg(group = "what")]
    pub(crate) path: Option<PathBuf>,
    /// Break every lease held on the mount.
    #[arg(long, group = "what")]
    pub(crate) all: bool,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct MountArgs {
    /// Empty directory to mount on.
    pub(crate) mountpoint: PathBuf,
    /// Directory for durable state: the epoch journal, the namespace journal
    /// and its snapshot (one daemon per directory).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/leasefs")]
    pub(crate) state_dir: PathBuf,
    /// Keep names, contents, xattrs, TTLs and guards in memory only (epochs
    /// stay durable). Discards a namespace kept in the state directory.
    #[arg(long)]
    pub(crate) volatile: bool,
    /// Serve as a test bench: every fsync and fdatasync reaches the daemon
    /// even when it has nothing to sync (a --volatile mount otherwise lets
    /// the kernel answer them, and fault rules could not name them). Costs
    /// one round trip per fsync (a few µs).
    #[arg(long)]
    pub(crate) bench: bool,
    /// Stay in the foreground instead of detaching the daemon.
    #[arg(long)]
    pub(crate) foreground: bool,
    /// Mount even if the directory is not empty (its entries are hidden while mounted).
    #[arg(long)]
    pub(crate) nonempty: bool,
    /// Let users other than the one who mounted use the mount (the default
    /// when root mounts; the kernel still checks permissions).
    #[arg(long, conflicts_with = "private")]
    pub(crate) allow_other: bool,
    /// Only the user who mounted may use the mount (the default for other users).
    #[arg(long)]
    pub(crate) private: bool,
    /// The mount's source in /proc/mounts and findmnt (fstab's first field).
    #[arg(long, value_name = "NAME", default_value = session::DEFAULT_SOURCE)]
    pub(crate) source: String,
    /// Seconds `mount` waits for the daemon to report the mount live
    /// (recovering a large state directory may need more).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub(crate) ready_timeout: u64,
    /// Serve the metrics over HTTP at http://ADDR/metrics for Prometheus
    /// (e.g. 127.0.0.1:9464; port 0 picks one, shown in `status`).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<String>,
    /// Default lease TTL (`500ms`, `30s`, `2m`, plain seconds; `0`/`off` for none).
    /// Past it, a lease whose holder did not renew goes to the next contender.
    #[arg(long, value_name = "DUR", value_parser = parse_ttl_arg)]
    pub(crate) lease_ttl: Option<TtlArg>,
    /// Append daemon logs to FILE (a detached daemon otherwise discards them).
    #[arg(long, value_name = "FILE")]
    pub(crate) log_file: Option<PathBuf>,
    /// Bytes of file contents and extended attributes the mount may hold
    /// (`64m`, `2g`, `10%` of memory; default 10 % of memory). Beyond it,
    /// writes, fallocate, creates of xattrs fail with ENOSPC; root keeps 5 %.
    #[arg(long, value_name = "SIZE", value_parser = leasefs::fs::limits::parse_size)]
    pub(crate) size: Option<u64>,
    /// Files, directories and symlinks the mount may hold (default one per
    /// KiB of --size). Beyond it, creates fail with ENOSPC; root keeps 5 %.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(16..))]
    pub(crate) max_inodes: Option<u64>,
    /// Files whose inodes the kernel may keep cached (default 65536; about
    /// 1 KiB of kernel memory each, all evicted by a clean unmount). Past
    /// it, the least recently first-used names that are not open are
    /// dropped from the kernel's cache once new names pause for 50 ms, and
    /// right away past twice it; using one again costs a lookup.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(16..))]
    pub(crate) kernel_inodes: Option<u64>,
    /// Locks (flock and byte ranges) held on the whole mount (default
    /// 1048576; one owner holds at most 16384 ranges per file). Beyond it,
    /// lock requests fail with ENOLCK.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(4..))]
    pub(crate) max_locks: Option<u64>,
    /// Lock requests waiting on the whole mount (default 65536; at most
    /// 4096 per lease). Beyond it, blocking lock requests fail with ENOLCK.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_waiters: Option<u64>,
    /// How requests reach the daemon: io_uring (one queue per CPU, each
    /// answered on the CPU that made the request; Linux 6.14+ with the
    /// fuse module's enable_uring), /dev/fuse, or auto (io_uring when the
    /// kernel offers it, else /dev/fuse, saying why in the log and status).
    #[arg(long, value_name = "KIND", env = "LEASEFS_TRANSPORT", default_value = "auto", value_parser = ["auto", "uring", "dev"])]
    pub(crate) transport: String,
    /// Share the namespace and its leases across hosts through etcd: client
    /// URLs of the cluster's members, comma-separated
    /// (http://10.0.0.1:2379,...). Files, locks and epochs are then the same
    /// on every mount of the same cluster and --etcd-prefix (files up to
    /// 1 MiB).
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',')]
    pub(crate) etcd: Vec<String>,
    /// Key prefix of the shared lease namespace in etcd.
    #[arg(long, value_name = "NAME", default_value = "leasefs", requires = "etcd")]
    pub(crate) etcd_prefix: String,
    /// TTL of this host's etcd lease: a host cut off from etcd fences its
    /// holders before it runs out (at 98 %), and other hosts' waiters are
    /// served once etcd expires it.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_secs_arg, requires = "etcd")]
    pub(crate) host_ttl: u64,
    /// Do not grant a lease whose previous holder's host was lost until
    /// this long after (for resources that never check fencing tokens).
    #[arg(long, value_name = "DUR", value_parser = parse_ttl_arg, requires = "etcd")]
    pub(crate) lock_delay: Option<TtlArg>,
    /// Deadline of one etcd call across all endpoints; calls that need etcd
    /// fail with EIO after at most twice this.
    #[arg(long, value_name = "DUR", default_value = "2s", value_parser = parse_ttl_arg, requires = "etcd")]
    pub(crate) etcd_timeout: TtlArg,
    /// Close-to-open: stat, readdir, read and lookups answer from this
    /// host's watched copy of the namespace while it is known to be at most
    /// this far behind etcd; past that they ask etcd first and fail with
    /// EIO when it cannot be reached. open and every change always see
    /// every change that completed anywhere before them.
    #[arg(long, value_name = "DUR", default_value = "1s", value_parser = parse_ttl_arg, requires = "etcd")]
    pub(crate) etcd_copy_lag: TtlArg,
}

#[derive(Args, Debug)]
pub(crate) struct UnmountArgs {
    /// Mount point of a leasefs mount.
    pub(crate) mountpoint: PathBuf,
    /// Seconds to wait for the daemon to exit.
    #[arg(long, default_value_t = 10)]
    pub(crate) timeout: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct TtlArg(pub(crate) Option<u64>);

pub(crate) fn parse_ttl_arg(v: &str) -> Result<TtlArg, String> {
    leasefs::fs::parse_ttl(v).map(TtlArg).map_err(|_| format!("not a duration: {v:?} (try 500ms, 30s, 2m)"))
}

/// Whole seconds, at least 2 (etcd's smallest lease TTL).
pub(crate) fn parse_secs_arg(v: &str) -> Result<u64, String> {
    match leasefs::fs::parse_ttl(v) {
        Ok(Some(ms)) if ms >= 2000 && ms % 1000 == 0 => Ok(ms / 1000),
        _ => Err(format!("not a whole number of seconds of at least 2: {v:?} (try 10s)")),
    }
}
