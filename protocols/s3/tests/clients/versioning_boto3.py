"""S3 bucket versioning driven by boto3: version ids on PUT, copy and multipart completion,
GET/HEAD/DELETE/tagging/ACL by version id, delete markers, the null version under
Suspended, ListObjectVersions pages with key and version-id markers, DeleteObjects with
versions. Exits non-zero on the first failed check."""
import os

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


def err(fn, **kw):
    try:
        fn(**kw)
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]
    return None


def body(**kw):
    return s3.get_object(**kw)["Body"].read()


def versions(bucket, **kw):
    r = s3.list_object_versions(Bucket=bucket, **kw)
    return r, [(v["Key"], v["VersionId"], v["IsLatest"]) for v in r.get("Versions", [])], [
        (m["Key"], m["VersionId"], m["IsLatest"]) for m in r.get("DeleteMarkers", [])
    ]


B = "ver"
s3.create_bucket(Bucket=B)
assert "Status" not in s3.get_bucket_versioning(Bucket=B)
# A plain object from before versioning is the null version.
s3.put_object(Bucket=B, Key="dir/k", Body=b"plain")
assert "VersionId" not in s3.head_object(Bucket=B, Key="dir/k")
s3.put_bucket_versioning(Bucket=B, VersioningConfiguration={"Status": "Enabled"})
assert s3.get_bucket_versioning(Bucket=B)["Status"] == "Enabled"
assert s3.head_object(Bucket=B, Key="dir/k")["VersionId"] == "null"

ids = [s3.put_object(Bucket=B, Key="dir/k", Body=b"v%d" % i)["VersionId"] for i in range(3)]
assert len(set(ids)) == 3 and "null" not in ids, ids
assert body(Bucket=B, Key="dir/k") == b"v2"
assert body(Bucket=B, Key="dir/k", VersionId=ids[0]) == b"v0"
assert body(Bucket=B, Key="dir/k", VersionId="null") == b"plain"
assert s3.head_object(Bucket=B, Key="dir/k", VersionId=ids[1])["VersionId"] == ids[1]
assert s3.get_object(Bucket=B, Key="dir/k")["VersionId"] == ids[2]
_, vs, dms = versions(B)
assert vs == [("dir/k", ids[2], True), ("dir/k", ids[1], False), ("dir/k", ids[0], False), ("dir/k", "null", False)], vs
assert dms == []
# Versions that do not exist, and ids that cannot be.
assert err(s3.get_object, Bucket=B, Key="dir/k", VersionId="0" * 32) == (404, "NoSuchVersion")
assert err(s3.get_object, Bucket=B, Key="dir/k", VersionId="not-a-version") == (400, "InvalidArgument")

# Tagging and ACLs by version id touch that version only.
s3.put_object_tagging(Bucket=B, Key="dir/k", VersionId=ids[0], Tagging={"TagSet": [{"Key": "old", "Value": "yes"}]})
assert s3.get_object_tagging(Bucket=B, Key="dir/k", VersionId=ids[0])["TagSet"] == [{"Key": "old", "Value": "yes"}]
assert s3.get_object_tagging(Bucket=B, Key="dir/k")["TagSet"] == []
s3.put_object_acl(Bucket=B, Key="dir/k", VersionId=ids[1], ACL="public-read")
grants = s3.get_object_acl(Bucket=B, Key="dir/k", VersionId=ids[1])["Grants"]
assert any(g["Grantee"].get("URI", "").endswith("AllUsers") for g in grants), grants
grants = s3.get_object_acl(Bucket=B, Key="dir/k")["Grants"]
assert not any(g["Grantee"].get("URI", "").endswith("AllUsers") for g in grants), grants

# Copy from an older version; the copy gets its own version id.
c = s3.copy_object(Bucket=B, Key="copy", CopySource={"Bucket": B, "Key": "dir/k", "VersionId": ids[0]})
assert c["CopySourceVersionId"] == ids[0] and c["VersionId"] not in ids, c
assert body(Bucket=B, Key="copy") == b"v0"

