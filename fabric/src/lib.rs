//! Portals: a hub directory extended to a spoke cluster across a WAN (DESIGN.md §5).
//!
//! Every daemon runs a [`Fabric`]: it listens for other clusters on `--fabric ADDR` (mutual
//! TLS with pinned certificates, [`tls`]), keeps the portal records (engine settings,
//! namespace `portal`), serves the portals it is the hub of ([`hub`]) and runs the ones it is
//! the spoke of ([`spoke`]): one long-lived multiplexed connection per portal ([`conn`],
//! frames in [`proto`]), lease renewal, reconnection, and the engine's mirror-inode hooks.

pub mod chunks;
pub mod conn;
pub mod hub;
pub mod proto;
pub mod spoke;
pub mod tls;
pub mod wan;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use storage_engine::{Caller, Engine, Error, FileKind, Ino, Mutation, Need, RemoteSource, RemoteStub, Role, Verdict};
use tokio::net::{TcpListener, TcpStream};

use crate::conn::{Conn, Handler};
use crate::hub::{HubPortal, HubService, ManifestCache};
use crate::proto::*;
use crate::spoke::{Link, SpokePortal, SpokeSettings};
use crate::tls::Identity;

/// Settings namespace of portal records.
pub const PORTAL_SETTINGS: &str = "portal";
/// How long a lease the hub grants, by default.
pub const LEASE_MS_DEFAULT: u64 = 10_000;
/// How long a spoke waits for one answer before it counts the link as down.
pub const CALL_TIMEOUT_MS: u64 = 30_000;
/// Longest wait between reconnection attempts.
const RECONNECT_BACKOFF_MAX_MS: u64 = 2_000;
/// Connections a hub serves at once, by default (`FabricConfig::connections_max`); more wait
/// in the listen backlog.
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;
/// Connections at once from certificates that no portal on this hub names (clusters about to
/// propose one, or strangers: they may only propose). More are closed after the handshake.
pub const STRANGER_CONNECTIONS_MAX: usize = 64;
/// Refusals of other clusters' requests logged one by one a minute (`Fabric::audit_refusal`).
pub const REFUSALS_LOGGED_PER_MINUTE: u32 = 60;
/// Proposals pending on a hub from one cluster certificate, and from all: any client
/// certificate may propose, and each proposal is a record the hub's admin sees.
pub const PENDING_PER_CERTIFICATE_MAX: usize = 16;
pub const PENDING_MAX: usize = 1024;
/// Longest hub or spoke path in a proposal, and longest cluster name or region.
const PROPOSAL_PATH_BYTES_MAX: usize = 4096;
const PROPOSAL_NAME_BYTES_MAX: usize = 255;
/// A hub closes a connection whose peer sent nothing for this many leases. Spokes renew
/// every third of a lease, so only a peer that is gone (a half-open connection after a cut)
/// or that holds a connection without using it reaches it.
pub const IDLE_LEASES: u64 = 3;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    Hub,
    Spoke,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PortalState {
    Pending,
    Active,
    Degraded,
    Deleting,
}

/// A portal as each side records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PortalRecord {
    pub id: String,
    pub side: Side,
    pub state: PortalState,
    pub mode: String,
    /// Spoke side: where the hub's fabric listener is.
    #[serde(default)]
    pub hub_addr: String,
    pub hub_path: String,
    pub spoke_path: String,
    /// The other cluster's certificate fingerprint (SHA-256).
    pub peer_fingerprint: String,
    #[serde(default)]
    pub peer_region: String,
    #[serde(default)]
    pub peer_name: String,
    #[serde(default)]
    pub serve_stale: bool,
    #[serde(default)]
    pub lease_ms: u64,
    pub created_ns: i64,
    /// Why the portal is degraded, when it is.
    #[serde(default)]
    pub reason: String,
    /// Spoke side: the local directory the portal shows.
    #[serde(default)]
    pub local_root: u64,
}

/// Everything a daemon's fabric needs.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    pub listen: Option<SocketAddr>,
    /// The listener was asked for explicitly: failing to bind it is an error. Otherwise (the
    /// embedded default address) the daemon runs without one, as a spoke only, and says so.
    pub listen_required: bool,
    /// This cluster's region (residency labels are matched against it).
    pub region: String,
    /// A name for this cluster, shown to peers.
    pub name: String,
    /// Where the cluster certificate and key live.
    pub identity_dir: PathBuf,
    pub lease_ms: u64,
    /// Spoke cache: evict least recently used files above this many bytes.
    pub cache_bytes_max: u64,
    /// Spoke cache: evict while less than this share of capacity is free.
    pub free_percent_min: u8,
    /// Hub: connections served at once (default [`CONNECTIONS_MAX_DEFAULT`]).
    pub connections_max: usize,
}

/// A request to create a portal on the spoke.
#[derive(Debug, Clone, Deserialize)]
pub struct CreatePortal {
    pub hub: String,
    pub hub_path: String,
    pub spoke_path: String,
    #[serde(default = "ro")]
    pub mode: String,
    #[serde(default)]
    pub serve_stale: bool,
    /// Expected hub certificate fingerprint; without it the first one seen is pinned.
    #[serde(default)]
    pub hub_fingerprint: Option<String>,
}

fn ro() -> String {
    "ro".into()
}

/// An error for the API: HTTP-like status and a message.
#[derive(Debug, Clone)]
pub struct ApiFailure {
    pub status: u16,
    pub message: String,
}

impl ApiFailure {
    fn new(status: u16, message: impl Into<String>) -> ApiFailure {
        ApiFailure { status, message: message.into() }
    }
}

/// The spoke's real link: a TLS connection, replaced on reconnect.
struct TlsLink {
    conn: RwLock<Option<Conn>>,
    epoch: AtomicU64,
    rt: tokio::runtime::Handle,
    /// Requests in flight to the hub at once: one less than the hub takes on a connection
    /// ([`conn::REQUESTS_IN_FLIGHT_MAX`]; it refuses the rest), the one left for lease
    /// renewals, which never wait for a place. Reads, prefetches and listings past it wait
    /// for an answer to another.
    slots: Arc<tokio::sync::Semaphore>,
}

