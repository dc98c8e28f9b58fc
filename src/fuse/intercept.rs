//! The part of the adapter the raw-request hook calls: interrupts, the raw
//! `lk_flags` of lock requests, `O_TMPFILE`, and the notices channel (which
//! starts the lease timer).

use super::*;

/// The part of the filesystem the request hook calls into.
pub struct Interceptor {
    pub(super) fs: Arc<Fs>,
    pub(super) waits: Arc<Mutex<Waits>>,
}

impl Intercept for Interceptor {
    fn interrupt(&self, unique: u64) {
        let mut w = self.waits.lock();
        match self.fs.interrupt(WaitId(unique)) {
            Some(effects) => {
                debug!(unique, "lock wait interrupted by a signal");
                w.deliver(effects, &self.fs);
            }
            None if w.parked_reads.contains_key(&unique) && self.fs.events_interrupt(unique) => {
                debug!(unique, "event read interrupted by a signal");
                if let Some(r) = w.parked_reads.remove(&unique) {
                    r.error(refuse("events read", Error::Interrupted));
                }
            }
            None if self.fs.bench().interrupt(unique) => {
                debug!(unique, "request held by a fault rule interrupted by a signal");
            }
            None => {
                // Either not a lock wait (ignored: it completes on its own) or
                // not parked yet: remember it for when it arrives.
                if w.early.len() >= EARLY_INTERRUPTS {
                    w.early.pop_front();
                }
                w.early.push_back(unique);
            }
        }
    }

    fn lock_request(&self, unique: u64, lk_flags: u32) {
        self.waits.lock().lk_flags.insert(unique, lk_flags);
    }

    fn tmpfile(&self, r: TmpfileRequest) -> Result<TmpfileReply, i32> {
        let direct_io = self.waits.lock().direct_io;
        let caller = Caller { uid: r.uid, gid: r.gid, pid: r.pid };
        let guarded =
            catch_unwind(AssertUnwindSafe(|| self.fs.tmpfile(caller, Ino(r.parent), r.mode, r.umask, r.flags as i32)));
        match guarded {
            Ok(Ok((attr, h))) => Ok(TmpfileReply { attr, fh: h.0, direct_io }),
            Ok(Err(e)) => Err(refuse("tmpfile", e).code()),
            Err(_) => {
                error!(op = "tmpfile", "handler panicked; request answered with EIO");
                Err(libc::EIO)
            }
        }
    }

    fn door(&self, msg: &[u8], answer: &fuser::RawReply<'_>) -> bool {
        self.door_here(msg, answer)
    }

    /// On a shared namespace, `getattr` and the `getxattr` of anything but
    /// a fencing fact (`user.leasefs.*`, a quorum read), of files other
    /// than the control files, are answered from the copy with no round
    /// trip while it is well within its lag and no change of this host is
    /// on its way: they run where they arrived, without the hand-over to a
    /// handler thread.
    fn inline(&self, msg: &[u8]) -> bool {
        let opcode = u32::from_ne_bytes(msg[4..8].try_into().expect("4 bytes"));
        let quick = match opcode {
            super::session::FUSE_GETATTR => true,
            super::session::FUSE_GETXATTR => msg
                .get(super::session::IN_HEADER + super::session::GETXATTR_IN..)
                .is_some_and(|name| !name.starts_with(b"user.leasefs.")),
            _ => false,
        };
        let ino = u64::from_ne_bytes(msg[16..24].try_into().expect("8 bytes"));
        quick && !crate::control::is_control(Ino(ino)) && self.fs.answers_from_the_copy_now()
    }

    fn attach(&self, notices: Notices) {
        self.waits.lock().notices = Some(notices);
        // Lease timers: a waiter on a lease whose TTL runs out is granted
        // without any other request arriving, and answers the authority
        // decided later are delivered. The timer sleeps to its next
        // deadline unless the authority wakes it; the thread ends with the
        // filesystem.
        let wake = self.fs.wake();
        let (fs, waits) = (Arc::downgrade(&self.fs), Arc::downgrade(&self.waits));
        let spawned = std::thread::Builder::new().name("lease-timer".into()).spawn(move || loop {
            let (Some(fs), Some(waits)) = (fs.upgrade(), waits.upgrade()) else {
                return;
            };
            let next = {
                // Without the `Waits` lock: a tick may ask etcd (answers
                // that come before their request is parked are kept).
                let (effects, next) = fs.tick();
                let mut w = waits.lock();
                send_entry_drops(&fs, &w);
                w.deliver(effects, &fs);
                w.deliver_events(&fs);
                next
            };
            drop((fs, waits));
            let nap = next.unwrap_or(TIMER_IDLE).clamp(Duration::from_millis(1), TIMER_IDLE);
            wake.sleep(nap);
        });
        if let Err(e) = spawned {
            error!("cannot start the lease timer: {e}");
        }
    }
}
