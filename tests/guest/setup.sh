#!/usr/bin/env bash
# Installs what the Linux-kernel NFS and SMB client guest needs (tests/nfs_kernel.rs,
# tests/smb_kernel.rs, tests/guest/pjdfstest.sh). Idempotent; needs root. Nothing lands in
# the repository: everything built goes under $AQUIFER_GUEST_DIR (default
# /var/cache/aquifer-guest).
#
#   qemu-system-x86        runs the guest with software emulation (TCG)
#   linux-image-cloud-amd64 Debian's kernel and its modules (nfs, nfsv3, sunrpc, cifs, virtio_net)
#   busybox-static         the guest's userland
#   libacl1-dev            pjdfstest links against libacl
#
# pjdfstest is built with `cargo install` into $AQUIFER_GUEST_DIR/pjdfstest, with its own
# target directory so the workspace's stays untouched.
set -euo pipefail

guest_dir=${AQUIFER_GUEST_DIR:-/var/cache/aquifer-guest}
want=(qemu-system-x86 linux-image-cloud-amd64 busybox-static libacl1-dev cpio)
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

if [[ "${1:-}" != "--no-pjdfstest" && ! -x "$guest_dir/pjdfstest/bin/pjdfstest" ]]; then
    echo "building pjdfstest into $guest_dir/pjdfstest"
    mkdir -p "$guest_dir"
    CARGO_TARGET_DIR="$guest_dir/target" cargo install --locked pjdfstest --root "$guest_dir/pjdfstest"
fi
