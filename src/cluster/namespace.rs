//! The namespace of an `--etcd` mount, shared by every host of the same
//! cluster and prefix.
//!
//! **Key schema** (under the mount's prefix `P`):
//! - `P/ns/i/<id>`: one inode (attributes, extended attributes, TTL and
//!   guard settings, symlink target, contents), encoded as the local
//!   journal encodes an inode. `<id>` is `r` for the root, otherwise
//!   `<host tag>.<inode number on the host that created it>`; the tag is
//!   the host's first etcd lease id, which etcd never hands out twice.
//! - `P/ns/e/<dir id>/<name>`: a directory entry; its value is the id of
//!   the inode it names (neither ids nor names contain `/`).
//! - `P/ns/rev`: written by every change, so its mod revision is the
//!   namespace's revision.
//! - `P/ns/lock`: the right to change the namespace, held by one host at a
//!   time on its host lease.
//!
//! **Changing.** A host takes `P/ns/lock` (a transaction that creates it
//! only if absent), catches up, applies the operation to its table, and
//! stores what the table's change tracking recorded in one transaction
//! that compares the lock's create revision, writes `P/ns/rev` and deletes
//! the lock. A host whose session expired meanwhile cannot land a change.
//!
//! **Reading.** Before each read a host reads `P/ns/rev` (a linearizable
//! read). When it moved, the host replays the changes since the revision it
//! last applied from a watch of `P/ns/` (every event of one revision
//! arrives together); a watch that fell behind compaction, or a change
//! whose outcome is unknown, makes it re-read the whole namespace. So no
//! read answers from a state older than a change that another host's call
//! had returned from.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use super::client::{prefix_end, Client, CmpOp, Compare, EtcdError, Kv, Op, OpResult, Target, WatchMsg};
use super::session::HostSession;
use crate::error::{Error, Result};
use crate::namespace::replica::{Caught, Condition, Replica};
use crate::namespace::{Body, Ino, Kind, Namespace, NewInode};
use crate::store::records::{decode_object, encode_object, Extra};

/// Largest file an etcd namespace keeps (etcd's default request limit is
/// 1.5 MiB; a file is one value).
pub const MAX_FILE: u64 = 1 << 20;

/// Revisions a host replays from a watch at most; further behind, it
/// re-reads the namespace instead.
const REPLAY_MAX: i64 = 256;

/// The root's id.
const ROOT: &str = "r";

/// The etcd side of a shared namespace.
pub struct EtcdNamespace {
    client: Arc<Client>,
    /// The host session the change lock hangs on (none in unit tests,
    /// which never change the store).
    session: Option<Arc<HostSession>>,
    /// `P/ns/`.
    base: String,
    /// Prefix of the ids of inodes this host creates.
    tag: String,
    to_ino: HashMap<String, Ino>,
    to_id: HashMap<Ino, String>,
    /// The namespace revision the table reflects.
    applied: i64,
    /// The table may differ from etcd (a change whose outcome is unknown,
    /// an event that did not fit): re-read everything at the next catch-up.
    desync: bool,
    /// Create revision of `P/ns/lock` while this host holds it.
    lock: Option<i64>,
    /// A lock request's answer was lost: the lock may be this host's.
    suspect: bool,
    /// Full re-reads and replayed revisions, for `status`.
    reloads: u64,
    replayed: u64,
    /// The last catch-up failed: reads answer from the table as it is.
    stale: bool,
    /// After a failed catch-up, reads do not wait for etcd again before
    /// this instant (each would wait a whole request timeout).
    retry_at: Option<Instant>,
}

impl std::fmt::Debug for EtcdNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdNamespace").field("base", &self.base).field("applied", &self.applied).finish()
    }
}

fn unreachable(e: EtcdError) -> Error {
    tracing::warn!("shared namespace: {e}");
    Error::Unreachable
}

/// What one batch of events does to the table, in the order it is applied.
#[derive(Default)]
struct Batch {
    inodes: Vec<(String, Vec<u8>)>,
    entries: Vec<(String, OsString, String)>,
    removed_entries: Vec<(String, OsString)>,
    removed_inodes: Vec<String>,
}

