//! Requests S3 clients should never send, or send only when something went wrong: each gets
//! a clear S3 error and leaves nothing behind.

mod common;

use std::time::Duration;

use common::{REGION, amz_ago, base64, error_code, hmac, signing_key, start, uri_encode};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_secret_is_signature_does_not_match() {
    let s = start().await;
    let res = s.signed_with("GET", "/", &[], vec![], &s.access, "not-the-secret-at-all").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(error_code(&res.text().await.unwrap()), "SignatureDoesNotMatch");
    let res = s.signed_with("GET", "/", &[], vec![], "NOSUCHKEY123", "whatever-secret").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(error_code(&res.text().await.unwrap()), "InvalidAccessKeyId");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_reads_need_a_public_read_bucket() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/pub", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/pub/hello.txt", &[], b"hi".to_vec()).await.0, 200);
    let url = format!("{}/pub/hello.txt", s.endpoint());
    let res = s.http.get(&url).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(error_code(&res.text().await.unwrap()), "AccessDenied");
    let res = s.signed("PUT", "/pub", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200, "{}", res.text().await.unwrap());
    // The bucket's public-read opens its listing; an object needs its own (as S3).
    let res = s.http.get(format!("{}/pub?list-type=2", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert!(res.text().await.unwrap().contains("<Key>hello.txt</Key>"));
    let res = s.http.get(&url).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403, "an object without an ACL is private in a public-read bucket");
    // Who may list the bucket learns that a key is not there: 404, as S3 answers.
    let res = s.http.get(format!("{}/pub/nothing-here", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 404);
    assert_eq!(error_code(&res.text().await.unwrap()), "NoSuchKey");
    assert_eq!(s.http.head(format!("{}/pub/nothing-here", s.endpoint())).send().await.unwrap().status().as_u16(), 404);
    let res = s.http.get(format!("{}/pub/nothing-here?versionId=abc", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403, "a version read is not a listing");
    let res = s.signed("PUT", "/pub/hello.txt", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let res = s.http.get(&url).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(res.text().await.unwrap(), "hi");
    // An object put with the canned ACL `private` stays private in a public-read bucket.
    let res = s.signed("PUT", "/pub/secret.txt", &[], b"s".to_vec()).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200, "{}", res.text().await.unwrap());
    let res = s.http.get(format!("{}/pub/secret.txt", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403, "a private object is not anonymously readable");
    assert_eq!(s.call("GET", "/pub/secret.txt", &[], vec![]).await.0, 200, "its owner reads it");
    // Also when it is empty (no bytes to read, so no read to refuse), for GET and HEAD.
    let res = s.signed("PUT", "/pub/empty-secret", &[], vec![]).header("x-amz-acl", "private").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let res = s.http.get(format!("{}/pub/empty-secret", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403, "an empty private object is not anonymously readable");
    assert_eq!(error_code(&res.text().await.unwrap()), "AccessDenied");
    let res = s.http.head(format!("{}/pub/empty-secret", s.endpoint())).send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    assert_eq!(s.call("GET", "/pub/empty-secret", &[], vec![]).await, (200, String::new()));
    // authenticated-read: signed-in users only, not anonymous clients of a public-read bucket.
    let res = s.signed("PUT", "/pub/other.txt", &[], b"s".to_vec()).header("x-amz-acl", "authenticated-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    assert_eq!(s.http.get(format!("{}/pub/other.txt", s.endpoint())).send().await.unwrap().status().as_u16(), 403);
    let res = s.signed("PUT", "/pub/exec.txt", &[], b"s".to_vec()).header("x-amz-acl", "aws-exec-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 501, "canned ACLs for AWS services are not supported");
    // Reading is all an anonymous client may do.
    let res = s.http.put(&url).body("x").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    let res = s.http.get(s.endpoint() + "/").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 403);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_xml_is_refused() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    let (st, body) = s.call("POST", "/bkt", &[("delete", "")], b"<Delete><Object><Key>x</Key>".to_vec()).await;
    assert_eq!((st, error_code(&body)), (400, "MalformedXML"), "{body}");
    let (st, body) = s.call("POST", "/bkt/k", &[("uploads", "")], vec![]).await;
    assert_eq!(st, 200, "{body}");
    let id = body.split("<UploadId>").nth(1).unwrap().split("</UploadId>").next().unwrap().to_string();
    let (st, body) = s.call("POST", "/bkt/k", &[("uploadId", &id)], b"<CompleteMultipartUpload><Part>".to_vec()).await;
    assert_eq!((st, error_code(&body)), (400, "MalformedXML"), "{body}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_cannot_be_paths_are_refused_clearly() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    let long = format!("/bkt/{}", "k".repeat(1025));
    let (st, body) = s.call("PUT", &long, &[], b"x".to_vec()).await;
    assert_eq!((st, error_code(&body)), (400, "KeyTooLongError"), "{body}");
    let component = format!("/bkt/{}", "c".repeat(256));
    let (st, body) = s.call("PUT", &component, &[], b"x".to_vec()).await;
    assert_eq!((st, error_code(&body)), (400, "KeyTooLongError"), "{body}");
    for bad in ["/bkt/a//c", "/bkt/a/./c", "/bkt/a/../c"] {
        let (st, body) = s.raw("PUT", bad, b"content".to_vec()).await;
        assert_eq!((st, error_code(&body)), (400, "InvalidArgument"), "{bad}: {body}");
        assert!(body.contains("object key refused"), "{bad}: {body}");
    }
    // A file and a directory cannot share a name.
    assert_eq!(s.call("PUT", "/bkt/x/y", &[], b"1".to_vec()).await.0, 200);
    let (st, body) = s.call("PUT", "/bkt/x", &[], b"2".to_vec()).await;
    assert_eq!((st, error_code(&body)), (400, "InvalidArgument"), "{body}");
    let (st, body) = s.call("PUT", "/bkt/x/y/z", &[], b"3".to_vec()).await;
    assert_eq!((st, error_code(&body)), (400, "InvalidArgument"), "{body}");
    // A folder object (tests/cross_protocol.rs) is fine.
    assert_eq!(s.call("PUT", "/bkt/dir/", &[], vec![]).await.0, 200);
    assert_eq!(s.call("HEAD", "/bkt/dir/", &[], vec![]).await.0, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn part_numbers_out_of_range_and_missing_parts_are_refused() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    let (_, body) = s.call("POST", "/bkt/big", &[("uploads", "")], vec![]).await;
    let id = body.split("<UploadId>").nth(1).unwrap().split("</UploadId>").next().unwrap().to_string();
    for n in ["0", "10001", "-1"] {
        let (st, body) = s.call("PUT", "/bkt/big", &[("partNumber", n), ("uploadId", &id)], b"data".to_vec()).await;
        assert_eq!(st, 400, "part {n}: {body}");
        assert_eq!(error_code(&body), "InvalidArgument", "part {n}: {body}");
    }
    let (st, body) = s.call("PUT", "/bkt/big", &[("partNumber", "1"), ("uploadId", &id)], vec![7u8; 5 << 20]).await;
    assert_eq!(st, 200, "{body}");
    let (st, body) = s.call("PUT", "/bkt/big", &[("partNumber", "1"), ("uploadId", "no-such-upload")], b"x".to_vec()).await;
    assert_eq!((st, error_code(&body)), (404, "NoSuchUpload"), "{body}");
    let xml = b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part><Part><PartNumber>2</PartNumber></Part></CompleteMultipartUpload>".to_vec();
    let (st, body) = s.call("POST", "/bkt/big", &[("uploadId", &id)], xml).await;
    assert_eq!((st, error_code(&body)), (400, "InvalidPart"), "{body}");
    let xml = b"<CompleteMultipartUpload><Part><PartNumber>2</PartNumber></Part><Part><PartNumber>1</PartNumber></Part></CompleteMultipartUpload>".to_vec();
    let (st, body) = s.call("POST", "/bkt/big", &[("uploadId", &id)], xml).await;
    assert_eq!((st, error_code(&body)), (400, "InvalidPartOrder"), "{body}");
    // Nothing was published, and the upload is still there to finish.
    assert_eq!(s.call("HEAD", "/bkt/big", &[], vec![]).await.0, 404);
    let xml = b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part></CompleteMultipartUpload>".to_vec();
    let (st, body) = s.call("POST", "/bkt/big", &[("uploadId", &id)], xml).await;
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("-1&quot;") || body.contains("-1\""), "{body}");
    let (st, _) = s.call("HEAD", "/bkt/big", &[], vec![]).await;
    assert_eq!(st, 200);
    s.stop().await;
}

/// Uploads in progress do not keep a bucket: DeleteBucket removes an otherwise empty bucket,
/// aborts its uploads (whoever started them) and frees their parts' space. Objects still
/// keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_bucket_aborts_its_multipart_uploads() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/gone", &[], vec![]).await.0, 200);
    let before = s.used_bytes().await;
    let (_, body) = s.call("POST", "/gone/dir/big", &[("uploads", "")], vec![]).await;
    let id = body.split("<UploadId>").nth(1).unwrap().split("</UploadId>").next().unwrap().to_string();
    let (st, body) = s.call("PUT", "/gone/dir/big", &[("partNumber", "1"), ("uploadId", &id)], vec![9u8; 5 << 20]).await;
    assert_eq!(st, 200, "{body}");
    assert!(s.used_bytes().await > before);
    // An object keeps the bucket, and the refusal aborts nothing.
    assert_eq!(s.call("PUT", "/gone/obj", &[], b"x".to_vec()).await.0, 200);
    let (st, body) = s.call("DELETE", "/gone", &[], vec![]).await;
    assert_eq!((st, error_code(&body)), (409, "BucketNotEmpty"), "{body}");
    let (_, body) = s.call("GET", "/gone", &[("uploads", "")], vec![]).await;
    assert!(body.contains(&id), "{body}");
    assert_eq!(s.call("DELETE", "/gone/obj", &[], vec![]).await.0, 204);
    let (st, body) = s.call("DELETE", "/gone", &[], vec![]).await;
    assert_eq!(st, 204, "{body}");
    assert_eq!(s.call("HEAD", "/gone", &[], vec![]).await.0, 404);
    let (st, body) = s.call("PUT", "/gone/dir/big", &[("partNumber", "2"), ("uploadId", &id)], b"late".to_vec()).await;
    assert!(st == 404, "{st} {body}");
    // A bucket of the same name starts without them, and their space is free.
    assert_eq!(s.call("PUT", "/gone", &[], vec![]).await.0, 200);
    let (_, body) = s.call("GET", "/gone", &[("uploads", "")], vec![]).await;
    assert!(!body.contains("<Upload>"), "{body}");
    let mut used = s.used_bytes().await;
    for _ in 0..100 {
        if used == before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        used = s.used_bytes().await;
    }
    assert_eq!(used, before);
    s.stop().await;
}

/// The head of a signed HTTP/1.1 PUT of `body` to `path`, with `extra` header lines, for
/// tests that write the request to a socket themselves.
fn signed_put_head(s: &common::Server, path: &str, body: &[u8], extra: &str) -> String {
    let req = s.signed("PUT", path, &[], body.to_vec()).build().unwrap();
    let mut head = format!("PUT {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n{extra}", s.addr, body.len());
    for (k, v) in req.headers() {
        head.push_str(&format!("{}: {}\r\n", k, v.to_str().unwrap()));
    }
    head.push_str("\r\n");
    head
}

/// A client that goes away in the middle of a PUT leaves no object and no used space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_put_leaves_nothing_visible_and_no_space_used() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    let before = s.used_bytes().await;
    // Sign a request for an 8 MiB body, send its headers and 3 MiB, then hang up.
    let full = vec![42u8; 8 << 20];
    let head = signed_put_head(&s, "/bkt/dropped", &full, "");
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&full[..3 << 20]).await.unwrap();
    tcp.flush().await.unwrap();
    // Let the server write what it got into the engine before the hang-up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(tcp);
    s.assert_space_returns_to(before).await;
    let (st, body) = s.call("HEAD", "/bkt/dropped", &[], vec![]).await;
    assert_eq!(st, 404, "{body}");
    let (_, body) = s.call("GET", "/bkt", &[("list-type", "2")], vec![]).await;
    assert!(!body.contains("dropped"), "{body}");
    s.stop().await;
}

/// The canned ACL given when a multipart upload starts applies to the completed object, as on
/// PutObject: `private` is owner-only (mode 0600), other canned ACLs are refused up front.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_canned_acl_private_is_owner_only_and_others_are_refused() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/pub", &[], vec![]).await.0, 200);
    let res = s.signed("PUT", "/pub", &[("acl", "")], vec![]).header("x-amz-acl", "public-read").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let res = s.signed("POST", "/pub/other", &[("uploads", "")], vec![]).header("x-amz-acl", "public-read-write").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 501);
    assert_eq!(error_code(&res.text().await.unwrap()), "NotImplemented");
    let (_, body) = s.call("GET", "/pub", &[("uploads", "")], vec![]).await;
    assert!(!body.contains("<Upload>"), "a refused CreateMultipartUpload left an upload: {body}");

    let mut ids = Vec::new();
    for (key, acl) in [("secret", Some("private")), ("open", None)] {
        let mut req = s.signed("POST", &format!("/pub/{key}"), &[("uploads", "")], vec![]);
        if let Some(a) = acl {
            req = req.header("x-amz-acl", a);
        }
        let res = req.send().await.unwrap();
        let body = res.text().await.unwrap();
        let id = body.split("<UploadId>").nth(1).expect("an upload id").split("</UploadId>").next().unwrap().to_string();
        let (st, body) = s.call("PUT", &format!("/pub/{key}"), &[("partNumber", "1"), ("uploadId", &id)], b"payload".to_vec()).await;
        assert_eq!(st, 200, "{body}");
        let xml = b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber></Part></CompleteMultipartUpload>".to_vec();
        let (st, body) = s.call("POST", &format!("/pub/{key}"), &[("uploadId", &id)], xml).await;
        assert_eq!(st, 200, "{body}");
        ids.push(id);
    }
    let anon = |key: &str| s.http.get(format!("{}/pub/{key}", s.endpoint())).send();
    assert_eq!(anon("secret").await.unwrap().status().as_u16(), 403, "a private multipart object is not anonymously readable");
    assert_eq!(anon("open").await.unwrap().status().as_u16(), 403, "without an ACL of its own an object is private, as in S3");
    assert_eq!(s.call("GET", "/pub/secret", &[], vec![]).await, (200, "payload".to_string()), "its owner reads it");
    let modes = s
        .with_engine(|e| {
            let c = storage_engine::Caller::system();
            let b = e.lookup(&c, storage_engine::ROOT_INO, b"pub").unwrap();
            ["secret", "open"].map(|k| e.lookup(&c, b.ino, k.as_bytes()).unwrap().mode & 0o7777)
        })
        .await;
    assert_eq!(modes, [0o600, 0o644]);
    s.stop().await;
}

/// `x-amz-meta-snowball-auto-extract: true` asks for a tar archive to be unpacked into
/// objects; Aquifer does not do that and refuses instead of storing the archive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snowball_auto_extract_is_refused_and_stores_nothing() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    let res = s.signed("PUT", "/bkt/batch.tar", &[], vec![0u8; 1024]).header("x-amz-meta-snowball-auto-extract", "true").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 501);
    assert_eq!(error_code(&res.text().await.unwrap()), "NotImplemented");
    assert_eq!(s.call("HEAD", "/bkt/batch.tar", &[], vec![]).await.0, 404);
    // Any other value is plain user metadata.
    let res = s.signed("PUT", "/bkt/plain.tar", &[], vec![0u8; 16]).header("x-amz-meta-snowball-auto-extract", "false").send().await.unwrap();
    assert_eq!(res.status().as_u16(), 200);
    s.stop().await;
}