impl TlsLink {
    fn new(rt: tokio::runtime::Handle) -> TlsLink {
        TlsLink { conn: RwLock::new(None), epoch: AtomicU64::new(0), rt, slots: Arc::new(tokio::sync::Semaphore::new(conn::REQUESTS_IN_FLIGHT_MAX - 1)) }
    }
}

impl Link for TlsLink {
    fn call(&self, req: Request) -> Result<Response, String> {
        let conn = self.conn.read().clone().ok_or("not connected")?;
        let slots = (!matches!(req, Request::Renew)).then(|| self.slots.clone());
        // Engine hooks run on blocking threads; waiting on a channel (not `block_on`) also
        // keeps a caller that is, wrongly, on a runtime thread from panicking.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt.spawn(async move {
            let _slot = match slots {
                Some(s) => Some(s.acquire_owned().await.expect("the semaphore is never closed")),
                None => None,
            };
            let _ = tx.send(conn.call(req, Duration::from_millis(CALL_TIMEOUT_MS)).await);
        });
        rx.recv().map_err(|_| "the fabric runtime stopped".to_string())?
    }
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }
}

struct SpokeRun {
    portal: Arc<SpokePortal>,
    link: Arc<TlsLink>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// The fabric of one daemon.
pub struct Fabric {
    engine: Arc<Engine>,
    cfg: FabricConfig,
    identity: Identity,
    rt: tokio::runtime::Handle,
    local_addr: Mutex<Option<SocketAddr>>,
    spokes: RwLock<HashMap<String, Arc<SpokeRun>>>,
    hub_conns: Mutex<HashMap<String, Vec<Conn>>>,
    manifests: Arc<Mutex<ManifestCache>>,
    records_lock: Mutex<()>,
    stop: tokio::sync::watch::Sender<bool>,
    /// Refusals logged: (the minute, how many in it, how many not logged since the last).
    refusals: Mutex<(i64, u32, u64)>,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn err_response(code: ErrorCode, m: impl Into<String>) -> Response {
    Response::Error { code, message: m.into() }
}

impl Fabric {
    /// Starts the fabric: loads the identity, listens (if configured), resumes spoke portals,
    /// and installs the mirror hooks in the engine.
    pub async fn start(engine: Arc<Engine>, cfg: FabricConfig) -> anyhow::Result<Arc<Fabric>> {
        let identity = Identity::load_or_create(&cfg.identity_dir, &cfg.name)?;
        let fabric = Arc::new(Fabric {
            engine: engine.clone(),
            cfg: cfg.clone(),
            identity,
            rt: tokio::runtime::Handle::current(),
            local_addr: Mutex::new(None),
            spokes: RwLock::new(HashMap::new()),
            hub_conns: Mutex::new(HashMap::new()),
            manifests: Arc::new(Mutex::new(ManifestCache::default())),
            records_lock: Mutex::new(()),
            stop: tokio::sync::watch::channel(false).0,
            refusals: Mutex::new((0, 0, 0)),
        });
        engine.set_remote_source(Arc::new(FabricSource(Arc::downgrade(&fabric))));
        let listener = match cfg.listen {
            Some(addr) => match TcpListener::bind(addr).await {
                Ok(l) => Some(l),
                Err(e) if !cfg.listen_required => {
                    tracing::warn!("no fabric listener on {addr} ({e}): this cluster can be a portal spoke but not a hub; give --fabric ADDR");
                    None
                }
                Err(e) => return Err(e).with_context(|| format!("binding the fabric listener to {addr}")),
            },
            None => None,
        };
        if let Some(l) = listener {
            *fabric.local_addr.lock() = Some(l.local_addr()?);
            let acceptor = Arc::new(fabric.identity.acceptor()?);
            let f = fabric.clone();
            let mut stop = fabric.stop.subscribe();
            let all = Arc::new(tokio::sync::Semaphore::new(cfg.connections_max.max(1)));
            let strangers = Arc::new(tokio::sync::Semaphore::new(STRANGER_CONNECTIONS_MAX));
            tokio::spawn(async move {
                loop {
                    // A connection is accepted only with a place free; the others wait in the
                    // listen backlog.
                    let permit = tokio::select! {
                        p = all.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                        _ = stop.changed() => return,
                    };
                    let accepted = tokio::select! {
                        a = l.accept() => a,
                        _ = stop.changed() => return,
                    };
                    let (sock, peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of descriptors, say: waiting lets connections close.
                            tracing::warn!(error = %e, "fabric listener: accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let f = f.clone();
                    let acceptor = acceptor.clone();
                    let strangers = strangers.clone();
                    tokio::spawn(async move {
                        if let Err(e) = f.serve_peer(sock, &acceptor, permit, &strangers).await {
                            tracing::info!(%peer, error = %e, "fabric peer refused");
                        }
                    });
                }
            });
        }
        for r in fabric.records()? {
            if r.side == Side::Spoke && r.state != PortalState::Deleting {
                fabric.run_spoke(&r);
            } else if r.side == Side::Spoke {
                let f = fabric.clone();
                let id = r.id.clone();
                tokio::task::spawn_blocking(move || f.finish_spoke_delete(&id));
            }
        }
        Ok(fabric)
    }

    /// Stops listening, closes every portal connection and stops the spoke supervisors.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
        for (_, run) in self.spokes.write().drain() {
            let _ = run.stop.send(true);
            if let Some(c) = run.link.conn.write().take() {
                c.close();
            }
            run.portal.close();
        }
        for (_, conns) in self.hub_conns.lock().drain() {
            for c in conns {
                c.close();
            }
        }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        *self.local_addr.lock()
    }

    pub fn fingerprint(&self) -> &str {
        &self.identity.fingerprint
    }

    pub fn region(&self) -> &str {
        &self.cfg.region
    }

    // ------------------------------------------------------------ records

    pub fn records(&self) -> anyhow::Result<Vec<PortalRecord>> {
        let mut out = Vec::new();
        for (_, v) in self.engine.settings_list(PORTAL_SETTINGS)? {
            out.push(serde_json::from_slice(&v).context("a portal record")?);
        }
        Ok(out)
    }

    pub fn record(&self, id: &str) -> Option<PortalRecord> {
        if !valid_id(id) {
            return None;
        }
        self.engine.setting_get(PORTAL_SETTINGS, id).ok().flatten().and_then(|v| serde_json::from_slice(&v).ok())
    }

    fn save(&self, r: &PortalRecord) -> Result<(), Error> {
        self.engine.setting_put(&Caller::system(), PORTAL_SETTINGS, &r.id, &serde_json::to_vec(r).expect("json"))
    }

    fn update(&self, id: &str, f: impl FnOnce(&mut PortalRecord)) -> Option<PortalRecord> {
        let _g = self.records_lock.lock();
        let mut r = self.record(id)?;
        f(&mut r);
        self.save(&r).ok()?;
        Some(r)
    }

    fn audit(&self, user: &str, action: &str, target: &str, outcome: &str) {
        if let Err(e) = self.engine.audit(user, "fabric", action, target, outcome) {
            tracing::warn!(error = %e, "audit log write failed");
        }
    }

    /// Logs a request from another cluster that the hub refused. Any client certificate can
    /// send them, as fast as it likes: at most [`REFUSALS_LOGGED_PER_MINUTE`] a minute are
    /// logged one by one, and the next one logged says how many were not.
    fn audit_refusal(&self, target: &str, why: &str) {
        let now_min = now_ns() / 60_000_000_000;
        let unlogged = {
            let mut r = self.refusals.lock();
            if r.0 != now_min {
                r.0 = now_min;
                r.1 = 0;
            }
            if r.1 >= REFUSALS_LOGGED_PER_MINUTE {
                r.2 += 1;
                return;
            }
            r.1 += 1;
            std::mem::take(&mut r.2)
        };
        if unlogged > 0 {
            self.audit("fabric", "portal.refused", "(several)", &format!("{unlogged} more refusals in the minutes before, not logged one by one"));
        }
        self.audit("fabric", "portal.refused", target, why);
    }

    /// A portal record with live figures, for the API.
    pub fn describe(&self, r: &PortalRecord) -> serde_json::Value {
        let mut v = serde_json::to_value(r).expect("json");
        if let Some(run) = self.spokes.read().get(&r.id) {
            v["lease_remaining_ms"] = run.portal.lease_remaining_ms().into();
            v["connected"] = run.link.conn.read().as_ref().is_some_and(|c| !c.is_closed()).into();
            // Connections made to the hub since the daemon started: more than one means the
            // link was lost and made again.
            v["connects"] = run.link.epoch.load(Ordering::Relaxed).into();
            v["cached_bytes"] = run.portal.cached_bytes().into();
            v["stats"] = run.portal.stats.to_json();
        }
        if r.side == Side::Hub {
            v["connections"] = self.hub_conns.lock().get(&r.id).map(|c| c.iter().filter(|c| !c.is_closed()).count()).unwrap_or(0).into();
        }
        v
    }

    pub fn spoke_stats(&self, id: &str) -> Option<serde_json::Value> {
        self.spokes.read().get(id).map(|r| {
            let mut v = r.portal.stats.to_json();
            v["files_busy"] = serde_json::json!(r.portal.files_busy());
            v
        })
    }

    // ------------------------------------------------------------ hub side

    /// Serves one accepted connection, which holds `permit` (one of the hub's places) for as
    /// long as it is open; a certificate that no portal on this hub names also takes one of
    /// `strangers`, or is refused when none is free.
    async fn serve_peer(
        self: Arc<Self>,
        sock: TcpStream,
        acceptor: &openssl::ssl::SslAcceptor,
        permit: tokio::sync::OwnedSemaphorePermit,
        strangers: &Arc<tokio::sync::Semaphore>,
    ) -> anyhow::Result<()> {
        sock.set_nodelay(true)?;
        let ssl = openssl::ssl::Ssl::new(acceptor.context())?;
        let mut stream = tokio_openssl::SslStream::new(ssl, sock)?;
        tokio::time::timeout(Duration::from_secs(10), std::pin::Pin::new(&mut stream).accept())
            .await
            .map_err(|_| anyhow!("TLS handshake timed out"))?
            .map_err(|e| anyhow!("TLS handshake failed: {e}"))?;
        let fp = stream.ssl().peer_certificate().map(|c| tls::fingerprint(&c)).ok_or_else(|| anyhow!("no client certificate"))?;
        let mut hold = vec![permit];
        let me = self.clone();
        let fp2 = fp.clone();
        let known = tokio::task::spawn_blocking(move || me.records().is_ok_and(|rs| rs.iter().any(|r| r.side == Side::Hub && r.peer_fingerprint == fp2))).await?;
        if !known {
            let Ok(p) = strangers.clone().try_acquire_owned() else {
                bail!("{STRANGER_CONNECTIONS_MAX} connections from certificates that no portal names are open already");
            };
            hold.push(p);
        }
        let served: Arc<Mutex<Option<Arc<HubService>>>> = Arc::new(Mutex::new(None));
        let me = self.clone();
        let fp2 = fp.clone();
        let served2 = served.clone();
        let conn_slot: Arc<Mutex<Option<Conn>>> = Arc::new(Mutex::new(None));
        let conn_slot2 = conn_slot.clone();
        let handler: Handler = Arc::new(move |req: Request| {
            let me = me.clone();
            let fp = fp2.clone();
            let served = served2.clone();
            let conn_slot = conn_slot2.clone();
            Box::pin(async move { me.hub_request(&fp, &served, &conn_slot, req).await })
        });
        let idle = Some(Duration::from_millis(self.cfg.lease_ms.saturating_mul(IDLE_LEASES).max(1_000)));
        let conn = Conn::spawn(stream, Some(handler), None, Some(fp), conn::Limits { idle, hold });
        *conn_slot.lock() = Some(conn);
        Ok(())
    }

    async fn hub_request(self: &Arc<Self>, fp: &str, served: &Mutex<Option<Arc<HubService>>>, conn_slot: &Mutex<Option<Conn>>, req: Request) -> Response {
        match req {
            Request::Propose { portal, hub_path, spoke_path, mode, spoke_region, spoke_name } => {
                let me = self.clone();
                let fp = fp.to_string();
                tokio::task::spawn_blocking(move || me.propose(&fp, portal, hub_path, spoke_path, mode, spoke_region, spoke_name))
                    .await
                    .unwrap_or_else(|e| err_response(ErrorCode::Internal, e.to_string()))
            }
            Request::Status { portal } => match self.record(&portal) {
                Some(r) if r.side == Side::Hub && r.peer_fingerprint == fp => {
                    Response::Status { state: serde_json::to_value(r.state).unwrap().as_str().unwrap_or("").into(), reason: r.reason }
                }
                _ => err_response(ErrorCode::NotAuthorized, format!("no portal {portal} for this cluster's certificate")),
            },
            Request::Withdraw { portal } => match self.record(&portal) {
                Some(r) if r.side == Side::Hub && r.peer_fingerprint == fp => {
                    let _ = self.engine.setting_delete(&Caller::system(), PORTAL_SETTINGS, &portal);
                    self.audit("fabric", "portal.withdraw", &portal, "ok");
                    Response::Ok
                }
                _ => err_response(ErrorCode::NotAuthorized, "no such portal for this certificate"),
            },
            Request::Hello { version, portal } => {
                if version != PROTOCOL_VERSION {
                    return err_response(ErrorCode::BadRequest, format!("protocol version {version}; this hub speaks {PROTOCOL_VERSION}"));
                }
                let r = match self.record(&portal) {
                    Some(r) if r.side == Side::Hub && r.peer_fingerprint == fp && r.state == PortalState::Active => r,
                    Some(r) if r.side == Side::Hub && r.peer_fingerprint != fp => {
                        self.audit_refusal(&portal, "connection with a certificate other than the authorized one");
                        return err_response(ErrorCode::NotAuthorized, "this certificate is not the one authorized for the portal");
                    }
                    Some(r) if r.side == Side::Hub => {
                        return err_response(ErrorCode::NotAuthorized, format!("portal {portal} is {:?} on the hub", r.state).to_lowercase());
                    }
                    _ => {
                        self.audit_refusal(&portal, "hello for an unknown portal");
                        return err_response(ErrorCode::NotAuthorized, format!("no portal {portal} on this hub"));
                    }
                };
                let root = match self.engine.resolve(&Caller::system(), &r.hub_path) {
                    Ok(a) if a.kind == FileKind::Dir => a.ino,
                    _ => return err_response(ErrorCode::NotFound, format!("hub path {} is gone", r.hub_path)),
                };
                let svc = Arc::new(HubService::new(
                    self.engine.clone(),
                    HubPortal { id: r.id.clone(), root, mode: PortalMode::parse(&r.mode).unwrap_or(PortalMode::ReadOnly), spoke_region: r.peer_region.clone() },
                    self.manifests.clone(),
                ));
                *served.lock() = Some(svc.clone());
                if let Some(conn) = conn_slot.lock().clone() {
                    let mut conns = self.hub_conns.lock();
                    let live = conns.entry(r.id.clone()).or_default();
                    live.retain(|c| !c.is_closed());
                    live.push(conn.clone());
                    drop(conns);
                    self.spawn_invalidations(svc, conn);
                }
                Response::Welcome { hub_region: self.cfg.region.clone(), lease_ms: self.cfg.lease_ms }
            }
            other => {
                let Some(svc) = served.lock().clone() else {
                    return err_response(ErrorCode::NotAuthorized, "say Hello for an authorized portal first");
                };
                match self.record(&svc.portal.id) {
                    Some(r) if r.state == PortalState::Active && r.peer_fingerprint == fp => {}
                    _ => return err_response(ErrorCode::NotAuthorized, "the portal is no longer authorized"),
                }
                if matches!(other, Request::Renew) {
                    return Response::Lease { lease_ms: self.cfg.lease_ms };
                }
                tokio::task::spawn_blocking(move || svc.handle(other))
                    .await
                    .unwrap_or_else(|e| err_response(ErrorCode::Internal, e.to_string()))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn propose(&self, fp: &str, id: String, hub_path: String, spoke_path: String, mode: PortalMode, spoke_region: String, spoke_name: String) -> Response {
        if !valid_id(&id) {
            return err_response(ErrorCode::BadRequest, "portal ids are 1-64 letters, digits and '-'");
        }
        if hub_path.len() > PROPOSAL_PATH_BYTES_MAX || spoke_path.len() > PROPOSAL_PATH_BYTES_MAX {
            return err_response(ErrorCode::BadRequest, format!("portal paths are at most {PROPOSAL_PATH_BYTES_MAX} bytes"));
        }
        if spoke_name.len() > PROPOSAL_NAME_BYTES_MAX || spoke_region.len() > PROPOSAL_NAME_BYTES_MAX {
            return err_response(ErrorCode::BadRequest, format!("cluster names and regions are at most {PROPOSAL_NAME_BYTES_MAX} bytes"));
        }
        // Counted and stored under the records' lock, so that proposals sent at once do not
        // pass the limits together.
        let _g = self.records_lock.lock();
        if let Some(r) = self.record(&id) {
            return if r.peer_fingerprint == fp && r.side == Side::Hub {
                Response::Proposed { state: format!("{:?}", r.state).to_lowercase() }
            } else {
                err_response(ErrorCode::BadRequest, format!("portal id {id} is taken"))
            };
        }
        let pending: Vec<PortalRecord> = match self.records() {
            Ok(rs) => rs.into_iter().filter(|r| r.side == Side::Hub && r.state == PortalState::Pending).collect(),
            Err(e) => return err_response(ErrorCode::Internal, e.to_string()),
        };
        if pending.iter().filter(|r| r.peer_fingerprint == fp).count() >= PENDING_PER_CERTIFICATE_MAX {
            return err_response(
                ErrorCode::BadRequest,
                format!("this cluster has {PENDING_PER_CERTIFICATE_MAX} proposals pending on the hub already; its admin authorizes or deletes them first"),
            );
        }
        if pending.len() >= PENDING_MAX {
            return err_response(ErrorCode::BadRequest, format!("the hub has {PENDING_MAX} proposals pending already"));
        }
        let target = format!("{hub_path} for {spoke_name} ({spoke_region})");
        if let Err(m) = hub::check_residency_path(&self.engine, &hub_path, &spoke_region) {
            let code = if m.contains("labelled") { ErrorCode::Residency } else { ErrorCode::NotFound };
            self.audit_refusal(&target, &m);
            return err_response(code, m);
        }
        let r = PortalRecord {
            id: id.clone(),
            side: Side::Hub,
            state: PortalState::Pending,
            mode: mode.as_str().into(),
            hub_addr: String::new(),
            hub_path,
            spoke_path,
            peer_fingerprint: fp.into(),
            peer_region: spoke_region,
            peer_name: spoke_name,
            serve_stale: false,
            lease_ms: self.cfg.lease_ms,
            created_ns: now_ns(),
            reason: String::new(),
            local_root: 0,
        };
        if let Err(e) = self.save(&r) {
            return err_response(ErrorCode::Internal, e.to_string());
        }
        self.audit("fabric", "portal.propose", &format!("{id}: {target}"), "pending");
        Response::Proposed { state: "pending".into() }
    }

    fn spawn_invalidations(&self, svc: Arc<HubService>, conn: Conn) {
        let mut events = self.engine.subscribe();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(ev) => {
                        let inv = svc.invalidations(&ev);
                        if !inv.is_empty() && !conn.push(inv).await {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Changes were missed: the spoke must re-verify everything.
                        conn.close();
                        return;
                    }
                    Err(_) => return,
                }
                if conn.is_closed() {
                    return;
                }
            }
        });
    }

    /// Hub: the admin accepts a pending portal.
    pub fn authorize(&self, caller: &Caller, id: &str) -> Result<PortalRecord, ApiFailure> {
        require_admin(caller)?;
        let r = self.record(id).ok_or_else(|| ApiFailure::new(404, format!("no portal {id}")))?;
        if r.side != Side::Hub {
            return Err(ApiFailure::new(409, "portals are authorized on their hub; this cluster is the spoke"));
        }
        if r.state != PortalState::Pending {
            return Err(ApiFailure::new(409, format!("portal {id} is not pending")));
        }
        // Residency may have changed since the proposal.
        if let Err(m) = hub::check_residency_path(&self.engine, &r.hub_path, &r.peer_region) {
            self.audit(&caller.user, "portal.refused", id, &m);
            return Err(ApiFailure::new(403, m));
        }
        let r = self.update(id, |r| r.state = PortalState::Active).ok_or_else(|| ApiFailure::new(500, "could not store the portal"))?;
        self.audit(&caller.user, "portal.authorize", &format!("{id}: {} for {}", r.hub_path, r.peer_name), "ok");
        Ok(r)
    }

    // ------------------------------------------------------------ spoke side

    async fn connect(&self, addr: &str, pin: Option<&str>, on_push: Option<conn::PushHandler>) -> anyhow::Result<Conn> {
        let sock = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow!("connecting to {addr} timed out"))?
            .with_context(|| format!("connecting to the hub at {addr}"))?;
        sock.set_nodelay(true)?;
        let connector = self.identity.connector()?;
        let ssl = connector.configure()?.verify_hostname(false).use_server_name_indication(false).into_ssl("aquifer")?;
        let mut stream = tokio_openssl::SslStream::new(ssl, sock)?;
        tokio::time::timeout(Duration::from_secs(10), std::pin::Pin::new(&mut stream).connect())
            .await
            .map_err(|_| anyhow!("TLS handshake with {addr} timed out"))?
            .map_err(|e| anyhow!("TLS handshake with {addr} failed: {e}"))?;
        let fp = stream.ssl().peer_certificate().map(|c| tls::fingerprint(&c)).ok_or_else(|| anyhow!("the hub sent no certificate"))?;
        if let Some(p) = pin {
            if !p.eq_ignore_ascii_case(&fp) {
                bail!("the hub at {addr} presented certificate {fp}, not the pinned {p}");
            }
        }
        Ok(Conn::spawn(stream, None, on_push, Some(fp), conn::Limits::default()))
    }

