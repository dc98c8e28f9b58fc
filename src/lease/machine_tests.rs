use super::*;

const I: Ino = Ino(7);

fn flock(owner: u64, mode: Option<Mode>) -> Request {
    Request { owner: Owner(owner), kind: LockKind::Flock, mode, range: Range::WHOLE, pid: owner as u32, handle: owner }
}

fn posix(owner: u64, mode: Option<Mode>, start: u64, end: u64) -> Request {
    Request {
        owner: Owner(owner),
        kind: LockKind::Posix,
        mode,
        range: Range { start, end },
        pid: owner as u32,
        handle: owner,
    }
}

#[test]
fn exclusive_conflicts_and_epoch_per_new_holder() {
    let mut t = Locks::new();
    let (o, e) = t.set(I, flock(1, Some(Mode::Exclusive)), None);
    assert_eq!(o, Outcome::Granted);
    assert_eq!(e, vec![Effect::Epoch(I, Epoch(1))]);
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), None).0, Outcome::Refused(Error::WouldBlock));
    assert_eq!(t.set(I, flock(2, Some(Mode::Shared)), None).0, Outcome::Refused(Error::WouldBlock));
    // Re-lock by the holder keeps the epoch.
    assert_eq!(t.set(I, flock(1, Some(Mode::Exclusive)), None).1, vec![]);
    assert_eq!(t.epoch(I), Epoch(1));
    t.set(I, flock(1, None), None);
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), None).0, Outcome::Granted);
    assert_eq!(t.epoch(I), Epoch(2));
}

#[test]
fn shared_locks_coexist_and_do_not_advance_the_epoch() {
    let mut t = Locks::new();
    assert_eq!(t.set(I, flock(1, Some(Mode::Shared)), None).0, Outcome::Granted);
    assert_eq!(t.set(I, flock(2, Some(Mode::Shared)), None).0, Outcome::Granted);
    assert_eq!(t.set(I, posix(3, Some(Mode::Exclusive), 0, 10), None).0, Outcome::Refused(Error::WouldBlock));
    assert_eq!(t.epoch(I), Epoch(0));
}

#[test]
fn waiters_are_granted_in_arrival_order_and_shared_cannot_starve_exclusive() {
    let mut t = Locks::new();
    t.set(I, flock(1, Some(Mode::Shared)), None);
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), Some(WaitId(2))).0, Outcome::Parked);
    // A new shared request must queue behind the exclusive waiter.
    assert_eq!(t.set(I, flock(3, Some(Mode::Shared)), Some(WaitId(3))).0, Outcome::Parked);
    assert_eq!(t.set(I, flock(4, Some(Mode::Exclusive)), Some(WaitId(4))).0, Outcome::Parked);
    let e = t.release_handle(I, 1, Some(Owner(1)));
    assert_eq!(e, vec![Effect::Epoch(I, Epoch(1)), Effect::Grant(WaitId(2))]);
    let e = t.set(I, flock(2, None), None).1;
    assert_eq!(e, vec![Effect::Grant(WaitId(3))]);
    let e = t.set(I, flock(3, None), None).1;
    assert_eq!(e, vec![Effect::Epoch(I, Epoch(2)), Effect::Grant(WaitId(4))]);
}

#[test]
fn interrupt_ends_a_wait_and_unblocks_those_queued_behind() {
    let mut t = Locks::new();
    t.set(I, flock(1, Some(Mode::Shared)), None);
    t.set(I, flock(2, Some(Mode::Exclusive)), Some(WaitId(2)));
    t.set(I, flock(3, Some(Mode::Shared)), Some(WaitId(3)));
    let e = t.interrupt(WaitId(2)).unwrap();
    assert_eq!(e, vec![Effect::Refuse(WaitId(2), Error::Interrupted), Effect::Grant(WaitId(3))]);
    assert!(t.interrupt(WaitId(2)).is_none());
}

