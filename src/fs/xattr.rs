//! Extended attributes: stored ones, and the computed `user.leasefs.*`
//! (epoch, version, holder, ttl, renew, guard).

use super::*;

impl Fs {
    /// `setxattr`.
    pub fn setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: i32, caller: Caller) -> Result<()> {
        let tid = caller.pid;
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::TooBig);
        }
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        self.change(|st| {
            st.clock();
            st.ns.get(ino)?;
            st.permit_xattr(caller, ino, name, true)?;
            st.check_fenced_pid(tid, ino, "setxattr")?;
            if is_leasefs_xattr(name) {
                let text = std::str::from_utf8(value).map_err(|_| Error::Invalid)?.trim_end_matches('\0');
                return match name.to_str() {
                    Some(XATTR_TTL) => {
                        let ttl = parse_ttl(text)?;
                        st.lease.set_ttl(ino, ttl);
                        st.ns.mark_dirty(ino);
                        Ok(())
                    }
                    Some(XATTR_RENEW) => {
                        let pids = st.lineage(tid);
                        if st.lease.renew(ino, None, &pids) {
                            Ok(())
                        } else {
                            Err(Error::NoLock)
                        }
                    }
                    Some(XATTR_GUARD) => {
                        let path = PathBuf::from(text);
                        let ok = !text.is_empty()
                            && text.len() < 4096
                            && path
                                .components()
                                .all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
                        if !ok {
                            return Err(Error::Invalid);
                        }
                        st.lease.table_mut().set_guard(ino, path);
                        st.ns.mark_dirty(ino);
                        Ok(())
                    }
                    _ => Err(Error::NotPermitted),
                };
            }
            let i = st.ns.get_mut(ino)?;
            let exists = i.xattrs.contains_key(name);
            if flags & XATTR_CREATE != 0 && exists {
                return Err(Error::Exists);
            }
            if flags & XATTR_REPLACE != 0 && !exists {
                return Err(Error::NoAttr);
            }
            // Bounded per file (count and bytes) and counted against the size limit.
            let old = i.xattrs.get(name).map_or(0, |v| (name.len() + v.len()) as u64);
            let new = (name.len() + value.len()) as u64;
            let count = i.xattrs.len() + usize::from(!exists);
            let bytes = crate::namespace::xattr_bytes(&i.xattrs) - old + new;
            let (max_count, max_bytes) = (st.bounds.limits.xattrs_per_file, st.bounds.limits.xattr_bytes_per_file);
            if count > max_count || bytes > max_bytes {
                return Err(st.bounds.hits.refuse(
                    super::limits::Limit::Xattrs,
                    Error::NoSpace,
                    format_args!("{count} attributes, {bytes} bytes on one file (at most {max_count}, {max_bytes})"),
                ));
            }
            st.room_for_bytes(caller.uid, new.saturating_sub(old))?;
            st.ns.account(ino, |i| {
                i.xattrs.insert(name.to_os_string(), value.to_vec());
                i.ctime = now();
                Ok(())
            })
        })
    }

    /// `getxattr`.
    pub fn getxattr(&self, ino: Ino, name: &OsStr, caller: Caller) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        if control::is_control(ino) {
            return Err(Error::NoAttr);
        }
        let mut st = self.fresh(&[ino])?;
        st.permit_xattr(caller, ino, name, false)?;
        let now = st.lease.now();
        let i = st.ns.get(ino)?;
        match name.to_str() {
            Some(XATTR_EPOCH) => {
                // A lost holder known here learns nothing, not even
                // whether etcd can be reached.
                st.check_token(caller.pid, ino)?;
                st.name_lease(ino);
                let mut st = self.refreshed(st, &[ino])?;
                st.check_token(caller.pid, ino)?;
                return Ok(st.lease.epoch(ino).0.to_string().into_bytes());
            }
            Some(XATTR_VERSION) => return Ok(i.version.to_string().into_bytes()),
            Some(XATTR_HOLDER) => {
                st.check_token(caller.pid, ino)?;
                st.name_lease(ino);
                let mut st = self.refreshed(st, &[ino])?;
                st.check_token(caller.pid, ino)?;
                // Holders on other hosts count as much as this host's
                // (`leasefs wait --free` waits for them too).
                let mut remote = Vec::new();
                if let Some(read) = st.lease.remote_holders(ino) {
                    drop(st);
                    remote = read().map_err(|e| {
                        tracing::warn!("cannot read other hosts' holders from etcd: {e}");
                        Error::Io
                    })?;
                    st = self.state.lock();
                    st.check_token(caller.pid, ino)?;
                }
                return Ok(holder_json(&st.lease, ino, now, remote).into_bytes());
            }
            Some(XATTR_TTL) => {
                let ttl = st.lease.table().lease(ino).and_then(|l| l.ttl()).ok_or(Error::NoAttr)?;
                return Ok(format_ttl(ttl).into_bytes());
            }
            Some(XATTR_GUARD) => {
                let g = st.lease.table().guard(ino).ok_or(Error::NoAttr)?;
                return Ok(g.to_string_lossy().into_owned().into_bytes());
            }
            Some(XATTR_RENEW) => return Err(Error::NoAttr),
            _ => {}
        }
        st.ns.get(ino)?.xattrs.get(name).cloned().ok_or(Error::NoAttr)
    }

    /// `listxattr`: NUL-terminated names.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        if control::is_control(ino) {
            return Ok(Vec::new());
        }
        let st = self.fresh(&[ino])?;
        let mut out = Vec::new();
        for name in st.ns.get(ino)?.xattrs.keys() {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    /// `removexattr`.
    pub fn removexattr(&self, ino: Ino, name: &OsStr, caller: Caller) -> Result<()> {
        let tid = caller.pid;
        check_xattr_name(name)?;
        if control::is_control(ino) {
            return Err(Error::NotPermitted);
        }
        self.change(|st| {
            st.ns.get(ino)?;
            st.permit_xattr(caller, ino, name, true)?;
            st.check_fenced_pid(tid, ino, "removexattr")?;
            if is_leasefs_xattr(name) {
                return match name.to_str() {
                    Some(XATTR_TTL) => {
                        st.clock();
                        st.lease.set_ttl(ino, None);
                        st.ns.mark_dirty(ino);
                        Ok(())
                    }
                    Some(XATTR_GUARD) => {
                        st.ns.mark_dirty(ino);
                        if st.lease.table_mut().remove_guard(ino) {
                            Ok(())
                        } else {
                            Err(Error::NoAttr)
                        }
                    }
                    _ => Err(Error::NotPermitted),
                };
            }
            st.ns.account(ino, |i| {
                i.xattrs.remove(name).ok_or(Error::NoAttr)?;
                i.ctime = now();
                Ok(())
            })
        })
    }
}

/// `user.leasefs.holder`: the holders as JSON.
/// `remote` are other hosts' holders.
pub(super) fn holder_json(locks: &LeaseAuthority, ino: Ino, now: u64, remote: Vec<HolderRow>) -> String {
    let mut holders: Vec<HolderRow> = locks
        .table()
        .lease(ino)
        .map(|l| l.locks().iter().map(|k| HolderRow::local(k, now)).collect())
        .unwrap_or_default();
    holders.extend(remote);
    serde_json::json!({ "epoch": locks.epoch(ino).0, "holders": holders }).to_string()
}

pub(super) fn is_leasefs_xattr(name: &OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes().starts_with(XATTR_PREFIX.as_bytes())
}

/// `ERANGE` for an empty or over-long name, `ENOTSUP` outside the
/// namespaces kept (`user.`, `trusted.`, `security.`).
pub(super) fn check_xattr_name(name: &OsStr) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    if b.is_empty() || b.len() > 255 {
        return Err(Error::Range);
    }
    // POSIX ACLs (system.*) are not supported, as on a filesystem without acl.
    if ["user.", "trusted.", "security."].iter().any(|p| b.starts_with(p.as_bytes())) {
        Ok(())
    } else {
        Err(Error::NotSupported)
    }
}
