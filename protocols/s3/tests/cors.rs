//! Bucket CORS configurations over raw HTTP: preflights answered as S3 answers them (also
//! the refusals a browser never shows a page), CORS headers on other answers (errors
//! included), and configurations S3 refuses. The browser's own view is
//! `clients.rs::browser_pages_get_what_bucket_cors_rules_allow` (Chromium).

mod common;

use common::{error_code, start};

const CORS: &str = r#"<CORSConfiguration>
  <CORSRule>
    <AllowedOrigin>https://*.labels.example</AllowedOrigin>
    <AllowedMethod>GET</AllowedMethod>
    <AllowedMethod>PUT</AllowedMethod>
    <AllowedHeader>content-type</AllowedHeader>
    <AllowedHeader>x-amz-*</AllowedHeader>
    <ExposeHeader>ETag</ExposeHeader>
    <MaxAgeSeconds>300</MaxAgeSeconds>
  </CORSRule>
  <CORSRule>
    <AllowedOrigin>*</AllowedOrigin>
    <AllowedMethod>HEAD</AllowedMethod>
  </CORSRule>
</CORSConfiguration>"#;

fn header(res: &reqwest::Response, name: &str) -> Option<String> {
    res.headers().get(name).map(|v| v.to_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflights_and_answers_follow_the_buckets_cors_rules() {
    let s = start().await;
    assert_eq!(s.call("PUT", "/site", &[], vec![]).await.0, 200);
    assert_eq!(s.call("PUT", "/site/a.txt", &[], b"aaa".to_vec()).await.0, 200);
    let options = |path: &str, headers: &[(&str, &str)]| {
        let mut r = s.http.request(reqwest::Method::OPTIONS, format!("{}{path}", s.endpoint()));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send()
    };
    let asks = [("Origin", "https://app.labels.example"), ("Access-Control-Request-Method", "PUT"), ("Access-Control-Request-Headers", "Content-Type, X-Amz-Date")];

    // Before a configuration: GetBucketCors says there is none, preflights are refused.
    let (status, body) = s.call("GET", "/site", &[("cors", "")], vec![]).await;
    assert_eq!((status, error_code(&body)), (404, "NoSuchCORSConfiguration"), "{body}");
    let res = options("/site/a.txt", &asks).await.unwrap();
    assert_eq!(res.status(), 403);
    assert!(res.text().await.unwrap().contains("CORS is not enabled for this bucket"));

    // Configurations S3 refuses change nothing.
    for bad in [
        CORS.replace("<AllowedMethod>PUT</AllowedMethod>", "<AllowedMethod>PATCH</AllowedMethod>"),
        CORS.replace("https://*.labels.example", "https://*.*.example"),
        "<CORSConfiguration></CORSConfiguration>".to_string(),
        "<CORSConfiguration><CORSRule>".to_string(),
    ] {
        let (status, body) = s.call("PUT", "/site", &[("cors", "")], bad.into_bytes()).await;
        assert!(status == 400, "{status} {body}");
    }
    assert_eq!(s.call("GET", "/site", &[("cors", "")], vec![]).await.0, 404);

    let (status, body) = s.call("PUT", "/site", &[("cors", "")], CORS.as_bytes().to_vec()).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = s.call("GET", "/site", &[("cors", "")], vec![]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("<AllowedOrigin>https://*.labels.example</AllowedOrigin>") && body.contains("<MaxAgeSeconds>300</MaxAgeSeconds>"), "{body}");

    // An allowed preflight, unauthenticated as browsers send it.
    let res = options("/site/new.txt", &asks).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "access-control-allow-origin").as_deref(), Some("https://app.labels.example"));
    assert_eq!(header(&res, "access-control-allow-methods").as_deref(), Some("GET, PUT"));
    assert_eq!(header(&res, "access-control-allow-headers").as_deref(), Some("content-type, x-amz-date"));
    assert_eq!(header(&res, "access-control-max-age").as_deref(), Some("300"));
    assert_eq!(header(&res, "access-control-allow-credentials").as_deref(), Some("true"));
    assert!(header(&res, "x-amz-request-id").is_some());
    // Refused: another origin, a method or a header no rule allows.
    for (origin, method, headers) in [
        ("https://labels.example", "PUT", ""),
        ("http://app.labels.example", "PUT", ""),
        ("https://app.labels.example", "DELETE", ""),
        ("https://app.labels.example", "PUT", "authorization, x-label"),
    ] {
        let mut h = vec![("Origin", origin), ("Access-Control-Request-Method", method)];
        if !headers.is_empty() {
            h.push(("Access-Control-Request-Headers", headers));
        }
        let res = options("/site/a.txt", &h).await.unwrap();
        assert_eq!(res.status(), 403, "{origin} {method} {headers}");
        assert!(header(&res, "access-control-allow-origin").is_none());
        assert_eq!(error_code(&res.text().await.unwrap()), "AccessForbidden");
    }
    // Any origin may HEAD: the answer names no origin but "*", without credentials.
    let res = options("/site/a.txt", &[("Origin", "https://elsewhere.example"), ("Access-Control-Request-Method", "HEAD")]).await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "access-control-allow-origin").as_deref(), Some("*"));
    assert!(header(&res, "access-control-allow-credentials").is_none());
    // What a preflight lacks, or a bucket that does not exist.
    assert_eq!(options("/site/a.txt", &[("Access-Control-Request-Method", "GET")]).await.unwrap().status(), 400);
    assert_eq!(options("/site/a.txt", &[("Origin", "https://app.labels.example")]).await.unwrap().status(), 400);
    let res = options("/nosuch/a.txt", &asks).await.unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(error_code(&res.text().await.unwrap()), "NoSuchBucket");

    // Other requests with an allowed origin get the headers, errors included; others not.
    let res = s.signed("GET", "/site/a.txt", &[], vec![]).header("Origin", "https://app.labels.example").send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "access-control-allow-origin").as_deref(), Some("https://app.labels.example"));
    assert_eq!(header(&res, "access-control-expose-headers").as_deref(), Some("ETag"));
    assert!(header(&res, "vary").is_some_and(|v| v.contains("Origin")));
    let res = s.signed("GET", "/site/missing", &[], vec![]).header("Origin", "https://app.labels.example").send().await.unwrap();
    assert_eq!(res.status(), 404);
    assert_eq!(header(&res, "access-control-allow-origin").as_deref(), Some("https://app.labels.example"));
    let res = s.signed("GET", "/site/a.txt", &[], vec![]).header("Origin", "https://other.example").send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(header(&res, "access-control-allow-origin").is_none());
    let res = s.signed("DELETE", "/site/a.txt", &[], vec![]).header("Origin", "https://app.labels.example").send().await.unwrap();
    assert_eq!(res.status(), 204);
    assert!(header(&res, "access-control-allow-origin").is_none(), "DELETE is not allowed to the origin");
    let res = s.signed("GET", "/site/missing", &[], vec![]).send().await.unwrap();
    assert!(header(&res, "access-control-allow-origin").is_none() && header(&res, "vary").is_none());

    // Only the bucket's owner reads or changes the configuration.
    let bob = s
        .with_engine(|e| {
            let admin = storage_engine::Caller::system();
            e.create_user(&admin, storage_engine::NewUser { name: "bob".into(), password: "bob-password".into(), uid: None, gid: None, groups: vec![], role: None }).unwrap();
            e.create_s3_key(&admin, "bob", None).unwrap()
        })
        .await;
    let res = s.signed_with("GET", "/site", &[("cors", "")], vec![], &bob.0, &bob.1).send().await.unwrap();
    assert_eq!(res.status(), 403);
    let res = s.signed_with("DELETE", "/site", &[("cors", "")], vec![], &bob.0, &bob.1).send().await.unwrap();
    assert_eq!(res.status(), 403);
    assert_eq!(s.call("GET", "/site", &[("cors", "")], vec![]).await.0, 200);

    assert_eq!(s.call("DELETE", "/site", &[("cors", "")], vec![]).await.0, 204);
    assert_eq!(s.call("GET", "/site", &[("cors", "")], vec![]).await.0, 404);
    assert_eq!(options("/site/a.txt", &asks).await.unwrap().status(), 403);
    s.stop().await;
}