    /// Spoke: proposes a portal to a hub and starts running it (pending until authorized).
    pub async fn create(self: &Arc<Self>, caller: &Caller, req: CreatePortal) -> Result<PortalRecord, ApiFailure> {
        require_admin(caller)?;
        let mode = PortalMode::parse(&req.mode).ok_or_else(|| ApiFailure::new(400, "mode must be ro or rw"))?;
        let spoke_path = normalize(&req.spoke_path).ok_or_else(|| ApiFailure::new(400, "spoke_path must be an absolute path below /"))?;
        let hub_path = normalize(&req.hub_path).ok_or_else(|| ApiFailure::new(400, "hub_path must be an absolute path"))?;
        let id = format!("p{:016x}", rand::random::<u64>());
        let target = format!("{id}: {}:{hub_path} -> {spoke_path}", req.hub);
        // The spoke directory: new or empty, and not inside another portal.
        let engine = self.engine.clone();
        let sp = spoke_path.clone();
        let local_root = tokio::task::spawn_blocking(move || prepare_spoke_dir(&engine, &sp))
            .await
            .map_err(|e| ApiFailure::new(500, e.to_string()))?
            .map_err(|m| ApiFailure::new(409, m))?;
        let conn = match self.connect(&req.hub, req.hub_fingerprint.as_deref(), None).await {
            Ok(c) => c,
            Err(e) => {
                self.audit(&caller.user, "portal.create", &target, &format!("failed: {e:#}"));
                return Err(ApiFailure::new(502, format!("{e:#}")));
            }
        };
        let hub_fp = conn.peer_fingerprint.clone().unwrap_or_default();
        let proposal = Request::Propose {
            portal: id.clone(),
            hub_path: hub_path.clone(),
            spoke_path: spoke_path.clone(),
            mode,
            spoke_region: self.cfg.region.clone(),
            spoke_name: self.cfg.name.clone(),
        };
        let answer = conn.call(proposal, Duration::from_millis(CALL_TIMEOUT_MS)).await;
        conn.close();
        match answer {
            Ok(Response::Proposed { .. }) => {}
            Ok(Response::Error { code, message }) => {
                self.audit(&caller.user, "portal.create", &target, &format!("refused by the hub: {message}"));
                let status = match code {
                    ErrorCode::Residency => 403,
                    ErrorCode::NotFound => 404,
                    _ => 400,
                };
                return Err(ApiFailure::new(status, format!("the hub refused the portal: {message}")));
            }
            Ok(r) => return Err(ApiFailure::new(502, format!("unexpected answer from the hub: {r:?}"))),
            Err(e) => return Err(ApiFailure::new(502, format!("the hub did not answer: {e}"))),
        }
        let r = PortalRecord {
            id: id.clone(),
            side: Side::Spoke,
            state: PortalState::Pending,
            mode: mode.as_str().into(),
            hub_addr: req.hub.clone(),
            hub_path,
            spoke_path,
            peer_fingerprint: hub_fp,
            peer_region: String::new(),
            peer_name: String::new(),
            serve_stale: req.serve_stale,
            lease_ms: 0,
            created_ns: now_ns(),
            reason: "waiting for the hub's admin to authorize".into(),
            local_root,
        };
        self.save(&r).map_err(|e| ApiFailure::new(500, e.to_string()))?;
        let root_stub = RemoteStub { portal: id.clone(), ..RemoteStub::default() };
        self.engine.remote_stub_put(&Caller::portal(), local_root, &root_stub).map_err(|e| ApiFailure::new(500, e.to_string()))?;
        self.audit(&caller.user, "portal.create", &target, "pending");
        self.run_spoke(&r);
        Ok(r)
    }

