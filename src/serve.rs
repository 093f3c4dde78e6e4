//! `aquifer serve`: opens the storage engine and serves every protocol from one process.

use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use storage_engine::{DriveConfig, Engine, EngineConfig, LOG_REUSE_BYTES_DEFAULT, PoolConfig};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where metadata, file drives and credentials live.
    #[arg(long, env = "AQUIFER_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Address of the REST API and file API.
    #[arg(long, env = "AQUIFER_REST_LISTEN")]
    rest: Option<SocketAddr>,
    /// Address of the S3 API.
    #[arg(long, env = "AQUIFER_S3_LISTEN")]
    s3: Option<SocketAddr>,
    /// Base domain for virtual-host style S3 requests: a Host of bucket.DOMAIN (any port)
    /// names the bucket; other hosts are path style. A DNS name without a port.
    #[arg(long)]
    s3_domain: Option<String>,
    /// Length of an S3 lifecycle day in seconds (default a real day, 86400). Only for trying
    /// lifecycle rules out: Expiration and AbortIncompleteMultipartUpload days count in
    /// these units, as with Ceph RGW's rgw_lc_debug_interval.
    #[arg(long, env = "AQUIFER_S3_LIFECYCLE_DAY_SECS", value_parser = clap::value_parser!(u64).range(1..=86400))]
    s3_lifecycle_day_secs: Option<u64>,
    /// Address of NFSv3 (MOUNT on the same port).
    #[arg(long, env = "AQUIFER_NFS_LISTEN")]
    nfs: Option<SocketAddr>,
    /// Address of SFTP (SSH).
    #[arg(long, env = "AQUIFER_SFTP_LISTEN")]
    sftp: Option<SocketAddr>,
    /// Address of SMB 2/3. Default 127.0.0.1:445, which needs root; when that default cannot
    /// be bound the daemon serves without SMB (an address given here must bind).
    #[arg(long, env = "AQUIFER_SMB_LISTEN")]
    smb: Option<SocketAddr>,
    /// Address of the fabric listener (portals between clusters, mutual TLS).
    #[arg(long, env = "AQUIFER_FABRIC_LISTEN")]
    fabric: Option<SocketAddr>,
    /// This cluster's region, matched against residency labels.
    #[arg(long, env = "AQUIFER_REGION")]
    region: Option<String>,
    /// A name for this cluster, shown to other clusters.
    #[arg(long, env = "AQUIFER_CLUSTER_NAME")]
    cluster_name: Option<String>,
    /// TOML configuration (drives, pools, listeners); flags override it.
    #[arg(long, env = "AQUIFER_CONFIG")]
    config: Option<PathBuf>,
    /// Size of each of the six file drives of the embedded default, created at first start.
    #[arg(long, default_value = "1GiB", value_parser = parse_bytes)]
    drive_size: u64,
    /// io backend for drives: auto (io_uring when the kernel allows), io_uring or pread.
    #[arg(long, default_value = "auto")]
    io_backend: String,
}

/// The configuration file. Every field is optional; missing ones take the embedded default.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    data_dir: Option<PathBuf>,
    #[serde(default)]
    listen: Listen,
    #[serde(default)]
    drives: Vec<DriveEntry>,
    #[serde(default)]
    pools: Vec<PoolEntry>,
    #[serde(default)]
    engine: EngineEntry,
    #[serde(default)]
    exports: Vec<ExportEntry>,
    #[serde(default)]
    fabric: crate::portal_api::FabricEntry,
    #[serde(default)]
    shares: Vec<ShareEntry>,
}

