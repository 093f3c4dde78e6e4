//! The `aquifer` command-line client: every subcommand here is a client of the REST API
//! (DESIGN.md §2: the CLI talks to the REST API like any client). Output is human-readable by
//! default and the API's JSON with `--json`.

use std::fs::File;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use reqwest::blocking::{Client as HttpClient, RequestBuilder, Response};
use serde_json::{Value, json};

/// How to reach and authenticate to the REST API. The password comes from the environment
/// variable AQUIFER_PASSWORD, or an API token from AQUIFER_TOKEN (which wins), so that neither
/// shows up in the process list.
#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// REST API address: host:port or an http:// URL.
    #[arg(long, global = true, env = "AQUIFER_REST", default_value = "127.0.0.1:8080")]
    pub rest: String,
    /// User to authenticate as (with the password in AQUIFER_PASSWORD).
    #[arg(long, global = true, env = "AQUIFER_USER", default_value = "admin")]
    pub user: String,
    /// Print the API's JSON instead of human-readable output.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Upload, download, list, move and remove files and directories.
    Files {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: FilesCmd,
    },
    /// Show, replace or fail drives (default: list).
    Drives {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<DrivesCmd>,
    },
    /// Background jobs: scrub and rebuild (default: list).
    Jobs {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<JobsCmd>,
    },
    /// Users (default: list).
    Users {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<UsersCmd>,
    },
    /// Groups (default: list).
    Groups {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<GroupsCmd>,
    },
    /// API tokens (default: list).
    Tokens {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<TokensCmd>,
    },
    /// Overall health of the node and its drives.
    Health {
        #[command(flatten)]
        conn: Conn,
    },
    /// Storage pools.
    Pools {
        #[command(flatten)]
        conn: Conn,
    },
    /// Usable and raw capacity.
    Capacity {
        #[command(flatten)]
        conn: Conn,
    },
    /// The data cache: stripe data kept in memory for reads, hits and misses.
    Cache {
        #[command(flatten)]
        conn: Conn,
    },
    /// Portals: extend a hub directory to this (spoke) cluster (default: list).
    Portal {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<PortalCmd>,
    },
    /// Residency labels of directories (portals never move labelled data out of its region).
    Residency {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: ResidencyCmd,
    },
    /// NFS exports: the configuration file's and those added here, applied without a restart
    /// (default: list).
    Exports {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<ExportsCmd>,
    },
    /// SMB shares: the configuration file's and those added here, served without a restart
    /// (default: list).
    Shares {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: Option<SharesCmd>,
    },
    /// SFTP settings: per-user chroots.
    Sftp {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: SftpCmd,
    },
    /// The audit log: every portal operation and refusal, residency changes.
    Audit {
        #[command(flatten)]
        conn: Conn,
        /// Only records after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
}

#[derive(Subcommand, Debug)]
pub enum PortalCmd {
    /// List portals this cluster is hub or spoke of.
    List,
    /// One portal with its live figures.
    Show { id: String },
    /// On the spoke: propose a portal to a hub (it stays pending until the hub authorizes it).
    Create {
        /// The hub's fabric address, HOST:PORT.
        #[arg(long)]
        hub: String,
        /// The directory on the hub.
        #[arg(long)]
        hub_path: String,
        /// Where it appears on this cluster (created; must be new or empty).
        #[arg(long)]
        spoke_path: String,
        /// ro (read-only) or rw (writes are forwarded to the hub).
        #[arg(long, default_value = "ro")]
        mode: String,
        /// Expected SHA-256 fingerprint of the hub's certificate (`aquifer portal identity` on the hub).
        #[arg(long)]
        hub_fingerprint: Option<String>,
        /// Serve cached data even when the hub's lease has run out (logged).
        #[arg(long)]
        serve_stale: bool,
    },
    /// On the hub: accept a pending portal.
    Authorize { id: String },
    /// Delete a portal (on a spoke: its cached data is reclaimed).
    Delete { id: String },
    /// Turn serving stale data on or off.
    ServeStale { id: String, on: String },
    /// This cluster's fabric identity (certificate fingerprint, region, listener).
    Identity,
}

#[derive(Subcommand, Debug)]
pub enum ExportsCmd {
    /// List exports (configuration file and added here).
    List,
    /// Export a directory over NFS.
    Add {
        /// Directory of the namespace (must exist); clients may mount it or any directory below.
        path: String,
        /// Who may mount: `*`, addresses and networks, comma-separated (e.g. 10.0.0.0/8,192.168.1.7).
        #[arg(long, value_delimiter = ',', required = true)]
        clients: Vec<String>,
        #[arg(long)]
        read_only: bool,
        /// Let uid 0 act as root (root is mapped to nobody by default).
        #[arg(long)]
        no_root_squash: bool,
    },
    /// Change an export added with `add` (by id or path).
    Set {
        export: String,
        #[arg(long, value_delimiter = ',')]
        clients: Option<Vec<String>>,
        /// on or off.
        #[arg(long)]
        read_only: Option<String>,
        /// on or off.
        #[arg(long)]
        root_squash: Option<String>,
    },
    /// Remove an export added with `add` (by id or path); clients using it are refused.
    Rm { export: String },
}

