#!/usr/bin/env bash
# Installs the packages Aquifer builds and tests with. Idempotent; needs root.
set -euo pipefail

# Build: RocksDB needs libclang; benchmarks use fio and iperf3.
# Tests drive real clients: awscli, rclone and s3cmd (S3), libnfs-utils (NFSv3), OpenSSH sftp with
# sshpass (SFTP), smbclient (SMB); samba's smbd and smbtorture (samba-testsuite) for the SMB
# conformance and benchmark scripts; python3 with boto3, paramiko, minio and
# s3torchconnectorclient; Chromium driven by playwright-core (node) as a web page's S3 client.
want=(build-essential pkg-config libclang-dev clang curl ca-certificates fio iperf3
      awscli rclone s3cmd libnfs-utils openssh-client sshpass python3
      smbclient samba samba-testsuite chromium nodejs)
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
# The S3 client under PyTorch's S3 connector (Mountpoint's client on the AWS CRT), without
# torch itself (protocols/s3/tests/clients/s3torch_suite.py).
s3torch_version=1.5.0
if ! python3 -c "import s3torchconnectorclient, sys; sys.exit(s3torchconnectorclient.__version__ != '$s3torch_version')" 2>/dev/null; then
    echo "installing python module: s3torchconnectorclient==$s3torch_version"
    python3 -m pip install --quiet --disable-pip-version-check "s3torchconnectorclient==$s3torch_version" \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "s3torchconnectorclient==$s3torch_version"
fi
# MinIO's Python SDK and its functional tests, which ship only in the sdist
# (protocols/s3/tests/clients.rs runs them from here). The SDK and the tests are one version.
minio_version=7.2.20
minio_dir=/var/cache/aquifer-minio
if ! python3 -c "import minio, sys; sys.exit(minio.__version__ != '$minio_version')" 2>/dev/null; then
    echo "installing python module: minio==$minio_version"
    python3 -m pip install --quiet --disable-pip-version-check "minio==$minio_version" \
        || python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "minio==$minio_version"
fi
if [[ ! -f "$minio_dir/minio-$minio_version/tests/functional/tests.py" ]]; then
    echo "fetching the minio $minio_version sdist (functional tests)"
    mkdir -p "$minio_dir"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$minio_dir" "minio==$minio_version"
    tar -xzf "$minio_dir/minio-$minio_version.tar.gz" -C "$minio_dir"
fi
# playwright-core only (it downloads no browser): it drives the Chromium installed above
# (protocols/s3/tests/clients/browser_cors.mjs).
playwright_version=1.65.2
node_dir=/var/cache/aquifer-node
if ! grep -qs "\"version\": \"$playwright_version\"" "$node_dir/node_modules/playwright-core/package.json"; then
    echo "installing playwright-core@$playwright_version into $node_dir"
    mkdir -p "$node_dir"
    (cd "$node_dir" && npm install --silent --no-audit --no-fund "playwright-core@$playwright_version")
fi
command -v cargo >/dev/null || { echo "cargo (Rust 1.95) is required" >&2; exit 1; }
