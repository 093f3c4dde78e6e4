"""Aquifer's S3 adapter driven by boto3: ranged GET, multipart with 4 parts, GetObjectAttributes, copy across
buckets, delete-many, presigned GET/PUT, conditional requests, tagging, listing pages.
Exits non-zero on the first failed check."""
import hashlib
import os
import sys
import urllib.request

import boto3
from botocore.client import Config
from botocore.exceptions import ClientError

s3 = boto3.client(
    "s3",
    endpoint_url=os.environ["ENDPOINT"],
    aws_access_key_id=os.environ["ACCESS"],
    aws_secret_access_key=os.environ["SECRET"],
    region_name="us-east-1",
    config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"),
)


def code(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["Error"]["Code"]
    return None


def data(n, seed):
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


s3.create_bucket(Bucket="alpha")
s3.create_bucket(Bucket="beta")
s3.put_object(Bucket="alpha", Key="kept", Body=b"kept")
# Re-creating one's own bucket succeeds, as in us-east-1, and keeps its contents.
assert code(lambda: s3.create_bucket(Bucket="alpha")) is None
assert s3.get_object(Bucket="alpha", Key="kept")["Body"].read() == b"kept"
s3.delete_object(Bucket="alpha", Key="kept")
names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
assert names == ["alpha", "beta"], names

# Put, metadata, content type, ranged GET.
body = data(300_000, 1)
r = s3.put_object(Bucket="alpha", Key="dir/obj.bin", Body=body, ContentType="application/x-test", Metadata={"Color": "blue"})
assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest(), r["ETag"]
h = s3.head_object(Bucket="alpha", Key="dir/obj.bin")
assert h["ContentLength"] == len(body) and h["ContentType"] == "application/x-test", h
assert h["Metadata"] == {"color": "blue"}, h["Metadata"]
g = s3.get_object(Bucket="alpha", Key="dir/obj.bin", Range="bytes=1000-1999")
assert g["Body"].read() == body[1000:2000] and g["ContentRange"] == "bytes 1000-1999/300000", g["ContentRange"]
assert s3.get_object(Bucket="alpha", Key="dir/obj.bin", Range="bytes=-10")["Body"].read() == body[-10:]
assert code(lambda: s3.get_object(Bucket="alpha", Key="dir/obj.bin", Range="bytes=400000-")) == "InvalidRange"
assert code(lambda: s3.get_object(Bucket="alpha", Key="nope")) == "NoSuchKey"
assert code(lambda: s3.get_object(Bucket="gamma", Key="nope")) == "NoSuchBucket"

# Conditional requests.
etag = h["ETag"]
assert code(lambda: s3.get_object(Bucket="alpha", Key="dir/obj.bin", IfMatch='"0000"')) == "PreconditionFailed"
assert s3.get_object(Bucket="alpha", Key="dir/obj.bin", IfMatch=etag)["Body"].read() == body
assert code(lambda: s3.get_object(Bucket="alpha", Key="dir/obj.bin", IfNoneMatch=etag)) == "304"
assert code(lambda: s3.get_object(Bucket="alpha", Key="dir/obj.bin", IfModifiedSince=h["LastModified"])) == "304"
assert code(lambda: s3.put_object(Bucket="alpha", Key="dir/obj.bin", Body=b"x", IfNoneMatch="*")) == "PreconditionFailed"

# Multipart: 4 parts (3 of 5 MiB, a short last one).
parts_data = [data(5 << 20, 10 + i) for i in range(3)] + [data(12345, 20)]
up = s3.create_multipart_upload(Bucket="alpha", Key="big/blob", ContentType="application/x-big")
uid = up["UploadId"]
assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket="alpha")["Uploads"]] == [uid]
done = []
for i, p in enumerate(parts_data, start=1):
    r = s3.upload_part(Bucket="alpha", Key="big/blob", UploadId=uid, PartNumber=i, Body=p)
    done.append({"PartNumber": i, "ETag": r["ETag"]})
listed = s3.list_parts(Bucket="alpha", Key="big/blob", UploadId=uid)["Parts"]
assert [(p["PartNumber"], p["Size"]) for p in listed] == [(i + 1, len(p)) for i, p in enumerate(parts_data)], listed
r = s3.complete_multipart_upload(Bucket="alpha", Key="big/blob", UploadId=uid, MultipartUpload={"Parts": done})
want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts_data)).hexdigest() + "-4"
assert r["ETag"] == '"%s"' % want, (r["ETag"], want)
whole = b"".join(parts_data)
g = s3.get_object(Bucket="alpha", Key="big/blob")
assert g["ETag"] == '"%s"' % want and g["ContentType"] == "application/x-big"
assert hashlib.md5(g["Body"].read()).digest() == hashlib.md5(whole).digest()
assert s3.list_multipart_uploads(Bucket="alpha").get("Uploads", []) == []
# GET and HEAD by part number: each part's bytes, with the part count.
off = 0
for i, p in enumerate(parts_data, start=1):
    g = s3.get_object(Bucket="alpha", Key="big/blob", PartNumber=i)
    assert g["Body"].read() == p and g["PartsCount"] == 4, i
    assert g["ContentRange"] == "bytes %d-%d/%d" % (off, off + len(p) - 1, len(whole)), g["ContentRange"]
    h = s3.head_object(Bucket="alpha", Key="big/blob", PartNumber=i)
    assert h["ContentLength"] == len(p) and h["PartsCount"] == 4, h
    off += len(p)
