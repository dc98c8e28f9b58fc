#!/usr/bin/env bash
# Build leasefs, mount a lease directory with the embedded defaults, use it
# from ordinary tools (flock, getfattr), and unmount it. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --quiet
bin=$PWD/target/release/leasefs
mnt=$(mktemp -d /tmp/leases.XXXXXX)
$bin mount "$mnt" --state-dir "$mnt.state"
trap '$bin unmount "$mnt"; rmdir "$mnt"; rm -rf "$mnt.state"' EXIT
echo "mounted: $(grep " $mnt " /proc/mounts)"
cd "$mnt"
echo '{"holder": "demo"}' > db.lease
flock -n db.lease -c 'echo "holding db.lease, epoch $(getfattr --only-values -n user.leasefs.epoch db.lease); a second flock -n says:"; flock -n db.lease true || echo "  busy (exit $?)"'
flock db.lease true
echo "after the next holder: epoch $(getfattr --only-values -n user.leasefs.epoch db.lease)"
cd /
