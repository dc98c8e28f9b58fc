#!/usr/bin/env bash
# Build leasefs, mount a lease directory with the embedded defaults, use it
# from ordinary tools, and unmount it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace --quiet
bin=./target/release/leasefs
mnt=$(mktemp -d /tmp/leases.XXXXXX)
$bin mount "$mnt" --state-dir "$mnt.state"
trap '$bin unmount "$mnt"; rmdir "$mnt"; rm -rf "$mnt.state"' EXIT
echo "mounted: $(grep " $mnt " /proc/mounts)"
cd "$mnt"
echo '{"holder": "demo"}' > db.lease
flock -n db.lease -c 'echo "holding db.lease; a second flock -n says:"; flock -n db.lease true || echo "  busy (exit $?)"'
mkdir -p jobs && ln db.lease jobs/link && stat -c '%n: inode %i, %h links' db.lease jobs/link
cd /