    fn run_spoke(self: &Arc<Self>, r: &PortalRecord) {
        let settings = SpokeSettings {
            id: r.id.clone(),
            mode: PortalMode::parse(&r.mode).unwrap_or(PortalMode::ReadOnly),
            serve_stale: r.serve_stale,
            cache_bytes_max: self.cfg.cache_bytes_max,
            free_percent_min: self.cfg.free_percent_min,
            local_root: r.local_root,
        };
        let spawner: spoke::PrefetchSpawner = {
            let rt = self.rt.clone();
            Arc::new(move |job| {
                rt.spawn_blocking(job);
            })
        };
        let clock: Arc<dyn storage_engine::Clock> = Arc::new(storage_engine::SystemClock);
        let portal = SpokePortal::new(self.engine.clone(), settings, clock, Some(spawner));
        let link = Arc::new(TlsLink::new(self.rt.clone()));
        portal.set_link(Some(link.clone()));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let run = Arc::new(SpokeRun { portal, link, stop });
        self.spokes.write().insert(r.id.clone(), run.clone());
        let me = self.clone();
        let id = r.id.clone();
        self.rt.spawn(async move { me.supervise(id, run, stop_rx).await });
    }

    /// Keeps a spoke portal connected: waits for authorization, says Hello, renews the
    /// lease, reconnects after a cut.
    async fn supervise(self: Arc<Self>, id: String, run: Arc<SpokeRun>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut backoff = 100u64;
        let mut authorized = false;
        loop {
            if *stop.borrow() {
                return;
            }
            let Some(r) = self.record(&id) else { return };
            if r.state == PortalState::Deleting {
                return;
            }
            let portal = run.portal.clone();
            let on_push: conn::PushHandler = Arc::new(move |changes| portal.on_invalidate(&changes));
            let conn = match self.connect(&r.hub_addr, Some(&r.peer_fingerprint), Some(on_push)).await {
                Ok(c) => c,
                Err(e) => {
                    self.degrade(&id, &format!("hub unreachable: {e:#}"));
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(backoff)) => {},
                        _ = stop.changed() => return,
                    }
                    backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX_MS);
                    continue;
                }
            };
            let t = Duration::from_millis(CALL_TIMEOUT_MS);
            if r.state == PortalState::Pending && !authorized {
                match conn.call(Request::Status { portal: id.clone() }, t).await {
                    Ok(Response::Status { state, .. }) if state == "active" => {
                        authorized = true;
                        conn.close();
                        continue;
                    }
                    Ok(Response::Error { message, .. }) => {
                        self.update(&id, |r| r.reason = message);
                    }
                    _ => {}
                }
                conn.close();
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {},
                    _ = stop.changed() => return,
                }
                continue;
            }
            match conn.call(Request::Hello { version: PROTOCOL_VERSION, portal: id.clone() }, t).await {
                Ok(Response::Welcome { hub_region, .. }) => {
                    self.update(&id, |r| r.peer_region = hub_region);
                }
                Ok(Response::Error { message, .. }) => {
                    conn.close();
                    self.degrade(&id, &format!("the hub refused: {message}"));
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(RECONNECT_BACKOFF_MAX_MS)) => {},
                        _ = stop.changed() => return,
                    }
                    continue;
                }
                other => {
                    conn.close();
                    self.degrade(&id, &format!("no welcome from the hub: {other:?}"));
                    tokio::time::sleep(Duration::from_millis(backoff)).await;
                    backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX_MS);
                    continue;
                }
            }
            *run.link.conn.write() = Some(conn.clone());
            run.link.epoch.fetch_add(1, Ordering::Relaxed);
            backoff = 100;
            // Bind the portal root to the hub directory and take the first lease.
            let portal = run.portal.clone();
            let engine = self.engine.clone();
            let local_root = r.local_root;
            let first = tokio::task::spawn_blocking(move || -> storage_engine::Result<()> {
                portal.renew()?;
                bind_root(&engine, &portal, local_root)
            })
            .await;
            match first {
                Ok(Ok(())) => {
                    let lease_ms = run.portal.lease_ms();
                    let was = self.update(&id, |r| {
                        r.state = PortalState::Active;
                        r.lease_ms = lease_ms;
                        r.reason.clear();
                    });
                    if r.state == PortalState::Pending && was.is_some() {
                        self.audit("fabric", "portal.active", &id, "authorized by the hub");
                    }
                }
                Ok(Err(e)) => self.degrade(&id, &format!("binding the portal root: {e}")),
                Err(e) => self.degrade(&id, &e.to_string()),
            }
            // Renew a third of the lease at a time until the connection dies.
            loop {
                let lease_ms = self.record(&id).map(|r| r.lease_ms).unwrap_or(LEASE_MS_DEFAULT).max(300);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(lease_ms / 3)) => {},
                    _ = stop.changed() => { conn.close(); return; }
                }
                if conn.is_closed() {
                    break;
                }
                let portal = run.portal.clone();
                match tokio::task::spawn_blocking(move || portal.renew()).await {
                    Ok(Ok(())) => {}
                    _ => {
                        conn.close();
                        break;
                    }
                }
            }
            *run.link.conn.write() = None;
            self.degrade(&id, "connection to the hub lost");
        }
    }

    fn degrade(&self, id: &str, why: &str) {
        let mut was_active = false;
        self.update(id, |r| {
            if r.state == PortalState::Active {
                was_active = true;
                r.state = PortalState::Degraded;
            }
            r.reason = why.into();
        });
        if was_active {
            tracing::warn!(portal = id, reason = why, "portal degraded");
            self.audit("fabric", "portal.degraded", id, why);
        }
    }

    /// Deletes a portal on this side. On a spoke: the hub is told, the mirror tree and its
    /// cached data are removed. On a hub: the spoke's connections are closed.
    pub async fn delete(self: &Arc<Self>, caller: &Caller, id: &str) -> Result<(), ApiFailure> {
        require_admin(caller)?;
        let r = self.record(id).ok_or_else(|| ApiFailure::new(404, format!("no portal {id}")))?;
        match r.side {
            Side::Hub => {
                self.engine.setting_delete(&Caller::system(), PORTAL_SETTINGS, id).map_err(|e| ApiFailure::new(500, e.to_string()))?;
                for c in self.hub_conns.lock().remove(id).unwrap_or_default() {
                    c.close();
                }
                self.audit(&caller.user, "portal.delete", id, "ok");
                Ok(())
            }
            Side::Spoke => {
                // Files written in place and not yet committed go to the hub first; if that
                // fails the portal stays as it is.
                let running = self.spokes.read().get(id).cloned();
                if let Some(run) = running {
                    let portal = run.portal.clone();
                    tokio::task::spawn_blocking(move || portal.push_all_dirty())
                        .await
                        .map_err(|e| ApiFailure::new(500, e.to_string()))?
                        .map_err(|e| ApiFailure::new(503, format!("portal {id} has writes the hub has not taken yet: {e}")))?;
                }
                self.update(id, |r| r.state = PortalState::Deleting);
                if let Ok(conn) = self.connect(&r.hub_addr, Some(&r.peer_fingerprint), None).await {
                    let _ = conn.call(Request::Withdraw { portal: id.into() }, Duration::from_secs(10)).await;
                    conn.close();
                }
                if let Some(run) = self.spokes.write().remove(id) {
                    let _ = run.stop.send(true);
                    if let Some(c) = run.link.conn.write().take() {
                        c.close();
                    }
                    run.portal.close();
                    run.portal.drop_retired();
                }
                let me = self.clone();
                let id2 = id.to_string();
                tokio::task::spawn_blocking(move || me.finish_spoke_delete(&id2)).await.map_err(|e| ApiFailure::new(500, e.to_string()))??;
                self.audit(&caller.user, "portal.delete", id, "ok");
                Ok(())
            }
        }
    }

    /// Removes a spoke portal's mirror tree (and with it the cached data), then its record.
    fn finish_spoke_delete(&self, id: &str) -> Result<(), ApiFailure> {
        let Some(r) = self.record(id) else { return Ok(()) };
        let c = Caller::portal();
        let f = |e: Error| ApiFailure::new(500, e.to_string());
        let cleaner = SpokePortal::new(
            self.engine.clone(),
            SpokeSettings { id: id.into(), mode: PortalMode::ReadOnly, serve_stale: false, cache_bytes_max: u64::MAX, free_percent_min: 0, local_root: 0 },
            Arc::new(storage_engine::SystemClock),
            None,
        );
        if r.local_root != 0 && self.engine.remote_stub(r.local_root).map_err(f)?.is_some_and(|s| s.portal == id) {
            let mut cursor: Option<Vec<u8>> = None;
            loop {
                let page = self.engine.readdir(&c, r.local_root, cursor.as_deref(), 1024).map_err(f)?;
                for e in &page.entries {
                    cleaner.remove_tree(r.local_root, &e.name, e.ino, e.kind).map_err(f)?;
                }
                match page.next_cursor {
                    Some(n) => cursor = Some(n),
                    None => break,
                }
            }
            self.engine.remote_stub_delete(&c, r.local_root).map_err(f)?;
        }
        // Anything left over (stubs of this portal outside the tree).
        for (ino, s) in self.engine.remote_stubs().map_err(f)? {
            if s.portal == id {
                self.engine.remote_stub_delete(&c, ino).map_err(f)?;
            }
        }
        cleaner.drop_retired();
        self.engine.setting_delete(&Caller::system(), PORTAL_SETTINGS, id).map_err(f)?;
        // Freed space becomes free once the metadata that freed it is durable.
        self.engine.sync_metadata().map_err(f)?;
        Ok(())
    }

    /// Spoke: turns serving stale data on or off for a portal.
    pub fn set_serve_stale(&self, caller: &Caller, id: &str, on: bool) -> Result<PortalRecord, ApiFailure> {
        require_admin(caller)?;
        let r = self.update(id, |r| r.serve_stale = on).ok_or_else(|| ApiFailure::new(404, format!("no portal {id}")))?;
        if let Some(run) = self.spokes.read().get(id) {
            run.portal.settings.write().serve_stale = on;
        }
        self.audit(&caller.user, "portal.serve_stale", id, if on { "on" } else { "off" });
        Ok(r)
    }

    fn spoke(&self, id: &str) -> Option<Arc<SpokePortal>> {
        self.spokes.read().get(id).map(|r| r.portal.clone())
    }
}

