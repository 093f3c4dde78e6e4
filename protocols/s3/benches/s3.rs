//! S3 throughput of the Aquifer daemon against the loopback limit (`iperf3`), the disk's
//! limit (O_DIRECT writes and reads of the same volume) and the s3s reference server
//! (`s3s-fs` 0.14.1), all measured in one run with one client.
//!
//! The machines this runs on are shared and noisy, so the throughput measurements run in
//! rounds (`S3_BENCH_ROUNDS`, default 3): each round measures the loopback and disk limits, then both
//! servers one after the other (the order alternating between rounds), and each ratio is taken
//! within its round. The table gives the median of the rounds' values and of their ratios,
//! with the ratios' range; the listing is measured once per server, after the rounds.
//!
//! ```text
//! cd /work/main && CARGO_TARGET_DIR=/var/cache/aquifer-target cargo build --workspace --all-targets
//! CARGO_TARGET_DIR=/var/cache/aquifer-target cargo bench -p aquifer-s3 --bench s3 --profile dev
//! ```
//!
//! Both servers run as their own processes, with their data in temporary directories on the
//! same filesystem (`S3_BENCH_DIR`, default the system temp directory). The client is this
//! program: reqwest with a small SigV4 signer (header form, `UNSIGNED-PAYLOAD`, so the client
//! hashes nothing), the same requests for both servers. Measurements:
//!
//! - PUT then GET of 64 MiB objects, 1 stream and 8 concurrent streams (MiB/s of object data),
//!   and a GET of the same objects read again (after two more unmeasured GETs: Aquifer's data
//!   cache keeps a shard once twice its data was read; s3s-fs reads through the page cache);
//! - PUT then GET of 4 KiB objects, 1 and 8 streams (operations/s), 6,000 a phase
//!   (`S3_BENCH_SMALL_OBJECTS`); `S3_BENCH_ROWS=large` or `small` measures only those rows;
//! - ListObjectsV2 of a bucket of 100,000 keys (`S3_BENCH_LIST_KEYS`, 0 leaves it out), 1000 keys a page:
//!   seconds to list them all (a listing is stopped after `LIST_SECS_MAX` and shown as "> s");
//! - in each round, MD5 on one core: a one-stream PUT cannot outrun the hash of its ETag.
//!
//! Binaries: the daemon next to this bench in the target directory (or `AQUIFER_BIN`);
//! `s3s-fs` from `S3S_FS_BIN`, default `/var/cache/aquifer-tools/bin/s3s-fs`, installed with
//! `CARGO_TARGET_DIR=/var/cache/aquifer-tools-target cargo install s3s-fs --version 0.14.1
//! --features binary --root /var/cache/aquifer-tools`.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

const REGION: &str = "us-east-1";
const ACCESS: &str = "BENCHACCESSKEY000001";
const SECRET: &str = "bench-secret-key-0000000000000000000001";
const MIB: usize = 1 << 20;
/// Size of a large object.
const LARGE_BYTES: usize = 64 * MIB;
/// Large objects each stream moves, per phase: 1 stream moves 8, 8 streams move 16 in all.
const LARGE_OBJECTS_ONE_STREAM: usize = 8;
const LARGE_OBJECTS_PER_STREAM_OF_8: usize = 2;
/// GETs of the large objects between the first measured one and the "read again" one.
const REREADS_BEFORE_MEASURED: usize = 2;
const SMALL_BYTES: usize = 4096;
/// Small objects per phase (split across the streams), unless `S3_BENCH_SMALL_OBJECTS` says.
/// With 2,000, Aquifer's eight-stream phase lasted about 0.3 s and its ratio moved between
/// 1.14× and 2.25× from round to round; 6,000 make it about a second (s3s-fs's one-stream
/// GETs, ~46 a second, then take two minutes a round).
const SMALL_OBJECTS_DEFAULT: usize = 6000;
const LIST_KEYS_DEFAULT: usize = 100_000;
const LIST_PAGE_KEYS: usize = 1000;
/// A listing still running after this long is stopped and reported as "more than" (a
/// server that rescans the whole bucket for every page takes quadratic time).
const LIST_SECS_MAX: u64 = 120;
/// Streams used to fill the listing bucket.
const FILL_STREAMS: usize = 8;
/// How long a server may take to start listening.
const START_TIMEOUT_MS: u64 = 60_000;
/// Rounds of the throughput measurements (`S3_BENCH_ROUNDS`); each round measures the
/// loopback and disk limits and then both servers, in alternating order.
const ROUNDS_DEFAULT: usize = 3;
/// Seconds each iperf3 measurement runs.
const IPERF_SECS: u32 = 3;
/// The disk's limit: `DISK_BYTES` written, then read back, with O_DIRECT requests, in each
/// of the `DISK_SHAPES` (threads, a file each, and request size); the best shape for each
/// direction (on the VMs measured, which one is fastest moves from minute to minute; `fio`
/// once read 1,577 MiB/s with 4 MiB requests 8 deep and 2,024 with 1 MiB 16 deep).
const DISK_BYTES: usize = 1024 * MIB;
const DISK_SHAPES: [(usize, usize); 4] = [(1, 4 * MIB), (8, 4 * MIB), (16, 4 * MIB), (16, MIB)];

