//! Permission checks made by the daemon. A single-host mount leaves them to
//! the kernel (`default_permissions`), which checks against the attributes
//! it holds. On a shared namespace (`--etcd`) the kernel may cache no
//! attributes, so with `default_permissions` it would ask for the
//! attributes of every directory on every path it walks and of every
//! directory it writes in. There the mount goes without `default_permissions` and
//! the daemon applies the kernel's rules itself, on the same caught-up state
//! the operation reads: `generic_permission` for search, read and write
//! (no ACLs), `may_delete` and `may_create` for names, `setattr_prepare` for
//! chmod, chown and times, `xattr_permission` for `user.*`. Root stands for
//! `CAP_DAC_OVERRIDE`, `CAP_FOWNER` and `CAP_CHOWN`; supplementary groups
//! come from `/proc`.
//!
//! What the daemon cannot check: opening a FIFO, socket or device node (the
//! kernel opens those without asking the filesystem), so on a shared mount
//! their permission bits do not restrict opening them.

use super::*;

/// Read permission.
pub(super) const R: u8 = 4;
/// Write permission.
pub(super) const W: u8 = 2;
/// Search (directories) or execute permission.
pub(super) const X: u8 = 1;

/// `generic_permission` without ACLs: whether `caller` may `want` (R, W, X
/// bits) on a file with `a`'s owner, group and mode.
pub(super) fn permitted(a: &Attr, caller: Caller, want: u8) -> bool {
    if caller.uid == 0 {
        // Read and write always; execute a file only when some x bit is set.
        return want & X == 0 || a.kind == Kind::Dir || a.perm & 0o111 != 0;
    }
    let class = if caller.uid == a.uid {
        a.perm >> 6
    } else if in_group(caller.pid, caller.gid, a.gid) {
        a.perm >> 3
    } else {
        a.perm
    };
    (class as u8 & 7) & want == want
}

/// The owner, or root (`inode_owner_or_capable`).
pub(super) fn owns(a: &Attr, caller: Caller) -> bool {
    caller.uid == 0 || caller.uid == a.uid
}

/// `R`/`W` an `open` with `flags` needs (`O_TRUNC` writes; an `execve`
/// reads and executes).
pub(super) fn wanted_by_open(flags: i32) -> u8 {
    let mut want = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => R,
        libc::O_WRONLY => W,
        _ => R | W,
    };
    if flags & libc::O_TRUNC != 0 {
        want |= W;
    }
    // __FMODE_EXEC, as the kernel passes it in an execve's open flags.
    if flags & 0x20 != 0 {
        want |= X;
    }
    want
}

impl State {
    /// `want` on `ino` for `caller` (`EACCES`), when the daemon checks
    /// permissions.
    pub(super) fn permit(&self, caller: Caller, ino: Ino, want: u8) -> Result<()> {
        if !self.mount.checks_access {
            return Ok(());
        }
        let a = self.ns.get(ino)?.attr();
        if permitted(&a, caller, want) {
            Ok(())
        } else {
            debug!(
                ino = ino.0,
                uid = caller.uid,
                gid = caller.gid,
                pid = caller.pid,
                owner = a.uid,
                group = a.gid,
                mode = format_args!("{:o}", a.perm),
                want,
                "permission denied"
            );
            Err(Error::Access)
        }
    }

    /// `may_delete`: removing the name of `victim` from `dir` needs write
    /// and search on the directory (`EACCES`), and in a sticky directory
    /// ownership of the directory or of the victim (`EPERM`).
    pub(super) fn permit_removal(&self, caller: Caller, dir: Ino, victim: Ino) -> Result<()> {
        if !self.mount.checks_access {
            return Ok(());
        }
        self.permit(caller, dir, W | X)?;
        let d = self.ns.get(dir)?;
        let sticky = d.perm & libc::S_ISVTX as u16 != 0;
        if sticky && caller.uid != 0 && caller.uid != d.uid && self.ns.get(victim)?.uid != caller.uid {
            return Err(Error::NotPermitted);
        }
        Ok(())
    }

