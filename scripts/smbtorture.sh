#!/usr/bin/env bash
# The smbtorture ladder (TESTING.md, SMB) against Aquifer and against stock Samba smbd with a
# minimal configuration, in the same run on the same disk; prints a Markdown report with
# pass/fail per test (docs/smb-conformance.md is this script's output).
#
#   scripts/smbtorture.sh [SUITE...]        default: the whole ladder
#   SMBTORTURE_TIMEOUT=300 (seconds per suite and server), AQUIFER_BIN (default: debug build),
#   SMBTORTURE_RAW_DIR (keep smbtorture's full output per server and suite there)
#
# Needs root for smbd's state, and apt samba + samba-testsuite (scripts/deps.sh installs them).
set -euo pipefail

suites=("$@")
if ((${#suites[@]} == 0)); then
    suites=(connect rw read maxfid lock getinfo setinfo dir create rename compound sharemode
            delete-on-close-perms session credits oplock lease)
fi
per_suite=${SMBTORTURE_TIMEOUT:-300}
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${AQUIFER_BIN:-${CARGO_TARGET_DIR:-$root/target}/debug/aquifer}
[[ -x $bin ]] || { echo "no aquifer binary at $bin (build first or set AQUIFER_BIN)" >&2; exit 1; }
command -v smbtorture >/dev/null && command -v smbd >/dev/null || { echo "install samba and samba-testsuite (scripts/deps.sh)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/aquifer-smbtorture.XXXXXX")
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
password=torture-password-1
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- Aquifer: the whole namespace as "aquifer", leases on (the torture suites test them).
aq_port=$(free_port)
cat > "$work/aquifer.toml" <<EOF
[listen]
smb = "127.0.0.1:$aq_port"
[[shares]]
name = "aquifer"
path = "/"
leases = true
EOF
AQUIFER_ADMIN_PASSWORD=$password AQUIFER_LOG=${AQUIFER_LOG:-warn} "$bin" serve --data-dir "$work/aquifer" \
    --config "$work/aquifer.toml" --rest 127.0.0.1:0 --s3 127.0.0.1:0 --nfs 127.0.0.1:0 --sftp 127.0.0.1:0 \
    --drive-size 512MiB > "$work/aquifer.out" 2> "$work/aquifer.log" &
pids+=($!)

# --- Samba: minimal standalone configuration, all state under $work.
sb_port=$(free_port)
source "$(dirname "$0")/smb-peer.sh"
start_samba "$work/samba" "$sb_port" "$password"

for i in $(seq 1 300); do
    grep -q "Aquifer is serving" "$work/aquifer.out" 2>/dev/null && (echo > "/dev/tcp/127.0.0.1/$sb_port") 2>/dev/null && break
    sleep 0.2
done
grep -q "Aquifer is serving" "$work/aquifer.out" || { cat "$work/aquifer.log" >&2; exit 1; }

# run SERVER PORT USER SUITE -> lines "result<TAB>test" in $work/SERVER.SUITE
run() {
    local server=$1 port=$2 user=$3 suite=$4 out="$work/$1.$4"
    # In $work: smbtorture leaves an empty smbtortureXXXXXX directory where it runs.
    (cd "$work" && timeout --kill-after=10 "$per_suite" smbtorture "//127.0.0.1/aquifer" -p "$port" \
        -U "$user%$password" --option=torture:writetimeupdatedelay=50000 "smb2.$suite") > "$out.raw" 2>&1 || true
    grep -E '^(success|failure|error|skip|xfail): ' "$out.raw" | sed -E 's/^(success|failure|error|skip|xfail): ([^ ]+).*/\1\t\2/' \
        | awk -F'\t' '!seen[$2]++' > "$out" || true
    if [[ -n ${SMBTORTURE_RAW_DIR:-} ]]; then mkdir -p "$SMBTORTURE_RAW_DIR" && cp "$out.raw" "$SMBTORTURE_RAW_DIR/$server.$suite.txt"; fi
    if ! grep -q . "$out"; then
        printf 'error\t%s (no result: %s)\n' "$suite" "$(tail -1 "$out.raw" | tr -d '\t' | cut -c1-80)" > "$out"
    fi
}

declare -A aq sb
names=()
for s in "${suites[@]}"; do
    run aquifer "$aq_port" admin "$s"
    run samba "$sb_port" root "$s"
    while IFS=$'\t' read -r r t; do aq[$t]=$r; names+=("$t"); done < "$work/aquifer.$s"
    while IFS=$'\t' read -r r t; do sb[$t]=$r; names+=("$t"); done < "$work/samba.$s"
    echo "suite $s done" >&2
done

mapfile -t names < <(printf '%s\n' "${names[@]}" | awk '!seen[$0]++')
pass() { [[ $1 == success || $1 == xfail ]]; }
n_aq=0; n_sb=0; n_both=0; n_sb_only=0; n_aq_only=0
for t in "${names[@]}"; do
    a=${aq[$t]:-missing}; b=${sb[$t]:-missing}
    pass "$a" && n_aq=$((n_aq + 1))
    pass "$b" && n_sb=$((n_sb + 1))
    pass "$a" && pass "$b" && n_both=$((n_both + 1))
    ! pass "$a" && pass "$b" && n_sb_only=$((n_sb_only + 1))
    pass "$a" && ! pass "$b" && n_aq_only=$((n_aq_only + 1))
done
echo "## smbtorture $(smbtorture --version 2>/dev/null | head -1), $(date -u +%Y-%m-%d)"
echo
echo "Command: \`scripts/smbtorture.sh ${*:-}\` (suites: ${suites[*]}; ${per_suite} s limit per suite and server)."
echo "Samba: $(smbd --version | head -1), minimal standalone configuration on the same disk, same run."
echo
echo "| | tests | Aquifer passes | Samba passes | both | Samba only | Aquifer only |"
echo "|---|---|---|---|---|---|---|"
echo "| total | ${#names[@]} | $n_aq | $n_sb | $n_both | $n_sb_only | $n_aq_only |"
echo
echo "| test | Aquifer | Samba |"
echo "|---|---|---|"
for t in "${names[@]}"; do
    echo "| $t | ${aq[$t]:-missing} | ${sb[$t]:-missing} |"
done
