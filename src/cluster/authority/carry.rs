//! Carrying etcd's decisions out on the host's lease table: a grant (now
//! or after the lock delay), a wait parked behind its predecessor or
//! handed the lease by a release, entries left when their locks go
//! (released, shrunk, renewed as errands), holders fenced when another
//! host broke them or the session was lost; and the epochs of
//! acquisitions by create or link, and other hosts' rows of
//! `.leasefs/leases`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::*;

impl EtcdArbitration {
    /// Leave the queue, as an errand (sent without the state lock); a
    /// failed release is retried off the request path. Waiters of this host
    /// that queued right behind the entry decide again at once instead of
    /// waiting for their watch.
    pub(super) fn release_ticket(&mut self, t: Ticket) {
        self.materialized.lock().remove(&t.key);
        if let (Some(flag), Some(w)) = (self.broken_flags.remove(&t.key), &self.watcher) {
            w.unregister(&t.key, &flag);
        }
        let behind: Vec<Arc<AtomicBool>> =
            self.parked.values().filter(|p| p.predecessor == t.key).map(|p| p.ready.clone()).collect();
        let (arbiter, leftover, wake) = (self.arbiter.clone(), self.leftover.clone(), self.wake.clone());
        self.errands.push(Errand::new(move || {
            match arbiter.release(&t) {
                Ok(()) => {
                    for ready in behind {
                        ready.store(true, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %t.name, "leaving the etcd queue failed, retrying: {e}");
                    leftover.push(t);
                }
            }
            wake.wake();
        }));
        // Run by the next tick if no request path runs it first.
        self.wake.wake();
    }

    /// Entries of `ino` whose owner no longer holds a lease-level lock here.
    pub(super) fn reconcile(&mut self, local: &LocalAuthority, ino: Ino) {
        let gone: Vec<(Ino, Owner)> = self
            .held
            .keys()
            .filter(|(i, owner)| {
                *i == ino
                    && !local.lease(ino).is_some_and(|l| l.locks().iter().any(|k| k.owner == *owner && lease_level(k)))
            })
            .copied()
            .collect();
        for key in gone {
            if let Some(t) = self.held.remove(&key) {
                self.release_ticket(t);
            }
        }
        self.reconcile_ranges(local, ino);
    }

    /// Shrink the byte-range entries of `ino` to what their owners still
    /// hold here, and leave the queue with those that hold nothing.
    pub(super) fn reconcile_ranges(&mut self, local: &LocalAuthority, ino: Ino) {
        let owners: Vec<(Ino, Owner)> = self.ranges.keys().filter(|(i, _)| *i == ino).copied().collect();
        for key in owners {
            let locks: Vec<Lock> = local
                .lease(ino)
                .map(|l| l.locks().iter().filter(|k| k.owner == key.1 && !lease_level(k)).copied().collect())
                .unwrap_or_default();
            let Some(tickets) = self.ranges.remove(&key) else { continue };
            let mut keep = Vec::new();
            for t in tickets {
                let qmode = |l: &Lock| if l.mode == Mode::Shared { QMode::Shared } else { QMode::Exclusive };
                let had = t.ranges.clone().unwrap_or_default();
                let still: Vec<(u64, u64)> = had
                    .iter()
                    .flat_map(|&(s, e)| {
                        locks.iter().filter(|l| qmode(l) == t.mode).filter_map(move |l| {
                            let (a, b) = (s.max(l.range.start), e.min(l.range.end));
                            (a <= b).then_some((a, b))
                        })
                    })
                    .collect();
                if still.is_empty() {
                    self.release_ticket(t);
                    continue;
                }
                if still == had {
                    keep.push(t);
                    continue;
                }
                // Rewritten as an errand, without the state lock; holding
                // less than etcd says only keeps others waiting meanwhile.
                let t = t.with_ranges(still);
                let behind: Vec<Arc<AtomicBool>> =
                    self.parked.values().filter(|p| p.predecessor == t.key).map(|p| p.ready.clone()).collect();
                let (arbiter, shrunk, wake) = (self.arbiter.clone(), t.clone(), self.wake.clone());
                self.errands.push(Errand::new(move || {
                    if let Err(e) = arbiter.shrink(&shrunk) {
                        tracing::warn!(lease = %shrunk.name, "shrinking a byte-range entry failed: {e}");
                    }
                    // Waiters behind it may fit now.
                    for ready in behind {
                        ready.store(true, Ordering::Relaxed);
                    }
                    wake.wake();
                }));
                self.wake.wake();
                keep.push(t);
            }
            if !keep.is_empty() {
                self.ranges.insert(key, keep);
            }
        }
    }

    /// etcd granted `ticket` with `epoch`: grant the request here.
    pub(super) fn grant_local(
        &mut self,
        local: &mut LocalAuthority,
        ino: Ino,
        req: Request,
        ticket: Ticket,
        epoch: u64,
        wait: Option<WaitId>,
    ) -> (Outcome, Vec<Effect>) {
        if ticket.mode == QMode::Exclusive && ticket.ranges.is_none() {
            local.align_epoch(ino, Epoch(epoch.saturating_sub(1)));
        } else {
            local.raise_epoch(ino, Epoch(epoch));
        }
        match local.request(ino, req, wait) {
            Ok((Outcome::Refused(e), effects)) => {
                self.release_ticket(ticket);
                (Outcome::Refused(e), effects)
            }
            Ok((outcome, effects)) => {
                if outcome == Outcome::Granted && ticket.mode == QMode::Exclusive && local.epoch(ino).0 != epoch {
                    tracing::error!(lease = %ticket.name, etcd = epoch, local = local.epoch(ino).0, "epoch differs from etcd's grant");
                }
                let mut ticket = ticket;
                ticket.mark_held(epoch);
                if ticket.ranges.is_some() {
                    self.ranges.entry((ino, req.owner)).or_default().push(ticket);
                    if outcome == Outcome::Granted {
                        // Merged with or converted from the owner's earlier ranges.
                        self.reconcile_ranges(local, ino);
                    }
                    return (outcome, effects);
                }
                // (A TTL set after the grant: `ttl_changed`.)
                if outcome == Outcome::Granted && local.effective_ttl(ino).is_some() && ticket.solo.is_none() {
                    // Another host may break it once its TTL passes.
                    let flag = Arc::new(AtomicBool::new(false));
                    if let Some(w) = &self.watcher {
                        w.register(&ticket.key, ticket.create_revision, &flag);
                    }
                    self.broken_flags.insert(ticket.key.clone(), flag);
                }
                // A TTL set or changed while it waited: its entry still
                // shows the one it was asked with.
                let retime = outcome == Outcome::Granted && ticket.ttl_ms() != local.effective_ttl(ino);
                self.held.insert((ino, req.owner), ticket);
                if retime {
                    self.ttl_changed(local, ino);
                }
                (outcome, effects)
            }
            Err(e) => {
                self.release_ticket(ticket);
                (Outcome::Refused(e), Vec::new())
            }
        }
    }

    /// Break the holder entry `key` if its TTL ran out unrenewed since
    /// revision `renewed` (as this host measured it); true if it did.
    pub(super) fn break_if_lapsed(
        arbiter: &Arbiter,
        seen: &Seen,
        name: &str,
        key: &[u8],
        renewed: i64,
        ttl_ms: u64,
    ) -> bool {
        lapses_at(seen, key, renewed, ttl_ms) <= Instant::now() && Self::break_lapsed(arbiter, name, key, renewed)
    }

    /// Break the holder entry `key` unless it was renewed since revision
    /// `renewed`; true if it was broken.
    pub(super) fn break_lapsed(arbiter: &Arbiter, name: &str, key: &[u8], renewed: i64) -> bool {
        match arbiter.break_held(key, renewed) {
            Ok(true) => {
                tracing::info!(lease = %name, "the TTL of another host's holder ran out: broken");
                true
            }
            Ok(false) => false,
            Err(e) => {
                tracing::warn!(lease = %name, "breaking a lapsed holder failed: {e}");
                false
            }
        }
    }

    /// A holder of `ino` renewed its lease: rewrite its entries with a TTL,
    /// so other hosts see the renewal.
    pub(super) fn touch(&mut self, local: &LocalAuthority, ino: Ino) {
        let epoch = local.epoch(ino).0;
        let renewed: Vec<Ticket> = self
            .held
            .iter()
            .filter(|((i, _), t)| *i == ino && self.broken_flags.contains_key(&t.key))
            .map(|(_, t)| t.clone())
            .collect();
        for t in renewed {
            let arbiter = self.arbiter.clone();
            self.errands.push(Errand::new(move || match arbiter.touch(&t, epoch) {
                Ok(true) => {}
                // Broken meanwhile: the queue watch reports it.
                Ok(false) => {}
                Err(e) => tracing::warn!(lease = %t.name, "renewing in etcd failed: {e}"),
            }));
        }
    }

    /// The TTL of `ino` changed after its holders here were granted: their
    /// entries show it (a holder granted solo gets its entry now), so
    /// other hosts' waiters break them by it, and renewals are written
    /// from now on.
    pub(super) fn ttl_changed(&mut self, local: &LocalAuthority, ino: Ino) {
        let ttl = local.effective_ttl(ino);
        let epoch = local.epoch(ino).0;
        let changed: Vec<(Ino, Owner)> =
            self.held.iter().filter(|((i, _), t)| *i == ino && t.ttl_ms() != ttl).map(|(k, _)| *k).collect();
        for k in changed {
            let Some(t) = self.held.get_mut(&k) else { continue };
            t.set_ttl_ms(ttl);
            if ttl.is_some() && !self.broken_flags.contains_key(&t.key) {
                let flag = Arc::new(AtomicBool::new(false));
                if let Some(w) = &self.watcher {
                    // Deletions from now on only: no other host can break
                    // the entry before it shows the TTL, written below.
                    w.register(&t.key, i64::MAX, &flag);
                }
                self.broken_flags.insert(t.key.clone(), flag);
            }
            let t = t.clone();
            let (arbiter, materialized) = (self.arbiter.clone(), self.materialized.clone());
            self.errands.push(Errand::new(move || match arbiter.retime(&t, epoch) {
                Ok(Some(rev)) => {
                    if t.solo.is_some() {
                        // Guarded writes compare the entry from now on.
                        materialized.lock().insert(t.key.clone(), rev);
                    }
                }
                // Released or broken meanwhile.
                Ok(None) => {}
                Err(e) => tracing::warn!(lease = %t.name, "showing a new TTL to other hosts failed: {e}"),
            }));
        }
    }

    /// Holders of this host whose entries another host broke (their TTL
    /// ran out): fenced here too.
    pub(super) fn broken_elsewhere(&mut self, local: &mut LocalAuthority, effects: &mut Vec<Effect>) {
        let gone: Vec<(Ino, Owner)> = self
            .held
            .iter()
            .filter(|(_, t)| self.broken_flags.get(&t.key).is_some_and(|f| f.load(Ordering::Relaxed)))
            .map(|(k, _)| *k)
            .collect();
        for (ino, owner) in gone {
            let Some(t) = self.held.remove(&(ino, owner)) else { continue };
            self.broken_flags.remove(&t.key);
            tracing::warn!(lease = %t.name, "another host broke this host's holder (its TTL ran out): fencing it");
            self.ttl_breaks.1 += 1;
            effects.extend(local.break_now(ino));
        }
    }

    /// The owner of one of this host's entries.
    pub(super) fn owner_of(&self, key: &[u8]) -> Option<Owner> {
        self.held
            .iter()
            .map(|((_, o), t)| (o, t))
            .chain(self.ranges.iter().flat_map(|((_, o), ts)| ts.iter().map(move |t| (o, t))))
            .find(|(_, t)| t.key == key)
            .map(|(o, _)| *o)
    }

    /// `owner` waiting behind `predecessor` closes a cycle of waits among
    /// this host's owners (`EDEADLK`, as on one host; waits through other
    /// hosts are not followed).
    pub(super) fn would_deadlock(&self, owner: Owner, predecessor: &[u8]) -> bool {
        let mut seen = std::collections::HashSet::new();
        let mut next = self.owner_of(predecessor);
        while let Some(o) = next {
            if o == owner {
                return true;
            }
            if !seen.insert(o) {
                return false;
            }
            next = self.parked.values().find(|p| p.req.owner == o).and_then(|p| self.owner_of(&p.predecessor));
        }
        false
    }

    /// Park `id` until `predecessor` leaves the queue.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn park(
        &mut self,
        id: WaitId,
        ino: Ino,
        req: Request,
        ticket: Ticket,
        predecessor: Vec<u8>,
        revision: i64,
        breakable: Option<(u64, i64)>,
    ) {
        let breakable = breakable.map(|(ttl, renewed)| (lapses_at(&self.seen, &predecessor, renewed, ttl), renewed));
        if breakable.is_some() {
            self.wake.wake();
        }
        let ready = Arc::new(AtomicBool::new(false));
        let now = match &self.watcher {
            // Its own entry too: a releaser may hand it the lease.
            Some(w) => w.register(&predecessor, revision, &ready) | w.register_handed(&ticket.key, &ready),
            // No watch yet: decide again on the next tick.
            None => {
                ready.store(true, Ordering::Relaxed);
                true
            }
        };
        if now {
            self.wake.wake();
        }
        self.parked.insert(id, Parked { ino, req, ticket, predecessor, ready, breakable, held_until: None });
    }

