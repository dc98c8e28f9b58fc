//! A minimal io_uring: 128-byte submission entries, one issuer (the thread
//! that made the ring), completions delivered when that thread waits.
//! Just what the FUSE transport needs (`IORING_OP_URING_CMD` and a read of
//! an eventfd); see `io_uring_setup(2)` and `io_uring_enter(2)`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

const IORING_SETUP_COOP_TASKRUN: u32 = 1 << 8;
const IORING_SETUP_TASKRUN_FLAG: u32 = 1 << 9;
const IORING_SETUP_SQE128: u32 = 1 << 10;
const IORING_SETUP_SINGLE_ISSUER: u32 = 1 << 12;
const IORING_SETUP_DEFER_TASKRUN: u32 = 1 << 13;
const IORING_ENTER_GETEVENTS: u32 = 1;
/// `IORING_ENTER_EXT_ARG`: the argument is an `io_uring_getevents_arg`.
const IORING_ENTER_EXT_ARG: u32 = 1 << 3;
/// `IORING_SQ_TASKRUN`: task work is waiting for the ring's thread.
const IORING_SQ_TASKRUN: u32 = 1 << 1;
const IORING_OFF_SQ_RING: libc::off_t = 0;
const IORING_OFF_CQ_RING: libc::off_t = 0x800_0000;
const IORING_OFF_SQES: libc::off_t = 0x1000_0000;

/// `IORING_OP_READ`.
pub const OP_READ: u8 = 22;
/// `IORING_OP_URING_CMD`.
pub const OP_URING_CMD: u8 = 46;
/// Size of one submission entry (`IORING_SETUP_SQE128`).
pub const SQE_SIZE: usize = 128;
const CQE_SIZE: usize = 16;

#[repr(C)]
#[derive(Default)]
struct SqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct CqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqOffsets,
    cq_off: CqOffsets,
}

/// One submission entry, built field by field (offsets of `struct
/// io_uring_sqe`).
pub struct Sqe(pub [u8; SQE_SIZE]);

impl Sqe {
    /// An entry for `opcode` on `fd`.
    pub fn new(opcode: u8, fd: RawFd, user_data: u64) -> Sqe {
        let mut s = Sqe([0; SQE_SIZE]);
        s.0[0] = opcode;
        s.0[4..8].copy_from_slice(&fd.to_ne_bytes());
        s.0[32..40].copy_from_slice(&user_data.to_ne_bytes());
        s
    }
    /// `off` (for `IORING_OP_URING_CMD`: `cmd_op` in its low half).
    pub fn off(mut self, v: u64) -> Sqe {
        self.0[8..16].copy_from_slice(&v.to_ne_bytes());
        self
    }
    /// `addr`.
    pub fn addr(mut self, v: u64) -> Sqe {
        self.0[16..24].copy_from_slice(&v.to_ne_bytes());
        self
    }
    /// `len`.
    pub fn len(mut self, v: u32) -> Sqe {
        self.0[24..28].copy_from_slice(&v.to_ne_bytes());
        self
    }
    /// The command area (`cmd`, 80 bytes from offset 48).
    pub fn cmd(mut self, bytes: &[u8]) -> Sqe {
        self.0[48..48 + bytes.len()].copy_from_slice(bytes);
        self
    }
}

