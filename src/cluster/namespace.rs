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
//! - `P/ns/t/<dir id>`: a directory's modification and change times when
//!   a change of its names moved them and nothing else the directory's
//!   value holds (its link count and size are its entries'): written
//!   blindly, never compared, and taken only when later than the
//!   directory's own value. Changes of different names of one directory
//!   on several hosts then compare different keys and never conflict; the
//!   directory's value is compared (it must still exist as the host knew
//!   it), and a directory removed is compared to have no entries.
//! - `P/ns/rev`: written (blindly, never compared) by every change, so its
//!   mod revision is the namespace's revision.
//!
//! **Changing** (optimistic concurrency; nothing cluster-wide is locked).
//! A host catches up (below), applies the operation to its table, and
//! stores what the table's change tracking recorded in one transaction
//! that compares the mod revision of every key it writes (the inodes and
//! directory entries it changed; for a directory moved to another parent,
//! also the inodes of the new parent's ancestors, so two crossing moves
//! cannot make a cycle) with the revision its table has for that key (0:
//! absent). When another host changed one of them first, nothing lands:
//! the table is read again and the operation is decided again on the fresh
//! copy ([`Error::Conflict`]), so the loser of a race gets the errno the
//! single-host code gives (`EEXIST`, `ENOENT`, ...). Changes to different
//! files compare different keys and commit in parallel.
//!
//! **Reading.** Before each read a host reads `P/ns/rev` (one linearizable
//! read). When it moved past what the table has applied, the host waits
//! until its feed ([`super::feed`], one watch kept open) has queued that
//! revision and applies the queue: no read answers from a state older than
//! a change that another host's call had returned from. Each key's mod
//! revision is kept, so an event older than what the table already has
//! (this host's own change, coming back through the feed) is skipped.
//! A broken feed or a change whose outcome is unknown makes the host
//! re-read the whole namespace.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::arbiter::SOLO_FROM;
use super::client::{prefix_end, Client, CmpOp, Compare, EtcdError, Kv, Op, OpResult, Target, TxnResult};
use super::feed::Feed;
use super::session::HostSession;
use crate::error::{Error, Result};
use crate::namespace::replica::{Barrier, Caught, Condition, Publication, Replica};
use crate::namespace::{Body, Ino, Kind, Namespace, NewInode};
use crate::store::records::{decode_object, decode_object_head, encode_object, Extra};

/// Largest file an etcd namespace keeps (etcd's default request limit is
/// 1.5 MiB; a file is one value).
pub const MAX_FILE: u64 = 1 << 20;

/// The root's id.
const ROOT: &str = "r";

/// The etcd side of a shared namespace.
pub struct EtcdNamespace {
    client: Arc<Client>,
    /// The host session (none in unit tests, which never change the store).
    session: Option<Arc<HostSession>>,
    /// `P/ns/`.
    base: String,
    /// Prefix of the ids of inodes this host creates.
    tag: String,
    to_ino: HashMap<String, Ino>,
    to_id: HashMap<Ino, String>,
    /// The mod revision and value of every key the table has (inodes and
    /// entries) as etcd has it, and the revision of keys it saw deleted
    /// (`None`) until the feed passed them: what a change that did not
    /// land is undone to, without asking etcd.
    revs: HashMap<Vec<u8>, (i64, Option<Vec<u8>>)>,
    /// The keys `revs` has as deleted, with the revision of the deletion:
    /// what is forgotten once the feed passed it (a walk of these, not of
    /// every key).
    tombstones: Vec<(i64, Vec<u8>)>,
    /// Events at or before this revision are in the table already (it was
    /// read whole at this revision).
    floor: i64,
    /// The namespace revision the table reflects.
    applied: i64,
    /// The table may differ from etcd (a change whose outcome is unknown,
    /// a change that lost a race, an event that did not fit): re-read
    /// everything at the next catch-up.
    desync: bool,
    /// The host's watch of the namespace (none in unit tests).
    feed: Option<Arc<Feed>>,
    /// Full re-reads, applied revisions and lost races, for `status`.
    reloads: u64,
    replayed: u64,
    conflicts: u64,
    /// What undoing changes that did not land changed in the table, for
    /// the next catch-up to report.
    undone: Vec<Caught>,
    /// The last catch-up failed: reads answer from the table as it is.
    stale: bool,
    /// The store side of read barriers.
    barrier: Arc<EtcdBarrier>,
    /// Keys of the change on its way to etcd (between `prepare` and
    /// `settle`): events of these keys are not applied meanwhile (this
    /// host's own change would come back as another host's), and the
    /// revisions of those skipped are kept here: one that is not the
    /// change's own means the table must be read again.
    in_flight: HashSet<Vec<u8>>,
    skipped: Vec<i64>,
}

/// The store side of a read barrier: the namespace revision from a
/// linearizable read, then a wait for the feed to have received it.
///
/// Readers that come while a read is on its way share the next one: a
/// read sent after a reader came reflects every change that returned
/// before it came, so one read serves every reader that was waiting when
/// it was sent (as etcd batches its own linearizable reads). One is on
/// its way at a time; a host's concurrent readers cost at most two round
/// trips each, and one for all of them together per round.
struct EtcdBarrier {
    client: Arc<Client>,
    /// `P/ns/rev`, written by every change.
    rev_key: Vec<u8>,
    rounds: parking_lot::Mutex<Rounds>,
    round_done: parking_lot::Condvar,
    feed: parking_lot::Mutex<Option<Arc<Feed>>>,
    /// After a failed read, reads do not wait for etcd again before this
    /// instant (each would wait a whole request timeout), unless the client
    /// heard from etcd since (its [`Client::answered`] count at the failure
    /// moved): a lock granted meanwhile is followed by fresh reads.
    retry_at: parking_lot::Mutex<Option<(Instant, u64)>>,
    /// When the latest barrier read that the watch then delivered was
    /// sent: the copy holds every change committed before it.
    confirmed: parking_lot::Mutex<Option<Instant>>,
    /// How far behind the copy may answer reads.
    max_lag: Duration,
}

impl std::fmt::Debug for EtcdBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBarrier").field("rev_key", &String::from_utf8_lossy(&self.rev_key)).finish()
    }
}

/// The reads of a barrier, numbered as they are sent.
#[derive(Debug, Default)]
struct Rounds {
    /// Reads sent so far (the last one may be on its way).
    sent: u64,
    /// Whether read number `sent` is on its way.
    on_its_way: bool,
    /// The outcome of read number `sent` once it came back.
    outcome: Option<std::result::Result<i64, EtcdError>>,
    /// Readers served by a read another reader sent.
    shared: u64,
}