# A delete marker hides the key; removing it brings the newest version back.
d = s3.delete_object(Bucket=B, Key="dir/k")
assert d["DeleteMarker"] is True and d["VersionId"] not in ids, d
marker = d["VersionId"]
assert err(s3.get_object, Bucket=B, Key="dir/k") == (404, "NoSuchKey")
assert err(s3.get_object, Bucket=B, Key="dir/k", VersionId=marker) == (405, "MethodNotAllowed")
assert body(Bucket=B, Key="dir/k", VersionId=ids[2]) == b"v2"
_, vs, dms = versions(B, Prefix="dir/")
assert dms == [("dir/k", marker, True)], dms
assert [v[2] for v in vs] == [False] * 4, vs
d = s3.delete_object(Bucket=B, Key="dir/k", VersionId=marker)
assert d["DeleteMarker"] is True and d["VersionId"] == marker, d
assert body(Bucket=B, Key="dir/k") == b"v2"
# Deleting the current version makes the previous one current; deleting it again succeeds.
s3.delete_object(Bucket=B, Key="dir/k", VersionId=ids[2])
assert body(Bucket=B, Key="dir/k") == b"v1"
s3.delete_object(Bucket=B, Key="dir/k", VersionId=ids[2])

# Multipart completion returns the new version's id.
up = s3.create_multipart_upload(Bucket=B, Key="mp")["UploadId"]
p1 = s3.upload_part(Bucket=B, Key="mp", UploadId=up, PartNumber=1, Body=b"a" * (5 << 20))["ETag"]
p2 = s3.upload_part(Bucket=B, Key="mp", UploadId=up, PartNumber=2, Body=b"b" * 100)["ETag"]
done = s3.complete_multipart_upload(Bucket=B, Key="mp", UploadId=up, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": p1}, {"PartNumber": 2, "ETag": p2}]})
assert done["VersionId"] == s3.head_object(Bucket=B, Key="mp")["VersionId"], done

# Suspended: writes replace the null version, others stay.
s3.put_bucket_versioning(Bucket=B, VersioningConfiguration={"Status": "Suspended"})
assert s3.get_bucket_versioning(Bucket=B)["Status"] == "Suspended"
r = s3.put_object(Bucket=B, Key="dir/k", Body=b"s1")
assert "VersionId" not in r, r
s3.put_object(Bucket=B, Key="dir/k", Body=b"s2")
_, vs, _ = versions(B, Prefix="dir/")
assert vs == [("dir/k", "null", True), ("dir/k", ids[1], False), ("dir/k", ids[0], False)], vs
assert body(Bucket=B, Key="dir/k", VersionId="null") == b"s2"
d = s3.delete_object(Bucket=B, Key="dir/k")
assert d["DeleteMarker"] is True and d["VersionId"] == "null", d
_, vs, dms = versions(B, Prefix="dir/")
assert dms == [("dir/k", "null", True)] and [v[1] for v in vs] == [ids[1], ids[0]], (vs, dms)
s3.put_bucket_versioning(Bucket=B, VersioningConfiguration={"Status": "Enabled"})

# Pages of two with key and version-id markers list every version once, in order.
many = [s3.put_object(Bucket=B, Key="p/%d" % (i % 3), Body=b"x")["VersionId"] for i in range(7)]
full = versions(B, Prefix="p/")[1]
assert len(full) == 7
seen, kw = [], {}
while True:
    r, vs, _ = versions(B, Prefix="p/", MaxKeys=2, **kw)
    seen += vs
    if not r["IsTruncated"]:
        break
    kw = {"KeyMarker": r["NextKeyMarker"], "VersionIdMarker": r["NextVersionIdMarker"]}
assert seen == full, (seen, full)
# Common prefixes with a delimiter.
r = s3.list_object_versions(Bucket=B, Delimiter="/")
assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["dir/", "p/"], r
assert [v["Key"] for v in r["Versions"]] == ["copy", "mp"], r

# DeleteObjects with and without versions.
r = s3.delete_objects(Bucket=B, Delete={"Objects": [{"Key": "p/0", "VersionId": v} for v in many[0::3]] + [{"Key": "p/1"}]})
kinds = sorted((d["Key"], d.get("VersionId"), d.get("DeleteMarker", False)) for d in r["Deleted"])
assert len(kinds) == 4 and kinds[-1][0] == "p/1" and kinds[-1][2] is True and "DeleteMarkerVersionId" in r["Deleted"][-1], r
assert err(s3.get_object, Bucket=B, Key="p/0") == (404, "NoSuchKey")
assert err(s3.get_object, Bucket=B, Key="p/1") == (404, "NoSuchKey")

# The bucket is not empty while versions remain; emptied version by version it goes.
assert err(s3.delete_bucket, Bucket=B) == (409, "BucketNotEmpty")
while True:
    r = s3.list_object_versions(Bucket=B)
    todo = [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in r.get("Versions", []) + r.get("DeleteMarkers", [])]
    if not todo:
        break
    s3.delete_objects(Bucket=B, Delete={"Objects": todo})
s3.delete_bucket(Bucket=B)
print("versioning suite passed")