    /// The lost holder of `name` whose lock delay has passed on this host.
    pub(super) fn served(&self, name: &str) -> Option<String> {
        let (holder, first) = self.lost_seen.get(name)?;
        (*first + self.config.lock_delay <= Instant::now()).then(|| holder.clone())
    }

    /// This host found `holder` of `name` lost: when its lock delay ends
    /// (from when that was first found, whoever found it here).
    pub(super) fn note_lost(&mut self, name: &str, holder: &str) -> Instant {
        if self.lost_seen.len() >= 4096 && !self.lost_seen.contains_key(name) {
            self.lost_seen.clear();
        }
        let seen = self.lost_seen.entry(name.to_string()).or_insert_with(|| (holder.to_string(), Instant::now()));
        if seen.0 != holder {
            *seen = (holder.to_string(), Instant::now());
        }
        seen.1 + self.config.lock_delay
    }

    /// A blocking request whose previous holder's host was lost waits out
    /// the lock delay with its entry queued and nothing granted (SPEC 5: a
    /// wait that ends meanwhile takes no epoch), then is decided again.
    pub(super) fn hold_back(&mut self, id: WaitId, ino: Ino, req: Request, mut ticket: Ticket, holder: String) {
        let until = self.note_lost(&ticket.name, &holder);
        tracing::info!(lease = %ticket.name, delay_ms = self.config.lock_delay.as_millis() as u64, "previous holder's host was lost: granting after the lock delay");
        ticket.served = Some(holder.clone());
        let ready = Arc::new(AtomicBool::new(false));
        let p = Parked {
            ino,
            req,
            ticket,
            predecessor: holder.into_bytes(),
            ready,
            breakable: None,
            held_until: Some(until),
        };
        self.parked.insert(id, p);
        self.wake.wake();
    }