impl EtcdNamespace {
    /// Join the namespace under `prefix` and read it whole into `ns`.
    pub fn open(client: Arc<Client>, session: Arc<HostSession>, prefix: &str) -> EtcdNamespace {
        let tag = format!("{:x}", session.lease().0);
        EtcdNamespace::with(client, Some(session), prefix, tag)
    }

    fn with(client: Arc<Client>, session: Option<Arc<HostSession>>, prefix: &str, tag: String) -> EtcdNamespace {
        let mut n = EtcdNamespace {
            client,
            session,
            base: format!("{prefix}/ns/"),
            tag,
            to_ino: HashMap::new(),
            to_id: HashMap::new(),
            applied: 0,
            desync: true,
            lock: None,
            suspect: false,
            reloads: 0,
            replayed: 0,
            stale: false,
            retry_at: None,
        };
        n.map(ROOT.to_string(), Ino::ROOT);
        n
    }

    fn key(&self, rest: &str) -> Vec<u8> {
        format!("{}{rest}", self.base).into_bytes()
    }

    fn inode_key(&self, id: &str) -> Vec<u8> {
        self.key(&format!("i/{id}"))
    }

    fn entry_key(&self, dir: &str, name: &OsStr) -> Vec<u8> {
        let mut k = self.key(&format!("e/{dir}/"));
        k.extend_from_slice(name.as_bytes());
        k
    }

    fn map(&mut self, id: String, ino: Ino) {
        self.to_id.insert(ino, id.clone());
        self.to_ino.insert(id, ino);
    }

    fn unmap(&mut self, id: &str) {
        if let Some(ino) = self.to_ino.remove(id) {
            self.to_id.remove(&ino);
        }
    }

    /// The id of a local inode, given one if it has none yet.
    fn id_of(&mut self, ino: Ino) -> String {
        if let Some(id) = self.to_id.get(&ino) {
            return id.clone();
        }
        let id = format!("{}.{}", self.tag, ino.0);
        self.map(id.clone(), ino);
        id
    }

    /// Sort an event into `batch` (lock events are not the namespace's).
    fn sort(&self, batch: &mut Batch, key: &[u8], value: Option<&[u8]>) {
        let Some(rest) = key.strip_prefix(self.base.as_bytes()) else { return };
        if let Some(id) = rest.strip_prefix(b"i/") {
            let id = String::from_utf8_lossy(id).into_owned();
            match value {
                Some(v) => batch.inodes.push((id, v.to_vec())),
                None => batch.removed_inodes.push(id),
            }
        } else if let Some(e) = rest.strip_prefix(b"e/") {
            let Some(slash) = e.iter().position(|&b| b == b'/') else { return };
            let dir = String::from_utf8_lossy(&e[..slash]).into_owned();
            let name = OsString::from_vec(e[slash + 1..].to_vec());
            match value {
                Some(v) => batch.entries.push((dir, name, String::from_utf8_lossy(v).into_owned())),
                None => batch.removed_entries.push((dir, name)),
            }
        }
    }

    /// Apply a batch: inodes, new entries, removed entries, removed inodes
    /// (an entry moved by a rename is added before its old name goes, so
    /// the inode never drops to no name on the way).
    fn apply(&mut self, ns: &mut Namespace, batch: Batch, caught: &mut Caught) -> Result<()> {
        for (id, v) in batch.inodes {
            self.apply_inode(ns, id, &v, caught)?;
        }
        let mut moved = HashSet::new();
        // A name put in this batch is not also removed by it (a re-read
        // lists a name whose target changed under both).
        let put: HashSet<(String, OsString)> = batch.entries.iter().map(|(d, n, _)| (d.clone(), n.clone())).collect();
        for (dir, name, child) in batch.entries {
            let (Some(&p), Some(&c)) = (self.to_ino.get(&dir), self.to_ino.get(&child)) else {
                return Err(Error::Unreachable);
            };
            moved.insert(c);
            if ns.child(p, &name).ok() == Some(c) {
                continue;
            }
            if ns.child(p, &name).is_ok() {
                let old = ns.unlink(p, &name)?;
                caught.removed_names.push((p, name.clone(), old));
                caught.unlinked.push(old);
            }
            ns.link(p, &name, c)?;
            caught.added_names.push((p, name, c));
        }
        for (dir, name) in batch.removed_entries {
            if put.contains(&(dir.clone(), name.clone())) {
                continue;
            }
            let Some(&p) = self.to_ino.get(&dir) else { continue };
            let Ok(c) = ns.child(p, &name) else { continue };
            let is_dir = ns.get(c)?.kind == Kind::Dir;
            if is_dir && moved.contains(&c) {
                // A renamed directory: its new name already counts it.
                ns.get_mut(p)?.dir_mut()?.remove(&name);
                ns.get_mut(p)?.nlink -= 1;
            } else {
                caught.unlinked.push(ns.unlink(p, &name)?);
            }
            caught.removed_names.push((p, name, c));
        }
        for id in batch.removed_inodes {
            self.unmap(&id);
        }
        Ok(())
    }

