#!/usr/bin/env bash
# pjdfstest through the Linux kernel SMB 3.1.1 client (cifs.ko in the QEMU guest of
# tests/guest/) against a fresh Aquifer daemon and against stock Samba's smbd on a temporary
# directory, one after the other, and prints both counts. The mount options are the guest's
# defaults (tests/guest/init); CIFS_OPTS=... replaces them for both servers.
#
#   scripts/pjdfstest-cifs.sh [PATTERN...]
#
# Needs tests/guest/setup.sh, apt samba and a build of the workspace. Results are recorded in
# docs/smb-conformance.md ("Linux CIFS client and pjdfstest").
set -euo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
for server in aquifer samba; do
    tests/guest/pjdfstest.sh --fs cifs --server "$server" --log "$logs/$server.log" "$@" >"$logs/$server.out"
    grep -E ' FAILED$' "$logs/$server.log" | awk '{print $1}' | sort >"$logs/$server.failed" || true
done
for server in aquifer samba; do
    printf '%-8s %s\n' "$server" "$(grep -h '^Summary' "$logs/$server.log")"
done
echo "failing on Aquifer only:"
comm -23 "$logs/aquifer.failed" "$logs/samba.failed" | sed 's/^/  /'
echo "failing on Samba only:"
comm -13 "$logs/aquifer.failed" "$logs/samba.failed" | sed 's/^/  /'