#[derive(Subcommand, Debug)]
pub enum SftpCmd {
    /// Per-user chroots: the directory a user's SFTP sessions see as `/` (default: list).
    Chroot {
        #[command(subcommand)]
        cmd: Option<ChrootCmd>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ChrootCmd {
    /// List users with an SFTP chroot.
    List,
    /// Confine USER's SFTP sessions to PATH (an existing directory) from their next login.
    Set {
        // Not `user`: that id is the global --user of the connection.
        #[arg(value_name = "USER")]
        name: String,
        path: String,
    },
    /// Lift USER's chroot: their next login sees the whole namespace (as their permissions allow).
    Rm {
        #[arg(value_name = "USER")]
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum SharesCmd {
    /// List shares (configuration file and added here).
    List,
    /// Share a directory over SMB as \\server\NAME.
    Add {
        /// Share name: letters, digits, '-', '_', '.', '$' (case-insensitive).
        name: String,
        /// Directory of the namespace (must exist); clients see it as the share's root.
        path: String,
        #[arg(long)]
        read_only: bool,
        /// Admit sessions without an account, as nobody/nogroup (from the next restart
        /// when no share admitted guests at start: signing is then required of every session).
        #[arg(long)]
        guest: bool,
        /// Only encrypted SMB 3 sessions may connect.
        #[arg(long)]
        encrypt: bool,
        /// SMB2 leases and durable handles; only for directories no other protocol writes.
        #[arg(long)]
        leases: bool,
    },
    /// Change a share added with `add`; its connections are closed and reconnect.
    Set {
        name: String,
        #[arg(long)]
        path: Option<String>,
        /// on or off.
        #[arg(long)]
        read_only: Option<String>,
        /// on or off.
        #[arg(long)]
        guest: Option<String>,
        /// on or off.
        #[arg(long)]
        encrypt: Option<String>,
        /// on or off.
        #[arg(long)]
        leases: Option<String>,
    },
    /// Remove a share added with `add`; its connections and open files are closed.
    Rm { name: String },
}

#[derive(Subcommand, Debug)]
pub enum ResidencyCmd {
    /// Label a directory with the regions its data may live in (e.g. eu, or eu,us).
    Set { path: String, label: String },
    /// Show a directory's label.
    Get { path: String },
    /// Remove a directory's label.
    Rm { path: String },
}

#[derive(Subcommand, Debug)]
pub enum FilesCmd {
    /// Upload LOCAL to REMOTE (a REMOTE ending in '/' keeps the local name); missing parent
    /// directories are created and an existing file is replaced atomically.
    Put { local: PathBuf, remote: String },
    /// Download REMOTE to LOCAL (default: its name in the current directory; '-' = stdout).
    Get { remote: String, local: Option<String> },
    /// List a directory (default: the root).
    Ls { remote: Option<String> },
    /// Remove a file, symbolic link or empty directory.
    Rm { remote: String },
    /// Make a directory.
    Mkdir {
        /// Also make missing parents; an existing directory is not an error.
        #[arg(short, long)]
        parents: bool,
        remote: String,
    },
    /// Move or rename (a DEST ending in '/' keeps the name).
    Mv { source: String, dest: String },
}

#[derive(Subcommand, Debug)]
pub enum DrivesCmd {
    /// List drives.
    List,
    /// Show one drive.
    Show { index: u32 },
    /// Replace a drive (in place, or with a new file or device) and rebuild onto it.
    Replace {
        index: u32,
        /// New drive file or device.
        #[arg(long)]
        path: Option<String>,
        /// Size of a drive file created at --path.
        #[arg(long)]
        size: Option<u64>,
    },
    /// Take a drive out of service.
    Fail {
        index: u32,
        #[arg(long, default_value = "failed by operator")]
        reason: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum JobsCmd {
    /// List jobs, newest first.
    List,
    /// Show one job.
    Show { id: u64 },
    /// Start a scrub of every stripe.
    Scrub {
        /// Throttle in bytes per second (0 = unthrottled).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Show progress until the job ends.
        #[arg(long)]
        wait: bool,
    },
    /// Start a rebuild onto a drive.
    Rebuild {
        drive: u32,
        #[arg(long, default_value_t = 0)]
        rate: u64,
        #[arg(long)]
        wait: bool,
    },
    /// Cancel a running job.
    Cancel { id: u64 },
}

#[derive(Subcommand, Debug)]
pub enum UsersCmd {
    /// List users.
    List,
    /// Show one user.
    Show { name: String },
    /// Create a user; the password is read from standard input.
    Add {
        name: String,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
        /// user, read-only, operator or admin.
        #[arg(long)]
        role: Option<String>,
        #[arg(long)]
        uid: Option<u32>,
        #[arg(long)]
        gid: Option<u32>,
        /// Supplementary group ids, comma-separated.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<u32>,
    },
    /// Change a user's password, read from standard input.
    Passwd {
        name: String,
        #[arg(long)]
        password_stdin: bool,
    },
    /// Delete a user and its tokens.
    Rm { name: String },
}

#[derive(Subcommand, Debug)]
pub enum GroupsCmd {
    /// List groups.
    List,
    /// Create a group.
    Add {
        name: String,
        #[arg(long)]
        gid: Option<u32>,
    },
    /// Delete a group.
    Rm { name: String },
}

#[derive(Subcommand, Debug)]
pub enum TokensCmd {
    /// Issue a token; the secret is printed once.
    Create {
        /// Whose token (admins only; default yourself).
        #[arg(long = "for")]
        for_user: Option<String>,
        #[arg(long)]
        role: Option<String>,
        /// Lifetime in seconds (default: no expiry).
        #[arg(long)]
        ttl: Option<u64>,
        #[arg(long)]
        label: Option<String>,
    },
    /// List tokens.
    List,
    /// Revoke a token.
    Revoke { id: String },
}

/// Runs one client command.
pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Files { conn, cmd } => files(&Client::new(&conn)?, cmd),
        Command::Drives { conn, cmd } => drives(&Client::new(&conn)?, cmd.unwrap_or(DrivesCmd::List)),
        Command::Jobs { conn, cmd } => jobs(&Client::new(&conn)?, cmd.unwrap_or(JobsCmd::List)),
        Command::Users { conn, cmd } => users(&Client::new(&conn)?, cmd.unwrap_or(UsersCmd::List)),
        Command::Groups { conn, cmd } => groups(&Client::new(&conn)?, cmd.unwrap_or(GroupsCmd::List)),
        Command::Tokens { conn, cmd } => tokens(&Client::new(&conn)?, cmd.unwrap_or(TokensCmd::List)),
        Command::Health { conn } => {
            let c = Client::new(&conn)?;
            let h = c.call(Method::GET, "/health", None, "get health")?;
            c.print(&h, print_health)
        }
        Command::Pools { conn } => {
            let c = Client::new(&conn)?;
            let v = c.call(Method::GET, "/pools", None, "list pools")?;
            c.print(&v, print_pools)
        }
        Command::Portal { conn, cmd } => portal(&Client::new(&conn)?, cmd.unwrap_or(PortalCmd::List)),
        Command::Residency { conn, cmd } => residency(&Client::new(&conn)?, cmd),
        Command::Exports { conn, cmd } => exports(&Client::new(&conn)?, cmd.unwrap_or(ExportsCmd::List)),
        Command::Shares { conn, cmd } => shares(&Client::new(&conn)?, cmd.unwrap_or(SharesCmd::List)),
        Command::Sftp { conn, cmd: SftpCmd::Chroot { cmd } } => chroots(&Client::new(&conn)?, cmd.unwrap_or(ChrootCmd::List)),
        Command::Audit { conn, after, limit } => {
            let c = Client::new(&conn)?;
            let v = c.call(Method::GET, &format!("/audit?after={after}&limit={limit}"), None, "read the audit log")?;
            c.print(&v, |v| {
                for r in items(v) {
                    println!("{:>6} {} {:<8} {:<8} {:<22} {} -> {}", u(r, "seq"), u(r, "time_ns") / 1_000_000_000, s(r, "user"), s(r, "protocol"), s(r, "action"), s(r, "target"), s(r, "outcome"));
                }
            })
        }
        Command::Capacity { conn } => {
            let c = Client::new(&conn)?;
            let v = c.call(Method::GET, "/capacity", None, "get capacity")?;
            c.print(&v, print_capacity)
        }
        Command::Cache { conn } => {
            let c = Client::new(&conn)?;
            let v = c.call(Method::GET, "/cache", None, "get the data cache")?;
            c.print(&v, print_cache)
        }
    }
}

// ------------------------------------------------------------------ the HTTP client

enum Credentials {
    Basic { user: String, password: String },
    Bearer(String),
    None,
}

struct Client {
    base: String,
    http: HttpClient,
    creds: Credentials,
    json: bool,
}

/// Connecting must succeed within this time; transfers themselves have no deadline.
const CONNECT_TIMEOUT_SECS: u64 = 10;
/// How often `--wait` asks for a job's progress.
const JOB_POLL_MS: u64 = 500;
/// Entries per listing page.
const LIST_PAGE_ENTRIES: usize = 1000;

impl Client {
    fn new(conn: &Conn) -> Result<Client> {
        let base = if conn.rest.contains("://") { conn.rest.trim_end_matches('/').to_string() } else { format!("http://{}", conn.rest) };
        let creds = match (std::env::var("AQUIFER_TOKEN"), std::env::var("AQUIFER_PASSWORD")) {
            (Ok(t), _) if !t.is_empty() => Credentials::Bearer(t),
            (_, Ok(p)) if !p.is_empty() => Credentials::Basic { user: conn.user.clone(), password: p },
            _ => Credentials::None,
        };
        let http = HttpClient::builder()
            .connect_timeout(Duration::from_secs(CONNECT_TIMEOUT_SECS))
            .timeout(None)
            .build()
            .context("create HTTP client")?;
        Ok(Client { base, http, creds, json: conn.json })
    }

    fn request(&self, method: Method, api_path: &str) -> RequestBuilder {
        let rb = self.http.request(method, format!("{}/api/v1{api_path}", self.base));
        match &self.creds {
            Credentials::Basic { user, password } => rb.basic_auth(user, Some(password)),
            Credentials::Bearer(t) => rb.bearer_auth(t),
            Credentials::None => rb,
        }
    }

    /// Sends a request; a non-success answer becomes "WHAT: STATUS MESSAGE".
    fn send(&self, rb: RequestBuilder, what: &str) -> Result<Response> {
        let res = rb.send().map_err(|e| anyhow!("{what}: cannot reach the REST API at {}: {e}", self.base))?;
        if res.status().is_success() {
            return Ok(res);
        }
        let status = res.status();
        let body = res.text().unwrap_or_default();
        let message = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string))
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_lowercase());
        let hint = if status.as_u16() == 401 && matches!(self.creds, Credentials::None) {
            " (set AQUIFER_PASSWORD or AQUIFER_TOKEN)"
        } else {
            ""
        };
        bail!("{what}: {} {message}{hint}", status.as_u16())
    }

    /// A JSON call; `Value::Null` for answers without a body.
    fn call(&self, method: Method, api_path: &str, body: Option<Value>, what: &str) -> Result<Value> {
        let mut rb = self.request(method, api_path);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let res = self.send(rb, what)?;
        let text = res.text().with_context(|| format!("{what}: read answer"))?;
        if text.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("{what}: answer is not JSON"))
    }