try:
    s3.get_object(Bucket="alpha", Key="big/blob", PartNumber=5)
    raise AssertionError("part 5 of 4 was served")
except ClientError as e:
    assert e.response["Error"]["Code"] == "InvalidPartNumber" and e.response["ResponseMetadata"]["HTTPStatusCode"] == 416, e.response
assert code(lambda: s3.get_object(Bucket="alpha", Key="big/blob", PartNumber=1, Range="bytes=0-1")) == "InvalidRequest"
# GetObjectAttributes: the ETag unquoted (as S3 sends it there), size, class, part count.
attrs = ["ETag", "ObjectSize", "StorageClass", "ObjectParts"]
a = s3.get_object_attributes(Bucket="alpha", Key="big/blob", ObjectAttributes=attrs)
assert (a["ETag"], a["ObjectSize"], a["StorageClass"], a["ObjectParts"]["TotalPartsCount"]) == (want, len(whole), "STANDARD", 4), a
# An object put whole is one part.
put = s3.put_object(Bucket="alpha", Key="small", Body=b"tiny")
assert s3.get_object(Bucket="alpha", Key="small", PartNumber=1)["Body"].read() == b"tiny"
a = s3.get_object_attributes(Bucket="alpha", Key="small", ObjectAttributes=attrs)
assert (a["ETag"], a["ObjectSize"], a["StorageClass"]) == (put["ETag"].strip('"'), 4, "STANDARD") and "ObjectParts" not in a, a
a = s3.get_object_attributes(Bucket="alpha", Key="small", ObjectAttributes=["ObjectSize"])
assert a["ObjectSize"] == 4 and "ETag" not in a and "StorageClass" not in a, a
assert code(lambda: s3.get_object_attributes(Bucket="alpha", Key="no-such", ObjectAttributes=attrs)) == "NoSuchKey"
assert code(lambda: s3.get_object_attributes(Bucket="alpha", Key="small", ObjectAttributes=["ETag", "Colour"])) == "InvalidArgument"
assert code(lambda: s3.get_object(Bucket="alpha", Key="small", PartNumber=2)) == "InvalidPartNumber"
s3.delete_object(Bucket="alpha", Key="small")

# Aborted upload and UploadPartCopy.
up2 = s3.create_multipart_upload(Bucket="beta", Key="copied")["UploadId"]
r = s3.upload_part_copy(Bucket="beta", Key="copied", UploadId=up2, PartNumber=1, CopySource={"Bucket": "alpha", "Key": "big/blob"}, CopySourceRange="bytes=0-%d" % ((5 << 20) - 1))
r2 = s3.upload_part(Bucket="beta", Key="copied", UploadId=up2, PartNumber=2, Body=b"tail")
s3.complete_multipart_upload(Bucket="beta", Key="copied", UploadId=up2, MultipartUpload={"Parts": [
    {"PartNumber": 1, "ETag": r["CopyPartResult"]["ETag"]}, {"PartNumber": 2, "ETag": r2["ETag"]}]})
assert s3.get_object(Bucket="beta", Key="copied")["Body"].read() == parts_data[0] + b"tail"
up3 = s3.create_multipart_upload(Bucket="beta", Key="aborted")["UploadId"]
s3.upload_part(Bucket="beta", Key="aborted", UploadId=up3, PartNumber=1, Body=b"abc")
s3.abort_multipart_upload(Bucket="beta", Key="aborted", UploadId=up3)
assert code(lambda: s3.list_parts(Bucket="beta", Key="aborted", UploadId=up3)) == "NoSuchUpload"

# Copy across buckets, metadata copied or replaced.
r = s3.copy_object(Bucket="beta", Key="c1", CopySource={"Bucket": "alpha", "Key": "dir/obj.bin"})
assert r["CopyObjectResult"]["ETag"] == etag
h2 = s3.head_object(Bucket="beta", Key="c1")
assert h2["Metadata"] == {"color": "blue"} and h2["ContentType"] == "application/x-test"
s3.copy_object(Bucket="beta", Key="c2", CopySource={"Bucket": "alpha", "Key": "dir/obj.bin"}, MetadataDirective="REPLACE", Metadata={"k": "v"})
assert s3.head_object(Bucket="beta", Key="c2")["Metadata"] == {"k": "v"}
assert s3.get_object(Bucket="beta", Key="c2")["Body"].read() == body
assert code(lambda: s3.copy_object(Bucket="alpha", Key="dir/obj.bin", CopySource={"Bucket": "alpha", "Key": "dir/obj.bin"})) == "InvalidRequest"

