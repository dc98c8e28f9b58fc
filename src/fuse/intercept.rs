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