/// An SMB share in the configuration file (`[[shares]]`).
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct ShareEntry {
    name: String,
    path: String,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    guest: bool,
    #[serde(default)]
    encrypt: bool,
    #[serde(default)]
    leases: bool,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct Listen {
    rest: Option<SocketAddr>,
    s3: Option<SocketAddr>,
    s3_domain: Option<String>,
    nfs: Option<SocketAddr>,
    sftp: Option<SocketAddr>,
    smb: Option<SocketAddr>,
}

/// An NFS export in the configuration file.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct ExportEntry {
    path: String,
    /// `*`, addresses and networks (`10.0.0.0/8`).
    clients: Vec<String>,
    #[serde(default)]
    read_only: bool,
    #[serde(default = "yes")]
    root_squash: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct DriveEntry {
    /// A block device (/dev/nvme0n1) or a file.
    path: PathBuf,
    /// For a file drive: its size when created at first start.
    size_bytes: Option<u64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct PoolEntry {
    name: String,
    data_shards: usize,
    parity_shards: usize,
    /// Indexes into `drives`; all drives when absent.
    drives: Option<Vec<u32>>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct EngineEntry {
    inline_bytes_max: Option<u64>,
    write_buffer_bytes_max: Option<usize>,
    write_flush_threads: Option<usize>,
    /// Bytes of stripe data kept in memory for reads (0: none).
    data_cache_bytes: Option<usize>,
    io_backend: Option<String>,
    /// Bytes of metadata log written when the daemon starts and overwritten afterwards
    /// (0: the log grows as it is written).
    log_reuse_bytes: Option<u64>,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let n: u64 = num.parse().map_err(|_| format!("not a size: {s}"))?;
    let m: u64 = match mult.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} (use KiB, MiB, GiB, TiB)")),
    };
    n.checked_mul(m).ok_or_else(|| format!("size {s} overflows"))
}

fn backend(name: &str) -> Result<hardware::BackendChoice> {
    Ok(match name {
        "auto" => hardware::BackendChoice::Auto,
        "io_uring" | "io-uring" | "uring" => hardware::BackendChoice::IoUring,
        "pread" => hardware::BackendChoice::Pread,
        other => bail!("unknown io backend {other:?} (auto, io_uring, pread)"),
    })
}

/// Writes a secret readable by its owner only; refuses to follow an existing file's mode.
fn write_secret(path: &Path, content: &str) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(content.as_bytes()).with_context(|| format!("write {}", path.display()))?;
    f.sync_all().with_context(|| format!("sync {}", path.display()))?;
    Ok(())
}

