"""Aquifer's S3 adapter driven by the client under PyTorch's S3 connector
(`s3torchconnectorclient`: Mountpoint's Rust S3 client on the AWS CRT, an HTTP stack and
signer other than boto3's). Does what S3MapDataset, S3IterableDataset and S3Checkpoint do
through it: streamed multipart writes of shards and checkpoints, listing by prefix across
pages, whole and ranged reads, HEAD, copy, delete, and the errors a loader sees.
Exits non-zero on the first failed check."""
import hashlib
import os

import boto3
from botocore.client import Config
from s3torchconnectorclient._mountpoint_s3_client import MountpointS3Client, S3Exception

os.environ["AWS_ACCESS_KEY_ID"] = os.environ["ACCESS"]
os.environ["AWS_SECRET_ACCESS_KEY"] = os.environ["SECRET"]
os.environ.pop("AWS_SESSION_TOKEN", None)
ENDPOINT = os.environ["ENDPOINT"]
PART = 5 * 1024 * 1024

client = MountpointS3Client(region="us-east-1", endpoint=ENDPOINT, force_path_style=True,
                            part_size=PART, max_attempts=1)
# boto3 only to make the bucket and to check what the connector wrote.
s3 = boto3.client("s3", endpoint_url=ENDPOINT, region_name="us-east-1",
                  aws_access_key_id=os.environ["ACCESS"], aws_secret_access_key=os.environ["SECRET"],
                  config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"))
B = "torch-data"
s3.create_bucket(Bucket=B)


def data(n, seed):
    block = hashlib.sha256(b"%d" % seed).digest() * 8
    return (block * (n // len(block) + 1))[:n]


def write(key, body, piece=1 << 20):
    w = client.put_object(B, key)
    for i in range(0, len(body), piece):
        w.write(body[i:i + piece])
    w.close()


def read(key, start=None, end=None):
    return b"".join(client.get_object(B, key, start, end))


# Shards: one below a part, one of several parts (a multipart upload by the CRT), and an
# empty one; then every sample of a map-style dataset.
shards = {
    "train/shard-00000.tar": data(300_000, 1),
    "train/shard-00001.tar": data(3 * PART + 12_345, 2),
    "train/shard-00002.tar": b"",
}
for k, v in shards.items():
    write(k, v)
samples = {"train/samples/%04d.jpg" % i: data(1000 + 37 * i, 100 + i) for i in range(120)}
for k, v in samples.items():
    write(k, v, piece=4096)
write("val/shard-00000.tar", data(4096, 9))

for k, v in shards.items():
    assert read(k) == v, k
    h = client.head_object(B, k)
    assert h.size == len(v), (k, h.size)
    # What boto3 sees is the same object: bytes, size, and an ETag of S3's form.
    o = s3.get_object(Bucket=B, Key=k)
    assert o["Body"].read() == v and o["ContentLength"] == len(v), k
    assert h.etag.strip('"') == o["ETag"].strip('"'), (h.etag, o["ETag"])
big = shards["train/shard-00001.tar"]
assert client.head_object(B, "train/shard-00001.tar").etag.strip('"').endswith("-4"), "multipart ETag"
# The connector writes every object as a multipart upload, so one part has ETag md5(md5)-1.
one = hashlib.md5(hashlib.md5(shards["train/shard-00000.tar"]).digest()).hexdigest() + "-1"
assert client.head_object(B, "train/shard-00000.tar").etag.strip('"') == one

# Ranged reads, as S3Reader's seek/read does: inside a part, across part boundaries, to the end.
for start, end in [(0, 1), (10, 5000), (PART - 100, PART + 100), (2 * PART + 1, 3 * PART + 12_345), (len(big) - 7, len(big))]:
    assert read("train/shard-00001.tar", start, end) == big[start:end], (start, end)

# Listing as S3IterableDataset.from_prefix does: everything under a prefix, in pages.
listed, pages = [], 0
for page in client.list_objects(B, "train/samples/", "", 50):
    pages += 1
    listed += [(o.key, o.size) for o in page.object_info]
assert pages == 3, pages
assert listed == sorted((k, len(v)) for k, v in samples.items()), listed[:3]
tops = [r for r in client.list_objects(B, "", "/")]
assert sorted(p for r in tops for p in r.common_prefixes) == ["train/", "val/"], tops
inner = [o.key for r in client.list_objects(B, "train/", "/") for o in r.object_info]
assert inner == sorted(shards), inner
for k, v in samples.items():
    assert read(k) == v, k

# A checkpoint overwritten in place, copied, then removed.
write("ckpt/epoch.pt", data(2 * PART + 1, 50))
new = data(PART + 3, 51)
write("ckpt/epoch.pt", new)
assert read("ckpt/epoch.pt") == new
client.copy_object(B, "ckpt/epoch.pt", B, "ckpt/best.pt")
assert read("ckpt/best.pt") == new
client.delete_object(B, "ckpt/epoch.pt")
client.delete_object(B, "ckpt/epoch.pt")  # deleting what is gone succeeds, as S3

# Errors a loader must see as errors, not as empty data.
for fn in (lambda: read("ckpt/epoch.pt"), lambda: client.head_object(B, "no/such/key"),
           lambda: b"".join(client.get_object("no-such-bucket", "k"))):
    try:
        fn()
    except S3Exception:
        pass
    else:
        raise AssertionError("expected an S3Exception")
# A key that cannot be a path is refused when the write completes; nothing is stored.
try:
    write("bad//key", b"x")
except S3Exception:
    pass
else:
    raise AssertionError("a key with an empty component was stored")
assert "Contents" not in s3.list_objects_v2(Bucket=B, Prefix="bad")

print("s3torchconnectorclient suite passed")
