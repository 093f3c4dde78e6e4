//! A real engine on small file drives in a temporary directory, its S3 adapter on an
//! ephemeral 127.0.0.1 port, an access key made with `create_s3_key`, and a small SigV4
//! signer for raw requests that no client library would send.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use storage_engine::{Caller, Engine, EngineConfig, NewUser};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const DRIVES: usize = 6;
pub const DRIVE_BYTES: u64 = 256 << 20;
pub const REGION: &str = "us-east-1";

pub struct Server {
    pub addr: SocketAddr,
    pub engine: Arc<Engine>,
    pub access: String,
    pub secret: String,
    pub http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    pub dir: tempfile::TempDir,
}

pub async fn start() -> Server {
    start_with(aquifer_s3::S3Options::default()).await
}

#[allow(dead_code)] // not every test binary starts a listener with options
pub async fn start_with(opts: aquifer_s3::S3Options) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = EngineConfig::with_file_drives(dir.path(), DRIVES, DRIVE_BYTES, 4, 2);
    cfg.admin_password = Some("admin-secret-1".into());
    cfg.argon2_memory_kib = 64;
    let engine = tokio::task::spawn_blocking(move || Engine::open(cfg)).await.expect("join").expect("open engine");
    let e = engine.clone();
    let (access, secret) = tokio::task::spawn_blocking(move || {
        let admin = Caller::system();
        e.create_user(&admin, NewUser { name: "alice".into(), password: "alice-password".into(), uid: None, gid: None, groups: vec![], role: None })
            .expect("create user");
        // Alice may create buckets: the root directory is sticky and world-writable in these tests.
        e.setattr(&admin, storage_engine::ROOT_INO, storage_engine::SetAttr { mode: Some(0o1777), ..Default::default() }).expect("chmod root");
        e.create_s3_key(&admin, "alice", None).expect("create s3 key")
    })
    .await
    .expect("join");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(aquifer_s3::serve(engine.clone(), listener, opts, async move {
        let _ = stopped.await;
    }));
    Server { addr, engine, access, secret, http: reqwest::Client::new(), stop: Some(stop), task: Some(task), dir }
}

impl Server {
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A signed request (SigV4, header form, payload hash included).
    pub fn signed(&self, method: &str, path: &str, query: &[(&str, &str)], body: Vec<u8>) -> reqwest::RequestBuilder {
        self.signed_with(method, path, query, body, &self.access, &self.secret)
    }

    pub fn signed_with(&self, method: &str, path: &str, query: &[(&str, &str)], body: Vec<u8>, access: &str, secret: &str) -> reqwest::RequestBuilder {
        sign(&self.http, &self.addr.to_string(), method, path, query, body, access, secret)
    }

    /// A signed request to `host` (`name:port`), sent with `client` (which resolves the name).
    pub fn signed_at(&self, client: &reqwest::Client, host: &str, method: &str, path: &str, query: &[(&str, &str)], body: Vec<u8>) -> reqwest::RequestBuilder {
        sign(client, host, method, path, query, body, &self.access, &self.secret)
    }

    /// Sends a signed request; returns (status, body text).
    pub async fn call(&self, method: &str, path: &str, query: &[(&str, &str)], body: Vec<u8>) -> (u16, String) {
        let res = self.signed(method, path, query, body).send().await.expect("send");
        let status = res.status().as_u16();
        (status, res.text().await.expect("body"))
    }

    /// Runs blocking engine work.
    pub async fn with_engine<T: Send + 'static>(&self, f: impl FnOnce(&Engine) -> T + Send + 'static) -> T {
        let e = self.engine.clone();
        tokio::task::spawn_blocking(move || f(&e)).await.expect("join")
    }

    /// Waits up to 10 s for the drives' used space to come back to `before` (a refused or
    /// dropped upload's space is freed as its staged file is dropped), failing otherwise.
    pub async fn assert_space_returns_to(&self, before: u64) {
        for _ in 0..100 {
            if self.used_bytes().await == before {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("space used before {before}, after {}", self.used_bytes().await);
    }

    pub async fn used_bytes(&self) -> u64 {
        self.with_engine(|e| {
            e.sync_metadata().expect("sync metadata");
            e.drives().iter().map(|d| d.used_bytes).sum()
        })
        .await
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("join").expect("serve");
        }
        // Requests' work on the blocking pool may still hold the engine for a moment: the
        // engine closes here, before the test's directory is removed, not on a pool thread
        // in the middle of the removal.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while Arc::strong_count(&self.engine) > 1 {
            assert!(std::time::Instant::now() < deadline, "the engine is still held 30 s after the listener stopped");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.engine.shutdown().expect("engine shutdown");
    }
}