    /// Prints `v` as JSON with `--json`, else with `human`.
    fn print(&self, v: &Value, human: fn(&Value)) -> Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(v)?);
        } else {
            human(v);
        }
        Ok(())
    }
}

/// Characters left as they are in a path component of a URL.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `/a/b c` → `/a/b%20c`: each component percent-encoded; empty for the root.
fn encode_remote(remote: &str) -> String {
    let trimmed = remote.trim_start_matches('/').trim_end_matches('/');
    if trimmed.is_empty() {
        return String::new();
    }
    trimmed.split('/').map(|c| format!("/{}", utf8_percent_encode(c, COMPONENT))).collect()
}

fn basename(p: &str) -> &str {
    p.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn items(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

// ------------------------------------------------------------------ files

fn files(c: &Client, cmd: FilesCmd) -> Result<()> {
    match cmd {
        FilesCmd::Put { local, remote } => {
            let remote = if remote.ends_with('/') || remote.is_empty() {
                let name = local.file_name().and_then(|n| n.to_str()).ok_or_else(|| anyhow!("{} has no file name", local.display()))?;
                format!("{}/{name}", remote.trim_end_matches('/'))
            } else {
                remote
            };
            let what = format!("put {} -> {remote}", local.display());
            let url = format!("/files{}", encode_remote(&remote));
            // The server refuses bad credentials before reading a body and closes the
            // connection, which a client still sending sees only as a broken pipe: check
            // them first so that the user gets the real reason.
            if let Ok(r) = c.request(Method::HEAD, &url).send() {
                if r.status().as_u16() == 401 {
                    c.send(c.request(Method::GET, "/auth/tokens"), &what)?;
                }
            }
            let file = File::open(&local).with_context(|| format!("{what}: open {}", local.display()))?;
            let len = file.metadata().with_context(|| format!("{what}: stat {}", local.display()))?.len();
            // Streams from the file: never read whole into memory.
            let body = reqwest::blocking::Body::sized(file, len);
            let res = c.send(c.request(Method::PUT, &url).body(body), &what)?;
            let created = res.status().as_u16() == 201;
            let attrs: Value = res.json().with_context(|| format!("{what}: read answer"))?;
            if c.json {
                println!("{}", serde_json::to_string_pretty(&attrs)?);
            } else {
                println!("{} {} -> {remote} ({})", if created { "created" } else { "replaced" }, local.display(), human_bytes(len));
            }
            Ok(())
        }
        FilesCmd::Get { remote, local } => {
            let what = format!("get {remote}");
            let res = c.send(c.request(Method::GET, &format!("/files{}", encode_remote(&remote))), &what)?;
            match local.as_deref() {
                Some("-") => {
                    let mut res = res;
                    let mut out = std::io::stdout().lock();
                    res.copy_to(&mut out).with_context(|| format!("{what}: download"))?;
                    out.flush()?;
                }
                other => {
                    let target = PathBuf::from(other.unwrap_or_else(|| basename(&remote)));
                    let target = if target.is_dir() { target.join(basename(&remote)) } else { target };
                    download_to(res, &target).with_context(|| format!("{what} -> {}", target.display()))?;
                    if !c.json {
                        println!("{remote} -> {}", target.display());
                    }
                }
            }
            Ok(())
        }
        FilesCmd::Ls { remote } => {
            let remote = remote.unwrap_or_else(|| "/".into());
            let what = format!("list {remote}");
            let base = format!("/dirs{}", encode_remote(&remote));
            let mut cursor: Option<String> = None;
            let mut all = Vec::new();
            loop {
                let mut rb = c.request(Method::GET, &base).query(&[("limit", LIST_PAGE_ENTRIES.to_string())]);
                if let Some(cur) = &cursor {
                    rb = rb.query(&[("cursor", cur)]);
                }
                let page: Value = c.send(rb, &what)?.json().with_context(|| format!("{what}: read answer"))?;
                for e in items(&page["entries"]) {
                    if c.json {
                        all.push(e.clone());
                    } else {
                        println!("{}", ls_line(e));
                    }
                }
                match page.get("next_cursor").and_then(Value::as_str) {
                    Some(next) => cursor = Some(next.to_string()),
                    None => break,
                }
            }
            if c.json {
                println!("{}", serde_json::to_string_pretty(&Value::Array(all))?);
            }
            Ok(())
        }
        FilesCmd::Rm { remote } => {
            let what = format!("rm {remote}");
            let enc = encode_remote(&remote);
            match c.send(c.request(Method::DELETE, &format!("/files{enc}")), &what) {
                Ok(_) => Ok(()),
                // A directory: remove it if it is empty.
                Err(e) if e.to_string().starts_with(&format!("{what}: 409 is a directory")) => {
                    c.send(c.request(Method::DELETE, &format!("/dirs{enc}")), &what).map(|_| ())
                }
                Err(e) => Err(e),
            }
        }
        FilesCmd::Mkdir { parents, remote } => {
            let what = format!("mkdir {remote}");
            let rb = c.request(Method::POST, &format!("/dirs{}", encode_remote(&remote))).query(&[("parents", parents)]);
            let v: Value = c.send(rb, &what)?.json().with_context(|| format!("{what}: read answer"))?;
            if c.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            Ok(())
        }
        FilesCmd::Mv { source, dest } => {
            let dest = if dest.ends_with('/') { format!("{dest}{}", basename(&source)) } else { dest };
            let dest_abs = if dest.starts_with('/') { dest.clone() } else { format!("/{dest}") };
            let what = format!("mv {source} -> {dest_abs}");
            let v = c.call(Method::POST, &format!("/files{}", encode_remote(&source)), Some(json!({ "rename_to": dest_abs })), &what)?;
            if c.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            Ok(())
        }
    }
}

/// Writes a download next to `target` and renames it into place when complete, so that an
/// interrupted download never looks like a whole file.
fn download_to(mut res: Response, target: &Path) -> Result<()> {
    let mut part = target.as_os_str().to_owned();
    part.push(".aquifer-part");
    let part = PathBuf::from(part);
    let result = (|| -> Result<()> {
        let mut f = File::create(&part).with_context(|| format!("create {}", part.display()))?;
        res.copy_to(&mut f).context("download")?;
        f.sync_all().with_context(|| format!("sync {}", part.display()))?;
        std::fs::rename(&part, target).with_context(|| format!("rename {} to {}", part.display(), target.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}

fn mode_string(kind: &str, mode: u64) -> String {
    let mut out = String::with_capacity(10);
    out.push(match kind {
        "dir" => 'd',
        "symlink" => 'l',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    out
}

fn ls_line(e: &Value) -> String {
    let kind = s(e, "kind");
    let suffix = if kind == "dir" { "/" } else { "" };
    format!(
        "{} {:>10} {} {}{suffix}",
        mode_string(kind, u(e, "mode")),
        human_bytes(u(e, "size")),
        utc_time(e.get("mtime_ns").and_then(Value::as_i64).unwrap_or(0)),
        s(e, "name")
    )
}

// ------------------------------------------------------------------ drives, pools, capacity, health

fn drives(c: &Client, cmd: DrivesCmd) -> Result<()> {
    match cmd {
        DrivesCmd::List => {
            let v = c.call(Method::GET, "/drives", None, "list drives")?;
            c.print(&v, |v| {
                println!("{:>5}  {:<10} {:<8} {:>10} {:>10}  {:>6}  PATH", "INDEX", "STATE", "POOL", "CAPACITY", "USED", "ERRORS");
                for d in items(v) {
                    println!("{}", drive_line(d));
                }
            })
        }
        DrivesCmd::Show { index } => {
            let v = c.call(Method::GET, &format!("/drives/{index}"), None, &format!("show drive {index}"))?;
            c.print(&v, print_fields)
        }
        DrivesCmd::Replace { index, path, size } => {
            let v = c.call(
                Method::POST,
                &format!("/drives/{index}/replace"),
                Some(json!({ "path": path, "size_bytes": size })),
                &format!("replace drive {index}"),
            )?;
            c.print(&v, |v| println!("rebuild started: job {}", u(v, "job_id")))
        }
        DrivesCmd::Fail { index, reason } => {
            let v = c.call(Method::POST, &format!("/drives/{index}/fail"), Some(json!({ "reason": reason })), &format!("fail drive {index}"))?;
            c.print(&v, |d| println!("{}", drive_line(d)))
        }
    }
}

fn drive_line(d: &Value) -> String {
    let errors = u(d, "read_errors") + u(d, "write_errors") + u(d, "checksum_errors");
    let state = match d.get("reason").and_then(Value::as_str) {
        Some(r) => format!("{} ({r})", s(d, "state")),
        None => s(d, "state").to_string(),
    };
    format!(
        "{:>5}  {:<10} {:<8} {:>10} {:>10}  {:>6}  {}",
        u(d, "index"),
        state,
        s(d, "pool"),
        human_bytes(u(d, "capacity_bytes")),
        human_bytes(u(d, "used_bytes")),
        errors,
        s(d, "path")
    )
}

fn print_pools(v: &Value) {
    println!("{:<12} {:>6} {:>8} {:>12} {:>12}", "POOL", "K+M", "DRIVES", "RAW", "RAW USED");
    for p in items(v) {
        println!(
            "{:<12} {:>6} {:>8} {:>12} {:>12}",
            s(p, "name"),
            format!("{}+{}", u(p, "data_shards"), u(p, "parity_shards")),
            items(&p["drives"]).len(),
            human_bytes(u(p, "raw_capacity_bytes")),
            human_bytes(u(p, "raw_used_bytes"))
        );
    }
}

fn print_capacity(v: &Value) {
    let total = u(v, "total_bytes");
    let used = u(v, "used_bytes");
    let pct = if total == 0 { 0.0 } else { used as f64 * 100.0 / total as f64 };
    println!("usable: {} of {} used ({pct:.1}%), {} free", human_bytes(used), human_bytes(total), human_bytes(u(v, "free_bytes")));
    println!("raw:    {} total, {} free", human_bytes(u(v, "raw_total_bytes")), human_bytes(u(v, "raw_free_bytes")));
    println!("files:  {}", u(v, "files"));
}

fn print_cache(v: &Value) {
    let (hits, misses) = (u(v, "hits"), u(v, "misses"));
    let pct = if hits + misses == 0 { 0.0 } else { hits as f64 * 100.0 / (hits + misses) as f64 };
    println!("data cache: {} of {} in {} shards", human_bytes(u(v, "bytes")), human_bytes(u(v, "max_bytes")), u(v, "entries"));
    println!("reads:      {hits} shards from memory, {misses} from drives ({pct:.1}% from memory)");
}

fn print_health(v: &Value) {
    println!("state: {}", s(v, "state"));
    for n in items(&v["notes"]) {
        println!("note:  {}", n.as_str().unwrap_or(""));
    }
    for d in items(&v["drives"]) {
        match d.get("reason").and_then(Value::as_str) {
            Some(r) => println!("drive {}: {} ({r})", u(d, "index"), s(d, "state")),
            None => println!("drive {}: {}", u(d, "index"), s(d, "state")),
        }
    }
}

/// One `key: value` line per field of an object.
fn print_fields(v: &Value) {
    if let Some(o) = v.as_object() {
        let width = o.keys().map(String::len).max().unwrap_or(0);
        for (k, val) in o {
            let shown = match val {
                Value::String(x) => x.clone(),
                other => other.to_string(),
            };
            println!("{k:<width$}  {shown}");
        }
    }
}

// ------------------------------------------------------------------ jobs

fn jobs(c: &Client, cmd: JobsCmd) -> Result<()> {
    match cmd {
        JobsCmd::List => {
            let v = c.call(Method::GET, "/jobs", None, "list jobs")?;
            c.print(&v, |v| {
                println!("{:>5}  {:<12} {:<10} {:>7}  {:>10}  {:>9}  {:>9}", "ID", "KIND", "STATE", "DONE", "BYTES", "BAD", "REPAIRED");
                for j in items(v) {
                    println!("{}", job_line(j));
                }
            })
        }
        JobsCmd::Show { id } => {
            let v = c.call(Method::GET, &format!("/jobs/{id}"), None, &format!("show job {id}"))?;
            c.print(&v, print_fields)
        }
        JobsCmd::Scrub { rate, wait } => start_job(c, json!({ "kind": "scrub", "bytes_per_sec_max": rate }), wait, "start scrub"),
        JobsCmd::Rebuild { drive, rate, wait } => {
            start_job(c, json!({ "kind": "rebuild", "drive": drive, "bytes_per_sec_max": rate }), wait, &format!("start rebuild of drive {drive}"))
        }
        JobsCmd::Cancel { id } => {
            let v = c.call(Method::POST, &format!("/jobs/{id}/cancel"), None, &format!("cancel job {id}"))?;
            c.print(&v, |j| println!("{}", job_line(j)))
        }
    }
}

fn job_line(j: &Value) -> String {
    let kind = match j.get("drive").and_then(Value::as_u64) {
        Some(d) => format!("{} {d}", s(j, "kind")),
        None => s(j, "kind").to_string(),
    };
    let progress = j.get("progress").and_then(Value::as_f64).unwrap_or(0.0);
    format!(
        "{:>5}  {:<12} {:<10} {:>6.1}%  {:>10}  {:>9}  {:>9}",
        u(j, "id"),
        kind,
        s(j, "state"),
        progress * 100.0,
        human_bytes(u(j, "bytes_done")),
        u(j, "shards_bad"),
        u(j, "shards_repaired")
    )
}

fn start_job(c: &Client, body: Value, wait: bool, what: &str) -> Result<()> {
    let started = c.call(Method::POST, "/jobs", Some(body), what)?;
    let id = started.get("job_id").and_then(Value::as_u64).ok_or_else(|| anyhow!("{what}: answer has no job_id"))?;
    if !wait {
        return c.print(&started, |v| println!("job {} started", u(v, "job_id")));
    }
    let bar = indicatif::ProgressBar::new(1000);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:<16} [{bar:40}] {percent:>3}% {elapsed_precise}")
            .expect("valid progress template")
            .progress_chars("=> "),
    );
    let job = loop {
        let j = c.call(Method::GET, &format!("/jobs/{id}"), None, &format!("watch job {id}"))?;
        let progress = j.get("progress").and_then(Value::as_f64).unwrap_or(0.0);
        bar.set_position((progress * 1000.0) as u64);
        bar.set_message(format!("job {id} {}", s(&j, "kind")));
        if s(&j, "state") != "running" {
            break j;
        }
        std::thread::sleep(Duration::from_millis(JOB_POLL_MS));
    };
    bar.finish();
    c.print(&job, |j| println!("{}", job_line(j)))?;
    match s(&job, "state") {
        "completed" => Ok(()),
        "failed" => bail!("job {id} failed: {}", s(&job, "error")),
        other => bail!("job {id} {other}"),
    }
}

// ------------------------------------------------------------------ users, groups, tokens

fn read_password() -> Result<String> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("read password from standard input")?;
    let password = line.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        bail!("the password on standard input is empty");
    }
    Ok(password)
}

fn users(c: &Client, cmd: UsersCmd) -> Result<()> {
    match cmd {
        UsersCmd::List => {
            let v = c.call(Method::GET, "/users", None, "list users")?;
            c.print(&v, |v| {
                println!("{:<20} {:>6} {:>6}  {:<10} {:<8} GROUPS", "NAME", "UID", "GID", "ROLE", "DISABLED");
                for x in items(v) {
                    let groups: Vec<String> = items(&x["groups"]).iter().map(|g| g.to_string()).collect();
                    let disabled = x.get("disabled").and_then(Value::as_bool).unwrap_or(false);
                    println!(
                        "{:<20} {:>6} {:>6}  {:<10} {:<8} {}",
                        s(x, "name"),
                        u(x, "uid"),
                        u(x, "gid"),
                        s(x, "role"),
                        if disabled { "yes" } else { "no" },
                        groups.join(",")
                    );
                }
            })
        }
        UsersCmd::Show { name } => {
            let v = c.call(Method::GET, &format!("/users/{}", enc(&name)), None, &format!("show user {name}"))?;
            c.print(&v, print_fields)
        }
        UsersCmd::Add { name, password_stdin, role, uid, gid, groups } => {
            if !password_stdin {
                bail!("add user {name}: give the password on standard input with --password-stdin");
            }
            let password = read_password()?;
            let body = json!({ "name": name, "password": password, "role": role, "uid": uid, "gid": gid, "groups": groups });
            let v = c.call(Method::POST, "/users", Some(body), &format!("add user {name}"))?;
            c.print(&v, |x| println!("created user {} (uid {}, gid {}, role {})", s(x, "name"), u(x, "uid"), u(x, "gid"), s(x, "role")))
        }
        UsersCmd::Passwd { name, password_stdin } => {
            if !password_stdin {
                bail!("change password of {name}: give the password on standard input with --password-stdin");
            }
            let password = read_password()?;
            let v = c.call(Method::PATCH, &format!("/users/{}", enc(&name)), Some(json!({ "password": password })), &format!("change password of {name}"))?;
            c.print(&v, |x| println!("password of {} changed", s(x, "name")))
        }
        UsersCmd::Rm { name } => {
            c.call(Method::DELETE, &format!("/users/{}", enc(&name)), None, &format!("delete user {name}"))?;
            Ok(())
        }
    }
}

fn enc(segment: &str) -> String {
    utf8_percent_encode(segment, COMPONENT).to_string()
}

fn groups(c: &Client, cmd: GroupsCmd) -> Result<()> {
    match cmd {
        GroupsCmd::List => {
            let v = c.call(Method::GET, "/groups", None, "list groups")?;
            c.print(&v, |v| {
                println!("{:<20} {:>6}", "NAME", "GID");
                for g in items(v) {
                    println!("{:<20} {:>6}", s(g, "name"), u(g, "gid"));
                }
            })
        }
        GroupsCmd::Add { name, gid } => {
            let v = c.call(Method::POST, "/groups", Some(json!({ "name": name, "gid": gid })), &format!("add group {name}"))?;
            c.print(&v, |g| println!("created group {} (gid {})", s(g, "name"), u(g, "gid")))
        }
        GroupsCmd::Rm { name } => {
            c.call(Method::DELETE, &format!("/groups/{}", enc(&name)), None, &format!("delete group {name}"))?;
            Ok(())
        }
    }
}

fn tokens(c: &Client, cmd: TokensCmd) -> Result<()> {
    match cmd {
        TokensCmd::Create { for_user, role, ttl, label } => {
            let body = json!({ "user": for_user, "role": role, "ttl_secs": ttl, "label": label });
            let v = c.call(Method::POST, "/auth/tokens", Some(body), "create token")?;
            c.print(&v, |v| {
                println!("{}", s(v, "token"));
                eprintln!("token {} for {} ({}); the secret above is shown only once", s(&v["info"], "id"), s(&v["info"], "user"), s(&v["info"], "role"));
            })
        }
        TokensCmd::List => {
            let v = c.call(Method::GET, "/auth/tokens", None, "list tokens")?;
            c.print(&v, |v| {
                println!("{:<18} {:<16} {:<10} {:<17} {:<17} LABEL", "ID", "USER", "ROLE", "CREATED", "EXPIRES");
                for t in items(v) {
                    let expires = t.get("expires_ns").and_then(Value::as_i64).map(utc_time).unwrap_or_else(|| "never".into());
                    println!(
                        "{:<18} {:<16} {:<10} {:<17} {:<17} {}",
                        s(t, "id"),
                        s(t, "user"),
                        s(t, "role"),
                        utc_time(t.get("created_ns").and_then(Value::as_i64).unwrap_or(0)),
                        expires,
                        s(t, "label")
                    );
                }
            })
        }
        TokensCmd::Revoke { id } => {
            c.call(Method::DELETE, &format!("/auth/tokens/{}", enc(&id)), None, &format!("revoke token {id}"))?;
            Ok(())
        }
    }
}

// ------------------------------------------------------------------ formatting

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `YYYY-MM-DD HH:MM` in UTC (civil-from-days, proleptic Gregorian calendar).
fn utc_time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = storage_engine::civil_from_days(secs.div_euclid(86_400));
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}", rem / 3600, rem % 3600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_paths_are_encoded_per_component() {
        assert_eq!(encode_remote("/"), "");
        assert_eq!(encode_remote(""), "");
        assert_eq!(encode_remote("/data/a b/c%d"), "/data/a%20b/c%25d");
        assert_eq!(encode_remote("data/été/"), "/data/%C3%A9t%C3%A9");
        assert_eq!(basename("/a/b/c.bin"), "c.bin");
        assert_eq!(basename("/a/b/"), "b");
    }

    #[test]
    fn formats() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(utc_time(0), "1970-01-01 00:00");
        assert_eq!(utc_time(1_709_210_096 * 1_000_000_000), "2024-02-29 12:34");
        assert_eq!(mode_string("dir", 0o755), "drwxr-xr-x");
        assert_eq!(mode_string("file", 0o640), "-rw-r-----");
    }
}

