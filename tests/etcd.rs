//! A real 3-member etcd cluster on loopback, started and stopped by each
//! test that needs one, and the tests of leasefs's etcd client against it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasefs::cluster::client::{Client, CmpOp, Compare, EtcdError, Op, OpResult, Target, WatchMsg};

use crate::util::STEP;

/// One member: its ports and, while it runs, its process.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A 3-member cluster on 127.0.0.1 with its own ports and data directories;
/// `Drop` kills every member (by pid) and removes the data.
pub struct Cluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    /// Another local address the members also serve clients on (a test
    /// network namespace's link), besides 127.0.0.1.
    also: Option<String>,
}

/// Ports nothing listens on now (bound, learnt, released together so no two
/// are the same).
fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port")).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

impl Cluster {
    /// Start three members and wait until the cluster serves
    /// linearizable reads on every one of them.
    pub fn start() -> Cluster {
        Cluster::start_also_on(None)
    }

    /// Start three members that also serve clients on the local address `also`.
    pub fn start_also_on(also: Option<&str>) -> Cluster {
        assert!(
            Command::new("etcd").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success()),
            "etcd is needed (apt-get install etcd-server etcd-client)"
        );
        let ports = free_ports(6);
        let members: Vec<Member> = (0..3)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                child: None,
            })
            .collect();
        let mut c = Cluster { dir: tempfile::tempdir().unwrap(), members, also: also.map(str::to_string) };
        for i in 0..3 {
            c.run(i);
        }
        c.wait_healthy();
        c
    }

    fn initial_cluster(&self) -> String {
        let peers: Vec<String> =
            self.members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port)).collect();
        peers.join(",")
    }

    fn run(&mut self, i: usize) {
        let initial = self.initial_cluster();
        let token = format!("leasefs-test-{}", self.dir.path().display());
        let data: PathBuf = self.dir.path().join(&self.members[i].name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", self.members[i].name)))
            .unwrap();
        let m = &mut self.members[i];
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let listen = match &self.also {
            Some(ip) => format!("{client},http://{ip}:{}", m.client_port),
            None => client.clone(),
        };
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &listen, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial, "--initial-cluster-token", &token])
            .args(["--initial-cluster-state", "new"])
            // Fast elections keep leader-loss tests short.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        m.child = Some(child);
    }

    /// `http://127.0.0.1:PORT` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| format!("http://127.0.0.1:{}", m.client_port)).collect()
    }

    /// `http://IP:PORT` of every member, on the other address it serves.
    pub fn endpoints_on(&self, ip: &str) -> Vec<String> {
        self.members.iter().map(|m| format!("http://{ip}:{}", m.client_port)).collect()
    }

    /// The endpoint of member `i` alone.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + STEP;
        for i in 0..3 {
            if self.members[i].child.is_none() {
                continue;
            }
            let c = Client::new(&[self.endpoint(i)], Duration::from_secs(1));
            while let Err(e) = c.get(b"health") {
                assert!(Instant::now() < deadline, "etcd member {i} not healthy: {e}\n{}", self.logs());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The pids of the members running.
    pub fn pids(&self) -> Vec<i32> {
        self.members.iter().filter_map(|m| m.child.as_ref().map(|c| c.id() as i32)).collect()
    }

    /// Stop member `i` at once (SIGKILL), as a crash would.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start member `i` again on its data directory; waits until it serves.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.run(i);
        self.wait_healthy();
    }

    /// The index of the current leader.
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + STEP;
        loop {
            for i in 0..3 {
                if self.members[i].child.is_none() {
                    continue;
                }
                if status(&self.endpoint(i)).is_some_and(|(me, leader)| leader != "0" && me == leader) {
                    return i;
                }
            }
            assert!(Instant::now() < deadline, "no etcd leader\n{}", self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The members' logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let log = std::fs::read_to_string(self.dir.path().join(format!("{}.log", m.name))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            out += &format!("--- {} ---\n{}\n", m.name, tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        out
    }
}

/// `(member id, leader id)` from a member's status endpoint.
fn status(endpoint: &str) -> Option<(String, String)> {
    let host = endpoint.trim_start_matches("http://");
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut conn = leasefs::cluster::http::Conn::connect(host, deadline).ok()?;
    let r = conn.post("/v3/maintenance/status", b"{}", deadline).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
    Some((v["header"]["member_id"].as_str()?.to_string(), v["leader"].as_str()?.to_string()))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

fn client(c: &Cluster) -> Client {
    Client::new(&c.endpoints(), Duration::from_secs(2))
}

#[test]
fn a_transaction_applies_only_when_the_revisions_it_compares_are_unchanged() {
    let cluster = Cluster::start();
    let a = Client::new(&[cluster.endpoint(0)], Duration::from_secs(2));
    let b = Client::new(&[cluster.endpoint(2)], Duration::from_secs(2));
    // Create-if-absent: exactly one of two creators wins.
    let won = a.txn(&[Compare::absent(&b"t/k"[..])], &[Op::put(&b"t/k"[..], &b"a"[..], 0)], &[]).unwrap();
    let lost =
        b.txn(&[Compare::absent(&b"t/k"[..])], &[Op::put(&b"t/k"[..], &b"b"[..], 0)], &[Op::get(&b"t/k"[..])]).unwrap();
    assert!(won.succeeded && !lost.succeeded);
    let OpResult::Range(seen) = &lost.responses[0] else { panic!("{lost:?}") };
    assert_eq!(seen[0].value, b"a", "the loser reads the winner's value in the same transaction");
    // A write decided on a read is refused once someone else wrote after that read.
    let (kv, _) = b.get(b"t/k").unwrap();
    let kv = kv.unwrap();
    a.put(b"t/k", b"a2", 0).unwrap();
    let stale =
        b.txn(&[Compare::unchanged(&b"t/k"[..], kv.mod_revision)], &[Op::put(&b"t/k"[..], &b"b"[..], 0)], &[]).unwrap();
    assert!(!stale.succeeded);
    // A read on another member right after the write returns sees it (linearizable).
    assert_eq!(b.get(b"t/k").unwrap().0.unwrap().value, b"a2");
    let greater = Compare::new(&b"t/k"[..], CmpOp::Greater, Target::Version(1));
    assert!(b.txn(&[greater], &[], &[]).unwrap().succeeded);
    assert_eq!(a.delete(b"t/", &leasefs::cluster::client::prefix_end(b"t/")).unwrap(), 1);
    assert_eq!(b.get(b"t/k").unwrap().0, None);
}

#[test]
fn keys_on_a_lease_vanish_when_it_is_not_renewed_and_stay_while_it_is() {
    let cluster = Cluster::start();
    let c = client(&cluster);
    let (kept, ttl) = c.grant(2).unwrap();
    assert_eq!(ttl, 2);
    let (dropped, _) = c.grant(2).unwrap();
    c.put(b"l/kept", b"", kept).unwrap();
    c.put(b"l/dropped", b"", dropped).unwrap();
    assert_eq!(c.get(b"l/kept").unwrap().0.unwrap().lease, kept);
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        assert_eq!(c.keep_alive(kept).unwrap(), 2);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(c.get(b"l/kept").unwrap().0.is_some(), "a renewed lease keeps its keys");
    assert!(c.get(b"l/dropped").unwrap().0.is_none(), "an expired lease takes its keys");
    assert_eq!(c.keep_alive(dropped).unwrap(), 0, "renewing an expired lease says so");
    c.revoke(kept).unwrap();
    assert!(c.get(b"l/kept").unwrap().0.is_none(), "revoking deletes at once");
    c.revoke(kept).unwrap();
}

#[test]
fn a_watch_reports_every_change_in_order_from_another_member() {
    let cluster = Cluster::start();
    let writer = Client::new(&[cluster.endpoint(1)], Duration::from_secs(2));
    let watcher = Client::new(&[cluster.endpoint(0)], Duration::from_secs(2));
    let mut w = watcher.watch(b"w/", &leasefs::cluster::client::prefix_end(b"w/"), 0).unwrap();
    let r1 = writer.put(b"w/a", b"1", 0).unwrap();
    writer.put(b"x/outside", b"", 0).unwrap();
    writer.put(b"w/a", b"2", 0).unwrap();
    let r3 = writer.delete(b"w/a", &[]).unwrap();
    assert_eq!(r3, 1);
    let mut seen = Vec::new();
    let deadline = Instant::now() + STEP;
    while seen.len() < 3 {
        assert!(Instant::now() < deadline, "watch events missing: {seen:?}");
        if let Some(WatchMsg::Events { events, .. }) = w.next(Duration::from_secs(1)).unwrap() {
            for e in events {
                seen.push((e.deleted, e.kv.value.clone(), e.kv.mod_revision, e.prev.map(|p| p.value)));
            }
        }
    }
    assert_eq!(seen[0], (false, b"1".to_vec(), r1, None));
    assert_eq!((seen[1].0, &seen[1].1, &seen[1].3), (false, &b"2".to_vec(), &Some(b"1".to_vec())));
    assert_eq!((seen[2].0, &seen[2].3), (true, &Some(b"2".to_vec())));
    assert!(seen[0].2 < seen[1].2 && seen[1].2 < seen[2].2, "revisions increase: {seen:?}");
    // Replaying from a revision gives the same history.
    let mut again = watcher.watch(b"w/a", &[], r1).unwrap();
    let Some(WatchMsg::Events { events, .. }) = again.next(STEP).unwrap() else { panic!() };
    assert_eq!(events[0].kv.mod_revision, r1);
    w.close();
    again.close();
}

#[test]
fn the_client_fails_over_when_members_die_and_reports_unavailable_within_its_timeout() {
    let mut cluster = Cluster::start();
    let c = Client::new(&cluster.endpoints(), Duration::from_secs(2));
    c.put(b"f/k", b"1", 0).unwrap();
    let first = c.current().to_string();
    let i = cluster.endpoints().iter().position(|e| e.ends_with(&first)).unwrap();
    cluster.kill(i);
    // Reads go on through another member (a new leader if it was the leader).
    let deadline = Instant::now() + STEP;
    let v = loop {
        match c.get(b"f/k") {
            Ok((Some(kv), _)) => break kv.value,
            Ok((None, _)) => panic!("the key is gone"),
            Err(e) => assert!(Instant::now() < deadline, "no failover: {e}\n{}", cluster.logs()),
        }
    };
    assert_eq!(v, b"1");
    assert_ne!(c.current(), first);
    // Writes too, once a leader is there.
    cluster.leader();
    let deadline = Instant::now() + STEP;
    while let Err(e) = c.put(b"f/k", b"2", 0) {
        assert!(Instant::now() < deadline, "no write after failover: {e}");
    }
    // With no quorum left, calls end within the timeout instead of hanging.
    let j = (i + 1) % 3;
    cluster.kill(j);
    let started = Instant::now();
    let e = c.get(b"f/k").unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "bounded by the timeout: {:?}", started.elapsed());
    assert!(matches!(e, EtcdError::Unavailable(_) | EtcdError::Server { .. }), "{e}");
    // Back to quorum: the client recovers by itself.
    cluster.restart(j);
    let deadline = Instant::now() + STEP;
    loop {
        match c.get(b"f/k") {
            Ok((Some(kv), _)) => {
                assert_eq!(kv.value, b"2");
                break;
            }
            Ok((None, _)) => panic!("the key is gone"),
            Err(e) => assert!(Instant::now() < deadline, "no recovery: {e}"),
        }
    }
}

mod arbitration {
    //! Cluster-wide arbitration: each "host" is its own client, etcd
    //! session and arbiter, as a daemon on another machine would be.

    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use leasefs::cluster::arbiter::{Arbiter, Asker, Decision, Mode, SOLO_FROM};
    use leasefs::cluster::client::{prefix_end, Client};
    use leasefs::cluster::session::HostSession;
    use leasefs::cluster::watcher::QueueWatcher;
    use leasefs::lease::authority::Wake;

    use super::Cluster;
    use crate::util::STEP;

    fn host(c: &Cluster, name: &str, ttl: i64) -> Arbiter {
        let client = Arc::new(Client::new(&c.endpoints(), Duration::from_secs(2)));
        let session = Arc::new(HostSession::start(client.clone(), ttl).unwrap());
        Arbiter::new(client, "leasefs-test", session, name)
    }

    fn asker(pid: u32) -> Asker {
        Asker { pid, comm: "test".into(), owner: format!("flock:{pid}"), ttl_ms: None }
    }

    /// Wait for `t` to be granted (its predecessors to go); the epoch.
    fn await_grant(a: &Arbiter, t: &leasefs::cluster::arbiter::Ticket) -> (u64, bool) {
        let deadline = Instant::now() + STEP;
        loop {
            match a.decide(t).unwrap() {
                Decision::Granted { epoch, lost_holder } => return (epoch, lost_holder),
                Decision::Gone => panic!("the entry is gone"),
                Decision::HeldBack { holder } => panic!("held back behind {holder}, unasked"),
                Decision::Behind { predecessor, revision, .. } => {
                    assert!(a.wait_gone(&predecessor, revision, deadline).unwrap(), "never granted")
                }
            }
        }
    }

    /// Take `name` exclusively, allowing a solo grant; the ticket and epoch.
    fn solo_acquire(a: &Arbiter, name: &str, pid: u32) -> (leasefs::cluster::arbiter::Ticket, u64) {
        let mut t = a.ticket(name, Mode::Exclusive, &asker(pid)).unwrap();
        t.solo_ok = true;
        a.acquire_ticket(t, STEP).unwrap().unwrap()
    }

    fn behind(a: &Arbiter, t: &leasefs::cluster::arbiter::Ticket) -> bool {
        matches!(a.decide(t).unwrap(), Decision::Behind { .. })
    }

    #[test]
    fn exclusive_grants_across_hosts_are_one_at_a_time_in_arrival_order_with_epoch_plus_one() {
        let cluster = Cluster::start();
        let (a, b, c) = (host(&cluster, "a", 10), host(&cluster, "b", 10), host(&cluster, "c", 10));
        let (ta, e1) = a.acquire("/L", Mode::Exclusive, &asker(1), STEP).unwrap().unwrap();
        assert_eq!(e1, 1);
        let tb = b.enqueue("/L", Mode::Exclusive, &asker(2)).unwrap();
        let tc = c.enqueue("/L", Mode::Exclusive, &asker(3)).unwrap();
        assert!(behind(&b, &tb) && behind(&c, &tc), "nobody is granted while a holds it");
        // Another name is independent, even one whose name starts the same.
        let (tx, ex) = c.acquire("/L/x", Mode::Exclusive, &asker(3), STEP).unwrap().unwrap();
        assert_eq!(ex, 1);
        a.release(&ta).unwrap();
        // c's entry is behind b's: arrival order across hosts.
        assert!(behind(&c, &tc), "c must not overtake b");
        assert_eq!(b.decide(&tb).unwrap(), Decision::Granted { epoch: 2, lost_holder: false });
        let (es, _) = a.entries("/L").unwrap();
        assert_eq!(es.iter().map(|e| (e.host.as_str(), e.held)).collect::<Vec<_>>(), [("b", true), ("c", false)]);
        assert_eq!(es[0].asker, asker(2));
        b.release(&tb).unwrap();
        assert_eq!(c.decide(&tc).unwrap(), Decision::Granted { epoch: 3, lost_holder: false });
        c.release(&tc).unwrap();
        c.release(&tx).unwrap();
        // The counter outlives every entry: the next holder gets 4, never 1 again.
        assert!(a.entries("/L").unwrap().0.is_empty());
        assert_eq!(a.epoch("/L").unwrap(), 3);
        assert_eq!(a.acquire("/L", Mode::Exclusive, &asker(1), STEP).unwrap().unwrap().1, 4);
    }

    /// A holder's release grants the next exclusive waiter in the same
    /// transaction (epoch + 1, the counter naming it), from the queue as
    /// the releasing host knew it; a waiter that left since is not written
    /// back, and a shared waiter decides for itself.
    #[test]
    fn a_release_hands_the_lease_to_the_next_exclusive_waiter_in_its_own_transaction() {
        let cluster = Cluster::start();
        let (a, b, c) = (host(&cluster, "a", 10), host(&cluster, "b", 10), host(&cluster, "c", 10));
        let q = a.queue_prefix("/F");
        let known = |x: &Arbiter| Some(x.client().range(&q, &prefix_end(&q)).unwrap());
        let holders =
            |x: &Arbiter| x.entries("/F").unwrap().0.into_iter().map(|e| (e.host, e.held, e.epoch)).collect::<Vec<_>>();
        let (ta, e1) = a.acquire("/F", Mode::Exclusive, &asker(1), STEP).unwrap().unwrap();
        let tb = b.enqueue("/F", Mode::Exclusive, &asker(2)).unwrap();
        let tc = c.enqueue("/F", Mode::Exclusive, &asker(3)).unwrap();
        // Known: b first. b leaves before the release: c is handed the
        // lease, and b's entry is not written back as a holder.
        let stale = known(&a);
        b.release(&tb).unwrap();
        a.release_from(&ta, stale).unwrap();
        assert_eq!(a.handoffs(), 1);
        assert_eq!(holders(&a), [("c".to_string(), true, e1 + 1)]);
        assert_eq!(a.epoch("/F").unwrap(), e1 + 1);
        assert_eq!(c.decide(&tc).unwrap(), Decision::Granted { epoch: e1 + 1, lost_holder: false });

        // Through a host's watch of the queues: a shared waiter is not
        // handed the lease (no hand-off counted); it decides for itself.
        let watch = QueueWatcher::start(c.client().clone(), "leasefs-test", "c", Wake::default());
        c.set_mirror(watch.mirror());
        let seen = |n: usize| {
            let deadline = Instant::now() + STEP;
            while watch.mirror().queue(&q).map(|(kvs, _)| kvs.len()) != Some(n) {
                assert!(Instant::now() < deadline, "the watch never saw {n} entries");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let sd = a.enqueue("/F", Mode::Shared, &asker(4)).unwrap();
        seen(2);
        c.release(&tc).unwrap();
        assert_eq!(c.handoffs(), 0);
        assert_eq!(a.decide(&sd).unwrap(), Decision::Granted { epoch: e1 + 1, lost_holder: false });
        a.release(&sd).unwrap();
        // An exclusive waiter is.
        let (tc2, e3) = c.acquire("/F", Mode::Exclusive, &asker(3), STEP).unwrap().unwrap();
        assert_eq!(e3, e1 + 2);
        let tb2 = b.enqueue("/F", Mode::Exclusive, &asker(2)).unwrap();
        seen(2);
        c.release(&tc2).unwrap();
        assert_eq!(c.handoffs(), 1);
        assert_eq!(holders(&c), [("b".to_string(), true, e1 + 3)]);
        // b's ticket still says it waits (its host has not seen the grant
        // yet): leaving the queue then releases the grant, handing it on.
        let ta3 = a.enqueue("/F", Mode::Exclusive, &asker(1)).unwrap();
        b.release_from(&tb2, known(&b)).unwrap();
        assert_eq!(holders(&b), [("a".to_string(), true, e1 + 4)]);
        assert_eq!(a.decide(&ta3).unwrap(), Decision::Granted { epoch: e1 + 4, lost_holder: false });
        a.release(&ta3).unwrap();
        assert!(holders(&a).is_empty());
        assert_eq!(a.epoch("/F").unwrap(), e1 + 4);
    }

    #[test]
    fn shared_holders_coexist_and_never_overtake_an_earlier_exclusive_waiter() {
        let cluster = Cluster::start();
        let (a, b, c) = (host(&cluster, "a", 10), host(&cluster, "b", 10), host(&cluster, "c", 10));
        let (sa, ea) = a.acquire("/S", Mode::Shared, &asker(1), STEP).unwrap().unwrap();
        let (sb, eb) = b.acquire("/S", Mode::Shared, &asker(2), STEP).unwrap().unwrap();
        assert_eq!((ea, eb), (0, 0), "shared holders do not raise the epoch");
        let xc = c.enqueue("/S", Mode::Exclusive, &asker(3)).unwrap();
        let sd = a.enqueue("/S", Mode::Shared, &asker(4)).unwrap();
        assert!(behind(&c, &xc));
        assert!(behind(&a, &sd), "a shared request behind an exclusive waiter waits");
        a.release(&sa).unwrap();
        assert!(behind(&c, &xc), "one shared holder is left");
        b.release(&sb).unwrap();
        assert_eq!(c.decide(&xc).unwrap(), Decision::Granted { epoch: 1, lost_holder: false });
        assert!(behind(&a, &sd));
        c.release(&xc).unwrap();
        assert_eq!(a.decide(&sd).unwrap(), Decision::Granted { epoch: 1, lost_holder: false });
    }

    #[test]
    fn a_cancelled_wait_leaves_the_queue_and_blocks_nobody() {
        let cluster = Cluster::start();
        let (a, b, c) = (host(&cluster, "a", 10), host(&cluster, "b", 10), host(&cluster, "c", 10));
        let (ta, _) = a.acquire("/C", Mode::Exclusive, &asker(1), STEP).unwrap().unwrap();
        // b gives up after its timeout; its entry goes with it.
        let started = Instant::now();
        assert!(b.acquire("/C", Mode::Exclusive, &asker(2), Duration::from_millis(300)).unwrap().is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
        let tc = c.enqueue("/C", Mode::Exclusive, &asker(3)).unwrap();
        assert_eq!(a.entries("/C").unwrap().0.len(), 2, "b's entry is gone");
        a.release(&ta).unwrap();
        assert_eq!(c.decide(&tc).unwrap(), Decision::Granted { epoch: 2, lost_holder: false });
    }

    #[test]
    fn a_host_that_cannot_renew_gives_up_before_etcd_expires_it_and_the_waiter_gets_epoch_plus_one() {
        let cluster = Cluster::start();
        let a = host(&cluster, "a", 3);
        let b = host(&cluster, "b", 10);
        let lost = Arc::new(Mutex::new(Vec::new()));
        let l = lost.clone();
        a.session().on_lost(Box::new(move |id| l.lock().unwrap().push(id)));
        let (ta, e1) = a.acquire("/H", Mode::Exclusive, &asker(1), STEP).unwrap().unwrap();
        let tb = b.enqueue("/H", Mode::Exclusive, &asker(2)).unwrap();
        let (old, _, generation) = a.session().lease();
        a.session().pause_renewals(true);
        // Until a knows it is in jeopardy, it still holds the lease on the server.
        let deadline = Instant::now() + STEP;
        while a.session().alive().is_some() {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(5));
        }
        let (es, _) = b.entries("/H").unwrap();
        assert!(es.iter().any(|e| e.key == ta.key), "a gave up while etcd still had its lease (the margin)");
        assert!(behind(&b, &tb), "nobody else was granted yet");
        // a's grants are refused from now on.
        assert_eq!(a.decide(&ta).unwrap(), Decision::Gone);
        // Once etcd expires a's lease, b is granted with the next epoch.
        let (e2, lost_holder) = await_grant(&b, &tb);
        assert_eq!((e2, lost_holder), (e1 + 1, true));
        let (es, _) = b.entries("/H").unwrap();
        assert!(!es.iter().any(|e| e.key == ta.key), "etcd removed the lost host's entry");
        assert_eq!(*lost.lock().unwrap(), [old], "on_lost ran once, with the old lease");
        // a comes back with a new session.
        a.session().pause_renewals(false);
        assert!(a.session().wait_newer(generation, STEP), "a registered a new session");
        assert_ne!(a.session().lease().0, old);
    }

    #[test]
    fn a_lost_holder_is_reported_to_the_next_holder_and_a_clean_release_is_not() {
        let cluster = Cluster::start();
        let a = host(&cluster, "a", 2);
        let b = host(&cluster, "b", 10);
        let (ta, _) = b.acquire("/D", Mode::Exclusive, &asker(1), STEP).unwrap().unwrap();
        b.release(&ta).unwrap();
        let (tb, _) = a.acquire("/D", Mode::Exclusive, &asker(2), STEP).unwrap().unwrap();
        let tc = b.enqueue("/D", Mode::Exclusive, &asker(3)).unwrap();
        let decided = b.decide(&tc).unwrap();
        assert!(matches!(decided, Decision::Behind { .. }));
        a.session().pause_renewals(true);
        let Decision::Behind { predecessor, .. } = decided else { unreachable!() };
        assert_eq!(predecessor, tb.key, "a waiter watches the entry right before it");
        assert_eq!(await_grant(&b, &tc), (3, true));
        b.release(&tc).unwrap();
        let (_, e) = b.acquire("/D", Mode::Exclusive, &asker(4), STEP).unwrap().unwrap();
        assert_eq!(e, 4);
    }

    /// A solo holder: granted by a transaction that writes the counter
    /// alone (no queue entry). Another host's waiter gives it its entry
    /// (on the holder's session) and queues behind it, though its own
    /// entry is older; the holder's release then hands the lease to that
    /// waiter, epoch + 1, and the next solo grant is epoch + 2. Red (the
    /// waiter granted while the holder holds) when only older entries
    /// stand in a waiter's way, or when a decision after a wake-up trusts
    /// a counter that names a holder.
    #[test]
    fn a_solo_holder_is_in_the_counter_alone_until_a_waiter_writes_its_entry_and_queues_behind_it() {
        let cluster = Cluster::start();
        let (a, b) = (host(&cluster, "a", 10), host(&cluster, "b", 10));
        let (ta, e1) = solo_acquire(&a, "/S", 1);
        assert_eq!(e1, 1);
        assert!(ta.solo.is_some(), "granted with an entry");
        let client = Client::new(&cluster.endpoints(), Duration::from_secs(2));
        let q = b"leasefs-test/q/%2FS/".to_vec();
        assert_eq!(client.range(&q, &prefix_end(&q)).unwrap().0.len(), 0, "a solo grant wrote an entry");
        let counter = client.get(b"leasefs-test/epoch/%2FS").unwrap().0.unwrap();
        assert!(counter.value.starts_with(SOLO_FROM), "{:?}", String::from_utf8_lossy(&counter.value));
        // Seen by other hosts as a holder (F_GETLK, `leases`).
        let seen = b.entries("/S").unwrap().0;
        assert!(seen.len() == 1 && seen[0].held && seen[0].host == "a" && seen[0].key == ta.key, "{seen:?}");
        assert!(b.all_entries().unwrap().iter().any(|(n, e, es)| n == "/S" && *e == 1 && es.len() == 1));
        // Both queued before its entry is written; a shared request is
        // in its way all the same.
        let tb = b.enqueue("/S", Mode::Exclusive, &asker(3)).unwrap();
        let ts = b.enqueue("/S", Mode::Shared, &asker(2)).unwrap();
        assert!(behind(&b, &tb) && behind(&b, &ts), "granted while a holds it solo");
        let queued = client.range(&q, &prefix_end(&q)).unwrap().0;
        assert_eq!(queued.len(), 3, "the holder's entry was not written");
        assert!(queued.iter().any(|kv| kv.key == ta.key && kv.create_revision > tb.create_revision));
        // Woken needlessly: still behind.
        assert!(matches!(b.decide_after(&tb, None).unwrap(), Decision::Behind { .. }), "granted while a holds it");
        a.release(&ta).unwrap();
        assert_eq!(await_grant(&b, &tb), (2, false));
        b.release(&tb).unwrap();
        assert_eq!(await_grant(&b, &ts), (2, false));
        b.release(&ts).unwrap();
        // b knows the counter as its release left it: solo again.
        let (tb, e3) = solo_acquire(&b, "/S", 3);
        assert_eq!((e3, tb.solo.is_some()), (3, true));
        // A release nobody interrupted clears the counter in one step.
        b.release(&tb).unwrap();
        assert_eq!(a.epoch("/S").unwrap(), 3);
        let counter = client.get(b"leasefs-test/epoch/%2FS").unwrap().0.unwrap();
        assert_eq!(String::from_utf8_lossy(&counter.value), r#"{"epoch":3,"holder":""}"#);
        assert_eq!(client.range(&q, &prefix_end(&q)).unwrap().0.len(), 0);
    }

    /// A solo holder whose host's session expires is a lost holder: not
    /// shown any more, and the next request is granted epoch + 1 with
    /// `lost_holder` (so `--lock-delay` holds it back). Until then it
    /// holds. Red when the session is not checked (granted at once) or
    /// when the counter is taken as lost while the session lives.
    #[test]
    fn a_solo_holder_whose_session_expired_is_a_lost_holder() {
        let cluster = Cluster::start();
        let (a, b) = (host(&cluster, "a", 2), host(&cluster, "b", 10));
        let (ta, e1) = solo_acquire(&a, "/T", 1);
        assert!(ta.solo.is_some());
        assert_eq!(b.entries("/T").unwrap().0.len(), 1, "the solo holder is not shown");
        a.session().pause_renewals(true);
        let deadline = Instant::now() + STEP;
        while !b.entries("/T").unwrap().0.is_empty() {
            assert!(Instant::now() < deadline, "etcd never expired a's session");
            std::thread::sleep(Duration::from_millis(20));
        }
        let tb = b.enqueue("/T", Mode::Exclusive, &asker(2)).unwrap();
        assert_eq!(b.decide(&tb).unwrap(), Decision::Granted { epoch: e1 + 1, lost_holder: true });
        a.session().pause_renewals(false);
    }

    /// `--lock-delay` in the arbiter: a ticket that asks for the delay
    /// and finds its predecessor's host lost is granted nothing (the
    /// counter keeps the lost holder's epoch, however often it decides)
    /// until it names that holder as served; then it is granted epoch + 1.
    /// Red (granted at once, or epoch 3) when the decision grants first.
    #[test]
    fn a_ticket_held_back_by_the_lock_delay_takes_no_epoch_until_served() {
        let cluster = Cluster::start();
        let a = host(&cluster, "a", 2);
        let b = host(&cluster, "b", 10);
        let (ta, e1) = a.acquire("/L", Mode::Exclusive, &asker(1), STEP).unwrap().unwrap();
        let mut tb = b.enqueue("/L", Mode::Exclusive, &asker(2)).unwrap();
        tb.delay_lost = true;
        a.session().pause_renewals(true);
        let deadline = Instant::now() + STEP;
        while b.entries("/L").unwrap().0.iter().any(|e| e.key == ta.key) {
            assert!(Instant::now() < deadline, "etcd never expired a's session");
            std::thread::sleep(Duration::from_millis(20));
        }
        let lost = String::from_utf8(ta.key.clone()).unwrap();
        for _ in 0..3 {
            assert_eq!(b.decide(&tb).unwrap(), Decision::HeldBack { holder: lost.clone() });
            assert_eq!(b.epoch("/L").unwrap(), e1, "a held-back decision took an epoch");
        }
        tb.served = Some(lost);
        assert_eq!(b.decide(&tb).unwrap(), Decision::Granted { epoch: e1 + 1, lost_holder: true });
        a.session().pause_renewals(false);
    }

    /// Workers on three hosts contend for one lease while the etcd leader is
    /// killed and restarted: never two holders at once, epochs strictly
    /// increase in grant order, every acknowledged increment is kept.
    #[test]
    fn contending_hosts_never_overlap_and_epochs_strictly_increase_through_a_leader_kill() {
        contend_through_a_leader_kill(false);
    }

    /// The same with one worker per host granted solo when nothing is in
    /// its way (its holds recorded in the counter alone until a waiter
    /// writes its entry).
    #[test]
    fn contending_solo_and_queued_holders_never_overlap_through_a_leader_kill() {
        contend_through_a_leader_kill(true);
    }

    fn contend_through_a_leader_kill(solo: bool) {
        let mut cluster = Cluster::start();
        let hosts: Vec<Arc<Arbiter>> = ["a", "b", "c"].iter().map(|n| Arc::new(host(&cluster, n, 10))).collect();
        let inside = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicU64::new(0));
        let grants = Arc::new(Mutex::new(Vec::new()));
        // Acquires that failed (the leader was killed): one may have been
        // granted, with the answer lost, and its grant given up again.
        let unknown = Arc::new(AtomicU64::new(0));
        let stop_at = Instant::now() + Duration::from_secs(6);
        let mut workers = Vec::new();
        for (h, arb) in hosts.iter().enumerate() {
            for w in 0..2u32 {
                let (arb, inside, overlaps, grants, unknown) =
                    (arb.clone(), inside.clone(), overlaps.clone(), grants.clone(), unknown.clone());
                workers.push(std::thread::spawn(move || {
                    let me = asker(h as u32 * 10 + w);
                    let mut done = 0;
                    while Instant::now() < stop_at {
                        let Ok(mut t) = arb.ticket("/J", Mode::Exclusive, &me) else {
                            unknown.fetch_add(1, Ordering::SeqCst);
                            continue;
                        };
                        t.solo_ok = solo && w == 0;
                        let (t, epoch) = match arb.acquire_ticket(t, Duration::from_secs(10)) {
                            Ok(Some(granted)) => granted,
                            Ok(None) => continue,
                            Err(_) => {
                                unknown.fetch_add(1, Ordering::SeqCst);
                                continue;
                            }
                        };
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        grants.lock().unwrap().push(epoch);
                        std::thread::sleep(Duration::from_millis(2));
                        inside.store(false, Ordering::SeqCst);
                        // A release whose answer is lost is retried; the entry may already be gone.
                        while arb.release(&t).is_err() && Instant::now() < stop_at + Duration::from_secs(20) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        done += 1;
                    }
                    done
                }));
            }
        }
        std::thread::sleep(Duration::from_secs(2));
        let leader = cluster.leader();
        cluster.kill(leader);
        std::thread::sleep(Duration::from_secs(1));
        cluster.restart(leader);
        let done: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        let grants = grants.lock().unwrap().clone();
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
        assert!(done >= 20, "only {done} grants in 6 s");
        assert!(grants.windows(2).all(|w| w[0] < w[1]), "epochs not strictly increasing: {grants:?}");
        // The epoch is the last grant's, or one an acquire whose answer was
        // lost took after it: never more than those could explain.
        let (last, epoch, unknown) =
            (*grants.last().unwrap(), hosts[0].epoch("/J").unwrap(), unknown.load(Ordering::SeqCst));
        assert!(
            epoch >= last && epoch <= last + unknown,
            "epoch {epoch}, last grant seen {last}, {unknown} acquires failed"
        );
    }
}