/// A memory mapping of the ring's shared areas.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(fd: RawFd, len: usize, offset: libc::off_t) -> io::Result<Map> {
        // SAFETY: a fresh shared mapping of the ring fd at an offset the
        // kernel defines; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map { ptr: ptr.cast(), len })
    }
    /// A pointer `off` bytes into the mapping.
    fn at<T>(&self, off: u32) -> *mut T {
        debug_assert!((off as usize) < self.len);
        // SAFETY: off is an offset the kernel gave inside this mapping.
        unsafe { self.ptr.add(off as usize).cast() }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// An io_uring owned by one thread (its only submitter).
pub struct Ring {
    fd: OwnedFd,
    _sq: Map,
    cq: Map,
    sqes: Map,
    sq_head: *const AtomicU32,
    sq_tail: *const AtomicU32,
    sq_flags: *const AtomicU32,
    sq_mask: u32,
    sq_entries: u32,
    sq_array: *mut u32,
    cq_head: *const AtomicU32,
    cq_tail: *const AtomicU32,
    cq_mask: u32,
    cqes: u32,
    /// Entries written but not yet handed to the kernel.
    unsubmitted: u32,
}

impl Ring {
    /// A ring with room for `entries` submissions (the kernel rounds up).
    pub fn new(entries: u32) -> io::Result<Ring> {
        let mut p = Params {
            flags: IORING_SETUP_SQE128
                | IORING_SETUP_SINGLE_ISSUER
                | IORING_SETUP_DEFER_TASKRUN
                | IORING_SETUP_TASKRUN_FLAG,
            ..Default::default()
        };
        // SAFETY: p is a valid io_uring_params the call fills in.
        let mut fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, entries, &mut p as *mut Params) };
        if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            // Kernels before 6.1 lack deferred task work.
            p = Params {
                flags: IORING_SETUP_SQE128 | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
                ..Default::default()
            };
            // SAFETY: as above.
            fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, entries, &mut p as *mut Params) };
        }
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor from io_uring_setup.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let raw = fd.as_raw_fd();
        let sq = Map::new(raw, p.sq_off.array as usize + p.sq_entries as usize * 4, IORING_OFF_SQ_RING)?;
        let cq = Map::new(raw, p.cq_off.cqes as usize + p.cq_entries as usize * CQE_SIZE, IORING_OFF_CQ_RING)?;
        let sqes = Map::new(raw, p.sq_entries as usize * SQE_SIZE, IORING_OFF_SQES)?;
        // SAFETY: the offsets point at the kernel's u32 fields of the mappings.
        let (sq_mask, cq_mask) = unsafe { (*sq.at::<u32>(p.sq_off.ring_mask), *cq.at::<u32>(p.cq_off.ring_mask)) };
        Ok(Ring {
            sq_head: sq.at(p.sq_off.head),
            sq_tail: sq.at(p.sq_off.tail),
            sq_flags: sq.at(p.sq_off.flags),
            sq_mask,
            sq_entries: p.sq_entries,
            sq_array: sq.at(p.sq_off.array),
            cq_head: cq.at(p.cq_off.head),
            cq_tail: cq.at(p.cq_off.tail),
            cq_mask,
            cqes: p.cq_off.cqes,
            fd,
            _sq: sq,
            cq,
            sqes,
            unsubmitted: 0,
        })
    }

    /// Queue an entry; false when the submission queue is full (call
    /// [`Ring::submit`] first).
    pub fn push(&mut self, sqe: &Sqe) -> bool {
        // SAFETY: head/tail point into the live SQ mapping; the kernel
        // writes head, only this thread writes tail.
        let (head, tail) =
            unsafe { ((*self.sq_head).load(Ordering::Acquire), (*self.sq_tail).load(Ordering::Relaxed)) };
        if tail.wrapping_sub(head) >= self.sq_entries {
            return false;
        }
        let i = tail & self.sq_mask;
        // SAFETY: slot i is inside the SQE array and not owned by the
        // kernel (tail - head < entries); the array has sq_entries slots.
        unsafe {
            std::ptr::copy_nonoverlapping(sqe.0.as_ptr(), self.sqes.at::<u8>(i * SQE_SIZE as u32), SQE_SIZE);
            *self.sq_array.add(i as usize) = i;
            (*self.sq_tail).store(tail.wrapping_add(1), Ordering::Release);
        }
        self.unsubmitted += 1;
        true
    }

    /// Entries pushed and not yet submitted.
    pub fn unsubmitted(&self) -> u32 {
        self.unsubmitted
    }

    /// Hand queued entries to the kernel and, when `wait`, sleep until at
    /// least one completion is ready.
    pub fn submit(&mut self, wait: bool) -> io::Result<()> {
        loop {
            let flags = if wait { IORING_ENTER_GETEVENTS } else { 0 };
            // Deferred task work runs only inside a GETEVENTS enter.
            let flags = flags | if self.ready() { 0 } else { IORING_ENTER_GETEVENTS };
            // SAFETY: a plain io_uring_enter on our ring fd, no argument.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_io_uring_enter,
                    self.fd.as_raw_fd(),
                    self.unsubmitted,
                    u32::from(wait),
                    flags,
                    std::ptr::null::<u8>(),
                    0usize,
                )
            };
            if n >= 0 {
                self.unsubmitted -= (n as u32).min(self.unsubmitted);
                if self.unsubmitted == 0 || wait {
                    return Ok(());
                }
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                // Completions must be reaped before more can be submitted.
                Some(libc::EBUSY) | Some(libc::EAGAIN) => return Ok(()),
                _ => return Err(e),
            }
        }
    }

    /// Hand queued entries to the kernel and sleep until a completion is
    /// ready or `timeout` passed.
    pub fn submit_and_wait_for(&mut self, timeout: std::time::Duration) -> io::Result<()> {
        // struct __kernel_timespec, then struct io_uring_getevents_arg
        // (sigmask, sigmask_sz, min_wait_usec, ts).
        let ts: [i64; 2] = [timeout.as_secs() as i64, i64::from(timeout.subsec_nanos())];
        let mut arg = [0u8; 24];
        arg[16..24].copy_from_slice(&(ts.as_ptr() as u64).to_ne_bytes());
        loop {
            // SAFETY: io_uring_enter on our ring fd with an extended
            // argument that lives (with ts) across the call.
            let n = unsafe {
                libc::syscall(
                    libc::SYS_io_uring_enter,
                    self.fd.as_raw_fd(),
                    self.unsubmitted,
                    1u32,
                    IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
                    arg.as_ptr(),
                    arg.len(),
                )
            };
            if n >= 0 {
                self.unsubmitted -= (n as u32).min(self.unsubmitted);
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ETIME) | Some(libc::EBUSY) | Some(libc::EAGAIN) => return Ok(()),
                _ => return Err(e),
            }
        }
    }

    /// What another thread may read of this ring while it exists.
    pub fn view(&self) -> RingView {
        RingView { sq_flags: self.sq_flags, cq_head: self.cq_head, cq_tail: self.cq_tail }
    }

    /// Whether a completion is waiting.
    fn ready(&self) -> bool {
        // SAFETY: pointers into the live CQ mapping.
        unsafe { (*self.cq_head).load(Ordering::Relaxed) != (*self.cq_tail).load(Ordering::Acquire) }
    }

    /// The next completion: its user data and result.
    pub fn pop(&mut self) -> Option<(u64, i32)> {
        // SAFETY: pointers into the live CQ mapping; only this thread
        // writes head, the kernel writes tail (read with Acquire).
        unsafe {
            let head = (*self.cq_head).load(Ordering::Relaxed);
            if head == (*self.cq_tail).load(Ordering::Acquire) {
                return None;
            }
            let cqe = self.cq.at::<u8>(self.cqes + (head & self.cq_mask) * CQE_SIZE as u32);
            let user_data = std::ptr::read_unaligned(cqe.cast::<u64>());
            let res = std::ptr::read_unaligned(cqe.add(8).cast::<i32>());
            (*self.cq_head).store(head.wrapping_add(1), Ordering::Release);
            Some((user_data, res))
        }
    }
}

