#!/usr/bin/env bash
# etcd requests per file operation on an --etcd mount: starts a one-member
# etcd on loopback and two hosts (two daemons), runs each operation ten
# times from Python (minus Python's own start-up), and prints the linearizable
# reads (range) and transactions (txn) each host sent per operation, from
# the `etcd.requests` counters of `.leasefs/status`. Needs root and etcd.
#   scripts/etcdcalls.sh
set -u
cd "$(dirname "$0")/.."
cargo build --quiet --workspace
BIN=$PWD/target/debug/leasefs
W=$(mktemp -d /tmp/leasefs-etcdcalls.XXXXXX); mkdir -p $W/a $W/b
PORT=$((40000 + RANDOM % 10000))
etcd --name p --data-dir $W/etcd --listen-client-urls http://127.0.0.1:$((PORT+1)) --advertise-client-urls http://127.0.0.1:$((PORT+1)) --listen-peer-urls http://127.0.0.1:$((PORT)) --initial-advertise-peer-urls http://127.0.0.1:$((PORT)) --initial-cluster p=http://127.0.0.1:$((PORT)) >$W/etcd.log 2>&1 &
EP=$!
trap 'for h in a b; do umount $W/$h 2>/dev/null; done; kill $EP 2>/dev/null; wait $EP 2>/dev/null; rm -rf $W' EXIT
for i in $(seq 100); do curl -sf -X POST http://127.0.0.1:$((PORT+1))/v3/kv/range -d '{"key":"eA=="}' >/dev/null && break; sleep 0.1; done
for h in a b; do $BIN mount $W/$h --state-dir $W/st-$h --volatile --etcd http://127.0.0.1:$((PORT+1)) --etcd-prefix prof; done
req() { python3 -c "import json,sys; d=json.load(open('$1/.leasefs/status'))['etcd']['requests']; print(' '.join(f'{k}={v}' for k,v in d.items()))"; }
tot() { python3 -c "import json; d=json.load(open('$1/.leasefs/status'))['etcd']['requests']; print(d['range']*1000+d['txn'])"; }
raw() { # host cmd -> "da db"
  local a0=$(tot $W/a) b0=$(tot $W/b)
  (cd $W/$1 && eval "$2")
  local a1=$(tot $W/a) b1=$(tot $W/b)
  echo "$((a1-a0)) $((b1-b0))"
}
measure() { # name host cmd: requests per op beyond python's start-up
  read ba bb <<<"$(raw $2 'python3 -c pass')"
  read xa xb <<<"$(raw $2 "$3")"
  python3 -c "
da, db = $xa-$ba, $xb-$bb
print('%-16s a: %4.1f range %4.1f txn   b: %4.1f range %4.1f txn' % ('$1', (da//1000)/10, (da%1000)/10, (db//1000)/10, (db%1000)/10))"
}
touch $W/a/p; echo x > $W/a/r.json
measure "flock pair" a 'python3 -c "
import fcntl,os
fd=os.open(\"p\",os.O_RDWR)
for i in range(10): fcntl.flock(fd,fcntl.LOCK_EX); fcntl.flock(fd,fcntl.LOCK_UN)"'
measure "stat" a 'python3 -c "
import os
for i in range(10): os.stat(\"p\")"'
measure "create14" a 'python3 -c "
import os
for i in range(10):
    fd=os.open(\"l%d\"%i,os.O_WRONLY|os.O_CREAT|os.O_EXCL); os.write(fd,b\"{\\\"owner\\\":\\\"me\\\"}\"); os.close(fd)"'
measure "pwrite" a 'python3 -c "
import os
fd=os.open(\"p\",os.O_RDWR)
for i in range(10): os.pwrite(fd,b\"%d\"%i,0)"'
measure "renew on a" a 'python3 -c "
import os
for i in range(10):
    open(\"r.tmp\",\"w\").write(str(i)); os.rename(\"r.tmp\",\"r.json\")"'
measure "read on b" b 'python3 -c "
for i in range(10): open(\"r.json\").read()"'
echo "totals a: $(req $W/a)"; echo "totals b: $(req $W/b)"
