#!/usr/bin/env bash
# The transport's floor, pinned: leasefs on /dev/fuse ("dev") and on
# FUSE-over-io_uring ("uring") beside libfuse's passthrough_hp example
# (a tmpfs directory passed through, --nocache) single-threaded on
# /dev/fuse ("lf-single"), multi-threaded on /dev/fuse ("lf-multi") and on
# io_uring ("lf-uring"), and the minimal fuser filesystem
# (scripts/minimalfs.rs, zero TTL). Every daemon and client on CPU 0
# (io_uring queue threads bind themselves to their CPUs); alternating
# rounds, medians, µs per operation. passthrough_hp leaves POSIX record
# locks to the kernel (its fcntl pair never reaches it), so the script
# measures the flock pair and stat.
#   LIBFUSE=/path/to/libfuse/build scripts/libfusebench.sh [ROUNDS] [N]
#   (defaults: 5, 20000). LIBFUSE is a meson build directory of libfuse
#   3.18 or later configured with -Dexamples=true -Denable-io-uring=true.
# Needs root, gcc and a kernel with FUSE-over-io_uring.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
n=${2:-20000}
ph=${LIBFUSE:?set LIBFUSE to a libfuse build directory}/example/passthrough_hp
[ -x "$ph" ] || { echo "no $ph" >&2; exit 1; }
param=/sys/module/fuse/parameters/enable_uring
[ -w "$param" ] || { echo "this kernel has no FUSE-over-io_uring ($param)" >&2; exit 1; }
cargo build --release --workspace --quiet
cargo build --release --quiet --example minimalfs
work=$(mktemp -d /tmp/leasefs-libfusebench.XXXXXX)
gcc -O2 -o "$work/lockbench" scripts/lockbench.c
was=$(cat "$param")
minimal_pid=
cleanup() {
    for m in dev uring; do
        mountpoint -q "$work/$m" && { ./target/release/leasefs unmount "$work/$m" || umount -l "$work/$m"; }
    done
    for m in minimal lf-single lf-multi lf-uring; do
        mountpoint -q "$work/$m" && { umount "$work/$m" || umount -l "$work/$m"; }
    done
    [ -n "$minimal_pid" ] && wait "$minimal_pid" 2>/dev/null
    echo "$was" > "$param"
    # The passthrough daemons close their source directories as they exit.
    for _ in $(seq 100); do
        mountpoint -q "$work/src" || break
        umount "$work/src" 2>/dev/null || sleep 0.05
    done
    mountpoint -q "$work/src" || rm -rf "$work"
}
trap 'set +e; cleanup' EXIT
echo Y > "$param"
pin=(taskset -c 0)
mkdir -p "$work/src" "$work/minimal" "$work/dev" "$work/uring"
mount -t tmpfs tmpfs "$work/src"
"${pin[@]}" ./target/release/examples/minimalfs "$work/minimal" 0 &
minimal_pid=$!
"${pin[@]}" ./target/release/leasefs mount "$work/dev" --volatile --state-dir "$work/state.dev" --transport dev
"${pin[@]}" ./target/release/leasefs mount "$work/uring" --volatile --state-dir "$work/state.uring" --transport uring
# passthrough_hp daemonizes once mounted.
declare -A lf=([lf-single]="--single" [lf-multi]="" [lf-uring]="-o io_uring")
for m in lf-single lf-multi lf-uring; do
    mkdir -p "$work/src/$m" "$work/$m"
    # shellcheck disable=SC2086
    "${pin[@]}" "$ph" --nocache ${lf[$m]} "$work/src/$m" "$work/$m"
done
cols="minimal dev uring lf-single lf-multi lf-uring"
for m in $cols; do
    for _ in $(seq 100); do mountpoint -q "$work/$m" && break; sleep 0.05; done
    mountpoint -q "$work/$m" || { echo "$m did not mount" >&2; exit 1; }
done
for r in $(seq "$rounds"); do
    for m in $cols; do
        d="$work/$m"
        [ "$m" = minimal ] || { d="$work/$m/run$r"; mkdir "$d"; }
        for metric in flock_pair_ns stat_ns; do
            echo "$m $metric $("${pin[@]}" "$work/lockbench" "$d" "$n" 0 "$metric" | awk '{print $NF}')"
        done
    done
done > "$work/results"
python3 - "$work/results" "$rounds" "$n" $cols <<'PY'
import statistics, sys
data = {}
for m, metric, v in (l.split() for l in open(sys.argv[1])):
    data.setdefault(metric, {}).setdefault(m, []).append(float(v) / 1000)
cols = sys.argv[4:]
print(f"# pinned to CPU 0; medians of {sys.argv[2]} alternating rounds of {sys.argv[3]}; µs per operation (ratio to minimal)")
print(f"{'metric':<14}" + "".join(f"{c:>18}" for c in cols))
for metric, by in data.items():
    base = statistics.median(by["minimal"])
    print(f"{metric:<14}" + "".join(f"{statistics.median(by[c]):>10.2f} ({statistics.median(by[c]) / base:.2f})" for c in cols))
PY