#[test]
fn posix_ranges_split_and_merge() {
    let mut t = Locks::new();
    t.set(I, posix(1, Some(Mode::Exclusive), 0, 99), None);
    t.set(I, posix(1, None, 40, 59), None);
    assert_eq!(t.set(I, posix(2, Some(Mode::Exclusive), 40, 59), None).0, Outcome::Granted);
    assert_eq!(t.set(I, posix(2, Some(Mode::Exclusive), 30, 45), None).0, Outcome::Refused(Error::WouldBlock));
    let l = t.test(I, &posix(3, Some(Mode::Shared), 60, 60)).unwrap();
    assert_eq!((l.range.start, l.range.end, l.pid), (60, 99, 1));
    t.set(I, posix(2, None, 0, OFFSET_MAX), None);
    t.set(I, posix(1, Some(Mode::Exclusive), 40, 59), None);
    let l = t.test(I, &posix(3, Some(Mode::Shared), 0, 0)).unwrap();
    assert_eq!((l.range.start, l.range.end), (0, 99), "adjacent ranges merge");
    assert_eq!(t.epoch(I), Epoch(0), "byte ranges do not advance the epoch");
}

#[test]
fn whole_file_posix_write_lock_and_flock_conflict_and_advance_epoch() {
    let mut t = Locks::new();
    t.set(I, posix(1, Some(Mode::Exclusive), 0, OFFSET_MAX), None);
    assert_eq!(t.epoch(I), Epoch(1));
    assert_eq!(t.set(I, flock(2, Some(Mode::Shared)), None).0, Outcome::Refused(Error::WouldBlock));
    t.release_owner(I, Owner(1));
    assert!(!t.is_live(I));
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), None).0, Outcome::Granted);
    assert_eq!(t.epoch(I), Epoch(2));
}

#[test]
fn deadlock_cycle_is_refused() {
    let (a, b) = (Ino(1), Ino(2));
    let mut t = Locks::new();
    t.set(a, posix(1, Some(Mode::Exclusive), 0, 0), None);
    t.set(b, posix(2, Some(Mode::Exclusive), 0, 0), None);
    assert_eq!(t.set(b, posix(1, Some(Mode::Exclusive), 0, 0), Some(WaitId(10))).0, Outcome::Parked);
    assert_eq!(t.set(a, posix(2, Some(Mode::Exclusive), 0, 0), Some(WaitId(11))).0, Outcome::Refused(Error::Deadlock));
}

#[test]
fn upgrade_by_a_holder_is_not_queued_behind_waiters() {
    let mut t = Locks::new();
    t.set(I, flock(1, Some(Mode::Shared)), None);
    t.set(I, flock(2, Some(Mode::Exclusive)), Some(WaitId(2)));
    assert_eq!(t.set(I, flock(1, Some(Mode::Exclusive)), None).0, Outcome::Granted);
    assert_eq!(t.epoch(I), Epoch(1));
    // Downgrade keeps the holder; the exclusive waiter still waits.
    assert_eq!(t.set(I, flock(1, Some(Mode::Shared)), None).1, vec![]);
    assert_eq!(t.lease(I).unwrap().waiters(), 1);
}

#[test]
fn ttl_breaks_for_a_contender_and_fences_the_holder() {
    let mut t = Locks::with_default_ttl(Some(1000));
    t.tick(0);
    t.set(I, flock(1, Some(Mode::Exclusive)), None);
    t.tick(500);
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), None).0, Outcome::Refused(Error::WouldBlock));
    assert!(t.renew(I, Some(1), &[]), "a write through the holder's descriptor renews");
    t.tick(1400);
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), None).0, Outcome::Refused(Error::WouldBlock));
    t.tick(1600);
    // Past the TTL: the contender breaks the lease and gets epoch + 1.
    let (o, e) = t.set(I, flock(2, Some(Mode::Exclusive)), None);
    assert_eq!(o, Outcome::Granted);
    assert!(e.contains(&Effect::Epoch(I, Epoch(2))), "{e:?}");
    assert!(t.fenced_handle(I, 1).is_some(), "the broken holder is fenced");
    // Its unlock is a no-op; it may contend again like anyone.
    assert_eq!(t.set(I, flock(1, None), None).0, Outcome::Granted);
    assert_eq!(t.epoch(I), Epoch(2));
}