    /// Create or update the inode `id` from its stored value.
    fn apply_inode(&mut self, ns: &mut Namespace, id: String, v: &[u8], caught: &mut Caught) -> Result<()> {
        let Some((new, extra)) = decode_object(v) else {
            tracing::warn!(id, "shared namespace: an inode value does not decode; skipped");
            return Ok(());
        };
        let ino = match self.to_ino.get(&id) {
            Some(&ino) if ns.get(ino).is_ok_and(|i| i.kind == new.kind) => ino,
            _ => {
                let symlink = match &new.body {
                    Body::Symlink(t) => Some(t.clone()),
                    _ => None,
                };
                let fields =
                    NewInode { kind: new.kind, perm: new.perm, uid: new.uid, gid: new.gid, rdev: new.rdev, symlink };
                let ino = ns.alloc(fields, Ino::ROOT, new.ctime);
                self.map(id, ino);
                ino
            }
        };
        let n = *new;
        ns.account(ino, |i| {
            i.perm = n.perm;
            i.uid = n.uid;
            i.gid = n.gid;
            i.rdev = n.rdev;
            i.atime = n.atime;
            i.mtime = n.mtime;
            i.ctime = n.ctime;
            i.crtime = n.crtime;
            i.version += 1;
            i.xattrs = n.xattrs;
            match (&mut i.body, n.body) {
                (Body::File(d), Body::File(nd)) => d.replace_with(nd),
                (Body::Symlink(t), Body::Symlink(nt)) => *t = nt,
                _ => {}
            }
            Ok(())
        })?;
        caught.extras.push((ino, extra));
        Ok(())
    }

    /// Read the whole namespace and make the table match it.
    fn reload(&mut self, ns: &mut Namespace) -> Result<Caught> {
        let base = self.base.clone().into_bytes();
        let (kvs, _) = self.client.range(&base, &prefix_end(&base)).map_err(unreachable)?;
        let caught = self.install(ns, &kvs)?;
        self.reloads += 1;
        Ok(caught)
    }

    /// Make the table match `kvs`, the whole namespace as read.
    fn install(&mut self, ns: &mut Namespace, kvs: &[Kv]) -> Result<Caught> {
        let mut batch = Batch::default();
        let mut applied = 0;
        let mut stored: HashSet<String> = HashSet::new();
        let mut wanted: HashMap<(String, OsString), String> = HashMap::new();
        for kv in kvs {
            if kv.key == self.key("rev") {
                applied = kv.mod_revision;
            }
            self.sort(&mut batch, &kv.key, Some(&kv.value));
        }
        for (id, _) in &batch.inodes {
            stored.insert(id.clone());
        }
        for (dir, name, child) in &batch.entries {
            wanted.insert((dir.clone(), name.clone()), child.clone());
        }
        // Local names etcd does not have go; ids etcd does not have are
        // forgotten.
        for (id, &ino) in &self.to_ino {
            let Ok(i) = ns.get(ino) else { continue };
            if let Body::Dir(d) = &i.body {
                for (name, c) in d.iter() {
                    let keep = wanted.get(&(id.clone(), name.clone())).is_some_and(|w| self.to_ino.get(w) == Some(&c));
                    if !keep {
                        batch.removed_entries.push((id.clone(), name.clone()));
                    }
                }
            }
        }
        batch.removed_inodes = self.to_ino.keys().filter(|id| *id != ROOT && !stored.contains(*id)).cloned().collect();
        let mut caught = Caught::default();
        self.apply(ns, batch, &mut caught)?;
        ns.clear_dirty();
        self.applied = applied;
        self.desync = false;
        Ok(caught)
    }

