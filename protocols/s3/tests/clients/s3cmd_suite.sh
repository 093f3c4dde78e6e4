#!/usr/bin/env bash
# Aquifer's S3 adapter driven by s3cmd: mb/put/get/ls/info/cp/del/sync and multipart uploads
# (5 MiB chunks), path-style, SigV4, plain HTTP.
set -euo pipefail
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
hostport=${ENDPOINT#http://}
cat > "$work/s3cfg" <<CFG
[default]
access_key = $ACCESS
secret_key = $SECRET
host_base = $hostport
host_bucket = $hostport
bucket_location = us-east-1
use_https = False
signature_v2 = False
check_ssl_certificate = False
guess_mime_type = False
progress_meter = True
CFG
s3() { s3cmd -c "$work/s3cfg" "$@"; }
# `! cmd` never trips `set -e`; this does.
fails() { if "$@"; then echo "unexpectedly succeeded: $*" >&2; exit 1; fi; }
mkdir -p "$work/src/sub/deeper"
head -c 17000000 /dev/urandom > "$work/src/big.bin"   # four 5 MiB-chunk parts
echo hello > "$work/src/sub/hello.txt"
echo deeper > "$work/src/sub/deeper/x.txt"
s3 mb s3://s3cmdbucket
# (Output to a file first: grep -q exiting early would break s3cmd's pipe under pipefail.)
s3 ls > "$work/buckets"
grep -q 's3://s3cmdbucket$' "$work/buckets"
# Multipart put; s3cmd checks the md5-of-md5s ETag itself, then we compare bytes on the way back.
s3 put --multipart-chunk-size-mb=5 "$work/src/big.bin" s3://s3cmdbucket/one/big.bin | tee "$work/put.log"
grep -q 'part 4 of 4' "$work/put.log"
s3 info s3://s3cmdbucket/one/big.bin | tee "$work/info"
grep -Eq 'File size: *17000000' "$work/info"
# s3cmd prints the MD5 it stored in its own metadata; the server's ETag is in the debug trace.
s3 -d info s3://s3cmdbucket/one/big.bin > "$work/trace" 2>&1
grep -Eq "'etag': '\"[0-9a-f]{32}-4\"'" "$work/trace"
grep -q "md5:$(md5sum < "$work/src/big.bin" | cut -c1-32)" "$work/info"
s3 get s3://s3cmdbucket/one/big.bin "$work/big.copy"
cmp "$work/src/big.bin" "$work/big.copy"
# Single-part put with metadata and content type; the ETag is the MD5 of the bytes.
s3 put --add-header=x-amz-meta-colour:teal --mime-type=text/plain "$work/src/sub/hello.txt" s3://s3cmdbucket/hello.txt
s3 info s3://s3cmdbucket/hello.txt > "$work/info2"
grep -q "$(md5sum < "$work/src/sub/hello.txt" | cut -c1-32)" "$work/info2"
grep -Eq 'x-amz-meta-colour: *teal' "$work/info2"
grep -Eq 'MIME type: *text/plain' "$work/info2"
s3 cp s3://s3cmdbucket/hello.txt s3://s3cmdbucket/copy/hello.txt
s3 get s3://s3cmdbucket/copy/hello.txt "$work/hello.copy"
cmp "$work/src/sub/hello.txt" "$work/hello.copy"
# Sync up (s3cmd compares sizes and MD5s against the listing), again with nothing to do, and down.
s3 sync --multipart-chunk-size-mb=5 "$work/src/" s3://s3cmdbucket/tree/
s3 ls -r s3://s3cmdbucket/tree/ | awk '{print $4}' | sort > "$work/listed"
printf 's3://s3cmdbucket/tree/big.bin\ns3://s3cmdbucket/tree/sub/deeper/x.txt\ns3://s3cmdbucket/tree/sub/hello.txt\n' | diff - "$work/listed"
s3 sync --multipart-chunk-size-mb=5 "$work/src/" s3://s3cmdbucket/tree/ > "$work/resync.log"
fails grep -q "upload:" "$work/resync.log"
echo changed > "$work/src/sub/hello.txt"
s3 sync --multipart-chunk-size-mb=5 "$work/src/" s3://s3cmdbucket/tree/ > "$work/resync2.log"
grep -c "upload:" "$work/resync2.log" | grep -qx 1
s3 sync s3://s3cmdbucket/tree/ "$work/back/"
diff -r "$work/src" "$work/back"
# A directory listing with the delimiter shows the common prefix.
s3 ls s3://s3cmdbucket/tree/ > "$work/top"
grep -q 'DIR.*s3://s3cmdbucket/tree/sub/$' "$work/top"
# Delete one, then everything, then the bucket.
s3 del s3://s3cmdbucket/hello.txt
fails s3 info s3://s3cmdbucket/hello.txt > /dev/null 2>&1
s3 del --recursive --force s3://s3cmdbucket/
test -z "$(s3 ls -r s3://s3cmdbucket/)"
s3 rb s3://s3cmdbucket
s3 ls > "$work/buckets"
fails grep -q s3cmdbucket "$work/buckets"
echo "s3cmd suite passed"