fn print_portal(p: &Value) {
    println!(
        "{:<18} {:<6} {:<9} {:<3} {} -> {}{}",
        s(p, "id"),
        s(p, "side"),
        s(p, "state"),
        s(p, "mode"),
        if s(p, "side") == "spoke" { format!("{}:{}", s(p, "hub_addr"), s(p, "hub_path")) } else { s(p, "hub_path").to_string() },
        s(p, "spoke_path"),
        if s(p, "reason").is_empty() { String::new() } else { format!("  ({})", s(p, "reason")) }
    );
}

fn portal(c: &Client, cmd: PortalCmd) -> Result<()> {
    match cmd {
        PortalCmd::List => {
            let v = c.call(Method::GET, "/portals", None, "list portals")?;
            c.print(&v, |v| {
                println!("{:<18} {:<6} {:<9} {:<3} HUB -> SPOKE", "ID", "SIDE", "STATE", "MODE");
                for p in items(v) {
                    print_portal(p);
                }
            })
        }
        PortalCmd::Show { id } => {
            let v = c.call(Method::GET, &format!("/portals/{}", enc(&id)), None, &format!("show portal {id}"))?;
            c.print(&v, |v| println!("{}", serde_json::to_string_pretty(v).unwrap_or_default()))
        }
        PortalCmd::Create { hub, hub_path, spoke_path, mode, hub_fingerprint, serve_stale } => {
            let body = json!({ "hub": hub, "hub_path": hub_path, "spoke_path": spoke_path, "mode": mode, "hub_fingerprint": hub_fingerprint, "serve_stale": serve_stale });
            let v = c.call(Method::POST, "/portals", Some(body), "create portal")?;
            c.print(&v, |v| {
                print_portal(v);
                eprintln!("portal {} is pending: authorize it on the hub with `aquifer portal authorize {}`", s(v, "id"), s(v, "id"));
            })
        }
        PortalCmd::Authorize { id } => {
            let v = c.call(Method::POST, &format!("/portals/{}/authorize", enc(&id)), None, &format!("authorize portal {id}"))?;
            c.print(&v, print_portal)
        }
        PortalCmd::Delete { id } => {
            c.call(Method::DELETE, &format!("/portals/{}", enc(&id)), None, &format!("delete portal {id}"))?;
            Ok(())
        }
        PortalCmd::ServeStale { id, on } => {
            let on = match on.as_str() {
                "on" | "true" | "yes" => true,
                "off" | "false" | "no" => false,
                _ => bail!("serve-stale takes on or off"),
            };
            let v = c.call(Method::PATCH, &format!("/portals/{}", enc(&id)), Some(json!({ "serve_stale": on })), &format!("change portal {id}"))?;
            c.print(&v, print_portal)
        }
        PortalCmd::Identity => {
            let v = c.call(Method::GET, "/fabric", None, "get the fabric identity")?;
            c.print(&v, |v| println!("fingerprint {}\nregion      {}\nlisten      {}", s(v, "fingerprint"), s(v, "region"), s(v, "listen")))
        }
    }
}