impl EtcdBarrier {
    /// The namespace revision from a linearizable read sent after this
    /// call began: this caller's own, or one it waited for with others.
    fn revision(&self) -> std::result::Result<i64, EtcdError> {
        let mut r = self.rounds.lock();
        // The read on its way now may have been sent before this call:
        // the next one is this caller's.
        let mine = r.sent + 1;
        loop {
            if r.sent >= mine && !r.on_its_way {
                if let Some(o) = r.outcome.clone() {
                    r.shared += 1;
                    return o;
                }
            }
            if !r.on_its_way {
                r.sent += 1;
                r.on_its_way = true;
                r.outcome = None;
                drop(r);
                let got = self.client.get(&self.rev_key).map(|(kv, _)| kv.map_or(0, |k| k.mod_revision));
                // Tests hold a read's answer back here (readers that come
                // meanwhile must not take it).
                crate::failpoints::pausepoint("barrier");
                let mut r = self.rounds.lock();
                r.on_its_way = false;
                r.outcome = Some(got.clone());
                self.round_done.notify_all();
                return got;
            }
            self.round_done.wait(&mut r);
        }
    }
}

impl Barrier for EtcdBarrier {
    fn max_lag(&self) -> Duration {
        self.max_lag
    }

    fn lag(&self) -> Option<Duration> {
        let feed = self.feed.lock().clone()?;
        if feed.broken() {
            return None;
        }
        self.confirmed.lock().map(|t| t.elapsed())
    }

    fn target(&self) -> Result<i64> {
        let backing_off = *self.retry_at.lock();
        if backing_off.is_some_and(|(t, answered)| Instant::now() < t && self.client.answered() == answered) {
            return Err(Error::Unreachable);
        }
        self.target_now()
    }

    fn target_now(&self) -> Result<i64> {
        // The read that answers is sent after this instant.
        let asked = Instant::now();
        match self.revision() {
            Ok(rev) => {
                *self.retry_at.lock() = None;
                let feed = self.feed.lock().clone();
                if let Some(f) = feed {
                    f.wait_through(rev, Instant::now() + self.client.timeout());
                    if f.through(rev) {
                        let mut c = self.confirmed.lock();
                        if c.is_none_or(|t| t < asked) {
                            *c = Some(asked);
                        }
                    }
                }
                Ok(rev)
            }
            Err(e) => {
                *self.retry_at.lock() = Some((Instant::now() + self.client.timeout(), self.client.answered()));
                Err(unreachable(e))
            }
        }
    }
}

/// A change on its way to etcd.
struct EtcdPublication {
    client: Arc<Client>,
    compares: Vec<Compare>,
    ops: Vec<Op>,
    reads: Vec<Op>,
    written: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    conditions: Vec<Condition>,
    answer: Option<std::result::Result<TxnResult, EtcdError>>,
}

impl Publication for EtcdPublication {
    fn send(&mut self) {
        self.answer = Some(self.client.txn(&self.compares, &self.ops, &self.reads));
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

impl std::fmt::Debug for EtcdNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdNamespace").field("base", &self.base).field("applied", &self.applied).finish()
    }
}

impl Drop for EtcdNamespace {
    fn drop(&mut self) {
        if let Some(f) = &self.feed {
            f.stop();
        }
    }
}

fn unreachable(e: EtcdError) -> Error {
    tracing::warn!("shared namespace: {e}");
    Error::Unreachable
}

/// What a change stores: the compares, the writes, and each key written
/// with whether it stays.
struct Changes {
    compares: Vec<Compare>,
    ops: Vec<Op>,
    written: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Keys of `written` stored blindly (directories' times): never
    /// compared, and other hosts' writes of them are applied meanwhile.
    blind: HashSet<Vec<u8>>,
}

/// What one batch of events does to the table, in the order it is applied.
#[derive(Default)]
struct Batch {
    inodes: Vec<(String, Vec<u8>)>,
    entries: Vec<(String, OsString, String)>,
    removed_entries: Vec<(String, OsString)>,
    removed_inodes: Vec<String>,
    /// Directories' times (`P/ns/t/`).
    times: Vec<(String, Vec<u8>)>,
}

/// A directory's times as `P/ns/t/<id>` stores them: modification and
/// change time, nanoseconds since the epoch.
fn encode_times(mtime: SystemTime, ctime: SystemTime) -> Vec<u8> {
    let ns = |t: SystemTime| t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{} {}", ns(mtime), ns(ctime)).into_bytes()
}

fn decode_times(v: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let text = std::str::from_utf8(v).ok()?;
    let mut parts = text.split(' ').map(|p| p.parse::<u64>().ok().map(|n| UNIX_EPOCH + Duration::from_nanos(n)));
    let (m, c) = (parts.next()??, parts.next()??);
    parts.next().is_none().then_some((m, c))
}

/// Whether `i` differs from the directory value `stored` only in what a
/// change of its names moves: times, size, link count (readers take
/// those from the entries), version and local number.
fn only_names_moved(stored: &[u8], i: &crate::namespace::Inode, extra: &Extra) -> bool {
    let Some((s, sx)) = decode_object_head(stored) else { return false };
    s.kind == Kind::Dir
        && i.kind == Kind::Dir
        && (s.perm, s.uid, s.gid, s.rdev, s.atime, s.crtime) == (i.perm, i.uid, i.gid, i.rdev, i.atime, i.crtime)
        && s.xattrs == i.xattrs
        && sx == *extra
}

impl EtcdNamespace {
    /// Join the namespace under `prefix` (read at the first catch-up).
    pub fn open(client: Arc<Client>, session: Arc<HostSession>, prefix: &str, copy_lag: Duration) -> EtcdNamespace {
        let tag = format!("{:x}", session.lease().0);
        EtcdNamespace::with(client, Some(session), prefix, tag, copy_lag)
    }