/// On later pages a ListObjectsV2 continuation token decides where listing resumes; a
/// StartAfter sent again with it (MinIO's SDK does) must not move the position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuation_token_wins_over_a_repeated_start_after() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    for k in ["a1", "a2", "a3", "b1", "b2"] {
        assert_eq!(s.call("PUT", &format!("/bkt/{k}"), &[], b"x".to_vec()).await.0, 200);
    }
    let keys = |body: &str| body.split("<Key>").skip(1).map(|p| p.split("</Key>").next().unwrap().to_string()).collect::<Vec<_>>();
    let (st, body) = s.call("GET", "/bkt", &[("list-type", "2"), ("max-keys", "2"), ("start-after", "a1")], vec![]).await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(keys(&body), ["a2", "a3"]);
    let token = body.split("<NextContinuationToken>").nth(1).expect("truncated").split("</NextContinuationToken>").next().unwrap().to_string();
    // A start-after that sorts after every key, sent with the token: the token counts.
    for start_after in ["a1", "zzzz"] {
        let q = [("list-type", "2"), ("max-keys", "2"), ("start-after", start_after), ("continuation-token", token.as_str())];
        let (st, body) = s.call("GET", "/bkt", &q, vec![]).await;
        assert_eq!(st, 200, "{body}");
        assert_eq!(keys(&body), ["b1", "b2"], "start-after {start_after}");
    }
    s.stop().await;
}

