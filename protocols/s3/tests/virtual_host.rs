//! Virtual-host style addressing (`--s3-domain`): `bucket.DOMAIN:port` names the bucket,
//! while path-style requests keep working through DOMAIN itself, `localhost` and the address.

mod common;

use common::{error_code, start_with};

const DOMAIN: &str = "s3.aquifer.test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_host_and_path_style_requests_reach_the_same_objects() {
    let s = start_with(aquifer_s3::S3Options { domain: Some(DOMAIN.into()), ..Default::default() }).await;
    let port = s.addr.port();
    // The names resolve to the listener (no DNS here); the Host header carries them.
    let mut b = reqwest::Client::builder();
    for name in [DOMAIN.to_string(), format!("photos.{DOMAIN}"), format!("nothere.{DOMAIN}"), "localhost".into(), "s3.elsewhere.test".into()] {
        b = b.resolve(&name, s.addr);
    }
    let client = b.build().unwrap();
    let vhost = format!("photos.{DOMAIN}:{port}");
    let call = |host: String, method: &'static str, path: &'static str, query: &'static [(&'static str, &'static str)], body: &'static [u8]| {
        let req = s.signed_at(&client, &host, method, path, query, body.to_vec());
        async move {
            let r = req.send().await.expect("send");
            (r.status().as_u16(), r.text().await.expect("body"))
        }
    };
    // A bucket made path style through the address; written and read virtual-host style.
    assert_eq!(s.call("PUT", "/photos", &[], vec![]).await.0, 200);
    assert_eq!(call(vhost.clone(), "PUT", "/cats/tom.jpg", &[], b"meow").await.0, 200);
    assert_eq!(call(vhost.clone(), "GET", "/cats/tom.jpg", &[], b"").await, (200, "meow".into()));
    assert_eq!(s.call("GET", "/photos/cats/tom.jpg", &[], vec![]).await, (200, "meow".into()));
    let (st, list) = call(vhost.clone(), "GET", "/", &[("list-type", "2")], b"").await;
    assert_eq!(st, 200, "{list}");
    assert!(list.contains("<Name>photos</Name>") && list.contains("<Key>cats/tom.jpg</Key>"), "{list}");
    // Path style through the domain itself, `localhost` and a name outside the domain.
    for host in [format!("{DOMAIN}:{port}"), format!("localhost:{port}"), format!("s3.elsewhere.test:{port}")] {
        assert_eq!(call(host.clone(), "GET", "/photos/cats/tom.jpg", &[], b"").await, (200, "meow".into()), "path style via {host}");
        let (st, buckets) = call(host.clone(), "GET", "/", &[], b"").await;
        assert!(st == 200 && buckets.contains("<Name>photos</Name>"), "ListBuckets via {host}: {st} {buckets}");
    }
    // A bucket that does not exist, virtual-host style.
    let (st, body) = call(format!("nothere.{DOMAIN}:{port}"), "GET", "/k", &[], b"").await;
    assert_eq!((st, error_code(&body)), (404, "NoSuchBucket"), "{body}");
    // CORS: a preflight addressed virtual-host style is matched against that bucket's rules
    // (the path `/cats/tom.jpg` names no bucket `cats`).
    let cors = "<CORSConfiguration><CORSRule><AllowedOrigin>https://app.test</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule></CORSConfiguration>";
    assert_eq!(s.call("PUT", "/photos", &[("cors", "")], cors.as_bytes().to_vec()).await.0, 200);
    let preflight = |host: String, path: &str| {
        client
            .request(reqwest::Method::OPTIONS, format!("http://{host}{path}"))
            .header("Origin", "https://app.test")
            .header("Access-Control-Request-Method", "GET")
            .send()
    };
    let res = preflight(vhost.clone(), "/cats/tom.jpg").await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers().get("access-control-allow-origin").unwrap(), "https://app.test");
    assert_eq!(preflight(format!("{DOMAIN}:{port}"), "/photos/cats/tom.jpg").await.unwrap().status(), 200, "path style through the domain");
    assert_eq!(preflight(format!("nothere.{DOMAIN}:{port}"), "/cats/tom.jpg").await.unwrap().status(), 404);
    s.stop().await;
}

#[tokio::test]
async fn a_domain_with_a_port_is_refused_when_the_listener_starts() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = storage_engine::EngineConfig::with_file_drives(dir.path(), 6, 64 << 20, 4, 2);
    cfg.admin_password = Some("admin-secret-1".into());
    cfg.argon2_memory_kib = 64;
    let engine = storage_engine::Engine::open(cfg).unwrap();
    let opts = aquifer_s3::S3Options { domain: Some(format!("{DOMAIN}:9000")), ..Default::default() };
    let e = aquifer_s3::serve(engine.clone(), listener, opts, std::future::pending()).await.expect_err("a domain with a port");
    assert!(e.to_string().contains("without a port"), "{e}");
    engine.shutdown().unwrap();
}