/// The `<Code>` of an S3 error body.
pub fn error_code(body: &str) -> &str {
    body.split("<Code>").nth(1).and_then(|s| s.split("</Code>").next()).unwrap_or("")
}

pub fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// The SigV4 signing key of `secret` for `day` (`YYYYMMDD`).
pub fn signing_key(secret: &str, day: &str) -> Vec<u8> {
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), day.as_bytes());
    for part in [REGION, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    key
}

/// SigV4 URI encoding; '/' stays in paths.
pub fn uri_encode(s: &str, encode_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (b == b'/' && !encode_slash) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// (`YYYYMMDDTHHMMSSZ`, `YYYYMMDD`) for now, UTC.
pub fn amz_now() -> (String, String) {
    amz_ago(0)
}

/// (`YYYYMMDDTHHMMSSZ`, `YYYYMMDD`) for `ago` seconds before now, UTC.
pub fn amz_ago(ago: i64) -> (String, String) {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_secs() as i64 - ago;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = storage_engine::civil_from_days(days);
    let day = format!("{y:04}{m:02}{d:02}");
    (format!("{day}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60), day)
}

impl Server {
    /// Sends a signed request over a plain TCP connection with `path` exactly as given (HTTP
    /// libraries normalise `.` and `..` segments away); returns (status, body).
    pub async fn raw(&self, method: &str, path: &str, body: Vec<u8>) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let req = self.signed(method, path, &[], body.clone()).build().expect("request");
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\nconnection: close\r\n", self.addr, body.len());
        for (k, v) in req.headers() {
            head.push_str(&format!("{}: {}\r\n", k, v.to_str().expect("ASCII header")));
        }
        head.push_str("\r\n");
        let mut tcp = tokio::net::TcpStream::connect(self.addr).await.expect("connect");
        tcp.write_all(head.as_bytes()).await.expect("send head");
        tcp.write_all(&body).await.expect("send body");
        let mut out = Vec::new();
        tcp.read_to_end(&mut out).await.expect("read answer");
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }
}

/// Standard base64 with padding (Content-MD5 values, POST form fields).
#[allow(dead_code)] // not every test binary sends base64
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Signs a request (SigV4, header form, payload hash included) for `host` (`name:port`).
#[allow(clippy::too_many_arguments)]
fn sign(client: &reqwest::Client, host: &str, method: &str, path: &str, query: &[(&str, &str)], body: Vec<u8>, access: &str, secret: &str) -> reqwest::RequestBuilder {
    let (amz_date, day) = amz_now();
    let payload = hex::encode(Sha256::digest(&body));
    let mut q: Vec<(String, String)> = query.iter().map(|(k, v)| (uri_encode(k, true), uri_encode(v, true))).collect();
    q.sort();
    let canonical_query = q.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
    let canonical_path = uri_encode(path, false);
    let canonical = format!(
        "{method}\n{canonical_path}\n{canonical_query}\nhost:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}"
    );
    let scope = format!("{day}/{REGION}/s3/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let sig = hex::encode(hmac(&signing_key(secret, &day), to_sign.as_bytes()));
    let auth = format!("AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}");
    let url = if canonical_query.is_empty() {
        format!("http://{host}{canonical_path}")
    } else {
        format!("http://{host}{canonical_path}?{canonical_query}")
    };
    let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    client
        .request(m, url)
        .header("x-amz-date", amz_date)
        .header("x-amz-content-sha256", payload)
        .header("authorization", auth)
        .body(body)
}