pub fn run(args: ServeArgs) -> Result<()> {
    // Stripe, shard and RPC buffers are MiB-sized and short-lived. Left alone, glibc raises its
    // mmap threshold after the first such buffer is freed and keeps freed heap space (measured:
    // ~300 MiB RSS after a 1 GiB PUT). A threshold of 256 KiB bounded that but mapped and
    // unmapped every buffer, and the page faults made bulk NFS reads and writes 2-3x slower
    // (docs/benchmarks.md). 8 MiB keeps 1 MiB shard and RPC buffers and 4 MiB stripe buffers and
    // SMB read-ahead chunks on the heap (a 64 MiB trim threshold returns the rest), two arenas
    // stop per-thread heaps from multiplying it. At 2 MiB every stripe buffer was still mapped
    // and unmapped: ~15 % of the daemon's CPU in page faults during a 1 GiB SMB put; at 8 MiB a
    // 1 GiB SMB put and get ran ~20 % and ~10 % faster, RSS after them the same (~310 MiB).
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    // glibc's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_ARENA_MAX variables,
    // when set, win.
    unsafe {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 8 << 20);
        }
        if std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none() {
            libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
        }
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("AQUIFER_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let file: ConfigFile = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("read config {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("parse config {}", p.display()))?
        }
        None => ConfigFile::default(),
    };
    let data_dir = args.data_dir.or(file.data_dir).unwrap_or_else(|| PathBuf::from("aquifer-data"));
    std::fs::create_dir_all(&data_dir).with_context(|| format!("create data dir {}", data_dir.display()))?;
    let data_dir = data_dir.canonicalize().with_context(|| format!("resolve {}", data_dir.display()))?;
    let addr = |a: Option<SocketAddr>, f: Option<SocketAddr>, default: &str| a.or(f).unwrap_or_else(|| default.parse().expect("address"));
    let fabric_cfg = crate::portal_api::config(&data_dir, &file.fabric, args.fabric, args.region.clone(), args.cluster_name.clone());
    let s3_domain = args.s3_domain.clone().or(file.listen.s3_domain.clone());
    if let Some(d) = &s3_domain {
        aquifer_s3::check_domain(d)?;
    }
    let listen = Listeners {
        fabric: fabric_cfg,
        rest: addr(args.rest, file.listen.rest, "127.0.0.1:8080"),
        s3: addr(args.s3, file.listen.s3, "127.0.0.1:9000"),
        s3_domain,
        s3_lifecycle_day_secs: args.s3_lifecycle_day_secs,
        nfs: addr(args.nfs, file.listen.nfs, "127.0.0.1:2049"),
        sftp: addr(args.sftp, file.listen.sftp, "127.0.0.1:2222"),
        smb: addr(args.smb, file.listen.smb, "127.0.0.1:445"),
        smb_given: args.smb.or(file.listen.smb).is_some(),
        smb_shares: if file.shares.is_empty() {
            aquifer_smb::default_shares()
        } else {
            file.shares
                .iter()
                .map(|s| aquifer_smb::ShareConfig {
                    name: s.name.clone(),
                    path: s.path.clone(),
                    read_only: s.read_only,
                    guest: s.guest,
                    encrypt: s.encrypt,
                    leases: s.leases,
                })
                .collect()
        },
        // The embedded default exports / to this machine only, without root squash, so the
        // local admin can use it as root.
        exports: if file.exports.is_empty() {
            vec![aquifer_nfs::Export { path: "/".into(), clients: vec!["127.0.0.1".into()], read_only: false, root_squash: false }]
        } else {
            file.exports
                .iter()
                .map(|e| aquifer_nfs::Export { path: e.path.clone(), clients: e.clients.clone(), read_only: e.read_only, root_squash: e.root_squash })
                .collect()
        },
    };

    let mut cfg = EngineConfig::with_file_drives(&data_dir, 6, args.drive_size, 4, 2);
    if !file.drives.is_empty() {
        cfg.drives = file
            .drives
            .iter()
            .map(|d| DriveConfig { path: d.path.clone(), create_bytes: d.size_bytes })
            .collect();
        cfg.pools = vec![PoolConfig {
            name: "default".into(),
            data_shards: 4,
            parity_shards: 2,
            drives: (0..cfg.drives.len() as u32).collect(),
        }];
    }
    if !file.pools.is_empty() {
        cfg.pools = file
            .pools
            .iter()
            .map(|p| PoolConfig {
                name: p.name.clone(),
                data_shards: p.data_shards,
                parity_shards: p.parity_shards,
                drives: p.drives.clone().unwrap_or_else(|| (0..cfg.drives.len() as u32).collect()),
            })
            .collect();
    }
    if let Some(v) = file.engine.inline_bytes_max {
        cfg.inline_bytes_max = v;
    }
    if let Some(v) = file.engine.write_buffer_bytes_max {
        cfg.write_buffer_bytes_max = v;
    }
    if let Some(v) = file.engine.data_cache_bytes {
        cfg.data_cache_bytes = v;
    }
    if let Some(v) = file.engine.write_flush_threads {
        cfg.write_flush_threads = v;
    }
    cfg.log_reuse_bytes = file.engine.log_reuse_bytes.unwrap_or(LOG_REUSE_BYTES_DEFAULT);
    cfg.drive_open.backend = backend(file.engine.io_backend.as_deref().unwrap_or(&args.io_backend))?;

    let fresh = !data_dir.join("meta").exists();
    let mut generated = None;
    if fresh {
        let pw = match std::env::var("AQUIFER_ADMIN_PASSWORD") {
            Ok(p) if !p.is_empty() => p,
            _ => {
                let p = hex_password();
                generated = Some(p.clone());
                p
            }
        };
        cfg.admin_password = Some(pw);
    }
    let engine = Engine::open(cfg).context("open storage engine")?;
    if fresh {
        let path = data_dir.join("admin-password");
        if let Some(p) = &generated {
            write_secret(&path, &format!("{p}\n"))?;
            println!("Created user admin with password {p}");
            println!("(written to {}, readable by this user only; shown only this once)", path.display());
        } else {
            println!("Created user admin with the password from AQUIFER_ADMIN_PASSWORD");
        }
        // S3 credentials for admin: from the environment, else generated and kept.
        let admin = storage_engine::Caller::system();
        let given = match (std::env::var("AQUIFER_S3_ACCESS_KEY"), std::env::var("AQUIFER_S3_SECRET_KEY")) {
            (Ok(a), Ok(s)) if !a.is_empty() && !s.is_empty() => Some((a, s)),
            _ => None,
        };
        let (access, secret) = engine
            .create_s3_key(&admin, "admin", given.as_ref().map(|(a, s)| (a.as_str(), s.as_str())))
            .context("create admin's S3 key")?;
        if given.is_none() {
            let path = data_dir.join("admin-s3-credentials");
            write_secret(&path, &format!("AWS_ACCESS_KEY_ID={access}\nAWS_SECRET_ACCESS_KEY={secret}\n"))?;
            println!("Created S3 access key {access} for admin (secret in {})", path.display());
        } else {
            println!("Created S3 access key {access} for admin from AQUIFER_S3_ACCESS_KEY");
        }
    }
    let health = engine.health();
    for d in &health.drives {
        tracing::info!(drive = d.index, path = %d.path.display(), state = d.state.as_str(), backend = %d.backend, "drive");
    }

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("aquifer-rt").build()?;
    let res = rt.block_on(serve_all(engine.clone(), listen, data_dir.clone()));
    tracing::info!("shutting down");
    // The runtime goes first: its drop ends every task still running (an SSH session runs
    // in a task of russh's own, for one) and waits for the threads in engine calls. A
    // request answered after the engine's last write-out would be lost at exit.
    drop(rt);
    let shut = engine.shutdown();
    res?;
    shut.context("shut down storage engine")?;
    Ok(())
}

