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
const VALUED: [(&str, &str); 6] = [
    ("metrics_addr", "--metrics-addr"),
    ("state_dir", "--state-dir"),
    ("lease_ttl", "--lease-ttl"),
    ("log_file", "--log-file"),
    ("ready_timeout", "--ready-timeout"),
    ("source", "--source"),
];

/// Flags, and the `leasefs mount` flag each becomes. mount(8) takes
/// `private` for itself (mount propagation) and never passes it on, so
/// fstab lines say `private_access`.
const FLAGS: [(&str, &str); 5] = [
    ("volatile", "--volatile"),
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
    for o in opts.iter().filter(|o| !o.is_empty()) {
        let (key, value) = match o.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (o.as_str(), None),
        };
        if IGNORED.contains(&key) || key.starts_with("x-") {
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
                "unknown mount option {o:?} (known: state_dir=, lease_ttl=, log_file=, ready_timeout=, metrics_addr=, volatile, \
                 private_access, allow_other, nonempty)"
            ));
        }
    }
    Ok(Helper { args, verbose })
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
}
