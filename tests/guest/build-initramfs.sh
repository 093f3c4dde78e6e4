#!/usr/bin/env bash
# Assembles the guest that runs the Linux kernel NFS and CIFS clients: OUT/vmlinuz and
# OUT/initramfs.cpio.gz, from Debian's cloud kernel, busybox-static and (when built and
# not refused with --no-pjdfstest) pjdfstest. Takes a few seconds; tests/guest/setup.sh
# installs the inputs.
#
#   tests/guest/build-initramfs.sh OUT [--no-pjdfstest]
#
# The guest's /init (tests/guest/init) reads its parameters from the kernel command line
# and runs tests/guest/<mode>.sh; see docs/nfs-kernel-client.md.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
guest_dir=${AQUIFER_GUEST_DIR:-/var/cache/aquifer-guest}
out=${1:?usage: build-initramfs.sh OUT [--no-pjdfstest]}
with_pjdfstest=1
[[ "${2:-}" == "--no-pjdfstest" ]] && with_pjdfstest=0

need() { echo "build-initramfs: $1 missing; run tests/guest/setup.sh" >&2; exit 2; }
command -v qemu-system-x86_64 >/dev/null || need qemu-system-x86_64
[[ -x /bin/busybox ]] || need busybox-static
command -v cpio >/dev/null || need cpio

# The newest installed kernel that has the NFSv3 and SMB clients as modules and a vmlinuz to
# boot (Debian's cloud kernel has both; cifs.ko lives in fs/smb/client from 6.1 on, fs/cifs
# before).
kver=""
for d in $(ls -d /lib/modules/*/ 2>/dev/null | sort -V); do
    v=$(basename "$d")
    if [[ -e /boot/vmlinuz-$v ]] && ls "$d"kernel/fs/nfs/nfsv3.ko* >/dev/null 2>&1 \
        && { ls "$d"kernel/fs/smb/client/cifs.ko* || ls "$d"kernel/fs/cifs/cifs.ko*; } >/dev/null 2>&1; then kver=$v; fi
done
[[ -n "$kver" ]] || need "a kernel with nfsv3.ko and cifs.ko (linux-image-cloud-amd64)"

mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# mktemp makes the directory 0700; as the guest's / it would shut every other user out.
chmod 0755 "$stage"
mkdir -p "$stage"/{bin,sbin,dev,proc,sys,mnt,tmp,etc,lib/modules,guest,root}
cp /bin/busybox "$stage/bin/busybox"
for applet in $("$stage/bin/busybox" --list); do
    [[ "$applet" == busybox ]] || ln -sf busybox "$stage/bin/$applet"
done

# Modules in dependency order, decompressed (busybox insmod takes plain .ko files). The guest
# has no modprobe for the kernel to call, so the ciphers cifs.ko asks for at run time (its
# softdeps: SMB 3.1.1 signing and encryption) are loaded up front; built-in ones list nothing.
: >"$stage/etc/modules.order"
seen=" "
for m in virtio_pci virtio_net nfsv3 ecb cmac ctr ccm ghash_generic gcm sha512_generic cifs; do
    while read -r verb path _; do
        [[ "$verb" == insmod ]] || continue
        base=$(basename "$path"); base=${base%.xz}; base=${base%.zst}; base=${base%.gz}
        [[ "$seen" == *" $base "* ]] && continue
        seen="$seen$base "
        case "$path" in
            *.xz) xz -dc "$path" >"$stage/lib/modules/$base" ;;
            *.zst) zstd -qdc "$path" >"$stage/lib/modules/$base" ;;
            *.gz) gzip -dc "$path" >"$stage/lib/modules/$base" ;;
            *) cp "$path" "$stage/lib/modules/$base" ;;
        esac
        echo "$base" >>"$stage/etc/modules.order"
    done < <(modprobe -S "$kver" --show-depends "$m")
done

# Users and groups for pjdfstest's user switching (nobody/nogroup and tests/tests).
cat >"$stage/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
tests:x:1000:1000:pjdfstest:/:/bin/false
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
P
cat >"$stage/etc/group" <<'G'
root:x:0:
tests:x:1000:
nogroup:x:65534:
G
printf 'passwd: files\ngroup: files\n' >"$stage/etc/nsswitch.conf"

install -m 0755 "$here/init" "$stage/init"
for f in "$here"/*.sh; do
    case "$(basename "$f")" in setup.sh|build-initramfs.sh|pjdfstest.sh) continue ;; esac
    install -m 0755 "$f" "$stage/guest/"
done
install -m 0644 "$here/pjdfstest.toml" "$stage/guest/pjdfstest.toml"

if ((with_pjdfstest)); then
    pjd="$guest_dir/pjdfstest/bin/pjdfstest"
    [[ -x "$pjd" ]] || need "$pjd"
    install -m 0755 "$pjd" "$stage/bin/pjdfstest"
    # The etxtbsy cases copy `which sleep` under another name and run the copy while they
    # open it for writing. A copy of busybox does not know its new name and exits at once,
    # which races the check; the host's sleep (coreutils) sleeps.
    sleep_bin=$(command -v sleep)
    rm -f "$stage/bin/sleep"
    install -m 0755 "$sleep_bin" "$stage/bin/sleep"
    # Their shared libraries at the paths the dynamic loader looks for them.
    for lib in $( (ldd "$pjd"; ldd "$sleep_bin") | grep -o '/[^ ]*' | sort -u); do
        mkdir -p "$stage$(dirname "$lib")"
        cp -L "$lib" "$stage$lib"
    done
fi

cp "/boot/vmlinuz-$kver" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"
(cd "$stage" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$out/initramfs.cpio.gz.tmp"
mv "$out/initramfs.cpio.gz.tmp" "$out/initramfs.cpio.gz"
echo "guest: kernel $kver, $(du -h "$out/initramfs.cpio.gz" | cut -f1) initramfs in $out"
