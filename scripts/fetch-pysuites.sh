#!/usr/bin/env bash
# Fetch the test suites of Python's filelock and portalocker, for
# tests/clients.rs: the pinned sdists, and the current releases on PyPI.
# Result: target/pysuites/{filelock,portalocker} (pinned) and
# target/pysuites/current/{filelock,portalocker}, with the versions in
# target/pysuites/current/versions; marked by target/pysuites/ready.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=target/pysuites
[ -e "$dest/ready" ] && exit 0
pip() { python3 -m pip -q --disable-pip-version-check "$@"; }
pip install pytest pytest-timeout pytest-mock pytest-asyncio pytest-rerunfailures virtualenv \
    hatchling hatch-vcs hatch-fancy-pypi-readme uv-build setuptools setuptools-scm wheel
# Newer filelock sdists name a hatch build hook that writes an SBOM into
# wheels (python-sbom); it has no release for this Python. Reading the
# sdist's metadata (all `pip download` needs) does not need it: a no-op hook
# of that name stands in.
stub=$(mktemp -d)
trap 'rm -rf "$stub"' EXIT
mkdir -p "$stub/leasefs_no_sbom"
cat > "$stub/pyproject.toml" <<'EOF'
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
[project]
name = "leasefs-no-sbom"
version = "0"
[project.entry-points.hatch]
python-sbom = "leasefs_no_sbom"
EOF
cat > "$stub/leasefs_no_sbom/__init__.py" <<'EOF'
from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.plugin import hookimpl


class NoSbom(BuildHookInterface):
    PLUGIN_NAME = "python-sbom"


@hookimpl
def hatch_register_build_hook():
    return NoSbom
EOF
pip install --no-build-isolation "$stub"

fetch() { # DIR SPEC...: unpack each sdist into DIR/NAME
    local dir=$1; shift
    mkdir -p "$dir/dl"
    pip download --no-deps --no-binary :all: --no-build-isolation -d "$dir/dl" "$@"
    for f in "$dir"/dl/*.tar.gz; do
        local base name
        base=$(basename "$f" .tar.gz)
        name=${base%-*}
        tar xzf "$f" -C "$dir" && mv "$dir/$base" "$dir/$name"
        echo "$name ${base##*-}" >> "$dir/versions"
    done
}
rm -rf "$dest" && mkdir -p "$dest"
fetch "$dest" filelock==3.16.1 portalocker==2.10.1
fetch "$dest/current" filelock portalocker
echo "current releases: $(tr '\n' ' ' < "$dest/current/versions")"
touch "$dest/ready"
