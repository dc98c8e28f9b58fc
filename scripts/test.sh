#!/usr/bin/env bash
# Run every test: unit tests of the core, and integration tests that mount
# real leasefs filesystems (root needed) and drive them from other processes,
# including the differential test against tmpfs and pjdfstest.
#
# Where the fuse module allows FUSE-over-io_uring
# (/sys/module/fuse/parameters/enable_uring is Y), the whole suite runs on
# io_uring, then the lock, interrupt, event, limit, fencing, durability,
# transport and fault-rule tests run again on /dev/fuse. Elsewhere everything runs on
# /dev/fuse, and the script says io_uring went untested.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --locked
if [ "$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null)" = Y ]; then
    LEASEFS_TRANSPORT=uring cargo test --workspace --locked "$@"
    if [ $# -eq 0 ]; then
        echo "== the same kernel, through /dev/fuse: locks, events, limits, fencing, durability, transport, faults, power, and names a shared mount's kernel keeps"
        LEASEFS_TRANSPORT=dev cargo test --locked --test tests -- locks:: events:: limits:: fencing:: durability:: transport:: faults:: power:: hosts::names_the_kernel_keeps
    fi
else
    echo "scripts/test.sh: FUSE-over-io_uring is off on this kernel (enable_uring): every test runs on /dev/fuse" >&2
    LEASEFS_TRANSPORT=dev cargo test --workspace --locked "$@"
fi