    /// Replay the changes after the applied revision up to `to`.
    fn replay(&mut self, ns: &mut Namespace, to: i64) -> Result<Caught> {
        let base = self.base.clone().into_bytes();
        let mut w = match self.client.watch(&base, &prefix_end(&base), self.applied + 1) {
            Ok(w) => w,
            Err(EtcdError::Server { code: 11, .. }) => return self.reload(ns),
            Err(e) => return Err(unreachable(e)),
        };
        let deadline = Instant::now() + self.client.timeout();
        let mut caught = Caught::default();
        let result = loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break Err(Error::Unreachable);
            };
            match w.next(left) {
                Ok(Some(WatchMsg::Events { events, .. })) => {
                    // One revision's events come together; apply them by revision.
                    let mut by_rev: Vec<(i64, Batch)> = Vec::new();
                    for e in &events {
                        let rev = e.kv.mod_revision;
                        if by_rev.last().is_none_or(|(r, _)| *r != rev) {
                            by_rev.push((rev, Batch::default()));
                        }
                        let b = &mut by_rev.last_mut().expect("just pushed").1;
                        self.sort(b, &e.kv.key, (!e.deleted).then_some(&e.kv.value[..]));
                    }
                    let mut done = false;
                    for (rev, b) in by_rev {
                        if let Err(e) = self.apply(ns, b, &mut caught) {
                            self.desync = true;
                            w.close();
                            return Err(e);
                        }
                        self.applied = self.applied.max(rev);
                        self.replayed += 1;
                        done |= rev >= to;
                    }
                    if done {
                        break Ok(());
                    }
                }
                Ok(Some(WatchMsg::Compacted(_))) => {
                    w.close();
                    return self.reload(ns);
                }
                Ok(Some(_)) | Ok(None) => {}
                Err(e) => break Err(unreachable(e)),
            }
        };
        w.close();
        ns.clear_dirty();
        result.map(|()| caught)
    }

    /// Bring the table up to namespace revision `to`.
    fn follow(&mut self, ns: &mut Namespace, to: i64) -> Result<Caught> {
        if self.desync {
            return self.reload(ns);
        }
        if to <= self.applied {
            return Ok(Caught::default());
        }
        if to - self.applied > REPLAY_MAX {
            // Far behind: the namespace as it is now is smaller than its history.
            return self.reload(ns);
        }
        match self.replay(ns, to) {
            // A replay too slow to finish (large values) gives way to one read.
            Err(Error::Unreachable) if !self.desync => self.reload(ns),
            r => r,
        }
    }

    /// Give up a lock this host still holds from a change that failed.
    fn drop_lock(&mut self) {
        if self.suspect && self.lock.is_none() {
            match self.client.get(&self.key("lock")) {
                Ok((Some(kv), _)) if kv.value == self.tag.as_bytes() => self.lock = Some(kv.create_revision),
                Ok(_) => self.suspect = false,
                Err(_) => return,
            }
        }
        if let Some(rev) = self.lock {
            let lock = self.key("lock");
            let cmp = [Compare::new(lock.clone(), CmpOp::Equal, Target::Create(rev))];
            if self.client.txn(&cmp, &[Op::delete(lock)], &[]).is_ok() {
                self.lock = None;
                self.suspect = false;
            }
        }
    }
}

impl Replica for EtcdNamespace {
    fn catch_up(&mut self, ns: &mut Namespace) -> Result<Caught> {
        if self.retry_at.is_some_and(|t| Instant::now() < t) {
            return Err(Error::Unreachable);
        }
        self.drop_lock();
        let out = self
            .client
            .get(&self.key("rev"))
            .map_err(unreachable)
            .and_then(|(kv, _)| self.follow(ns, kv.map_or(0, |k| k.mod_revision)));
        self.stale = out.is_err();
        self.retry_at = self.stale.then(|| Instant::now() + self.client.timeout());
        out
    }

