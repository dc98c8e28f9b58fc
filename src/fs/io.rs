//! Attributes and I/O: getattr/setattr, open and release (guards, fences
//! checked per handle), read, write (suid/sgid kill, `O_APPEND`), fallocate,
//! lseek, readdir, statfs.

use super::shared::Walk;
use super::*;

impl Fs {
    /// Attributes of an inode (`stat`: an observation by `tid`).
    pub fn getattr(&self, ino: Ino, tid: u32) -> Result<Attr> {
        if control::is_control(ino) {
            return Ok(self.control_attr(ino));
        }
        let mut st = if ino == Ino::ROOT { self.fresh_root()? } else { self.fresh(&[ino])? };
        let a = st.ns.get(ino)?.attr();
        st.observe(tid, ino);
        Ok(a)
    }

    /// Change attributes (chmod, chown, truncate, utimensat).
    pub fn setattr(&self, ino: Ino, set: &SetAttr, caller: Caller) -> Result<Attr> {
        let tid = caller.pid;
        if control::is_control(ino) {
            // `echo PATH > .leasefs/break` opens with O_TRUNC: let that be.
            let only_truncate = set.size == Some(0) && set.mode.is_none() && set.uid.is_none() && set.gid.is_none();
            return if ControlFile::by_ino(ino) == Some(ControlFile::Break) && only_truncate {
                Ok(self.control_attr(ino))
            } else {
                Err(Error::NotPermitted)
            };
        }
        if let (Some(_), Some(h)) = (set.size, set.handle) {
            self.precheck(|st| Self::check_handle(st, ino, h, "truncate"))?;
        }
        self.change(|st| {
            let mode = st.permit_setattr(caller, ino, set)?;
            st.clock();
            if set.size.is_some() {
                match set.handle {
                    Some(h) => Self::check_handle(st, ino, h, "truncate")?,
                    None => st.check_fenced_pid(tid, ino, "truncate")?,
                }
            }
            if set.atime.is_some() || set.mtime.is_some() {
                // touch/utimensat by the holder renews its lease.
                let pids = st.lineage(tid);
                st.lease.renew(ino, set.handle.map(|h| h.0), &pids);
            }
            let now = now();
            if let Some(size) = set.size {
                if size > st.bounds.max_file {
                    return Err(Error::FileTooBig);
                }
                // Growing is sparse (no pages stored), as on tmpfs: only writes take room.
                st.ns.account(ino, |i| i.data_mut()?.truncate(size))?;
            }
            let i = st.ns.get_mut(ino)?;
            if set.drops_set_id() && i.kind != Kind::Dir {
                i.perm = after_chown(i.perm, i.gid, caller);
            }
            if set.size.is_some() {
                i.change_content(now);
                if set.mode.is_none() {
                    i.perm = after_unprivileged_change(i.perm, i.gid, caller);
                }
            }
            let searchable = i.perm & 0o111 == 0o111;
            if let Some(mode) = mode {
                i.perm = (mode & 0o7777) as u16;
            }
            if let Some(uid) = set.uid {
                i.uid = uid;
            }
            if let Some(gid) = set.gid {
                i.gid = gid;
            }
            if let Some(t) = set.atime {
                i.atime = resolve(t, now);
            }
            if let Some(t) = set.mtime {
                i.mtime = resolve(t, now);
            }
            i.ctime = set.ctime.unwrap_or(now);
            let a = i.attr();
            if searchable && a.perm & 0o111 != 0o111 && a.kind == Kind::Dir {
                st.unsearchable(ino);
            }
            if set.size.is_some() {
                st.observe(tid, ino);
                st.collect(ino);
            }
            Ok(a)
        })
    }

