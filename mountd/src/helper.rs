//! `mount.fuse.leasefs`: the helper mount(8) runs for `-t fuse.leasefs` and
//! for fstab lines of that type, as `mount.fuse.leasefs SOURCE DIR [-sfnv]
//! [-o OPTS]`. The same binary under that name (a symlink) turns the mount
//! options into a `leasefs mount` command line.

use std::ffi::OsString;

/// Names the binary answers to as the mount helper.
pub const NAMES: [&str; 2] = ["mount.fuse.leasefs", "mount.leasefs"];

/// Options mount(8), systemd or fstab conventions pass that mean nothing
/// to leasefs (the kernel mount is always `nosuid,nodev`).
const IGNORED: [&str; 16] = [
    "defaults", "auto", "noauto", "user", "users", "nouser", "owner", "_netdev", "nofail", "rw", "nodev", "nosuid",
    "exec", "noexec", "async", "comment",
];

/// Options taking a value, and the `leasefs mount` flag each becomes.
const VALUED: [(&str, &str); 18] = [
    ("size", "--size"),
    ("max_locks", "--max-locks"),
    ("max_waiters", "--max-waiters"),
    ("nr_inodes", "--max-inodes"),
    ("max_inodes", "--max-inodes"),
    ("kernel_inodes", "--kernel-inodes"),
    ("metrics_addr", "--metrics-addr"),
    ("state_dir", "--state-dir"),
    ("lease_ttl", "--lease-ttl"),
    ("log_file", "--log-file"),
    ("ready_timeout", "--ready-timeout"),
    ("source", "--source"),
    ("etcd_prefix", "--etcd-prefix"),
    ("host_ttl", "--host-ttl"),
    ("lock_delay", "--lock-delay"),
    ("etcd_timeout", "--etcd-timeout"),
    ("etcd_copy_lag", "--etcd-copy-lag"),
    ("transport", "--transport"),
];

/// Flags, and the `leasefs mount` flag each becomes. mount(8) takes
/// `private` for itself (mount propagation) and never passes it on, so
/// fstab lines say `private_access`.
const FLAGS: [(&str, &str); 6] = [
    ("volatile", "--volatile"),
    ("bench", "--bench"),
    ("private_access", "--private"),
    ("private", "--private"),
    ("allow_other", "--allow-other"),
    ("nonempty", "--nonempty"),
];

/// The helper's command line, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct Helper {
    /// The `leasefs` arguments to run (starting with `mount`).
    pub args: Vec<OsString>,
    /// `-v`: print what is run.
    pub verbose: bool,
}

