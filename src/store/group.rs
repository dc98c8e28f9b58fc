//! Group commit: the journal's `fdatasync` runs off the request path.
//!
//! A flush appends its batch to the namespace journal under the state lock
//! (a copy into the page cache; the bulk of a batch of megabytes is
//! written by the sync instead, without the page cache: see
//! [`crate::store::direct`]) and hands the sync to this thread, which
//! answers the caller once the batch is durable. Requests that arrive
//! meanwhile (other files' lock operations, reads, writes) are served at
//! once instead of waiting for another process's `fsync`, and every sync
//! waiting when the thread wakes is covered by one `fdatasync`.
//!
//! Invariants:
//! - A caller is answered `Ok` only after a sync that started after its
//!   batch was appended has returned `Ok`.
//! - Callers are answered in the order they were queued, so a flush with
//!   nothing of its own to write still waits for the syncs queued before it
//!   (its changes may be in their batches).
//! - A failed sync is fail-stop: the store's failure flag is set, every
//!   caller of that round gets `EIO`, and so does every later flush.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::store::storage::Syncer;

/// How a flush's caller is answered.
pub type Done = Box<dyn FnOnce(Result<()>) + Send>;

/// One queued flush: the sync covering its batch (none when it appended
/// nothing), and its caller.
struct Job {
    sync: Option<Syncer>,
    done: Done,
}

/// The sync thread and its queue (the thread starts with the first job and
/// ends when this is dropped, after answering everything queued).
#[derive(Default)]
pub struct GroupCommit {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Jobs queued and not yet answered.
    in_flight: Arc<AtomicUsize>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").field("in_flight", &self.in_flight.load(Ordering::Relaxed)).finish()
    }
}