/// Every response names its request (`x-amz-request-id`), and an error body carries the
/// same id as `<RequestId>`, also for errors raised before the request reaches a handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_the_request_id_of_their_header() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/ids", &[], vec![]).await.0, 200);
    let ok = s.signed("GET", "/ids", &[("list-type", "2")], vec![]).send().await.unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    assert!(ok.headers().get("x-amz-request-id").is_some(), "a success names its request too");
    let mut seen = Vec::new();
    for res in [
        s.signed("GET", "/ids/missing", &[], vec![]).send().await.unwrap(),
        s.signed("GET", "/ids/missing", &[], vec![]).send().await.unwrap(),
        s.signed_with("GET", "/", &[], vec![], &s.access, "not-the-secret-at-all").send().await.unwrap(),
    ] {
        assert!(res.status().is_client_error());
        let header = res.headers().get("x-amz-request-id").expect("x-amz-request-id").to_str().unwrap().to_string();
        let body = res.text().await.unwrap();
        let in_body = body.split("<RequestId>").nth(1).and_then(|r| r.split("</RequestId>").next()).unwrap_or_else(|| panic!("no RequestId in {body}"));
        assert_eq!(in_body, header, "{body}");
        assert!(!error_code(&body).is_empty(), "still an S3 error: {body}");
        seen.push(header);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 3, "each request has its own id");
    s.stop().await;
}