    fn begin(&mut self, ns: &mut Namespace) -> Result<Caught> {
        self.drop_lock();
        let lock = self.key("lock");
        let rev = self.key("rev");
        let deadline = Instant::now() + self.client.timeout() * 2;
        loop {
            let lease = self.session.as_ref().and_then(|s| s.alive()).ok_or(Error::Unreachable)?;
            let took = self
                .client
                .txn(
                    &[Compare::absent(lock.clone())],
                    &[Op::put(lock.clone(), self.tag.clone(), lease), Op::get(rev.clone())],
                    &[Op::get(lock.clone())],
                )
                // A put whose answer was lost may hold the lock: the next
                // catch-up or attempt finds it under this host's tag.
                .map_err(|e| {
                    self.suspect = true;
                    unreachable(e)
                })?;
            // Success: [put, the namespace revision]; failure: [the lock].
            let read = match took.responses.last() {
                Some(OpResult::Range(kvs)) => kvs.first().cloned(),
                _ => None,
            };
            if took.succeeded {
                self.lock = Some(took.revision);
                let caught = self.follow(ns, read.map_or(0, |k| k.mod_revision));
                ns.clear_dirty();
                if caught.is_err() {
                    self.drop_lock();
                }
                self.stale = caught.is_err();
                return caught;
            }
            let Some(Kv { create_revision, value, .. }) = read else { continue };
            if value == self.tag.as_bytes() {
                // This host's own lock from a change whose answer was lost.
                self.lock = Some(create_revision);
                self.desync = true;
                self.drop_lock();
                continue;
            }
            // Another host changes the namespace: wait for its lock to go.
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                tracing::warn!("shared namespace: another host held the change lock too long");
                return Err(Error::Unreachable);
            };
            let mut w = self.client.watch(&lock, &[], took.revision + 1).map_err(unreachable)?;
            let until = Instant::now() + left;
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                match w.next(left) {
                    Ok(Some(WatchMsg::Events { events, .. })) if events.iter().any(|e| e.deleted) => break,
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
            w.close();
        }
    }

    fn publish(&mut self, ns: &mut Namespace, extra: &dyn Fn(Ino) -> Extra, conditions: &[Condition]) -> Result<()> {
        let Some(lock_rev) = self.lock else { return Err(Error::Unreachable) };
        let (dirty, freed) = ns.dirty();
        let dirty: Vec<Ino> = dirty.iter().copied().collect();
        let freed: Vec<Ino> = freed.iter().copied().collect();
        let mut ops = Vec::new();
        let named = |ns: &Namespace, ino: Ino| ns.get(ino).is_ok_and(|i| i.nlink > 0 || ino == Ino::ROOT);
        for &ino in &dirty {
            if !named(ns, ino) {
                if let Some(id) = self.to_id.get(&ino).cloned() {
                    ops.push(Op::delete(self.inode_key(&id)));
                    self.unmap(&id);
                }
                continue;
            }
            let i = ns.get(ino)?;
            if let Body::File(d) = &i.body {
                if d.size() > MAX_FILE {
                    self.lock = Some(lock_rev);
                    ns.clear_dirty();
                    self.desync = true;
                    self.drop_lock();
                    return Err(Error::FileTooBig);
                }
            }
            let id = self.id_of(ino);
            ops.push(Op::put(self.inode_key(&id), encode_object(i, &extra(ino)), 0));
            if let Body::Dir(d) = &i.body {
                for name in d.dirty_names() {
                    let key = self.entry_key(&id, name);
                    match d.get(name) {
                        Some(c) if named(ns, c) => {
                            let unstored = !dirty.contains(&c) && !self.to_id.contains_key(&c);
                            let cid = self.id_of(c);
                            if unstored {
                                ops.push(Op::put(self.inode_key(&cid), encode_object(ns.get(c)?, &extra(c)), 0));
                            }
                            ops.push(Op::put(key, cid, 0));
                        }
                        _ => ops.push(Op::delete(key)),
                    }
                }
            }
        }
        for ino in freed {
            if let Some(id) = self.to_id.get(&ino).cloned() {
                ops.push(Op::delete(self.inode_key(&id)));
                self.unmap(&id);
            }
        }
        ns.clear_dirty();
        let lock = self.key("lock");
        let changed = !ops.is_empty();
        if changed {
            ops.push(Op::put(self.key("rev"), self.tag.clone(), 0));
        }
        ops.push(Op::delete(lock.clone()));
        let mut cmp = vec![Compare::new(lock.clone(), CmpOp::Equal, Target::Create(lock_rev))];
        for c in conditions {
            cmp.push(Compare::new(c.key.clone(), CmpOp::Equal, Target::Create(c.create_revision)));
        }
        match self.client.txn(&cmp, &ops, &[Op::get(lock)]) {
            Ok(t) if t.succeeded => {
                self.lock = None;
                if changed {
                    self.applied = t.revision;
                }
                Ok(())
            }
            Ok(t) => {
                // Nothing landed: the change is undone by re-reading.
                self.desync = true;
                let still_ours = matches!(t.responses.first(), Some(OpResult::Range(kvs)) if kvs.first().is_some_and(|k| k.create_revision == lock_rev));
                if still_ours {
                    // A condition failed: the guarding lease is no longer held.
                    tracing::warn!("shared namespace: a guarded write came after its lease was lost; refused");
                    self.drop_lock();
                    Err(Error::Stale)
                } else {
                    // The lock expired with this host's session.
                    self.lock = None;
                    tracing::warn!("shared namespace: the change lock was lost; the change is undone");
                    Err(Error::Unreachable)
                }
            }
            Err(e) => {
                self.desync = true;
                self.drop_lock();
                Err(unreachable(e))
            }
        }
    }