#[test]
fn ttl_without_contention_keeps_the_incumbent_and_waiters_are_granted_at_expiry() {
    let mut t = Locks::with_default_ttl(Some(1000));
    t.tick(0);
    t.set(I, flock(1, Some(Mode::Exclusive)), None);
    t.tick(5000);
    assert!(t.tick(5000).is_empty(), "no contender: nothing happens");
    assert!(t.renew(I, Some(1), &[]), "a late renewal keeps the incumbent");
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), Some(WaitId(9))).0, Outcome::Parked);
    assert_eq!(t.next_deadline(), Some(6000));
    assert!(t.tick(5999).is_empty());
    let e = t.tick(6000);
    assert!(e.contains(&Effect::Grant(WaitId(9))), "{e:?}");
    assert_eq!(t.epoch(I), Epoch(2));
}

#[test]
fn a_files_own_ttl_is_timed_without_a_mount_default_and_follows_a_rebind() {
    // Only leases with a TTL of their own are looked at by the timer here;
    // a waiter on one must still be granted when the holder's TTL runs out,
    // also after the lease moved to another inode number.
    let mut t = Locks::new();
    t.tick(0);
    for other in 100..200 {
        t.set(Ino(other), flock(other, Some(Mode::Exclusive)), None);
    }
    t.set_ttl(I, Some(1000));
    t.set(I, flock(1, Some(Mode::Exclusive)), None);
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), Some(WaitId(9))).0, Outcome::Parked);
    assert_eq!(t.next_deadline(), Some(1000));
    let moved = Ino(8);
    t.rebind(I, moved);
    assert_eq!(t.next_deadline(), Some(1000));
    let e = t.tick(1000);
    assert!(e.contains(&Effect::Grant(WaitId(9))), "{e:?}");
    assert_eq!(t.epoch(moved), Epoch(2));
    assert_eq!(t.next_deadline(), Some(2000), "the new holder runs on the file's TTL");
    t.set_ttl(moved, None);
    assert_eq!(t.next_deadline(), None);
    // An uncontended holder's expiry is reported once.
    t.set_ttl(Ino(100), Some(500));
    let e = t.tick(2500);
    assert!(e.contains(&Effect::Expired(Ino(100), Epoch(1), 100)), "{e:?}");
    assert!(t.tick(3000).is_empty());
}

#[test]
fn an_idle_lease_is_kept_as_its_epoch_and_resumes_from_it() {
    let mut t = Locks::new();
    t.acquire_by_create(I);
    assert!(t.lease(I).is_none(), "a created, unlocked lease is idle");
    assert_eq!(t.epoch(I), Epoch(1));
    t.set(I, flock(1, Some(Mode::Exclusive)), None);
    assert!(t.lease(I).is_some());
    t.set(I, flock(1, None), None);
    assert!(t.lease(I).is_none(), "released: idle again");
    assert_eq!((t.epoch(I), t.idle_count()), (Epoch(2), 1));
    let (_, e) = t.set(I, flock(2, Some(Mode::Exclusive)), None);
    assert_eq!(e, vec![Effect::Epoch(I, Epoch(3))], "the next holder continues from the idle epoch");
    t.set(I, flock(2, None), None);
    // A file's own TTL keeps the full lease; removing it makes it idle at the next change.
    t.set_ttl(I, Some(1000));
    assert!(t.lease(I).is_some_and(|l| l.ttl() == Some(1000)));
    t.set_ttl(I, None);
    // Moving an idle lease carries its epoch and replaces the target's state.
    t.set(I, flock(3, Some(Mode::Exclusive)), None);
    t.set(I, flock(3, None), None);
    let to = Ino(8);
    t.set(to, flock(4, Some(Mode::Shared)), None);
    t.rebind(I, to);
    assert_eq!((t.epoch(to), t.epoch(I)), (Epoch(4), Epoch(0)));
    assert!(t.lease(to).is_none());
    assert_eq!(t.usage().0, 0, "the replaced target's locks are not counted");
    assert_eq!(t.forget(to), Epoch(4));
    assert_eq!((t.epoch(to), t.idle_count()), (Epoch(0), 0));
}