fn residency_path(path: &str) -> String {
    path.split('/').filter(|p| !p.is_empty()).map(enc).collect::<Vec<_>>().join("/")
}

fn residency(c: &Client, cmd: ResidencyCmd) -> Result<()> {
    match cmd {
        ResidencyCmd::Set { path, label } => {
            let v = c.call(Method::PUT, &format!("/residency/{}", residency_path(&path)), Some(json!({ "label": label })), &format!("label {path}"))?;
            c.print(&v, |v| println!("{} residency={}", s(v, "path"), s(v, "label")))
        }
        ResidencyCmd::Get { path } => {
            let v = c.call(Method::GET, &format!("/residency/{}", residency_path(&path)), None, &format!("get label of {path}"))?;
            c.print(&v, |v| println!("{} residency={}", s(v, "path"), if v["label"].is_null() { "(none)".to_string() } else { s(v, "label").to_string() }))
        }
        ResidencyCmd::Rm { path } => {
            c.call(Method::DELETE, &format!("/residency/{}", residency_path(&path)), None, &format!("remove label of {path}"))?;
            Ok(())
        }
    }
}

// ------------------------------------------------------------------ SMB shares

fn print_share(e: &Value) {
    let flags: Vec<&str> = [("read_only", "ro"), ("guest", "guest"), ("encrypt", "encrypt"), ("leases", "leases")]
        .into_iter()
        .filter(|(k, _)| e.get(*k).and_then(Value::as_bool).unwrap_or(false))
        .map(|(_, f)| f)
        .collect();
    let flags = if flags.is_empty() { "-".to_string() } else { flags.join(",") };
    println!("{:<20} {:<6} {:<24} {}", s(e, "name"), s(e, "source"), flags, s(e, "path"));
}

