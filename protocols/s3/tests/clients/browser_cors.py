"""A web page as an S3 client in Chromium: a bucket's CORS configuration lets a page from one
origin upload with a presigned PUT and with a browser upload form (presigned POST) and read
the object back (its ETag exposed to the page),
while a page from another origin, or a request with a header no rule allows, is stopped by
the browser at the preflight and nothing is written. boto3 sets the bucket up and checks
what the server holds. Exits non-zero on the first failed check."""
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading

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


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<!doctype html><title>labelling tool</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def page_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}"


def code(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["Error"]["Code"]
    return None


allowed, other = page_server(), page_server()
s3.create_bucket(Bucket="web")
s3.put_object(Bucket="web", Key="shown.txt", Body=b"for the page")
assert code(lambda: s3.get_bucket_cors(Bucket="web")) == "NoSuchCORSConfiguration"
rules = [{
    "AllowedOrigins": [allowed],
    "AllowedMethods": ["GET", "PUT", "HEAD", "POST"],
    "AllowedHeaders": ["content-type"],
    "ExposeHeaders": ["ETag"],
    "MaxAgeSeconds": 0,
}]
s3.put_bucket_cors(Bucket="web", CORSConfiguration={"CORSRules": rules})
got = s3.get_bucket_cors(Bucket="web")["CORSRules"]
assert got[0]["AllowedOrigins"] == [allowed] and got[0]["ExposeHeaders"] == ["ETag"], got
# A method S3 does not know in a rule: refused, the stored configuration unchanged.
bad = [{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}]
assert code(lambda: s3.put_bucket_cors(Bucket="web", CORSConfiguration={"CORSRules": bad})) == "InvalidRequest"
assert s3.get_bucket_cors(Bucket="web")["CORSRules"][0]["AllowedOrigins"] == [allowed]

body = "uploaded by a page " * 100
put_url = s3.generate_presigned_url("put_object", Params={"Bucket": "web", "Key": "up/from-page.txt", "ContentType": "text/plain"}, ExpiresIn=600)
get_url = s3.generate_presigned_url("get_object", Params={"Bucket": "web", "Key": "up/from-page.txt"}, ExpiresIn=600)
shown_url = s3.generate_presigned_url("get_object", Params={"Bucket": "web", "Key": "shown.txt"}, ExpiresIn=600)
sneaky_url = s3.generate_presigned_url("put_object", Params={"Bucket": "web", "Key": "up/sneaky.txt"}, ExpiresIn=600)
other_url = s3.generate_presigned_url("put_object", Params={"Bucket": "web", "Key": "up/other.txt", "ContentType": "text/plain"}, ExpiresIn=600)
# A browser upload form (presigned POST): a simple request, no preflight; the page reads the
# answer only with the rule's headers.
post = s3.generate_presigned_post("web", "forms/${filename}", Fields={"success_action_status": "201"},
                                  Conditions=[{"success_action_status": "201"}, ["starts-with", "$key", "forms/"]], ExpiresIn=600)

spec = {
    "chromium": os.environ.get("CHROMIUM", "/usr/bin/chromium"),
    "pages": [
        {"origin": allowed, "calls": [
            {"url": put_url, "method": "PUT", "headers": {"Content-Type": "text/plain"}, "body": body},
            {"url": get_url, "method": "GET"},
            # A header no rule allows: the preflight is refused, the PUT never sent.
            {"url": sneaky_url, "method": "PUT", "headers": {"X-Label": "cat"}, "body": "sneaky"},
            {"url": post["url"], "method": "POST", "form": post["fields"], "file": "a form's file"},
        ]},
        {"origin": other, "calls": [
            {"url": shown_url, "method": "GET"},
            {"url": other_url, "method": "PUT", "headers": {"Content-Type": "text/plain"}, "body": "from elsewhere"},
        ]},
    ],
}
here = os.path.dirname(os.path.abspath(__file__))
run = subprocess.run(["node", os.path.join(here, "browser_cors.mjs"), json.dumps(spec)], capture_output=True, text=True, timeout=240)
if run.returncode != 0:
    sys.exit(f"the browser run failed:\n{run.stdout}\n{run.stderr}")
pages = json.loads(run.stdout.strip().splitlines()[-1])
print(json.dumps(pages, indent=1))
(put, get, sneaky, form), (shown, other_put) = pages

md5 = hashlib.md5(body.encode()).hexdigest()
assert put.get("status") == 200, put
assert put["etag"] == f'"{md5}"', put  # exposed to the page by the rule
assert get.get("status") == 200 and get["text"] == body, get
assert "blocked" in sneaky, sneaky
assert form.get("status") == 201 and "<Key>forms/from-form.txt</Key>" in form["text"], form
assert "blocked" in shown, shown
assert "blocked" in other_put, other_put

# What the server holds: the page's upload, nothing from the refused preflights.
obj = s3.get_object(Bucket="web", Key="up/from-page.txt")
assert obj["Body"].read() == body.encode() and obj["ContentType"] == "text/plain", obj
assert s3.get_object(Bucket="web", Key="forms/from-form.txt")["Body"].read() == b"a form's file"
assert code(lambda: s3.head_object(Bucket="web", Key="up/sneaky.txt")) == "404"
assert code(lambda: s3.head_object(Bucket="web", Key="up/other.txt")) == "404"

s3.delete_bucket_cors(Bucket="web")
assert code(lambda: s3.get_bucket_cors(Bucket="web")) == "NoSuchCORSConfiguration"
print("browser CORS suite passed")
