//! Aquifer's SMB 2/3 adapter (SMB 2.0.2–3.1.1 through the `smb-server` crate).
//!
//! Users log in with NTLMv2 against the NT hashes the engine's identity store keeps (set with
//! every password); every file operation runs in the engine as that user. A share is a
//! directory of the namespace; paths cannot leave it (`..` is refused by the path parser).
//! Guest and anonymous sessions are refused unless a share enables guest access, and then act
//! as the engine's anonymous caller (nobody/nogroup).

mod backend;
pub mod shares;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use smb_server::{Access, ConfigHandle, Share, SmbServer};
use storage_engine::Engine;
use tracing::{info, warn};

pub use backend::{EngineShare, smb_error};
pub use shares::{SHARE_SETTING_NS, ShareError, SharePatch, ShareSource, ShareTable};

/// How often accounts and shares created, changed or removed through the API reach the SMB
/// server (share changes made through the [`ShareTable`] apply at once).
const SYNC_INTERVAL: Duration = Duration::from_secs(1);
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
    /// NetBIOS name announced to clients.
    pub server_name: String,
}

impl Default for SmbOptions {
    fn default() -> Self {
        SmbOptions { server_name: "AQUIFER".into() }
    }
}

/// The embedded default when the configuration file has no shares: the whole namespace as
/// `aquifer`.
pub fn default_shares() -> Vec<ShareConfig> {
    vec![ShareConfig::new("aquifer", "/")]
}

/// An SMB server bound to its address, not yet serving.
pub struct SmbService {
    server: SmbServer,
    engine: Arc<Engine>,
    table: ShareTable,
    local: SocketAddr,
}

impl SmbService {
    /// Builds the server with the table's shares and binds `addr` (port 0 picks one; see
    /// [`SmbService::local_addr`]).
    pub async fn bind(engine: Arc<Engine>, addr: SocketAddr, opts: SmbOptions, table: ShareTable) -> anyhow::Result<SmbService> {
        let shares: Vec<ShareConfig> = table.list().into_iter().map(|(s, _)| s).collect();
        if shares.is_empty() {
            bail!("SMB needs at least one share");
        }
        // Guest sessions cannot sign; signing is required unless a share admits guests. This is
        // fixed when the server starts: a guest share added later admits guests after a restart.
        let any_guest = shares.iter().any(|s| s.guest);
        let builder = SmbServer::builder()
            .listen(addr)
            .netbios_name(opts.server_name.clone())
            .require_signing(!any_guest)
            // Each WRITE is one engine call; 1 MiB matches the engine's stripe-sized buffering.
            .max_write_size(1 << 20)
            .max_read_size(1 << 20);
        // Shares are added by the first sync, with the users they admit.
        let server = builder.build().context("configure SMB server")?;
        let local = server.bind().await.with_context(|| format!("listen for SMB on {addr}"))?;
        Ok(SmbService { server, engine, table, local })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The names of the shares served now.
    pub fn share_names(&self) -> Vec<String> {
        self.table.list().into_iter().map(|(s, _)| s.name).collect()
    }

    /// Serves until `shutdown` resolves.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()> + Send) -> anyhow::Result<()> {
        let config = self.server.config_handle();
        let mut sync = Reconcile { config, engine: self.engine.clone(), table: self.table.clone(), users: HashMap::new(), shares: HashMap::new() };
        sync.run().await?;
        let stop = self.server.shutdown_handle();
        let local = self.local;
        info!(%local, shares = sync.shares.len(), "SMB service listening");
        let serving = self.server.serve();
        tokio::pin!(serving);
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(SYNC_INTERVAL);
        let table = self.table.clone();
        loop {
            tokio::select! {
                r = &mut serving => return r.context("SMB server"),
                _ = &mut shutdown => break,
                _ = tick.tick() => {}
                _ = table.changed() => {}
            }
            if let Err(e) = sync.run().await {
                warn!("SMB users and shares: {e:#}");
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

/// Keeps the server's users equal to the engine's accounts that have an NT hash, and its
/// shares equal to the share table.
struct Reconcile {
    config: ConfigHandle,
    engine: Arc<Engine>,
    table: ShareTable,
    users: HashMap<String, [u8; 16]>,
    /// Shares served, by lower-case name.
    shares: HashMap<String, ShareConfig>,
}

impl Reconcile {
    async fn run(&mut self) -> anyhow::Result<()> {
        self.sync_users().await?;
        self.sync_shares().await
    }

    async fn sync_users(&mut self) -> anyhow::Result<()> {
        let engine = self.engine.clone();
        let now: HashMap<String, [u8; 16]> =
            tokio::task::spawn_blocking(move || engine.nt_hashes()).await?.context("read NT hashes")?.into_iter().collect();
        for (name, hash) in &now {
            if self.users.get(name) == Some(hash) {
                continue;
            }
            if let Err(e) = self.config.add_user_nt_hash(name.clone(), *hash).await {
                // Names the SMB layer reserves (such as "anonymous") cannot log in over SMB.
                warn!(user = %name, "not an SMB user: {e}");
                continue;
            }
            for s in self.shares.values() {
                grant(&self.config, s, name).await?;
            }
            self.users.insert(name.clone(), *hash);
        }
        let gone: Vec<String> = self.users.keys().filter(|n| !now.contains_key(*n)).cloned().collect();
        for name in gone {
            let _ = self.config.remove_user(&name).await;
            self.users.remove(&name);
        }
        Ok(())
    }

    async fn sync_shares(&mut self) -> anyhow::Result<()> {
        let table = self.table.clone();
        let want: HashMap<String, ShareConfig> = tokio::task::spawn_blocking(move || table.list())
            .await?
            .into_iter()
            .map(|(s, _)| (s.name.to_ascii_lowercase(), s))
            .collect();
        let stale: Vec<String> = self.shares.iter().filter(|(k, s)| want.get(*k) != Some(*s)).map(|(k, _)| k.clone()).collect();
        for k in stale {
            let old = self.shares.remove(&k).expect("listed above");
            // Closes the share's tree connections and open files.
            self.config.remove_share(&old.name).await.with_context(|| format!("remove share {}", old.name))?;
            info!(share = %old.name, "SMB share removed");
        }
        for (k, s) in want {
            if self.shares.contains_key(&k) {
                continue;
            }
            self.config.add_share(self.share(&s)).await.with_context(|| format!("add share {}", s.name))?;
            for user in self.users.keys() {
                grant(&self.config, &s, user).await?;
            }
            info!(share = %s.name, path = %s.path, "SMB share added");
            self.shares.insert(k, s);
        }
        Ok(())
    }

    fn share(&self, s: &ShareConfig) -> Share {
        let backend = EngineShare::new(self.engine.clone(), &s.path, s.read_only, s.guest);
        let mut share = Share::new(s.name.clone(), backend).leases(s.leases).durable_handles(s.leases);
        if s.guest {
            share = if s.read_only { share.public_read_only() } else { share.public() };
        }
        if s.encrypt {
            share = share.encrypt_data();
        }
        share
    }
}

/// Shares admit every account; what it may do there is the engine's decision.
async fn grant(config: &ConfigHandle, s: &ShareConfig, user: &str) -> anyhow::Result<()> {
    if s.guest {
        return Ok(());
    }
    let access = if s.read_only { Access::Read } else { Access::ReadWrite };
    config.grant_share_user(&s.name, user, access).await.with_context(|| format!("grant {user} on {}", s.name))
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