/// After a restart every lease resumes at the recovered ceiling at least:
/// known leases are raised, unknown ones start there (without an entry),
/// and idle leases at it are not kept.
#[test]
fn raise_all_lifts_every_lease_to_the_floor_without_an_entry_per_lease() {
    let mut t = Locks::new();
    let (a, b, c) = (Ino(5), Ino(6), Ino(7));
    t.acquire_by_create(a);
    t.set(b, flock(1, Some(Mode::Exclusive)), None);
    for _ in 0..20 {
        t.acquire_by_create(c);
    }
    t.raise_all(Epoch(10));
    assert_eq!([t.epoch(a), t.epoch(b), t.epoch(c), t.epoch(Ino(99))], [Epoch(10), Epoch(10), Epoch(20), Epoch(10)]);
    assert_eq!(t.idle_count(), 1, "only the lease above the floor is kept as an idle entry");
    let (_, e) = t.set(Ino(99), flock(2, Some(Mode::Exclusive)), None);
    assert_eq!(e, vec![Effect::Epoch(Ino(99), Epoch(11))], "a lease never seen starts from the floor");
    t.raise_all(Epoch(4));
    assert_eq!(t.epoch(a), Epoch(10), "a lower floor changes nothing");
    assert_eq!(t.forget(Ino(42)), Epoch(10), "an unknown lease's epoch is the floor");
}

/// Model test: random operations from several owners; after every step
/// no two owners hold conflicting locks and the epoch never decreases.
#[test]
fn model_no_two_exclusive_holders_and_monotonic_epochs() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut t = Locks::new();
    let mut last_epoch = Epoch(0);
    let mut parked: Vec<WaitId> = Vec::new();
    for step in 0..20_000u64 {
        let owner = next() % 5;
        let mode = match next() % 3 {
            0 => None,
            1 => Some(Mode::Shared),
            _ => Some(Mode::Exclusive),
        };
        let req = if next() % 2 == 0 {
            flock(owner, mode)
        } else {
            let s = next() % 8;
            let e = if next() % 4 == 0 { OFFSET_MAX } else { s + next() % 8 };
            posix(owner + 10, mode, s, e)
        };
        let effects = match next() % 6 {
            0 => t.release_handle(I, owner, Some(Owner(owner))),
            1 => t.release_owner(I, Owner(owner + 10)),
            2 if !parked.is_empty() => {
                let id = parked.remove((next() % parked.len() as u64) as usize);
                t.interrupt(id).unwrap_or_default()
            }
            _ => {
                let wait = (next() % 2 == 0 && !t.waiting.contains_key(&req.owner)).then_some(WaitId(step));
                let (o, e) = t.set(I, req, wait);
                if o == Outcome::Parked {
                    parked.push(WaitId(step));
                }
                e
            }
        };
        for e in effects {
            if let Effect::Grant(id) | Effect::Refuse(id, _) = e {
                parked.retain(|p| *p != id);
            }
        }
        let waiters = t.lease(I).map_or(0, |l| l.waiters());
        assert_eq!(t.waited(), if waiters > 0 { vec![I] } else { vec![] }, "step {step}: waited() is the waiters");
        assert_eq!(t.waiting.len(), waiters, "step {step}: every waiter is indexed");
        let locks = t.lease(I).map(|l| l.locks().to_vec()).unwrap_or_default();
        for a in &locks {
            for b in &locks {
                let conflict = a.owner != b.owner
                    && a.range.overlaps(&b.range)
                    && (a.mode == Mode::Exclusive || b.mode == Mode::Exclusive);
                assert!(!conflict, "step {step}: {a:?} and {b:?} both held");
            }
        }
        assert!(t.epoch(I) >= last_epoch, "step {step}: epoch went backwards");
        last_epoch = t.epoch(I);
    }
    assert!(last_epoch.0 > 100, "the model exercised acquisitions: {last_epoch:?}");
}

