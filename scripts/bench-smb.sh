#!/usr/bin/env bash
# Measures Aquifer's SMB 3 throughput and create rate against stock Samba smbd sharing a
# directory on the same disk, in one run, both driven by Samba's smbclient (-m SMB3, signing as
# negotiated, no encryption unless BENCH_ENCRYPT=1), and prints a Markdown table of medians and
# Aquifer/Samba ratios:
#   - put and get of one BENCH_SIZE_MIB file (1 GiB by default), and the get again into
#     /dev/null;
#   - BENCH_FILES 4 KiB files created with one smbclient session (`put` of each, one session).
# Samba runs twice: its default configuration (smbclient signs only the session setup) and
# `server signing = mandatory`, since Aquifer signs every message.
#
#   scripts/bench-smb.sh
#
# Environment: AQUIFER_BIN (default /var/cache/aquifer-target/debug/aquifer), BENCH_SIZE_MIB
# (1024), BENCH_FILES (500), BENCH_REPS (3), BENCH_ENCRYPT (0). Needs (apt): samba smbclient.
# Runs as root; drops the page cache before timed operations when it can (and reads the put's
# source back into it). Data lives under a temporary directory in /var/tmp, removed at the
# end; servers are stopped by their pid.
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
# Before a put: a clean cold cache, then the source file back in the page cache, so that
# smbclient reads it from memory for every server (as scripts/bench-nfs-sftp.sh does). Read
# from the disk, it competes with the server that writes to the disk during the put.
before_put() { drop_caches; cat "$work/big" > /dev/null; }
now() { date +%s.%N; }

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
# Servers take turns within each round, operation by operation, in an order that rotates from
# round to round, so that load from elsewhere on the machine falls on all of them alike; each
# ratio is taken within its round.
servers=(aquifer samba samba-signed)
target() { # SERVER -> "PORT USER"
    case $1 in
        aquifer) echo "$aq_port admin" ;;
        samba) echo "$sb_port root" ;;
        samba-signed) echo "$sbs_port root" ;;
    esac
}
for r in $(seq "$reps"); do
    k=$(( (r - 1) % ${#servers[@]} ))
    order=("${servers[@]:k}" "${servers[@]:0:k}")
    for server in "${order[@]}"; do
        read -r port user <<< "$(target "$server")"
        before_put
        res[$server.put]+="$(timed smb "$port" "$user" "put $work/big big$r") "
        drop_caches
        res[$server.get]+="$(timed smb "$port" "$user" "get big$r $work/back") "
        cmp -s "$work/big" "$work/back" || { echo "$server: get returned different bytes" >&2; exit 1; }
        rm -f "$work/back"
        # The same get with smbclient writing nothing: its writes into the page cache cost it
        # as much CPU as the rest of a get, and vary from run to run.
        drop_caches
        res[$server.getnull]+="$(timed smb "$port" "$user" "get big$r /dev/null") "
        smb "$port" "$user" "rm big$r"
    done
    for server in "${order[@]}"; do
        read -r port user <<< "$(target "$server")"
        res[$server.create]+="$(timed smb "$port" "$user" "$creates") "
        smb "$port" "$user" "deltree many"
    done
    echo "round $r ($(IFS=,; echo "${order[*]}")): put ${res[aquifer.put]}/ ${res[samba.put]}/ ${res[samba-signed.put]}; get ${res[aquifer.get]}/ ${res[samba.get]}/ ${res[samba-signed.get]}; get to /dev/null ${res[aquifer.getnull]}/ ${res[samba.getnull]}/ ${res[samba-signed.getnull]}; create ${res[aquifer.create]}/ ${res[samba.create]}/ ${res[samba-signed.create]} s" >&2
done

# row LABEL OP AMOUNT: values are AMOUNT / seconds (medians); a round's ratio is the peer's
# seconds over Aquifer's, and the table gives the median of the rounds' ratios.
row() {
    python3 - "$@" "${res[aquifer.$2]}" "${res[samba.$2]}" "${res[samba-signed.$2]}" <<'PY'
import statistics as st, sys
label, op, amount, a, s, ss = sys.argv[1:]
amount = float(amount)
a, s, ss = ([float(x) for x in v.split()] for v in (a, s, ss))
def cell(peer):
    r = [p / x for x, p in zip(a, peer)]
    return f"{st.median(r):.2f}× ({min(r):.2f}–{max(r):.2f})"
print(f"| {label} | {amount / st.median(a):.0f} | {amount / st.median(s):.0f} | {amount / st.median(ss):.0f} | {cell(s)} | {cell(ss)} |")
PY
}
echo "| operation | Aquifer (signed) | Samba smbd (default) | Samba smbd (signing mandatory) | Aquifer / Samba (rounds) | Aquifer / Samba signed (rounds) |"
echo "|---|--:|--:|--:|--:|--:|"
row "put $size_mib MiB (MiB/s)" put "$size_mib"
row "get $size_mib MiB (MiB/s)" get "$size_mib"
row "get $size_mib MiB to /dev/null (MiB/s)" getnull "$size_mib"
row "create $nfiles × 4 KiB, one session (files/s)" create "$nfiles"
echo
echo "Medians of $reps rounds (ratios: median of the rounds' own ratios, with their range); encryption $([[ $encrypt == 1 ]] && echo on || echo off); $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)."
