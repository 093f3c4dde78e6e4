#!/usr/bin/env bash
# Measures Aquifer's NFSv3 and SFTP throughput against peer servers on this machine, in one run,
# and prints a markdown table:
#   NFSv3: Aquifer vs nfs-ganesha (VFS FSAL) exporting a directory on the same disk, both driven
#          by the libnfs userspace client (nfs-cp for 1 GiB sequential write/read; a small libnfs
#          C loop, compiled here, for 4 KiB file creates over one mount; an nfs-cp-per-file loop;
#          a libnfs reader, compiled here, that keeps BENCH_READ_DEPTH 1 MiB READs in flight as
#          a kernel client's read-ahead does, where nfs-cp waits for each READ and copies it).
#   SFTP:  Aquifer vs OpenSSH sshd (internal-sftp), both driven by OpenSSH `sftp -b` with the same
#          cipher (password via sshpass for Aquifer, a generated key for sshd).
# All servers run for the whole measurement, and each operation is measured in rounds: in every
# round Aquifer and its peer run the operation one after the other (the order alternating between
# rounds), so each round's ratio compares two measurements taken moments apart on this shared,
# noisy machine. The table gives the medians of the rounds' values and of their ratios, with the
# ratios' range. A second table gives each client-paced or disk-paced row's ceiling: the ratio
# to the peer that no server could pass in the same run (for the write rows, that Aquifer
# cannot: two thirds of the disk's O_DIRECT write by fio, as it writes 4+2 parity too, and
# beside it what share of the disk writing Aquifer's own pattern in the same round Aquifer
# reached; for the read with READs in flight, the disk's O_DIRECT read by fio, the best of
# three request shapes; for the rows one nfs-cp process paces, the peer's time less the time
# from each call to its reply's first byte, and in brackets less all the time a call was
# outstanding, from a packet capture read by scripts/rpc-busy.py).
#
#   scripts/bench-nfs-sftp.sh
#
# Environment: AQUIFER_BIN (default /var/cache/aquifer-target/debug/aquifer), BENCH_SIZE_MIB
# (1024), BENCH_FILES (2000, libnfs create loop), BENCH_CP_FILES (300, nfs-cp-per-file loop),
# BENCH_REPS (3 rounds; medians are reported), BENCH_READ_DEPTH (8), BENCH_CIPHER (aes256-gcm@openssh.com), BENCH_DRIVE_SIZE
# (2GiB, each of Aquifer's six file drives).
# Needs (apt): libnfs-utils libnfs-dev gcc nfs-ganesha nfs-ganesha-vfs rpcbind openssh-server
# openssh-client sshpass; for the ceilings, fio and tcpdump (left out when missing). Runs as
# root (drops the page cache before every timed operation when /proc/sys/vm/drop_caches is
# writable). All data lives under a temporary directory in /var/tmp, removed at the end; every
# server started here is stopped by its pid.
set -euo pipefail

bin=${AQUIFER_BIN:-/var/cache/aquifer-target/debug/aquifer}
size_mib=${BENCH_SIZE_MIB:-1024}
nfiles=${BENCH_FILES:-2000}
cpfiles=${BENCH_CP_FILES:-300}
reps=${BENCH_REPS:-3}
cipher=${BENCH_CIPHER:-aes256-gcm@openssh.com}
depth=${BENCH_READ_DEPTH:-8}
admin_pw=bench-admin-pw

for t in nfs-cp gcc ganesha.nfsd rpcbind sftp sshpass ssh-keygen python3; do
    command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 2; }
done
[[ -x /usr/sbin/sshd ]] || { echo "missing /usr/sbin/sshd (apt openssh-server)" >&2; exit 2; }
[[ -f /usr/include/nfsc/libnfs.h ]] || { echo "missing libnfs-dev" >&2; exit 2; }
[[ -x "$bin" ]] || { echo "missing $bin" >&2; exit 2; }

