//! A real engine on small file drives in a temporary directory, served over real HTTP on an
//! ephemeral 127.0.0.1 port.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::Value;
use storage_engine::{Engine, EngineConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const ADMIN_PASSWORD: &str = "admin-secret-1";
pub const DRIVES: usize = 6;
pub const DRIVE_BYTES: u64 = 64 << 20;

pub struct Server {
    pub addr: SocketAddr,
    pub engine: Arc<Engine>,
    pub http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    pub dir: tempfile::TempDir,
}

pub async fn start() -> Server {
    start_opts(aquifer_rest::ServeOptions::default()).await
}

pub async fn start_opts(opts: aquifer_rest::ServeOptions) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = EngineConfig::with_file_drives(dir.path(), DRIVES, DRIVE_BYTES, 4, 2);
    cfg.admin_password = Some(ADMIN_PASSWORD.into());
    cfg.argon2_memory_kib = 64;
    let engine = tokio::task::spawn_blocking(move || Engine::open(cfg)).await.expect("join").expect("open engine");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(aquifer_rest::serve_opts(engine.clone(), aquifer_rest::Hooks::default(), opts, listener, async move {
        let _ = stopped.await;
    }));
    Server { addr, engine, http: reqwest::Client::new(), stop: Some(stop), task: Some(task), dir }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/api/v1{path}", self.addr)
    }

    /// A request without credentials.
    pub fn anon(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, self.url(path))
    }

    pub fn as_user(&self, method: Method, path: &str, user: &str, password: &str) -> RequestBuilder {
        self.anon(method, path).basic_auth(user, Some(password))
    }

    pub fn admin(&self, method: Method, path: &str) -> RequestBuilder {
        self.as_user(method, path, "admin", ADMIN_PASSWORD)
    }

    pub fn bearer(&self, method: Method, path: &str, token: &str) -> RequestBuilder {
        self.anon(method, path).bearer_auth(token)
    }

    /// An admin request that must succeed; returns its JSON (Null when there is no body).
    pub async fn admin_json(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let mut rb = self.admin(method.clone(), path);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let res = rb.send().await.expect("send");
        let status = res.status();
        let text = res.text().await.expect("body");
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        if text.is_empty() { Value::Null } else { serde_json::from_str(&text).expect("json") }
    }

    pub async fn put_file(&self, path: &str, data: Vec<u8>) -> StatusCode {
        let res = self.admin(Method::PUT, &format!("/files{path}")).body(data).send().await.expect("send");
        let status = res.status();
        assert!(status.is_success(), "put {path}: {status} {}", res.text().await.unwrap_or_default());
        status
    }

    pub async fn get_file(&self, path: &str) -> (StatusCode, Vec<u8>) {
        let res = self.admin(Method::GET, &format!("/files{path}")).send().await.expect("send");
        let status = res.status();
        (status, res.bytes().await.expect("body").to_vec())
    }

    pub async fn file_count(&self) -> u64 {
        self.admin_json(Method::GET, "/capacity", None).await["files"].as_u64().expect("files")
    }

    /// Names in a directory listing (first page).
    pub async fn names(&self, dir: &str) -> Vec<String> {
        let v = self.admin_json(Method::GET, &format!("/dirs{dir}"), None).await;
        v["entries"].as_array().expect("entries").iter().map(|e| e["name"].as_str().unwrap().to_string()).collect()
    }

    /// Sends raw bytes as one HTTP/1.1 request (for request targets that URL libraries would
    /// normalise, such as `..`) and returns the status code and body.
    pub async fn raw(&self, request_head: &str, body: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(self.addr).await.expect("connect");
        s.write_all(request_head.as_bytes()).await.expect("write head");
        s.write_all(body).await.expect("write body");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await.expect("answer in time").expect("read");
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    pub fn basic_header(&self) -> String {
        format!("Authorization: Basic {}\r\n", base64(&format!("admin:{ADMIN_PASSWORD}")))
    }

    /// Stops the server gracefully and shuts the engine down.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(40), task).await.expect("server stops").expect("join").expect("serve");
        }
        let engine = self.engine.clone();
        tokio::task::spawn_blocking(move || engine.shutdown()).await.expect("join").expect("engine shutdown");
    }
}

pub fn base64(s: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (chunk[0] as u32) << 16 | (*chunk.get(1).unwrap_or(&0) as u32) << 8 | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Deterministic pseudo-random bytes (xorshift), so a failure replays.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub async fn error_code(res: reqwest::Response) -> (StatusCode, String) {
    let status = res.status();
    let v: Value = res.json().await.unwrap_or(Value::Null);
    (status, v["error"].as_str().unwrap_or("").to_string())
}
