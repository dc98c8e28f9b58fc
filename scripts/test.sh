#!/usr/bin/env bash
# Run every test: unit tests of the core, and integration tests that mount
# real leasefs filesystems (root needed) and drive them from other processes,
# including the differential test against tmpfs and pjdfstest.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --locked
cargo test --workspace --locked "$@"