work=$(mktemp -d /var/tmp/aquifer-bench.XXXXXX)
pids=()
rpcbind_pid=""
cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
    done
    for p in "${pids[@]}"; do
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    if [[ -n "$rpcbind_pid" ]]; then kill "$rpcbind_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
log() { echo "[$(date +%T) load $(cut -d' ' -f1 /proc/loadavg)] $*" >&2; }
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
t_start=$EPOCHREALTIME

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { # PORT PID LOG
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || { cat "$3" >&2; return 1; }
        sleep 0.1
    done
    echo "port $1 never opened" >&2; return 1
}
can_drop=0
[[ -w /proc/sys/vm/drop_caches ]] && can_drop=1
drop_caches() { sync; if ((can_drop)); then echo 3 >/proc/sys/vm/drop_caches; fi; }
# Before a write: clean cold cache, then the source file back in the page cache, so the
# client reads it from memory for both servers.
before_write() { drop_caches; cat "$work/src.bin" >/dev/null; }
before_read() { drop_caches; }
# timeit CMD... -> prints elapsed seconds; the command's output goes to $work/cmd.log
timeit() {
    local t0=$EPOCHREALTIME
    "$@" >>"$work/cmd.log" 2>&1 || { echo "FAILED: $*" >&2; tail -20 "$work/cmd.log" >&2; return 1; }
    python3 -c "print(f'{$EPOCHREALTIME - $t0:.3f}')"
}

# --- client helpers ---------------------------------------------------------------------
log "work dir $work; page-cache drop: $can_drop"
cat >"$work/nfsbench.c" <<'C'
/* nfsbench URL create DIR N   : mkdir DIR, then N x (create DIR/fI, write 4 KiB, close) over
 *                                one mount; prints the seconds the loop took (mkdir excluded)
 * nfsbench URL mkdir DIR | rm PATH */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <nfsc/libnfs.h>
