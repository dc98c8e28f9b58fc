# Sourced by the benchmarks: mounts tmpfs, leasefs, leasefs --volatile, an
# optional older build (BASELINE=/path/to/leasefs) and the minimal fuser
# filesystem (scripts/minimalfs.rs) under $work, pinned with ${pin[@]}, and
# unmounts them all (by daemon, not by sleeping) when the script exits.
# Sets $cols to the columns mounted besides "minimal". PIN=1 pins the
# daemons (and, through ${pin[@]}, the clients) to CPU 0.
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)

bench_mount_all() {
    cargo build --release --workspace --quiet
    cargo build --release --quiet --example minimalfs
    mkdir -p "$work/tmpfs" "$work/leasefs" "$work/volatile" "$work/minimal"
    mount -t tmpfs tmpfs "$work/tmpfs"
    "${pin[@]}" ./target/release/leasefs mount "$work/leasefs" --state-dir "$work/state.leasefs"
    "${pin[@]}" ./target/release/leasefs mount "$work/volatile" --state-dir "$work/state.volatile" --volatile
    cols="tmpfs leasefs volatile"
    if [ -n "${BASELINE:-}" ]; then
        mkdir -p "$work/baseline"
        "${pin[@]}" "$BASELINE" mount "$work/baseline" --state-dir "$work/state.baseline"
        cols="$cols baseline"
    fi
    "${pin[@]}" ./target/release/examples/minimalfs "$work/minimal" &
    minimal_pid=$!
    trap bench_unmount_all EXIT
    for _ in $(seq 100); do mountpoint -q "$work/minimal" && break; sleep 0.05; done
    mountpoint -q "$work/minimal" || { echo "minimalfs did not mount" >&2; exit 1; }
}

# bench_each_run PROGRAM ARGS...: compile scripts/PROGRAM.c, then run it
# $repeats times on every column plus a directory on the root disk, each
# run in a fresh directory (the minimal filesystem has no mkdir), as
# "PROGRAM DIR ARGS..."; prints "COLUMN METRIC VALUE" lines and sets $cols
# to the columns run.
bench_each_run() {
    local prog=$1
    shift
    gcc -O2 -o "$work/$prog" "scripts/$prog.c"
    mkdir -p "$work/disk"
    cols="tmpfs disk ${cols#tmpfs } minimal"
    for r in $(seq "$repeats"); do
        for fs in $cols; do
            d="$work/$fs"
            [ "$fs" = minimal ] || { d="$work/$fs/run$r"; mkdir "$d"; }
            "${pin[@]}" "$work/$prog" "$d" "$@" | sed "s/^/$fs /"
        done
    done
}

bench_unmount_all() {
    for m in leasefs volatile baseline; do
        [ -d "$work/$m" ] || continue
        ./target/release/leasefs unmount "$work/$m" 2>/dev/null || umount -l "$work/$m" 2>/dev/null || true
    done
    umount "$work/minimal" 2>/dev/null || umount -l "$work/minimal" 2>/dev/null || true
    kill "$minimal_pid" 2>/dev/null || true
    wait "$minimal_pid" 2>/dev/null || true
    umount "$work/tmpfs" 2>/dev/null || true
    rm -rf "$work"
}
