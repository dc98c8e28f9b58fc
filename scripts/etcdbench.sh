#!/usr/bin/env bash
# Cross-host arbitration cost on a real 3-member etcd cluster on loopback
# (started and stopped here): the arbiter's uncontended acquire+release
# against a bare etcd transaction cycle through the same client, and two
# hosts contending for one lease. Medians over repeated runs.
#   scripts/etcdbench.sh [REPEATS] [N] [SECONDS]   (defaults: 5, 500, 3)
# Needs etcd (apt-get install etcd-server).
set -euo pipefail
cd "$(dirname "$0")/.."
repeats=${1:-5}
n=${2:-500}
secs=${3:-3}
work=$(mktemp -d /tmp/leasefs-etcdbench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
cargo build --release --quiet --example etcdbench
base=$((23000 + RANDOM % 20000))
cluster=""
for i in 0 1 2; do cluster+="m$i=http://127.0.0.1:$((base + 2 * i + 1)),"; done
cluster=${cluster%,}
endpoints=""
for i in 0 1 2; do
    c=http://127.0.0.1:$((base + 2 * i)); p=http://127.0.0.1:$((base + 2 * i + 1))
    etcd --name "m$i" --data-dir "$work/m$i" --listen-client-urls "$c" --advertise-client-urls "$c" \
        --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" --initial-cluster "$cluster" \
        --initial-cluster-state new --initial-cluster-token "bench-$base" 2>"$work/m$i.log" &
    pids+=($!)
    endpoints+="$c,"
done
endpoints=${endpoints%,}
for _ in $(seq 200); do
    curl -sf -X POST "${endpoints%%,*}/v3/kv/range" -d '{"key":"eA=="}' >/dev/null 2>&1 && break
    sleep 0.1
done
for r in $(seq "$repeats"); do
    ./target/release/examples/etcdbench "$endpoints" "$n" "$secs"
done > "$work/results"
python3 - "$work/results" "$repeats" "$n" <<'PY'
import statistics, sys
data = {}
for metric, v in (l.split() for l in open(sys.argv[1])):
    data.setdefault(metric, []).append(float(v))
print(f"# medians of {sys.argv[2]} runs; {sys.argv[3]} cycles per latency metric; 3-member etcd on loopback")
for metric, vs in data.items():
    print(f"{metric:<20}{statistics.median(vs):>10.0f}")
m = {k: statistics.median(v) for k, v in data.items()}
print(f"arbiter/raw         {m['arbiter_cycle_us'] / m['raw_txn_cycle_us']:>9.2f}x")
PY