impl GroupCommit {
    /// True while some queued sync has not been answered. Read under the
    /// state lock (which every `submit` holds), so `false` means every batch
    /// appended so far is durable.
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Queue `done` behind every sync queued before it, after running `sync`
    /// (if any). `failed` is the store's fail-stop flag.
    pub fn submit(&self, sync: Option<Syncer>, failed: &Arc<AtomicBool>, done: Done) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let mut tx = self.tx.lock();
        if tx.is_none() {
            let (send, recv) = mpsc::channel::<Job>();
            let in_flight = self.in_flight.clone();
            let flag = failed.clone();
            match std::thread::Builder::new().name("group-commit".into()).spawn(move || run(&recv, &in_flight, &flag)) {
                Ok(t) => {
                    *self.thread.lock() = Some(t);
                    *tx = Some(send);
                }
                Err(e) => {
                    tracing::error!("cannot start the group-commit thread: {e}; syncing on the request path");
                    drop(tx);
                    answer(vec![Job { sync, done }], failed, &self.in_flight);
                    return;
                }
            }
        }
        if let Err(mpsc::SendError(job)) = tx.as_ref().expect("started above").send(Job { sync, done }) {
            answer(vec![job], failed, &self.in_flight);
        }
    }

    /// Answer everything queued, then stop the thread.
    pub fn stop(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(recv: &mpsc::Receiver<Job>, in_flight: &AtomicUsize, failed: &AtomicBool) {
    while let Ok(first) = recv.recv() {
        let mut round = vec![first];
        round.extend(recv.try_iter());
        answer(round, failed, in_flight);
    }
}

/// Run the round's syncs (after the first, the others find little or
/// nothing left to flush), then answer its callers in order.
fn answer(round: Vec<Job>, failed: &AtomicBool, in_flight: &AtomicUsize) {
    let mut result = if failed.load(Ordering::Acquire) { Err(Error::Io) } else { Ok(()) };
    let mut callers = Vec::with_capacity(round.len());
    for job in round {
        if let (Ok(()), Some(sync)) = (&result, job.sync) {
            if let Err(e) = sync() {
                tracing::error!("journal sync failed: {e}; durability is no longer promised (fail-stop)");
                failed.store(true, Ordering::Release);
                result = Err(Error::Io);
            }
        }
        callers.push(job.done);
    }
    if result.is_ok() {
        crate::failpoints::failpoint("journal-synced");
    }
    for done in callers {
        done(result);
        in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::Duration;

    use super::*;
    use crate::fs::{Caller, Fs, WriteOpts};
    use crate::namespace::Ino;
    use crate::store::storage::{MemStorage, Storage};

    /// Memory storage whose deferred syncs wait for the test to open a gate
    /// (and then fail if the test says so).
    struct Gated {
        mem: MemStorage,
        gate: Arc<(std::sync::Mutex<Option<bool>>, std::sync::Condvar)>,
    }

    impl Storage for Gated {
        fn read(&mut self, name: &str) -> std::io::Result<Option<Vec<u8>>> {
            self.mem.read(name)
        }
        fn append(&mut self, name: &str, data: &[u8]) -> std::io::Result<()> {
            self.mem.append(name, data)
        }
        fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.mem.write_at(name, offset, data)
        }
        fn truncate(&mut self, name: &str, len: u64) -> std::io::Result<()> {
            self.mem.truncate(name, len)
        }
        fn sync(&mut self, name: &str) -> std::io::Result<()> {
            self.mem.sync(name)
        }
        fn syncer(&mut self, _name: &str) -> std::io::Result<Syncer> {
            let gate = self.gate.clone();
            Ok(Box::new(move || {
                let (m, cv) = &*gate;
                let open = cv.wait_while(m.lock().unwrap(), |g| g.is_none()).unwrap();
                if open.unwrap() {
                    Ok(())
                } else {
                    Err(std::io::Error::from_raw_os_error(libc::EIO))
                }
            }))
        }
        fn write_new(&mut self, name: &str, data: &[u8]) -> std::io::Result<()> {
            self.mem.write_new(name, data)
        }
        fn rename(&mut self, from: &str, to: &str) -> std::io::Result<()> {
            self.mem.rename(from, to)
        }
        fn remove(&mut self, name: &str) -> std::io::Result<()> {
            self.mem.remove(name)
        }
        fn sync_dir(&mut self) -> std::io::Result<()> {
            self.mem.sync_dir()
        }
        fn len(&mut self, name: &str) -> u64 {
            self.mem.len(name)
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
        fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
            self
        }
    }

    type Gate = Arc<(std::sync::Mutex<Option<bool>>, std::sync::Condvar)>;

    fn gated_fs() -> (Arc<Fs>, Gate) {
        let gate: Gate = Default::default();
        let (store, rec) =
            crate::store::snapshot::Store::open(Box::new(Gated { mem: MemStorage::recording(), gate: gate.clone() }))
                .unwrap();
        let fs = Arc::new(Fs::new(0, 0));
        fs.restore(store, rec);
        (fs, gate)
    }

    fn open_gate(gate: &Gate, ok: bool) {
        *gate.0.lock().unwrap() = Some(ok);
        gate.1.notify_all();
    }

    /// Run `f` on another thread; it must finish well within `secs`.
    fn finishes<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(Duration::from_secs(secs)).expect("blocked behind a journal sync")
    }

    fn write_file(fs: &Fs, name: &str) {
        let (a, h) = fs.create(Caller::ROOT, Ino::ROOT, OsStr::new(name), 0o644, 0o022, libc::O_RDWR).unwrap();
        fs.write(a.ino, h, 0, b"data", WriteOpts::default()).unwrap();
    }

    #[test]
    fn requests_go_on_while_a_sync_waits_and_callers_are_answered_in_order() {
        let (fs, gate) = gated_fs();
        write_file(&fs, "a");
        let (tx, rx) = mpsc::channel();
        let (f, tx1) = (fs.clone(), tx.clone());
        finishes(10, move || f.sync_then(Box::new(move |r| tx1.send(("first", r)).unwrap())));
        // The sync is held at the gate, and the state is not: other files
        // are created, written, looked up meanwhile.
        let f = fs.clone();
        finishes(10, move || {
            write_file(&f, "b");
            f.lookup(Ino::ROOT, OsStr::new("a"), crate::fs::Caller::ROOT).unwrap();
        });
        // A flush with nothing of its own waits for the one before it.
        let f = fs.clone();
        let tx2 = tx.clone();
        finishes(10, move || f.sync_then(Box::new(move |r| tx2.send(("second", r)).unwrap())));
        assert_eq!(rx.recv_timeout(Duration::from_millis(100)).err(), Some(RecvTimeoutError::Timeout));
        open_gate(&gate, true);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), ("first", Ok(())));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), ("second", Ok(())));
        // Nothing queued and nothing changed: answered at once.
        assert_eq!(fs.sync(), Ok(()));
    }

    #[test]
    fn a_failed_group_sync_is_fail_stop() {
        let (fs, gate) = gated_fs();
        write_file(&fs, "a");
        let (tx, rx) = mpsc::channel();
        fs.sync_then(Box::new(move |r| tx.send(r).unwrap()));
        open_gate(&gate, false);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Err(Error::Io));
        assert_eq!(fs.sync(), Err(Error::Io), "nothing is durable after a failed sync");
        write_file(&fs, "b");
        assert_eq!(fs.sync(), Err(Error::Io));
    }
}
