#!/usr/bin/env bash
# Fetch the test suites of Python's filelock and portalocker (pinned sdists
# from PyPI) and their test dependencies, for tests/clients.rs.
# Result: target/pysuites/{filelock,portalocker}, marked by target/pysuites/ready.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=target/pysuites
[ -e "$dest/ready" ] && exit 0
python3 -m pip install -q --disable-pip-version-check \
    pytest pytest-timeout pytest-mock pytest-asyncio virtualenv \
    hatchling hatch-vcs setuptools setuptools-scm wheel
rm -rf "$dest" && mkdir -p "$dest/dl"
python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: --no-build-isolation \
    -d "$dest/dl" filelock==3.16.1 portalocker==2.10.1
tar xzf "$dest/dl/filelock-3.16.1.tar.gz" -C "$dest" && mv "$dest/filelock-3.16.1" "$dest/filelock"
tar xzf "$dest/dl/portalocker-2.10.1.tar.gz" -C "$dest" && mv "$dest/portalocker-2.10.1" "$dest/portalocker"
touch "$dest/ready"