    /// Grant the parked requests whose entries a releaser's transaction
    /// wrote held ([`crate::cluster::arbiter::Arbiter::release`]), as the host's
    /// watch saw them: etcd decided, nothing to ask it.
    pub(super) fn handed_over(&mut self, local: &mut LocalAuthority, effects: &mut Vec<Effect>) {
        let Some(mirror) = self.watcher.as_ref().map(QueueWatcher::mirror) else { return };
        let alive = self.session.alive();
        let handed: Vec<(WaitId, u64, i64)> = self
            .parked
            .iter()
            .filter(|(_, p)| p.ready.load(Ordering::Relaxed) && Some(p.ticket.session) == alive)
            .filter_map(|(id, p)| {
                let kv = mirror.entry(&p.ticket.key)?;
                let e = crate::cluster::entries::entry(&kv)?;
                e.held.then_some((*id, e.epoch, kv.mod_revision))
            })
            .collect();
        for (id, epoch, rev) in handed {
            let Some(p) = self.parked.remove(&id) else { continue };
            self.unpark(&p);
            self.handoffs += 1;
            self.arbiter.granted(&p.ticket, epoch, rev);
            self.answer_grant(local, p.ino, p.req, p.ticket, epoch, Some(id), true, effects);
        }
    }

    /// A wait a signal ended left the queue ([`Arbiter::withdraw`]): its
    /// `EINTR`, or the grant a hand-off gave it first.
    pub(super) fn withdrawn(
        &mut self,
        local: &mut LocalAuthority,
        id: WaitId,
        p: Parked,
        w: std::result::Result<Withdrawn, EtcdError>,
        effects: &mut Vec<Effect>,
    ) {
        match w {
            Ok(Withdrawn::Handed { epoch, rev }) if self.session.alive() == Some(p.ticket.session) => {
                self.handoffs += 1;
                self.arbiter.granted(&p.ticket, epoch, rev);
                self.answer_grant(local, p.ino, p.req, p.ticket, epoch, Some(id), true, effects);
            }
            Ok(_) => effects.push(Effect::Refuse(id, Error::Interrupted)),
            Err(e) => {
                tracing::warn!(lease = %p.ticket.name, "a cancelled wait could not leave the queue now: {e}");
                self.interrupted_unreached(id, p.ticket, effects);
            }
        }
    }