int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage\n"); return 2; }
    struct nfs_context *nfs = nfs_init_context();
    struct nfs_url *url = nfs_parse_url_dir(nfs, argv[1]);
    if (!url) { fprintf(stderr, "url: %s\n", nfs_get_error(nfs)); return 1; }
    if (nfs_mount(nfs, url->server, url->path)) { fprintf(stderr, "mount: %s\n", nfs_get_error(nfs)); return 1; }
    int rc = 0;
    if (!strcmp(argv[2], "rm")) {
        rc = nfs_unlink(nfs, argv[3]);
        if (rc) fprintf(stderr, "unlink %s: %s\n", argv[3], nfs_get_error(nfs));
    } else if (!strcmp(argv[2], "mkdir")) {
        rc = nfs_mkdir(nfs, argv[3]);
        if (rc) fprintf(stderr, "mkdir %s: %s\n", argv[3], nfs_get_error(nfs));
    } else if (!strcmp(argv[2], "create") && argc == 5) {
        int n = atoi(argv[4]);
        char buf[4096], path[4096];
        for (int i = 0; i < 4096; i++) buf[i] = (char)(i * 7 + 3);
        if (nfs_mkdir(nfs, argv[3])) { fprintf(stderr, "mkdir: %s\n", nfs_get_error(nfs)); return 1; }
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < n; i++) {
            struct nfsfh *fh;
            snprintf(path, sizeof path, "%s/f%05d", argv[3], i);
            if (nfs_create(nfs, path, O_WRONLY | O_CREAT | O_EXCL, 0644, &fh)) {
                fprintf(stderr, "create %s: %s\n", path, nfs_get_error(nfs)); return 1;
            }
            if (nfs_write(nfs, fh, sizeof buf, buf) != (int)sizeof buf) {
                fprintf(stderr, "write %s: %s\n", path, nfs_get_error(nfs)); return 1;
            }
            if (nfs_close(nfs, fh)) { fprintf(stderr, "close: %s\n", nfs_get_error(nfs)); return 1; }
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%.3f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    } else { fprintf(stderr, "bad mode\n"); return 2; }
    nfs_destroy_url(url);
    nfs_destroy_context(nfs);
    return rc ? 1 : 0;
}
C
gcc -O2 -o "$work/nfsbench" "$work/nfsbench.c" -lnfs
cat >"$work/nfspread.c" <<'C'
/* nfspread URL FILE DEPTH : reads FILE whole over one mount with DEPTH 1 MiB READs in flight,
 * as a kernel client's read-ahead keeps several in flight, and discards the bytes; prints the
 * seconds the reads took. */
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <nfsc/libnfs.h>
#define CHUNK (1u << 20)
struct piece { uint64_t off, len; };
static struct nfs_context *nfs;
static struct nfsfh *fh;
static uint64_t size, next, got;
static int inflight, depth, failed;
static void cb(int err, struct nfs_context *n, void *data, void *priv);
static void send_piece(struct piece *p) {
    if (nfs_pread_async(nfs, fh, p->off, p->len, cb, p)) { fprintf(stderr, "pread: %s\n", nfs_get_error(nfs)); failed = 1; free(p); return; }
    inflight++;
}
static void issue(void) {
    while (!failed && inflight < depth && next < size) {
        struct piece *p = malloc(sizeof *p);
        p->off = next;
        p->len = size - next < CHUNK ? size - next : CHUNK;
        next += p->len;
        send_piece(p);
    }
}
static void cb(int err, struct nfs_context *n, void *data, void *priv) {
    struct piece *p = priv;
    (void)n;
    inflight--;
    if (err <= 0) {
        fprintf(stderr, "read at %llu: %s\n", (unsigned long long)p->off, err < 0 ? (char *)data : "end of file early");
        failed = 1; free(p); return;
    }
    got += (uint64_t)err;
    if ((uint64_t)err < p->len) { p->off += err; p->len -= err; send_piece(p); }
    else free(p);
    issue();
}
int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: nfspread URL FILE DEPTH\n"); return 2; }
    nfs = nfs_init_context();
    struct nfs_url *url = nfs_parse_url_dir(nfs, argv[1]);
    if (!url || nfs_mount(nfs, url->server, url->path)) { fprintf(stderr, "mount: %s\n", nfs_get_error(nfs)); return 1; }
    depth = atoi(argv[3]);
    struct nfs_stat_64 st;
    if (nfs_stat64(nfs, argv[2], &st)) { fprintf(stderr, "stat: %s\n", nfs_get_error(nfs)); return 1; }
    size = st.nfs_size;
    if (nfs_open(nfs, argv[2], O_RDONLY, &fh)) { fprintf(stderr, "open: %s\n", nfs_get_error(nfs)); return 1; }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    issue();
    while (!failed && inflight > 0) {
        struct pollfd pfd = { .fd = nfs_get_fd(nfs), .events = nfs_which_events(nfs) };
        if (poll(&pfd, 1, 100) < 0) { perror("poll"); return 1; }
        if (nfs_service(nfs, pfd.revents) < 0) { fprintf(stderr, "service: %s\n", nfs_get_error(nfs)); return 1; }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (failed || got != size) { fprintf(stderr, "read %llu of %llu bytes\n", (unsigned long long)got, (unsigned long long)size); return 1; }
    printf("%.3f\n", (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
    nfs_close(nfs, fh);
    nfs_destroy_url(url);
    nfs_destroy_context(nfs);
    return 0;
}
C
gcc -O2 -o "$work/nfspread" "$work/nfspread.c" -lnfs

log "generating ${size_mib} MiB of random data"
head -c "$((size_mib * 1048576))" /dev/urandom >"$work/src.bin"
head -c 4096 /dev/urandom >"$work/f4k.bin"

declare -A T # T[server.metric]=seconds, one per round, space-separated
add() { T[$1]="${T[$1]:-}${T[$1]:+ }$2"; }

# --- NFS --------------------------------------------------------------------------------
# NFS servers by name: the query string of their URLs, the export root URL, and the prefix of
# a file's URL in the export root (libnfs mounts the parent directory of a URL's file).
declare -A NQ NROOT NPREFIX
nfs_rw() { # NAME ROUND: write, then read back, the big file
    local name=$1 i=$2 q=${NQ[$1]} root=${NROOT[$1]} w r p
    local big="${NPREFIX[$1]}big.bin?$q"
    "$work/nfsbench" "$root?$q" rm /big.bin >/dev/null 2>&1 || true
    before_write
    w=$(timeit nfs-cp "$work/src.bin" "$big")
    rm -f "$work/back.bin"
    before_read
    r=$(timeit nfs-cp "$big" "$work/back.bin")
    if ((i == 1)); then cmp -s "$work/src.bin" "$work/back.bin" || { echo "$name: NFS read-back differs" >&2; exit 1; }; fi
    rm -f "$work/back.bin"
    before_read
    p=$("$work/nfspread" "$root?$q" /big.bin "$depth")
    "$work/nfsbench" "$root?$q" rm /big.bin
    add "$name.nfs_w" "$w"
    add "$name.nfs_r" "$r"
    add "$name.nfs_rp" "$p"
    log "$name nfs round $i: write $w s, read $r s, read with $depth in flight $p s"
}
nfs_create() { # NAME ROUND: the libnfs create loop
    local name=$1 i=$2 t
    drop_caches
    t=$("$work/nfsbench" "${NROOT[$1]}?${NQ[$1]}" create "/creates$i" "$nfiles")
    add "$name.nfs_c" "$t"
    log "$name create round $i: $nfiles files in $t s"
}
nfs_cp_loop() { # NAME ROUND: one nfs-cp process per file
    local name=$1 i=$2 k t
    drop_caches
    local t0=$EPOCHREALTIME
    for k in $(seq "$cpfiles"); do
        nfs-cp "$work/f4k.bin" "${NPREFIX[$1]}cpf$i-$k?${NQ[$1]}" >>"$work/cmd.log" 2>&1 || { echo "$name: nfs-cp #$k failed" >&2; tail "$work/cmd.log" >&2; exit 1; }
    done
    t=$(python3 -c "print(f'{$EPOCHREALTIME - $t0:.3f}')")
    add "$name.nfs_cp" "$t"
    log "$name nfs-cp loop round $i: $cpfiles files in $t s"
}

# --- SFTP -------------------------------------------------------------------------------
ssh_opts=(-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR
    -o Ciphers="$cipher" -o Compression=no)
declare -A SREMOTE
sftp_batch() { # NAME BATCHFILE
    case $1 in
        aquifer) sshpass -p "$admin_pw" sftp -o BatchMode=no "${ssh_opts[@]}" -P "$aq_sftp" -b "$2" admin@127.0.0.1 ;;
        sshd) sftp "${ssh_opts[@]}" -o IdentitiesOnly=yes -i "$work/client_key" -P "$s_port" -b "$2" root@127.0.0.1 ;;
    esac
}
sftp_rw() { # NAME ROUND: put, then get back, the big file
    local name=$1 i=$2 remote=${SREMOTE[$1]} p g
    printf -- '-rm %s\n' "$remote" >"$work/b-rm.$name"
    printf 'put %s %s\n' "$work/src.bin" "$remote" >"$work/b-put.$name"
    printf 'get %s %s\n' "$remote" "$work/back.bin" >"$work/b-get.$name"
    sftp_batch "$name" "$work/b-rm.$name" >>"$work/cmd.log" 2>&1 || true
    before_write
    p=$(timeit sftp_batch "$name" "$work/b-put.$name")
    rm -f "$work/back.bin"
    before_read
    g=$(timeit sftp_batch "$name" "$work/b-get.$name")
    if ((i == 1)); then cmp -s "$work/src.bin" "$work/back.bin" || { echo "$name: SFTP read-back differs" >&2; exit 1; }; fi
    rm -f "$work/back.bin"
    sftp_batch "$name" "$work/b-rm.$name" >>"$work/cmd.log" 2>&1 || true
    add "$name.sftp_p" "$p"
    add "$name.sftp_g" "$g"
    log "$name sftp round $i: put $p s, get $g s"
}

