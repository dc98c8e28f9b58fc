//! Operations on names: lookup, create (with the lease rules for `O_EXCL`
//! and re-attaching a live lease after unlink), link, unlink and rename
//! (compare-and-swap, rename over a live lease, `EBUSY` for moving one).

use super::*;

impl Fs {
    /// Resolve `name` in `parent` for thread `tid` and take a kernel
    /// reference on it; false when the kernel must not keep the entry (the
    /// source of a pending rename over a live lease, a file younger than
    /// `YOUNG`). Every entry of a file the kernel may keep is recorded.
    pub fn lookup(&self, parent: Ino, name: &OsStr, caller: Caller) -> Result<(Attr, bool)> {
        if let Some(a) = self.control_lookup(parent, name)? {
            return Ok((a, true));
        }
        let out = self.lookup_name(parent, name, caller);
        if self.reads_a_copy() {
            let mut st = self.state.lock();
            if !st.sharing.retrying.is_empty() {
                st.sharing.retrying.looked_up_by(caller.pid, out.as_ref().ok().map(|(a, _)| (a.ino, a.kind)));
            }
        }
        out
    }

    /// [`Fs::lookup`] of a name that is not a control file's.
    fn lookup_name(&self, parent: Ino, name: &OsStr, caller: Caller) -> Result<(Attr, bool)> {
        let mut st = self.fresh_name(parent, name, false)?;
        st.permit(caller, parent, access::X)?;
        // Whether the caller is making this very name, and how.
        let making_it = |st: &State| {
            let path = st.ns.dir_path(parent).map(|d| {
                let mut p = st.mount.point.clone();
                p.extend(d);
                p.join(name)
            })?;
            crate::procfs::making(caller.pid).filter(|(p, _)| *p == path).map(|(_, how)| how)
        };
        let ino = match st.ns.child(parent, name) {
            // A name the copy has, looked up by a call that fails when it
            // exists (`O_CREAT|O_EXCL`, `mkdir`, `mknod`, `symlink`,
            // `link`, `RENAME_NOREPLACE`: the kernel asks again for them):
            // confirmed with the store, or the call would fail with
            // `EEXIST` for a name another host removed before it began
            // (SPEC 10).
            Ok(_) if self.reads_a_copy() && making_it(&st).is_some_and(|how| how != crate::procfs::Making::Open) => {
                drop(st);
                self.state.lock().sharing.confirmed_existing += 1;
                st = self.fresh_name(parent, name, true)?;
                st.permit(caller, parent, access::X)?;
                st.ns.child(parent, name)?
            }
            // A name the copy lacks is confirmed with the store before
            // ENOENT (SPEC 10): another host may have just made it.
            Err(Error::NotFound) if self.reads_a_copy() => {
                let creating = making_it(&st).is_some_and(|how| how != crate::procfs::Making::Link);
                drop(st);
                // Unless the caller is making this very name (the last
                // part of an `O_CREAT` open, a `mkdir`, `mknod` or
                // `symlink`): the kernel's `CREATE`, `MKDIR`, `MKNOD` or
                // `SYMLINK` follows, and its transaction compares that the
                // name is absent; when another host made it meanwhile, it
                // answers `EEXIST` (a create without `O_EXCL`: `ESTALE`,
                // and the kernel walks again). The caller is never
                // answered this `ENOENT`.
                if creating {
                    self.state.lock().sharing.unconfirmed_creates += 1;
                    return Err(Error::NotFound);
                }
                st = self.fresh_name(parent, name, true)?;
                st.permit(caller, parent, access::X)?;
                st.ns.child(parent, name)?
            }
            r => r?,
        };
        st.referenced(ino);
        st.named(ino);
        let mut keep = !st.cache.pending_renames.looked_up(parent, name, caller.pid);
        if st.mount.checks_access {
            // The kernel does not check search permission on the walk (the
            // daemon does, at each lookup): it may keep a name only where
            // everyone may search the directory.
            keep &= st.ns.get(parent)?.attr().perm & 0o111 == 0o111;
        }
        let a = st.ns.get(ino)?.attr();
        if keep && st.cache.names_cached && a.kind != Kind::Dir {
            keep = SystemTime::now().duration_since(a.crtime).is_ok_and(|age| age >= YOUNG);
            if keep {
                st.cache.entry_deadlines.given(ino, Instant::now());
            }
        }
        Ok((a, keep))
    }