    /// A rename's checks (`vfs_rename`): the source's removal, the
    /// target's removal or the new name's creation, and write permission
    /// on a directory that moves to another parent (its `..` changes), or
    /// on an exchanged one. What the kernel finds before (a missing source
    /// or exchange target, an existing target of `RENAME_NOREPLACE`) is
    /// left to the rename to answer.
    pub(super) fn permit_rename(
        &self,
        caller: Caller,
        (dir, name): (Ino, &OsStr),
        (newdir, newname): (Ino, &OsStr),
        flags: u32,
    ) -> Result<()> {
        if !self.mount.checks_access {
            return Ok(());
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        let Ok(source) = self.ns.child(dir, name) else { return Ok(()) };
        let target = self.ns.child(newdir, newname).ok();
        if target.is_none() && exchange || target.is_some() && flags & RENAME_NOREPLACE != 0 {
            return Ok(());
        }
        self.permit_removal(caller, dir, source)?;
        match target {
            Some(t) => self.permit_removal(caller, newdir, t)?,
            None => self.permit(caller, newdir, W | X)?,
        }
        if dir != newdir {
            if self.ns.get(source)?.kind == Kind::Dir {
                self.permit(caller, source, W)?;
            }
            if let Some(t) = target.filter(|_| exchange) {
                if self.ns.get(t)?.kind == Kind::Dir {
                    self.permit(caller, t, W)?;
                }
            }
        }
        Ok(())
    }

    /// `setattr_prepare` and the write check of `truncate` and of
    /// `utimensat` to the current time: chmod and explicit times by the
    /// owner or root (`EPERM`), chown by root, chgrp by the owner to one of
    /// its groups, truncating by path with write permission, touching with
    /// ownership or write permission (`EACCES`). Returns the mode to set:
    /// the setgid bit goes when a caller outside the file's group and not
    /// root sets it.
    pub(super) fn permit_setattr(&self, caller: Caller, ino: Ino, set: &SetAttr) -> Result<Option<u32>> {
        if set.asks_nothing() {
            self.permit_dropping_set_id(caller, ino)?;
        }
        if !self.mount.checks_access {
            return Ok(set.mode);
        }
        let a = self.ns.get(ino)?.attr();
        if let Some(uid) = set.uid {
            if caller.uid != 0 && !(uid == a.uid && caller.uid == a.uid) {
                return Err(Error::NotPermitted);
            }
        }
        if let Some(gid) = set.gid {
            let own = caller.uid == a.uid && set.uid.is_none_or(|u| u == a.uid);
            if caller.uid != 0 && !(own && (gid == a.gid || in_group(caller.pid, caller.gid, gid))) {
                return Err(Error::NotPermitted);
            }
        }
        let mut mode = set.mode;
        if let Some(m) = mode {
            if !owns(&a, caller) {
                return Err(Error::NotPermitted);
            }
            let gid = set.gid.unwrap_or(a.gid);
            if caller.uid != 0 && m & libc::S_ISGID != 0 && !in_group(caller.pid, caller.gid, gid) {
                mode = Some(m & !libc::S_ISGID);
            }
        }
        let explicit = |t: &Option<SetTime>| matches!(t, Some(SetTime::At(_)));
        if explicit(&set.atime) || explicit(&set.mtime) {
            if !owns(&a, caller) {
                return Err(Error::NotPermitted);
            }
        } else if (set.atime.is_some() || set.mtime.is_some()) && !owns(&a, caller) {
            self.permit(caller, ino, W)?;
        }
        if set.size.is_some() && set.handle.is_none() {
            self.permit(caller, ino, W)?;
        }
        Ok(mode)
    }

    /// A `SETATTR` with nothing to set asks to drop suid/sgid (see
    /// [`SetAttr::asks_nothing`]). As `chown(f, -1, -1)` by someone else
    /// it is refused once there are bits to drop (the kernel's
    /// `setattr_prepare` would see a mode change); before a writer's
    /// `fallocate` it is not: that writer has the file open and may write
    /// it. The kernel cannot check this itself, even with
    /// `default_permissions`: it no longer sends the mode change.
    fn permit_dropping_set_id(&self, caller: Caller, ino: Ino) -> Result<()> {
        let i = self.ns.get(ino)?;
        let a = i.attr();
        if a.kind == Kind::Dir || owns(&a, caller) || after_chown(a.perm, a.gid, caller) == a.perm {
            return Ok(());
        }
        if i.opens > 0 && permitted(&a, caller, W) {
            Ok(())
        } else {
            Err(Error::NotPermitted)
        }
    }

    /// `may_linkat` with `fs.protected_hardlinks` (on by default): a caller
    /// that neither owns `ino` nor is root may link it only when it may
    /// read and write it (`EPERM`); the kernel checks the rest (a regular
    /// file, not setuid, not setgid-executable).
    pub(super) fn permit_hardlink(&self, caller: Caller, ino: Ino) -> Result<()> {
        if !self.mount.checks_access {
            return Ok(());
        }
        let a = self.ns.get(ino)?.attr();
        if owns(&a, caller) || permitted(&a, caller, R | W) {
            return Ok(());
        }
        let protected = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks").map_or(true, |s| s.trim() != "0");
        if protected {
            Err(Error::NotPermitted)
        } else {
            Ok(())
        }
    }

    /// `xattr_permission` for the `user.` namespace: reading needs read
    /// permission, changing needs write permission; only regular files and
    /// directories carry them (`ENODATA` to read, `EPERM` to write), and in
    /// a sticky directory only its owner changes them.
    pub(super) fn permit_xattr(&self, caller: Caller, ino: Ino, name: &OsStr, write: bool) -> Result<()> {
        if !self.mount.checks_access || !name.as_encoded_bytes().starts_with(b"user.") {
            return Ok(());
        }
        let a = self.ns.get(ino)?.attr();
        if !matches!(a.kind, Kind::File | Kind::Dir) {
            return Err(if write { Error::NotPermitted } else { Error::NoAttr });
        }
        if write && a.kind == Kind::Dir && a.perm & libc::S_ISVTX as u16 != 0 && !owns(&a, caller) {
            return Err(Error::NotPermitted);
        }
        self.permit(caller, ino, if write { W } else { R })
    }
}

impl Fs {
    /// `access(2)` and `chdir(2)` on a mount where the daemon checks
    /// permissions (the kernel asks only there): `mask` of `R_OK`, `W_OK`,
    /// `X_OK` (0: the file exists).
    pub fn access(&self, ino: Ino, mask: i32, caller: Caller) -> Result<()> {
        if control::is_control(ino) {
            return Ok(());
        }
        let st = if ino == Ino::ROOT { self.fresh_root()? } else { self.fresh(&[ino])? };
        st.ns.get(ino)?;
        let want = (mask & (libc::R_OK | libc::W_OK | libc::X_OK)) as u8;
        if want == 0 {
            return Ok(());
        }
        let a = st.ns.get(ino)?.attr();
        if permitted(&a, caller, want) {
            Ok(())
        } else {
            Err(Error::Access)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: Kind, perm: u16, uid: u32, gid: u32) -> Attr {
        Attr { kind, perm, uid, gid, ..Attr::absent() }
    }

    const ME: Caller = Caller { uid: 1000, gid: 1000, pid: 0 };

    #[test]
    fn the_owner_group_and_other_classes_decide_and_root_needs_an_x_bit_to_execute() {
        let f = attr(Kind::File, 0o640, 1000, 50);
        assert!(permitted(&f, ME, R | W));
        assert!(!permitted(&f, ME, X));
        let other = Caller { uid: 2000, gid: 2000, pid: 0 };
        assert!(!permitted(&f, other, R));
        let member = Caller { uid: 2000, gid: 50, pid: 0 };
        assert!(permitted(&f, member, R));
        assert!(!permitted(&f, member, W));
        // The owner's class applies even when it grants less than the others'.
        let g = attr(Kind::File, 0o077, 1000, 1000);
        assert!(!permitted(&g, ME, R));
        assert!(permitted(&f, Caller::ROOT, R | W));
        assert!(!permitted(&f, Caller::ROOT, X));
        assert!(permitted(&attr(Kind::File, 0o001, 5, 5), Caller::ROOT, X));
        assert!(permitted(&attr(Kind::Dir, 0o000, 5, 5), Caller::ROOT, R | W | X));
    }

    #[test]
    fn open_flags_ask_for_read_write_and_truncate_writes() {
        assert_eq!(wanted_by_open(libc::O_RDONLY), R);
        assert_eq!(wanted_by_open(libc::O_WRONLY), W);
        assert_eq!(wanted_by_open(libc::O_RDWR), R | W);
        assert_eq!(wanted_by_open(libc::O_RDONLY | libc::O_TRUNC), R | W);
        assert_eq!(wanted_by_open(libc::O_RDONLY | 0x20), R | X);
    }
}
