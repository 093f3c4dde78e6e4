#!/bin/bash
# The train benchmark (docs/benchmarks.md): one daemon, small and shard datasets, the loader
# directly through REST and S3 and through aquifer wan-emulator (30 ms each way, 1 Gbit/s).
# AQUIFER_BIN picks the binary (default target/debug/aquifer).
set -e
B=${AQUIFER_BIN:-target/debug/aquifer}
T=$(mktemp -d); D=$T/data
export AQUIFER_ADMIN_PASSWORD=bench-password AQUIFER_PASSWORD=bench-password AQUIFER_S3_ACCESS_KEY=BENCHKEY AQUIFER_S3_SECRET_KEY=benchsecret AQUIFER_LOG=warn
$B serve --data-dir $D --rest 127.0.0.1:0 --s3 127.0.0.1:0 --nfs 127.0.0.1:0 --sftp 127.0.0.1:0 --fabric 127.0.0.1:0 --smb 127.0.0.1:0 --drive-size 256MiB > $T/serve.log 2>&1 &
SP=$!
for i in $(seq 600); do grep -q 'Aquifer is serving' $T/serve.log && break; sleep 0.3; done
REST=$(grep -o 'http://[0-9.:]*' $T/serve.log | head -1 | sed 's|http://||')
S3=$(grep -o 's3://[0-9.:]*' $T/serve.log | head -1 | sed 's|s3://||')
echo "rest $REST s3 $S3"
$B bench dataset --rest $REST --path /bench/small --layout small --count 2000 --sample-bytes 100KiB
$B bench dataset --rest $REST --path /bench/shards --layout shard --count 2600 --sample-bytes 100KiB --shard-bytes 64MiB
$B wan-emulator --listen 127.0.0.1:0 --target $REST --delay-ms 30 --bandwidth-mbit 1000 > $T/wan.log &
WP=$!
sleep 1
WAN=$(awk '{print $4}' $T/wan.log | head -1)
echo "wan $WAN"
for layout in small shards; do
  echo "== $layout direct"; $B bench train --via rest --endpoint $REST --path /bench/$layout --workers 4 --batch 32 --compute-ms 100 --shuffle --batches 50 --quiet
  echo "== $layout direct s3"; $B bench train --via s3 --endpoint $S3 --path bench/$layout --workers 4 --batch 32 --compute-ms 100 --shuffle --batches 50 --quiet
  echo "== $layout wan"; $B bench train --via rest --endpoint $WAN --path /bench/$layout --workers 4 --batch 32 --compute-ms 100 --shuffle --batches 20 --quiet
done
kill $WP; kill $SP; wait $SP || true
rm -rf $T