    fn max_file_size(&self) -> u64 {
        MAX_FILE
    }

    fn status(&self) -> serde_json::Value {
        json!({
            "revision": self.applied,
            "inodes": self.to_ino.len(),
            "reloads": self.reloads,
            "replayed": self.replayed,
            "stale": self.stale || self.desync,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::Inode;
    use std::time::UNIX_EPOCH;

    fn table() -> (EtcdNamespace, Namespace) {
        let client = Arc::new(Client::new(&["http://127.0.0.1:9".to_string()], std::time::Duration::from_millis(10)));
        (EtcdNamespace::with(client, None, "p", "h".into()), Namespace::new(0o755, 0, 0, UNIX_EPOCH))
    }

    /// The stored value of a file holding `text` (or of a directory).
    fn value(kind: Kind, text: &str) -> Vec<u8> {
        let mut ns = Namespace::new(0o755, 0, 0, UNIX_EPOCH);
        let new = NewInode { kind, perm: 0o644, uid: 1, gid: 2, rdev: 0, symlink: None };
        let ino = ns.alloc(new, Ino::ROOT, UNIX_EPOCH);
        if kind == Kind::File {
            ns.get_mut(ino).unwrap().data_mut().unwrap().write(0, text.as_bytes()).unwrap();
        }
        let i: Inode = ns.get(ino).unwrap().clone();
        encode_object(&i, &Extra::default())
    }

    fn kv(key: &str, value: &[u8], rev: i64) -> Kv {
        Kv { key: key.as_bytes().to_vec(), value: value.to_vec(), mod_revision: rev, ..Kv::default() }
    }

    /// Apply one revision's events: (key, Some(value)) puts, (key, None) deletes.
    fn events(t: &mut EtcdNamespace, ns: &mut Namespace, evs: &[(&str, Option<Vec<u8>>)]) -> Caught {
        let mut b = Batch::default();
        for (k, v) in evs {
            t.sort(&mut b, k.as_bytes(), v.as_deref());
        }
        let mut c = Caught::default();
        t.apply(ns, b, &mut c).unwrap();
        c
    }

    fn read(ns: &Namespace, dir: Ino, name: &str) -> String {
        let ino = ns.child(dir, OsStr::new(name)).unwrap();
        String::from_utf8(ns.get(ino).unwrap().data().unwrap().read(0, 100)).unwrap()
    }

    #[test]
    fn a_renewal_by_rename_from_another_host_re_points_the_name() {
        let (mut t, mut ns) = table();
        events(
            &mut t,
            &mut ns,
            &[("p/ns/i/o.1", Some(value(Kind::File, "v1"))), ("p/ns/e/r/l.json", Some(b"o.1".to_vec()))],
        );
        let old = ns.child(Ino::ROOT, OsStr::new("l.json")).unwrap();
        events(
            &mut t,
            &mut ns,
            &[("p/ns/i/o.2", Some(value(Kind::File, "v2"))), ("p/ns/e/r/l.tmp", Some(b"o.2".to_vec()))],
        );
        let c = events(
            &mut t,
            &mut ns,
            &[("p/ns/e/r/l.json", Some(b"o.2".to_vec())), ("p/ns/e/r/l.tmp", None), ("p/ns/i/o.1", None)],
        );
        assert_eq!(read(&ns, Ino::ROOT, "l.json"), "v2");
        assert!(ns.child(Ino::ROOT, OsStr::new("l.tmp")).is_err());
        let new = ns.child(Ino::ROOT, OsStr::new("l.json")).unwrap();
        assert_eq!(ns.get(new).unwrap().nlink, 1);
        // Observers of the old file learn the name moved on.
        assert!(c.removed_names.iter().any(|(_, n, i)| n == "l.json" && *i == old));
        assert!(c.added_names.iter().any(|(_, n, i)| n == "l.json" && *i == new));
        assert!(!t.to_ino.contains_key("o.1"));
    }

    #[test]
    fn a_directory_renamed_elsewhere_keeps_its_link_counts() {
        let (mut t, mut ns) = table();
        events(&mut t, &mut ns, &[("p/ns/i/o.1", Some(value(Kind::Dir, ""))), ("p/ns/e/r/d1", Some(b"o.1".to_vec()))]);
        let d = ns.child(Ino::ROOT, OsStr::new("d1")).unwrap();
        events(&mut t, &mut ns, &[("p/ns/e/r/d2", Some(b"o.1".to_vec())), ("p/ns/e/r/d1", None)]);
        assert_eq!(ns.child(Ino::ROOT, OsStr::new("d2")).unwrap(), d);
        assert!(ns.child(Ino::ROOT, OsStr::new("d1")).is_err());
        assert_eq!((ns.get(d).unwrap().nlink, ns.get(Ino::ROOT).unwrap().nlink), (2, 3));
    }

    #[test]
    fn a_re_read_follows_a_name_whose_target_changed_and_drops_names_gone() {
        let (mut t, mut ns) = table();
        events(
            &mut t,
            &mut ns,
            &[
                ("p/ns/i/o.1", Some(value(Kind::File, "old"))),
                ("p/ns/e/r/s", Some(b"o.1".to_vec())),
                ("p/ns/i/o.3", Some(value(Kind::File, "gone"))),
                ("p/ns/e/r/g", Some(b"o.3".to_vec())),
            ],
        );
        let kvs =
            [kv("p/ns/i/o.2", &value(Kind::File, "renewed"), 9), kv("p/ns/e/r/s", b"o.2", 9), kv("p/ns/rev", b"x", 9)];
        t.install(&mut ns, &kvs).unwrap();
        assert_eq!(read(&ns, Ino::ROOT, "s"), "renewed");
        assert!(ns.child(Ino::ROOT, OsStr::new("g")).is_err());
        assert_eq!(t.applied, 9);
        assert!(!t.to_ino.contains_key("o.1") && !t.to_ino.contains_key("o.3"));
    }

    #[test]
    fn an_entry_naming_an_unknown_inode_asks_for_a_re_read() {
        let (mut t, mut ns) = table();
        let mut b = Batch::default();
        t.sort(&mut b, b"p/ns/e/r/x", Some(b"o.9"));
        assert_eq!(t.apply(&mut ns, b, &mut Caught::default()), Err(Error::Unreachable));
        // Keys outside the namespace (the change lock) are not the table's.
        let mut b = Batch::default();
        t.sort(&mut b, b"p/ns/lock", Some(b"h"));
        t.sort(&mut b, b"q/ns/i/o.1", Some(b""));
        assert!(b.inodes.is_empty() && b.entries.is_empty());
    }
}
