#!/usr/bin/env bash
# Installs the Debian packages Aquifer builds and tests with. Idempotent; needs root.
set -euo pipefail

want=(build-essential pkg-config libclang-dev clang curl ca-certificates fio iperf3)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v cargo >/dev/null || { echo "cargo (Rust 1.95) is required" >&2; exit 1; }