    /// Writes through a fenced descriptor, or through a guarded file's
    /// descriptor whose lease moved on since open, fail with `ESTALE`.
    pub(super) fn check_handle(st: &mut State, ino: Ino, h: Handle, what: &str) -> Result<()> {
        // Opened before a power cut; the door answers these, this covers a
        // request that passed the door while the cut was made.
        if h.0 < st.open.cut_below {
            return Err(Error::Io);
        }
        if let Some(f) = st.lease.fenced_handle(ino, h.0) {
            debug!(path = %st.path_for_log(ino), ino = ino.0, pid = f.pid, held = f.epoch.0, current = st.lease.epoch(ino).0, op = what, "fenced");
            st.report.metrics.fenced_operations += 1;
            st.emit_fence(ino, f.pid, f.epoch, what);
            return Err(Error::Stale(Stale::Fenced { held: f.epoch.0, current: st.lease.epoch(ino).0 }));
        }
        if let Some((lease, epoch, pid)) = st.open.handles.get(&h).and_then(|f| f.guard) {
            let now = st.lease.epoch(lease);
            if now != epoch || st.lease.held_by(lease, &[pid]).is_none() {
                debug!(path = %st.path_for_log(ino), lease = %st.path_for_log(lease), pid, held = epoch.0, current = now.0, op = what, "guard fenced");
                st.report.metrics.fenced_operations += 1;
                st.emit_fence(lease, pid, epoch, what);
                return Err(Error::Stale(Stale::Guard { held: epoch.0, current: now.0 }));
            }
        }
        Ok(())
    }

    pub(super) fn open_locked(st: &mut State, ino: Ino, flags: i32, tid: u32) -> Result<Handle> {
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let mut guard = None;
        if writes {
            if let Some(path) = st.lease.table().guard(ino) {
                // A guarded file opens for writing only under its lease.
                let pids = st.lineage(tid);
                let lease = st.resolve_path(&path).ok_or(Error::NoLock)?;
                let Some(holder) = st.lease.held_by(lease, &pids) else {
                    debug!(ino = ino.0, pids = ?pids, lease = %path.display(), "guarded open refused: lease not held");
                    return Err(Error::NoLock);
                };
                guard = Some((lease, st.lease.epoch(lease), holder));
            }
        }
        st.room_for_handle(false)?;
        let opener = st.proc(tid, false);
        let i = st.ns.get_mut(ino)?;
        i.opens += 1;
        let h = st.new_handle();
        st.open.handles.insert(h, OpenFile { ino, opener, guard, control: None, listing: None, paged: false });
        Ok(h)
    }

    /// Whether the descriptor `h` just opened on `ino` goes through the
    /// kernel's page cache, its pages kept across opens (else every read
    /// and write of it reaches the daemon). Files used as leases do not:
    /// one that is live, has a lease record, an epoch or a guard, so that
    /// every read of a lease is an observation (SPEC 6). Nor does anything
    /// on a shared namespace (another host's change could not reach this
    /// kernel's pages in time). Every other regular file does: its reads
    /// are served from the page cache, with the kernel's readahead, and
    /// its writes still reach the daemon before they return (no
    /// write-back cache). Content changed behind the cache drops its pages
    /// before the change is answered (a rename over a live lease, a write
    /// through a direct descriptor).
    pub fn page_cache(&self, ino: Ino, h: Handle) -> bool {
        // Nor while a fault rule may name reads or writes: those served
        // from the page cache would never reach the rule, and a short read
        // would be zero-filled by the kernel.
        if self.bench.wants_direct_io() {
            return false;
        }
        let mut st = self.state.lock();
        // Nor a set-id file: a write through the page cache leaves clearing
        // the set-id bits to the kernel, which keeps a set-group-id bit
        // without group execute that a write by a non-member must clear
        // (tmpfs clears it; the daemon does, for writes it sees as direct).
        let setid = (libc::S_ISUID | libc::S_ISGID) as u16;
        if st.sharing.replica.is_some() || !st.ns.get(ino).is_ok_and(|i| i.kind == Kind::File && i.perm & setid == 0) {
            return false;
        }
        let lease = &st.lease;
        if lease.is_live(ino)
            || lease.table().lease(ino).is_some()
            || lease.table().guard(ino).is_some()
            || lease.epoch(ino).0 > 0
        {
            return false;
        }
        let Some(f) = st.open.handles.get_mut(&h) else { return false };
        f.paged = true;
        *st.cache.paged.entry(ino).or_default() += 1;
        true
    }

