#!/usr/bin/env bash
# Build leasefs, mount a lease directory with the embedded defaults, use it
# from ordinary tools (flock, the shell) and leasefs's own commands, and
# unmount it. Needs root, Rust and util-linux, nothing else.
# LEASEFS_BIN=PATH runs an already built binary instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${LEASEFS_BIN:-}" ]; then
    bin=$LEASEFS_BIN
else
    cargo build --release --workspace --quiet
    bin=$PWD/target/release/leasefs
fi
mnt=$(mktemp -d /tmp/leases.XXXXXX)
"$bin" mount "$mnt" --state-dir "$mnt.state"
trap '"$bin" unmount "$mnt"; rmdir "$mnt"; rm -rf "$mnt.state"' EXIT
echo "mounted: $(grep " $mnt " /proc/mounts)"
cd "$mnt"
echo '{"holder": "demo"}' > db.lease
export bin mnt
flock -n db.lease -c '
    echo "holding db.lease, epoch $("$bin" epoch db.lease); a second flock -n says:"
    flock -n db.lease true || echo "  busy (exit $?)"
    "$bin" leases "$mnt"'
flock db.lease true
echo "after the next holder: epoch $("$bin" epoch db.lease)"
cd /
