//! Bench-only baseline: a minimal fuser filesystem with in-memory locks and
//! none of leasefs's logic (no request hook, no epochs, no identity, no fairness
//! beyond a FIFO queue). `scripts/lockbench.sh` measures leasefs against it.
//!
//! Usage: minimalfs MOUNTPOINT [TTL_SECONDS [punch] [writeback]]   (runs until unmounted; as root)
//!
//! TTL_SECONDS (default 0) is the entry and attribute timeout of every reply:
//! 0 makes the kernel ask for every name and attribute, 1 lets it cache them.
//! `punch` makes it answer `fallocate` (hole punching and allocation, the
//! work `stress-ng --mmap-file` asks for on every page); without it
//! `fallocate` is ENOSYS and the kernel stops sending it after the first.
//! `writeback` turns on the kernel's write-back cache (`FUSE_WRITEBACK_CACHE`:
//! writes are acknowledged from the page cache and sent later), the mode
//! leasefs does not use; it shows what that mode would gain.
//!
//! One flat directory of regular files whose contents are kept in memory,
//! one contiguous buffer per file, served through the kernel's page cache
//! (fuser's defaults: no direct I/O, default readahead); `fsync` has
//! nothing to do. `scripts/databench.sh` measures leasefs's data path
//! against it. Blocked lock waits cannot be interrupted.

use std::collections::{HashMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyWrite, Request,
    WriteFlags,
};
use parking_lot::Mutex;

struct Held {
    owner: u64,
    exclusive: bool,
}

#[derive(Default)]
struct FileLocks {
    held: Vec<Held>,
    waiting: VecDeque<(u64, bool, ReplyEmpty)>,
}

impl FileLocks {
    fn can(&self, owner: u64, exclusive: bool) -> bool {
        self.held.iter().all(|h| h.owner == owner || (!h.exclusive && !exclusive))
    }
    fn grant(&mut self, owner: u64, exclusive: bool) {
        self.held.retain(|h| h.owner != owner);
        self.held.push(Held { owner, exclusive });
    }
    fn drain(&mut self) {
        while let Some((owner, ex, _)) = self.waiting.front() {
            if !self.can(*owner, *ex) {
                break;
            }
            let (owner, ex, reply) = self.waiting.pop_front().expect("front");
            self.grant(owner, ex);
            reply.ok();
        }
    }
}

#[derive(Default)]
struct State {
    /// (parent, name) -> inode.
    names: HashMap<(u64, OsString), u64>,
    dirs: std::collections::HashSet<u64>,
    locks: HashMap<u64, FileLocks>,
    data: HashMap<u64, Vec<u8>>,
    next: u64,
    next_fh: u64,
}

impl State {
    fn attr(&self, ino: u64) -> FileAttr {
        let mut a = attr(ino, self.data.get(&ino).map_or(0, |d| d.len() as u64));
        if self.dirs.contains(&ino) {
            (a.kind, a.perm, a.nlink) = (FileType::Directory, 0o777, 2);
        }
        a
    }

    /// A new inode under `parent`, or the one the name already has.
    fn make(&mut self, parent: u64, name: &OsStr) -> u64 {
        self.next = self.next.max(1) + 1;
        let fresh = self.next;
        *self.names.entry((parent, name.to_os_string())).or_insert(fresh)
    }
}

struct MinimalFs {
    st: Mutex<State>,
}

