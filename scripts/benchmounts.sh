# Sourced by the benchmarks: mounts tmpfs, leasefs, leasefs --volatile, an
# optional older build (BASELINE=/path/to/leasefs) and the minimal fuser
# filesystem (scripts/minimalfs.rs) twice, with a zero entry/attribute TTL
# ("minimal") and with a 1 s TTL ("minimal1s"), under $work, pinned with
# ${pin[@]}, and unmounts them all (by daemon, not by sleeping) when the
# script exits. Sets $cols to the columns mounted besides the minimal ones.
# BENCH=1 adds leasefs with --bench, volatile and durable (vbench, dbench).
# PIN=1 pins the daemons (and, through ${pin[@]}, the clients) to CPU 0.
pin=()
[ "${PIN:-0}" = 1 ] && pin=(taskset -c 0)

bench_mount_all() {
    cargo build --release --workspace --quiet
    cargo build --release --quiet --example minimalfs
    mkdir -p "$work/tmpfs" "$work/leasefs" "$work/volatile" "$work/minimal" "$work/minimal1s"
    mount -t tmpfs tmpfs "$work/tmpfs"
    "${pin[@]}" ./target/release/leasefs mount "$work/leasefs" --state-dir "$work/state.leasefs"
    "${pin[@]}" ./target/release/leasefs mount "$work/volatile" --state-dir "$work/state.volatile" --volatile
    cols="tmpfs leasefs volatile"
    # URING=1: leasefs served through FUSE-over-io_uring as a column of its
    # own ("uring"; the fuse module's enable_uring is set for the run and
    # restored after).
    if [ "${URING:-0}" = 1 ]; then
        uring_param=/sys/module/fuse/parameters/enable_uring
        uring_was=$(cat "$uring_param")
        echo Y > "$uring_param"
        mkdir -p "$work/uring"
        "${pin[@]}" ./target/release/leasefs mount "$work/uring" --state-dir "$work/state.uring" --transport uring
        cols="$cols uring"
    fi
    # RULES=N: leasefs with N test-bench fault rules that match nothing
    # (each names every operation and a path no request has), as column
    # "rules": what rules that do not fire cost every request.
    if [ -n "${RULES:-}" ]; then
        mkdir -p "$work/rules"
        "${pin[@]}" ./target/release/leasefs mount "$work/rules" --state-dir "$work/state.rules"
        for i in $(seq "$RULES"); do
            ./target/release/leasefs fault add "$work/rules" --path "no-such-dir-$i/**" --errno EIO >/dev/null
        done
        cols="$cols rules"
    fi
    # BENCH=1: leasefs --volatile --bench ("vbench") and durable with
    # --bench ("dbench"): what tracking for a power cut costs (SPEC 13).
    if [ "${BENCH:-0}" = 1 ]; then
        mkdir -p "$work/vbench" "$work/dbench"
        "${pin[@]}" ./target/release/leasefs mount "$work/vbench" --state-dir "$work/state.vbench" --volatile --bench
        "${pin[@]}" ./target/release/leasefs mount "$work/dbench" --state-dir "$work/state.dbench" --bench
        cols="$cols vbench dbench"
    fi
    if [ -n "${BASELINE:-}" ]; then
        mkdir -p "$work/baseline"
        "${pin[@]}" "$BASELINE" mount "$work/baseline" --state-dir "$work/state.baseline"
        cols="$cols baseline"
    fi
    "${pin[@]}" ./target/release/examples/minimalfs "$work/minimal" 0 &
    minimal_pid=$!
    "${pin[@]}" ./target/release/examples/minimalfs "$work/minimal1s" 1 &
    minimal1s_pid=$!
    trap bench_unmount_all EXIT
    for m in minimal minimal1s; do
        for _ in $(seq 100); do mountpoint -q "$work/$m" && break; sleep 0.05; done
        mountpoint -q "$work/$m" || { echo "minimalfs did not mount on $m" >&2; exit 1; }
    done
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
    cols="tmpfs disk ${cols#tmpfs } minimal minimal1s"
    for r in $(seq "$repeats"); do
        for fs in $cols; do
            d="$work/$fs"
            case $fs in minimal*) ;; *) d="$work/$fs/run$r"; mkdir "$d" ;; esac
            "${pin[@]}" "$work/$prog" "$d" "$@" | sed "s/^/$fs /"
        done
    done
}

bench_unmount_all() {
    for m in leasefs volatile baseline uring rules vbench dbench; do
        [ -d "$work/$m" ] || continue
        ./target/release/leasefs unmount "$work/$m" 2>/dev/null || umount -l "$work/$m" 2>/dev/null || true
    done
    for m in minimal minimal1s; do
        umount "$work/$m" 2>/dev/null || umount -l "$work/$m" 2>/dev/null || true
    done
    kill "$minimal_pid" "$minimal1s_pid" 2>/dev/null || true
    wait "$minimal_pid" "$minimal1s_pid" 2>/dev/null || true
    umount "$work/tmpfs" 2>/dev/null || true
    [ -n "${uring_was:-}" ] && echo "$uring_was" > "$uring_param"
    rm -rf "$work"
}