/// A PUT refused before its body is read, sent with `Expect: 100-continue` (as botocore
/// sends PutObject), must not leave the connection in doubt about where the next request
/// starts: a body that arrives after the refusal would be parsed as the next request, which
/// boto3 then saw answered `400 Bad Request` (s3tests' delimiter tests failed one run in three
/// that way). The refusal closes the connection instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_refused_before_its_body_closes_the_connection() {
    use tokio::io::AsyncReadExt;
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/bkt/a", &[], b"file".to_vec()).await.0, 200);
    // `a` is an object, so `a/b` cannot be one: refused with InvalidArgument by the handler.
    let body = b"foo/bar/xyzzy".to_vec();
    let head = signed_put_head(&s, "/bkt/a/b", &body, "expect: 100-continue\r\n");
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut sent_body = false;
    let exchange = async {
        loop {
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before answering: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            if !sent_body && got.starts_with(b"HTTP/1.1 100") {
                // Asked for the body: send it, as a client does.
                tcp.write_all(&body).await.unwrap();
                sent_body = true;
            }
            if got.windows(8).any(|w| w == b"</Error>") {
                break;
            }
        }
        // Whatever the client does next, the server has closed this connection.
        let _ = tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut rest = Vec::new();
        let _ = tcp.read_to_end(&mut rest).await;
        rest
    };
    let rest = tokio::time::timeout(Duration::from_secs(10), exchange).await.expect("the server closed the connection");
    let text = String::from_utf8_lossy(&got).to_lowercase();
    assert!(text.contains(" 400 ") && text.contains("invalidargument"), "{text}");
    assert!(text.contains("connection: close"), "{text}");
    assert!(rest.is_empty(), "answered a request after the refusal: {}", String::from_utf8_lossy(&rest));
    // Nothing was stored, and the service goes on answering on new connections.
    assert_eq!(s.call("HEAD", "/bkt/a/b", &[], vec![]).await.0, 404);
    s.stop().await;
}

