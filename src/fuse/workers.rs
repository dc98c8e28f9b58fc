//! Request handlers off the session thread, in order per inode.
//!
//! On a mount whose namespace is shared with other hosts a request may wait
//! for etcd (a change stored, a read barrier, a lock step). The session
//! thread hands each request to this pool instead of running it, so it goes
//! on reading `/dev/fuse` while one request waits:
//! - requests are keyed by the node id the kernel sent them for (the inode,
//!   or the directory of a name; for a lookup, the directory and the name:
//!   lookups of different names in one directory need no order between
//!   them, and every path walk looks up names in the root); requests with
//!   one key run one at a time,
//!   in the order the kernel sent them (a `close` releasing a `flock` comes
//!   before the next lock request on that file, as on the session thread);
//! - requests with different keys run on up to `threads` threads at once;
//! - at most `bound` requests are queued or running; past it a request is
//!   refused and the kernel answered `EAGAIN` (a request that waits for a
//!   lock holds no thread: its reply is kept elsewhere).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queues {
    /// Jobs waiting, per key, and whether one of the key's jobs is
    /// running; a key is present while it has a job queued or running.
    by_key: HashMap<u64, (bool, VecDeque<Job>)>,
    /// Keys with a job queued and none running, oldest first.
    ready: VecDeque<u64>,
    /// Jobs queued or running.
    held: usize,
    /// Most jobs queued or running at once.
    peak: usize,
    /// Jobs refused at the bound.
    refused: u64,
    stop: bool,
}

struct Inner {
    q: Mutex<Queues>,
    work: Condvar,
    bound: usize,
}

/// A pool of handler threads, ordered per key.
#[derive(Clone)]
pub struct Workers {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Workers")
    }
}

/// What `status` shows of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerStats {
    pub threads: usize,
    pub bound: usize,
    pub held: usize,
    pub peak: usize,
    pub refused: u64,
}

impl Workers {
    /// Start `threads` handler threads; at most `bound` jobs held at once.
    pub fn start(threads: usize, bound: usize) -> std::io::Result<Workers> {
        let inner = Arc::new(Inner { q: Mutex::new(Queues::default()), work: Condvar::new(), bound: bound.max(1) });
        for i in 0..threads.max(1) {
            let inner = inner.clone();
            std::thread::Builder::new().name(format!("handler-{i}")).spawn(move || serve(&inner))?;
        }
        Ok(Workers { inner })
    }

    /// Queue `job` behind the jobs of `key`; `Err(job)` past the bound.
    pub fn run(&self, key: u64, job: Job) -> Result<(), Job> {
        let mut q = self.inner.q.lock();
        if q.held >= self.inner.bound || q.stop {
            q.refused += 1;
            return Err(job);
        }
        q.held += 1;
        q.peak = q.peak.max(q.held);
        let (running, jobs) = q.by_key.entry(key).or_default();
        let idle = !*running && jobs.is_empty();
        jobs.push_back(job);
        // A key with jobs already is queued or running: its thread takes
        // this one next.
        if idle {
            q.ready.push_back(key);
            self.inner.work.notify_one();
        }
        Ok(())
    }

    /// For `status`.
    pub fn stats(&self, threads: usize) -> WorkerStats {
        let q = self.inner.q.lock();
        WorkerStats { threads, bound: self.inner.bound, held: q.held, peak: q.peak, refused: q.refused }
    }

    /// Let the threads end once the queues are empty.
    pub fn stop(&self) {
        self.inner.q.lock().stop = true;
        self.inner.work.notify_all();
    }
}

fn serve(inner: &Inner) {
    let mut q = inner.q.lock();
    loop {
        let Some(key) = q.ready.pop_front() else {
            if q.stop {
                return;
            }
            inner.work.wait(&mut q);
            continue;
        };
        // While the job runs its key is marked running, so a job queued
        // meanwhile for the key waits behind it.
        let Some((running, jobs)) = q.by_key.get_mut(&key) else { continue };
        let Some(job) = jobs.pop_front() else { continue };
        *running = true;
        drop(q);
        // Handlers answer EIO on a panic themselves; this keeps the thread
        // and the key's order whatever a job does.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        q = inner.q.lock();
        q.held -= 1;
        let (running, jobs) = q.by_key.get_mut(&key).expect("a running key stays present");
        *running = false;
        if jobs.is_empty() {
            q.by_key.remove(&key);
        } else {
            q.ready.push_back(key);
            inner.work.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn jobs_of_one_key_run_in_order_one_at_a_time_and_other_keys_pass_a_stalled_one() {
        let w = Workers::start(4, 100).unwrap();
        let (tx, rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        // Key 1's first job stalls until released.
        {
            let tx = tx.clone();
            let r = release_rx.clone();
            w.run(
                1,
                Box::new(move || {
                    r.lock().recv().unwrap();
                    tx.send((1, 0)).unwrap();
                }),
            )
            .map_err(|_| ())
            .unwrap();
        }
        for i in 1..4 {
            let tx = tx.clone();
            w.run(1, Box::new(move || tx.send((1, i)).unwrap())).map_err(|_| ()).unwrap();
        }
        for i in 0..3 {
            let tx = tx.clone();
            w.run(2, Box::new(move || tx.send((2, i)).unwrap())).map_err(|_| ()).unwrap();
        }
        // Key 2 is served while key 1 stalls.
        for i in 0..3 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), (2, i));
        }
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "key 1's later jobs wait behind its first");
        release_tx.send(()).unwrap();
        for i in 0..4 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), (1, i));
        }
        w.stop();
    }

    #[test]
    fn past_the_bound_a_job_is_refused_and_counted() {
        let w = Workers::start(1, 2).unwrap();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        w.run(7, Box::new(move || release_rx.recv().unwrap())).map_err(|_| ()).unwrap();
        w.run(8, Box::new(move || done_tx.send(()).unwrap())).map_err(|_| ()).unwrap();
        assert!(w.run(9, Box::new(|| {})).is_err(), "a third job is past the bound of 2");
        assert_eq!(w.stats(1).refused, 1);
        release_tx.send(()).unwrap();
        done_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while w.stats(1).held > 0 {
            assert!(std::time::Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(w.run(9, Box::new(|| {})).is_ok(), "room again once the jobs ran");
        w.stop();
    }
}