fn hex_password() -> String {
    let mut b = [0u8; 12];
    getrandom(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn getrandom(buf: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .expect("read /dev/urandom");
}

struct Listeners {
    rest: SocketAddr,
    s3: SocketAddr,
    s3_domain: Option<String>,
    s3_lifecycle_day_secs: Option<u64>,
    nfs: SocketAddr,
    sftp: SocketAddr,
    smb: SocketAddr,
    /// The SMB address was configured (must bind) rather than the default (may be skipped).
    smb_given: bool,
    smb_shares: Vec<aquifer_smb::ShareConfig>,
    exports: Vec<aquifer_nfs::Export>,
    fabric: fabric::FabricConfig,
}

async fn bind(what: &str, addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listen for {what} on {addr}"))
}

async fn serve_all(engine: Arc<Engine>, listen: Listeners, data_dir: PathBuf) -> Result<()> {
    let rest = bind("REST", listen.rest).await?;
    let s3 = bind("S3", listen.s3).await?;
    let nfs = bind("NFS", listen.nfs).await?;
    let sftp = bind("SFTP", listen.sftp).await?;
    let (rest_at, s3_at, nfs_at, sftp_at) = (rest.local_addr()?, s3.local_addr()?, nfs.local_addr()?, sftp.local_addr()?);
    // Shares of the configuration file and those added through the API (engine settings).
    let smb_shares = aquifer_smb::ShareTable::new(engine.clone(), listen.smb_shares.clone()).context("SMB shares")?;
    let smb = match aquifer_smb::SmbService::bind(engine.clone(), listen.smb, aquifer_smb::SmbOptions::default(), smb_shares.clone()).await {
        Ok(s) => Some(s),
        Err(e) if !listen.smb_given => {
            tracing::warn!("not serving SMB: {e:#} (give --smb ADDR, e.g. 127.0.0.1:4445)");
            None
        }
        Err(e) => return Err(e),
    };
    let (tx, rx) = tokio::sync::watch::channel(false);
    // Handlers first: once the address is printed, SIGTERM must mean a clean shutdown.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let stopped = move || {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    };
    let fabric = fabric::Fabric::start(engine.clone(), listen.fabric.clone()).await.context("starting the fabric")?;
    let portals: Arc<dyn aquifer_rest::portals::PortalAdmin> = Arc::new(crate::portal_api::PortalApi(fabric.clone()));
    let exports = aquifer_nfs::ExportTable::new(engine.clone(), listen.exports.clone()).context("NFS exports")?;
    let export_api: Arc<dyn aquifer_rest::exports::ExportAdmin> = Arc::new(crate::export_api::ExportApi(exports.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn({
        let share_api: Arc<dyn aquifer_rest::shares::ShareAdmin> = Arc::new(crate::share_api::ShareApi(smb_shares));
        let hooks = aquifer_rest::Hooks { portals: Some(portals), exports: Some(export_api), shares: Some(share_api) };
        let f = aquifer_rest::serve_hooks(engine.clone(), hooks, rest, stopped());
        async move { ("REST", f.await.map_err(anyhow::Error::from)) }
    });
    tasks.spawn({
        let opts = aquifer_s3::S3Options { domain: listen.s3_domain.clone(), lifecycle_day_secs: listen.s3_lifecycle_day_secs, body_idle_timeout_ms: None };
        let f = aquifer_s3::serve(engine.clone(), s3, opts, stopped());
        async move { ("S3", f.await) }
    });
    tasks.spawn({
        let f = aquifer_nfs::serve_table(exports, nfs, stopped());
        async move { ("NFS", f.await) }
    });
    tasks.spawn({
        let opts = aquifer_sftp::SftpOptions::new(data_dir.join("ssh_host_ed25519_key"));
        let f = aquifer_sftp::serve(engine.clone(), sftp, opts, stopped());
        async move { ("SFTP", f.await) }
    });
    if let Some(smb) = smb {
        let at = smb.local_addr();
        let names = smb.share_names();
        println!("SMB at smb://{at} (shares: {})", names.join(", "));
        tasks.spawn({
            let f = smb.serve(stopped());
            async move { ("SMB", f.await) }
        });
    }
    println!(
        "S3 at s3://{s3_at}, NFSv3 at nfs://{nfs_at} (MOUNT on the same port), SFTP at sftp://{sftp_at}"
    );
    if let Some(at) = fabric.local_addr() {
        println!("Fabric at fabric://{at} (region {}, certificate SHA-256 {})", fabric.region(), fabric.fingerprint());
    }
    println!(
        "Aquifer is serving {} (REST API and file API at http://{}/api/v1/, log in as admin)",
        data_dir.display(),
        rest_at
    );
    let outcome = tokio::select! {
        _ = term.recv() => { tracing::info!("SIGTERM received"); Ok(()) }
        _ = int.recv() => { tracing::info!("SIGINT received"); Ok(()) }
        Some(r) = tasks.join_next() => match r {
            Ok((what, Ok(()))) => Err(anyhow::anyhow!("{what} server stopped unexpectedly")),
            Ok((what, Err(e))) => Err(e.context(format!("{what} server"))),
            Err(e) => Err(anyhow::anyhow!("server task: {e}")),
        },
    };
    let _ = tx.send(true);
    while let Some(r) = tasks.join_next().await {
        if let Ok((what, Err(e))) = r {
            tracing::error!("{what} server: {e:#}");
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("12XB").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
    }

    #[test]
    fn config_rejects_unknown_fields() {
        assert!(toml::from_str::<ConfigFile>("data_dir = \"/x\"\nbogus = 1").is_err());
        let c: ConfigFile = toml::from_str(
            "[listen]\nrest = \"127.0.0.1:9\"\n[[drives]]\npath = \"/dev/nvme0n1\"\n[[pools]]\nname = \"p\"\ndata_shards = 4\nparity_shards = 2\n",
        )
        .unwrap();
        assert_eq!(c.drives.len(), 1);
        assert_eq!(c.pools[0].data_shards, 4);
    }
}
