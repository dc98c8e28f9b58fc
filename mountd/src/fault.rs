//! `leasefs fault`: the test bench's rules on a live mount (SPEC 13),
//! through `.leasefs/faults`.

use std::process::ExitCode;

use leasefs::bench::guard::Refused;
use leasefs::bench::RuleSpec;

use crate::cli::{FaultAddArgs, FaultCmd};
use crate::show::{control_file, table};

/// Write `line` to `.leasefs/faults` and read back the daemon's answer.
fn send(mountpoint: &std::path::Path, line: &str) -> Result<serde_json::Value, String> {
    let p = control_file(mountpoint, "faults")?;
    leasefs::bench::guard::send(&p, line).map_err(|e| match e {
        Refused::Io(e) if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) => {
            "only root (or, on a private mount, the user who mounted it) may set faults".into()
        }
        Refused::Io(e) => format!("{}: {e}", p.display()),
        Refused::Reason(why) => why,
    })
}

fn spec(a: &FaultAddArgs) -> Result<RuleSpec, String> {
    let ms = |v: &Option<String>| -> Result<Option<u64>, String> {
        v.as_deref()
            .map(|d| leasefs::fs::parse_ttl(d).map(|t| t.unwrap_or(0)).map_err(|_| format!("not a duration: {d:?}")))
            .transpose()
    };
    let spec = RuleSpec {
        op: a.op.iter().flat_map(|o| o.split(',')).filter(|o| !o.is_empty()).map(str::to_string).collect(),
        path: a.path.clone(),
        pid: a.pid,
        uid: a.uid,
        comm: a.comm.clone(),
        cgroup: a.cgroup.clone(),
        probability: a.probability,
        seed: a.seed,
        after: a.after,
        count: a.count,
        errno: a.errno.clone(),
        delay_ms: ms(&a.delay)?,
        hang: a.hang,
        short: a.short,
        lose_lease: a.lose_lease,
        crash: a.crash,
        ..RuleSpec::default()
    };
    // The daemon checks again; this gives the reason without a round trip.
    leasefs::bench::Rules::check(&spec)?;
    Ok(spec)
}

fn action(r: &RuleSpec) -> String {
    match (&r.errno, r.delay_ms, r.short) {
        (Some(e), Some(d), _) => format!("errno {e} after {d}ms"),
        (Some(e), None, _) => format!("errno {e}"),
        (None, Some(d), _) => format!("delay {d}ms"),
        (None, None, Some(n)) => format!("short {n}"),
        _ if r.hang => "hang".into(),
        _ if r.crash => "crash".into(),
        _ => "lose-lease".into(),
    }
}

fn list(mountpoint: &std::path::Path, json: bool) -> Result<(), String> {
    let text = crate::show::read_control(mountpoint, "faults")?;
    if json {
        print!("{text}");
        return Ok(());
    }
    let mut rows =
        vec![["ID", "OP", "PATH", "CALLER", "WHEN", "ACTION", "MATCHES", "FIRED"].map(String::from).to_vec()];
    for line in text.lines() {
        let r: RuleSpec = serde_json::from_str(line).map_err(|e| format!("{line}: {e}"))?;
        let who: Vec<String> = [
            r.pid.map(|p| format!("pid {p}")),
            r.uid.map(|u| format!("uid {u}")),
            r.comm.as_ref().map(|c| format!("comm {c}")),
            r.cgroup.as_ref().map(|c| format!("cgroup {c}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let when: Vec<String> = [
            r.probability.map(|p| format!("p={p} seed={}", r.seed.unwrap_or(0))),
            r.after.map(|n| format!("after {n}")),
            r.count.map(|n| format!("count {n}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let dash = |v: Vec<String>, sep: &str| if v.is_empty() { "-".to_string() } else { v.join(sep) };
        rows.push(vec![
            r.id.unwrap_or(0).to_string(),
            dash(r.op.clone(), ","),
            r.path.clone().unwrap_or_else(|| "-".into()),
            dash(who, " "),
            dash(when, " "),
            action(&r),
            r.matches.unwrap_or(0).to_string(),
            r.fired.unwrap_or(0).to_string(),
        ]);
    }
    print!("{}", table(&rows));
    Ok(())
}

/// `leasefs crash`: cut the power, print what was lost.
pub(crate) fn crash(mountpoint: &std::path::Path, kill: bool, report: bool) -> ExitCode {
    let line = serde_json::json!({ "crash": { "kill": kill } }).to_string();
    match send(mountpoint, &line) {
        Ok(answer) => {
            let r = &answer["crash"];
            if report {
                println!("{r}");
            } else {
                let n = |k: &str| r[k].as_array().map_or(0, Vec::len);
                println!(
                    "power cut: {} files and {} names went back to what was synced, {} inodes gone, {} descriptors dead",
                    n("files"),
                    n("names"),
                    r["gone"],
                    r["descriptors"]
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("leasefs crash: {e}");
            ExitCode::FAILURE
        }
    }
}

pub(crate) fn fault(cmd: &FaultCmd) -> ExitCode {
    let done = match cmd {
        FaultCmd::Add(a) => spec(a).and_then(|s| {
            let line = serde_json::to_string(&s).map_err(|e| e.to_string())?;
            let answer = send(&a.mountpoint, &line)?;
            let id = answer["id"].as_u64().ok_or_else(|| format!("the mount answered {answer}, not a rule id"))?;
            println!("{id}");
            Ok(())
        }),
        FaultCmd::List { mountpoint, json } => list(mountpoint, *json),
        FaultCmd::Del { mountpoint, id } => send(mountpoint, &format!("{{\"del\":{id}}}")).map(|_| ()),
        FaultCmd::Clear { mountpoint } => send(mountpoint, "{\"clear\":true}").map(|_| ()),
        FaultCmd::Release { mountpoint, id } => {
            let what = id.map_or("\"all\"".to_string(), |i| i.to_string());
            send(mountpoint, &format!("{{\"release\":{what}}}")).map(|a| println!("{}", a["released"]))
        }
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasefs fault: {e}");
            ExitCode::FAILURE
        }
    }
}