/// A body whose Content-MD5 does not match is refused with `400 BadDigest` and leaves the
/// key as it was, for a small body (stored in one step) and a large one (streamed) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_fails_its_content_md5_changes_nothing() {
    use md5::{Digest, Md5};
    let s = start().await;
    assert_eq!(s.call("PUT", "/digest", &[], vec![]).await.0, 200);
    for (key, len) in [("small", 4096usize), ("large", aquifer_s3::SMALL_PUT_BYTES + 70_000)] {
        let body: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let good = base64(&Md5::digest(&body));
        let wrong = base64(&Md5::digest(b"something else"));
        let path = format!("/digest/{key}");
        let res = s.signed("PUT", &path, &[], body.clone()).header("content-md5", wrong.as_str()).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 400, "{key}");
        assert_eq!(error_code(&res.text().await.unwrap()), "BadDigest");
        assert_eq!(s.call("GET", &path, &[], vec![]).await.0, 404, "a refused {key} PUT leaves nothing");
        let res = s.signed("PUT", &path, &[], body.clone()).header("content-md5", good.as_str()).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 200, "{key}");
        let res = s.signed("PUT", &path, &[], b"other".to_vec()).header("content-md5", wrong.as_str()).send().await.unwrap();
        assert_eq!(res.status().as_u16(), 400);
        let res = s.signed("GET", &path, &[], vec![]).send().await.unwrap();
        assert_eq!(res.bytes().await.unwrap().as_ref(), &body[..], "a refused overwrite of {key} keeps the object");
    }
    s.stop().await;
}

/// Reads a socket until the server closes it (at most `limit`): what the server answered.
async fn answer_until_closed(tcp: &mut tokio::net::TcpStream, limit: Duration) -> String {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(limit, tcp.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection was still open after {limit:?}; read so far: {}", String::from_utf8_lossy(&answer));
    String::from_utf8_lossy(&answer).into_owned()
}

/// A PUT whose body stops arriving half-way is answered `400 RequestTimeout` once its body
/// has been idle for the limit, its connection is closed, and it leaves no object and no
/// space used; a body that arrives slowly but steadily is not cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_whose_body_stalls_times_out_and_leaves_nothing() {
    let s = common::start_with(aquifer_s3::S3Options { body_idle_timeout_ms: Some(1_000), ..Default::default() }).await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    let before = s.used_bytes().await;
    let full = vec![42u8; 4 << 20];
    let head = signed_put_head(&s, "/bkt/stalled", &full, "");
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&full[..1 << 20]).await.unwrap();
    let started = std::time::Instant::now();
    let answer = answer_until_closed(&mut tcp, Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("<Code>RequestTimeout</Code>"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(900), "answered after {:?}, before the body was idle for a second", started.elapsed());
    s.assert_space_returns_to(before).await;
    assert_eq!(s.call("HEAD", "/bkt/stalled", &[], vec![]).await.0, 404);

    // Ten bytes, one every 400 ms: slower than the limit in all, never idle for it.
    let body = b"0123456789".to_vec();
    let head = signed_put_head(&s, "/bkt/slow", &body, "");
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(head.as_bytes()).await.unwrap();
    for b in &body {
        tokio::time::sleep(Duration::from_millis(400)).await;
        tcp.write_all(&[*b]).await.unwrap();
    }
    let mut answer = [0u8; 12];
    use tokio::io::AsyncReadExt;
    tcp.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    let (st, got) = s.call("GET", "/bkt/slow", &[], vec![]).await;
    assert_eq!((st, got.as_bytes()), (200, &body[..]));
    s.stop().await;
}

