//! The `leasefs` command: mount (and serve) a lease directory, unmount it,
//! show and break its leases. Run as `mount.fuse.leasefs` it is the mount
//! helper of mount(8) and fstab (see [`helper`]).

mod cli;
mod daemon;
mod docs;
mod fault;
mod helper;
mod lock;
mod metrics_http;
mod notify;
mod show;
mod top;
mod tree;
mod unmount;
mod wakeup;
mod watch;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::cli::*;
use crate::daemon::*;
use crate::show::*;
use crate::unmount::*;

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
        Cmd::Fault(cmd) => fault::fault(&cmd),
        Cmd::Crash { mountpoint, kill, report } => fault::crash(&mountpoint, kill, report),
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