fn attr(ino: u64, size: u64) -> FileAttr {
    let t = SystemTime::UNIX_EPOCH;
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind: if ino == 1 { FileType::Directory } else { FileType::RegularFile },
        perm: if ino == 1 { 0o777 } else { 0o666 },
        nlink: if ino == 1 { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// The entry and attribute timeout (second argument).
static TTL: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

fn ttl() -> &'static Duration {
    TTL.get_or_init(|| Duration::ZERO)
}

/// Whether `fallocate` is served (argument `punch`).
static PUNCH: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the kernel's write-back cache is asked for (argument `writeback`).
static WRITEBACK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl fuser::Filesystem for MinimalFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS);
        if WRITEBACK.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.st.lock().names.get(&(parent.0, name.to_os_string())).copied();
        match found.as_ref() {
            Some(&ino) => reply.entry(ttl(), &self.st.lock().attr(ino), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        reply.attr(ttl(), &self.st.lock().attr(ino.0));
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.st.lock();
        if let Some(size) = size {
            st.data.entry(ino.0).or_default().resize(size as usize, 0);
        }
        reply.attr(ttl(), &st.attr(ino.0));
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.st.lock();
        let d = st.data.get(&ino.0).map_or(&[][..], |d| &d[..]);
        let from = (offset as usize).min(d.len());
        let to = from.saturating_add(size as usize).min(d.len());
        reply.data(&d[from..to]);
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.st.lock();
        let ino = st.make(parent.0, name);
        st.next_fh += 1;
        reply.created(ttl(), &st.attr(ino), Generation(0), FileHandle(st.next_fh), FopenFlags::empty());
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, _mode: u32, _umask: u32, reply: ReplyEntry) {
        let mut st = self.st.lock();
        let ino = st.make(parent.0, name);
        st.dirs.insert(ino);
        reply.entry(ttl(), &st.attr(ino), Generation(0));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.st.lock();
        match st.names.remove(&(parent.0, name.to_os_string())) {
            Some(ino) => {
                st.data.remove(&ino);
                reply.ok();
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.unlink(req, parent, name, reply);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.st.lock();
        st.next_fh += 1;
        reply.opened(FileHandle(st.next_fh), FopenFlags::empty());
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.st.lock();
        let d = st.data.entry(ino.0).or_default();
        let end = offset as usize + data.len();
        if d.len() < end {
            d.resize(end, 0);
        }
        d[offset as usize..end].copy_from_slice(data);
        reply.written(data.len() as u32);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if !PUNCH.load(std::sync::atomic::Ordering::Relaxed) {
            return reply.error(Errno::ENOSYS);
        }
        let mut st = self.st.lock();
        let d = st.data.entry(ino.0).or_default();
        let end = (offset + length) as usize;
        if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
            let to = end.min(d.len());
            let from = (offset as usize).min(to);
            d[from..to].fill(0);
        } else if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && d.len() < end {
            d.resize(end, 0);
        }
        reply.ok();
    }

    fn flush(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, owner: LockOwner, reply: ReplyEmpty) {
        let mut st = self.st.lock();
        if let Some(l) = st.locks.get_mut(&ino.0) {
            l.held.retain(|h| h.owner != owner.0);
            l.drain();
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st.lock();
        if let (Some(l), Some(o)) = (st.locks.get_mut(&ino.0), owner) {
            l.held.retain(|h| h.owner != o.0);
            l.drain();
        }
        reply.ok();
    }

    fn getlk(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _owner: LockOwner,
        start: u64,
        end: u64,
        _typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        reply.locked(start, end, libc::F_UNLCK, 0);
    }

    fn setlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        owner: LockOwner,
        _start: u64,
        _end: u64,
        typ: i32,
        _pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.st.lock();
        let l = st.locks.entry(ino.0).or_default();
        if typ == libc::F_UNLCK {
            l.held.retain(|h| h.owner != owner.0);
            l.drain();
            return reply.ok();
        }
        let ex = typ == libc::F_WRLCK;
        if l.waiting.is_empty() && l.can(owner.0, ex) {
            l.grant(owner.0, ex);
            reply.ok();
        } else if sleep {
            l.waiting.push_back((owner.0, ex, reply));
        } else {
            reply.error(Errno::EAGAIN);
        }
    }
}

fn main() {
    let mountpoint = std::env::args().nth(1).expect("usage: minimalfs MOUNTPOINT [TTL_SECONDS]");
    let secs: f64 = std::env::args().nth(2).map_or(0.0, |s| s.parse().expect("TTL_SECONDS: a number"));
    let _ = TTL.set(Duration::from_secs_f64(secs));
    let flags: Vec<String> = std::env::args().skip(3).collect();
    PUNCH.store(flags.iter().any(|f| f == "punch"), std::sync::atomic::Ordering::Relaxed);
    WRITEBACK.store(flags.iter().any(|f| f == "writeback"), std::sync::atomic::Ordering::Relaxed);
    let mut config = fuser::Config::default();
    config.mount_options = vec![fuser::MountOption::FSName("minimalfs".into()), fuser::MountOption::DefaultPermissions];
    config.acl = fuser::SessionACL::All;
    let fs = MinimalFs { st: Mutex::new(State::default()) };
    if let Err(e) = fuser::mount(fs, &mountpoint, &config) {
        eprintln!("minimalfs: {e}");
        std::process::exit(1);
    }
}