/// A browser upload's form is read before anyone is authenticated: a client that starts one
/// and stops sending gets `400 RequestTimeout` and its connection closed once the body has
/// been idle for the limit, instead of holding the connection for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_form_that_stalls_is_cut_off() {
    let s = common::start_with(aquifer_s3::S3Options { body_idle_timeout_ms: Some(1_000), ..Default::default() }).await;
    assert_eq!(s.call("PUT", "/forms", &[], vec![]).await.0, 200);
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST /forms HTTP/1.1\r\nhost: {}\r\ncontent-type: multipart/form-data; boundary=XyZ\r\ncontent-length: 100000\r\n\r\n--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nhalf",
        s.addr
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let answer = answer_until_closed(&mut tcp, Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("<Code>RequestTimeout</Code>"), "{answer}");
    assert_eq!(s.call("HEAD", "/forms/half", &[], vec![]).await.0, 404);
    s.stop().await;
}

/// A presigned URL for `method` on `path`, signed `ago` seconds ago and valid for `expires`
/// seconds from then.
fn presigned(s: &common::Server, method: &str, path: &str, ago: i64, expires: u32) -> String {
    let (amz_date, day) = amz_ago(ago);
    let scope = format!("{day}/{REGION}/s3/aws4_request");
    let credential = format!("{}/{scope}", s.access);
    let query = format!(
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}&X-Amz-Date={amz_date}&X-Amz-Expires={expires}&X-Amz-SignedHeaders=host",
        uri_encode(&credential, true)
    );
    let canonical = format!("{method}\n{path}\n{query}\nhost:{}\n\nhost\nUNSIGNED-PAYLOAD", s.addr);
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let sig = hex::encode(hmac(&signing_key(&s.secret, &day), to_sign.as_bytes()));
    format!("http://{}{path}?{query}&X-Amz-Signature={sig}", s.addr)
}

/// A presigned URL whose time has passed is refused (`AccessDenied`) for GET and PUT, and the
/// PUT stores nothing; the same URL signed now works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_presigned_urls_are_refused() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/bkt/obj", &[], b"kept".to_vec()).await.0, 200);
    let get = |url: String| async { s.http.get(url).send().await.unwrap() };
    let r = get(presigned(&s, "GET", "/bkt/obj", 0, 300)).await;
    assert_eq!(r.status(), 200, "a fresh presigned GET");
    assert_eq!(&r.bytes().await.unwrap()[..], b"kept");
    for (ago, expires) in [(3600, 60), (120, 60), (8 * 86_400, 7 * 86_400)] {
        let r = get(presigned(&s, "GET", "/bkt/obj", ago, expires)).await;
        let st = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!((st, error_code(&body)), (403, "AccessDenied"), "GET signed {ago} s ago for {expires} s: {body}");
        let r = s.http.put(presigned(&s, "PUT", "/bkt/obj", ago, expires)).body("replaced").send().await.unwrap();
        let st = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!((st, error_code(&body)), (403, "AccessDenied"), "PUT signed {ago} s ago for {expires} s: {body}");
        let r = s.http.put(presigned(&s, "PUT", "/bkt/new", ago, expires)).body("new").send().await.unwrap();
        assert_eq!(r.status(), 403);
    }
    assert_eq!(s.call("GET", "/bkt/obj", &[], vec![]).await, (200, "kept".to_string()));
    assert_eq!(s.call("HEAD", "/bkt/new", &[], vec![]).await.0, 404);
    let r = s.http.put(presigned(&s, "PUT", "/bkt/new", 0, 300)).body("new").send().await.unwrap();
    assert_eq!(r.status(), 200, "a fresh presigned PUT");
    assert_eq!(s.call("GET", "/bkt/new", &[], vec![]).await, (200, "new".to_string()));
    s.stop().await;
}

/// A streaming (`aws-chunked`) PUT of `chunks`, each chunk signed in the chain from the
/// request's own signature; `tamper` names a chunk whose signature is spoiled (the last,
/// empty chunk is number `chunks.len()`). Returns (status, body).
async fn chunked_put(s: &common::Server, path: &str, chunks: &[Vec<u8>], tamper: Option<usize>) -> (u16, String) {
    streaming_put(s, path, chunks, Streaming { signed: true, tamper, trailer: None, sdk_algorithm: None }).await
}

/// How a streaming upload is sent.
#[derive(Clone)]
struct Streaming<'a> {
    /// Chunks signed in the chain (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`), or sent
    /// bare (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`).
    signed: bool,
    /// A chunk whose signature is spoiled (the trailer's is number `chunks.len() + 1`).
    tamper: Option<usize>,
    /// A trailing header (`x-amz-checksum-…`, value), announced in `x-amz-trailer` and, when
    /// signed, followed by its `x-amz-trailer-signature`.
    trailer: Option<(&'a str, String)>,
    /// `x-amz-sdk-checksum-algorithm`, which SDKs send beside the trailer.
    sdk_algorithm: Option<&'a str>,
}

