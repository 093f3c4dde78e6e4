#!/usr/bin/env bash
# Installs the packages Aquifer builds and tests with. Idempotent; needs root.
set -euo pipefail

# Build: RocksDB needs libclang; benchmarks use fio and iperf3.
# Tests drive real clients: awscli, rclone and s3cmd (S3), libnfs-utils (NFSv3), OpenSSH sftp with
# sshpass (SFTP); python3 with boto3 and paramiko.
want=(build-essential pkg-config libclang-dev clang curl ca-certificates fio iperf3
      awscli rclone s3cmd libnfs-utils openssh-client sshpass python3)
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
py_missing=()
for m in boto3 paramiko; do
    python3 -c "import $m" 2>/dev/null || py_missing+=("$m")
done
if ((${#py_missing[@]})); then
    echo "installing python modules: ${py_missing[*]}"
    python3 -m pip install --quiet --disable-pip-version-check "${py_missing[@]}" \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "${py_missing[@]}"
fi
command -v cargo >/dev/null || { echo "cargo (Rust 1.95) is required" >&2; exit 1; }
