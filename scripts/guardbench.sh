#!/usr/bin/env bash
# Mounting for tests: mount-to-ready and unmount of a --volatile mount
# (leasefs mount/unmount and the Rust guard, medians of REPEATS), and N
# tests in a row each with its own mount through the guard.
#   scripts/guardbench.sh [REPEATS] [N]      (defaults: 15, 100)
#   PIN=1 scripts/guardbench.sh              (everything on CPU 0)
# Needs root (or fusermount3 for a user).
set -euo pipefail
cd "$(dirname "$0")/.."
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)
cargo build --release --workspace --quiet
cargo build --release --quiet --example guardbench
"${pin[@]}" ./target/release/examples/guardbench "$PWD/target/release/leasefs" "${1:-15}" "${2:-100}"