    /// `open` / `opendir` (an observation by the caller's thread).
    pub fn open(&self, ino: Ino, flags: i32, caller: Caller) -> Result<Handle> {
        let tid = caller.pid;
        if control::is_control(ino) {
            return self.control_open(ino, flags);
        }
        // A directory's open is the first step of a listing: a read
        // (close-to-open applies to files' contents).
        // The kernel's second walk after an open refused below: the read
        // that refused it was made during this same call.
        let (dir, walk) = if self.reads_a_copy() {
            let mut st = self.state.lock();
            let dir = st.ns.get(ino).is_ok_and(|i| i.attr().kind == Kind::Dir);
            (dir, st.sharing.retrying.opened(tid, ino))
        } else {
            (false, Walk::First)
        };
        let mut st = if dir || walk == Walk::AgainAfterRead { self.fresh(&[ino])? } else { self.fresh_open(&[ino])? };
        if self.reads_a_copy() && !dir && st.opened_by_a_stale_name(ino) {
            // The kernel opens by a name it looked up (from this host's
            // copy, or kept since), and another host removed or replaced
            // the file, or moved a directory, before this open began: the
            // kernel looks the path up again (LOOKUP_REVAL, fresh LOOKUPs)
            // and opens what it names now.
            st.sharing.stale_lookups += 1;
            // A second refusal goes to the caller: its next call is new.
            if walk == Walk::First {
                st.sharing.retrying.refused(tid, true);
            }
            return Err(Error::Stale(Stale::Lookup));
        }
        st.permit(caller, ino, access::wanted_by_open(flags))?;
        let h = Self::open_locked(&mut st, ino, flags, tid)?;
        st.observe(tid, ino);
        Ok(h)
    }

    /// `release` / `releasedir`: the last close of an open file description.
    /// Every lock taken through it goes; returns what that unblocked.
    pub fn release(&self, h: Handle, flock_owner: Option<Owner>) -> Result<Vec<Effect>> {
        let mut st = self.state.lock();
        let f = st.open.handles.remove(&h).ok_or(Error::BadHandle)?;
        if f.paged {
            if let Some(open) = st.cache.paged.get_mut(&f.ino) {
                *open = open.saturating_sub(1);
            }
        }
        if Fs::is_events(f.ino) {
            // A read cannot be in flight on a descriptor being released.
            st.report.events.close(h.0);
            if st.report.events.readers() == 0 {
                st.lease.listen(false);
                Self::run_errands(st);
            }
            return Ok(Vec::new());
        }
        if let Err(e) = st.reserve(f.ino) {
            tracing::error!(ino = f.ino.0, "cannot make the next epoch durable: {e}");
        }
        let released = st.releases(f.ino, |l| {
            l.handle == h.0 || Some(l.owner) == flock_owner && l.kind == crate::lease::LockKind::Flock
        });
        let effects = st.lease.release_handle(f.ino, h.0, flock_owner);
        for ev in released {
            st.emit(ev, f.ino);
        }
        st.account(&effects);
        if h.0 >= st.open.cut_below {
            if let Ok(i) = st.ns.get_mut(f.ino) {
                i.opens = i.opens.saturating_sub(1);
            }
        }
        st.ns.maybe_drop(f.ino);
        st.collect(f.ino);
        // The locks' releases are done before the close returns.
        Self::run_errands(st);
        Ok(effects)
    }

    /// A process closed a descriptor (FLUSH): its POSIX locks on the file go.
    pub fn flush(&self, ino: Ino, owner: Owner) -> Vec<Effect> {
        let mut st = self.state.lock();
        if let Err(e) = st.reserve(ino) {
            tracing::error!(ino = ino.0, "cannot make the next epoch durable: {e}");
        }
        let released = st.releases(ino, |l| l.owner == owner && l.kind == crate::lease::LockKind::Posix);
        let effects = st.lease.release_owner(ino, owner);
        for ev in released {
            st.emit(ev, ino);
        }
        st.account(&effects);
        st.collect(ino);
        Self::run_errands(st);
        effects
    }

    /// Inodes whose kernel page cache must be dropped.
    pub fn take_invalidations(&self) -> Vec<Ino> {
        std::mem::take(&mut self.state.lock().cache.invalidate)
    }

    /// Entries (directory, name) the kernel should drop to keep its
    /// references to files near the bound (see `KernelCache`).
    pub fn take_entry_drops(&self) -> Vec<(Ino, OsString)> {
        let mut st = self.state.lock();
        if st.cache.refs.drop.is_empty() {
            return Vec::new();
        }
        std::mem::take(&mut st.cache.refs.drop)
    }