fn shares(c: &Client, cmd: SharesCmd) -> Result<()> {
    match cmd {
        SharesCmd::List => {
            let v = c.call(Method::GET, "/shares", None, "list shares")?;
            c.print(&v, |v| {
                println!("{:<20} {:<6} {:<24} PATH", "NAME", "SOURCE", "FLAGS");
                for e in items(v) {
                    print_share(e);
                }
            })
        }
        SharesCmd::Add { name, path, read_only, guest, encrypt, leases } => {
            let body = json!({ "name": name, "path": path, "read_only": read_only, "guest": guest, "encrypt": encrypt, "leases": leases });
            let v = c.call(Method::POST, "/shares", Some(body), &format!("share {path} as {name}"))?;
            c.print(&v, print_share)
        }
        SharesCmd::Set { name, path, read_only, guest, encrypt, leases } => {
            let mut body = serde_json::Map::new();
            if let Some(p) = path {
                body.insert("path".into(), json!(p));
            }
            for (key, flag, v) in [("read_only", "--read-only", read_only), ("guest", "--guest", guest), ("encrypt", "--encrypt", encrypt), ("leases", "--leases", leases)] {
                if let Some(b) = on_off(flag, v)? {
                    body.insert(key.into(), json!(b));
                }
            }
            if body.is_empty() {
                bail!("nothing to change: give --path, --read-only, --guest, --encrypt or --leases");
            }
            let v = c.call(Method::PATCH, &format!("/shares/{}", enc(&name)), Some(Value::Object(body)), &format!("change share {name}"))?;
            c.print(&v, print_share)
        }
        SharesCmd::Rm { name } => {
            c.call(Method::DELETE, &format!("/shares/{}", enc(&name)), None, &format!("remove share {name}"))?;
            Ok(())
        }
    }
}

