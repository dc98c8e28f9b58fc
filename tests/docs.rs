//! The documentation: every relative link in README.md and docs/ resolves,
//! and the command-line synopsis in docs/reference.md names exactly the
//! options `--help` lists (by their short or long name), subcommand by
//! subcommand.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use crate::util::{leasefs_bin, run_timeout, STEP};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    pages.sort();
    pages
}

/// The targets of the markdown links `[text](target)` in `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap();
            let at = page.parent().unwrap().join(file);
            checked += 1;
            if !at.exists() {
                broken.push(format!("{}: {target}", page.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(checked >= 10, "only {checked} relative links found: is the parser broken?");
    assert!(broken.is_empty(), "links that do not resolve:\n{}", broken.join("\n"));
}

/// The options named in `text`: `--long` and `-s` words.
fn options(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| {
            (w.starts_with("--") && w.len() > 2 && w.as_bytes()[2].is_ascii_alphabetic())
                || (w.len() == 2 && w.starts_with('-') && w.as_bytes()[1].is_ascii_alphabetic())
        })
        .map(str::to_string)
        .collect()
}

/// `leasefs SUB --help`'s options, each as its names (`-s`, `--shared`).
fn help_options(sub: &str) -> Vec<BTreeSet<String>> {
    let o = run_timeout(Command::new(leasefs_bin()).args(sub.split(' ')).arg("--help"), STEP);
    assert!(o.status.success(), "leasefs {sub} --help: {o:?}");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let after = text.split("\nOptions:\n").nth(1).unwrap_or_else(|| panic!("{sub} --help has no options:\n{text}"));
    after
        .lines()
        // An option's line starts with its names; its help is indented further.
        .filter(|l| l.starts_with("  -") || l.starts_with("      --"))
        .map(|l| options(l.split('<').next().unwrap()))
        .filter(|names| !names.contains("--help") && !names.contains("--version"))
        .collect()
}

#[test]
fn the_command_line_reference_names_exactly_the_options_of_each_subcommand() {
    let reference = std::fs::read_to_string(root().join("docs/reference.md")).unwrap();
    let block = reference.split("## Command line\n\n```\n").nth(1).unwrap().split("```").next().unwrap();
    // Each synopsis: a `leasefs SUB` line and the lines indented under it.
    let mut synopses: Vec<(String, String)> = Vec::new();
    for line in block.lines() {
        if let Some(rest) = line.strip_prefix("leasefs ") {
            // `fault add`: a subcommand's own subcommands are lower-case words.
            let sub = rest
                .split_whitespace()
                .take_while(|w| w.chars().all(|c| c.is_ascii_lowercase()))
                .collect::<Vec<_>>()
                .join(" ");
            synopses.push((sub, rest.to_string()));
        } else if line.starts_with(' ') {
            if let Some((_, text)) = synopses.last_mut() {
                text.push_str(line);
            }
        } else {
            synopses.push((String::new(), String::new()));
        }
    }
    let synopses: Vec<(String, String)> = synopses.into_iter().filter(|(s, _)| !s.is_empty()).collect();
    assert!(synopses.len() >= 10, "{synopses:?}");
    let top = run_timeout(Command::new(leasefs_bin()).arg("--help"), STEP);
    let listed: BTreeSet<String> = String::from_utf8_lossy(&top.stdout)
        .split("\nCommands:\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    let documented: BTreeSet<String> =
        synopses.iter().map(|(s, _)| s.split(' ').next().unwrap_or_default().to_string()).collect();
    assert_eq!(documented, listed, "subcommands in docs/reference.md against `leasefs --help`");
    let mut wrong = Vec::new();
    for (sub, synopsis) in &synopses {
        let named = options(synopsis);
        let help = help_options(sub);
        for names in &help {
            if names.is_disjoint(&named) {
                wrong.push(format!("{sub}: {names:?} is in --help, not in the reference"));
            }
        }
        for n in &named {
            if !help.iter().any(|names| names.contains(n)) {
                wrong.push(format!("{sub}: {n} is in the reference, not in --help"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