fn require_admin(caller: &Caller) -> Result<(), ApiFailure> {
    if caller.role >= Role::Admin { Ok(()) } else { Err(ApiFailure::new(403, "portals are managed by admins")) }
}

/// `/a//b/` → `/a/b`; `None` for relative paths or `.`/`..` names.
fn normalize(p: &str) -> Option<String> {
    if !p.starts_with('/') {
        return None;
    }
    let parts: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
    if parts.iter().any(|c| *c == "." || *c == ".." || c.contains('\0')) {
        return None;
    }
    Some(format!("/{}", parts.join("/")))
}

/// Creates the spoke directory (and its parents) or checks that it is empty.
fn prepare_spoke_dir(engine: &Engine, path: &str) -> Result<Ino, String> {
    let c = Caller::system();
    if path == "/" {
        return Err("the root directory cannot be a portal".into());
    }
    let mut cur = engine.getattr(&c, storage_engine::ROOT_INO).map_err(|e| e.to_string())?;
    for comp in path.split('/').filter(|s| !s.is_empty()) {
        if engine.remote_stub(cur.ino).map_err(|e| e.to_string())?.is_some() {
            return Err(format!("{path} would be inside another portal"));
        }
        cur = match engine.lookup(&c, cur.ino, comp.as_bytes()) {
            Ok(a) => a,
            Err(Error::NotFound) => engine.mkdir(&c, cur.ino, comp.as_bytes(), 0o755).map_err(|e| e.to_string())?,
            Err(e) => return Err(e.to_string()),
        };
    }
    if cur.kind != FileKind::Dir {
        return Err(format!("{path} is not a directory"));
    }
    if engine.remote_stub(cur.ino).map_err(|e| e.to_string())?.is_some() {
        return Err(format!("{path} is already a portal"));
    }
    if !engine.readdir(&c, cur.ino, None, 1).map_err(|e| e.to_string())?.entries.is_empty() {
        return Err(format!("{path} is not empty"));
    }
    Ok(cur.ino)
}