    fn with(
        client: Arc<Client>,
        session: Option<Arc<HostSession>>,
        prefix: &str,
        tag: String,
        copy_lag: Duration,
    ) -> EtcdNamespace {
        let mut n = EtcdNamespace {
            client: client.clone(),
            session,
            base: format!("{prefix}/ns/"),
            tag,
            to_ino: HashMap::new(),
            to_id: HashMap::new(),
            revs: HashMap::new(),
            tombstones: Vec::new(),
            floor: 0,
            applied: 0,
            desync: true,
            feed: None,
            reloads: 0,
            replayed: 0,
            conflicts: 0,
            undone: Vec::new(),
            stale: false,
            in_flight: HashSet::new(),
            skipped: Vec::new(),
            barrier: Arc::new(EtcdBarrier {
                rev_key: format!("{prefix}/ns/rev").into_bytes(),
                client: client.clone(),
                rounds: parking_lot::Mutex::new(Rounds::default()),
                round_done: parking_lot::Condvar::new(),
                feed: parking_lot::Mutex::new(None),
                retry_at: parking_lot::Mutex::new(None),
                confirmed: parking_lot::Mutex::new(None),
                max_lag: copy_lag,
            }),
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

    fn times_key(&self, id: &str) -> Vec<u8> {
        self.key(&format!("t/{id}"))
    }

    /// Whether the inode `key` names is a directory, as etcd has it.
    fn stored_dir(&self, key: &[u8]) -> bool {
        match self.revs.get(key) {
            Some((_, Some(v))) => decode_object_head(v).is_some_and(|(i, _)| i.kind == Kind::Dir),
            _ => false,
        }
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

    /// The mod revision the table has for `key` (0: absent).
    fn rev_of(&self, key: &[u8]) -> i64 {
        match self.revs.get(key) {
            Some(&(rev, Some(_))) => rev,
            _ => 0,
        }
    }

    /// Record that etcd has `key` at `rev` with `value` (`None`: deleted).
    fn remember(&mut self, key: Vec<u8>, rev: i64, value: Option<Vec<u8>>) {
        if value.is_none() {
            self.tombstones.push((rev, key.clone()));
        }
        self.revs.insert(key, (rev, value));
    }

    /// Forget the deletions the feed has passed (`applied`): a change that
    /// does not land is undone to what the table has, and no event older
    /// than them can come any more.
    fn forget_passed_deletions(&mut self) {
        let applied = self.applied;
        let revs = &mut self.revs;
        self.tombstones.retain(|(rev, key)| {
            if *rev > applied {
                return true;
            }
            if revs.get(key).is_some_and(|&(r, ref v)| v.is_none() && r <= applied) {
                revs.remove(key);
            }
            false
        });
    }

    /// Sort an event of revision `rev` into `batch`, unless the table has
    /// that key at `rev` or later already (keys outside inodes and entries
    /// are not the table's).
    fn sort(&mut self, batch: &mut Batch, key: &[u8], value: Option<&[u8]>, rev: i64) {
        let Some(rest) = key.strip_prefix(self.base.as_bytes()) else { return };
        if !rest.starts_with(b"i/") && !rest.starts_with(b"e/") && !rest.starts_with(b"t/") {
            return;
        }
        if rev <= self.floor || self.revs.get(key).is_some_and(|&(r, _)| r >= rev) {
            return;
        }
        if self.in_flight.contains(key) {
            self.skipped.push(rev);
            return;
        }
        self.remember(key.to_vec(), rev, value.map(<[u8]>::to_vec));
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
        } else if let (Some(id), Some(v)) = (rest.strip_prefix(b"t/"), value) {
            batch.times.push((String::from_utf8_lossy(id).into_owned(), v.to_vec()));
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
        for (id, v) in batch.times {
            let (Some(&ino), Some((m, c))) = (self.to_ino.get(&id), decode_times(&v)) else { continue };
            if let Ok(i) = ns.get_mut(ino) {
                i.mtime = i.mtime.max(m);
                i.ctime = i.ctime.max(c);
            }
        }
        Ok(())
    }

    /// Create or update the inode `id` from its stored value.
    fn apply_inode(&mut self, ns: &mut Namespace, id: String, v: &[u8], caught: &mut Caught) -> Result<()> {
        let times = self.times_key(&id);
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
        let mut n = *new;
        if n.kind == Kind::Dir {
            // Times a change of its names stored since are later.
            if let Some((_, Some(tv))) = self.revs.get(&times) {
                if let Some((m, c)) = decode_times(tv) {
                    n.mtime = n.mtime.max(m);
                    n.ctime = n.ctime.max(c);
                }
            }
        }
        if n.kind == Kind::Dir && ns.get(ino).is_ok_and(|i| i.perm & 0o111 == 0o111) && n.perm & 0o111 != 0o111 {
            caught.unsearchable.push(ino);
        }
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

    /// Read the whole namespace, make the table match it, and follow the
    /// feed from there.
    fn reload(&mut self, ns: &mut Namespace) -> Result<Caught> {
        let base = self.base.clone().into_bytes();
        let (kvs, at) = self.client.range(&base, &prefix_end(&base)).map_err(unreachable)?;
        let caught = self.install(ns, &kvs, at)?;
        self.reloads += 1;
        match &self.feed {
            Some(f) => f.restart(at),
            None if self.session.is_some() => {
                let feed = Feed::start(self.client.clone(), base, at);
                *self.barrier.feed.lock() = Some(feed.clone());
                self.feed = Some(feed);
            }
            None => {}
        }
        Ok(caught)
    }

    /// Make the table match `kvs`, the whole namespace as read at revision `at`.
    fn install(&mut self, ns: &mut Namespace, kvs: &[Kv], at: i64) -> Result<Caught> {
        let mut batch = Batch::default();
        let mut stored: HashSet<String> = HashSet::new();
        let mut wanted: HashMap<(String, OsString), String> = HashMap::new();
        self.revs.clear();
        self.tombstones.clear();
        self.floor = 0;
        for kv in kvs {
            self.sort(&mut batch, &kv.key, Some(&kv.value), kv.mod_revision);
        }
        self.floor = at;
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
        self.applied = at;
        self.desync = false;
        Ok(caught)
    }

    /// Apply what the feed queued, through namespace revision `to` at least.
    fn drain(&mut self, ns: &mut Namespace, to: i64) -> Result<Caught> {
        let Some(feed) = self.feed.clone() else { return self.reload(ns) };
        let deadline = Instant::now() + self.client.timeout();
        let Some(queued) = feed.take_through(to, deadline) else {
            // Lost events, or a watch too slow to deliver: one read instead.
            return self.reload(ns);
        };
        self.apply_queued(ns, queued)
    }

    /// Apply the feed's events, revision by revision.
    fn apply_queued(&mut self, ns: &mut Namespace, queued: Vec<(i64, Vec<super::client::Event>)>) -> Result<Caught> {
        let mut caught = Caught::default();
        let mut deleted = false;
        for (rev, events) in queued {
            deleted |= events.iter().any(|e| e.deleted);
            let mut b = Batch::default();
            for e in &events {
                self.sort(&mut b, &e.kv.key, (!e.deleted).then_some(&e.kv.value[..]), rev);
            }
            if let Err(e) = self.apply(ns, b, &mut caught) {
                self.desync = true;
                return Err(e);
            }
            self.applied = self.applied.max(rev);
            self.replayed += 1;
        }
        // Deletions the feed has passed need no remembering.
        if deleted {
            self.forget_passed_deletions();
        }
        ns.clear_dirty();
        Ok(caught)
    }

    /// Undo a change that did not land: make the table what etcd had as
    /// this host last knew it (no round trip; a re-read when that fails).
    /// Returns `e`, the change's answer.
    fn undo(&mut self, ns: &mut Namespace, e: Error) -> Error {
        let kvs: Vec<Kv> = self
            .revs
            .iter()
            .filter_map(|(k, (rev, v))| {
                v.as_ref().map(|v| Kv { key: k.clone(), value: v.clone(), mod_revision: *rev, ..Kv::default() })
            })
            .collect();
        let at = self.floor.max(self.applied);
        // Putting back what etcd has changes no file for the processes'
        // views either: each inode keeps its version (SPEC 6), or a
        // process that observed a file would find it changed by another's
        // lost attempt (or its own) and its rename over it refused ESTALE.
        let versions: Vec<(Ino, u64)> = ns.inodes().map(|i| (i.ino, i.version)).collect();
        match self.install(ns, &kvs, at) {
            Ok(mut c) => {
                for (ino, v) in versions {
                    if ns.get(ino).is_ok_and(|i| i.version != v) {
                        if let Ok(i) = ns.get_mut(ino) {
                            i.version = v;
                        }
                    }
                }
                ns.clear_dirty();
                // Names put back as they were never pointed anywhere else
                // in the stored history: not news for processes' views
                // (a process whose rename lost its compare would otherwise
                // find its own name re-pointed, and its retry ESTALE).
                c.removed_names.clear();
                c.added_names.clear();
                self.undone.push(c)
            }
            Err(_) => self.desync = true,
        }
        e
    }

    /// `c` and what undoing changes changed before it.
    fn with_undone(&mut self, mut c: Caught) -> Caught {
        for u in self.undone.drain(..).rev() {
            let mut u = u;
            u.extras.append(&mut c.extras);
            u.unlinked.append(&mut c.unlinked);
            u.removed_names.append(&mut c.removed_names);
            u.added_names.append(&mut c.added_names);
            u.unsearchable.append(&mut c.unsearchable);
            c = u;
        }
        c
    }

    /// Apply what the feed has queued, without asking etcd (a re-read when
    /// the table is known to differ).
    fn quick(&mut self, ns: &mut Namespace) -> Result<Caught> {
        let queued = match &self.feed {
            Some(f) if !self.desync => f.take_ready(),
            _ => None,
        };
        let Some(queued) = queued else { return self.reload(ns) };
        self.apply_queued(ns, queued)
    }

    /// Bring the table up to namespace revision `to`.
    fn follow(&mut self, ns: &mut Namespace, to: i64) -> Result<Caught> {
        if self.desync || self.feed.as_ref().is_none_or(|f| f.broken()) {
            return self.reload(ns);
        }
        if to <= self.applied {
            return Ok(Caught::default());
        }
        self.drain(ns, to)
    }

    /// The compares and writes that store what changed in `ns`; the keys
    /// written, with whether they stay.
    fn changes(&mut self, ns: &Namespace, extra: &dyn Fn(Ino) -> Extra) -> Result<Changes> {
        let (dirty, freed) = ns.dirty();
        let dirty: Vec<Ino> = dirty.iter().copied().collect();
        let freed: Vec<Ino> = freed.iter().copied().collect();
        let mut ops = Vec::new();
        let mut written: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut blind: HashSet<Vec<u8>> = HashSet::new();
        // Keys compared without being written: directories whose names
        // changed (they must still be as this host knew them), and removed
        // directories' entries (none may be left).
        let mut guards: Vec<Vec<u8>> = Vec::new();
        let mut empty: Vec<Vec<u8>> = Vec::new();
        // Directories a directory moved into: their ancestors are compared too.
        let mut moved_into: Vec<Ino> = Vec::new();
        let named = |ns: &Namespace, ino: Ino| ns.get(ino).is_ok_and(|i| i.nlink > 0 || ino == Ino::ROOT);
        // A directory made, moved or removed: the directories whose names
        // change are written whole and compared, as the ancestors of a
        // moved directory are (two crossing moves must conflict).
        let structural = dirty.iter().any(|&ino| {
            let Ok(Body::Dir(d)) = ns.get(ino).map(|i| &i.body) else { return false };
            let Some(id) = self.to_id.get(&ino) else { return true };
            d.dirty_names().any(|name| {
                let now = d.get(name).is_some_and(|c| ns.get(c).is_ok_and(|c| c.kind == Kind::Dir));
                let before = match self.revs.get(&self.entry_key(id, name)) {
                    Some((_, Some(child))) => self.stored_dir(&self.inode_key(&String::from_utf8_lossy(child))),
                    _ => false,
                };
                now || before
            })
        });
        for &ino in &dirty {
            if !named(ns, ino) {
                if let Some(id) = self.to_id.get(&ino).cloned() {
                    self.remove_inode(&id, &mut ops, &mut written, &mut blind, &mut empty);
                }
                continue;
            }
            let i = ns.get(ino)?;
            if let Body::File(d) = &i.body {
                if d.size() > MAX_FILE {
                    return Err(Error::FileTooBig);
                }
            }
            let id = self.id_of(ino);
            let k = self.inode_key(&id);
            let x = extra(ino);
            // A change of names alone (not a `utime`, which may set times
            // back: the directory's value carries those).
            let renamed = matches!(&i.body, Body::Dir(d) if d.dirty_names().next().is_some());
            let names_only = match self.revs.get(&k) {
                Some((_, Some(stored))) if renamed && !structural => only_names_moved(stored, i, &x),
                _ => false,
            };
            let tk = self.times_key(&id);
            if names_only {
                let tv = encode_times(i.mtime, i.ctime);
                ops.push(Op::put(tk.clone(), tv.clone(), 0));
                written.push((tk.clone(), Some(tv)));
                blind.insert(tk);
                guards.push(k);
            } else {
                let v = encode_object(i, &x);
                ops.push(Op::put(k.clone(), v.clone(), 0));
                written.push((k, Some(v)));
                // The value now carries the directory's times, earlier
                // ones too: stored times no longer stand over them.
                self.drop_times(tk, &mut ops, &mut written, &mut blind);
            }
            if let Body::Dir(d) = &i.body {
                for name in d.dirty_names() {
                    let key = self.entry_key(&id, name);
                    match d.get(name) {
                        Some(c) if named(ns, c) => {
                            let unstored = !dirty.contains(&c) && !self.to_id.contains_key(&c);
                            let cid = self.id_of(c);
                            if unstored {
                                let ck = self.inode_key(&cid);
                                let v = encode_object(ns.get(c)?, &extra(c));
                                ops.push(Op::put(ck.clone(), v.clone(), 0));
                                written.push((ck, Some(v)));
                            }
                            if ns.get(c).is_ok_and(|i| i.kind == Kind::Dir) {
                                moved_into.push(ino);
                            }
                            ops.push(Op::put(key.clone(), cid.clone(), 0));
                            written.push((key, Some(cid.into_bytes())));
                        }
                        _ => {
                            ops.push(Op::delete(key.clone()));
                            written.push((key, None));
                        }
                    }
                }
            }
        }
        for ino in freed {
            if let Some(id) = self.to_id.get(&ino).cloned() {
                self.remove_inode(&id, &mut ops, &mut written, &mut blind, &mut empty);
            }
        }
        let mut compared: HashSet<Vec<u8>> = HashSet::new();
        let mut cmp = Vec::new();
        for k in written.iter().map(|(k, _)| k).filter(|k| !blind.contains(*k)).chain(&guards) {
            if compared.insert(k.clone()) {
                cmp.push(Compare::unchanged(k.clone(), self.rev_of(k)));
            }
        }
        cmp.extend(empty.into_iter().map(Compare::none_under));
        for dir in moved_into {
            let mut at = dir;
            while at != Ino::ROOT {
                let Ok(Body::Dir(d)) = ns.get(at).map(|i| &i.body) else { break };
                at = d.parent;
                if let Some(id) = self.to_id.get(&at).cloned() {
                    let k = self.inode_key(&id);
                    if compared.insert(k.clone()) {
                        cmp.push(Compare::unchanged(k.clone(), self.rev_of(&k)));
                    }
                }
            }
        }
        Ok(Changes { compares: cmp, ops, written, blind })
    }

    /// Delete inode `id` from the store; a directory's times go with it,
    /// and it is compared to have no entries left (another host's change
    /// of its names does not write the directory's value).
    fn remove_inode(
        &self,
        id: &str,
        ops: &mut Vec<Op>,
        written: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
        blind: &mut HashSet<Vec<u8>>,
        empty: &mut Vec<Vec<u8>>,
    ) {
        let k = self.inode_key(id);
        if self.stored_dir(&k) {
            empty.push(self.key(&format!("e/{id}/")));
            self.drop_times(self.times_key(id), ops, written, blind);
        }
        ops.push(Op::delete(k.clone()));
        written.push((k, None));
    }

    /// Delete a directory's times key `tk`, blindly, if etcd has it.
    fn drop_times(
        &self,
        tk: Vec<u8>,
        ops: &mut Vec<Op>,
        written: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
        blind: &mut HashSet<Vec<u8>>,
    ) {
        if matches!(self.revs.get(&tk), Some((_, Some(_)))) {
            ops.push(Op::delete(tk.clone()));
            written.push((tk.clone(), None));
            blind.insert(tk);
        }
    }
}

impl Replica for EtcdNamespace {
    fn barrier(&self) -> Arc<dyn Barrier> {
        self.barrier.clone()
    }

    fn catch_up_to(&mut self, ns: &mut Namespace, target: Result<i64>) -> Result<Caught> {
        let out = target.and_then(|to| self.follow(ns, to)).map(|c| self.with_undone(c));
        self.stale = out.is_err();
        out
    }

    fn catch_up_quick(&mut self, ns: &mut Namespace) -> Result<Caught> {
        let out = self.quick(ns).map(|c| self.with_undone(c));
        self.stale = out.is_err();
        out
    }

    fn catch_up_queued(&mut self, ns: &mut Namespace) -> Result<Caught> {
        if self.desync || self.feed.as_ref().is_none_or(|f| f.broken()) {
            return Ok(Caught::default());
        }
        self.catch_up_quick(ns)
    }

    fn begin(&mut self, ns: &mut Namespace, target: Option<Result<i64>>) -> Result<Caught> {
        if self.session.as_ref().and_then(|s| s.alive()).is_none() {
            return Err(Error::Unreachable);
        }
        // A change always asks etcd: reads after it may too.
        *self.barrier.retry_at.lock() = None;
        let caught = match target {
            Some(t) => self.catch_up_to(ns, t),
            None => self.quick(ns).map(|c| self.with_undone(c)),
        };
        ns.clear_dirty();
        caught
    }

    fn applied(&self) -> i64 {
        self.applied
    }

    fn prepare(
        &mut self,
        ns: &mut Namespace,
        extra: &dyn Fn(Ino) -> Extra,
        conditions: &[Condition],
    ) -> Result<Option<Box<dyn Publication>>> {
        let changes = self.changes(ns, extra);
        ns.clear_dirty();
        let Changes { compares: mut cmp, mut ops, written, blind } = match changes {
            Ok(c) => c,
            Err(e) => return Err(self.undo(ns, e)),
        };
        if ops.is_empty() && conditions.is_empty() {
            return Ok(None);
        }
        if !ops.is_empty() {
            ops.push(Op::put(self.key("rev"), self.tag.clone(), 0));
        }
        for c in conditions {
            match c {
                Condition::Held { key, create_revision } => {
                    cmp.push(Compare::new(key.clone(), CmpOp::Equal, Target::Create(*create_revision)));
                }
                Condition::Claim { key, mod_revision, value, .. } => {
                    cmp.push(Compare::unchanged(key.clone(), *mod_revision));
                    ops.push(Op::put(key.clone(), value.clone(), 0));
                }
                Condition::Reattach { key, mod_revision, alive, .. } => {
                    cmp.push(Compare::unchanged(key.clone(), *mod_revision));
                    cmp.push(Compare::new(alive.clone(), CmpOp::Greater, Target::Version(0)));
                }
                Condition::Free { prefix, .. } => cmp.push(Compare::none_under(prefix.clone())),
                Condition::NoSolo { key, exists: true, .. } => {
                    cmp.push(Compare::new(key.clone(), CmpOp::Less, Target::Value(SOLO_FROM.to_vec())));
                }
                Condition::NoSolo { key, exists: false, .. } => cmp.push(Compare::absent(key.clone())),
                Condition::HeldSolo { counter, value, session, .. } => {
                    cmp.push(Compare::new(counter.clone(), CmpOp::Equal, Target::Value(value.clone())));
                    // Its session alive, as a holder's entry would be.
                    cmp.push(Compare::new(session.clone(), CmpOp::Greater, Target::Version(0)));
                }
            }
        }
        let reads: Vec<Op> = conditions
            .iter()
            .map(|c| match c {
                Condition::Free { prefix, .. } => Op::get_prefix(prefix.clone()),
                _ => Op::get(c.key().to_vec()),
            })
            .collect();
        self.in_flight = written.iter().map(|(k, _)| k.clone()).filter(|k| !blind.contains(k)).collect();
        self.skipped.clear();
        Ok(Some(Box::new(EtcdPublication {
            client: self.client.clone(),
            compares: cmp,
            ops,
            reads,
            written,
            conditions: conditions.to_vec(),
            answer: None,
        })))
    }

    fn settle(&mut self, ns: &mut Namespace, p: Box<dyn Publication>) -> Result<()> {
        let Ok(p) = p.into_any().downcast::<EtcdPublication>() else {
            return Err(self.undo(ns, Error::Unreachable));
        };
        let EtcdPublication { written, conditions, answer, .. } = *p;
        self.in_flight.clear();
        let skipped = std::mem::take(&mut self.skipped);
        let own = match &answer {
            Some(Ok(t)) if t.succeeded => Some(t.revision),
            _ => None,
        };
        if skipped.iter().any(|&r| Some(r) != own) {
            // Another host's change of these keys was held back: read again.
            self.desync = true;
        }
        match answer {
            Some(Ok(t)) if t.succeeded => {
                for c in &conditions {
                    if let Condition::Claim { value, seen, .. } = c {
                        seen(Some((value, t.revision)));
                    }
                }
                let inodes = self.key("i/");
                for (k, v) in written {
                    // An inode this change removed from the store: its id
                    // goes (its own event is skipped below, so the feed
                    // would never take it away).
                    if v.is_none() {
                        if let Some(id) = k.strip_prefix(inodes.as_slice()) {
                            self.unmap(&String::from_utf8_lossy(id));
                        }
                    }
                    // The feed may have brought a later change of the key
                    // while the answer was on its way.
                    match self.revs.get(&k) {
                        Some((r, _)) if *r > t.revision => {}
                        _ => {
                            self.remember(k, t.revision, v);
                        }
                    }
                }
                Ok(())
            }
            Some(Ok(t)) => {
                let mut lost = false;
                for (c, r) in conditions.iter().zip(&t.responses) {
                    let kvs = match r {
                        OpResult::Range(kvs) => kvs.as_slice(),
                        _ => &[],
                    };
                    let kv = kvs.first();
                    match c {
                        Condition::Held { create_revision, .. } => {
                            lost |= kv.is_none_or(|k| k.create_revision != *create_revision);
                        }
                        // Decided again on the counter as it is now.
                        Condition::Claim { seen, .. } | Condition::Reattach { seen, .. } => {
                            seen(kv.map(|k| (k.value.as_slice(), k.mod_revision)))
                        }
                        // Decided again, asking etcd whether it is held.
                        Condition::Free { busy, .. } if !kvs.is_empty() => busy(),
                        Condition::Free { .. } => {}
                        Condition::NoSolo { seen, .. } => seen(kv.map(|k| (k.value.as_slice(), k.mod_revision))),
                        // Its entry, written by a waiter: still held.
                        Condition::HeldSolo { moved, .. } if kv.is_some() => {
                            moved(kv.map_or(0, |k| k.create_revision));
                        }
                        Condition::HeldSolo { .. } => lost = true,
                    }
                }
                if lost {
                    // The guarding lease is no longer held.
                    tracing::warn!("shared namespace: a guarded write came after its lease was lost; refused");
                    Err(self.undo(ns, Error::Stale(crate::error::Stale::LeaseLost)))
                } else {
                    self.conflicts += 1;
                    Err(self.undo(ns, Error::Conflict))
                }
            }
            // Landed or not: if it did, the feed brings it back.
            Some(Err(e)) => {
                let e = unreachable(e);
                Err(self.undo(ns, e))
            }
            None => Err(self.undo(ns, Error::Unreachable)),
        }
    }

    fn max_file_size(&self) -> u64 {
        MAX_FILE
    }

    fn status(&self) -> serde_json::Value {
        let barriers = {
            let r = self.barrier.rounds.lock();
            json!({"sent": r.sent, "shared": r.shared})
        };
        json!({
            "revision": self.applied,
            "inodes": self.to_ino.len(),
            "keys": self.revs.len(),
            "tombstones": self.tombstones.len(),
            "reloads": self.reloads,
            "replayed": self.replayed,
            "conflicts": self.conflicts,
            "stale": self.stale || self.desync,
            "barriers": barriers,
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
        (
            EtcdNamespace::with(client, None, "p", "h".into(), Duration::from_secs(1)),
            Namespace::new(0o755, 0, 0, UNIX_EPOCH),
        )
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
        let rev = t.applied + 1;
        t.applied = rev;
        for (k, v) in evs {
            t.sort(&mut b, k.as_bytes(), v.as_deref(), rev);
        }
        let mut c = Caught::default();
        t.apply(ns, b, &mut c).unwrap();
        c
    }

    /// A table that has one file, `name` (inode `o.1`) holding `v1`.
    fn with_file(name: &str) -> (EtcdNamespace, Namespace) {
        let (mut t, mut ns) = table();
        let entry = format!("p/ns/e/r/{name}");
        events(&mut t, &mut ns, &[("p/ns/i/o.1", Some(value(Kind::File, "v1"))), (&entry, Some(b"o.1".to_vec()))]);
        (t, ns)
    }

    fn read(ns: &Namespace, dir: Ino, name: &str) -> String {
        let ino = ns.child(dir, OsStr::new(name)).unwrap();
        String::from_utf8(ns.get(ino).unwrap().data().unwrap().read(0, 100)).unwrap()
    }

    #[test]
    fn a_renewal_by_rename_from_another_host_re_points_the_name() {
        let (mut t, mut ns) = with_file("l.json");
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
    fn an_inode_this_host_removed_from_the_store_leaves_the_id_table() {
        // Another host's file, renewed over by a rename made here: the old
        // inode's key is deleted by this host's change, whose own event the
        // feed then skips. A host renewing a lease this way for a day must
        // not keep an id per renewal.
        let (mut t, mut ns) = with_file("l.json");
        ns.set_tracking();
        let old = ns.child(Ino::ROOT, OsStr::new("l.json")).unwrap();
        ns.unlink(Ino::ROOT, OsStr::new("l.json")).unwrap();
        let mut p = publish(&mut t, &mut ns);
        assert!(p.written.contains(&(b"p/ns/i/o.1".to_vec(), None)), "{:?}", p.written);
        // A file's removal compares no directory to be empty.
        let (_, dels, cmps) = shape(&p);
        assert!(dels.iter().all(|d| !d.starts_with("p/ns/t/")), "{dels:?}");
        assert!(cmps.iter().all(|c| !c.ends_with('*')), "{cmps:?}");
        p.answer = Some(Ok(TxnResult { succeeded: true, revision: t.applied + 1, responses: vec![] }));
        t.settle(&mut ns, p).unwrap();
        assert!(!t.to_ino.contains_key("o.1") && !t.to_id.contains_key(&old));
        assert_eq!(t.to_ino.len(), 1, "{:?}", t.to_ino);
        // A change that did not land keeps it until the store says otherwise.
        let (mut t, mut ns) = with_file("l.json");
        ns.set_tracking();
        ns.unlink(Ino::ROOT, OsStr::new("l.json")).unwrap();
        let mut p = publish(&mut t, &mut ns);
        p.answer = Some(Ok(TxnResult { succeeded: false, revision: t.applied + 1, responses: vec![] }));
        assert_eq!(t.settle(&mut ns, p), Err(Error::Conflict));
        assert!(t.to_ino.contains_key("o.1"));
        assert_eq!(read(&ns, Ino::ROOT, "l.json"), "v1");
    }

    /// The keys `p` puts, deletes and compares.
    fn shape(p: &EtcdPublication) -> (Vec<String>, Vec<String>, Vec<String>) {
        let text = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
        let mut puts = Vec::new();
        let mut dels = Vec::new();
        for op in &p.ops {
            match op {
                Op::Put { key, .. } => puts.push(text(key)),
                Op::Delete { key, .. } => dels.push(text(key)),
                Op::Get { .. } => {}
            }
        }
        let cmps = p
            .compares
            .iter()
            .map(|c| if c.range_end.is_empty() { text(&c.key) } else { format!("{}*", text(&c.key)) })
            .collect();
        (puts, dels, cmps)
    }

    fn publish(t: &mut EtcdNamespace, ns: &mut Namespace) -> Box<EtcdPublication> {
        let p = t.prepare(ns, &|_| Extra::default(), &[]).unwrap().unwrap();
        p.into_any().downcast::<EtcdPublication>().unwrap()
    }

    #[test]
    fn a_new_name_writes_its_directorys_times_and_compares_its_value_unwritten() {
        let (mut t, mut ns) = with_file("f");
        events(&mut t, &mut ns, &[("p/ns/i/r", Some(value(Kind::Dir, "")))]);
        ns.set_tracking();
        let file = NewInode { kind: Kind::File, perm: 0o644, uid: 0, gid: 0, rdev: 0, symlink: None };
        let g = ns.alloc(file, Ino::ROOT, UNIX_EPOCH);
        ns.link(Ino::ROOT, OsStr::new("g"), g).unwrap();
        let later = UNIX_EPOCH + Duration::from_secs(7);
        ns.get_mut(Ino::ROOT).unwrap().mtime = later;
        let mut p = publish(&mut t, &mut ns);
        let (puts, dels, cmps) = shape(&p);
        assert!(puts.contains(&"p/ns/t/r".to_string()) && !puts.contains(&"p/ns/i/r".to_string()), "{puts:?}");
        assert!(dels.is_empty(), "{dels:?}");
        // The directory must still be as known; its times are not compared
        // (another host's new name in it does not conflict with this one).
        assert!(cmps.contains(&"p/ns/i/r".to_string()) && !cmps.contains(&"p/ns/t/r".to_string()), "{cmps:?}");
        assert!(cmps.contains(&"p/ns/e/r/g".to_string()), "{cmps:?}");
        assert!(!t.in_flight.contains(b"p/ns/t/r".as_slice()) && t.in_flight.contains(b"p/ns/e/r/g".as_slice()));
        let rev = t.applied + 1;
        p.answer = Some(Ok(TxnResult { succeeded: true, revision: rev, responses: vec![] }));
        t.settle(&mut ns, p).unwrap();
        assert_eq!(t.rev_of(b"p/ns/t/r"), rev);
        // A directory made in it: the directory's value is written whole
        // (its link count; crossing moves of directories must conflict).
        ns.clear_dirty();
        let dir = NewInode { kind: Kind::Dir, perm: 0o755, uid: 0, gid: 0, rdev: 0, symlink: None };
        let d = ns.alloc(dir, Ino::ROOT, UNIX_EPOCH);
        ns.link(Ino::ROOT, OsStr::new("d"), d).unwrap();
        let p = publish(&mut t, &mut ns);
        let (puts, _, cmps) = shape(&p);
        assert!(puts.contains(&"p/ns/i/r".to_string()) && !puts.contains(&"p/ns/t/r".to_string()), "{puts:?}");
        assert!(cmps.contains(&"p/ns/i/r".to_string()), "{cmps:?}");
    }

    #[test]
    fn a_removed_directory_is_compared_empty_and_its_times_go_with_it() {
        let (mut t, mut ns) = table();
        events(
            &mut t,
            &mut ns,
            &[
                ("p/ns/i/r", Some(value(Kind::Dir, ""))),
                ("p/ns/i/o.1", Some(value(Kind::Dir, ""))),
                ("p/ns/e/r/d", Some(b"o.1".to_vec())),
                ("p/ns/t/o.1", Some(encode_times(UNIX_EPOCH, UNIX_EPOCH))),
            ],
        );
        ns.set_tracking();
        ns.unlink(Ino::ROOT, OsStr::new("d")).unwrap();
        let p = publish(&mut t, &mut ns);
        let (_, dels, cmps) = shape(&p);
        assert!(dels.contains(&"p/ns/i/o.1".to_string()) && dels.contains(&"p/ns/t/o.1".to_string()), "{dels:?}");
        // Another host may have made a name in it without writing its value.
        assert!(cmps.contains(&"p/ns/e/o.1/*".to_string()), "{cmps:?}");
        assert!(!cmps.contains(&"p/ns/t/o.1".to_string()), "{cmps:?}");
        // The root's value is written whole: a directory left it.
        assert!(shape(&p).0.contains(&"p/ns/i/r".to_string()));
    }

    #[test]
    fn a_directorys_times_from_another_host_are_taken_only_when_later() {
        let (mut t, mut ns) = table();
        events(&mut t, &mut ns, &[("p/ns/i/r", Some(value(Kind::Dir, "")))]);
        let t5 = UNIX_EPOCH + Duration::new(5, 7);
        events(&mut t, &mut ns, &[("p/ns/t/r", Some(encode_times(t5, t5)))]);
        assert_eq!((ns.get(Ino::ROOT).unwrap().mtime, ns.get(Ino::ROOT).unwrap().ctime), (t5, t5));
        // A later value of the directory written by a host whose copy
        // lacked those times (a chmod) does not take them back.
        events(&mut t, &mut ns, &[("p/ns/i/r", Some(value(Kind::Dir, "")))]);
        assert_eq!(ns.get(Ino::ROOT).unwrap().mtime, t5);
        // Earlier times do not either; later ones are taken.
        events(&mut t, &mut ns, &[("p/ns/t/r", Some(encode_times(UNIX_EPOCH, UNIX_EPOCH)))]);
        assert_eq!(ns.get(Ino::ROOT).unwrap().mtime, t5);
        let t9 = UNIX_EPOCH + Duration::from_secs(9);
        events(&mut t, &mut ns, &[("p/ns/t/r", Some(encode_times(t9, t5)))]);
        assert_eq!((ns.get(Ino::ROOT).unwrap().mtime, ns.get(Ino::ROOT).unwrap().ctime), (t9, t5));
        assert_eq!(decode_times(b"1 2 3"), None);
        assert_eq!(decode_times(&encode_times(t9, t5)), Some((t9, t5)));
    }

    #[test]
    fn times_set_back_on_a_directory_are_stored_in_its_value_and_its_times_go() {
        let t9 = UNIX_EPOCH + Duration::from_secs(9);
        // A host whose root's times a change of names moved to t9.
        let root_at = |t9| {
            let (mut t, mut ns) = table();
            events(
                &mut t,
                &mut ns,
                &[("p/ns/i/r", Some(value(Kind::Dir, ""))), ("p/ns/t/r", Some(encode_times(t9, t9)))],
            );
            (t, ns)
        };
        let (mut t, mut ns) = root_at(t9);
        ns.set_tracking();
        // `touch -m -d` of the directory: no name changes.
        let t3 = UNIX_EPOCH + Duration::from_secs(3);
        ns.get_mut(Ino::ROOT).unwrap().mtime = t3;
        let p = publish(&mut t, &mut ns);
        let (puts, dels, _) = shape(&p);
        assert!(puts.contains(&"p/ns/i/r".to_string()) && !puts.contains(&"p/ns/t/r".to_string()), "{puts:?}");
        assert!(dels.contains(&"p/ns/t/r".to_string()), "{dels:?}");
        // Another host applies the change: the time set back stands.
        let (mut o, mut ons) = root_at(t9);
        let v = p.ops.iter().find_map(|op| match op {
            Op::Put { key, value, .. } if key == b"p/ns/i/r" => Some(value.clone()),
            _ => None,
        });
        events(&mut o, &mut ons, &[("p/ns/i/r", v), ("p/ns/t/r", None)]);
        assert_eq!(ons.get(Ino::ROOT).unwrap().mtime, t3);
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
        t.install(&mut ns, &kvs, 9).unwrap();
        assert_eq!(read(&ns, Ino::ROOT, "s"), "renewed");
        assert!(ns.child(Ino::ROOT, OsStr::new("g")).is_err());
        assert_eq!(t.applied, 9);
        assert!(!t.to_ino.contains_key("o.1") && !t.to_ino.contains_key("o.3"));
    }

    #[test]
    fn an_event_no_newer_than_what_the_table_has_is_skipped() {
        let (mut t, mut ns) = with_file("f");
        // This host stored v3 at revision 7 (its own change)...
        let k = b"p/ns/i/o.1".to_vec();
        t.revs.insert(k.clone(), (7, Some(value(Kind::File, "v3"))));
        let mut b = Batch::default();
        // ...so the older v2 of revision 6 coming through the feed is not applied,
        t.sort(&mut b, &k, Some(&value(Kind::File, "v2")), 6);
        // nor its own event of revision 7,
        t.sort(&mut b, &k, Some(&value(Kind::File, "v3")), 7);
        assert!(b.inodes.is_empty());
        // while another host's later change is.
        t.sort(&mut b, &k, Some(&value(Kind::File, "v4")), 8);
        t.apply(&mut ns, b, &mut Caught::default()).unwrap();
        assert_eq!(read(&ns, Ino::ROOT, "f"), "v4");
        // Nothing at or before the revision of a whole read is applied again.
        t.floor = 20;
        let mut b = Batch::default();
        t.sort(&mut b, b"p/ns/e/r/g", Some(b"o.1"), 20);
        assert!(b.entries.is_empty());
        assert_eq!(t.rev_of(b"p/ns/e/r/g"), 0);
        assert_eq!(t.rev_of(&k), 8);
    }

    #[test]
    fn a_change_that_did_not_land_is_undone_to_what_etcd_has_without_asking_it() {
        let (mut t, mut ns) = with_file("f");
        let f = ns.child(Ino::ROOT, OsStr::new("f")).unwrap();
        // A change decided here: f rewritten, a new name made, then lost.
        ns.account(f, |i| i.data_mut()?.write(0, b"XX")).unwrap();
        let new = NewInode { kind: Kind::File, perm: 0o644, uid: 0, gid: 0, rdev: 0, symlink: None };
        let n = ns.alloc(new, Ino::ROOT, UNIX_EPOCH);
        ns.link(Ino::ROOT, OsStr::new("new"), n).unwrap();
        assert_eq!(t.undo(&mut ns, Error::Conflict), Error::Conflict);
        assert_eq!(read(&ns, Ino::ROOT, "f"), "v1");
        assert!(ns.child(Ino::ROOT, OsStr::new("new")).is_err());
        assert!(!t.desync);
        // The inode the undo took the name from is reported with the next
        // catch-up (to be collected); no name is reported re-pointed: the
        // stored history never had "new", so no process's view went stale.
        let c = t.with_undone(Caught::default());
        assert!(c.unlinked.contains(&n), "{c:?}");
        assert!(c.removed_names.is_empty() && c.added_names.is_empty(), "{c:?}");
    }

    #[test]
    fn an_entry_naming_an_unknown_inode_asks_for_a_re_read() {
        let (mut t, mut ns) = table();
        let mut b = Batch::default();
        t.sort(&mut b, b"p/ns/e/r/x", Some(b"o.9"), 1);
        assert_eq!(t.apply(&mut ns, b, &mut Caught::default()), Err(Error::Unreachable));
        // Keys outside inodes and entries are not the table's.
        let mut b = Batch::default();
        t.sort(&mut b, b"p/ns/rev", Some(b"h"), 2);
        t.sort(&mut b, b"q/ns/i/o.1", Some(b""), 2);
        assert!(b.inodes.is_empty() && b.entries.is_empty());
    }

    #[test]
    fn deletions_the_feed_passed_are_forgotten_and_later_ones_kept() {
        let (mut t, mut ns) = with_file("f");
        let at = t.applied;
        let ev = |key: &str, value: Option<&[u8]>| super::super::client::Event {
            deleted: value.is_none(),
            kv: kv(key, value.unwrap_or_default(), 0),
            prev: None,
        };
        let g = value(Kind::File, "g");
        t.apply_queued(&mut ns, vec![(at + 1, vec![ev("p/ns/i/o.2", Some(&g)), ev("p/ns/e/r/g", Some(b"o.2"))])])
            .unwrap();
        // This host's own removal of f, stored at a revision the feed has
        // not brought yet.
        t.remember(b"p/ns/e/r/f".to_vec(), at + 3, None);
        t.apply_queued(&mut ns, vec![(at + 2, vec![ev("p/ns/e/r/g", None), ev("p/ns/i/o.2", None)])]).unwrap();
        assert!(ns.child(Ino::ROOT, OsStr::new("g")).is_err());
        // g's deletions are passed: forgotten; f's is not: kept, so the
        // feed's older events of f are still skipped.
        assert!(!t.revs.contains_key(b"p/ns/e/r/g".as_slice()) && !t.revs.contains_key(b"p/ns/i/o.2".as_slice()));
        assert_eq!(t.revs.get(b"p/ns/e/r/f".as_slice()), Some(&(at + 3, None)));
        assert_eq!(t.tombstones, vec![(at + 3, b"p/ns/e/r/f".to_vec())]);
        // Every key the table has stays.
        assert_eq!(t.rev_of(b"p/ns/i/o.1"), at);
        // `status` counts them: f's inode, and f's entry kept as deleted.
        let kept = |t: &EtcdNamespace| (t.status()["keys"].clone(), t.status()["tombstones"].clone());
        assert_eq!(kept(&t), (json!(2), json!(1)));
        t.apply_queued(&mut ns, vec![(at + 3, vec![ev("p/ns/e/r/f", None)])]).unwrap();
        assert!(!t.revs.contains_key(b"p/ns/e/r/f".as_slice()) && t.tombstones.is_empty());
        assert_eq!(kept(&t), (json!(1), json!(0)));
    }
}
