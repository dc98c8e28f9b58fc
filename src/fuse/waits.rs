//! Lock requests parked until the lease core answers them, and what the
//! request hook saw of requests in flight (interrupts and answers that
//! came before their request was parked, `lk_flags`), with the parked
//! reads and polls of `.leasefs/events`.

use super::*;

/// Parked lock requests and what the request hook saw of requests in flight.
#[derive(Default)]
pub(super) struct Waits {
    /// Replies of lock requests parked in the lease core.
    pub(super) parked: HashMap<WaitId, ReplyEmpty>,
    /// Interrupts that arrived before their request was parked.
    pub(super) early: VecDeque<u64>,
    /// Answers (`None`: granted) that arrived before their request was
    /// parked: a lock request's handler parks its reply only after the
    /// lease core answered it, without this lock, and a grant may come
    /// from the lease timer in between.
    pub(super) answered: VecDeque<(WaitId, Option<Error>)>,
    /// `lk_flags` of lock requests, by request id (fuser does not expose them).
    pub(super) lk_flags: HashMap<u64, u32>,
    /// Where to send page-cache invalidations.
    pub(super) notices: Option<Notices>,
    /// Regular files are opened with direct I/O (decided at INIT).
    pub(super) direct_io: bool,
    /// Reads of `.leasefs/events` waiting for an event, by request id.
    pub(super) parked_reads: HashMap<u64, ReplyData>,
    /// Polls of `.leasefs/events` waiting for an event, by kernel handle.
    pub(super) polls: HashMap<u64, PollNotifier>,
}

impl Waits {
    /// Answer parked requests as the lease core decided. Runs with the
    /// `Waits` lock held so a reply cannot be parked after its answer.
    pub(super) fn deliver(&mut self, effects: Vec<Effect>, fs: &Fs) {
        for e in effects {
            match e {
                Effect::Grant(id) => match self.parked.remove(&id) {
                    Some(r) => r.ok(),
                    None => self.answer_early(id, None),
                },
                Effect::Refuse(id, err) => match self.parked.remove(&id) {
                    Some(r) => r.error(refuse("lock wait", err)),
                    None => self.answer_early(id, Some(err)),
                },
                Effect::Epoch(ino, epoch) => {
                    debug!(path = %fs.describe(ino), ino = ino.0, epoch = epoch.0, "lease acquired: new epoch")
                }
                Effect::Expired(ino, epoch, pid) => {
                    debug!(path = %fs.describe(ino), ino = ino.0, pid, epoch = epoch.0, "lease TTL ran out uncontended")
                }
                Effect::Broken(ino, f) => debug!(
                    path = %fs.describe(ino),
                    ino = ino.0,
                    pid = f.pid,
                    epoch = f.epoch.0,
                    "lease broken: holder fenced"
                ),
            }
        }
    }

    /// Answer the event reads that can be answered and wake the polls.
    pub(super) fn deliver_events(&mut self, fs: &Fs) {
        let (answers, polls) = fs.events_ready();
        for (id, data) in answers {
            if let Some(r) = self.parked_reads.remove(&id) {
                r.data(&data);
            }
        }
        for kh in polls {
            if let Some(p) = self.polls.remove(&kh) {
                // A poll wake-up only wakes a wait queue in the kernel:
                // safe from any thread, unlike invalidations.
                let _ = p.notify();
            }
        }
    }

    /// Keep the answer of a request not parked yet for its handler.
    pub(super) fn answer_early(&mut self, id: WaitId, answer: Option<Error>) {
        if self.answered.len() >= EARLY_INTERRUPTS {
            if let Some((old, _)) = self.answered.pop_front() {
                warn!(wait = old.0, "answer for a request that was never parked");
            }
        }
        self.answered.push_back((id, answer));
    }

    /// Park the reply of the lock request `id`, or answer it at once if its
    /// answer or an interrupt came first.
    pub(super) fn park(&mut self, id: WaitId, reply: ReplyEmpty, fs: &Fs) {
        if let Some(i) = self.answered.iter().position(|(a, _)| *a == id) {
            match self.answered.remove(i).and_then(|(_, a)| a) {
                None => reply.ok(),
                Some(err) => reply.error(refuse("lock wait", err)),
            }
            return;
        }
        self.parked.insert(id, reply);
        if self.take_early(id.0) {
            if let Some(effects) = fs.interrupt(id) {
                debug!(unique = id.0, "lock wait interrupted by a signal");
                self.deliver(effects, fs);
            }
        }
    }

    pub(super) fn take_early(&mut self, unique: u64) -> bool {
        match self.early.iter().position(|u| *u == unique) {
            Some(i) => {
                self.early.remove(i);
                true
            }
            None => false,
        }
    }
}

/// Send the entry drops `fs` picked to the kernel.
pub(super) fn send_entry_drops(fs: &Fs, waits: &Waits) {
    let drops = fs.take_entry_drops();
    if drops.is_empty() {
        return;
    }
    if let Some(n) = &waits.notices {
        n.drop_entries(drops.into_iter().map(|(parent, name)| (parent.0, name)).collect());
    }
}