# --- servers ----------------------------------------------------------------------------
log "starting Aquifer"
AQUIFER_ADMIN_PASSWORD=$admin_pw AQUIFER_LOG=${AQUIFER_LOG:-warn} "$bin" serve --data-dir "$work/aquifer" \
    --rest 127.0.0.1:0 --s3 127.0.0.1:0 --nfs 127.0.0.1:0 --sftp 127.0.0.1:0 --drive-size "${BENCH_DRIVE_SIZE:-2GiB}" \
    >"$work/aquifer.out" 2>"$work/aquifer.err" &
aq_pid=$!
pids+=("$aq_pid")
for _ in $(seq 600); do
    grep -q "^Aquifer is serving" "$work/aquifer.out" 2>/dev/null && break
    kill -0 "$aq_pid" 2>/dev/null || { cat "$work/aquifer.err" >&2; exit 1; }
    sleep 0.1
done
grep -q "^Aquifer is serving" "$work/aquifer.out" || { echo "Aquifer did not start" >&2; exit 1; }
aq_nfs=$(grep -o 'nfs://[^ ,]*' "$work/aquifer.out" | sed 's/.*://')
aq_sftp=$(grep -o 'sftp://[^ ,]*' "$work/aquifer.out" | sed 's/.*://')
log "Aquifer pid $aq_pid: NFS/MOUNT port $aq_nfs, SFTP port $aq_sftp"
NQ[aquifer]="nfsport=$aq_nfs&mountport=$aq_nfs&version=3"
NROOT[aquifer]="nfs://127.0.0.1/"
NPREFIX[aquifer]="nfs://127.0.0.1//"
SREMOTE[aquifer]=big.bin

