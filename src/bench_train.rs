//! `aquifer bench dataset` and `aquifer bench train`: the `train` benchmark of DESIGN.md §7.
//!
//! `dataset` writes a dataset through a daemon's REST file API or S3: one file per sample
//! ("small") or tar shards of many samples ("shard"), with content derived from a seed so that
//! every byte read back can be checked, plus `manifest.json` describing it.
//!
//! `train` is an emulated data loader in the manner of PyTorch's `DataLoader`: `workers`
//! reader tasks each prepare whole batches (a worker reads its batch's samples one after
//! another, as a map-style dataset's `__getitem__` does), each worker keeps at most
//! `prefetch_factor` batches prepared or in preparation, and batches reach the trainer in
//! order, round-robin over the workers. The trainer waits for each batch (the stall), then
//! "computes" for a fixed time. With the shard layout each worker streams whole shards in
//! order, a sample being a range read of its shard (WebDataset). The result is one JSON line:
//! throughput, accelerator utilization = compute / (compute + stall), warm-up batches and stall
//! percentiles.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use hmac::{Hmac, KeyInit, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::{Client, Method, StatusCode, Url};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, mpsc};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    cmd: BenchCmd,
}

#[derive(Subcommand, Debug)]
enum BenchCmd {
    /// Write a seeded dataset (one file per sample, or tar shards) through REST or S3.
    Dataset(DatasetArgs),
    /// Emulate a training job's data loader over a dataset and report stalls and utilization.
    Train(TrainArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Layout {
    /// One file per sample.
    Small,
    /// Tar shards of many samples, read sequentially.
    Shard,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Via {
    Rest,
    S3,
}

/// Credentials shared by both commands.
#[derive(Args, Debug, Clone)]
struct Creds {
    /// REST user (password in AQUIFER_PASSWORD, or a token in AQUIFER_TOKEN).
    #[arg(long, env = "AQUIFER_USER", default_value = "admin")]
    user: String,
    /// S3 key file (AWS_ACCESS_KEY_ID=... / AWS_SECRET_ACCESS_KEY=... lines, as the daemon
    /// writes to DATA_DIR/admin-s3-credentials), when AQUIFER_S3_ACCESS_KEY/AQUIFER_S3_SECRET_KEY
    /// and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set.
    #[arg(long)]
    s3_credentials: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
struct DatasetArgs {
    /// Write through the REST file API at host:port (or an http:// URL).
    #[arg(long, conflicts_with = "s3", required_unless_present = "s3")]
    rest: Option<String>,
    /// Write through S3 at host:port (or an http:// URL); the path's first component is the bucket.
    #[arg(long)]
    s3: Option<String>,
    /// Directory of the dataset (for S3: bucket/prefix).
    #[arg(long)]
    path: String,
    #[arg(long, value_enum)]
    layout: Layout,
    /// Number of samples.
    #[arg(long)]
    count: u64,
    /// Bytes per sample (suffixes KiB, MiB, GiB).
    #[arg(long, default_value = "100KiB", value_parser = parse_size)]
    sample_bytes: u64,
    /// Largest shard file for the shard layout.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    shard_bytes: u64,
    /// Seed of the sample content.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Files uploaded at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    #[command(flatten)]
    creds: Creds,
}

#[derive(Args, Debug)]
struct TrainArgs {
    #[arg(long, value_enum)]
    via: Via,
    /// host:port (or http:// URL) of the REST API or of S3, as --via says.
    #[arg(long)]
    endpoint: String,
    /// Directory of the dataset (for S3: bucket/prefix), as given to `bench dataset`.
    #[arg(long)]
    path: String,
    /// Reader workers (DataLoader num_workers).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Emulated accelerator time per batch, in milliseconds.
    #[arg(long, default_value_t = 100.0)]
    compute_ms: f64,
    /// Expected layout (the dataset's manifest is authoritative; a mismatch is an error).
    #[arg(long, value_enum)]
    layout: Option<Layout>,
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Shuffle samples (small) or shard order (shard) every epoch.
    #[arg(long)]
    shuffle: bool,
    /// Seed of the shuffle.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stop after this many batches in all.
    #[arg(long)]
    batches: Option<u64>,
    /// Batches each worker may have prepared or in preparation (DataLoader prefetch_factor).
    #[arg(long, default_value_t = 2)]
    prefetch_factor: usize,
    /// Batches in the rolling window that decides when warm-up is over.
    #[arg(long, default_value_t = 10)]
    stall_window: usize,
    /// Skip comparing every byte read with the seeded content.
    #[arg(long)]
    no_verify: bool,
    /// Print only the final JSON, not a line per batch.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    creds: Creds,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the async runtime")?;
    match args.cmd {
        BenchCmd::Dataset(a) => rt.block_on(dataset(a)),
        BenchCmd::Train(a) => rt.block_on(train(a)),
    }
}

/// A size in bytes: a number with an optional binary suffix (KiB, MiB, GiB; K, M, G).
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("not a size: {s:?} (e.g. 100KiB, 64MiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        other => return Err(format!("unknown size unit {other:?} in {s:?} (B, KiB, MiB, GiB)")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("size {s:?} is too large"))
}

// ---------------------------------------------------------------------------- dataset shape

/// Dataset description stored as `manifest.json` next to the data.
#[derive(Clone, Debug, PartialEq)]
struct Dataset {
    layout: Layout,
    count: u64,
    sample_bytes: u64,
    shard_bytes: u64,
    seed: u64,
}

const MANIFEST: &str = "manifest.json";
const MANIFEST_FORMAT: &str = "aquifer-train-dataset";
const TAR_BLOCK: u64 = 512;

impl Dataset {
    fn to_json(&self) -> Value {
        json!({
            "format": MANIFEST_FORMAT,
            "version": 1,
            "layout": match self.layout { Layout::Small => "small", Layout::Shard => "shard" },
            "count": self.count,
            "sample_bytes": self.sample_bytes,
            "shard_bytes": self.shard_bytes,
            "seed": self.seed,
            "samples_per_shard": self.samples_per_shard(),
            "files": self.files(),
        })
    }

    fn from_json(v: &Value) -> Result<Dataset> {
        if v["format"] != MANIFEST_FORMAT || v["version"] != 1 {
            bail!("not a dataset manifest written by `aquifer bench dataset` (format {}, version {})", v["format"], v["version"]);
        }
        let num = |k: &str| v[k].as_u64().ok_or_else(|| anyhow!("manifest field {k:?} is missing or not a number"));
        let layout = match v["layout"].as_str() {
            Some("small") => Layout::Small,
            Some("shard") => Layout::Shard,
            other => bail!("manifest layout {other:?} is neither \"small\" nor \"shard\""),
        };
        let d = Dataset { layout, count: num("count")?, sample_bytes: num("sample_bytes")?, shard_bytes: num("shard_bytes")?, seed: num("seed")? };
        d.check()?;
        Ok(d)
    }

    fn check(&self) -> Result<()> {
        if self.count == 0 || self.sample_bytes == 0 {
            bail!("a dataset needs at least one sample of at least one byte");
        }
        if self.layout == Layout::Shard && self.shard_bytes < self.member_bytes() + 2 * TAR_BLOCK {
            bail!("shard size {} cannot hold one {}-byte sample as a tar member", self.shard_bytes, self.sample_bytes);
        }
        Ok(())
    }

    /// A sample as a tar member: header block plus data padded to whole blocks.
    fn member_bytes(&self) -> u64 {
        TAR_BLOCK + self.sample_bytes.div_ceil(TAR_BLOCK) * TAR_BLOCK
    }

    fn samples_per_shard(&self) -> u64 {
        match self.layout {
            Layout::Small => 1,
            // Two zero blocks end a tar archive.
            Layout::Shard => ((self.shard_bytes - 2 * TAR_BLOCK) / self.member_bytes()).max(1),
        }
    }

    fn files(&self) -> u64 {
        self.count.div_ceil(self.samples_per_shard())
    }

    fn file_name(&self, file: u64) -> String {
        match self.layout {
            Layout::Small => format!("sample-{file:08}.bin"),
            Layout::Shard => format!("shard-{file:06}.tar"),
        }
    }

    /// Where sample `i` lives: file index and byte range (end exclusive).
    fn locate(&self, i: u64) -> (u64, u64, u64) {
        match self.layout {
            Layout::Small => (i, 0, self.sample_bytes),
            Layout::Shard => {
                let sps = self.samples_per_shard();
                let start = (i % sps) * self.member_bytes() + TAR_BLOCK;
                (i / sps, start, start + self.sample_bytes)
            }
        }
    }

    /// The bytes of file `file`: the sample itself, or a tar archive of its samples.
    fn file_bytes(&self, file: u64) -> Vec<u8> {
        match self.layout {
            Layout::Small => sample_bytes(self.seed, file, self.sample_bytes),
            Layout::Shard => {
                let sps = self.samples_per_shard();
                let first = file * sps;
                let last = (first + sps).min(self.count);
                let mut out = Vec::with_capacity(((last - first) * self.member_bytes() + 2 * TAR_BLOCK) as usize);
                for i in first..last {
                    out.extend_from_slice(&tar_header(&format!("sample-{i:08}.bin"), self.sample_bytes));
                    out.extend_from_slice(&sample_bytes(self.seed, i, self.sample_bytes));
                    out.resize(out.len().next_multiple_of(TAR_BLOCK as usize), 0);
                }
                out.resize(out.len() + 2 * TAR_BLOCK as usize, 0);
                out
            }
        }
    }
}

/// splitmix64: the sample generator and the shuffle's random numbers.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The content of sample `index` under `seed`: different for every sample, cheap to make again.
fn sample_bytes(seed: u64, index: u64, len: u64) -> Vec<u8> {
    let mut state = seed ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    let mut out = Vec::with_capacity(len as usize + 8);
    while (out.len() as u64) < len {
        out.extend_from_slice(&splitmix(&mut state).to_le_bytes());
    }
    out.truncate(len as usize);
    out
}

/// A POSIX ustar header for a regular file.
fn tar_header(name: &str, size: u64) -> [u8; TAR_BLOCK as usize] {
    let mut h = [0u8; TAR_BLOCK as usize];
    let put = |h: &mut [u8; 512], at: usize, s: &[u8]| h[at..at + s.len()].copy_from_slice(s);
    put(&mut h, 0, &name.as_bytes()[..name.len().min(99)]);
    put(&mut h, 100, b"0000644\0");
    put(&mut h, 108, b"0000000\0");
    put(&mut h, 116, b"0000000\0");
    put(&mut h, 124, format!("{size:011o}\0").as_bytes());
    put(&mut h, 136, b"00000000000\0");
    put(&mut h, 156, b"0");
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    put(&mut h, 265, b"aquifer");
    put(&mut h, 297, b"aquifer");
    // The checksum is the byte sum of the header with its own field read as spaces.
    put(&mut h, 148, b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    h
}

// ------------------------------------------------------------------------------- transport

/// Characters kept as they are in a path segment (RFC 3986 unreserved), as SigV4 wants.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

fn encode_path(path: &str) -> String {
    path.split('/').filter(|s| !s.is_empty()).map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect::<Vec<_>>().join("/")
}

fn base_url(endpoint: &str) -> Result<Url> {
    let s = if endpoint.contains("://") { endpoint.to_string() } else { format!("http://{endpoint}") };
    let url = Url::parse(&s).with_context(|| format!("parse endpoint {endpoint:?}"))?;
    if url.scheme() != "http" {
        bail!("endpoint {endpoint:?}: only http:// is supported by this benchmark client");
    }
    Ok(url)
}

#[derive(Clone, Debug)]
struct S3Key {
    access: String,
    secret: String,
}

enum RestAuth {
    Basic(String, String),
    Bearer(String),
    None,
}

enum Store {
    Rest { base: Url, auth: RestAuth },
    S3 { base: Url, key: S3Key },
}

/// Region in the SigV4 scope; the daemon serves one region and accepts this one.
const S3_REGION: &str = "us-east-1";
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// One request (a sample, a shard upload) must finish within this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

impl Store {
    fn new(via: Via, endpoint: &str, creds: &Creds) -> Result<Store> {
        let base = base_url(endpoint)?;
        Ok(match via {
            Via::Rest => {
                let auth = match (std::env::var("AQUIFER_TOKEN"), std::env::var("AQUIFER_PASSWORD")) {
                    (Ok(t), _) if !t.is_empty() => RestAuth::Bearer(t),
                    (_, Ok(p)) if !p.is_empty() => RestAuth::Basic(creds.user.clone(), p),
                    _ => RestAuth::None,
                };
                Store::Rest { base, auth }
            }
            Via::S3 => Store::S3 { base, key: s3_key(creds)? },
        })
    }

    fn url(&self, path: &str) -> Url {
        let (base, prefix) = match self {
            Store::Rest { base, .. } => (base, "/api/v1/files/"),
            Store::S3 { base, .. } => (base, "/"),
        };
        let mut u = base.clone();
        u.set_path(&format!("{prefix}{}", encode_path(path)));
        u
    }

    async fn send(&self, http: &Client, method: Method, path: &str, range: Option<(u64, u64)>, body: Option<Vec<u8>>) -> Result<reqwest::Response> {
        let url = self.url(path);
        let mut rb = http.request(method.clone(), url.clone()).timeout(REQUEST_TIMEOUT);
        let range_value = range.map(|(a, b)| format!("bytes={a}-{}", b - 1));
        if let Some(r) = &range_value {
            rb = rb.header(reqwest::header::RANGE, r);
        }
        match self {
            Store::Rest { auth, .. } => {
                rb = match auth {
                    RestAuth::Basic(u, p) => rb.basic_auth(u, Some(p)),
                    RestAuth::Bearer(t) => rb.bearer_auth(t),
                    RestAuth::None => rb,
                };
            }
            Store::S3 { key, .. } => {
                let payload = body.as_deref().map_or_else(|| EMPTY_SHA256.to_string(), |b| hex::encode(Sha256::digest(b)));
                let (date, amz_date) = amz_dates(SystemTime::now());
                let mut extra = Vec::new();
                if let Some(r) = &range_value {
                    extra.push(("range", r.as_str()));
                }
                let auth = sigv4_authorization(key, method.as_str(), &url, &extra, &payload, &date, &amz_date);
                rb = rb.header("x-amz-date", &amz_date).header("x-amz-content-sha256", &payload).header(reqwest::header::AUTHORIZATION, auth);
            }
        }
        if let Some(b) = body {
            rb = rb.body(b);
        }
        rb.send().await.with_context(|| format!("{method} {url}"))
    }

    async fn put(&self, http: &Client, path: &str, body: Vec<u8>) -> Result<()> {
        let res = self.send(http, Method::PUT, path, None, Some(body)).await?;
        expect_ok(res, "write", path).await.map(|_| ())
    }

    /// Reads a whole file, or `[a, b)` of it.
    async fn get(&self, http: &Client, path: &str, range: Option<(u64, u64)>) -> Result<Vec<u8>> {
        let res = self.send(http, Method::GET, path, range, None).await?;
        if range.is_some() && res.status() == StatusCode::OK {
            bail!("read {path}: the server ignored the Range header (200 instead of 206)");
        }
        let res = expect_ok(res, "read", path).await?;
        Ok(res.bytes().await.with_context(|| format!("read {path}: body"))?.to_vec())
    }

    /// S3 needs the bucket before objects can go in; REST makes parent directories itself.
    async fn prepare_write(&self, http: &Client, path: &str) -> Result<()> {
        let Store::S3 { .. } = self else { return Ok(()) };
        let bucket = path.split('/').find(|s| !s.is_empty()).ok_or_else(|| anyhow!("an S3 dataset path needs a bucket: bucket/prefix"))?;
        let res = self.send(http, Method::PUT, bucket, None, Some(Vec::new())).await?;
        if res.status().is_success() || res.status() == StatusCode::CONFLICT {
            return Ok(());
        }
        expect_ok(res, "create bucket", bucket).await.map(|_| ())
    }
}

async fn expect_ok(res: reqwest::Response, what: &str, path: &str) -> Result<reqwest::Response> {
    let status = res.status();
    if status.is_success() {
        return Ok(res);
    }
    let body = res.text().await.unwrap_or_default();
    let hint = if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        " (REST: set AQUIFER_PASSWORD or AQUIFER_TOKEN; S3: AQUIFER_S3_ACCESS_KEY/AQUIFER_S3_SECRET_KEY or --s3-credentials)"
    } else {
        ""
    };
    bail!("{what} {path}: {status}{hint}: {}", body.chars().take(300).collect::<String>())
}

fn s3_key(creds: &Creds) -> Result<S3Key> {
    for (a, s) in [("AQUIFER_S3_ACCESS_KEY", "AQUIFER_S3_SECRET_KEY"), ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")] {
        if let (Ok(access), Ok(secret)) = (std::env::var(a), std::env::var(s))
            && !access.is_empty()
            && !secret.is_empty()
        {
            return Ok(S3Key { access, secret });
        }
    }
    let Some(file) = &creds.s3_credentials else {
        bail!("no S3 credentials: set AQUIFER_S3_ACCESS_KEY and AQUIFER_S3_SECRET_KEY, or pass --s3-credentials DATA_DIR/admin-s3-credentials");
    };
    let text = std::fs::read_to_string(file).with_context(|| format!("read S3 credentials {}", file.display()))?;
    let field = |k: &str| {
        text.lines().find_map(|l| l.trim().strip_prefix(k).and_then(|r| r.strip_prefix('='))).map(|v| v.trim().to_string())
    };
    match (field("AWS_ACCESS_KEY_ID"), field("AWS_SECRET_ACCESS_KEY")) {
        (Some(access), Some(secret)) if !access.is_empty() && !secret.is_empty() => Ok(S3Key { access, secret }),
        _ => bail!("{}: expected AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=... lines", file.display()),
    }
}

// ----------------------------------------------------------------------------------- SigV4

/// `YYYYMMDD` and `YYYYMMDDTHHMMSSZ` for a time (UTC).
fn amz_dates(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = storage_engine::civil_from_days((secs / 86_400) as i64);
    let date = format!("{y:04}{m:02}{d:02}");
    let full = format!("{date}T{:02}{:02}{:02}Z", rem / 3600, rem / 60 % 60, rem % 60);
    (date, full)
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(data.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// The `Authorization` header of an AWS Signature Version 4 request for S3, signing `host`,
/// `x-amz-content-sha256`, `x-amz-date` and the `extra` headers (lower-case names). The URL's
/// path must already be URI-encoded; query strings are not used by this client.
fn sigv4_authorization(key: &S3Key, method: &str, url: &Url, extra: &[(&str, &str)], payload_sha256: &str, date: &str, amz_date: &str) -> String {
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_string(),
    };
    let mut headers: Vec<(&str, &str)> = vec![("host", &host), ("x-amz-content-sha256", payload_sha256), ("x-amz-date", amz_date)];
    headers.extend_from_slice(extra);
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{}\n", v.trim())).collect();
    let signed_headers = headers.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(";");
    let canonical_request = format!("{method}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{payload_sha256}", url.path(), url.query().unwrap_or(""));
    let scope = format!("{date}/{S3_REGION}/s3/aws4_request");
    let string_to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical_request.as_bytes())));
    let k_date = hmac(format!("AWS4{}", key.secret).as_bytes(), date);
    let k_region = hmac(&k_date, S3_REGION);
    let k_service = hmac(&k_region, "s3");
    let k_signing = hmac(&k_service, "aws4_request");
    let signature = hex::encode(hmac(&k_signing, &string_to_sign));
    format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}", key.access)
}

// ---------------------------------------------------------------------------------- dataset

fn http_client() -> Result<Client> {
    Client::builder().connect_timeout(Duration::from_secs(10)).build().context("create HTTP client")
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_matches('/'))
}