    /// A signal ended a wait whose entry etcd could not be asked to drop:
    /// `EINTR` now, the entry deleted later by the retrier. Until then (or
    /// until this host's session expires) a hand-off may still grant it,
    /// and that grant is released.
    fn interrupted_unreached(&mut self, id: WaitId, ticket: Ticket, effects: &mut Vec<Effect>) {
        self.leftover.push(ticket);
        effects.push(Effect::Refuse(id, Error::Interrupted));
    }

    /// A parked request's wait ended: stop watching for it.
    pub(super) fn unpark(&self, p: &Parked) {
        if let Some(w) = &self.watcher {
            w.unregister(&p.predecessor, &p.ready);
            w.unregister(&p.ticket.key, &p.ready);
        }
    }

    /// Carry out a parked request's new decision; its answer, if it has
    /// one now.
    pub(super) fn redecided(
        &mut self,
        local: &mut LocalAuthority,
        id: WaitId,
        p: Parked,
        decided: std::result::Result<Decision, EtcdError>,
        effects: &mut Vec<Effect>,
    ) {
        if self.deciding.remove(&id) == Some(true) && self.session.alive() == Some(p.ticket.session) {
            // A signal came while etcd was asked. A grant etcd made stands
            // (the wait ended with it; answering EINTR would leave its
            // epoch without a holder, SPEC 5); a wait still queued leaves
            // the queue before its EINTR is answered.
            match decided {
                Ok(Decision::Granted { epoch, .. }) => {
                    self.answer_grant(local, p.ino, p.req, p.ticket, epoch, Some(id), true, effects);
                }
                Ok(Decision::Behind { .. } | Decision::HeldBack { .. }) => {
                    self.withdrawing.push((id, p));
                    self.wake.wake();
                }
                Ok(Decision::Gone) => effects.push(Effect::Refuse(id, Error::Interrupted)),
                Err(_) => self.interrupted_unreached(id, p.ticket, effects),
            }
            return;
        }
        if self.session.alive() != Some(p.ticket.session) {
            effects.push(Effect::Refuse(id, Error::Unreachable));
            return;
        }
        match decided {
            Ok(Decision::Granted { epoch, .. }) => {
                self.answer_grant(local, p.ino, p.req, p.ticket, epoch, Some(id), true, effects);
            }
            Ok(Decision::HeldBack { holder }) => self.hold_back(id, p.ino, p.req, p.ticket, holder),
            Ok(Decision::Behind { predecessor, revision, breakable }) => {
                self.park(id, p.ino, p.req, p.ticket, predecessor, revision, breakable);
            }
            Ok(Decision::Gone) => effects.push(Effect::Refuse(id, Error::Unreachable)),
            Err(e) => {
                let err = unreachable("deciding a waiting lock request", &e);
                self.leftover.push(p.ticket);
                effects.push(Effect::Refuse(id, err));
            }
        }
    }

