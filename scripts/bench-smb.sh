#!/usr/bin/env bash
# Measures Aquifer's SMB 3 throughput and create rate against stock Samba smbd sharing a
# directory on the same disk, in one run, both driven by Samba's smbclient (-m SMB3, signing as
# negotiated, no encryption unless BENCH_ENCRYPT=1), and prints a Markdown table of medians and
# Aquifer/Samba ratios:
#   - put and get of one BENCH_SIZE_MIB file (1 GiB by default);
#   - BENCH_FILES 4 KiB files created with one smbclient session (`put` of each, one session).
# Samba runs twice: its default configuration (smbclient signs only the session setup) and
# `server signing = mandatory`, since Aquifer signs every message.
#
#   scripts/bench-smb.sh
#
# Environment: AQUIFER_BIN (default /var/cache/aquifer-target/debug/aquifer), BENCH_SIZE_MIB
# (1024), BENCH_FILES (500), BENCH_REPS (3), BENCH_ENCRYPT (0). Needs (apt): samba smbclient.
# Runs as root; drops the page cache before timed reads when it can. Data lives under a
# temporary directory in /var/tmp, removed at the end; servers are stopped by their pid.
set -euo pipefail

bin=${AQUIFER_BIN:-/var/cache/aquifer-target/debug/aquifer}
size_mib=${BENCH_SIZE_MIB:-1024}
nfiles=${BENCH_FILES:-500}
reps=${BENCH_REPS:-3}
encrypt=${BENCH_ENCRYPT:-0}
pw=bench-admin-pw1
for t in smbclient smbd smbpasswd python3; do command -v "$t" >/dev/null || { echo "missing $t" >&2; exit 2; }; done
[[ -x "$bin" ]] || { echo "missing $bin" >&2; exit 2; }

work=$(mktemp -d /var/tmp/aquifer-bench-smb.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

aq_port=$(free_port)
AQUIFER_ADMIN_PASSWORD=$pw AQUIFER_LOG=warn "$bin" serve --data-dir "$work/aquifer" --smb "127.0.0.1:$aq_port" \
    --rest 127.0.0.1:0 --s3 127.0.0.1:0 --nfs 127.0.0.1:0 --sftp 127.0.0.1:0 \
    --drive-size "$(( (size_mib * 3 / 2 / 4 + 256) ))MiB" > "$work/aquifer.out" 2> "$work/aquifer.log" &
pids+=($!)

# Samba twice: as configured by default (smbclient then signs only the session setup) and
# with signing required, as Aquifer requires it on every session.
sb_port=$(free_port)
source "$(dirname "$0")/smb-peer.sh"
start_samba "$work/samba" "$sb_port" "$pw"
sbs_port=$(free_port)
start_samba "$work/samba-signed" "$sbs_port" "$pw" "server signing = mandatory"
for _ in $(seq 300); do
    grep -q "Aquifer is serving" "$work/aquifer.out" 2>/dev/null && (echo > "/dev/tcp/127.0.0.1/$sb_port") 2>/dev/null \
        && (echo > "/dev/tcp/127.0.0.1/$sbs_port") 2>/dev/null && break
    sleep 0.2
done
grep -q "Aquifer is serving" "$work/aquifer.out" || { cat "$work/aquifer.log" >&2; exit 1; }

enc_opt="--option=client smb encrypt=off"
[[ $encrypt == 1 ]] && enc_opt="--option=client smb encrypt=required"
smb() { # PORT USER COMMANDS
    smbclient "//127.0.0.1/aquifer" -p "$1" -m SMB3 -U "$2%$pw" -s /dev/null "--option=client use kerberos=off" "$enc_opt" -c "$3" > "$work/last.out" 2>&1 \
        || { cat "$work/last.out" >&2; exit 1; }
    if grep -q NT_STATUS_ "$work/last.out"; then cat "$work/last.out" >&2; exit 1; fi
}
timed() { local t0; t0=$(now); "$@"; echo "$(now) - $t0" | bc -l; }

head -c $((size_mib << 20)) /dev/urandom > "$work/big"
head -c 4096 /dev/urandom > "$work/small"
{ echo "mkdir many"; for i in $(seq "$nfiles"); do echo "put $work/small many\\f$i"; done; } > "$work/creates.cmd"
creates=$(paste -sd';' "$work/creates.cmd")

declare -A res
# Servers take turns within each repetition, so load from elsewhere on the machine falls on all.
for r in $(seq "$reps"); do
    for server in aquifer samba samba-signed; do
        case $server in
            aquifer) port=$aq_port; user=admin ;;
            samba) port=$sb_port; user=root ;;
            samba-signed) port=$sbs_port; user=root ;;
        esac
        drop_caches
        res[$server.put]+="$(timed smb "$port" "$user" "put $work/big big$r") "
        drop_caches
        res[$server.get]+="$(timed smb "$port" "$user" "get big$r $work/back") "
        cmp -s "$work/big" "$work/back" || { echo "$server: get returned different bytes" >&2; exit 1; }
        rm -f "$work/back"
        smb "$port" "$user" "rm big$r"
        res[$server.create]+="$(timed smb "$port" "$user" "$creates") "
        smb "$port" "$user" "deltree many"
        echo "$server rep $r done" >&2
    done
done

med() { tr ' ' '\n' <<< "${res[$1]}" | grep . | median; }
echo "| operation | Aquifer (signed) | Samba smbd (default) | Samba smbd (signing mandatory) | Aquifer / Samba | Aquifer / Samba signed |"
echo "|---|--:|--:|--:|--:|--:|"
for op in put get; do
    a=$(med aquifer.$op); s=$(med samba.$op); ss=$(med samba-signed.$op)
    printf '| %s %d MiB (MiB/s) | %.0f | %.0f | %.0f | %.2f× | %.2f× |\n' "$op" "$size_mib" "$(bc -l <<< "$size_mib / $a")" \
        "$(bc -l <<< "$size_mib / $s")" "$(bc -l <<< "$size_mib / $ss")" "$(bc -l <<< "$s / $a")" "$(bc -l <<< "$ss / $a")"
done
a=$(med aquifer.create); s=$(med samba.create); ss=$(med samba-signed.create)
printf '| create %d × 4 KiB, one session (files/s) | %.0f | %.0f | %.0f | %.2f× | %.2f× |\n' "$nfiles" "$(bc -l <<< "$nfiles / $a")" \
    "$(bc -l <<< "$nfiles / $s")" "$(bc -l <<< "$nfiles / $ss")" "$(bc -l <<< "$s / $a")" "$(bc -l <<< "$ss / $a")"
echo
echo "Medians of $reps runs; encryption $([[ $encrypt == 1 ]] && echo on || echo off); $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)."