async fn dataset(a: DatasetArgs) -> Result<()> {
    let (via, endpoint) = match (&a.rest, &a.s3) {
        (Some(r), None) => (Via::Rest, r.clone()),
        (None, Some(s)) => (Via::S3, s.clone()),
        _ => bail!("give exactly one of --rest and --s3"),
    };
    let ds = Dataset { layout: a.layout, count: a.count, sample_bytes: a.sample_bytes, shard_bytes: a.shard_bytes, seed: a.seed };
    ds.check()?;
    if a.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let store = Arc::new(Store::new(via, &endpoint, &a.creds)?);
    let http = http_client()?;
    store.prepare_write(&http, &a.path).await?;
    let t0 = Instant::now();
    let slots = Arc::new(Semaphore::new(a.concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    let ds = Arc::new(ds);
    let mut bytes = 0u64;
    for f in 0..ds.files() {
        let permit = slots.clone().acquire_owned().await.expect("semaphore never closed");
        while let Some(r) = tasks.try_join_next() {
            bytes += r.context("upload task")??;
        }
        let (store, http, ds, path) = (store.clone(), http.clone(), ds.clone(), join(&a.path, &ds.file_name(f)));
        tasks.spawn(async move {
            let body = ds.file_bytes(f);
            let n = body.len() as u64;
            store.put(&http, &path, body).await?;
            drop(permit);
            Ok::<u64, anyhow::Error>(n)
        });
    }
    while let Some(r) = tasks.join_next().await {
        bytes += r.context("upload task")??;
    }
    let manifest = serde_json::to_vec_pretty(&ds.to_json()).expect("JSON of plain values");
    store.put(&http, &join(&a.path, MANIFEST), manifest).await?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{}",
        json!({
            "path": a.path, "layout": ds.to_json()["layout"], "samples": ds.count, "files": ds.files(),
            "bytes": bytes, "elapsed_s": round3(secs), "mib_per_s": round3(bytes as f64 / (1 << 20) as f64 / secs),
        })
    );
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

// ------------------------------------------------------------------------------------ train

/// One batch of the plan: which worker prepares it and which samples it holds.
#[derive(Clone, Debug, PartialEq)]
struct PlannedBatch {
    epoch: u64,
    worker: usize,
    samples: Vec<u64>,
}

fn shuffle<T>(v: &mut [T], state: &mut u64) {
    for i in (1..v.len()).rev() {
        v.swap(i, (splitmix(state) % (i as u64 + 1)) as usize);
    }
}

/// The batches of a run, in the order the trainer consumes them.
fn plan(ds: &Dataset, workers: usize, batch: usize, epochs: u64, shuffle_each_epoch: bool, seed: u64, batches_max: Option<u64>) -> Vec<PlannedBatch> {
    let mut out = Vec::new();
    let cap = batches_max.unwrap_or(u64::MAX);
    for epoch in 0..epochs {
        let mut rng = seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407);
        match ds.layout {
            Layout::Small => {
                // Map-style: the sampler's order cut into batches, batch k to worker k mod W.
                let mut order: Vec<u64> = (0..ds.count).collect();
                if shuffle_each_epoch {
                    shuffle(&mut order, &mut rng);
                }
                for chunk in order.chunks(batch) {
                    if out.len() as u64 >= cap {
                        return out;
                    }
                    out.push(PlannedBatch { epoch, worker: out.len() % workers, samples: chunk.to_vec() });
                }
            }
            Layout::Shard => {
                // Iterable-style: shards dealt to workers, each worker streams its shards in order
                // and cuts its own batches; the loader takes one batch from each worker in turn.
                let mut shards: Vec<u64> = (0..ds.files()).collect();
                if shuffle_each_epoch {
                    shuffle(&mut shards, &mut rng);
                }
                let sps = ds.samples_per_shard();
                let per_worker: Vec<Vec<Vec<u64>>> = (0..workers)
                    .map(|w| {
                        let stream: Vec<u64> = shards.iter().skip(w).step_by(workers).flat_map(|&s| s * sps..((s + 1) * sps).min(ds.count)).collect();
                        stream.chunks(batch).map(|c| c.to_vec()).collect()
                    })
                    .collect();
                let turns = per_worker.iter().map(Vec::len).max().unwrap_or(0);
                for t in 0..turns {
                    for (w, batches) in per_worker.iter().enumerate() {
                        if let Some(b) = batches.get(t) {
                            if out.len() as u64 >= cap {
                                return out;
                            }
                            out.push(PlannedBatch { epoch, worker: w, samples: b.clone() });
                        }
                    }
                }
            }
        }
    }
    out
}

/// Warm-up: the batches before the stall settles — the smallest k such that, from batch k on,
/// every run of `window` consecutive batches (fewer at the end of the run) stalls on average
/// less than 2 % of the compute time, with at least one whole window of such batches observed
/// after it (a run's last few batches, prepared in advance, are not a steady state). `None`
/// when the run ends before that.
fn warmup_batches(stalls_ms: &[f64], compute_ms: f64, window: usize) -> Option<usize> {
    let threshold = 0.02 * compute_ms;
    let window = window.max(1);
    let n = stalls_ms.len();
    let mut sum = 0.0;
    // Windows starting at j, from the end backwards; the first bad one found decides.
    for j in (0..n).rev() {
        sum += stalls_ms[j];
        if j + window < n {
            sum -= stalls_ms[j + window];
        }
        let len = (n - j).min(window) as f64;
        if sum / len >= threshold {
            return (n - (j + 1) >= window).then_some(j + 1);
        }
    }
    Some(0)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

struct ReadyBatch {
    index: usize,
    bytes: u64,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

async fn train(a: TrainArgs) -> Result<()> {
    if a.workers == 0 || a.batch == 0 || a.prefetch_factor == 0 || a.epochs == 0 {
        bail!("--workers, --batch, --prefetch-factor and --epochs must each be at least 1");
    }
    if !(a.compute_ms.is_finite() && a.compute_ms > 0.0) {
        bail!("--compute-ms must be a positive number of milliseconds");
    }
    if a.batches == Some(0) {
        bail!("--batches must be at least 1");
    }
    let store = Arc::new(Store::new(a.via, &a.endpoint, &a.creds)?);
    let http = http_client()?;
    let manifest_path = join(&a.path, MANIFEST);
    let manifest = store.get(&http, &manifest_path, None).await.context("read the dataset manifest (write one with `aquifer bench dataset`)")?;
    let manifest: Value = serde_json::from_slice(&manifest).with_context(|| format!("parse {manifest_path}"))?;
    let ds = Arc::new(Dataset::from_json(&manifest).with_context(|| format!("dataset manifest {manifest_path}"))?);
    if let Some(l) = a.layout
        && l != ds.layout
    {
        bail!("--layout {l:?} but the dataset at {} has layout {:?}", a.path, ds.layout);
    }
    let plan = Arc::new(plan(&ds, a.workers, a.batch, a.epochs, a.shuffle, a.seed, a.batches));
    let verify = !a.no_verify;

    let t0 = Instant::now();
    let mut inboxes = Vec::new();
    let mut handles = Vec::new();
    for w in 0..a.workers {
        let (tx, rx) = mpsc::unbounded_channel::<ReadyBatch>();
        inboxes.push(rx);
        let slots = Arc::new(Semaphore::new(a.prefetch_factor));
        let (store, http, ds, plan, dir) = (store.clone(), http.clone(), ds.clone(), plan.clone(), a.path.clone());
        handles.push(tokio::spawn(async move {
            for (index, b) in plan.iter().enumerate().filter(|(_, b)| b.worker == w) {
                let slot = slots.clone().acquire_owned().await.expect("semaphore never closed");
                let mut bytes = 0;
                for &i in &b.samples {
                    let (file, start, end) = ds.locate(i);
                    let path = join(&dir, &ds.file_name(file));
                    let range = (ds.layout == Layout::Shard).then_some((start, end));
                    let got = store.get(&http, &path, range).await?;
                    if got.len() as u64 != ds.sample_bytes {
                        bail!("sample {i} ({path}): {} bytes, expected {}", got.len(), ds.sample_bytes);
                    }
                    if verify && got != sample_bytes(ds.seed, i, ds.sample_bytes) {
                        bail!("sample {i} ({path} bytes {start}..{end}): content differs from the seeded dataset");
                    }
                    bytes += got.len() as u64;
                }
                if tx.send(ReadyBatch { index, bytes, _slot: slot }).is_err() {
                    break;
                }
            }
            Ok::<(), anyhow::Error>(())
        }));
    }

    let compute = Duration::from_secs_f64(a.compute_ms / 1000.0);
    let mut stalls_ms = Vec::with_capacity(plan.len());
    let mut consumed_at = Vec::with_capacity(plan.len());
    let (mut samples, mut bytes) = (0u64, 0u64);
    for (k, b) in plan.iter().enumerate() {
        let wait = Instant::now();
        let Some(ready) = inboxes[b.worker].recv().await else {
            let h = handles.swap_remove(b.worker);
            return Err(match h.await {
                Ok(Err(e)) => e.context(format!("worker {}", b.worker)),
                Ok(Ok(())) => anyhow!("worker {} stopped early", b.worker),
                Err(e) => anyhow!("worker {} failed: {e}", b.worker),
            });
        };
        let stall = wait.elapsed().as_secs_f64() * 1000.0;
        debug_assert_eq!(ready.index, k, "batches reach the trainer in plan order");
        samples += b.samples.len() as u64;
        bytes += ready.bytes;
        drop(ready);
        stalls_ms.push(stall);
        if !a.quiet {
            println!("batch {k} epoch {} worker {} samples {} stall_ms {stall:.3}", b.epoch, b.worker, b.samples.len());
        }
        tokio::time::sleep(compute).await;
        consumed_at.push((t0.elapsed().as_secs_f64(), samples));
    }
    for h in handles {
        h.await.context("worker task")??;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let n = stalls_ms.len();
    let stall_total: f64 = stalls_ms.iter().sum();
    let compute_total = a.compute_ms * n as f64;
    let warmup = warmup_batches(&stalls_ms, a.compute_ms, a.stall_window);
    // Steady state: from the end of the warm-up batches to the end of the run.
    let after_warmup = warmup.filter(|w| *w < n).map(|w| {
        let (t_start, s_start) = if w == 0 { (0.0, 0) } else { consumed_at[w - 1] };
        (samples - s_start) as f64 / (elapsed - t_start)
    });
    let mut sorted = stalls_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let result = json!({
        "benchmark": "train",
        "via": match a.via { Via::Rest => "rest", Via::S3 => "s3" },
        "layout": ds.to_json()["layout"],
        "workers": a.workers,
        "batch": a.batch,
        "prefetch_factor": a.prefetch_factor,
        "compute_ms": a.compute_ms,
        "shuffle": a.shuffle,
        "epochs": a.epochs,
        "batches": n,
        "samples": samples,
        "bytes": bytes,
        "verified_bytes": if verify { bytes } else { 0 },
        "elapsed_s": round3(elapsed),
        "throughput_samples_per_s": round3(samples as f64 / elapsed),
        "throughput_mib_per_s": round3(bytes as f64 / (1 << 20) as f64 / elapsed),
        "throughput_after_warmup_samples_per_s": after_warmup.map(round3),
        "accelerator_utilization": (compute_total / (compute_total + stall_total) * 1e4).round() / 1e4,
        "warmup_batches": warmup,
        "stall_ms": {
            "median": round3(percentile(&sorted, 50.0)),
            "p99": round3(percentile(&sorted, 99.0)),
            "max": round3(sorted.last().copied().unwrap_or(0.0)),
            "total": round3(stall_total),
        },
    });
    println!("{result}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigv4_matches_the_aws_documentation_example() {
        // "GET Object" example of the S3 SigV4 documentation (header-based auth).
        let key = S3Key { access: "AKIAIOSFODNN7EXAMPLE".into(), secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into() };
        let url = Url::parse("http://examplebucket.s3.amazonaws.com/test.txt").unwrap();
        let auth = sigv4_authorization(&key, "GET", &url, &[("range", "bytes=0-9")], EMPTY_SHA256, "20130524", "20130524T000000Z");
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn amz_dates_are_utc_calendar_dates() {
        assert_eq!(amz_dates(UNIX_EPOCH), ("19700101".into(), "19700101T000000Z".into()));
        let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096); // 2024-02-29 12:34:56 UTC
        assert_eq!(amz_dates(t), ("20240229".into(), "20240229T123456Z".into()));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100KiB"), Ok(100 * 1024));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999GiB").is_err());
    }

    #[test]
    fn tar_headers_have_valid_checksums_and_members_are_block_aligned() {
        let ds = Dataset { layout: Layout::Shard, count: 5, sample_bytes: 1000, shard_bytes: 5000, seed: 9 };
        ds.check().unwrap();
        assert_eq!(ds.member_bytes(), 512 + 1024);
        assert_eq!(ds.samples_per_shard(), 2);
        assert_eq!(ds.files(), 3);
        let shard = ds.file_bytes(1);
        assert_eq!(shard.len(), 2 * 1536 + 1024);
        let h = &shard[1536..2048];
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        let sum: u32 = h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { b' ' as u32 } else { b as u32 }).sum();
        assert_eq!(stored, sum);
        assert!(h.starts_with(b"sample-00000003.bin\0"));
        let (file, a, b) = ds.locate(3);
        assert_eq!((file, a, b), (1, 1536 + 512, 1536 + 512 + 1000));
        assert_eq!(&shard[a as usize..b as usize], &sample_bytes(9, 3, 1000)[..]);
        assert_ne!(sample_bytes(9, 3, 64), sample_bytes(9, 4, 64));
        let tiny = Dataset { shard_bytes: 1024, ..ds };
        assert!(tiny.check().is_err());
    }

    #[test]
    fn plans_cover_every_sample_once_per_epoch_in_worker_order() {
        let small = Dataset { layout: Layout::Small, count: 10, sample_bytes: 1, shard_bytes: 0, seed: 1 };
        let p = plan(&small, 3, 4, 2, true, 7, None);
        assert_eq!(p.len(), 6);
        assert_eq!(p.iter().map(|b| b.worker).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
        for e in 0..2 {
            let mut seen: Vec<u64> = p.iter().filter(|b| b.epoch == e).flat_map(|b| b.samples.clone()).collect();
            seen.sort();
            assert_eq!(seen, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(p[0].samples, p[3].samples, "each epoch has its own order");
        assert_eq!(plan(&small, 3, 4, 2, true, 7, Some(4)).len(), 4);

        let shard = Dataset { layout: Layout::Shard, count: 10, sample_bytes: 1000, shard_bytes: 5000, seed: 1 };
        let p = plan(&shard, 2, 2, 1, false, 7, None);
        // Shards {0,1,2,3,4} of two samples: worker 0 streams shards 0, 2, 4; worker 1 shards 1, 3.
        assert_eq!(p.iter().map(|b| (b.worker, b.samples.clone())).collect::<Vec<_>>(), vec![
            (0, vec![0, 1]),
            (1, vec![2, 3]),
            (0, vec![4, 5]),
            (1, vec![6, 7]),
            (0, vec![8, 9]),
        ]);
    }

    #[test]
    fn warmup_ends_when_the_rolling_stall_stays_low() {
        // compute 100 ms: the threshold is 2 ms.
        assert_eq!(warmup_batches(&[0.0; 20], 100.0, 5), Some(0));
        let mut s = vec![50.0, 30.0, 10.0];
        s.extend([0.0; 20]);
        // Window 5: from batch 3 on every window is all zeros; the one starting at 2 averages 2 ms.
        assert_eq!(warmup_batches(&s, 100.0, 5), Some(3));
        // One slow first batch is one batch of warm-up, whatever the window.
        assert_eq!(warmup_batches(&[90.0, 0.0, 0.0, 0.0], 100.0, 3), Some(1));
        // ... but settling only in the last batches, fewer than a window, is not warmed up.
        assert_eq!(warmup_batches(&[90.0, 0.0, 0.0, 0.0], 100.0, 4), None);
        assert_eq!(warmup_batches(&[0.0, 0.0], 100.0, 10), Some(0), "a short run that never stalled");
        s.push(100.0);
        assert_eq!(warmup_batches(&s, 100.0, 5), None, "a stall at the end: never warmed up");
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 99.0), 4.0);
    }
}