    /// etcd granted a request: grant it here. A request that was `parked`
    /// is answered by an effect for `id`; one being asked now by the
    /// outcome. (The lock delay held it back before etcd was asked to
    /// grant it: [`Decision::HeldBack`].)
    #[allow(clippy::too_many_arguments)]
    pub(super) fn answer_grant(
        &mut self,
        local: &mut LocalAuthority,
        ino: Ino,
        req: Request,
        ticket: Ticket,
        epoch: u64,
        id: Option<WaitId>,
        parked: bool,
        effects: &mut Vec<Effect>,
    ) -> Outcome {
        if ticket.mode == QMode::Exclusive && ticket.ranges.is_none() {
            // A new holder: the lost one is in the past (a shared grant
            // leaves it named in the counter, and served).
            self.lost_seen.remove(&ticket.name);
        }
        let (outcome, more) = self.grant_local(local, ino, req, ticket, epoch, id);
        effects.extend(more);
        if let Some(id) = id.filter(|_| parked) {
            match outcome {
                Outcome::Granted => effects.push(Effect::Grant(id)),
                Outcome::Refused(e) => effects.push(Effect::Refuse(id, e)),
                // Waits on a byte-range lock of this host; granted by it later.
                Outcome::Parked => {}
            }
        }
        outcome
    }