    /// Drop `n` kernel references.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut st = self.state.lock();
        st.ns.forget(ino, n);
        // A forgotten inode's pages went with it.
        if st.ns.get(ino).map_or(true, |i| i.lookups == 0) {
            st.cache.paged.remove(&ino);
            st.unnamed(ino);
        }
        st.collect(ino);
    }

    /// Target of a symlink.
    pub fn readlink(&self, ino: Ino) -> Result<OsString> {
        match &self.fresh(&[ino])?.ns.get(ino)?.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(Error::Invalid),
        }
    }

    #[allow(clippy::too_many_arguments)] // the arguments of mknod/mkdir/symlink/create, passed on
    pub(super) fn make(
        st: &mut State,
        caller: Caller,
        parent: Ino,
        name: &OsStr,
        kind: Kind,
        perm: u32,
        rdev: u32,
        symlink: Option<OsString>,
    ) -> Result<Attr> {
        check_name(name)?;
        refuse_control_name(parent, name)?;
        let now = now();
        let p = st.ns.get(parent)?;
        if p.nlink == 0 {
            // A removed directory accepts no new entries.
            return Err(Error::NotFound);
        }
        if p.dir()?.get(name).is_some() {
            return Err(Error::Exists);
        }
        st.permit(caller, parent, access::W | access::X)?;
        let p = st.ns.get(parent)?;
        let mut perm = (perm & 0o7777) as u16;
        let mut gid = caller.gid;
        // A setgid directory hands its group down, and its setgid bit to subdirectories.
        if p.perm & libc::S_ISGID as u16 != 0 {
            gid = p.gid;
            if kind == Kind::Dir {
                perm |= libc::S_ISGID as u16;
            }
        }
        let path = st.path_of(parent, name);
        if kind == Kind::File {
            // A live lease whose name was removed comes back with its inode,
            // holders, waiters and epoch (SPEC 4), also while other hard
            // links still name it. Without other names its content starts
            // empty like any newly created file; with them it keeps the
            // content those names still show.
            if let Some(ino) = path.as_ref().and_then(|p| st.lease.table_mut().take_detached(p)) {
                if st.lease.is_live(ino) && st.ns.get(ino).is_ok_and(|i| i.kind == Kind::File) {
                    let orphan = st.ns.get(ino)?.nlink == 0;
                    st.ns.link(parent, name, ino)?;
                    st.referenced(ino);
                    if orphan {
                        st.ns.account(ino, |i| i.data_mut()?.truncate(0))?;
                    }
                    let i = st.ns.get_mut(ino)?;
                    i.change_content(now);
                    st.ns.get_mut(parent)?.touch_content(now);
                    st.repoint(ino);
                    return Ok(st.ns.get(ino)?.attr());
                }
            }
        }
        st.room_for_inode(caller.uid)?;
        let ino = st.ns.alloc(NewInode { kind, perm, uid: caller.uid, gid, rdev, symlink }, parent, now);
        st.ns.link(parent, name, ino)?;
        st.referenced(ino);
        st.floor_epoch(path.as_ref(), ino);
        if let Some(old) = path.as_ref().and_then(|p| st.lease.table_mut().views().take_removed(p)) {
            // The name points at something new: whoever looked at the old
            // target has a stale view.
            st.succeed(old, ino);
        }
        st.ns.get_mut(parent)?.touch_content(now);
        Ok(st.ns.get(ino)?.attr())
    }

    /// `mknod`: regular files, FIFOs, sockets and (inert) device nodes.
    pub fn mknod(&self, caller: Caller, parent: Ino, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> Result<Attr> {
        let kind = Kind::from_mode(mode).ok_or(Error::Invalid)?;
        if matches!(kind, Kind::Dir | Kind::Symlink) {
            return Err(Error::Invalid);
        }
        self.change(|st| Self::make(st, caller, parent, name, kind, mode & !umask, rdev, None))
    }

    /// `mkdir`.
    pub fn mkdir(&self, caller: Caller, parent: Ino, name: &OsStr, mode: u32, umask: u32) -> Result<Attr> {
        self.change(|st| Self::make(st, caller, parent, name, Kind::Dir, mode & !umask & 0o7777, 0, None))
    }

    /// `symlink`.
    pub fn symlink(&self, caller: Caller, parent: Ino, name: &OsStr, target: &OsStr) -> Result<Attr> {
        if target.len() >= libc::PATH_MAX as usize {
            return Err(Error::NameTooLong);
        }
        self.change(|st| Self::make(st, caller, parent, name, Kind::Symlink, 0o777, 0, Some(target.to_os_string())))
    }

    /// `create`: make a regular file and open it.
    pub fn create(
        &self,
        caller: Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(Attr, Handle)> {
        self.change(|st| {
            let attr = match Self::make(st, caller, parent, name, Kind::File, mode & !umask, 0, None) {
                Ok(a) => {
                    // O_CREAT|O_EXCL that creates the file acquires the lease (the
                    // lockfile idiom). A re-attached live lease keeps its holder.
                    if flags & libc::O_EXCL != 0 && !st.lease.is_live(a.ino) {
                        let acquired = st.reserve(a.ino).and_then(|()| {
                            st.name_lease(a.ino);
                            st.lease.acquire_by_create(a.ino)
                        });
                        if let Err(e) = acquired {
                            // No file without its epoch: the name goes, and
                            // the inode with it (the kernel never saw it).
                            let _ = st.ns.unlink(parent, name);
                            st.ns.forget(a.ino, 1);
                            st.collect(a.ino);
                            return Err(e);
                        }
                    }
                    a
                }
                Err(Error::Exists) if flags & libc::O_EXCL == 0 => {
                    // The kernel raced with another creator: open the existing file.
                    let ino = st.ns.child(parent, name)?;
                    if self.reads_a_copy() {
                        // Another host made it after this host's kernel
                        // was told it was absent (a lookup for a create is
                        // not confirmed): the kernel walks again
                        // (`ESTALE`) and opens what it finds as any open
                        // would (a symlink followed, `O_TRUNC` applied).
                        st.sharing.retrying.refused(caller.pid, false);
                        return Err(Error::Stale(Stale::Lookup));
                    }
                    st.permit(caller, ino, access::wanted_by_open(flags))?;
                    st.referenced(ino);
                    st.ns.get(ino)?.attr()
                }
                Err(e) => return Err(e),
            };
            let h = Self::open_locked(st, attr.ino, flags, caller.pid)?;
            st.observe(caller.pid, attr.ino);
            Ok((attr, h))
        })
    }

    /// `O_TMPFILE`: an open regular file in `parent` without a name
    /// (nlink 0) until `linkat` gives it one; dropped at its last close.
    pub fn tmpfile(&self, caller: Caller, parent: Ino, mode: u32, umask: u32, flags: i32) -> Result<(Attr, Handle)> {
        let mut st = self.state.lock();
        let p = st.ns.get(parent)?;
        if p.nlink == 0 {
            return Err(Error::NotFound);
        }
        st.permit(caller, parent, access::W | access::X)?;
        let p = st.ns.get(parent)?;
        let mut gid = caller.gid;
        if p.perm & libc::S_ISGID as u16 != 0 {
            gid = p.gid;
        }
        let perm = (mode & !umask & 0o7777) as u16;
        st.room_for_inode(caller.uid)?;
        let ino = st.ns.alloc(
            NewInode { kind: Kind::File, perm, uid: caller.uid, gid, rdev: 0, symlink: None },
            parent,
            now(),
        );
        st.referenced(ino);
        st.open.tmpfiles.insert(ino);
        let h = Self::open_locked(&mut st, ino, flags, caller.pid)?;
        st.observe(caller.pid, ino);
        Ok((st.ns.get(ino)?.attr(), h))
    }

    /// `unlink`; `ESTALE` when it acts on an old view.
    pub fn unlink(&self, parent: Ino, name: &OsStr, caller: Caller) -> Result<()> {
        let tid = caller.pid;
        refuse_control_name(parent, name)?;
        self.change(|st| {
            let ino = st.ns.child(parent, name)?;
            st.permit_removal(caller, parent, ino)?;
            if st.ns.get(ino)?.kind == Kind::Dir {
                return Err(Error::IsDir);
            }
            st.check_fenced_pid(tid, ino, "unlink")?;
            st.check_current(tid, ino, false, "unlink")?;
            let now = now();
            let path = st.path_of(parent, name);
            if let Some(p) = &path {
                st.lease.table_mut().views().name_removed(p.clone(), ino);
            }
            st.remember_epoch(path.clone(), ino);
            if st.lease.is_live(ino) {
                // The name goes (POSIX), the lease stays bound to the path.
                if let Some(p) = path {
                    st.lease.table_mut().detach(p, ino);
                }
            }
            st.ns.get_mut(ino)?.ctime = now;
            st.ns.unlink(parent, name)?;
            st.ns.get_mut(parent)?.touch_content(now);
            st.collect(ino);
            Ok(())
        })
    }

    /// `rmdir`.
    pub fn rmdir(&self, parent: Ino, name: &OsStr, caller: Caller) -> Result<()> {
        refuse_control_name(parent, name)?;
        self.change(|st| {
            if name == "." {
                return Err(Error::Invalid);
            }
            if name == ".." {
                return Err(Error::NotEmpty);
            }
            let ino = st.ns.child(parent, name)?;
            st.permit_removal(caller, parent, ino)?;
            let d = st.ns.get(ino)?.dir()?;
            if !d.is_empty() {
                return Err(Error::NotEmpty);
            }
            let now = now();
            st.ns.get_mut(ino)?.ctime = now;
            st.ns.unlink(parent, name)?;
            st.ns.get_mut(parent)?.touch_content(now);
            Ok(())
        })
    }

    /// `link`: a new name for an existing non-directory.
    pub fn link(&self, ino: Ino, parent: Ino, name: &OsStr, caller: Caller) -> Result<Attr> {
        check_name(name)?;
        refuse_control_name(parent, name)?;
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        self.change(|st| {
            let i = st.ns.get(ino)?;
            if i.kind == Kind::Dir {
                return Err(Error::NotPermitted);
            }
            if i.nlink == 0 && !st.open.tmpfiles.contains(&ino) {
                return Err(Error::NotFound);
            }
            let p = st.ns.get(parent)?;
            if p.nlink == 0 {
                return Err(Error::NotFound);
            }
            if p.dir()?.get(name).is_some() {
                return Err(Error::Exists);
            }
            st.permit(caller, parent, access::W | access::X)?;
            st.permit_hardlink(caller, ino)?;
            let now = now();
            let path = st.path_of(parent, name);
            st.ns.link(parent, name, ino)?;
            st.referenced(ino);
            st.open.tmpfiles.remove(&ino);
            st.ns.get_mut(parent)?.touch_content(now);
            // link() creating the name acquires the lease (the dotlock idiom).
            let floor = st.path_floor(path.as_ref());
            st.lease.raise_epoch(ino, floor);
            if let Err(e) = st.reserve(ino) {
                // Undo the name: the acquisition could not be made durable.
                let _ = st.ns.unlink(parent, name);
                return Err(e);
            }
            st.name_lease(ino);
            if let Err(e) = st.lease.acquire_by_link(ino, floor) {
                // The name without its epoch is not kept.
                let _ = st.ns.unlink(parent, name);
                return Err(e);
            }
            // The name now leads to `ino`: whoever looked at what it named
            // before holds a stale view (the dotlock-breaking race).
            if let Some(old) = path.as_ref().and_then(|p| st.lease.table_mut().views().take_removed(p)) {
                st.succeed(old, ino);
            }
            let i = st.ns.get_mut(ino)?;
            i.ctime = now;
            Ok(i.attr())
        })
    }

    /// `rename` / `renameat2` with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
        caller: Caller,
    ) -> Result<()> {
        let tid = caller.pid;
        check_name(name)?;
        check_name(newname)?;
        refuse_control_name(parent, name)?;
        refuse_control_name(newparent, newname)?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0
        {
            return Err(Error::Invalid);
        }
        self.change(|st| {
            st.permit_rename(caller, (parent, name), (newparent, newname), flags)?;
            let src = st.ns.child(parent, name)?;
            let dst = match st.ns.child(newparent, newname) {
                Ok(i) => Some(i),
                Err(Error::NotFound) => None,
                Err(e) => return Err(e),
            };
            let m = Move {
                from: (parent, name),
                to: (newparent, newname),
                src,
                src_dir: st.ns.get(src)?.kind == Kind::Dir,
                now: now(),
                tid,
            };
            if flags & RENAME_EXCHANGE != 0 {
                return Self::exchange(st, &m, dst.ok_or(Error::NotFound)?);
            }
            if let Some(dst) = dst {
                if flags & RENAME_NOREPLACE != 0 {
                    return Err(Error::Exists);
                }
                if dst == src {
                    // Two names of one inode: POSIX says do nothing.
                    return Ok(());
                }
                let d = st.ns.get(dst)?;
                match (m.src_dir, d.kind == Kind::Dir) {
                    (true, false) => return Err(Error::NotDir),
                    (false, true) => return Err(Error::IsDir),
                    (true, true) if !d.dir()?.is_empty() => return Err(Error::NotEmpty),
                    _ => {}
                }
            }
            if m.src_dir && st.ns.is_ancestor(src, newparent) {
                return Err(Error::Invalid);
            }
            if st.ns.get(newparent)?.nlink == 0 {
                return Err(Error::NotFound);
            }
            st.check_fenced_pid(tid, src, "rename")?;
            if st.holds_live_lease(src) {
                return Err(Error::Busy);
            }
            if let Some(dst) = dst {
                st.check_fenced_pid(tid, dst, "rename over")?;
                st.check_current(tid, dst, true, "rename over")?;
                st.name_lease(dst);
                let both_files = st.ns.get(dst)?.kind == Kind::File && st.ns.get(src)?.kind == Kind::File;
                if st.lease.held_anywhere(dst) && both_files {
                    return Self::rename_over_live_lease(st, &m, dst);
                }
            }
            Self::move_name(st, &m, dst)
        })
    }

    /// `RENAME_EXCHANGE`: the two names swap their inodes (never a live
    /// lease's: `EBUSY`).
    fn exchange(st: &mut State, m: &Move<'_>, dst: Ino) -> Result<()> {
        let ((parent, name), (newparent, newname), src) = (m.from, m.to, m.src);
        if src == dst {
            return Ok(());
        }
        // Moving a live lease would let newcomers lock a fresh file at
        // its old name (SPEC 4).
        if st.holds_live_lease(src) || st.holds_live_lease(dst) {
            return Err(Error::Busy);
        }
        let dst_dir = st.ns.get(dst)?.kind == Kind::Dir;
        // Neither may end up inside itself.
        if m.src_dir && st.ns.is_ancestor(src, newparent) || dst_dir && st.ns.is_ancestor(dst, parent) {
            return Err(Error::Invalid);
        }
        let mark = st.ns.power_mark();
        st.ns.get_mut(parent)?.dir_mut()?.insert(name.to_os_string(), dst);
        st.ns.get_mut(newparent)?.dir_mut()?.insert(newname.to_os_string(), src);
        st.ns.power_renamed((parent, name), (newparent, newname), mark);
        st.ns.hint(dst, parent, name);
        st.ns.hint(src, newparent, newname);
        if parent != newparent {
            if m.src_dir {
                Self::reparent(&mut st.ns, src, parent, newparent)?;
            }
            if dst_dir {
                Self::reparent(&mut st.ns, dst, newparent, parent)?;
            }
        }
        for ino in [src, dst, parent, newparent] {
            st.ns.get_mut(ino)?.ctime = m.now;
        }
        st.ns.get_mut(parent)?.mtime = m.now;
        st.ns.get_mut(newparent)?.mtime = m.now;
        Ok(())
    }

    /// A file renamed over a live lease: the lease keeps its inode,
    /// holders, waiters and epoch and takes the source's content, and the
    /// source's name goes (SPEC 4).
    fn rename_over_live_lease(st: &mut State, m: &Move<'_>, dst: Ino) -> Result<()> {
        let ((parent, name), (newparent, _), src, tid) = (m.from, m.to, m.src, m.tid);
        // The kernel moves the source's entry to the lease's name once it
        // has the answer. If that entry may still be valid (the source was
        // looked up less than FILE_ENTRY_TTL + margin ago), it must expire
        // first, or the next walk to the name would reach the source. Then
        // the first try is answered ESTALE, which makes the kernel retry
        // the rename once after looking the source up again
        // (LOOKUP_REVAL); that lookup is answered with an entry that
        // expires at once, and the retry goes ahead. No lock is needed: an
        // entry invalidation notice would wait for the directory the
        // rename holds. A source the kernel only got from its create (the
        // usual renewal) has no valid entry and is renamed at the first
        // try.
        if st.cache.names_cached
            && st.cache.entry_deadlines.cached(src, Instant::now())
            && !st.cache.pending_renames.retried(parent, name, tid)
        {
            st.cache.pending_renames.ask(parent, name, tid);
            return Err(Error::Stale(Stale::Lookup));
        }
        let old_path = st.path_of(parent, name);
        let data = st.ns.get(src)?.data()?.clone();
        st.ns.account(dst, |d| {
            d.data_mut()?.replace_with(data);
            Ok(())
        })?;
        st.ns.get_mut(dst)?.change_content(m.now);
        st.remember_epoch(old_path, src);
        st.ns.get_mut(src)?.ctime = m.now;
        st.ns.unlink(parent, name)?;
        st.ns.get_mut(parent)?.touch_content(m.now);
        st.ns.get_mut(newparent)?.touch_content(m.now);
        st.cache.invalidate.push(dst);
        st.repoint(dst);
        st.collect(src);
        // Its own rename is an observation of the new version.
        st.observe(tid, dst);
        Ok(())
    }

    /// The POSIX rename: the source's entry moves to the new name,
    /// replacing `dst` (which goes, and whose observers now hold a stale
    /// view of the name).
    fn move_name(st: &mut State, m: &Move<'_>, dst: Option<Ino>) -> Result<()> {
        let ((parent, name), (newparent, newname), src) = (m.from, m.to, m.src);
        let old_path = st.path_of(parent, name);
        let new_path = st.path_of(newparent, newname);
        let mark = st.ns.power_mark();
        if let Some(dst) = dst {
            st.remember_epoch(new_path.clone(), dst);
            // Whoever looked at the replaced file now has a stale view of
            // this name (versions count content changes; re-pointing a name
            // is tracked through predecessors, so other hard links of the
            // moved file are unaffected).
            st.succeed(dst, src);
            st.ns.get_mut(dst)?.ctime = m.now;
            st.ns.unlink(newparent, newname)?;
            st.collect(dst);
        }
        st.remember_epoch(old_path, src);
        st.ns.get_mut(parent)?.dir_mut()?.remove(name);
        st.ns.get_mut(newparent)?.dir_mut()?.insert(newname.to_os_string(), src);
        st.ns.power_renamed((parent, name), (newparent, newname), mark);
        st.ns.hint(src, newparent, newname);
        if m.src_dir && parent != newparent {
            Self::reparent(&mut st.ns, src, parent, newparent)?;
        }
        st.floor_epoch(new_path.as_ref(), src);
        if dst.is_none() {
            if let Some(old) = new_path.as_ref().and_then(|p| st.lease.table_mut().views().take_removed(p)) {
                st.succeed(old, src);
            }
        }
        st.ns.get_mut(src)?.ctime = m.now;
        st.ns.get_mut(parent)?.touch_content(m.now);
        st.ns.get_mut(newparent)?.touch_content(m.now);
        st.observe(m.tid, src);
        Ok(())
    }

    pub(super) fn reparent(ns: &mut Namespace, dir: Ino, from: Ino, to: Ino) -> Result<()> {
        ns.get_mut(from)?.nlink -= 1;
        ns.get_mut(to)?.nlink += 1;
        ns.get_mut(dir)?.dir_mut()?.parent = to;
        Ok(())
    }
}

/// A rename's two names and what it moves, for the cases of [`Fs::rename`].
struct Move<'a> {
    from: (Ino, &'a OsStr),
    to: (Ino, &'a OsStr),
    src: Ino,
    src_dir: bool,
    now: SystemTime,
    tid: u32,
}