log "starting nfs-ganesha"
g_port=$(free_port) g_mnt=$(free_port)
mkdir -p "$work/ganesha-export"
cat >"$work/ganesha.conf" <<CONF
NFS_CORE_PARAM { NFS_Port = $g_port; MNT_Port = $g_mnt; NLM_Port = 0; Rquota_Port = 0;
    Enable_NLM = false; Enable_RQUOTA = false; Protocols = 3; Bind_addr = 127.0.0.1; }
NFSV4 { Graceless = true; }
EXPORT { Export_Id = 1; Path = $work/ganesha-export; Pseudo = $work/ganesha-export; Access_Type = RW;
    Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys;
    PrivilegedPort = false; CLIENT { Clients = 127.0.0.1; Access_Type = RW; }
    FSAL { Name = VFS; } }
CONF
if ! pgrep -x rpcbind >/dev/null; then
    rpcbind
    rpcbind_pid=$(pgrep -x rpcbind | head -1)
fi
ganesha.nfsd -F -f "$work/ganesha.conf" -L "$work/ganesha.log" -p "$work/ganesha.pid" &
g_pid=$!
pids+=("$g_pid")
wait_port "$g_port" "$g_pid" "$work/ganesha.log"
wait_port "$g_mnt" "$g_pid" "$work/ganesha.log"
log "ganesha pid $g_pid: NFS port $g_port, MOUNT port $g_mnt, export $work/ganesha-export"
NQ[ganesha]="nfsport=$g_port&mountport=$g_mnt&version=3"
NROOT[ganesha]="nfs://127.0.0.1$work/ganesha-export"
NPREFIX[ganesha]="nfs://127.0.0.1$work/ganesha-export/"

log "starting sshd"
s_port=$(free_port)
mkdir -p /run/sshd "$work/sshd-data"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh_host_ed25519_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/client_key"
cp "$work/client_key.pub" "$work/authorized_keys"
cat >"$work/sshd_config" <<CONF
Port $s_port
ListenAddress 127.0.0.1
HostKey $work/ssh_host_ed25519_key
PidFile $work/sshd.pid
AuthorizedKeysFile $work/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
CONF
/usr/sbin/sshd -D -e -f "$work/sshd_config" 2>"$work/sshd.log" &
s_pid=$!
pids+=("$s_pid")
wait_port "$s_port" "$s_pid" "$work/sshd.log"
log "sshd pid $s_pid on port $s_port"
SREMOTE[sshd]="$work/sshd-data/big.bin"

# --- rounds -----------------------------------------------------------------------------
# in_order ROUND A B CMD... : runs `CMD A ROUND` and `CMD B ROUND`, A first in odd rounds.
in_order() {
    local i=$1 a=$2 b=$3
    shift 3
    if ((i % 2 == 1)); then "$@" "$a" "$i"; "$@" "$b" "$i"; else "$@" "$b" "$i"; "$@" "$a" "$i"; fi
}
# The disk's own sequential O_DIRECT read or write of the big file's size ($work/disk.bin,
# already written): the best of three request shapes (1 MiB 16 in flight, 4 MiB 8 and 16 in
# flight; which is fastest varies between these VMs and between minutes). A read, from a
# dropped page cache, is the ceiling of any server's cold read. A write goes over written
# blocks, as Aquifer's drive files are, and is synced at the end as nfs-cp's COMMIT is:
# Aquifer writes 1.5 bytes a byte with the default 4+2 parity before it answers a COMMIT or an
# SFTP close, so the write rows cannot pass two thirds of it.
fio_rate() { # read|write FIO_ARGS... : fio's MiB/s for the job (summed over its files), as JSON read
    local rw=$1 out
    shift
    out=$(fio "$@" --rw="$rw" --ioengine=libaio --direct=1 --output-format=json 2>>"$work/cmd.log") || { echo "fio failed" >&2; return 1; }
    python3 -c 'import json,sys; r = json.load(sys.stdin)["jobs"][0][sys.argv[1]]; print(round(r["bw_bytes"] / 1048576))' "$rw" <<<"$out"
}
disk_rate() { # read|write ROUND
    local rw=$1 shape best=0 bw extra=()
    if ! command -v fio >/dev/null; then return 0; fi
    [[ $rw == write ]] && extra=(--end_fsync=1)
    for shape in 1M:16 4M:8 4M:16; do
        [[ $rw == read ]] && drop_caches
        bw=$(fio_rate "$rw" --name=disk --filename="$work/disk.bin" --bs="${shape%:*}" --iodepth="${shape#*:}" \
            "${extra[@]}" --size="${size_mib}M") || return 1
        log "disk O_DIRECT $rw round $2, $shape: $bw MiB/s"
        ((bw > best)) && best=$bw
    done
    add "disk.${rw}_MiB_per_s" "$best"
}
# The disk writing what Aquifer's write of the big file writes, just before the round's NFS
# writes: with 4+2 parity 1.5 times its bytes, over six files (one per drive file) in 1 MiB
# requests (a shard), four in flight in each (four stripes' shards outstanding), over written
# blocks, synced at the end. The best-of-three shapes above pick the disk's best moments; this
# is the same bytes in Aquifer's own pattern, in the same minute as the round's writes.
own_write() { # ROUND
    local bw
    if ! command -v fio >/dev/null; then return 0; fi
    bw=$(fio_rate write --name=own --directory="$work/own" --filename_format='drive-$jobnum' --numjobs=6 \
        --size="$((size_mib / 4))M" --bs=1M --iodepth=4 --end_fsync=1 --group_reporting) || return 1
    log "disk O_DIRECT write round $1, Aquifer's pattern (six files, 1 MiB, 4 in flight each): $bw MiB/s"
    add "disk.own_write_MiB_per_s" "$bw"
}
if command -v fio >/dev/null; then
    head -c "$((size_mib * 1048576))" /dev/urandom >"$work/disk.bin"
    mkdir -p "$work/own"
    for k in 0 1 2 3 4 5; do head -c "$((size_mib / 4 * 1048576))" /dev/urandom >"$work/own/drive-$k"; done
    sync