#[test]
fn break_all_fences_every_holder_and_grants_each_lease_its_first_waiter() {
    const J: Ino = Ino(8);
    let mut t = Locks::new();
    t.set(I, flock(1, Some(Mode::Exclusive)), None);
    t.set(J, posix(2, Some(Mode::Shared), 0, 10), None);
    t.set(J, posix(3, Some(Mode::Shared), 5, 20), None);
    assert_eq!(t.set(I, flock(4, Some(Mode::Exclusive)), Some(WaitId(4))).0, Outcome::Parked);
    assert_eq!(t.held(), vec![I, J]);
    let e = t.break_all();
    let broken: Vec<(Ino, u32, Epoch)> =
        e.iter().filter_map(|e| if let Effect::Broken(i, f) = e { Some((*i, f.pid, f.epoch)) } else { None }).collect();
    assert_eq!(broken, vec![(I, 1, Epoch(1)), (J, 2, Epoch(0)), (J, 3, Epoch(0))]);
    // The waiter on I is the next holder, with a new epoch; J is free.
    assert!(e.contains(&Effect::Grant(WaitId(4))));
    assert_eq!(t.epoch(I), Epoch(2));
    assert_eq!(t.held(), vec![I]);
    assert!(t.fenced_pid(I, &[1]).is_some());
    assert!(t.fenced_pid(J, &[3]).is_some());
    assert_eq!(t.set(J, posix(5, Some(Mode::Exclusive), 0, 100), None).0, Outcome::Granted);
}

#[test]
fn a_deadline_exists_while_a_holder_with_a_ttl_has_a_waiter_or_its_expiry_was_not_yet_reported() {
    let mut t = Locks::with_default_ttl(Some(1000));
    assert_eq!(t.deadline(I), None);
    t.set(I, flock(1, Some(Mode::Exclusive)), None);
    assert_eq!(t.deadline(I), Some(1000), "the expiry is reported once");
    assert!(t.tick(999).is_empty());
    assert_eq!(t.tick(1000), [Effect::Expired(I, Epoch(1), 1)]);
    assert_eq!(t.deadline(I), None, "reported; the holder keeps the lease");
    assert!(t.tick(5000).is_empty());
    // A renewal makes a new expiry to report.
    assert!(t.renew(I, Some(1), &[]));
    assert_eq!(t.deadline(I), Some(6000));
    // A contender after the expiry breaks it at once and holds a new one.
    t.tick(6000);
    let (o, fx) = t.set(I, flock(2, Some(Mode::Exclusive)), Some(WaitId(2)));
    assert_eq!(o, Outcome::Granted);
    assert!(fx.iter().any(|e| matches!(e, Effect::Broken(..))));
    assert_eq!(t.deadline(I), Some(7000));
    t.release_handle(I, 2, Some(Owner(2)));
    assert_eq!(t.deadline(I), None);
}

