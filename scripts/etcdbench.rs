//! Cost of cross-host arbitration on a real etcd cluster (run by
//! scripts/etcdbench.sh, which starts the cluster): the arbiter's
//! uncontended acquire+release against a bare etcd transaction cycle
//! (create-if-absent, delete) through the same client, two hosts
//! contending for one lease, and what the cluster itself gives two clients
//! writing disjoint keys at once against one alone (the ceiling of the
//! mounts' `parallel2/1`).
//!   etcdbench ENDPOINTS ITERATIONS SECONDS [cycle NAME]
//! With `cycle NAME`, only the bare cycle, printed as `NAME` (the script
//! measures it right before and after a mount's figure).

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasefs::cluster::arbiter::{Arbiter, Asker, Mode};
use leasefs::cluster::client::{Client, Compare, Op};
use leasefs::cluster::session::HostSession;

fn median_us(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

/// `n` bare transaction cycles (create-if-absent, delete) through `raw`.
fn bare_cycles(raw: &Client, n: usize) -> Vec<Duration> {
    let mut cycle = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("bench/raw/{}", i % 16).into_bytes();
        let t = Instant::now();
        let r = raw.txn(&[Compare::absent(key.clone())], &[Op::put(key.clone(), b"x".to_vec(), 0)], &[]).expect("txn");
        assert!(r.succeeded);
        raw.delete(&key, &[]).expect("delete");
        cycle.push(t.elapsed());
    }
    cycle
}

fn host(endpoints: &[String], name: &str) -> Arbiter {
    let client = Arc::new(Client::new(endpoints, Duration::from_secs(2)));
    let session = Arc::new(HostSession::start(client.clone(), 10).expect("etcd session"));
    Arbiter::new(client, "leasefs-bench", session, name)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let endpoints: Vec<String> = args[1].split(',').map(str::to_string).collect();
    let n: usize = args[2].parse().expect("iterations");
    let secs: u64 = args[3].parse().expect("seconds");
    let raw = Client::new(&endpoints, Duration::from_secs(2));
    let cycle = bare_cycles(&raw, n);
    if args.get(4).map(String::as_str) == Some("cycle") {
        println!("{} {:.0}", args[5], median_us(cycle));
        return;
    }
    // Where an arbiter cycle's extra time goes: the same cycle writing two
    // keys per step (entry and counter, as the arbiter does), and with the
    // entry on an etcd lease (as every queue entry is).
    let mut two = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("bench/raw/{}", i % 16).into_bytes();
        let counter = format!("bench/ctr/{}", i % 16).into_bytes();
        let t = Instant::now();
        let r = raw
            .txn(
                &[Compare::absent(key.clone())],
                &[Op::put(key.clone(), b"x".to_vec(), 0), Op::put(counter.clone(), format!("{i}"), 0)],
                &[],
            )
            .expect("txn");
        assert!(r.succeeded);
        let r =
            raw.txn(&[], &[Op::delete(key.clone()), Op::put(counter.clone(), format!("{i}"), 0)], &[]).expect("txn");
        assert!(r.succeeded);
        two.push(t.elapsed());
    }
    let (lease, _) = raw.grant(30).expect("lease");
    let mut leased = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("bench/raw/{}", i % 16).into_bytes();
        let t = Instant::now();
        let r =
            raw.txn(&[Compare::absent(key.clone())], &[Op::put(key.clone(), b"x".to_vec(), lease)], &[]).expect("txn");
        assert!(r.succeeded);
        raw.delete(&key, &[]).expect("delete");
        leased.push(t.elapsed());
    }
    // The read barrier's own cost: one linearizable read of one key.
    let mut read = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        raw.get(b"bench/ns/rev").expect("range");
        read.push(t.elapsed());
    }
    println!("raw_read_us {:.0}", median_us(read));
    println!("raw_txn2_cycle_us {:.0}", median_us(two));
    println!("raw_leased_cycle_us {:.0}", median_us(leased));
    let a = host(&endpoints, "a");
    let me = Asker { pid: std::process::id(), comm: "etcdbench".into(), owner: "bench".into(), ttl_ms: None };
    let mut arb = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("/bench/{}", i % 16);
        let t = Instant::now();
        let (ticket, _) =
            a.acquire(&name, Mode::Exclusive, &me, Duration::from_secs(5)).expect("acquire").expect("granted");
        a.release(&ticket).expect("release");
        arb.push(t.elapsed());
    }
    println!("raw_txn_cycle_us {:.0}", median_us(cycle));
    println!("arbiter_cycle_us {:.0}", median_us(arb));
    // Two hosts, one lease.
    let hosts = [Arc::new(a), Arc::new(host(&endpoints, "b"))];
    let stop = Instant::now() + Duration::from_secs(secs);
    let workers: Vec<_> = hosts
        .iter()
        .map(|h| {
            let (h, me) = (h.clone(), me.clone());
            std::thread::spawn(move || {
                let mut done = 0u64;
                while Instant::now() < stop {
                    if let Ok(Some((t, _))) = h.acquire("/bench/shared", Mode::Exclusive, &me, Duration::from_secs(5)) {
                        let _ = h.release(&t);
                        done += 1;
                    }
                }
                done
            })
        })
        .collect();
    let total: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
    println!("contend2_acq_s {:.0}", total as f64 / secs as f64);
    // Transactions per second from one client, then from two at once
    // (each its own connection and key, one transaction after another).
    for clients in [1, 2] {
        let stop = Instant::now() + Duration::from_secs(secs);
        let workers: Vec<_> = (0..clients)
            .map(|c| {
                let client = Client::new(&endpoints, Duration::from_secs(2));
                std::thread::spawn(move || {
                    let key = format!("bench/parallel/{c}").into_bytes();
                    let mut done = 0u64;
                    while Instant::now() < stop {
                        client.txn(&[], &[Op::put(key.clone(), format!("{done}"), 0)], &[]).expect("txn");
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let total: u64 = workers.into_iter().map(|w| w.join().expect("worker")).sum();
        println!("raw_parallel{clients}_txn_s {:.0}", total as f64 / secs as f64);
    }
}