async fn streaming_put(s: &common::Server, path: &str, chunks: &[Vec<u8>], how: Streaming<'_>) -> (u16, String) {
    let (amz_date, day) = amz_ago(0);
    let scope = format!("{day}/{REGION}/s3/aws4_request");
    let key = signing_key(&s.secret, &day);
    let decoded: usize = chunks.iter().map(Vec::len).sum();
    let payload = match (how.signed, how.trailer.is_some()) {
        (true, false) => "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        (true, true) => "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        (false, _) => "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    };
    let mut headers = vec![
        ("content-encoding", "aws-chunked".to_string()),
        ("host", s.addr.to_string()),
        ("x-amz-content-sha256", payload.to_string()),
        ("x-amz-date", amz_date.clone()),
        ("x-amz-decoded-content-length", decoded.to_string()),
    ];
    if let Some(alg) = how.sdk_algorithm {
        headers.push(("x-amz-sdk-checksum-algorithm", alg.to_string()));
    }
    if let Some((name, _)) = &how.trailer {
        headers.push(("x-amz-trailer", name.to_string()));
    }
    let signed_headers = headers.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(";");
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let canonical = format!("PUT\n{path}\n\n{canonical_headers}\n{signed_headers}\n{payload}");
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let mut prev = hex::encode(hmac(&key, to_sign.as_bytes()));
    let auth = format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={prev}", s.access);
    let empty = hex::encode(Sha256::digest(b""));
    let mut body = Vec::new();
    let last = Vec::new();
    for (i, c) in chunks.iter().chain(std::iter::once(&last)).enumerate() {
        if how.signed {
            let to_sign = format!("AWS4-HMAC-SHA256-PAYLOAD\n{amz_date}\n{scope}\n{prev}\n{empty}\n{}", hex::encode(Sha256::digest(c)));
            let mut sig = hex::encode(hmac(&key, to_sign.as_bytes()));
            prev = sig.clone();
            if how.tamper == Some(i) {
                sig.replace_range(0..1, if sig.starts_with('0') { "1" } else { "0" });
            }
            body.extend_from_slice(format!("{:x};chunk-signature={sig}\r\n", c.len()).as_bytes());
        } else {
            body.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        }
        body.extend_from_slice(c);
        if !c.is_empty() || how.trailer.is_none() {
            body.extend_from_slice(b"\r\n");
        }
    }
    if let Some((name, value)) = &how.trailer {
        body.extend_from_slice(format!("{name}:{value}\r\n").as_bytes());
        if how.signed {
            let to_sign = format!("AWS4-HMAC-SHA256-TRAILER\n{amz_date}\n{scope}\n{prev}\n{}", hex::encode(Sha256::digest(format!("{name}:{value}\n"))));
            let mut sig = hex::encode(hmac(&key, to_sign.as_bytes()));
            if how.tamper == Some(chunks.len() + 1) {
                sig.replace_range(0..1, if sig.starts_with('0') { "1" } else { "0" });
            }
            body.extend_from_slice(format!("x-amz-trailer-signature:{sig}\r\n").as_bytes());
        }
        body.extend_from_slice(b"\r\n");
    }
    let mut req = s.http.put(format!("http://{}{path}", s.addr)).header("authorization", auth).body(body);
    for (n, v) in headers.into_iter().filter(|(n, _)| *n != "host") {
        req = req.header(n, v);
    }
    let r = req.send().await.expect("the answer to a streaming upload");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// CRC-32 (`poly` 0xEDB88320) or CRC-32C (0x82F63B78), reflected, as S3's checksums.
fn crc(poly: u32, data: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32).map(|mut c| {
        for _ in 0..8 {
            c = if c & 1 == 1 { poly ^ (c >> 1) } else { c >> 1 };
        }
        c
    }).collect();
    !data.iter().fold(!0u32, |c, &b| table[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8))
}

/// Streaming uploads with a checksum in the trailer, as SDKs send them over TLS (unsigned
/// chunks) or sign them (chunks and trailer signed): stored when the checksum matches, with
/// or without `x-amz-sdk-checksum-algorithm` beside it; a wrong checksum or trailer signature
/// is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_uploads_with_a_trailing_checksum() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/bkt/obj", &[], b"kept".to_vec()).await.0, 200);
    let chunks: Vec<Vec<u8>> = (0..3u32).map(|i| (0..600 * 1024 + i).map(|j| (j * 7 + i) as u8).collect()).collect();
    let whole: Vec<u8> = chunks.concat();
    let crc32 = base64(&crc(0xEDB8_8320, &whole).to_be_bytes());
    let crc32c = base64(&crc(0x82F6_3B78, &whole).to_be_bytes());
    assert_eq!(crc(0x82F6_3B78, b"123456789"), 0xE306_9283, "the CRC-32C check value");
    let wrong = base64(&(crc(0xEDB8_8320, &whole) ^ 1).to_be_bytes());
    let before = s.used_bytes().await;

    let refused: Vec<(&str, Streaming, u16, &str)> = vec![
        ("unsigned, a wrong CRC-32", Streaming { signed: false, tamper: None, trailer: Some(("x-amz-checksum-crc32", wrong.clone())), sdk_algorithm: Some("CRC32") }, 400, "BadDigest"),
        ("signed, a wrong CRC-32", Streaming { signed: true, tamper: None, trailer: Some(("x-amz-checksum-crc32", wrong.clone())), sdk_algorithm: Some("CRC32") }, 400, "BadDigest"),
        ("unsigned, a wrong CRC-32 announced in x-amz-trailer only", Streaming { signed: false, tamper: None, trailer: Some(("x-amz-checksum-crc32", wrong.clone())), sdk_algorithm: None }, 400, "BadDigest"),
        ("signed, a CRC-32C under the CRC-32's name", Streaming { signed: true, tamper: None, trailer: Some(("x-amz-checksum-crc32", crc32c.clone())), sdk_algorithm: None }, 400, "BadDigest"),
        ("signed, a spoiled chunk", Streaming { signed: true, tamper: Some(1), trailer: Some(("x-amz-checksum-crc32", crc32.clone())), sdk_algorithm: Some("CRC32") }, 403, "SignatureDoesNotMatch"),
        ("signed, a spoiled trailer signature", Streaming { signed: true, tamper: Some(chunks.len() + 1), trailer: Some(("x-amz-checksum-crc32", crc32.clone())), sdk_algorithm: Some("CRC32") }, 403, "SignatureDoesNotMatch"),
    ];
    for (what, how, status, code) in refused {
        for path in ["/bkt/obj", "/bkt/new"] {
            let (st, body) = streaming_put(&s, path, &chunks, how.clone()).await;
            assert_eq!((st, error_code(&body)), (status, code), "{what}, {path}: {body}");
            assert_eq!(s.call("GET", "/bkt/obj", &[], vec![]).await, (200, "kept".to_string()), "{what}, {path}");
            assert_eq!(s.call("HEAD", "/bkt/new", &[], vec![]).await.0, 404, "{what}, {path}");
        }
    }
    s.assert_space_returns_to(before).await;

    let stored: Vec<(&str, Streaming)> = vec![
        ("unsigned, CRC-32 with the SDK's header", Streaming { signed: false, tamper: None, trailer: Some(("x-amz-checksum-crc32", crc32.clone())), sdk_algorithm: Some("CRC32") }),
        ("unsigned, CRC-32C announced in x-amz-trailer only", Streaming { signed: false, tamper: None, trailer: Some(("x-amz-checksum-crc32c", crc32c.clone())), sdk_algorithm: None }),
        ("signed, CRC-32C with the SDK's header", Streaming { signed: true, tamper: None, trailer: Some(("x-amz-checksum-crc32c", crc32c.clone())), sdk_algorithm: Some("CRC32C") }),
        ("signed, CRC-32 announced in x-amz-trailer only", Streaming { signed: true, tamper: None, trailer: Some(("x-amz-checksum-crc32", crc32.clone())), sdk_algorithm: None }),
    ];
    for (i, (what, how)) in stored.into_iter().enumerate() {
        let path = format!("/bkt/stored-{i}");
        let (st, body) = streaming_put(&s, &path, &chunks, how).await;
        assert_eq!(st, 200, "{what}: {body}");
        let r = s.signed("GET", &path, &[], vec![]).send().await.unwrap();
        assert_eq!(r.status(), 200, "{what}");
        assert!(r.bytes().await.unwrap()[..] == whole[..], "{what}: the streamed object's bytes");
    }
    s.stop().await;
}

