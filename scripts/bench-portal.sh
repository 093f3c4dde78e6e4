#!/usr/bin/env bash
# Portal benchmarks (docs/benchmarks.md, "Portals"), from one run:
#  1. `aquifer bench train` on the hub directly vs on a spoke through `aquifer wan-emulator`
#     (one-way delay DELAY_MS, default 30 = 60 ms round trip; cap BANDWIDTH_MBIT, default 1000),
#     for a small-sample and a shard dataset;
#  2. bytes over the WAN for 5 versions of a 256 MiB checkpoint (about 10 % of bytes changed
#     between versions), each read through the spoke, against a plain copy of each version.
# Usage: bash scripts/bench-portal.sh   (AQUIFER_BIN to use another binary; KEEP_BATCHES=PREFIX
# keeps each run's per-batch lines in PREFIX-LAYOUT-SIDE.txt; SKIP_CHECKPOINT=1 skips part 2)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${AQUIFER_BIN:-${CARGO_TARGET_DIR:-/var/cache/aquifer-target}/debug/aquifer}
[[ -x "$bin" ]] || { echo "no aquifer binary at $bin: build the workspace first" >&2; exit 1; }
DELAY_MS=${DELAY_MS:-30}
BANDWIDTH_MBIT=${BANDWIDTH_MBIT:-1000}
work=$(mktemp -d /tmp/aquifer-portal-bench.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
export AQUIFER_ADMIN_PASSWORD="bench-admin-$RANDOM$RANDOM" AQUIFER_PASSWORD AQUIFER_LOG=warn
AQUIFER_PASSWORD=$AQUIFER_ADMIN_PASSWORD

start() { # name -> sets ${name}_rest ${name}_fabric
  local name=$1
  "$bin" serve --data-dir "$work/$name" --rest 127.0.0.1:0 --s3 127.0.0.1:0 --nfs 127.0.0.1:0 \
    --sftp 127.0.0.1:0 --smb 127.0.0.1:0 --fabric 127.0.0.1:0 --drive-size 2GiB --region bench \
    > "$work/$name.out" 2> "$work/$name.log" &
  pids+=($!)
  for _ in $(seq 1 3000); do
    grep -q "^Aquifer is serving" "$work/$name.out" 2>/dev/null && break
    sleep 0.1
  done
  grep -q "^Aquifer is serving" "$work/$name.out" || { echo "$name did not start:" >&2; tail -n 20 "$work/$name.log" >&2; exit 1; }
  printf -v "${name}_rest" '%s' "$(sed -n 's|.*REST API and file API at http://\([^/]*\)/.*|\1|p' "$work/$name.out")"
  printf -v "${name}_fabric" '%s' "$(sed -n 's|^Fabric at fabric://\([^ ]*\) .*|\1|p' "$work/$name.out")"
}
start hub
start spoke
# shellcheck disable=SC2154
echo "hub REST $hub_rest fabric $hub_fabric; spoke REST $spoke_rest" >&2
"$bin" wan-emulator --listen 127.0.0.1:0 --target "$hub_fabric" --delay-ms "$DELAY_MS" \
  --bandwidth-mbit "$BANDWIDTH_MBIT" --control 127.0.0.1:0 > "$work/wan.out" &
pids+=($!)
for _ in $(seq 1 100); do [[ -s "$work/wan.out" ]] && break; sleep 0.1; done
wan=$(awk 'NR==1{print $4}' "$work/wan.out")
control=$(sed -n '1s/.*control \([0-9.:]*\)).*/\1/p' "$work/wan.out")
wan_status() { python3 - "$control" <<'PY'
import json, socket, sys
h, p = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((h, int(p)))
s.sendall(b"status\n")
line = s.makefile().readline()
print(json.loads(line[3:])["bytes_down"])
PY
}

"$bin" bench dataset --rest "$hub_rest" --path /bench/small --layout small --count 2000 --sample-bytes 100KiB > /dev/null
"$bin" bench dataset --rest "$hub_rest" --path /bench/shard --layout shard --count 1280 --sample-bytes 512KiB --shard-bytes 64MiB > /dev/null
id=$("$bin" portal create --rest "$spoke_rest" --hub "$wan" --hub-path /bench --spoke-path /bench --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
"$bin" portal authorize "$id" --rest "$hub_rest" > /dev/null
for _ in $(seq 1 300); do
  state=$("$bin" portal show "$id" --rest "$spoke_rest" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  [[ $state == active ]] && break
  sleep 0.1
done
[[ $state == active ]] || { echo "portal did not become active" >&2; exit 1; }


train() { # endpoint path layout [keep-as] -> final JSON line
  "$bin" bench train --via rest --endpoint "$1" --path "$2" --layout "$3" --workers 8 --batch 16 \
    --compute-ms 100 > "$work/train.out" 2> "$work/train.err" || { echo "bench train failed:" >&2; tail -n 5 "$work/train.err" "$work/train.out" >&2; exit 1; }
  [[ -n "${4:-}" && -n "${KEEP_BATCHES:-}" ]] && cp "$work/train.out" "$KEEP_BATCHES-$4.txt"
  grep '^{' "$work/train.out" | tail -1
}
report() { python3 - "$@" <<'PY'
import json, sys
layout, hub, spoke = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
def after(j): return j["throughput_after_warmup_samples_per_s"] or j["throughput_samples_per_s"]
print(f"| {layout} | {hub['batches']} | {hub['throughput_samples_per_s']:.0f} | {spoke['throughput_samples_per_s']:.0f} | "
      f"{after(spoke)/after(hub):.2f}x | {hub['accelerator_utilization']:.3f} | {spoke['accelerator_utilization']:.3f} | "
      f"{hub['warmup_batches']} | {spoke['warmup_batches']} |")
PY
}
echo "| layout | batches | hub samples/s | spoke samples/s | spoke/hub after warm-up | hub util | spoke util | hub warm-up | spoke warm-up |"
echo "|---|---|---|---|---|---|---|---|---|"
for layout in shard small; do
  h=$(train "$hub_rest" "/bench/$layout" "$layout" "$layout-hub")
  before=$(wan_status)
  s=$(train "$spoke_rest" "/bench/$layout" "$layout" "$layout-spoke")
  after_b=$(wan_status)
  report "$layout" "$h" "$s"
  echo "  ($layout: $(( (after_b - before) >> 20 )) MiB over the WAN)" >&2
done

# Checkpoint versions: written on the hub, read in turn through the spoke.
[[ -n "${SKIP_CHECKPOINT:-}" ]] && exit 0
python3 - "$hub_rest" "$spoke_rest" "$control" "$AQUIFER_PASSWORD" <<'PY'
import base64, json, random, socket, sys, urllib.request
hub, spoke, control, pw = sys.argv[1:5]
auth = "Basic " + base64.b64encode(f"admin:{pw}".encode()).decode()
def req(method, url, data=None):
    r = urllib.request.Request(url, data=data, method=method, headers={"Authorization": auth})
    with urllib.request.urlopen(r, timeout=600) as resp:
        return resp.read()
def down():
    h, p = control.rsplit(":", 1)
    s = socket.create_connection((h, int(p)))
    s.sendall(b"status\n")
    return json.loads(s.makefile().readline()[3:])["bytes_down"]
size = 256 << 20
rng = random.Random(42)
data = bytearray(b"".join(rng.randbytes(1 << 20) for _ in range(size >> 20)))
total, plain = 0, 0
print("| version | bytes changed | WAN bytes | plain copy |")
print("|---|---|---|---|")
for v in range(5):
    changed = 0
    if v:
        # ~10 % of the bytes, in 64 runs of random length at random places
        while changed < size // 10:
            n = rng.randrange(64 << 10, 1 << 20)
            at = rng.randrange(0, size - n)
            data[at:at + n] = rng.randbytes(n)
            changed += n
    req("PUT", f"http://{hub}/api/v1/files/bench/ckpt/model.pt", bytes(data))
    b0 = down()
    got = None
    for _ in range(100):
        got = req("GET", f"http://{spoke}/api/v1/files/bench/ckpt/model.pt")
        if got == bytes(data):
            break
        import time; time.sleep(0.2)
    assert got == bytes(data), f"version {v} never read back bit-exact through the spoke"
    wan = down() - b0
    total += wan
    plain += size
    print(f"| {v + 1} | {changed / size:.0%} | {wan / 2**20:.1f} MiB | {size / 2**20:.0f} MiB |")
print(f"\nFive versions: {total / 2**20:.0f} MiB over the WAN vs {plain / 2**20:.0f} MiB copied plainly: {1 - total / plain:.0%} fewer bytes")
PY