/// Points the portal root's stub at the hub directory (first connection, or after the hub
/// directory was replaced).
fn bind_root(engine: &Engine, portal: &SpokePortal, local_root: Ino) -> storage_engine::Result<()> {
    let c = Caller::portal();
    let Some(mut stub) = engine.remote_stub(local_root)? else { return Ok(()) };
    let resp = portal.call(Request::GetAttr { path: vec![] })?;
    let Response::Attr(e) = resp else { return Err(Error::Io("unexpected answer for the portal root".into())) };
    if stub.hub_ino != e.hub_ino {
        stub.hub_ino = e.hub_ino;
        stub.hub_version = 0;
        stub.listed = false;
    }
    if stub.hub_version != e.version {
        engine.remote_set_attr(&c, local_root, &spoke::remote_attr(&e))?;
        stub.hub_version = e.version;
        stub.listed = false;
    }
    engine.remote_stub_put(&c, local_root, &stub)
}

/// The engine's view of the fabric (held weakly: the fabric owns the engine's hooks).
struct FabricSource(std::sync::Weak<Fabric>);

impl RemoteSource for FabricSource {
    fn ensure(&self, ino: Ino, stub: &RemoteStub, need: Need) -> storage_engine::Result<()> {
        let f = self.0.upgrade().ok_or_else(|| Error::Unavailable("the fabric is shut down".into()))?;
        let p = f.spoke(&stub.portal).ok_or_else(|| Error::Unavailable(format!("portal {} is not running", stub.portal)))?;
        if stub.hub_ino == 0 {
            let state = f.record(&stub.portal).map(|r| (r.state, r.reason)).unwrap_or((PortalState::Deleting, String::new()));
            let what = match state.0 {
                PortalState::Pending => format!("pending: {}", state.1),
                PortalState::Active => "connecting to the hub".to_string(),
                s => format!("{s:?}: {}", state.1).to_lowercase(),
            };
            return Err(Error::Unavailable(format!("portal {} is {what}", stub.portal)));
        }
        p.ensure(ino, stub, need)
    }

    fn before_mutation(&self, ino: Ino, stub: &RemoteStub, m: &Mutation<'_>) -> storage_engine::Result<Verdict> {
        let f = self.0.upgrade().ok_or_else(|| Error::Unavailable("the fabric is shut down".into()))?;
        let p = f.spoke(&stub.portal).ok_or_else(|| Error::ReadOnly(format!("portal {} is not running", stub.portal)))?;
        if stub.hub_ino == 0 {
            return Err(Error::Unavailable(format!("portal {} is not active yet", stub.portal)));
        }
        p.before_mutation(ino, stub, m)
    }
}
