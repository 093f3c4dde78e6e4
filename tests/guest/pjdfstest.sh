#!/usr/bin/env bash
# Runs pjdfstest through the Linux kernel NFSv3 client (--fs nfs, the default) or SMB 3.1.1
# client (--fs cifs) in a QEMU guest against a fresh Aquifer daemon (or, for comparison,
# nfs-ganesha's VFS backend or stock Samba's smbd on a temporary directory), and prints
# pass/fail counts and the names of the failing tests.
#
#   tests/guest/pjdfstest.sh [--fs nfs|cifs] [--server aquifer|ganesha|samba] [--log FILE] [PATTERN...]
#
# Needs tests/guest/setup.sh (for ganesha: apt nfs-ganesha nfs-ganesha-vfs rpcbind; for samba:
# apt samba) and a build of the workspace (the daemon is $AQUIFER_BIN, default
# /var/cache/aquifer-target/debug/aquifer). Results are recorded in docs/nfs-kernel-client.md
# and, for CIFS, docs/smb-conformance.md (scripts/pjdfstest-cifs.sh runs both CIFS servers).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
guest_dir=${AQUIFER_GUEST_DIR:-/var/cache/aquifer-guest}
bin=${AQUIFER_BIN:-/var/cache/aquifer-target/debug/aquifer}
server=aquifer
fs=nfs
log=""
while (($#)); do
    case "$1" in
        --fs) fs=$2; shift 2 ;;
        --server) server=$2; shift 2 ;;
        --log) log=$2; shift 2 ;;
        *) break ;;
    esac
done
patterns=$(IFS=,; echo "$*")

work=$(mktemp -d)
server_pid=""
pids=()
cleanup() {
    for p in $server_pid "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
[[ -n "$log" ]] || log="$work/guest.log"

"$here/build-initramfs.sh" "$guest_dir/pjdfstest-guest"

case "$server" in
aquifer)
    AQUIFER_ADMIN_PASSWORD=pjdfstest-admin AQUIFER_LOG=${AQUIFER_LOG:-warn} "$bin" serve --data-dir "$work/data" \
        --drive-size 1GiB --rest 127.0.0.1:0 --s3 127.0.0.1:0 --nfs 127.0.0.1:0 --sftp 127.0.0.1:0 \
        --smb 127.0.0.1:0 >"$work/daemon.out" 2>"$log.daemon" &
    server_pid=$!
    for _ in $(seq 600); do
        grep -q "^Aquifer is serving" "$work/daemon.out" 2>/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || { cat "$log.daemon" >&2; exit 1; }
        sleep 0.1
    done
    port=$(grep -o "$([[ $fs == cifs ]] && echo smb || echo nfs)://[^ ,]*" "$work/daemon.out" | sed 's/.*://')
    user=admin password=pjdfstest-admin
    export_path=/
    mountport=$port
    ;;
ganesha)
    [[ $fs == nfs ]] || { echo "ganesha serves --fs nfs only" >&2; exit 2; }
    free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
    # Ganesha serves NFS and MOUNT on separate ports.
    port=$(free_port) mountport=$(free_port)
    mkdir -p "$work/export" "$work/ganesha"
    cat >"$work/ganesha.conf" <<CONF
NFS_CORE_PARAM { NFS_Port = $port; MNT_Port = $mountport; NLM_Port = 0; Rquota_Port = 0;
    Enable_NLM = false; Enable_RQUOTA = false; Protocols = 3; Bind_addr = 127.0.0.1; }
NFSV4 { Graceless = true; }
EXPORT { Export_Id = 1; Path = $work/export; Pseudo = $work/export; Access_Type = RW;
    Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys;
    PrivilegedPort = false; CLIENT { Clients = 127.0.0.1; Access_Type = RW; }
    FSAL { Name = VFS; } }
CONF
    pgrep -x rpcbind >/dev/null || rpcbind
    ganesha.nfsd -F -f "$work/ganesha.conf" -L "$work/ganesha.log" -p "$work/ganesha.pid" &
    server_pid=$!
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$mountport") 2>/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || { cat "$work/ganesha.log" >&2; exit 1; }
        sleep 0.1
    done
    export_path=$work/export
    ;;
samba)
    [[ $fs == cifs ]] || { echo "samba serves --fs cifs only" >&2; exit 2; }
    # shellcheck source=../../scripts/smb-peer.sh
    . "$here/../../scripts/smb-peer.sh"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    user=root password=pjdfstest-samba
    start_samba "$work/samba" "$port" "$password"
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/samba/smbd.out" >&2; exit 1; }
        sleep 0.1
    done
    ;;
*) echo "unknown server $server" >&2; exit 2 ;;
esac

start=$(date +%s)
if [[ $fs == cifs ]]; then
    args="console=ttyS0 panic=-1 quiet aq.fs=cifs aq.port=$port aq.user=$user aq.pass=$password aq.mode=pjdfstest-run"
    [[ -n "${CIFS_OPTS:-}" ]] && args="$args aq.cifsopts=$CIFS_OPTS"
else
    args="console=ttyS0 panic=-1 quiet aq.port=$port aq.mountport=$mountport aq.export=$export_path aq.mode=pjdfstest-run"
fi
[[ -n "$patterns" ]] && args="$args aq.args=$patterns"
timeout 3600 qemu-system-x86_64 -accel tcg -m 1024 -smp 1 -nodefaults -no-reboot -display none \
    -monitor none -serial stdio -kernel "$guest_dir/pjdfstest-guest/vmlinuz" \
    -initrd "$guest_dir/pjdfstest-guest/initramfs.cpio.gz" -append "$args" \
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0 </dev/null | tr -d '\r' >"$log"
echo "guest ran $(($(date +%s) - start)) s; log in $log"

grep -q "^AQ-PJDFSTEST-END" "$log" || { tail -30 "$log"; echo "pjdfstest did not finish" >&2; exit 1; }
grep "^Summary" "$log"
echo "failed tests:"
grep -E ' FAILED$' "$log" | awk '{print "  " $1}'
