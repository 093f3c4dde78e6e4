#!/usr/bin/env bash
# Installs what Aquifer needs, builds it, and starts the embedded single-node default:
# data in ./aquifer-data (six 1 GiB file drives, 4+2 erasure coding), REST on 127.0.0.1:8080.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bash "$here/scripts/deps.sh"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/aquifer-target}"
cargo build --release --locked --manifest-path "$here/Cargo.toml" --bin aquifer
install -m 0755 "$CARGO_TARGET_DIR/release/aquifer" /usr/local/bin/aquifer
exec /usr/local/bin/aquifer serve "$@"