// ------------------------------------------------------------------ SigV4 client

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    addr: SocketAddr,
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

/// SigV4 URI encoding; '/' stays in paths.
fn uri_encode(s: &str, encode_slash: bool) -> String {
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
fn amz_now() -> (String, String) {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = storage_engine::civil_from_days(days);
    let day = format!("{y:04}{m:02}{d:02}");
    (format!("{day}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60), day)
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        Client { http: reqwest::Client::builder().pool_max_idle_per_host(64).build().expect("http client"), addr }
    }

    fn request(&self, method: &str, path: &str, query: &[(&str, &str)], body: Bytes) -> reqwest::RequestBuilder {
        let host = self.addr.to_string();
        let (amz_date, day) = amz_now();
        let payload = "UNSIGNED-PAYLOAD";
        let mut q: Vec<(String, String)> = query.iter().map(|(k, v)| (uri_encode(k, true), uri_encode(v, true))).collect();
        q.sort();
        let canonical_query = q.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
        let canonical_path = uri_encode(path, false);
        let canonical = format!(
            "{method}\n{canonical_path}\n{canonical_query}\nhost:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}"
        );
        let scope = format!("{day}/{REGION}/s3/aws4_request");
        let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
        let mut key = hmac(format!("AWS4{SECRET}").as_bytes(), day.as_bytes());
        for part in [REGION, "s3", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        let sig = hex::encode(hmac(&key, to_sign.as_bytes()));
        let auth = format!("AWS4-HMAC-SHA256 Credential={ACCESS}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}");
        let url = if canonical_query.is_empty() {
            format!("http://{host}{canonical_path}")
        } else {
            format!("http://{host}{canonical_path}?{canonical_query}")
        };
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        self.http.request(m, url).header("x-amz-date", amz_date).header("x-amz-content-sha256", payload).header("authorization", auth).body(body)
    }

    /// Sends a request that must succeed; returns the body.
    async fn call(&self, method: &str, path: &str, query: &[(&str, &str)], body: Bytes) -> Result<String> {
        let res = self.request(method, path, query, body).send().await.with_context(|| format!("send {method} {path}"))?;
        let status = res.status();
        let text = res.text().await.with_context(|| format!("read answer to {method} {path}"))?;
        ensure!(status.is_success(), "{method} {path}: {status}: {text}");
        Ok(text)
    }

    async fn put(&self, path: &str, body: Bytes) -> Result<()> {
        self.call("PUT", path, &[], body).await.map(|_| ())
    }

    /// GETs an object, streaming; returns its length.
    async fn get(&self, path: &str) -> Result<usize> {
        let mut res = self.request("GET", path, &[], Bytes::new()).send().await.with_context(|| format!("send GET {path}"))?;
        ensure!(res.status().is_success(), "GET {path}: {}", res.status());
        let mut n = 0;
        while let Some(c) = res.chunk().await.with_context(|| format!("read GET {path}"))? {
            n += c.len();
        }
        Ok(n)
    }
}

// ------------------------------------------------------------------ servers

struct Server {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bench_dir() -> PathBuf {
    std::env::var_os("S3_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn wait_listening(addr: SocketAddr, child: &mut Child) -> Result<()> {
    let start = Instant::now();
    while TcpStream::connect(addr).is_err() {
        if let Some(st) = child.try_wait()? {
            bail!("server exited before listening: {st}");
        }
        ensure!(start.elapsed() < Duration::from_millis(START_TIMEOUT_MS), "server did not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn aquifer_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("AQUIFER_BIN") {
        return Ok(PathBuf::from(p));
    }
    // This bench runs from <target>/<profile>/deps/; the daemon is <target>/<profile>/aquifer.
    let exe = std::env::current_exe()?;
    let p = exe.parent().and_then(|d| d.parent()).map(|d| d.join("aquifer")).context("locate the target directory")?;
    ensure!(p.exists(), "{} is missing: run `cargo build --workspace --all-targets` first, or set AQUIFER_BIN", p.display());
    Ok(p)
}

fn start_aquifer() -> Result<Server> {
    let dir = tempfile::tempdir_in(bench_dir()).context("create the Aquifer data directory")?;
    let mut child = Command::new(aquifer_bin()?)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--rest", "127.0.0.1:0", "--s3", "127.0.0.1:0", "--nfs", "127.0.0.1:0", "--sftp", "127.0.0.1:0", "--drive-size", "2GiB"])
        .env("AQUIFER_ADMIN_PASSWORD", "bench-admin-password")
        .env("AQUIFER_S3_ACCESS_KEY", ACCESS)
        .env("AQUIFER_S3_SECRET_KEY", SECRET)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start the Aquifer daemon")?;
    let out = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(out).lines();
    let addr = loop {
        let Some(line) = lines.next() else {
            let st = child.wait()?;
            bail!("the Aquifer daemon exited before announcing S3: {st}");
        };
        let line = line?;
        if let Some(rest) = line.strip_prefix("S3 at s3://") {
            break rest.split(',').next().unwrap_or_default().parse::<SocketAddr>().context("parse the S3 address")?;
        }
    };
    // Keep draining stdout so the daemon never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    wait_listening(addr, &mut child)?;
    Ok(Server { name: "Aquifer", child, addr, _dir: dir })
}

fn start_s3s_fs() -> Result<Server> {
    let bin = std::env::var_os("S3S_FS_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/cache/aquifer-tools/bin/s3s-fs"));
    ensure!(
        bin.exists(),
        "{} is missing: CARGO_TARGET_DIR=/var/cache/aquifer-tools-target cargo install s3s-fs --version 0.14.1 --features binary --root /var/cache/aquifer-tools",
        bin.display()
    );
    let dir = tempfile::tempdir_in(bench_dir()).context("create the s3s-fs directory")?;
    let port = free_port()?;
    let mut child = Command::new(bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", ACCESS, "--secret-key", SECRET])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start s3s-fs")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    wait_listening(addr, &mut child)?;
    Ok(Server { name: "s3s-fs", child, addr, _dir: dir })
}

// ------------------------------------------------------------------ measurements

/// Runs `streams` tasks, task `s` handling items `s, s + streams, ...` of `0..n`; returns
/// the wall time.
async fn parallel<F, Fut>(streams: usize, n: usize, f: F) -> Result<Duration>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let f = Arc::new(f);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..streams {
        let f = f.clone();
        tasks.spawn(async move {
            let mut i = s;
            while i < n {
                f(i).await?;
                i += streams;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(start.elapsed())
}

/// One round's throughput rows of one server: (label, value), in the order measured.
type Rows = Vec<(String, f64)>;

fn plural(streams: usize) -> &'static str {
    if streams > 1 { "s" } else { "" }
}

/// PUT then GET of large and of small objects, under keys of their own for `round`; the large
/// objects are deleted again.
async fn measure_round(c: &Client, round: usize, small_objects: usize, phases: Phases) -> Result<Rows> {
    let mut r = Rows::new();
    let large = Bytes::from((0..LARGE_BYTES).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>());
    let large_phases: &[(usize, usize)] = if phases.large { &[(1, LARGE_OBJECTS_ONE_STREAM), (8, 8 * LARGE_OBJECTS_PER_STREAM_OF_8)] } else { &[] };
    for &(streams, n) in large_phases {
        let (cc, body) = (c.clone(), large.clone());
        let t = parallel(streams, n, move |i| {
            let (cc, body) = (cc.clone(), body.clone());
            async move { cc.put(&format!("/bench/r{round}/large/{streams}/{i}"), body).await }
        })
        .await?;
        r.push((format!("PUT 64 MiB, {streams} stream{} (MiB/s)", plural(streams)), (n * LARGE_BYTES / MIB) as f64 / t.as_secs_f64()));
        let get_all = || {
            let cc = c.clone();
            parallel(streams, n, move |i| {
                let cc = cc.clone();
                async move {
                    let got = cc.get(&format!("/bench/r{round}/large/{streams}/{i}")).await?;
                    ensure!(got == LARGE_BYTES, "GET returned {got} bytes, not {LARGE_BYTES}");
                    Ok(())
                }
            })
        };
        let t = get_all().await?;
        r.push((format!("GET 64 MiB, {streams} stream{} (MiB/s)", plural(streams)), (n * LARGE_BYTES / MIB) as f64 / t.as_secs_f64()));
        // Data read again, as a training job's later epochs read it: from Aquifer's data
        // cache (which keeps a shard once twice its data was read) and s3s-fs's page cache.
        for _ in 0..REREADS_BEFORE_MEASURED {
            get_all().await?;
        }
        let t = get_all().await?;
        r.push((format!("GET 64 MiB read again, {streams} stream{} (MiB/s)", plural(streams)), (n * LARGE_BYTES / MIB) as f64 / t.as_secs_f64()));
        for i in 0..n {
            c.call("DELETE", &format!("/bench/r{round}/large/{streams}/{i}"), &[], Bytes::new()).await?;
        }
    }
    let small = Bytes::from(vec![7u8; SMALL_BYTES]);
    let small_phases: &[usize] = if phases.small { &[1, 8] } else { &[] };
    for &streams in small_phases {
        let (cc, body) = (c.clone(), small.clone());
        let t = parallel(streams, small_objects, move |i| {
            let (cc, body) = (cc.clone(), body.clone());
            async move { cc.put(&format!("/bench/r{round}/small{streams}-{i:06}"), body).await }
        })
        .await?;
        r.push((format!("PUT 4 KiB, {streams} stream{} (ops/s)", plural(streams)), small_objects as f64 / t.as_secs_f64()));
        let cc = c.clone();
        let t = parallel(streams, small_objects, move |i| {
            let cc = cc.clone();
            async move {
                let got = cc.get(&format!("/bench/r{round}/small{streams}-{i:06}")).await?;
                ensure!(got == SMALL_BYTES, "GET returned {got} bytes, not {SMALL_BYTES}");
                Ok(())
            }
        })
        .await?;
        r.push((format!("GET 4 KiB, {streams} stream{} (ops/s)", plural(streams)), small_objects as f64 / t.as_secs_f64()));
    }
    Ok(r)
}

/// Fills a bucket with `keys` keys, then lists it with ListObjectsV2: (seconds, whether the
/// listing was stopped after `LIST_SECS_MAX`).
async fn measure_list(server: &Server, keys: usize) -> Result<(f64, bool)> {
    let c = Client::new(server.addr);
    c.put("/listing", Bytes::new()).await?;
    let cc = c.clone();
    let fill = parallel(FILL_STREAMS, keys, move |i| {
        let cc = cc.clone();
        async move { cc.put(&format!("/listing/obj-{i:07}"), Bytes::from_static(b"0123456789abcdef")).await }
    })
    .await?;
    eprintln!("{}: filled the listing bucket with {keys} keys in {:.1} s", server.name, fill.as_secs_f64());
    let start = Instant::now();
    let mut listed = 0;
    let mut token: Option<String> = None;
    let page = LIST_PAGE_KEYS.to_string();
    loop {
        let mut q = vec![("list-type", "2"), ("max-keys", page.as_str())];
        if let Some(t) = &token {
            q.push(("continuation-token", t.as_str()));
        }
        let body = c.call("GET", "/listing", &q, Bytes::new()).await?;
        listed += body.matches("<Key>").count();
        token = xml_field(&body, "NextContinuationToken");
        if !body.contains("<IsTruncated>true</IsTruncated>") {
            break;
        }
        ensure!(token.is_some(), "a truncated listing without a continuation token");
        if start.elapsed() > Duration::from_secs(LIST_SECS_MAX) {
            break;
        }
    }
    let t = start.elapsed();
    let stopped = listed < keys && t > Duration::from_secs(LIST_SECS_MAX);
    if stopped {
        eprintln!("{}: listing stopped after {:.0} s with {listed} of {keys} keys", server.name, t.as_secs_f64());
    } else {
        ensure!(listed == keys, "{}: listed {listed} keys, not {keys}", server.name);
    }
    Ok((t.as_secs_f64(), stopped))
}

fn xml_field(body: &str, name: &str) -> Option<String> {
    let v = body.split(&format!("<{name}>")).nth(1)?.split(&format!("</{name}>")).next()?;
    Some(v.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&"))
}

/// Loopback TCP throughput in MiB/s with `streams` parallel iperf3 streams.
fn iperf3(streams: usize) -> Result<f64> {
    let port = free_port()?.to_string();
    let mut server = Command::new("iperf3").args(["-s", "-p", &port]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("start iperf3 (apt install iperf3)")?;
    // A probe connection would count as iperf3's client, so the client itself retries until
    // the server listens.
    let start = Instant::now();
    let out = loop {
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port, "-J", "-t", &IPERF_SECS.to_string(), "-P", &streams.to_string()])
            .output()
            .context("run iperf3 -c")?;
        // iperf3 3.12 exits 0 with an "error" member when it could not connect.
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let ok = out.status.success() && v.get("error").is_none();
        if ok || start.elapsed() > Duration::from_millis(START_TIMEOUT_MS) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = server.kill();
    let _ = server.wait();
    ensure!(out.status.success(), "iperf3 -c failed: {}", String::from_utf8_lossy(&out.stdout));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("parse iperf3 JSON")?;
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().context("iperf3 JSON without end.sum_received")?;
    Ok(bps / 8.0 / MIB as f64)
}

/// What the disk under `S3_BENCH_DIR` moves with O_DIRECT, in MiB/s: (write, read), each
/// the best of the `DISK_SHAPES`. Each thread writes a file of its own (then `fdatasync`s
/// it) and reads it back, as the servers' data was just written when it is read; the host's
/// caches below this VM's disk serve both alike.
fn disk_limit() -> Result<(f64, f64)> {
    let mut best = (0.0_f64, 0.0_f64);
    for (threads, request) in DISK_SHAPES {
        let (w, r) = disk_rates(threads, request)?;
        best = (best.0.max(w), best.1.max(r));
    }
    Ok(best)
}

/// (write, read) MiB/s of `threads` threads moving `DISK_BYTES` in all, `request` bytes a call.
fn disk_rates(threads: usize, request: usize) -> Result<(f64, f64)> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let dir = tempfile::tempdir_in(bench_dir()).context("create the disk measurement directory")?;
    let file_bytes = DISK_BYTES / threads;
    let run = |write: bool| -> Result<f64> {
        let start = Instant::now();
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let path = dir.path().join(format!("disk{t}"));
                    scope.spawn(move || -> Result<()> {
                        // O_DIRECT needs an aligned buffer: a 4 KiB-aligned window of a larger Vec.
                        let mut raw = vec![(t as u8).wrapping_mul(37); request + 4096];
                        let skip = raw.as_ptr().align_offset(4096);
                        let buf = &mut raw[skip..skip + request];
                        let f = std::fs::OpenOptions::new()
                            .read(true)
                            .write(write)
                            .create(write)
                            .custom_flags(libc::O_DIRECT)
                            .open(&path)
                            .with_context(|| format!("open {} with O_DIRECT", path.display()))?;
                        for off in (0..file_bytes).step_by(request) {
                            if write {
                                f.write_all_at(buf, off as u64)?;
                            } else {
                                f.read_exact_at(buf, off as u64)?;
                            }
                        }
                        if write {
                            f.sync_data()?;
                        }
                        Ok(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("disk thread panicked"))?)
        })?;
        Ok((DISK_BYTES / MIB) as f64 / start.elapsed().as_secs_f64())
    };
    Ok((run(true)?, run(false)?))
}

/// Bytes hashed to measure MD5's speed on one core.
const MD5_BYTES: usize = 512 * MIB;

/// MD5 on one core with OpenSSL (the daemon's MD5), in MiB/s over 1 MiB updates: a
/// single-part PUT's ETag is the MD5 of the whole object, a serial hash, so it bounds what
/// one stream of PUTs can reach.
fn md5_limit() -> Result<f64> {
    let block = vec![0x5a_u8; MIB];
    let mut h = openssl::hash::Hasher::new(openssl::hash::MessageDigest::md5())?;
    let start = Instant::now();
    for _ in 0..MD5_BYTES / MIB {
        h.update(&block)?;
    }
    std::hint::black_box(h.finish()?);
    Ok((MD5_BYTES / MIB) as f64 / start.elapsed().as_secs_f64())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

/// Which object sizes a round measures (`S3_BENCH_ROWS`: `large`, `small`, or both when unset).
#[derive(Clone, Copy)]
struct Phases {
    large: bool,
    small: bool,
}

impl Phases {
    fn from_env() -> Result<Phases> {
        match std::env::var("S3_BENCH_ROWS").as_deref() {
            Err(_) | Ok("") | Ok("all") => Ok(Phases { large: true, small: true }),
            Ok("large") => Ok(Phases { large: true, small: false }),
            Ok("small") => Ok(Phases { large: false, small: true }),
            Ok(other) => bail!("S3_BENCH_ROWS is `large`, `small` or `all`, not `{other}`"),
        }
    }
}

/// One round: the loopback limit with 1 and 8 streams, the disk's (write, read), and both
/// servers' rows.
struct Round {
    tcp1: f64,
    tcp8: f64,
    disk: (f64, f64),
    md5: f64,
    aquifer: Rows,
    s3s: Rows,
}

/// A count from the environment variable `name`, or `default` when it is unset or not a number.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there are no other options.
    let rounds = env_count("S3_BENCH_ROUNDS", ROUNDS_DEFAULT).max(1);
    let small_objects = env_count("S3_BENCH_SMALL_OBJECTS", SMALL_OBJECTS_DEFAULT).max(1);
    let keys = env_count("S3_BENCH_LIST_KEYS", LIST_KEYS_DEFAULT);
    let phases = Phases::from_env()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // Both servers run for the whole measurement; only one is ever sent requests.
    let aquifer = start_aquifer()?;
    let s3s = start_s3s_fs()?;
    let (ca, cs) = (Client::new(aquifer.addr), Client::new(s3s.addr));
    rt.block_on(async {
        ca.put("/bench", Bytes::new()).await?;
        cs.put("/bench", Bytes::new()).await
    })?;
    let mut measured: Vec<Round> = Vec::new();
    for round in 0..rounds {
        let tcp1 = iperf3(1)?;
        let tcp8 = iperf3(8)?;
        let disk = disk_limit()?;
        let md5 = md5_limit()?;
        eprintln!(
            "round {}: loopback TCP (iperf3) {tcp1:.0} MiB/s with 1 stream, {tcp8:.0} MiB/s with 8; disk (O_DIRECT) write {:.0}, read {:.0} MiB/s; MD5 on one core {md5:.0} MiB/s",
            round + 1,
            disk.0,
            disk.1
        );
        // The order alternates, so that neither server always runs first after iperf3.
        let (a, s) = if round % 2 == 0 {
            let a = rt.block_on(measure_round(&ca, round, small_objects, phases))?;
            (a, rt.block_on(measure_round(&cs, round, small_objects, phases))?)
        } else {
            let s = rt.block_on(measure_round(&cs, round, small_objects, phases))?;
            (rt.block_on(measure_round(&ca, round, small_objects, phases))?, s)
        };
        for ((label, av), (_, sv)) in a.iter().zip(&s) {
            eprintln!("round {}: {label}: Aquifer {} s3s-fs {} ({:.2}×)", round + 1, fmt_value(*av), fmt_value(*sv), av / sv);
        }
        measured.push(Round { tcp1, tcp8, disk, md5, aquifer: a, s3s: s });
    }
    // `S3_BENCH_LIST_KEYS=0` leaves the listing out.
    let listed = if keys > 0 { Some((rt.block_on(measure_list(&aquifer, keys))?, rt.block_on(measure_list(&s3s, keys))?)) } else { None };
    drop(aquifer);
    drop(s3s);

    println!("Medians of {rounds} round{}; each ratio is the median of the rounds' own ratios, with their range.", plural(rounds));
    println!(
        "Disk: {} MiB written, then read back, with O_DIRECT requests, the best of {} (PUT rows: write; first-read GET rows: read).",
        DISK_BYTES / MIB,
        DISK_SHAPES.iter().map(|(t, r)| format!("{t} thread{} of {} MiB", plural(*t), r / MIB)).collect::<Vec<_>>().join(", ")
    );
    println!();
    println!(
        "| measurement | Aquifer | s3s-fs 0.14.1 | Aquifer / s3s-fs | (rounds) | loopback TCP (iperf3) | Aquifer / TCP | (rounds) | disk (O_DIRECT) | Aquifer / disk | (rounds) |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{lo:.2}–{hi:.2}×")
    };
    // (limit column, median ratio, range) of `av` against one limit value per round.
    let against = |av: &[f64], limit: &[f64]| {
        let ratios: Vec<f64> = av.iter().zip(limit).map(|(a, l)| a / l).collect();
        (fmt_value(median(limit)), format!("{:.2}×", median(&ratios)), range(&ratios))
    };
    let blank = || (String::new(), String::new(), String::new());
    // Lines printed after the table.
    let mut post: Vec<String> = Vec::new();
    for (row, (label, _)) in measured[0].aquifer.iter().enumerate() {
        let av: Vec<f64> = measured.iter().map(|m| m.aquifer[row].1).collect();
        let sv: Vec<f64> = measured.iter().map(|m| m.s3s[row].1).collect();
        let ratios: Vec<f64> = av.iter().zip(&sv).map(|(a, s)| a / s).collect();
        let large = label.contains("64 MiB");
        let tcp = if large {
            let tcp: Vec<f64> = measured.iter().map(|m| if label.contains("1 stream ") { m.tcp1 } else { m.tcp8 }).collect();
            against(&av, &tcp)
        } else {
            blank()
        };
        // Data read again comes from memory, not the disk.
        let disk = if large && label.starts_with("PUT") {
            against(&av, &measured.iter().map(|m| m.disk.0).collect::<Vec<_>>())
        } else if large && !label.contains("again") {
            against(&av, &measured.iter().map(|m| m.disk.1).collect::<Vec<_>>())
        } else {
            blank()
        };
        println!(
            "| {label} | {} | {} | {:.2}× | {} | {} | {} | {} | {} | {} | {} |",
            fmt_value(median(&av)),
            fmt_value(median(&sv)),
            median(&ratios),
            range(&ratios),
            tcp.0,
            tcp.1,
            tcp.2,
            disk.0,
            disk.1,
            disk.2
        );
    }
    // One stream of 64 MiB PUTs against the serial hash each of them needs.
    if let Some(row) = measured[0].aquifer.iter().position(|(l, _)| l.starts_with("PUT") && l.contains("64 MiB") && l.contains("1 stream ")) {
        let av: Vec<f64> = measured.iter().map(|m| m.aquifer[row].1).collect();
        let sv: Vec<f64> = measured.iter().map(|m| m.s3s[row].1).collect();
        let (md5, a, ar) = against(&av, &measured.iter().map(|m| m.md5).collect::<Vec<_>>());
        let (_, s, sr) = against(&sv, &measured.iter().map(|m| m.md5).collect::<Vec<_>>());
        post.push(format!(
            "MD5 on one core (OpenSSL, {} MiB in 1 MiB updates): {md5} MiB/s. A one-stream 64 MiB PUT's ETag is the MD5 of the object, a serial hash: Aquifer reaches {a} of it ({ar}), s3s-fs {s} ({sr}).",
            MD5_BYTES / MIB
        ));
    }
    if let Some(((al, a_stopped), (sl, s_stopped))) = listed {
        let list_value = |v: f64, stopped: bool| if stopped { format!("> {}", fmt_value(v)) } else { fmt_value(v) };
        let list_ratio = match (a_stopped, s_stopped) {
            (false, false) => format!("{:.2}×", al / sl),
            (false, true) => format!("< {:.3}×", al / sl),
            _ => "n/a".to_string(),
        };
        println!(
            "| ListObjectsV2 of {keys} keys, {LIST_PAGE_KEYS} a page (s, once) | {} | {} | {list_ratio} | | | | | | | |",
            list_value(al, a_stopped),
            list_value(sl, s_stopped)
        );
    }
    for line in post {
        println!();
        println!("{line}");
    }
    Ok(())
}