fi

for i in $(seq "$reps"); do
    disk_rate write "$i"
    disk_rate read "$i"
    own_write "$i"
    in_order "$i" aquifer ganesha nfs_rw
    in_order "$i" aquifer ganesha nfs_create
    in_order "$i" aquifer ganesha nfs_cp_loop
    in_order "$i" aquifer sshd sftp_rw
done

# --- ceilings ---------------------------------------------------------------------------
# Two rows are paced by one client process: nfs-cp keeps one READ in flight and copies each
# into a local file, and an nfs-cp process per file spends most of its time starting. One
# more pass of each, per server, under a packet capture of the server's ports: the time the
# server had a call outstanding (scripts/rpc-busy.py) is more than a faster server could save:
# a 1 MiB READ reply takes time to cross the loopback and into the client whatever the server,
# so only the time from each call to its reply's first byte is the server's own. seconds /
# (seconds - answering) of the peer is the ratio a server beginning every reply at once would
# reach. Capturing slows both sides; the pass is not one of the timed rounds.
declare -A BUSY # BUSY[server.metric]="seconds busy_seconds answering_seconds"
nfs_ports() { case $1 in aquifer) echo "$aq_nfs" ;; ganesha) echo "$g_port $g_mnt" ;; esac; }
captured() { # NAME METRIC CMD... : runs CMD under a capture of NAME's NFS and MOUNT ports
    local name=$1 metric=$2 filter="" p tpid t0 t busy
    shift 2
    local ports
    read -ra ports <<<"$(nfs_ports "$name")"
    for p in "${ports[@]}"; do filter+="${filter:+ or }tcp port $p"; done
    tcpdump -i lo -s 200 -B 262144 -U -w "$work/cap.pcap" "$filter" 2>"$work/tcpdump.err" &
    tpid=$!
    for _ in $(seq 100); do grep -q "listening on" "$work/tcpdump.err" && break; sleep 0.05; done
    t0=$EPOCHREALTIME
    "$@" >>"$work/cmd.log" 2>&1 || { echo "FAILED: $*" >&2; tail -20 "$work/cmd.log" >&2; kill "$tpid"; return 1; }
    t=$(python3 -c "print(f'{$EPOCHREALTIME - $t0:.3f}')")
    sleep 0.2
    kill -INT "$tpid"
    wait "$tpid" || true
    if ! grep -q "^0 packets dropped by kernel" "$work/tcpdump.err"; then
        echo "$name $metric: the capture dropped packets; no ceiling" >&2
        cat "$work/tcpdump.err" >&2
        return 0
    fi
    busy=$(python3 "$(dirname "$0")/rpc-busy.py" "$work/cap.pcap" "${ports[@]}")
    log "$name $metric under capture: $t s, server $busy"
    BUSY[$name.$metric]="$t $(python3 -c 'import json,sys; d=json.load(sys.stdin); print(*(["lost"] if d["lost"] else [d["busy_s"], d["answer_s"]]))' <<<"$busy")"
    rm -f "$work/cap.pcap"
}
cp_files() { # NAME: the nfs-cp-per-file loop's files, under the capture's own prefix
    local k
    for k in $(seq "$cpfiles"); do nfs-cp "$work/f4k.bin" "${NPREFIX[$1]}cap-$k?${NQ[$1]}" || return 1; done
}
if command -v tcpdump >/dev/null; then
    for name in aquifer ganesha; do
        "$work/nfsbench" "${NROOT[$name]}?${NQ[$name]}" rm /big.bin >/dev/null 2>&1 || true
        before_write
        nfs-cp "$work/src.bin" "${NPREFIX[$name]}big.bin?${NQ[$name]}" >>"$work/cmd.log" 2>&1
        rm -f "$work/back.bin"
        before_read
        captured "$name" nfs_r nfs-cp "${NPREFIX[$name]}big.bin?${NQ[$name]}" "$work/back.bin"
        rm -f "$work/back.bin"
        "$work/nfsbench" "${NROOT[$name]}?${NQ[$name]}" rm /big.bin
        drop_caches
        captured "$name" nfs_cp cp_files "$name"
    done