    /// `read` by thread `tid` (an observation).
    pub fn read(&self, ino: Ino, h: Handle, offset: u64, size: u32, tid: u32) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.read_into(ino, h, offset, size, tid, &mut out)?;
        Ok(out)
    }

    /// [`Fs::read`] into `out`: a caller that keeps its buffer from read
    /// to read touches no fresh memory for the bytes.
    pub fn read_into(&self, ino: Ino, h: Handle, offset: u64, size: u32, tid: u32, out: &mut Vec<u8>) -> Result<()> {
        // Control files answer whatever the copy's lag (status says it).
        let mut st = if control::is_control(ino) { self.fresh_root()? } else { self.fresh(&[ino])? };
        if ControlFile::by_ino(ino) == Some(ControlFile::Leases) {
            *out = Fs::listing_read(&mut st, h, offset, size)?;
            return Ok(());
        }
        if control::is_control(ino) {
            let c = st.open.handles.get(&h).and_then(|f| f.control.as_ref()).ok_or(Error::BadHandle)?;
            let from = (offset as usize).min(c.len());
            let to = from.saturating_add(size as usize).min(c.len());
            out.clear();
            out.extend_from_slice(&c[from..to]);
            return Ok(());
        }
        if h.0 < st.open.cut_below {
            return Err(Error::Io);
        }
        st.ns.get(ino)?.data()?.read_into(offset, size as usize, out);
        st.observe(tid, ino);
        Ok(())
    }

    /// `write`; returns the number of bytes written.
    pub fn write(&self, ino: Ino, h: Handle, offset: u64, data: &[u8], how: WriteOpts) -> Result<u32> {
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        // A fenced holder learns it is fenced (ESTALE) even when the
        // shared namespace cannot be changed now.
        self.precheck(|st| Self::check_handle(st, ino, h, "write"))?;
        self.change(|st| {
            st.clock();
            Self::check_handle(st, ino, h, "write")?;
            // On a shared namespace the write is stored only while the lease
            // of a guarded file is still held (checked where it is stored).
            if let Some((lease, _, _)) = st.open.handles.get(&h).and_then(|f| f.guard) {
                if let Some(c) = st.lease.hold_condition(lease) {
                    st.sharing.conditions.push(c);
                }
            }
            // A write through the holder's descriptor renews its lease.
            st.lease.renew(ino, Some(h.0), &[]);
            let opener = st.open.handles.get(&h).and_then(|f| f.opener);
            let d = st.ns.get(ino)?.data()?;
            // O_APPEND writes land at the daemon's end of file, which other
            // writers may have moved since the kernel last saw the size.
            let offset = if how.append { d.size() } else { offset };
            if offset.saturating_add(data.len() as u64) > st.bounds.max_file {
                return Err(Error::FileTooBig);
            }
            let extra = d.new_pages(offset, data.len() as u64) * PAGE as u64;
            st.room_for_bytes(how.uid, extra)?;
            st.ns.account(ino, |i| i.data_mut()?.write(offset, data))?;
            st.durable.unflushed += data.len() as u64;
            let i = st.ns.get_mut(ino)?;
            i.change_content(now());
            if how.kill_suidgid && i.perm & (libc::S_ISUID | libc::S_ISGID) as u16 != 0 {
                let file_gid = i.gid;
                let member = how.tid != 0 && !how.writeback && in_group(how.tid, how.gid, file_gid);
                let i = st.ns.get_mut(ino)?;
                i.perm = kill_suidgid(i.perm, member);
            }
            // Writeback carries no meaningful caller: the pages were dirtied
            // through the opener's mapping, so the opener's own view stays
            // current (its own writes never make it stale).
            match (how.writeback || how.tid == 0, opener) {
                (true, Some(p)) => st.observe_as(p, ino),
                _ => st.observe(how.tid, ino),
            }
            // Written past the page cache (a direct descriptor) while the
            // kernel may hold pages of the file: they must go before the
            // writer is answered, or a cached reader could read old bytes
            // (kernels that drop them around a direct write themselves
            // find nothing left to drop). Never for the write-back of
            // cached pages: those pages are the content, and dropping them
            // would wait for this very write to be answered.
            let paged = st.open.handles.get(&h).is_some_and(|f| f.paged);
            if let (false, false, Some(&open)) = (paged, how.writeback, st.cache.paged.get(&ino)) {
                st.cache.invalidate.push(ino);
                if open == 0 {
                    st.cache.paged.remove(&ino);
                }
            }
            Ok(data.len() as u32)
        })
    }

    /// `fallocate`: mode 0 and `FALLOC_FL_KEEP_SIZE` reserve (a no-op in
    /// memory beyond growing the size), `PUNCH_HOLE|KEEP_SIZE` zeroes.
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: i32, caller: Caller) -> Result<()> {
        let tid = caller.pid;
        self.change(|st| {
            let end = offset.checked_add(len).ok_or(Error::FileTooBig)?;
            if end > st.bounds.max_file {
                return Err(Error::FileTooBig);
            }
            let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            if mode != 0 && mode != libc::FALLOC_FL_KEEP_SIZE && mode != punch {
                return Err(Error::NotSupported);
            }
            if mode != punch {
                // Reserving stores the pages, so later writes into the range
                // cannot fail for lack of room (what fallocate promises).
                let extra = st.ns.get(ino)?.data()?.new_pages(offset, len) * PAGE as u64;
                st.room_for_bytes(caller.uid, extra)?;
            }
            let i = st.ns.get_mut(ino)?;
            i.perm = after_unprivileged_change(i.perm, i.gid, caller);
            st.ns.account(ino, |i| {
                let d = i.data_mut()?;
                if mode == punch {
                    d.zero_range(offset, len);
                } else {
                    d.allocate(offset, len);
                    if mode == 0 && end > d.size() {
                        d.truncate(end)?;
                    }
                }
                Ok(())
            })?;
            let i = st.ns.get_mut(ino)?;
            i.change_content(now());
            st.observe(tid, ino);
            st.collect(ino);
            Ok(())
        })
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` (the kernel handles the
    /// other whences itself) over the sparse pages.
    pub fn lseek(&self, ino: Ino, offset: i64, whence: i32) -> Result<u64> {
        let from = u64::try_from(offset).map_err(|_| Error::NoSuchOffset)?;
        let st = self.fresh(&[ino])?;
        let d = st.ns.get(ino)?.data()?;
        match whence {
            libc::SEEK_DATA => d.seek_data(from).ok_or(Error::NoSuchOffset),
            libc::SEEK_HOLE => d.seek_hole(from).ok_or(Error::NoSuchOffset),
            _ => Err(Error::Invalid),
        }
    }

    /// `readdir`: entries after `offset` (0 starts over), including `.` and `..`.
    pub fn readdir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<DirEntry>> {
        if ino == control::DIR_INO {
            let mut out = vec![
                DirEntry { cookie: 1, ino, kind: Kind::Dir, name: ".".into() },
                DirEntry { cookie: 2, ino: Ino::ROOT, kind: Kind::Dir, name: "..".into() },
            ];
            for (i, c) in ControlFile::ALL.into_iter().enumerate() {
                out.push(DirEntry { cookie: 3 + i as u64, ino: c.ino(), kind: Kind::File, name: c.name().into() });
            }
            out.retain(|e| e.cookie > offset);
            return Ok(out);
        }
        let st = self.fresh_listing(ino)?;
        let i = st.ns.get(ino)?;
        let d = i.dir()?;
        let mut out = Vec::new();
        if offset < 1 {
            out.push(DirEntry { cookie: 1, ino, kind: Kind::Dir, name: ".".into() });
        }
        if offset < 2 {
            out.push(DirEntry { cookie: 2, ino: d.parent, kind: Kind::Dir, name: "..".into() });
        }
        for (cookie, name, child) in d.after(offset.max(2), max) {
            let kind = st.ns.get(child).map_or(Kind::File, |c| c.kind);
            out.push(DirEntry { cookie, ino: child, kind, name });
        }
        Ok(out)
    }

    /// `statfs`.
    pub fn statfs(&self) -> StatFs {
        let st = self.state.lock();
        let (used, size) = (st.ns.usage().bytes(), st.bounds.limits.size);
        let block = PAGE as u64;
        StatFs {
            blocks: size / block,
            bfree: size.saturating_sub(used) / block,
            // What users other than root may still use (root's reserve excluded).
            bavail: super::limits::allowed(size, u32::MAX).saturating_sub(used) / block,
            files: st.bounds.limits.inodes,
            ffree: st.bounds.limits.inodes.saturating_sub(st.ns.len() as u64),
            bsize: PAGE as u32,
            namelen: crate::namespace::NAME_MAX as u32,
        }
    }
}
