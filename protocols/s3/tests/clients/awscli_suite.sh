#!/usr/bin/env bash
# Aquifer's S3 adapter driven by the AWS CLI: s3 cp/sync/ls/rm and s3api multipart.
set -euo pipefail
export AWS_ACCESS_KEY_ID="$ACCESS" AWS_SECRET_ACCESS_KEY="$SECRET" AWS_DEFAULT_REGION=us-east-1
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
aws() { command aws --endpoint-url "$ENDPOINT" "$@"; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/sub/deeper"
head -c 20000000 /dev/urandom > "$work/src/big.bin"   # multipart in the CLI (8 MiB parts)
echo hello > "$work/src/sub/hello.txt"
echo deeper > "$work/src/sub/deeper/x.txt"
aws s3 mb s3://clibucket
aws s3 cp "$work/src/big.bin" s3://clibucket/one/big.bin
aws s3 cp s3://clibucket/one/big.bin "$work/big.copy"
cmp "$work/src/big.bin" "$work/big.copy"
aws s3 sync "$work/src" s3://clibucket/tree
aws s3 ls s3://clibucket/tree/ --recursive | awk '{print $4}' | sort > "$work/listed"
printf 'tree/big.bin\ntree/sub/deeper/x.txt\ntree/sub/hello.txt\n' | diff - "$work/listed"
# A second sync has nothing to do.
test -z "$(aws s3 sync "$work/src" s3://clibucket/tree)"
aws s3 sync s3://clibucket/tree "$work/back"
diff -r "$work/src" "$work/back"
# s3api multipart by hand.
id=$(aws s3api create-multipart-upload --bucket clibucket --key mp/obj --query UploadId --output text)
head -c 5242880 /dev/urandom > "$work/p1"; echo tail > "$work/p2"
e1=$(aws s3api upload-part --bucket clibucket --key mp/obj --part-number 1 --upload-id "$id" --body "$work/p1" --query ETag --output text)
e2=$(aws s3api upload-part --bucket clibucket --key mp/obj --part-number 2 --upload-id "$id" --body "$work/p2" --query ETag --output text)
aws s3api list-parts --bucket clibucket --key mp/obj --upload-id "$id" --query 'Parts[].PartNumber' --output text | grep -q '1.*2'
aws s3api complete-multipart-upload --bucket clibucket --key mp/obj --upload-id "$id" \
  --multipart-upload "{\"Parts\":[{\"PartNumber\":1,\"ETag\":$e1},{\"PartNumber\":2,\"ETag\":$e2}]}" > /dev/null
aws s3api get-object --bucket clibucket --key mp/obj "$work/mp.out" > /dev/null
cat "$work/p1" "$work/p2" | cmp - "$work/mp.out"
aws s3 rm s3://clibucket --recursive > /dev/null
test -z "$(aws s3 ls s3://clibucket --recursive)"
aws s3 rb s3://clibucket
echo "awscli suite passed"
