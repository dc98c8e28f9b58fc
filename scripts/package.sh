#!/usr/bin/env bash
# Build a Debian package of leasefs: the binary, the mount.fuse.leasefs
# helper (a symlink), the systemd unit template, the tmpfiles.d entry,
# man pages and bash/zsh/fish completions (generated from the CLI), and the
# examples. The package has no maintainer scripts: upgrading it never
# restarts a running daemon (a restart fences every holder).
#   scripts/package.sh [OUTDIR]          (default: target/debian)
#   LEASEFS_BIN=/path/to/leasefs scripts/package.sh   (package that binary
#                                        instead of building a release one)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/debian}
bin=${LEASEFS_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --locked -p leasefs-mountd
    bin=target/release/leasefs
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' mountd/Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d /tmp/leasefs-package.XXXXXX)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
install -D -m 0755 "$bin" "$root/usr/bin/leasefs"
mkdir -p "$root/usr/sbin"
ln -s ../bin/leasefs "$root/usr/sbin/mount.fuse.leasefs"
install -D -m 0644 dist/leasefs@.service "$root/usr/lib/systemd/system/leasefs@.service"
install -D -m 0644 dist/tmpfiles-leasefs.conf "$root/usr/lib/tmpfiles.d/leasefs.conf"
"$bin" generate-docs "$stage/docs"
mkdir -p "$root/usr/share/man/man1"
for m in "$stage"/docs/man/*.1; do gzip -9n < "$m" > "$root/usr/share/man/man1/$(basename "$m").gz"; done
install -d "$root/usr/share/man/man8"
gzip -9n < "$stage/docs/man/mount.fuse.leasefs.8" > "$root/usr/share/man/man8/mount.fuse.leasefs.8.gz"
install -D -m 0644 "$stage/docs/completions/leasefs.bash" "$root/usr/share/bash-completion/completions/leasefs"
install -D -m 0644 "$stage/docs/completions/_leasefs" "$root/usr/share/zsh/vendor-completions/_leasefs"
install -D -m 0644 "$stage/docs/completions/leasefs.fish" "$root/usr/share/fish/vendor_completions.d/leasefs.fish"
doc=$root/usr/share/doc/leasefs
install -D -m 0644 README.md "$doc/README.md"
install -m 0644 dist/fstab.example dist/client-dropin.conf dist/grafana-leasefs.json "$doc/"
install -D -m 0755 examples/cron-singleton.sh examples/fenced_sqlite.py examples/leader.py -t "$doc/examples"
install -m 0644 examples/leased-service.service "$doc/examples/"
mkdir -p "$root/DEBIAN"
cat > "$root/DEBIAN/control" <<CONTROL
Package: leasefs
Version: $version
Architecture: $arch
Maintainer: leasefs developers <leasefs@localhost>
Depends: libc6
Section: admin
Priority: optional
Description: FUSE filesystem that turns a directory into a fenced lock service
 Unmodified programs (flock, fcntl, Python filelock, pidfiles, SQLite,
 leases renewed by rename) get fenced locking: every new holder gets a
 higher epoch, a lease keeps its identity across unlink and rename-over,
 and a holder that lost its lease cannot write through it.
CONTROL
mkdir -p "$out"
deb="$out/leasefs_${version}_${arch}.deb"
# gzip (xz takes minutes on 2 cores); a given binary (the tests' debug
# build, 70 MB) at the fastest level, which takes seconds instead of ~45 s.
level=9
[ -n "${LEASEFS_BIN:-}" ] && level=1
dpkg-deb --root-owner-group -Zgzip -z"$level" --build "$root" "$deb" >/dev/null
echo "$deb"