// ------------------------------------------------------------------ SFTP chroots

fn print_chroot(e: &Value) {
    println!("{:<20} {}", s(e, "user"), s(e, "path"));
}

fn chroots(c: &Client, cmd: ChrootCmd) -> Result<()> {
    match cmd {
        ChrootCmd::List => {
            let v = c.call(Method::GET, "/sftp/chroots", None, "list SFTP chroots")?;
            c.print(&v, |v| {
                println!("{:<20} PATH", "USER");
                for e in items(v) {
                    print_chroot(e);
                }
            })
        }
        ChrootCmd::Set { name, path } => {
            let v = c.call(Method::PUT, &format!("/sftp/chroots/{}", enc(&name)), Some(json!({ "path": path })), &format!("set the SFTP chroot of {name} to {path}"))?;
            c.print(&v, print_chroot)
        }
        ChrootCmd::Rm { name } => {
            c.call(Method::DELETE, &format!("/sftp/chroots/{}", enc(&name)), None, &format!("remove the SFTP chroot of {name}"))?;
            Ok(())
        }
    }
}

// ------------------------------------------------------------------ NFS exports

fn print_export(e: &Value) {
    let flag = |k: &str, on: &str, off: &str| if e.get(k).and_then(Value::as_bool).unwrap_or(false) { on.to_string() } else { off.to_string() };
    let clients: Vec<&str> = items(&e["clients"]).iter().filter_map(Value::as_str).collect();
    println!(
        "{:<8} {:<6} {:<2} {:<9} {} {}",
        s(e, "id"),
        s(e, "source"),
        flag("read_only", "ro", "rw"),
        flag("root_squash", "squash", "no_squash"),
        s(e, "path"),
        clients.join(",")
    );
}