fi

# --- report -----------------------------------------------------------------------------
total=$(python3 -c "print(f'{$EPOCHREALTIME - $t_start:.0f}')")
echo
echo "| Protocol | Operation | Aquifer | Peer | Aquifer/peer | (rounds) |"
echo "|---|---|---:|---:|---:|---:|"
# row PROTOCOL OPERATION METRIC UNIT PEER AMOUNT: values are AMOUNT / seconds; a round's ratio
# is the peer's seconds over Aquifer's.
row() {
    python3 - "$@" "${T[aquifer.$3]}" "${T[$5.$3]}" <<'PY'
import statistics as st, sys
proto, op, metric, unit, peer, amount, a, p = sys.argv[1:]
a = [float(x) for x in a.split()]
p = [float(x) for x in p.split()]
amount = float(amount)
ratios = [pt / at for at, pt in zip(a, p)]
print(f"| {proto} | {op} | {amount / st.median(a):.0f} {unit} | {amount / st.median(p):.0f} {unit} "
      f"| {st.median(ratios):.2f} | {min(ratios):.2f}–{max(ratios):.2f} |")
PY
}
row "NFSv3 (vs ganesha VFS)" "sequential write ${size_mib} MiB (nfs-cp)" nfs_w MiB/s ganesha "$size_mib"
row "NFSv3 (vs ganesha VFS)" "sequential read ${size_mib} MiB (nfs-cp)" nfs_r MiB/s ganesha "$size_mib"
row "NFSv3 (vs ganesha VFS)" "sequential read ${size_mib} MiB, $depth × 1 MiB READs in flight (libnfs async)" nfs_rp MiB/s ganesha "$size_mib"
row "NFSv3 (vs ganesha VFS)" "create+write 4 KiB files, one mount (libnfs loop, $nfiles files)" nfs_c files/s ganesha "$nfiles"
row "NFSv3 (vs ganesha VFS)" "create 4 KiB files, nfs-cp per file ($cpfiles files)" nfs_cp files/s ganesha "$cpfiles"
row "SFTP (vs sshd internal-sftp)" "put ${size_mib} MiB (sftp -b, $cipher)" sftp_p MiB/s sshd "$size_mib"
row "SFTP (vs sshd internal-sftp)" "get ${size_mib} MiB (sftp -b, $cipher)" sftp_g MiB/s sshd "$size_mib"
if [[ -n "${T[disk.read_MiB_per_s]:-}${T[disk.write_MiB_per_s]:-}" || ${#BUSY[@]} -gt 0 ]]; then
    echo
    echo "| Row | Ceiling against the peer | What sets it | Aquifer/peer |"
    echo "|---|---:|---|---:|"
    python3 - "$size_mib" "${T[disk.read_MiB_per_s]:-}" "${T[ganesha.nfs_rp]}" "${T[aquifer.nfs_rp]}" \
        "${BUSY[ganesha.nfs_r]:-}" "${BUSY[aquifer.nfs_r]:-}" "${T[ganesha.nfs_r]}" "${T[aquifer.nfs_r]}" \
        "${BUSY[ganesha.nfs_cp]:-}" "${BUSY[aquifer.nfs_cp]:-}" "${T[ganesha.nfs_cp]}" "${T[aquifer.nfs_cp]}" \
        "${T[disk.write_MiB_per_s]:-}" "${T[ganesha.nfs_w]}" "${T[aquifer.nfs_w]}" "${T[sshd.sftp_p]}" "${T[aquifer.sftp_p]}" \
        "${T[disk.own_write_MiB_per_s]:-}" <<'PY'
import statistics as st, sys
a = sys.argv[1:]
size = float(a[0])
med = lambda v: st.median(float(x) for x in v.split())
# Aquifer/peer as in the table above: the median of the rounds' ratios.
ratio = lambda peer_s, aq_s: st.median(float(p) / float(q) for p, q in zip(peer_s.split(), aq_s.split()))
if a[12]:
    disk = med(a[12])
    for row, peer_s, aq_s in (("sequential write (nfs-cp)", a[13], a[14]), ("SFTP put", a[15], a[16])):
        peer, aq = size / med(peer_s), size / med(aq_s)
        own = ""
        if a[17]:
            # Per round: Aquifer's bytes with parity over the disk's in Aquifer's pattern that round.
            fr = [size * 1.5 / float(t) / float(d) for t, d in zip(aq_s.split(), a[17].split())]
            own = (f"; in Aquifer's own pattern the disk wrote {med(a[17]):.0f} MiB/s, and Aquifer reached "
                   f"{st.median(fr):.2f} ({min(fr):.2f}–{max(fr):.2f}) of it in the same rounds")
        print(f"| {row} | {disk / 1.5 / peer:.2f} | the disk's O_DIRECT write, {disk:.0f} MiB/s, of which Aquifer's 4+2 "
              f"parity leaves two thirds (peer at {peer / disk:.2f} of the disk's write; Aquifer at {aq * 1.5 / disk:.2f} "
              f"of it with parity{own}) | {ratio(peer_s, aq_s):.2f} |")
if a[1]:
    disk, peer, aq = med(a[1]), size / med(a[2]), size / med(a[3])
    print(f"| sequential read, READs in flight | {disk / peer:.2f} | the disk's O_DIRECT read, {disk:.0f} MiB/s "
          f"(peer at {peer / disk:.2f}, Aquifer at {aq / disk:.2f} of it) | {ratio(a[2], a[3]):.2f} |")
for row, gb, ab, gt, at in (("sequential read (nfs-cp)", *a[4:8]), ("create 4 KiB files, nfs-cp per file", *a[8:12])):
    if not gb or "lost" in gb:
        continue
    g_t, g_busy, g_answer = (float(x) for x in gb.split())
    detail = f"peer's server busy {g_busy:.2f} s of {g_t:.2f} s, {g_answer:.2f} s of it before replies began"
    if ab and "lost" not in ab:
        a_t, a_busy, a_answer = (float(x) for x in ab.split())
        detail += f"; Aquifer's {a_busy:.2f} s of {a_t:.2f} s, {a_answer:.2f} s before replies began"
    print(f"| {row} | {g_t / (g_t - g_answer):.2f} ({g_t / (g_t - g_busy):.2f}) | the client: {detail} | {ratio(gt, at):.2f} |")
PY
    echo
    echo "A ceiling is the ratio to the peer that no server could pass in this run, or for the write"
    echo "rows that Aquifer cannot: two thirds of the disk's own write (with 4+2 parity it writes 1.5"
    echo "bytes a byte before it answers a COMMIT or a close) over the peer's rate (sshd's put writes"
    echo "into the page cache and never waits for the disk); for the read with READs in flight, the"
    echo "disk's own read over the peer's; for the rows paced by one nfs-cp process, the peer's"
    echo "time over what is left of it with no time between each call and the"
    echo "first byte of its reply, and in brackets with no call outstanding at all (replies crossing"
    echo "the loopback in no time either): one more pass of each under a packet capture,"
    echo "scripts/rpc-busy.py. The capture slows both sides, not always alike."
fi
echo
echo "Medians of $reps rounds; in each round both servers ran the operation one after the other,"
echo "the order alternating. Page cache dropped before every timed operation: $([[ $can_drop == 1 ]] && echo yes || echo no)."
echo "Aquifer binary: $bin. Total $total s."
echo "$(nproc) CPUs; load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine shows here)."
echo
echo "Raw seconds per round:"
for k in "${!T[@]}"; do echo "- $k: ${T[$k]}"; done | sort