/// Turn `SOURCE DIR [-s] [-f] [-n] [-v] [-o OPTS]...` into a `leasefs mount`
/// command line, or one line saying what is wrong.
pub fn parse(argv: &[OsString]) -> Result<Helper, String> {
    let mut positional = Vec::new();
    let mut opts = Vec::new();
    let (mut sloppy, mut foreground, mut verbose) = (false, false, false);
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let s = a.to_str().unwrap_or("");
        match s {
            "-o" => {
                let v = it.next().ok_or("-o needs a list of options")?;
                opts.extend(v.to_str().ok_or("mount options must be UTF-8")?.split(',').map(str::to_string));
            }
            _ if s.starts_with("-o") && s.len() > 2 => opts.extend(s[2..].split(',').map(str::to_string)),
            _ if s.starts_with('-') && s.len() > 1 && !s.starts_with("--") => {
                for c in s[1..].chars() {
                    match c {
                        's' => sloppy = true,
                        'f' => foreground = true,
                        'v' => verbose = true,
                        // No mtab to write: the kernel's mount table is the only one.
                        'n' => {}
                        _ => return Err(format!("unknown flag -{c} (known: -s -f -n -v -o OPTS)")),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, dir] =
        <[OsString; 2]>::try_from(positional).map_err(|p| format!("expected SOURCE DIR, got {} arguments", p.len()))?;
    let mut args: Vec<OsString> = vec!["mount".into(), dir, "--source".into(), source];
    if foreground {
        args.push("--foreground".into());
    }
    // `etcd=URL`, once per member (a comma would end the option).
    let mut etcd: Vec<&str> = Vec::new();
    for o in opts.iter().filter(|o| !o.is_empty()) {
        let (key, value) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        if IGNORED.contains(&key) || key.starts_with("x-") {
            continue;
        }
        if key == "etcd" {
            etcd.push(value.filter(|v| !v.is_empty()).ok_or("mount option etcd needs a value")?);
            continue;
        }
        if let Some((_, flag)) = VALUED.iter().find(|(k, _)| *k == key) {
            let v = value.filter(|v| !v.is_empty()).ok_or_else(|| format!("mount option {key} needs a value"))?;
            if key == "source" {
                // The fstab source wins; `source=` is only for mount(8) lines without one.
                continue;
            }
            args.push((*flag).into());
            args.push(v.into());
        } else if let Some((_, flag)) = FLAGS.iter().find(|(k, _)| *k == key).filter(|_| value.is_none()) {
            args.push((*flag).into());
        } else if !sloppy {
            return Err(format!(
                "unknown mount option {o:?} (known: state_dir=, lease_ttl=, size=, nr_inodes=, kernel_inodes=, max_locks=, max_waiters=, transport=, \
                 log_file=, ready_timeout=, metrics_addr=, etcd=, etcd_prefix=, host_ttl=, lock_delay=, etcd_timeout=, etcd_copy_lag=, \
                 volatile, bench, private_access, allow_other, nonempty)"
            ));
        }
    }
    if !etcd.is_empty() {
        args.push("--etcd".into());
        args.push(etcd.join(",").into());
    }
    Ok(Helper { args, verbose })
}

/// The helper's manual page (`mount.fuse.leasefs(8)`), built from the same
/// option tables [`parse`] uses, so the page lists exactly what it accepts.
pub fn command() -> clap::Command {
    use clap::{Arg, ArgAction};
    let valued: Vec<String> = VALUED
        .iter()
        .map(|(k, flag)| match *k {
            "source" => format!("  {k}=VALUE    used only when mount(8) gives no SOURCE"),
            _ => format!("  {k}=VALUE    leasefs mount {flag} VALUE"),
        })
        .collect();
    let flags: Vec<String> = FLAGS
        .iter()
        .filter(|(k, _)| *k != "private")
        .map(|(k, flag)| format!("  {k}    leasefs mount {flag}"))
        .collect();
    let about = format!(
        "mount(8) runs this helper for `mount -t fuse.leasefs SOURCE DIR -o OPTS` and for /etc/fstab lines of \
         type fuse.leasefs. It starts `leasefs mount DIR --source SOURCE` with the options below and returns once \
         the mount is live (or after ready_timeout, 30 s by default, with the daemon stopped). The mount's source \
         is SOURCE, so `findmnt SOURCE` and `mount -a` recognise it; `umount DIR` stops the daemon.\n\n\
         Options taking a value:\n{}\n  etcd=URL    one etcd member of leasefs mount --etcd (give it once per member)\n\n\
         Flags:\n{}\n  private    the same as private_access, for callers other than mount(8), which keeps \
         `private` for itself (mount propagation)\n\n\
         Ignored, as mount(8), systemd and fstab conventions pass them: {} and every x-* option. Any other \
         option is refused with one line on stderr and exit status 2 (with -s it is ignored instead); a mount \
         that fails exits 1.\n\n\
         Example /etc/fstab line:\n  leasefs /run/leases fuse.leasefs nofail,state_dir=/var/lib/leasefs/run-leases 0 0",
        valued.join("\n"),
        flags.join("\n"),
        IGNORED.join(", "),
    );
    clap::Command::new("mount.fuse.leasefs")
        .about("mount helper for leasefs filesystems (fstab type fuse.leasefs)")
        .long_about(about)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .arg(Arg::new("SOURCE").required(true).help("the mount's source name, shown by findmnt (e.g. leasefs)"))
        .arg(Arg::new("DIR").required(true).help("the mount point"))
        .arg(Arg::new("sloppy").short('s').action(ArgAction::SetTrue).help("ignore unknown options"))
        .arg(Arg::new("foreground").short('f').action(ArgAction::SetTrue).help("keep the daemon in the foreground"))
        .arg(Arg::new("no-mtab").short('n').action(ArgAction::SetTrue).help("accepted; there is no mtab to write"))
        .arg(Arg::new("verbose").short('v').action(ArgAction::SetTrue).help("print the leasefs mount command run"))
        .arg(
            Arg::new("options").short('o').value_name("OPTS").action(ArgAction::Append).help("comma-separated options"),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(line: &str) -> Result<Vec<String>, String> {
        let argv: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
        parse(&argv).map(|h| h.args.iter().map(|a| a.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn fstab_options_map_to_mount_flags_and_mount_noise_is_ignored() {
        let got = run("leases /run/leases -n -o rw,nosuid,nodev,_netdev,nofail,x-systemd.automount,state_dir=/var/lib/l,lease_ttl=30s,private_access,volatile").unwrap();
        assert_eq!(
            got,
            [
                "mount",
                "/run/leases",
                "--source",
                "leases",
                "--state-dir",
                "/var/lib/l",
                "--lease-ttl",
                "30s",
                "--private",
                "--volatile"
            ]
        );
        assert_eq!(
            run("s /d -f -oallow_other").unwrap(),
            ["mount", "/d", "--source", "s", "--foreground", "--allow-other"]
        );
        assert_eq!(
            run("s /d -o nr_inodes=5000,kernel_inodes=4096").unwrap(),
            ["mount", "/d", "--source", "s", "--max-inodes", "5000", "--kernel-inodes", "4096"]
        );
    }

    #[test]
    fn etcd_members_are_one_option_each() {
        let got =
            run("l /d -o etcd=http://a:2379,etcd=http://b:2379,etcd_prefix=p,host_ttl=5s,etcd_copy_lag=off").unwrap();
        assert_eq!(
            got,
            [
                "mount",
                "/d",
                "--source",
                "l",
                "--etcd-prefix",
                "p",
                "--host-ttl",
                "5s",
                "--etcd-copy-lag",
                "off",
                "--etcd",
                "http://a:2379,http://b:2379"
            ]
        );
        assert!(run("l /d -o etcd=").is_err());
    }

    #[test]
    fn unknown_options_are_refused_in_one_line_unless_sloppy() {
        let e = run("s /d -o ro").unwrap_err();
        assert!(e.contains("\"ro\"") && !e.contains('\n'), "{e}");
        assert!(run("s /d -s -o ro,volatile").unwrap().contains(&"--volatile".to_string()));
        assert!(run("s /d -o state_dir").unwrap_err().contains("needs a value"));
        assert!(run("s /d -o volatile=1").unwrap_err().contains("unknown mount option"));
        assert!(run("/d").unwrap_err().contains("SOURCE DIR"));
        assert!(run("s /d -x").unwrap_err().contains("-x"));
    }

    #[test]
    fn the_manual_page_names_every_option_the_helper_takes() {
        let mut page = Vec::new();
        clap_mangen::Man::new(command()).section("8").render(&mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        for k in VALUED.iter().map(|(k, _)| *k).chain(FLAGS.iter().map(|(k, _)| *k)).chain(IGNORED) {
            // roff escapes '-' and '_' is plain; match on the option name.
            assert!(page.contains(k), "the manual page lacks {k}");
        }
        assert!(page.contains(".TH mount.fuse.leasefs 8"), "{}", &page[..200]);
    }
}
