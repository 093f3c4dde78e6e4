#!/usr/bin/env bash
# Aquifer's S3 adapter driven by rclone: copy, check (MD5 against ETags), sync, purge.
set -euo pipefail
# A CA bundle from the environment makes rclone refuse its plain-HTTP transport.
unset AWS_CA_BUNDLE
export RCLONE_CONFIG=/dev/null
export RCLONE_CONFIG_AQ_TYPE=s3 RCLONE_CONFIG_AQ_PROVIDER=Other RCLONE_CONFIG_AQ_ENV_AUTH=false
export RCLONE_CONFIG_AQ_ACCESS_KEY_ID="$ACCESS" RCLONE_CONFIG_AQ_SECRET_ACCESS_KEY="$SECRET"
export RCLONE_CONFIG_AQ_ENDPOINT="$ENDPOINT" RCLONE_CONFIG_AQ_FORCE_PATH_STYLE=true
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/a/b"
head -c 7000000 /dev/urandom > "$work/src/a/b/blob"
echo one > "$work/src/one.txt"; echo dash > "$work/src/a-b.txt"
rclone mkdir aq:rcbucket
rclone copy "$work/src" aq:rcbucket/data
rclone check "$work/src" aq:rcbucket/data
echo changed > "$work/src/one.txt"
rclone sync "$work/src" aq:rcbucket/data
rclone copy aq:rcbucket/data "$work/back"
diff -r "$work/src" "$work/back"
test "$(rclone lsf -R aq:rcbucket/data | sort | tr '\n' ' ')" = "a-b.txt a/ a/b/ a/b/blob one.txt "
rclone purge aq:rcbucket
echo "rclone suite passed"
