//! Browser-based uploads (POST Object): forms signed with SigV4 over their policy, as a
//! browser sends them. A form the policy does not admit is refused as S3 refuses it and
//! leaves no object and no space behind.

mod common;

use common::{REGION, Server, amz_now, base64, error_code, hmac, start};
use serde_json::{Value, json};

const FUTURE: &str = "2099-01-01T00:00:00.000Z";

/// The SigV4 fields of a form signed with alice's key: the policy (with the `x-amz-*`
/// conditions SigV4 asks for) and its signature.
fn signed(s: &Server, expiration: &str, mut conditions: Vec<Value>) -> Vec<(String, String)> {
    let (amz_date, day) = amz_now();
    let cred = format!("{}/{day}/{REGION}/s3/aws4_request", s.access);
    conditions.push(json!({"x-amz-algorithm": "AWS4-HMAC-SHA256"}));
    conditions.push(json!({"x-amz-credential": cred}));
    conditions.push(json!({"x-amz-date": amz_date}));
    let policy = base64(json!({"expiration": expiration, "conditions": conditions}).to_string().as_bytes());
    let mut key = hmac(format!("AWS4{}", s.secret).as_bytes(), day.as_bytes());
    for part in [REGION, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let sig = hex::encode(hmac(&key, policy.as_bytes()));
    [("x-amz-algorithm", "AWS4-HMAC-SHA256".to_string()), ("x-amz-credential", cred), ("x-amz-date", amz_date), ("policy", policy), ("x-amz-signature", sig)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

/// Fields in order, then the file part.
fn form(fields: &[(String, String)], file_name: &str, content: &[u8]) -> (String, Vec<u8>) {
    let boundary = "----aquifer-post-test-7d1e";
    let mut body = Vec::new();
    for (k, v) in fields {
        body.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n").as_bytes());
    }
    body.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{file_name}\"\r\nContent-Type: text/plain\r\n\r\n").as_bytes(),
    );
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Posts the form to `bucket` without following redirects; returns (status, headers, body).
async fn post(s: &Server, bucket: &str, fields: &[(String, String)], file_name: &str, content: &[u8]) -> (u16, reqwest::header::HeaderMap, String) {
    let (ct, body) = form(fields, file_name, content);
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let res = client.post(format!("{}/{bucket}", s.endpoint())).header("content-type", ct).body(body).send().await.expect("send");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    (status, headers, res.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_form_uploads_with_its_acl_tags_and_filename() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/forms", &[], vec![]).await.0, 200);

    // `${filename}` in the key is the browser's name of the file, also for the policy.
    let mut f = fields(&[("key", "up/${filename}"), ("Content-Type", "text/plain")]);
    f.extend(signed(&s, FUTURE, vec![json!({"bucket": "forms"}), json!(["starts-with", "$key", "up/"]), json!(["starts-with", "$Content-Type", "text/"])]));
    let (st, h, body) = post(&s, "forms", &f, "photo.txt", b"from a browser").await;
    assert_eq!(st, 204, "{body}");
    let (st, got) = s.call("GET", "/forms/up/photo.txt", &[], vec![]).await;
    assert_eq!((st, got.as_str()), (200, "from a browser"));
    let etag = h.get("etag").expect("ETag header").to_str().unwrap().to_string();
    assert!(etag.starts_with('"') && etag.ends_with('"') && etag.len() == 34, "{etag}");

    // `acl` and `tagging` (an XML Tagging document) are S3's form fields for the canned ACL
    // and the tags.
    let tagging = "<Tagging><TagSet><Tag><Key>0</Key><Value>zero</Value></Tag><Tag><Key>1</Key><Value>one</Value></Tag></TagSet></Tagging>";
    let mut f = fields(&[("key", "tagged.txt"), ("acl", "public-read"), ("tagging", tagging)]);
    f.extend(signed(&s, FUTURE, vec![json!(["eq", "$key", "tagged.txt"]), json!({"acl": "public-read"}), json!(["starts-with", "$tagging", ""])]));
    let (st, _, body) = post(&s, "forms", &f, "x.txt", b"tagged").await;
    assert_eq!(st, 204, "{body}");
    let (st, body) = s.call("GET", "/forms/tagged.txt", &[("tagging", "")], vec![]).await;
    assert_eq!(st, 200, "{body}");
    assert!(body.contains("<Key>0</Key><Value>zero</Value>") && body.contains("<Key>1</Key><Value>one</Value>"), "{body}");
    let anon = s.http.get(format!("{}/forms/tagged.txt", s.endpoint())).send().await.unwrap();
    assert_eq!(anon.status().as_u16(), 200, "the form's acl public-read lets anyone read the object");
    // Without an acl field the object stays private (the bucket is).
    let anon = s.http.get(format!("{}/forms/up/photo.txt", s.endpoint())).send().await.unwrap();
    assert_eq!(anon.status().as_u16(), 403);

    // success_action_redirect: 303 to the URL with bucket, key and the quoted ETag.
    let mut f = fields(&[("key", "redirected.txt"), ("success_action_redirect", "http://example.invalid/done")]);
    f.extend(signed(&s, FUTURE, vec![json!({"key": "redirected.txt"}), json!(["eq", "$success_action_redirect", "http://example.invalid/done"])]));
    let (st, h, body) = post(&s, "forms", &f, "x.txt", b"bar").await;
    assert_eq!(st, 303, "{body}");
    let location = h.get("location").expect("Location").to_str().unwrap();
    // MD5 of "bar".
    assert_eq!(location, "http://example.invalid/done?bucket=forms&key=redirected.txt&etag=%2237b51d194a7513e45b56f6524f2d51f2%22");

    // success_action_status 201: the PostResponse document, its ETag quoted as S3's.
    let mut f = fields(&[("key", "created.txt"), ("success_action_status", "201")]);
    f.extend(signed(&s, FUTURE, vec![json!({"key": "created.txt"}), json!({"success_action_status": "201"})]));
    let (st, _, body) = post(&s, "forms", &f, "x.txt", b"bar").await;
    assert_eq!(st, 201, "{body}");
    let text = body.replace("&quot;", "\"");
    assert!(text.contains("<Key>created.txt</Key>") && text.contains("<ETag>\"37b51d194a7513e45b56f6524f2d51f2\"</ETag>"), "{body}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_its_policy_refuses_changes_nothing() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/forms", &[], vec![]).await.0, 200);
    let before = s.used_bytes().await;
    let base = || vec![json!({"bucket": "forms"}), json!(["starts-with", "$key", "foo"])];

    // Each case: the form's own fields, extra conditions, the expiration, the status and the
    // code S3 answers.
    let cases: Vec<(&str, Vec<(&str, &str)>, Vec<Value>, &str, u16, &str)> = vec![
        ("a key outside the policy's prefix", vec![("key", "bar.txt")], vec![], FUTURE, 403, "AccessDenied"),
        ("an eq condition the field fails", vec![("key", "foo.txt"), ("x-amz-meta-foo", "barclamp")], vec![json!(["eq", "$x-amz-meta-foo", ""])], FUTURE, 403, "AccessDenied"),
        ("a field the policy names is missing", vec![("key", "foo.txt")], vec![json!(["starts-with", "$x-amz-meta-foo", "bar"])], FUTURE, 403, "AccessDenied"),
        ("a field the policy does not name", vec![("key", "foo.txt"), ("x-amz-meta-extra", "1")], vec![], FUTURE, 403, "AccessDenied"),
        ("an expired policy", vec![("key", "foo.txt")], vec![], "2001-01-01T00:00:00Z", 403, "AccessDenied"),
        ("an expiration that is not ISO 8601 UTC", vec![("key", "foo.txt")], vec![], "2099-01-01 00:00:00.123456+00:00", 400, "InvalidPolicyDocument"),
        ("an expiration with an offset", vec![("key", "foo.txt")], vec![], "2099-01-01T00:00:00+00:00", 400, "InvalidPolicyDocument"),
        ("a file larger than the policy's range", vec![("key", "foo.txt")], vec![json!(["content-length-range", 0, 2])], FUTURE, 400, "EntityTooLarge"),
    ];
    for (what, own, extra, expiration, status, code) in cases {
        let mut f = fields(&own);
        let mut conds = base();
        conds.extend(extra);
        f.extend(signed(&s, expiration, conds));
        let (st, _, body) = post(&s, "forms", &f, "foo.txt", b"content").await;
        assert_eq!((st, error_code(&body)), (status, code), "{what}: {body}");
    }

    // A policy without its signature, and a signature that does not match.
    let mut f = fields(&[("key", "foo.txt")]);
    f.extend(signed(&s, FUTURE, base()).into_iter().filter(|(k, _)| k != "x-amz-signature"));
    let (st, _, body) = post(&s, "forms", &f, "foo.txt", b"content").await;
    assert_eq!(st, 400, "{body}");
    let mut f = fields(&[("key", "foo.txt")]);
    f.extend(signed(&s, FUTURE, base()).into_iter().map(|(k, v)| if k == "x-amz-signature" { (k, "0".repeat(64)) } else { (k, v) }));
    let (st, _, body) = post(&s, "forms", &f, "foo.txt", b"content").await;
    assert_eq!((st, error_code(&body)), (403, "SignatureDoesNotMatch"), "{body}");
    // The signature is checked first: a forged form its policy would refuse too is answered
    // as forged.
    let mut f = fields(&[("key", "bar.txt")]);
    f.extend(signed(&s, "2099-01-01 00:00:00+00:00", base()).into_iter().map(|(k, v)| if k == "x-amz-signature" { (k, "0".repeat(64)) } else { (k, v) }));
    let (st, _, body) = post(&s, "forms", &f, "foo.txt", b"content").await;
    assert_eq!((st, error_code(&body)), (403, "SignatureDoesNotMatch"), "{body}");

    // Fields before the file are bounded.
    let big = "x".repeat(aquifer_s3::FORM_FIELDS_BYTES_MAX + 1);
    let mut f = fields(&[("key", "foo.txt"), ("x-ignore-padding", &big)]);
    f.extend(signed(&s, FUTURE, base()));
    let (st, _, body) = post(&s, "forms", &f, "foo.txt", b"content").await;
    assert_eq!((st, error_code(&body)), (400, "MaxPostPreDataLengthExceededError"), "{body}");

    for key in ["foo.txt", "bar.txt"] {
        assert_eq!(s.call("GET", &format!("/forms/{key}"), &[], vec![]).await.0, 404, "{key} was not stored");
    }
    let (_, listing) = s.call("GET", "/forms", &[("list-type", "2")], vec![]).await;
    assert!(listing.contains("<KeyCount>0</KeyCount>"), "{listing}");
    assert_eq!(s.used_bytes().await, before, "refused uploads leave no space used");

    // The same form with a key the policy admits is stored.
    let mut f = fields(&[("key", "foo.txt")]);
    f.extend(signed(&s, FUTURE, base()));
    let (st, _, body) = post(&s, "forms", &f, "foo.txt", b"content").await;
    assert_eq!(st, 204, "{body}");
    assert_eq!(s.call("GET", "/forms/foo.txt", &[], vec![]).await, (200, "content".to_string()));
    s.stop().await;
}

/// A form whose body arrives a byte at a time (`Transfer-Encoding: chunked`, every byte a
/// chunk of its own) is read in time linear in its size: half a MiB of fields before the file
/// is stored in seconds. The listener reads the fields before anybody is authenticated, and
/// reading the whole form again at every chunk took it minutes of a core per such request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_sent_a_byte_at_a_time_is_read_in_linear_time() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = start().await;
    assert_eq!(s.call("PUT", "/forms", &[], vec![]).await.0, 200);
    // `x-ignore-` fields need no policy condition.
    let pad = "p".repeat(512 * 1024);
    let mut f = fields(&[("key", "trickled.txt"), ("x-ignore-padding", &pad)]);
    f.extend(signed(&s, FUTURE, vec![json!({"bucket": "forms"}), json!(["eq", "$key", "trickled.txt"])]));
    let (ct, body) = form(&f, "t.txt", b"arrived a byte at a time");
    let addr = s.endpoint().trim_start_matches("http://").to_string();
    let mut wire = format!("POST /forms HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {ct}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").into_bytes();
    for b in &body {
        wire.extend_from_slice(b"1\r\n");
        wire.push(*b);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let exchange = async {
        let mut conn = tokio::net::TcpStream::connect(&addr).await?;
        conn.write_all(&wire).await?;
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(std::time::Duration::from_secs(60), exchange).await.expect("the form was answered within a minute").expect("exchange");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    let (st, got) = s.call("GET", "/forms/trickled.txt", &[], vec![]).await;
    assert_eq!((st, got.as_str()), (200, "arrived a byte at a time"));
}

/// The listener checks a form's fields, then hands s3s the form written again, and s3s reads
/// it once more: a form that can be read two ways would have s3s act on fields nobody
/// checked. Each of these was read two ways: s3s ends header lines at a bare LF (it stored
/// the form, the file starting with what the listener read as headers), takes the last of
/// two Content-Disposition headers (it refused that form itself), reads a blank line right
/// after a boundary as a part without headers (stored), and ends a value at a boundary line
/// that starts it or that the file's name made in `key` (it stored the object under a second
/// `key`). Each is refused now and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forms_that_read_two_ways_are_refused() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/forms", &[], vec![]).await.0, 200);
    let before = s.used_bytes().await;
    let boundary = "----aquifer-post-test-7d1e";
    let policy = || signed(&s, FUTURE, vec![json!({"bucket": "forms"}), json!(["starts-with", "$key", "up/"]), json!(["starts-with", "$x-amz-meta-note", ""])]);
    let send = |ct: String, body: Vec<u8>| {
        let url = format!("{}/forms", s.endpoint());
        async move {
            let res = reqwest::Client::new().post(url).header("content-type", ct).body(body).send().await.expect("send");
            let status = res.status().as_u16();
            (status, res.text().await.expect("body"))
        }
    };
    let file_line = "name=\"file\"; filename=\"a.txt\"\r\n";
    let mut f = fields(&[("key", "up/a.txt")]);
    f.extend(policy());
    let (ct, plain) = form(&f, "a.txt", b"content");
    let text = String::from_utf8(plain.clone()).unwrap();
    assert!(text.contains(file_line));
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("a bare LF in the file part's headers", text.replace(file_line, "name=\"file\"\n\r\nX-Note: 1\r\n"), 400, "MalformedPOSTRequest"),
        (
            "two Content-Disposition headers in the file part",
            text.replace(file_line, &format!("{file_line}Content-Disposition: form-data; name=\"x-amz-meta-note\"\r\n")),
            400,
            "MalformedPOSTRequest",
        ),
        (
            "a part without headers before the file",
            text.replacen(&format!("--{boundary}\r\n"), &format!("--{boundary}\r\n\r\nup/b.txt\r\n--{boundary}\r\n"), 1),
            400,
            "MalformedPOSTRequest",
        ),
    ];
    for (what, body, status, code) in cases {
        let (st, body) = send(ct.clone(), body.into_bytes()).await;
        assert_eq!((st, error_code(&body)), (status, code), "{what}: {body}");
    }
    // The file's name put into `key` makes a boundary line, then a second `key` part: before,
    // s3s stored the second key (`up/other.txt`), which the listener never saw as a key.
    let smuggled = format!("up/a.txt\r\n${{filename}}\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nup/other.txt");
    let mut f = fields(&[("key", &smuggled)]);
    f.extend(policy());
    let (ct, body) = form(&f, &format!("--{boundary}"), b"content");
    let (st, body) = send(ct, body).await;
    assert_eq!((st, error_code(&body)), (400, "InvalidArgument"), "{body}");
    // And a value that starts with the boundary line.
    let mut f = fields(&[("key", "up/a.txt"), ("x-amz-meta-note", &format!("--{boundary}\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nup/other.txt"))]);
    f.extend(policy());
    let (ct, body) = form(&f, "a.txt", b"content");
    let (st, body) = send(ct, body).await;
    assert_eq!((st, error_code(&body)), (400, "InvalidArgument"), "{body}");

    for key in ["up/a.txt", "up/b.txt", "up/other.txt"] {
        assert_eq!(s.call("GET", &format!("/forms/{key}"), &[], vec![]).await.0, 404, "{key} was not stored");
    }
    assert_eq!(s.used_bytes().await, before, "refused uploads leave no space used");
    // The plain form is stored.
    let (st, body) = send(ct_of(boundary), plain).await;
    assert_eq!(st, 204, "{body}");
    assert_eq!(s.call("GET", "/forms/up/a.txt", &[], vec![]).await, (200, "content".to_string()));
    s.stop().await;
}

fn ct_of(boundary: &str) -> String {
    format!("multipart/form-data; boundary={boundary}")
}

/// A form may have `FORM_PARTS_MAX` parts, the file's included, as s3s reads them; one more
/// is refused when it begins, before the fields are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_of_more_parts_than_the_limit_is_refused() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/forms", &[], vec![]).await.0, 200);
    let before = s.used_bytes().await;
    let with_fields = |n: usize, key: &str| {
        let mut f = fields(&[("key", key)]);
        f.extend(signed(&s, FUTURE, vec![json!({"bucket": "forms"}), json!(["starts-with", "$key", "many/"])]));
        let pad = aquifer_s3::FORM_PARTS_MAX - 1 - f.len() + n;
        f.extend((0..pad).map(|i| (format!("x-ignore-{i}"), String::new())));
        f
    };
    let (st, _, body) = post(&s, "forms", &with_fields(1, "many/over.txt"), "f.txt", b"one part too many").await;
    assert_eq!((st, error_code(&body)), (400, "MalformedPOSTRequest"), "{body}");
    assert_eq!(s.call("GET", "/forms/many/over.txt", &[], vec![]).await.0, 404);
    assert_eq!(s.used_bytes().await, before, "a refused upload leaves no space used");
    let (st, _, body) = post(&s, "forms", &with_fields(0, "many/at-limit.txt"), "f.txt", b"as many parts as allowed").await;
    assert_eq!(st, 204, "{body}");
    assert_eq!(s.call("GET", "/forms/many/at-limit.txt", &[], vec![]).await, (200, "as many parts as allowed".to_string()));
    s.stop().await;
}
