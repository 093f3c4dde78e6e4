//! Aquifer's SMB 2/3 adapter (SMB 2.0.2–3.1.1 through the `smb-server` crate).
//!
//! Users log in with NTLMv2 against the NT hashes the engine's identity store keeps (set with
//! every password); every file operation runs in the engine as that user. A share is a
//! directory of the namespace; paths cannot leave it (`..` is refused by the path parser).
//! Guest and anonymous sessions are refused unless a share enables guest access, and then act
//! as the engine's anonymous caller (nobody/nogroup).

mod backend;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use smb_server::{Access, ConfigHandle, Share, SmbServer};
use storage_engine::Engine;
use tracing::{info, warn};

pub use backend::{EngineShare, smb_error};

/// How often accounts created, changed or removed through the API reach the SMB user table.
const USER_SYNC_INTERVAL: Duration = Duration::from_secs(1);
/// After shutdown is asked, how long connections get to finish before they are dropped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// One share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareConfig {
    /// The name clients connect to (`\\server\NAME`).
    pub name: String,
    /// The directory of the namespace it shows (`/` for everything).
    pub path: String,
    /// Refuse every change through this share.
    pub read_only: bool,
    /// Sessions without an account (guest, anonymous) may connect, as nobody/nogroup.
    pub guest: bool,
    /// Only encrypted sessions (SMB 3.x) may connect.
    pub encrypt: bool,
    /// SMB2 leases (client caching). Off by default: changes made through NFS, S3, SFTP or
    /// REST do not break a lease, so a caching SMB client could serve stale data.
    pub leases: bool,
}

impl ShareConfig {
    pub fn new(name: impl Into<String>, path: impl Into<String>) -> ShareConfig {
        ShareConfig { name: name.into(), path: path.into(), read_only: false, guest: false, encrypt: false, leases: false }
    }