/// Pointers into a ring's shared area, for another thread to see whether
/// the ring's own thread has anything waiting. Valid only while the ring
/// exists (its owner clears the view before dropping the ring).
pub struct RingView {
    sq_flags: *const AtomicU32,
    cq_head: *const AtomicU32,
    cq_tail: *const AtomicU32,
}

// SAFETY: the pointers are to atomics in a shared mapping; the owner keeps
// the mapping alive while a view is reachable (see above).
unsafe impl Send for RingView {}
// SAFETY: as above.
unsafe impl Sync for RingView {}

impl RingView {
    /// No completion waiting and no task work pending.
    pub fn quiet(&self) -> bool {
        // SAFETY: valid while the view exists (see the type).
        unsafe {
            (*self.sq_flags).load(Ordering::SeqCst) & IORING_SQ_TASKRUN == 0
                && (*self.cq_head).load(Ordering::SeqCst) == (*self.cq_tail).load(Ordering::SeqCst)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OP_NOP: u8 = 0;

    #[test]
    fn entries_are_submitted_and_their_completions_read_back_in_order() {
        let mut ring = Ring::new(4).expect("io_uring_setup");
        for k in 0..10u64 {
            // More than the ring holds: push submits when it is full.
            while !ring.push(&Sqe::new(OP_NOP, -1, k)) {
                ring.submit(false).unwrap();
            }
            ring.submit(false).unwrap();
            assert_eq!(ring.pop(), Some((k, 0)));
        }
        assert_eq!(ring.pop(), None);
        assert!(ring.view().quiet());
    }

    #[test]
    fn a_read_completes_when_its_data_arrives_and_wakes_the_waiter() {
        let mut ring = Ring::new(4).unwrap();
        let mut fds = [0; 2];
        // SAFETY: fds has room for the two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let mut buf = [0u8; 8];
        ring.push(&Sqe::new(OP_READ, fds[0], 42).addr(buf.as_mut_ptr() as u64).len(8).off(u64::MAX));
        ring.submit(false).unwrap();
        assert_eq!(ring.pop(), None, "nothing to read yet");
        let w = fds[1];
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            // SAFETY: writing 3 bytes from a static buffer to our pipe.
            unsafe { libc::write(w, b"abc".as_ptr().cast(), 3) };
        });
        ring.submit(true).unwrap();
        assert_eq!(ring.pop(), Some((42, 3)));
        assert_eq!(&buf[..3], b"abc");
        writer.join().unwrap();
        // SAFETY: closing the pipe made above.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