fn on_off(what: &str, v: Option<String>) -> Result<Option<bool>> {
    v.map(|v| match v.as_str() {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => bail!("{what} takes on or off"),
    })
    .transpose()
}

fn exports(c: &Client, cmd: ExportsCmd) -> Result<()> {
    match cmd {
        ExportsCmd::List => {
            let v = c.call(Method::GET, "/exports", None, "list exports")?;
            c.print(&v, |v| {
                println!("{:<8} {:<6} {:<2} {:<9} PATH CLIENTS", "ID", "SOURCE", "RW", "SQUASH");
                for e in items(v) {
                    print_export(e);
                }
            })
        }
        ExportsCmd::Add { path, clients, read_only, no_root_squash } => {
            let body = json!({ "path": path, "clients": clients, "read_only": read_only, "root_squash": !no_root_squash });
            let v = c.call(Method::POST, "/exports", Some(body), &format!("export {path}"))?;
            c.print(&v, print_export)
        }
        ExportsCmd::Set { export, clients, read_only, root_squash } => {
            let mut body = serde_json::Map::new();
            if let Some(cl) = clients {
                body.insert("clients".into(), json!(cl));
            }
            if let Some(b) = on_off("--read-only", read_only)? {
                body.insert("read_only".into(), json!(b));
            }
            if let Some(b) = on_off("--root-squash", root_squash)? {
                body.insert("root_squash".into(), json!(b));
            }
            if body.is_empty() {
                bail!("nothing to change: give --clients, --read-only or --root-squash");
            }
            let v = c.call(Method::PATCH, &format!("/exports/{}", enc(&export)), Some(Value::Object(body)), &format!("change export {export}"))?;
            c.print(&v, print_export)
        }
        ExportsCmd::Rm { export } => {
            c.call(Method::DELETE, &format!("/exports/{}", enc(&export)), None, &format!("remove export {export}"))?;
            Ok(())
        }
    }
}