    /// When the host session is lost, fence every holder on this host and
    /// fail every wait (their entries went with the session).
    pub(super) fn on_session_loss(&mut self, local: &mut LocalAuthority, effects: &mut Vec<Effect>) {
        let alive = self.session.alive();
        let stale = |t: &Ticket| Some(t.session) != alive;
        let lost = self.held.values().any(stale)
            || self.ranges.values().flatten().any(stale)
            || self.parked.values().any(|p| stale(&p.ticket));
        if !lost {
            return;
        }
        self.losses += 1;
        let holders = self.held.len();
        tracing::warn!(holders, waiters = self.parked.len(), "this host's etcd session is lost: fencing its holders");
        self.held.retain(|_, t| !stale(t));
        self.ranges.retain(|_, ts| {
            ts.retain(|t| !stale(t));
            !ts.is_empty()
        });
        let fenced = local.fence_all();
        self.lost_holders = fenced
            .iter()
            .filter_map(|e| if let Effect::Broken(i, f) = e { Some((*i, f.handle)) } else { None })
            .collect();
        effects.extend(fenced);
        let ids: Vec<WaitId> = self.parked.iter().filter(|(_, p)| stale(&p.ticket)).map(|(id, _)| *id).collect();
        for id in ids {
            if let Some(p) = self.parked.remove(&id) {
                self.unpark(&p);
                effects.push(Effect::Refuse(id, Error::Unreachable));
            }
        }
    }