# Tagging.
s3.put_object_tagging(Bucket="beta", Key="c1", Tagging={"TagSet": [{"Key": "team", "Value": "ml"}]})
assert s3.get_object_tagging(Bucket="beta", Key="c1")["TagSet"] == [{"Key": "team", "Value": "ml"}]
h = s3.head_object(Bucket="beta", Key="c1")
assert h["ETag"] == etag  # tags do not change the ETag
# HEAD sends the tag count as GET does.
assert h["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "1", h["ResponseMetadata"]["HTTPHeaders"]
assert s3.get_object(Bucket="beta", Key="c1")["TagCount"] == 1
s3.delete_object_tagging(Bucket="beta", Key="c1")
assert s3.get_object_tagging(Bucket="beta", Key="c1")["TagSet"] == []

# Listing: v2 pages with a continuation token, delimiter, v1 marker, versions.
for i in range(25):
    s3.put_object(Bucket="beta", Key="many/k%02d" % i, Body=b"%d" % i)
s3.put_object(Bucket="beta", Key="many-x", Body=b"x")
keys, token = [], None
while True:
    kw = {"Bucket": "beta", "Prefix": "many", "MaxKeys": 7}
    if token:
        kw["ContinuationToken"] = token
    page = s3.list_objects_v2(**kw)
    keys += [o["Key"] for o in page.get("Contents", [])]
    if not page["IsTruncated"]:
        break
    token = page["NextContinuationToken"]
assert keys == ["many-x"] + ["many/k%02d" % i for i in range(25)], keys
d = s3.list_objects_v2(Bucket="beta", Delimiter="/")
assert [p["Prefix"] for p in d["CommonPrefixes"]] == ["many/"], d
assert [o["Key"] for o in d["Contents"]] == ["c1", "c2", "copied", "many-x"], d["Contents"]
v1 = s3.list_objects(Bucket="beta", Prefix="many/", Marker="many/k20")
assert [o["Key"] for o in v1["Contents"]] == ["many/k%02d" % i for i in range(21, 25)]
# RGW's allow-unordered: Aquifer's order is one it allows; with a delimiter it is refused.
unordered = boto3.client("s3", endpoint_url=os.environ["ENDPOINT"], region_name="us-east-1",
                         aws_access_key_id=os.environ["ACCESS"], aws_secret_access_key=os.environ["SECRET"],
                         config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"))
unordered.meta.events.register("before-call.s3.ListObjects",
                               lambda params, **kw: params.update(url=params["url"] + "&allow-unordered=true"))
assert [o["Key"] for o in unordered.list_objects(Bucket="beta", Prefix="many/", Marker="many/k20")["Contents"]] == ["many/k%02d" % i for i in range(21, 25)]
assert code(lambda: unordered.list_objects(Bucket="beta", Delimiter="/")) == "InvalidArgument"
vers = s3.list_object_versions(Bucket="beta", Prefix="many/k0")
assert all(v["VersionId"] == "null" and v["IsLatest"] for v in vers["Versions"]) and len(vers["Versions"]) == 10

# Delete many, then the prefix is gone.
r = s3.delete_objects(Bucket="beta", Delete={"Objects": [{"Key": "many/k%02d" % i} for i in range(25)] + [{"Key": "never-was"}]})
assert len(r["Deleted"]) == 26 and not r.get("Errors"), r
assert [p["Prefix"] for p in s3.list_objects_v2(Bucket="beta", Delimiter="/").get("CommonPrefixes", [])] == []

# Presigned GET and PUT.
url = s3.generate_presigned_url("get_object", Params={"Bucket": "alpha", "Key": "dir/obj.bin"}, ExpiresIn=300)
assert urllib.request.urlopen(url).read() == body
url = s3.generate_presigned_url("put_object", Params={"Bucket": "alpha", "Key": "presigned.txt"}, ExpiresIn=300)
urllib.request.urlopen(urllib.request.Request(url, data=b"via presigned", method="PUT")).read()
assert s3.get_object(Bucket="alpha", Key="presigned.txt")["Body"].read() == b"via presigned"

# Bucket removal: refused while not empty.
assert code(lambda: s3.delete_bucket(Bucket="beta")) == "BucketNotEmpty"
for k in ["c1", "c2", "copied", "many-x"]:
    s3.delete_object(Bucket="beta", Key=k)
s3.delete_bucket(Bucket="beta")
assert code(lambda: s3.head_bucket(Bucket="beta")) == "404"
print("boto3 suite passed")
