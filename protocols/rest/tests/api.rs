//! End-to-end tests of the REST API: a real engine, real HTTP, a real HTTP client.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use reqwest::header;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const MIB: usize = 1 << 20;

async fn create_user(s: &Server, name: &str, password: &str, role: &str) {
    s.admin_json(Method::POST, "/users", Some(json!({ "name": name, "password": password, "role": role }))).await;
}

async fn wait_job(s: &Server, id: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = s.admin_json(Method::GET, &format!("/jobs/{id}"), None).await;
        let p = j["progress"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&p), "progress {p}");
        if j["state"] != "running" {
            return j;
        }
        assert!(Instant::now() < deadline, "job {id} still running: {j}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_public_and_lists_every_drive() {
    let s = start().await;
    let res = s.anon(Method::GET, "/health").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let h: Value = res.json().await.unwrap();
    assert_eq!(h["state"], "ok");
    assert_eq!(h["drives"].as_array().unwrap().len(), DRIVES);
    assert!(h["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("single point of failure")));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_credentials_get_401() {
    let s = start().await;
    for rb in [
        s.anon(Method::GET, "/drives"),
        s.as_user(Method::GET, "/drives", "admin", "wrong-password"),
        s.as_user(Method::GET, "/drives", "nobody", "whatever-123"),
        s.bearer(Method::GET, "/drives", "aqf_0000_0000"),
        s.anon(Method::GET, "/drives").header(header::AUTHORIZATION, "Basic !!!notbase64"),
        s.anon(Method::GET, "/drives").header(header::AUTHORIZATION, "Digest abc"),
    ] {
        let res = rb.send().await.unwrap();
        assert_eq!(res.status(), 401);
        assert_eq!(res.headers()[header::WWW_AUTHENTICATE], "Basic realm=\"aquifer\"");
        let (_, code) = error_code(res).await;
        assert_eq!(code, "unauthenticated");
    }
    // Nothing is written without credentials.
    let res = s.anon(Method::PUT, "/files/anon.txt").body("x").send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert!(s.names("").await.is_empty());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_without_permission_gets_403_and_nothing_changes() {
    let s = start().await;
    create_user(&s, "alice", "alice-password", "user").await;
    s.put_file("/admin-only.txt", b"owned by admin".to_vec()).await;
    let jobs_before = s.admin_json(Method::GET, "/jobs", None).await;
    let users_before = s.admin_json(Method::GET, "/users", None).await;
    let alice = |m: Method, p: &str| s.as_user(m, p, "alice", "alice-password");

    let cases = [
        alice(Method::GET, "/drives"),
        alice(Method::GET, "/jobs"),
        alice(Method::GET, "/capacity"),
        alice(Method::GET, "/cache"),
        alice(Method::GET, "/users"),
        alice(Method::POST, "/users").json(&json!({ "name": "mallory", "password": "mallory-password" })),
        alice(Method::POST, "/jobs").json(&json!({ "kind": "scrub" })),
        alice(Method::POST, "/drives/0/fail").json(&json!({ "reason": "test" })),
        alice(Method::PATCH, "/users/alice").json(&json!({ "role": "admin" })),
        alice(Method::PUT, "/files/alice.txt").body("hello"),
        alice(Method::PUT, "/files/newdir/alice.txt").body("hello"),
        alice(Method::DELETE, "/files/admin-only.txt"),
        alice(Method::POST, "/dirs/alice-dir"),
    ];
    for rb in cases {
        let (status, code) = error_code(rb.send().await.unwrap()).await;
        assert_eq!((status, code.as_str()), (StatusCode::FORBIDDEN, "permission_denied"));
    }
    assert_eq!(s.names("").await, vec!["admin-only.txt"]);
    assert_eq!(s.get_file("/admin-only.txt").await.1, b"owned by admin");
    assert_eq!(s.admin_json(Method::GET, "/jobs", None).await, jobs_before);
    assert_eq!(s.admin_json(Method::GET, "/users", None).await, users_before);
    let drive = s.admin_json(Method::GET, "/drives/0", None).await;
    assert_eq!(drive["state"], "online");
    // Reading a world-readable file and one's own record is allowed.
    let res = alice(Method::GET, "/files/admin-only.txt").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let me: Value = alice(Method::GET, "/users/alice").send().await.unwrap().json().await.unwrap();
    assert_eq!(me["role"], "user");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_issued_used_and_revoked() {
    let s = start().await;
    let issued = s
        .admin_json(Method::POST, "/auth/tokens", Some(json!({ "role": "read-only", "ttl_secs": 3600, "label": "monitoring" })))
        .await;
    let token = issued["token"].as_str().unwrap().to_string();
    let id = issued["info"]["id"].as_str().unwrap().to_string();
    assert_eq!(issued["info"]["role"], "read-only");
    assert!(issued["info"]["expires_ns"].as_i64().unwrap() > issued["info"]["created_ns"].as_i64().unwrap());

    let res = s.bearer(Method::GET, "/drives", &token).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let res = s.bearer(Method::POST, "/jobs", &token).json(&json!({ "kind": "scrub" })).send().await.unwrap();
    assert_eq!(res.status(), 403);
    assert!(s.admin_json(Method::GET, "/jobs", None).await.as_array().unwrap().is_empty());

    let list = s.admin_json(Method::GET, "/auth/tokens", None).await;
    let t = list.as_array().unwrap().iter().find(|t| t["id"] == id.as_str()).expect("token listed");
    assert_eq!(t["label"], "monitoring");
    assert!(t.get("token").is_none(), "secrets are never listed");

    // A token cannot be worth more than its user.
    create_user(&s, "bob", "bob-password", "operator").await;
    let res = s
        .as_user(Method::POST, "/auth/tokens", "bob", "bob-password")
        .json(&json!({ "role": "admin" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 400);

    let res = s.admin(Method::DELETE, &format!("/auth/tokens/{id}")).send().await.unwrap();
    assert_eq!(res.status(), 204);
    let res = s.bearer(Method::GET, "/drives", &token).send().await.unwrap();
    assert_eq!(res.status(), 401);
    let res = s.admin(Method::DELETE, &format!("/auth/tokens/{id}")).send().await.unwrap();
    assert_eq!(res.status(), 404);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_file_round_trip_and_head() {
    let s = start().await;
    let res = s.admin(Method::PUT, "/files/docs/readme.txt").body("hello, aquifer\n").send().await.unwrap();
    assert_eq!(res.status(), 201);
    let etag1 = res.headers()[header::ETAG].to_str().unwrap().to_string();
    let attrs: Value = res.json().await.unwrap();
    assert_eq!(attrs["size"], 15);
    assert_eq!(attrs["kind"], "file");
    assert_eq!(attrs["etag"], etag1.as_str());
    assert_eq!(s.names("").await, vec!["docs"], "missing parent created");

    let (status, body) = s.get_file("/docs/readme.txt").await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, b"hello, aquifer\n".as_slice()));

    let res = s.admin(Method::HEAD, "/files/docs/readme.txt").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let h = res.headers().clone();
    assert_eq!(h[header::CONTENT_LENGTH], "15");
    assert_eq!(h[header::ETAG].to_str().unwrap(), etag1);
    assert_eq!(h[header::ACCEPT_RANGES], "bytes");
    assert!(h[header::LAST_MODIFIED].to_str().unwrap().ends_with("GMT"));
    assert_eq!(h["x-aquifer-ino"].to_str().unwrap(), attrs["ino"].to_string());
    assert_eq!(h["x-aquifer-version"].to_str().unwrap(), attrs["version"].to_string());
    assert_eq!(h["x-aquifer-mode"], "0644");
    assert_eq!(h["x-aquifer-uid"], "0");
    assert_eq!(h["x-aquifer-gid"], "0");
    assert!(res.bytes().await.unwrap().is_empty());

    let res = s.admin(Method::GET, "/files/docs/readme.txt").header(header::IF_NONE_MATCH, &etag1).send().await.unwrap();
    assert_eq!(res.status(), 304);

    // Replacing answers 200 and changes the entity tag.
    let res = s.admin(Method::PUT, "/files/docs/readme.txt").body("v2").send().await.unwrap();
    assert_eq!(res.status(), 200);
    assert_ne!(res.headers()[header::ETAG].to_str().unwrap(), etag1);
    assert_eq!(s.get_file("/docs/readme.txt").await.1, b"v2");

    // An empty file.
    assert_eq!(s.put_file("/empty", vec![]).await, StatusCode::CREATED);
    assert_eq!(s.get_file("/empty").await, (StatusCode::OK, vec![]));

    let (status, code) = error_code(s.admin(Method::GET, "/files/docs/missing").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (404, "not_found"));
    let (status, code) = error_code(s.admin(Method::GET, "/files/docs").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (409, "is_dir"));
    let (status, code) = error_code(s.admin(Method::PUT, "/files/docs").body("x").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (409, "is_dir"));
    let (status, code) = error_code(s.admin(Method::PUT, "/files/docs/readme.txt/below").body("x").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (409, "not_dir"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_file_streams_bit_exact_with_ranges() {
    let s = start().await;
    let data = random_bytes(20 * MIB + 12345, 7);
    // Sent chunked in 64 KiB pieces, the way a streaming client uploads.
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> = data.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(pieces));
    let res = s.admin(Method::PUT, "/files/big/model.bin").body(body).send().await.unwrap();
    assert_eq!(res.status(), 201);
    let attrs: Value = res.json().await.unwrap();
    assert_eq!(attrs["size"].as_u64().unwrap(), data.len() as u64);

    let (status, got) = s.get_file("/big/model.bin").await;
    assert_eq!(status, 200);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "content differs");

    let size = data.len();
    let cases: [(String, usize, usize); 5] = [
        ("bytes=0-99".into(), 0, 100),
        // Across a 4 MiB stripe boundary.
        (format!("bytes={}-{}", 4 * MIB - 10, 4 * MIB + 9), 4 * MIB - 10, 4 * MIB + 10),
        (format!("bytes={}-", size - 1000), size - 1000, size),
        ("bytes=-4096".into(), size - 4096, size),
        (format!("bytes=5-{}", size * 2), 5, size),
    ];
    for (range, a, b) in cases {
        let res = s.admin(Method::GET, "/files/big/model.bin").header(header::RANGE, &range).send().await.unwrap();
        assert_eq!(res.status(), 206, "{range}");
        assert_eq!(res.headers()[header::CONTENT_RANGE].to_str().unwrap(), format!("bytes {a}-{}/{size}", b - 1));
        assert_eq!(res.headers()[header::CONTENT_LENGTH].to_str().unwrap(), (b - a).to_string());
        let body = res.bytes().await.unwrap();
        assert!(body[..] == data[a..b], "{range}");
    }
    for range in [format!("bytes={size}-"), format!("bytes={}-{}", size + 5, size + 10), "bytes=-0".into()] {
        let res = s.admin(Method::GET, "/files/big/model.bin").header(header::RANGE, &range).send().await.unwrap();
        assert_eq!(res.status(), 416, "{range}");
        assert_eq!(res.headers()[header::CONTENT_RANGE].to_str().unwrap(), format!("bytes */{size}"));
    }
    // A range on HEAD gives the part's headers without a body.
    let res = s.admin(Method::HEAD, "/files/big/model.bin").header(header::RANGE, "bytes=10-19").send().await.unwrap();
    assert_eq!(res.status(), 206);
    assert_eq!(res.headers()[header::CONTENT_LENGTH], "10");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_paginates_with_cursors() {
    let s = start().await;
    let mut expected = BTreeSet::new();
    for i in 0..25 {
        let name = format!("f{i:02}");
        s.put_file(&format!("/many/{name}"), vec![i as u8; i]).await;
        expected.insert(name);
    }
    s.admin_json(Method::POST, "/dirs/many/sub", None).await;
    expected.insert("sub".into());

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut q = vec![("limit", "10".to_string())];
        if let Some(c) = &cursor {
            q.push(("cursor", c.clone()));
        }
        let res = s.admin(Method::GET, "/dirs/many").query(&q).send().await.unwrap();
        assert_eq!(res.status(), 200);
        let page: Value = res.json().await.unwrap();
        pages += 1;
        let entries = page["entries"].as_array().unwrap();
        assert!(entries.len() <= 10);
        for e in entries {
            let name = e["name"].as_str().unwrap().to_string();
            if name == "sub" {
                assert_eq!(e["kind"], "dir");
            } else {
                assert_eq!(e["kind"], "file");
                assert_eq!(e["size"].as_u64().unwrap(), name[1..].parse::<u64>().unwrap());
            }
            seen.push(name);
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, expected.into_iter().collect::<Vec<_>>(), "every entry once, in name order");

    let v = s.admin_json(Method::GET, "/dirs", None).await;
    assert_eq!(v["path"], "/");
    assert_eq!(v["entries"][0]["name"], "many");
    assert!(v.get("next_cursor").is_none());

    for q in ["limit=0", "cursor=zz", "limit=abc"] {
        let res = s.admin(Method::GET, &format!("/dirs/many?{q}")).send().await.unwrap();
        assert_eq!(res.status(), 400, "{q}");
    }
    let (status, code) = error_code(s.admin(Method::GET, "/dirs/many/f01").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (409, "not_dir"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkdir_rename_and_delete() {
    let s = start().await;
    let (status, code) = error_code(s.admin(Method::POST, "/dirs/a/b/c").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (404, "not_found"));
    assert!(s.names("").await.is_empty());

    let res = s.admin(Method::POST, "/dirs/a/b/c?parents=true").send().await.unwrap();
    assert_eq!(res.status(), 201);
    let res = s.admin(Method::POST, "/dirs/a/b/c?parents=true").send().await.unwrap();
    assert_eq!(res.status(), 200, "mkdir -p of an existing directory");
    let (status, code) = error_code(s.admin(Method::POST, "/dirs/a/b/c").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (409, "exists"));
    assert_eq!(s.names("/a/b").await, vec!["c"]);

    s.put_file("/a/b/c/data.bin", b"payload".to_vec()).await;
    s.admin_json(Method::POST, "/dirs/x/y?parents=true", None).await;
    let moved = s.admin_json(Method::POST, "/files/a/b/c/data.bin", Some(json!({ "rename_to": "/x/y/renamed.bin" }))).await;
    assert_eq!(moved["size"], 7);
    assert!(s.names("/a/b/c").await.is_empty());
    assert_eq!(s.names("/x/y").await, vec!["renamed.bin"]);
    assert_eq!(s.get_file("/x/y/renamed.bin").await.1, b"payload");

    // Renaming onto an existing file replaces it.
    s.put_file("/x/other.bin", b"other".to_vec()).await;
    s.admin_json(Method::POST, "/files/x/other.bin", Some(json!({ "rename_to": "/x/y/renamed.bin" }))).await;
    assert_eq!(s.get_file("/x/y/renamed.bin").await.1, b"other");
    assert_eq!(s.names("/x").await, vec!["y"]);

    // A whole directory moves too.
    s.admin_json(Method::POST, "/files/x/y", Some(json!({ "rename_to": "/a/y" }))).await;
    assert_eq!(s.get_file("/a/y/renamed.bin").await.1, b"other");

    for (body, want) in [
        (json!({ "rename_to": "/nowhere/z" }), 404),
        (json!({ "rename_to": "/a/../z" }), 400),
        (json!({ "rename_to": "/" }), 400),
        (json!({ "wrong": 1 }), 422),
    ] {
        let res = s.admin(Method::POST, "/files/a/y/renamed.bin").json(&body).send().await.unwrap();
        assert_eq!(res.status(), want, "{body}");
    }
    assert_eq!(s.get_file("/a/y/renamed.bin").await.0, 200);

    let (status, code) = error_code(s.admin(Method::DELETE, "/dirs/a").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (409, "not_empty"));
    let (status, code) = error_code(s.admin(Method::DELETE, "/files/a/y").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (409, "is_dir"));
    assert_eq!(s.admin(Method::DELETE, "/files/a/y/renamed.bin").send().await.unwrap().status(), 204);
    assert_eq!(s.get_file("/a/y/renamed.bin").await.0, 404);
    assert_eq!(s.admin(Method::DELETE, "/files/a/y/renamed.bin").send().await.unwrap().status(), 404);
    assert_eq!(s.admin(Method::DELETE, "/dirs/a/y").send().await.unwrap().status(), 204);
    assert_eq!(s.names("/a").await, vec!["b"]);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_refused_and_change_nothing() {
    let s = start().await;
    let files_before = s.file_count().await;
    let long = "n".repeat(256);
    let targets = [
        "/api/v1/files/new/../escape".to_string(),
        "/api/v1/files/new/./x".to_string(),
        "/api/v1/files/new/%2E%2E/x".to_string(),
        "/api/v1/files/new/a%00b".to_string(),
        "/api/v1/files/new/%FF%FE".to_string(),
        format!("/api/v1/files/new/{long}"),
        "/api/v1/files/new//x".to_string(),
        "/api/v1/files/new/x/".to_string(),
        "/api/v1/files/new/a%2Fb".to_string(),
    ];
    for t in &targets {
        let head = format!(
            "PUT {t} HTTP/1.1\r\nHost: aquifer\r\n{}Content-Length: 4\r\nConnection: close\r\n\r\n",
            s.basic_header()
        );
        let (status, body) = s.raw(&head, b"data").await;
        assert_eq!(status, 400, "{t}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(v["error"], "invalid_name", "{t}: {body}");
        // Directory creation and listing refuse them too.
        let mk = t.replace("/files/", "/dirs/");
        let head = format!("POST {mk}?parents=true HTTP/1.1\r\nHost: aquifer\r\n{}Content-Length: 0\r\nConnection: close\r\n\r\n", s.basic_header());
        assert_eq!(s.raw(&head, b"").await.0, 400, "mkdir {mk}");
    }
    assert!(s.names("").await.is_empty(), "no parent directory was created");
    assert_eq!(s.file_count().await, files_before);
    // 255 bytes is the longest name.
    assert_eq!(s.put_file(&format!("/{}", "n".repeat(255)), b"ok".to_vec()).await, StatusCode::CREATED);
    // Percent-encoded but valid names round-trip.
    assert_eq!(s.put_file("/caf%C3%A9%20menu.txt", b"ok".to_vec()).await, StatusCode::CREATED);
    assert!(s.names("").await.contains(&"café menu.txt".to_string()));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_upload_leaves_nothing_visible() {
    let s = start().await;
    let original = random_bytes(200_000, 3);
    s.put_file("/keep.bin", original.clone()).await;
    let files_before = s.file_count().await;

    for target in ["/api/v1/files/partial.bin", "/api/v1/files/keep.bin"] {
        let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        let head = format!(
            "PUT {target} HTTP/1.1\r\nHost: aquifer\r\n{}Content-Length: {}\r\n\r\n",
            s.basic_header(),
            40 * MIB
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let chunk = random_bytes(MIB, 11);
        for _ in 0..24 {
            conn.write_all(&chunk).await.unwrap();
        }
        conn.flush().await.unwrap();
        // Give the server time to stage what it received, then vanish mid-body.
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(conn);

        // The staged file is aborted: the file count (which counts staged files) returns.
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.file_count().await != files_before {
            assert!(Instant::now() < deadline, "the staged upload of {target} was not aborted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(s.get_file("/partial.bin").await.0, 404);
    assert_eq!(s.names("").await, vec!["keep.bin"]);
    assert!(s.get_file("/keep.bin").await.1 == original, "the replaced file is untouched");
    s.stop().await;
}

/// An upload whose body stops arriving is answered `408` once it has been idle for the limit,
/// its connection is closed and nothing is left staged; one that arrives slowly but steadily
/// is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_upload_times_out_and_a_slow_one_does_not() {
    use tokio::io::AsyncReadExt;
    let s = start_opts(aquifer_rest::ServeOptions { body_idle_timeout_ms: Some(1_000) }).await;
    let files_before = s.file_count().await;
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!("PUT /api/v1/files/stalled.bin HTTP/1.1\r\nHost: aquifer\r\n{}Content-Length: {}\r\n\r\n", s.basic_header(), 4 * MIB);
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&random_bytes(MIB, 7)).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the connection was still open after 20 s: {}", String::from_utf8_lossy(&answer));
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(started.elapsed() >= Duration::from_millis(900), "answered after {:?}", started.elapsed());
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.file_count().await != files_before {
        assert!(Instant::now() < deadline, "the stalled upload was not aborted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(s.get_file("/stalled.bin").await.0, 404);

    // Ten bytes, one every 400 ms: slower than the limit in all, never idle for it.
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let head = format!("PUT /api/v1/files/slow.bin HTTP/1.1\r\nHost: aquifer\r\n{}Content-Length: 10\r\n\r\n", s.basic_header());
    conn.write_all(head.as_bytes()).await.unwrap();
    for b in b"0123456789" {
        tokio::time::sleep(Duration::from_millis(400)).await;
        conn.write_all(&[*b]).await.unwrap();
    }
    let mut status = [0u8; 10];
    conn.read_exact(&mut status).await.unwrap();
    assert!(status.starts_with(b"HTTP/1.1 2"), "{}", String::from_utf8_lossy(&status));
    assert_eq!(s.get_file("/slow.bin").await.1, b"0123456789");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrub_and_rebuild_jobs_run_to_completion() {
    let s = start().await;
    let data = random_bytes(9 * MIB, 5);
    s.put_file("/jobs/data.bin", data.clone()).await;

    let started = s.admin_json(Method::POST, "/jobs", Some(json!({ "kind": "scrub" }))).await;
    let id = started["job_id"].as_u64().unwrap();
    let job = wait_job(&s, id).await;
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["kind"], "scrub");
    assert_eq!(job["progress"], 1.0);
    assert!(job["stripes_total"].as_u64().unwrap() >= 3, "{job}");
    assert_eq!(job["stripes_done"], job["stripes_total"]);
    assert_eq!(job["shards_bad"], 0);
    let list = s.admin_json(Method::GET, "/jobs", None).await;
    assert_eq!(list[0]["id"], id);

    // Cancelling a finished job is refused; unknown jobs are 404.
    assert_eq!(s.admin(Method::POST, &format!("/jobs/{id}/cancel")).send().await.unwrap().status(), 400);
    assert_eq!(s.admin(Method::GET, "/jobs/999999").send().await.unwrap().status(), 404);
    for body in [json!({ "kind": "defrag" }), json!({ "kind": "rebuild" }), json!({ "kind": "scrub", "drive": 1 })] {
        assert_eq!(s.admin(Method::POST, "/jobs").json(&body).send().await.unwrap().status(), 400, "{body}");
    }

    // Fail a drive, replace it with a new file, and rebuild onto it.
    let failed = s.admin_json(Method::POST, "/drives/2/fail", Some(json!({ "reason": "pulled" }))).await;
    assert_eq!(failed["state"], "failed");
    assert_eq!(failed["reason"], "pulled");
    let h: Value = s.anon(Method::GET, "/health").send().await.unwrap().json().await.unwrap();
    assert_eq!(h["state"], "degraded");
    assert!(s.get_file("/jobs/data.bin").await.1 == data, "readable while degraded");

    let new_path = s.dir.path().join("spare-2.img");
    let started = s
        .admin_json(Method::POST, "/drives/2/replace", Some(json!({ "path": new_path.display().to_string(), "size_bytes": DRIVE_BYTES })))
        .await;
    let job = wait_job(&s, started["job_id"].as_u64().unwrap()).await;
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["kind"], "rebuild");
    assert_eq!(job["drive"], 2);
    assert!(job["shards_repaired"].as_u64().unwrap() > 0, "{job}");
    let drive = s.admin_json(Method::GET, "/drives/2", None).await;
    assert_eq!(drive["state"], "online");
    assert_eq!(drive["path"], new_path.display().to_string());
    assert_eq!(drive["epoch"], 2);
    assert!(s.get_file("/jobs/data.bin").await.1 == data);
    let h: Value = s.anon(Method::GET, "/health").send().await.unwrap().json().await.unwrap();
    assert_eq!(h["state"], "ok");
    assert_eq!(s.admin(Method::GET, "/drives/99").send().await.unwrap().status(), 404);
    assert_eq!(s.admin(Method::GET, "/drives/x").send().await.unwrap().status(), 400);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_groups_crud() {
    let s = start().await;
    let g = s.admin_json(Method::POST, "/groups", Some(json!({ "name": "research", "gid": 5000 }))).await;
    assert_eq!(g["gid"], 5000);
    let res = s.admin(Method::POST, "/groups").json(&json!({ "name": "research" })).send().await.unwrap();
    assert_eq!(res.status(), 409);

    let res = s
        .admin(Method::POST, "/users")
        .json(&json!({ "name": "carol", "password": "carol-password", "groups": [5000], "role": "operator" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let carol: Value = res.json().await.unwrap();
    assert_eq!(carol["role"], "operator");
    assert_eq!(carol["groups"], json!([5000]));
    let uid = carol["uid"].as_u64().unwrap();
    assert!(uid >= 1000);

    for (body, want) in [
        (json!({ "name": "carol", "password": "another-password" }), 409),
        (json!({ "name": "dave", "password": "short" }), 400),
        (json!({ "name": "dave", "password": "dave-password", "role": "emperor" }), 400),
        (json!({ "name": "../dave", "password": "dave-password" }), 400),
        (json!({ "name": "dave" }), 422),
    ] {
        assert_eq!(s.admin(Method::POST, "/users").json(&body).send().await.unwrap().status(), want, "{body}");
    }

    let got = s.admin_json(Method::GET, "/users/carol", None).await;
    assert_eq!(got, carol);
    let names: Vec<String> =
        s.admin_json(Method::GET, "/users", None).await.as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, vec!["admin", "carol"]);
    let groups = s.admin_json(Method::GET, "/groups", None).await;
    assert!(groups.as_array().unwrap().iter().any(|g| g["name"] == "carol" && g["gid"] == uid), "private group: {groups}");

    // Carol changes her own password; then the old one stops working.
    let res = s
        .as_user(Method::PATCH, "/users/carol", "carol", "carol-password")
        .json(&json!({ "password": "carol-new-password" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(s.as_user(Method::GET, "/drives", "carol", "carol-new-password").send().await.unwrap().status(), 200);
    assert_eq!(s.as_user(Method::GET, "/drives", "carol", "carol-password").send().await.unwrap().status(), 401);

    let patched = s.admin_json(Method::PATCH, "/users/carol", Some(json!({ "role": "read-only", "disabled": true }))).await;
    assert_eq!(patched["role"], "read-only");
    assert_eq!(patched["disabled"], true);
    assert_eq!(s.as_user(Method::GET, "/drives", "carol", "carol-new-password").send().await.unwrap().status(), 401);

    // The primary group of a user cannot go while the user exists.
    assert_eq!(s.admin(Method::DELETE, "/groups/carol").send().await.unwrap().status(), 409);
    assert_eq!(s.admin(Method::DELETE, "/users/carol").send().await.unwrap().status(), 204);
    assert_eq!(s.admin(Method::GET, "/users/carol").send().await.unwrap().status(), 404);
    assert_eq!(s.admin(Method::DELETE, "/users/carol").send().await.unwrap().status(), 404);
    assert_eq!(s.admin(Method::DELETE, "/groups/carol").send().await.unwrap().status(), 204);
    assert_eq!(s.admin(Method::DELETE, "/groups/research").send().await.unwrap().status(), 204);
    assert_eq!(s.admin(Method::DELETE, "/users/admin").send().await.unwrap().status(), 400);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reads_pools_and_capacity() {
    let s = start().await;
    let pools = s.admin_json(Method::GET, "/pools", None).await;
    assert_eq!(pools[0]["data_shards"], 4);
    assert_eq!(pools[0]["parity_shards"], 2);
    assert_eq!(pools[0]["drives"].as_array().unwrap().len(), DRIVES);
    let cap = s.admin_json(Method::GET, "/capacity", None).await;
    let raw = cap["raw_total_bytes"].as_u64().unwrap();
    assert!(raw > 0 && raw <= DRIVES as u64 * DRIVE_BYTES);
    assert!(cap["total_bytes"].as_u64().unwrap() <= raw * 4 / 6 + 1);
    let drives = s.admin_json(Method::GET, "/drives", None).await;
    assert_eq!(drives.as_array().unwrap().len(), DRIVES);
    assert!(drives.as_array().unwrap().iter().all(|d| d["state"] == "online"));
    // The data cache: a file read three times is kept, the fourth read is a hit.
    let cache = s.admin_json(Method::GET, "/cache", None).await;
    assert!(cache["max_bytes"].as_u64().unwrap() > 0);
    assert_eq!(cache["bytes"], 0);
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let res = s.admin(Method::PUT, "/files/cached.bin").body(body.clone()).send().await.unwrap();
    assert!(res.status().is_success());
    for _ in 0..4 {
        let res = s.admin(Method::GET, "/files/cached.bin").send().await.unwrap();
        assert!(res.bytes().await.unwrap() == body);
    }
    let cache = s.admin_json(Method::GET, "/cache", None).await;
    assert!(cache["bytes"].as_u64().unwrap() >= 1_000_000, "{cache}");
    assert!(cache["entries"].as_u64().unwrap() > 0 && cache["hits"].as_u64().unwrap() > 0, "{cache}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_and_error_format() {
    let s = start().await;
    // JSON bodies are limited to 1 MiB: the server stops reading past the limit and answers.
    let head = format!(
        "POST /api/v1/users HTTP/1.1\r\nHost: aquifer\r\n{}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        s.basic_header(),
        2 * MIB
    );
    let mut body = br#"{"name": "x", "password": ""#.to_vec();
    body.resize(MIB + 1, b'p');
    let (status, text) = s.raw(&head, &body).await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("body_too_large"), "{text}");
    assert_eq!(s.admin_json(Method::GET, "/users", None).await.as_array().unwrap().len(), 1);
    let (status, code) = error_code(s.admin(Method::POST, "/users").body("{not json").header(header::CONTENT_TYPE, "application/json").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (400, "invalid_body"));
    let (status, code) = error_code(s.admin(Method::GET, "/no/such/route").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (404, "no_route"));
    let (status, code) = error_code(s.admin(Method::PATCH, "/drives").send().await.unwrap()).await;
    assert_eq!((status.as_u16(), code.as_str()), (405, "method_not_allowed"));

    // A client that never finishes its headers is disconnected.
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(b"GET /api/v1/health HTTP/1.1\r\nHost: aquifer\r\n").await.unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut buf)).await;
    assert!(read.is_ok(), "connection still open after 30 s");
    assert!(started.elapsed() >= Duration::from_millis(aquifer_rest::HEADER_READ_TIMEOUT_MS - 1000));
    s.stop().await;
}

/// Sample values for path parameters when probing every documented route.
fn sample_path(p: &str) -> String {
    p.replace("{path}", "probe/file.txt").replace("{index}", "99").replace("{id}", "999999").replace("{name}", "nobody").replace("{user}", "nobody")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openapi_documents_exactly_the_served_routes() {
    let s = start().await;
    let res = s.anon(Method::GET, "/openapi.json").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let doc: Value = res.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            assert!(op["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path} has responses");
            documented.push((method.to_uppercase(), path.clone()));
            // Every referenced schema exists.
            for r in op.to_string().split("#/components/schemas/").skip(1) {
                let name: String = r.chars().take_while(|c| c.is_alphanumeric()).collect();
                assert!(doc["components"]["schemas"].get(&name).is_some(), "schema {name}");
            }
        }
    }
    documented.sort();
    let served = aquifer_rest::served_routes();
    assert_eq!(documented, served, "the OpenAPI document and the router disagree");

    // Every route the router reports is really routed: none falls through to the fallback.
    for (method, path) in &served {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        let url = sample_path(path).trim_start_matches("/api/v1").to_string();
        let res = s.admin(m, &url).send().await.unwrap();
        let status = res.status();
        let text = res.text().await.unwrap();
        assert!(status != 405, "{method} {path}: {status} {text}");
        assert!(!text.contains("\"no_route\""), "{method} {path}: {status} {text}");
    }
    // And the spec's resources are all there.
    for (m, p) in [
        ("GET", "/api/v1/health"),
        ("POST", "/api/v1/auth/tokens"),
        ("DELETE", "/api/v1/auth/tokens/{id}"),
        ("POST", "/api/v1/drives/{index}/replace"),
        ("GET", "/api/v1/capacity"),
        ("GET", "/api/v1/cache"),
        ("PATCH", "/api/v1/users/{name}"),
        ("POST", "/api/v1/jobs/{id}/cancel"),
        ("PUT", "/api/v1/files/{path}"),
        ("HEAD", "/api/v1/files/{path}"),
        ("GET", "/api/v1/dirs"),
        ("DELETE", "/api/v1/dirs/{path}"),
        ("GET", "/api/v1/openapi.json"),
    ] {
        assert!(served.contains(&(m.to_string(), p.to_string())), "{m} {p}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_requests_in_flight() {
    let s = start().await;
    let data = random_bytes(6 * MIB, 9);
    s.put_file("/f.bin", data.clone()).await;
    // Start a download, then ask the server to stop while it streams.
    let res = s.admin(Method::GET, "/files/f.bin").send().await.unwrap();
    assert_eq!(res.status(), 200);
    let addr = s.addr;
    let reader = tokio::spawn(async move { res.bytes().await.map(|b| b.to_vec()) });
    s.stop().await;
    let got = reader.await.unwrap().expect("download completes across shutdown");
    assert!(got == data);
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no longer listening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_and_ssh_keys_are_managed_per_user() {
    let s = start().await;
    create_user(&s, "dana", "dana-password", "user").await;
    // Dana issues her own S3 key; the secret is shown once and resolves to her.
    let res = s.as_user(Method::POST, "/users/dana/s3-keys", "dana", "dana-password").send().await.unwrap();
    assert_eq!(res.status(), 201);
    let k: Value = res.json().await.unwrap();
    let access = k["access_key"].as_str().unwrap().to_string();
    let (secret, who) = s.engine.s3_credentials(&access).unwrap();
    assert_eq!(secret, k["secret_key"].as_str().unwrap());
    assert_eq!(who.user, "dana");
    // Not for somebody else.
    let res = s.as_user(Method::POST, "/users/admin/s3-keys", "dana", "dana-password").send().await.unwrap();
    assert_eq!(res.status(), 403);
    // Admin stores a given pair; half a pair is refused.
    let res = s.admin(Method::POST, "/users/dana/s3-keys").json(&json!({ "access_key": "DANAFIXED", "secret_key": "dana-fixed-secret" })).send().await.unwrap();
    assert_eq!(res.status(), 201);
    let res = s.admin(Method::POST, "/users/dana/s3-keys").json(&json!({ "access_key": "ONLYHALF" })).send().await.unwrap();
    assert_eq!(res.status(), 400);
    let listed = s.admin_json(Method::GET, "/s3-keys", None).await;
    assert!(listed.as_array().unwrap().iter().all(|k| k.get("secret_key").is_none()), "secrets are never listed");
    assert_eq!(listed.as_array().unwrap().iter().filter(|k| k["user"] == "dana").count(), 2);
    let res = s.as_user(Method::DELETE, &format!("/s3-keys/{access}"), "dana", "dana-password").send().await.unwrap();
    assert_eq!(res.status(), 204);
    assert!(s.engine.s3_credentials(&access).is_err());

    let line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPkxDfaWnWQ6Rb1bOy8a1tTXGlHe5cRP1tUjZ7kBKf2V dana@laptop";
    let res = s.as_user(Method::POST, "/users/dana/ssh-keys", "dana", "dana-password").json(&json!({ "key": line })).send().await.unwrap();
    assert_eq!(res.status(), 201);
    let id = res.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let res = s.as_user(Method::POST, "/users/dana/ssh-keys", "dana", "dana-password").json(&json!({ "key": "garbage" })).send().await.unwrap();
    assert_eq!(res.status(), 400);
    let keys = s.admin_json(Method::GET, "/users/dana/ssh-keys", None).await;
    assert_eq!(keys.as_array().unwrap().len(), 1);
    let res = s.as_user(Method::DELETE, &format!("/users/dana/ssh-keys/{id}"), "dana", "dana-password").send().await.unwrap();
    assert_eq!(res.status(), 204);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sftp_chroots_are_set_listed_removed_and_validated() {
    let s = start().await;
    create_user(&s, "alice", "alice-password", "user").await;
    create_user(&s, "olga", "olga-password", "operator").await;
    s.admin_json(Method::POST, "/dirs/home/alice?parents=true", None).await;
    s.put_file("/home/notes.txt", b"not a directory".to_vec()).await;
    assert_eq!(s.admin_json(Method::GET, "/sftp/chroots", None).await, json!([]));

    // Set: stored normalised, in the setting the SFTP service reads at each login.
    let v = s.admin_json(Method::PUT, "/sftp/chroots/alice", Some(json!({ "path": "/home/./alice/" }))).await;
    assert_eq!(v, json!({ "user": "alice", "path": "/home/alice" }));
    let stored = s.engine.sftp_chroot("alice").unwrap();
    assert_eq!(stored.as_deref(), Some("/home/alice"));
    assert_eq!(s.admin_json(Method::GET, "/sftp/chroots/alice", None).await, json!({ "user": "alice", "path": "/home/alice" }));
    assert_eq!(s.admin_json(Method::GET, "/sftp/chroots", None).await, json!([{ "user": "alice", "path": "/home/alice" }]));
    // Setting it again replaces it.
    let v = s.admin_json(Method::PUT, "/sftp/chroots/alice", Some(json!({ "path": "/home/alice/../" }))).await;
    assert_eq!(v["path"], "/home");

    // Bad input: a clear 4xx, and nothing changes.
    for (user, body, status, needle) in [
        ("alice", json!({ "path": "home/alice" }), 400, "absolute"),
        ("alice", json!({ "path": "" }), 400, "absolute"),
        ("alice", json!({ "path": "/nowhere" }), 404, "/nowhere does not exist"),
        ("alice", json!({ "path": "/home/notes.txt" }), 400, "not a directory"),
        ("alice", json!({ "path": "/home/notes.txt/below" }), 400, "not a directory"),
        ("nobody", json!({ "path": "/home" }), 404, "no user nobody"),
        ("alice", json!({ "dir": "/home" }), 422, "dir"),
        ("alice", json!({ "path": 7 }), 422, "path"),
    ] {
        let res = s.admin(Method::PUT, &format!("/sftp/chroots/{user}")).json(&body).send().await.unwrap();
        let status_got = res.status().as_u16();
        let text = res.text().await.unwrap();
        assert_eq!(status_got, status, "{user} {body}: {text}");
        assert!(text.contains(needle), "{user} {body}: {text}");
    }
    assert_eq!(s.admin_json(Method::GET, "/sftp/chroots", None).await, json!([{ "user": "alice", "path": "/home" }]));
    let res = s.admin(Method::GET, "/sftp/chroots/olga").send().await.unwrap();
    assert_eq!(res.status(), 404);

    // Only admins: users and operators are refused and change nothing; no credentials is 401.
    for (who, password) in [("alice", "alice-password"), ("olga", "olga-password")] {
        for (method, path) in [(Method::GET, "/sftp/chroots"), (Method::GET, "/sftp/chroots/alice"), (Method::DELETE, "/sftp/chroots/alice")] {
            let res = s.as_user(method.clone(), path, who, password).send().await.unwrap();
            assert_eq!(res.status(), 403, "{who} {method} {path}");
        }
        let res = s.as_user(Method::PUT, &format!("/sftp/chroots/{who}"), who, password).json(&json!({ "path": "/" })).send().await.unwrap();
        assert_eq!(res.status(), 403, "{who} PUT");
    }
    let res = s.anon(Method::PUT, "/sftp/chroots/alice").json(&json!({ "path": "/" })).send().await.unwrap();
    assert_eq!(res.status(), 401);
    assert_eq!(s.admin_json(Method::GET, "/sftp/chroots", None).await, json!([{ "user": "alice", "path": "/home" }]));
    assert_eq!(s.engine.sftp_chroot("olga").unwrap(), None);

    // Delete lifts it; deleting again is 404.
    let res = s.admin(Method::DELETE, "/sftp/chroots/alice").send().await.unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(s.engine.sftp_chroot("alice").unwrap(), None);
    let res = s.admin(Method::DELETE, "/sftp/chroots/alice").send().await.unwrap();
    assert_eq!(res.status(), 404);
    assert!(res.text().await.unwrap().contains("has no SFTP chroot"));
    assert_eq!(s.admin_json(Method::GET, "/sftp/chroots", None).await, json!([]));

    // Every change and refusal by an admin is in the audit log, with its outcome.
    let audit = s.admin_json(Method::GET, "/audit?after=0&limit=1000", None).await;
    let recs: Vec<(String, String, String)> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"].as_str().unwrap().starts_with("sftp.chroot."))
        .map(|r| (r["action"].as_str().unwrap().to_string(), r["target"].as_str().unwrap().to_string(), r["outcome"].as_str().unwrap().to_string()))
        .collect();
    let set_ok = recs.iter().filter(|(a, _, o)| a == "sftp.chroot.set" && o == "ok").count();
    assert_eq!(set_ok, 2, "{recs:?}");
    assert!(recs.iter().any(|(a, t, o)| a == "sftp.chroot.set" && t.contains("/nowhere") && o.contains("does not exist")), "{recs:?}");
    assert!(recs.iter().any(|(a, t, o)| a == "sftp.chroot.set" && t.starts_with("nobody") && o.contains("no user")), "{recs:?}");
    assert!(recs.iter().any(|(a, t, o)| a == "sftp.chroot.remove" && t == "alice" && o == "ok"), "{recs:?}");
    assert!(recs.iter().all(|(_, t, _)| !t.starts_with("olga")), "refused non-admins change nothing and are not recorded as changes: {recs:?}");
    s.stop().await;
}