    /// A share name clients can type and a namespace path: refuses what would fail later.
    pub fn validate(&self) -> anyhow::Result<()> {
        let n = &self.name;
        if n.is_empty() || n.len() > 80 || !n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.$".contains(c)) {
            bail!("share name {n:?} must be 1-80 characters of a-z, A-Z, 0-9, '-', '_', '.', '$'");
        }
        if n.eq_ignore_ascii_case("IPC$") {
            bail!("share name IPC$ is reserved");
        }
        if !self.path.starts_with('/') || self.path.split('/').any(|c| c == ".." || c == ".") {
            bail!("share path {:?} must be absolute, without '.' or '..'", self.path);
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct SmbOptions {
    pub shares: Vec<ShareConfig>,
    /// NetBIOS name announced to clients.
    pub server_name: String,
}

impl Default for SmbOptions {
    /// The embedded default: the whole namespace as `aquifer`.
    fn default() -> Self {
        SmbOptions { shares: vec![ShareConfig::new("aquifer", "/")], server_name: "AQUIFER".into() }
    }
}

/// An SMB server bound to its address, not yet serving.
pub struct SmbService {
    server: SmbServer,
    engine: Arc<Engine>,
    shares: Vec<ShareConfig>,
    local: SocketAddr,
}

impl SmbService {
    /// Builds the server and binds `addr` (port 0 picks one; see [`SmbService::local_addr`]).
    pub async fn bind(engine: Arc<Engine>, addr: SocketAddr, opts: SmbOptions) -> anyhow::Result<SmbService> {
        if opts.shares.is_empty() {
            bail!("SMB needs at least one share");
        }
        for s in &opts.shares {
            s.validate()?;
        }
        // Guest sessions cannot sign; signing is required unless a share admits guests.
        let any_guest = opts.shares.iter().any(|s| s.guest);
        let mut builder = SmbServer::builder()
            .listen(addr)
            .netbios_name(opts.server_name.clone())
            .require_signing(!any_guest)
            // Each WRITE is one engine call; 1 MiB matches the engine's stripe-sized buffering.
            .max_write_size(1 << 20)
            .max_read_size(1 << 20);
        for s in &opts.shares {
            let backend = EngineShare::new(engine.clone(), &s.path, s.read_only, s.guest);
            let mut share = Share::new(s.name.clone(), backend).leases(s.leases).durable_handles(s.leases);
            if s.guest {
                share = if s.read_only { share.public_read_only() } else { share.public() };
            }
            if s.encrypt {
                share = share.encrypt_data();
            }
            builder = builder.share(share);
        }
        let server = builder.build().context("configure SMB server")?;
        let local = server.bind().await.with_context(|| format!("listen for SMB on {addr}"))?;
        Ok(SmbService { server, engine, shares: opts.shares, local })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves until `shutdown` resolves.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()> + Send) -> anyhow::Result<()> {
        let config = self.server.config_handle();
        let mut users = UserSync { config, engine: self.engine.clone(), shares: self.shares.clone(), known: HashMap::new() };
        users.sync().await?;
        let stop = self.server.shutdown_handle();
        let local = self.local;
        info!(%local, shares = self.shares.len(), "SMB service listening");
        let serving = self.server.serve();
        tokio::pin!(serving);
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(USER_SYNC_INTERVAL);
        loop {
            tokio::select! {
                r = &mut serving => return r.context("SMB server"),
                _ = &mut shutdown => break,
                _ = tick.tick() => {
                    if let Err(e) = users.sync().await {
                        warn!("SMB user table: {e:#}");
                    }
                }
            }
        }
        stop.shutdown();
        // Files kept open for clients to reconnect to (durable handles) would hold the server
        // for minutes; a stopping daemon closes them after a grace period.
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut serving).await.is_err() {
            warn!("SMB connections still open after {SHUTDOWN_GRACE:?}; closing them");
        }
        info!(%local, "SMB service stopped");
        Ok(())
    }
}

/// Keeps the server's user table equal to the engine's accounts that have an NT hash.
struct UserSync {
    config: ConfigHandle,
    engine: Arc<Engine>,
    shares: Vec<ShareConfig>,
    known: HashMap<String, [u8; 16]>,
}

impl UserSync {
    async fn sync(&mut self) -> anyhow::Result<()> {
        let engine = self.engine.clone();
        let now: HashMap<String, [u8; 16]> =
            tokio::task::spawn_blocking(move || engine.nt_hashes()).await?.context("read NT hashes")?.into_iter().collect();
        for (name, hash) in &now {
            if self.known.get(name) == Some(hash) {
                continue;
            }
            if let Err(e) = self.config.add_user_nt_hash(name.clone(), *hash).await {
                // Names the SMB layer reserves (such as "anonymous") cannot log in over SMB.
                warn!(user = %name, "not an SMB user: {e}");
                continue;
            }
            // Shares admit every account; what it may do there is the engine's decision.
            for s in self.shares.iter().filter(|s| !s.guest) {
                let access = if s.read_only { Access::Read } else { Access::ReadWrite };
                self.config.grant_share_user(&s.name, name, access).await.with_context(|| format!("grant {name} on {}", s.name))?;
            }
            self.known.insert(name.clone(), *hash);
        }
        let gone: Vec<String> = self.known.keys().filter(|n| !now.contains_key(*n)).cloned().collect();
        for name in gone {
            let _ = self.config.remove_user(&name).await;
            self.known.remove(&name);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_config_is_validated() {
        assert!(ShareConfig::new("aquifer", "/").validate().is_ok());
        assert!(ShareConfig::new("data-1", "/projects/x").validate().is_ok());
        assert!(ShareConfig::new("", "/").validate().is_err());
        assert!(ShareConfig::new("a b", "/").validate().is_err());
        assert!(ShareConfig::new("ipc$", "/").validate().is_err());
        assert!(ShareConfig::new("x", "relative").validate().is_err());
        assert!(ShareConfig::new("x", "/a/../b").validate().is_err());
    }
}
