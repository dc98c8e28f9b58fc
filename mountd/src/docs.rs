//! Man pages and shell completions, generated from the command line's own
//! definition (`leasefs generate-docs DIR`), so they never drift from
//! `--help`.

use std::path::Path;

use clap::Command;

/// Write `DIR/man/leasefs.1`, one `leasefs-SUBCOMMAND.1` per subcommand,
/// `mount.fuse.leasefs.8` for the mount helper,
/// and `DIR/completions/` for bash, zsh and fish.
pub fn generate(cmd: Command, out: &Path) -> std::io::Result<()> {
    let man = out.join("man");
    std::fs::create_dir_all(&man)?;
    write_man(cmd.clone(), &man.join("leasefs.1"))?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("leasefs-{}", sub.get_name());
        write_man(
            sub.clone().name(name.clone()).bin_name(format!("leasefs {}", sub.get_name())),
            &man.join(format!("{name}.1")),
        )?;
    }
    let mut page = Vec::new();
    clap_mangen::Man::new(crate::helper::command()).section("8").render(&mut page)?;
    std::fs::write(man.join("mount.fuse.leasefs.8"), page)?;
    let completions = out.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd.clone(), "leasefs", &completions)?;
    }
    Ok(())
}

fn write_man(cmd: Command, path: &Path) -> std::io::Result<()> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut buf)?;
    std::fs::write(path, buf)
}