#[test]
fn lock_limits_refuse_with_enolck_change_nothing_and_free_up_again() {
    let mut t = Locks::new();
    let limits = LockLimits { ranges_per_owner: 4, locks_total: 100, waiters_per_lease: 2, waiters_total: 3 };
    t.set_limits(limits);
    // Owner 1 splits its locks into ranges 0, 2, 4, 6: the fifth is refused.
    for r in 0..4 {
        assert_eq!(t.set(I, posix(1, Some(Mode::Exclusive), r * 2, r * 2), None).0, Outcome::Granted);
    }
    assert_eq!(t.set(I, posix(1, Some(Mode::Exclusive), 8, 8), None).0, Outcome::Refused(Error::NoLock));
    assert_eq!(t.set(I, posix(1, Some(Mode::Exclusive), 0, 2), None).0, Outcome::Granted, "merging is fine");
    assert_eq!(t.set(I, posix(1, None, 1, 1), None).0, Outcome::Granted, "back to 4 ranges");
    assert_eq!(t.set(I, posix(1, None, 0, 0), None).0, Outcome::Granted, "removing one");
    assert_eq!(t.usage().0, 3);
    // A merge that would go above the bound in between is not refused.
    assert_eq!(t.set(I, posix(1, Some(Mode::Exclusive), 10, 10), None).0, Outcome::Granted);
    assert_eq!(t.set(I, posix(1, Some(Mode::Exclusive), 12, 12), None).0, Outcome::Refused(Error::NoLock));
    assert!(t.test(I, &posix(2, Some(Mode::Shared), 12, 12)).is_none(), "the refused lock is not held");
    assert_eq!(t.usage().0, 4);
    // The mount-wide bound counts every file's locks.
    const J: Ino = Ino(8);
    t.set_limits(LockLimits { locks_total: 5, ..limits });
    assert_eq!(t.set(J, flock(5, Some(Mode::Exclusive)), None).0, Outcome::Refused(Error::NoLock), "4 + 2 > 5");
    assert_eq!(t.limit_refusals(), 3);
    t.set_limits(limits);
    // Splitting by an unlock is refused too, and leaves every range as it was.
    const K: Ino = Ino(9);
    t.set(K, posix(3, Some(Mode::Exclusive), 0, 99), None);
    for hole in [10, 20, 30] {
        assert_eq!(t.set(K, posix(3, None, hole, hole), None).0, Outcome::Granted);
    }
    assert_eq!(t.set(K, posix(3, None, 40, 40), None).0, Outcome::Refused(Error::NoLock));
    assert_eq!(t.test(K, &posix(4, Some(Mode::Shared), 40, 40)).map(|l| l.owner), Some(Owner(3)));
    t.set(K, posix(3, None, 0, OFFSET_MAX), None);
    // Waiters: two per lease, three in all.
    t.set(I, posix(1, None, 0, OFFSET_MAX), None);
    assert_eq!(t.usage().0, 0);
    t.set(J, flock(5, Some(Mode::Exclusive)), None);
    assert_eq!(t.set(J, flock(6, Some(Mode::Exclusive)), Some(WaitId(1))).0, Outcome::Parked);
    assert_eq!(t.set(J, flock(7, Some(Mode::Exclusive)), Some(WaitId(2))).0, Outcome::Parked);
    assert_eq!(t.set(J, flock(8, Some(Mode::Exclusive)), Some(WaitId(3))).0, Outcome::Refused(Error::NoLock));
    t.set(I, flock(9, Some(Mode::Exclusive)), None);
    assert_eq!(t.set(I, flock(10, Some(Mode::Exclusive)), Some(WaitId(4))).0, Outcome::Parked);
    assert_eq!(t.set(I, flock(11, Some(Mode::Exclusive)), Some(WaitId(5))).0, Outcome::Refused(Error::NoLock));
    assert_eq!(t.usage(), (2, 3));
    // Releases free the room: the waiter is granted and a new one may queue.
    let fx = t.release_handle(J, 5, Some(Owner(5)));
    assert!(fx.contains(&Effect::Grant(WaitId(1))));
    assert_eq!(t.set(J, flock(8, Some(Mode::Exclusive)), Some(WaitId(3))).0, Outcome::Parked);
    assert_eq!(t.usage(), (2, 3));
}

/// A grant the arbiter numbered lands on exactly its number, also when a
/// read of the arbiter's counter raised the epoch here to it first; an
/// exclusive holder's epoch here is never lowered.
#[test]
fn an_arbitrated_grant_lands_on_the_arbiters_epoch() {
    let mut t = Locks::new();
    t.set(I, flock(1, Some(Mode::Exclusive)), None);
    t.set(I, flock(1, None), None);
    // The counter read 5 (the grant of 5 committed) before the grant was answered.
    t.raise_epoch(I, Epoch(5));
    t.align_epoch(I, Epoch(4));
    assert_eq!(t.set(I, flock(2, Some(Mode::Exclusive)), None).1, vec![Effect::Epoch(I, Epoch(5))]);
    // Held exclusively here: nothing lowers it.
    t.align_epoch(I, Epoch(3));
    assert_eq!(t.epoch(I), Epoch(5));
    // Below the counter: raised.
    t.set(I, flock(2, None), None);
    t.align_epoch(I, Epoch(8));
    assert_eq!(t.set(I, flock(3, Some(Mode::Exclusive)), None).1, vec![Effect::Epoch(I, Epoch(9))]);
}