    /// A lease held here by holders the arbitration still backs needs no
    /// read: no grant can have completed elsewhere while they hold it, so
    /// its epoch here is the current one (and a name re-created on another
    /// host meanwhile does not lend this inode its counter). A lease whose
    /// holders here were lost or fenced is read like any other: everyone
    /// reads its current epoch, and the lost holders `ESTALE` (SPEC 5).
    pub(super) fn keeps_its_epoch(&self, local: &LocalAuthority, ino: Ino) -> bool {
        local.lease(ino).is_some_and(|l| !l.locks().is_empty()) && self.lost_hold(local, ino, &|_| true).is_none()
    }

    /// Take the next epoch of `ino` from etcd's counter for an
    /// acquisition by `how` (O_EXCL, link) in the transaction that stores
    /// the change ([`Arbiter::claim`]), so the local acquisition (+1) lands
    /// on it; the change is not stored unless etcd hands out that epoch.
    pub(super) fn claimed(&mut self, local: &mut LocalAuthority, ino: Ino, how: &str) -> Result<bool> {
        let Some(name) = self.names.get(&ino).cloned() else {
            tracing::warn!(ino = ino.0, "{how} acquisition of a lease without a name: refused");
            return Err(Error::Io);
        };
        if crate::failpoints::injected("etcd-bump").is_err() {
            tracing::warn!(lease = %name, "{how} acquisition refused: etcd did not hand out its epoch (failpoint)");
            return Err(Error::Io);
        }
        let (epoch, claim, acquires) = self.arbiter.claim(&name, how == "link");
        if acquires {
            local.raise_epoch(ino, Epoch(epoch.saturating_sub(1)));
        } else {
            // Held on another host: re-attached, with its epoch.
            local.raise_epoch(ino, Epoch(epoch));
        }
        self.claims.push(claim);
        Ok(acquires)
    }

    /// Other hosts' leases at or under `prefix`, as etcd's queues say
    /// (host `me` left out): one read, made without the state lock.
    pub(super) fn list_remote(arbiter: &Arbiter, me: &str, prefix: &str) -> Vec<LeaseRow> {
        let all = match arbiter.all_entries() {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!("listing other hosts' leases: {e}");
                return Vec::new();
            }
        };
        let prefix = prefix.trim_matches('/');
        all.into_iter()
            .filter(|(name, _, _)| {
                prefix.is_empty() || name.strip_prefix(prefix).is_some_and(|r| r.is_empty() || r.starts_with('/'))
            })
            .filter_map(|(name, epoch, entries)| {
                let theirs: Vec<_> = entries.iter().filter(|e| e.host != me).collect();
                if theirs.is_empty() {
                    return None;
                }
                let holders = theirs.iter().filter(|e| e.held).map(|e| remote_row(e)).collect();
                Some(LeaseRow {
                    epoch,
                    holders,
                    hosts: Some("other"),
                    path: format!("/{name}"),
                    waiters: theirs.iter().filter(|e| !e.held).count(),
                    ..LeaseRow::default()
                })
            })
            .collect()
    }

    /// Other hosts' holders of the lease `name` (`user.leasefs.holder`),
    /// read from etcd (its queue, and its counter for a holder granted
    /// solo).
    pub(super) fn holders_elsewhere(
        arbiter: &Arbiter,
        me: &str,
        name: &str,
    ) -> std::result::Result<Vec<HolderRow>, String> {
        let (entries, _) = arbiter.entries(name).map_err(|e| e.to_string())?;
        Ok(entries.iter().filter(|e| e.held && e.host != me).map(remote_row).collect())
    }
}

/// The row of a holder on another host (it has no byte range or age here).
fn remote_row(e: &crate::cluster::entries::Entry) -> HolderRow {
    HolderRow {
        comm: Some(e.asker.comm.clone()),
        host: Some(e.host.clone()),
        kind: kind_name(crate::cluster::arbiter::owner_kind(&e.asker.owner)),
        mode: if e.mode == QMode::Shared { "shared" } else { "exclusive" },
        pid: e.asker.pid,
        ..HolderRow::default()
    }
}