/// A streaming upload with a chunk whose signature does not follow from the one before is
/// refused and changes nothing: the object it would replace keeps its bytes, a new key does
/// not appear, and no space stays used. The same upload signed right is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_upload_with_a_bad_chunk_signature_changes_nothing() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/bkt", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/bkt/obj", &[], b"kept".to_vec()).await.0, 200);
    let chunks: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i + 1; 700 * 1024]).collect();
    let whole: Vec<u8> = chunks.concat();
    let before = s.used_bytes().await;
    for (path, tamper) in [("/bkt/obj", 0), ("/bkt/obj", 2), ("/bkt/new", 3), ("/bkt/new", 4)] {
        let (st, body) = chunked_put(&s, path, &chunks, Some(tamper)).await;
        assert_eq!((st, error_code(&body)), (403, "SignatureDoesNotMatch"), "chunk {tamper} spoiled, {path}: {body}");
        assert_eq!(s.call("GET", "/bkt/obj", &[], vec![]).await, (200, "kept".to_string()), "chunk {tamper} spoiled, {path}");
        assert_eq!(s.call("HEAD", "/bkt/new", &[], vec![]).await.0, 404, "chunk {tamper} spoiled, {path}");
    }
    s.assert_space_returns_to(before).await;
    let (st, body) = chunked_put(&s, "/bkt/obj", &chunks, None).await;
    assert_eq!(st, 200, "{body}");
    let r = s.signed("GET", "/bkt/obj", &[], vec![]).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap()[..] == whole[..], "the streamed object's bytes");
    s.stop().await;
}
