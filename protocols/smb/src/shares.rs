//! The share table: shares from the configuration file plus shares added at run time (REST
//! `/api/v1/shares`, `aquifer shares`), kept as engine settings in the namespace
//! [`SHARE_SETTING_NS`] so they survive restarts.
//!
//! The running SMB server applies the table within a second of a change (at once when the
//! change is made through this table): a new share can be connected to, a removed share's
//! tree connections and open files are closed, and a changed share is removed and added
//! again, so its connections reconnect under the new settings.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use storage_engine::{Caller, Engine, FileKind, Role};
use tokio::sync::Notify;

use crate::ShareConfig;

/// Engine settings namespace of shares added at run time; the key is the share's name in
/// lower case (share names are case-insensitive, as Windows treats them).
pub const SHARE_SETTING_NS: &str = "smb.share";

/// Where a share comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareSource {
    /// The configuration file (or the embedded default): changed by editing it and restarting.
    Config,
    /// Added at run time and kept in the engine's settings.
    Api,
}

impl ShareSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ShareSource::Config => "config",
            ShareSource::Api => "api",
        }
    }
}

/// Changes to a share added at run time; `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub struct SharePatch {
    pub path: Option<String>,
    pub read_only: Option<bool>,
    pub guest: Option<bool>,
    pub encrypt: Option<bool>,
    pub leases: Option<bool>,
}

/// Why a change of the share table was refused.
#[derive(Debug, thiserror::Error)]
pub enum ShareError {
    #[error("{0}")]
    Invalid(String),
    #[error("no share {0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("changing shares needs the admin role")]
    PermissionDenied,
    #[error("{0}")]
    Engine(#[from] storage_engine::Error),
}

/// A share as stored in the engine's settings.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    name: String,
    path: String,
    read_only: bool,
    guest: bool,
    encrypt: bool,
    leases: bool,
}

impl From<&ShareConfig> for Stored {
    fn from(s: &ShareConfig) -> Stored {
        Stored { name: s.name.clone(), path: s.path.clone(), read_only: s.read_only, guest: s.guest, encrypt: s.encrypt, leases: s.leases }
    }
}

impl From<Stored> for ShareConfig {
    fn from(s: Stored) -> ShareConfig {
        ShareConfig { name: s.name, path: s.path, read_only: s.read_only, guest: s.guest, encrypt: s.encrypt, leases: s.leases }
    }
}

/// The configuration file's shares and the engine's stored ones; cheap to clone.
#[derive(Clone)]
pub struct ShareTable {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<Engine>,
    config: Vec<ShareConfig>,
    /// Wakes the running server to apply a change made through this table.
    changed: Notify,
}

fn key(name: &str) -> String {
    name.to_ascii_lowercase()
}

impl ShareTable {
    /// Validates the configuration file's shares (names unique in any case).
    pub fn new(engine: Arc<Engine>, config: Vec<ShareConfig>) -> anyhow::Result<ShareTable> {
        let mut seen = std::collections::HashSet::new();
        for s in &config {
            s.validate()?;
            if !seen.insert(key(&s.name)) {
                anyhow::bail!("share {} is configured twice", s.name);
            }
        }
        Ok(ShareTable { inner: Arc::new(Inner { engine, config, changed: Notify::new() }) })
    }

    /// Every share: the configuration file's first, then the stored ones by name. A stored
    /// share whose name a configuration share has taken since (the file was edited) is left
    /// out; an unreadable record is skipped with a warning.
    pub fn list(&self) -> Vec<(ShareConfig, ShareSource)> {
        let mut out: Vec<(ShareConfig, ShareSource)> = self.inner.config.iter().map(|s| (s.clone(), ShareSource::Config)).collect();
        let stored = match self.inner.engine.settings_list(SHARE_SETTING_NS) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("SMB shares in the engine's settings: {e}");
                Vec::new()
            }
        };
        for (k, v) in stored {
            match serde_json::from_slice::<Stored>(&v) {
                Ok(s) if key(&s.name) == k && !out.iter().any(|(c, _)| key(&c.name) == k) => {
                    out.push((s.into(), ShareSource::Api));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(share = %k, "unreadable SMB share record: {e}"),
            }
        }
        out
    }

    /// One share by name (any case).
    pub fn get(&self, name: &str) -> Option<(ShareConfig, ShareSource)> {
        self.list().into_iter().find(|(s, _)| key(&s.name) == key(name))
    }

    /// Adds a share (admin): its name must be free and its path an existing directory.
    pub fn add(&self, caller: &Caller, share: ShareConfig) -> Result<ShareConfig, ShareError> {
        admin(caller)?;
        share.validate().map_err(|e| ShareError::Invalid(e.to_string()))?;
        if self.get(&share.name).is_some() {
            return Err(ShareError::Conflict(format!("share {} exists", share.name)));
        }
        self.store(caller, &share)?;
        Ok(share)
    }

    /// Changes a share added at run time (admin).
    pub fn update(&self, caller: &Caller, name: &str, patch: SharePatch) -> Result<ShareConfig, ShareError> {
        admin(caller)?;
        let mut share = self.api_share(name)?;
        share.path = patch.path.unwrap_or(share.path);
        share.read_only = patch.read_only.unwrap_or(share.read_only);
        share.guest = patch.guest.unwrap_or(share.guest);
        share.encrypt = patch.encrypt.unwrap_or(share.encrypt);
        share.leases = patch.leases.unwrap_or(share.leases);
        share.validate().map_err(|e| ShareError::Invalid(e.to_string()))?;
        self.store(caller, &share)?;
        Ok(share)
    }

    /// Removes a share added at run time (admin); its connections are closed.
    pub fn remove(&self, caller: &Caller, name: &str) -> Result<(), ShareError> {
        admin(caller)?;
        let share = self.api_share(name)?;
        self.inner.engine.setting_delete(caller, SHARE_SETTING_NS, &key(&share.name))?;
        self.inner.changed.notify_one();
        Ok(())
    }

    /// Resolves when a change was made through this table since the last call.
    pub async fn changed(&self) {
        self.inner.changed.notified().await
    }

    fn api_share(&self, name: &str) -> Result<ShareConfig, ShareError> {
        match self.get(name) {
            None => Err(ShareError::NotFound(name.to_string())),
            Some((_, ShareSource::Config)) => {
                Err(ShareError::Conflict(format!("share {name} is defined in the configuration file; change it there")))
            }
            Some((s, ShareSource::Api)) => Ok(s),
        }
    }

    fn store(&self, caller: &Caller, share: &ShareConfig) -> Result<(), ShareError> {
        match self.inner.engine.resolve(caller, &share.path) {
            Ok(a) if a.kind == FileKind::Dir => {}
            Ok(_) => return Err(ShareError::Invalid(format!("{} is not a directory", share.path))),
            Err(storage_engine::Error::NotFound | storage_engine::Error::NotDir) => {
                return Err(ShareError::Invalid(format!("{} does not exist", share.path)));
            }
            Err(e) => return Err(e.into()),
        }
        let value = serde_json::to_vec(&Stored::from(share)).expect("a share serializes");
        self.inner.engine.setting_put(caller, SHARE_SETTING_NS, &key(&share.name), &value)?;
        self.inner.changed.notify_one();
        Ok(())
    }
}

fn admin(caller: &Caller) -> Result<(), ShareError> {
    if caller.role >= Role::Admin { Ok(()) } else { Err(ShareError::PermissionDenied) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_stored_merged_and_guarded() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(storage_engine::EngineConfig::with_file_drives(dir.path(), 6, 64 << 20, 4, 2)).unwrap();
        let sys = Caller::system();
        engine.mkdir(&sys, storage_engine::ROOT_INO, b"data", 0o755).unwrap();
        engine.create(&sys, storage_engine::ROOT_INO, b"file", 0o644, true).unwrap();
        let t = ShareTable::new(engine.clone(), vec![ShareConfig::new("aquifer", "/")]).unwrap();
        assert!(ShareTable::new(engine.clone(), vec![ShareConfig::new("a", "/"), ShareConfig::new("A", "/data")]).is_err());

        let mut s = ShareConfig::new("Data", "/data");
        s.read_only = true;
        t.add(&sys, s.clone()).unwrap();
        let names: Vec<_> = t.list().into_iter().map(|(s, src)| (s.name, src)).collect();
        assert_eq!(names, [("aquifer".to_string(), ShareSource::Config), ("Data".to_string(), ShareSource::Api)]);
        assert_eq!(t.get("DATA").unwrap().0, s);

        // Refusals change nothing.
        assert!(matches!(t.add(&sys, ShareConfig::new("data", "/")), Err(ShareError::Conflict(_))));
        assert!(matches!(t.add(&sys, ShareConfig::new("AQUIFER", "/data")), Err(ShareError::Conflict(_))));
        assert!(matches!(t.add(&sys, ShareConfig::new("x", "/missing")), Err(ShareError::Invalid(_))));
        assert!(matches!(t.add(&sys, ShareConfig::new("x", "/file")), Err(ShareError::Invalid(_))));
        assert!(matches!(t.add(&sys, ShareConfig::new("bad name", "/")), Err(ShareError::Invalid(_))));
        assert!(matches!(t.add(&sys, ShareConfig::new("x", "/a/../b")), Err(ShareError::Invalid(_))));
        let user = Caller { role: Role::User, ..Caller::system() };
        assert!(matches!(t.add(&user, ShareConfig::new("y", "/")), Err(ShareError::PermissionDenied)));
        assert!(matches!(t.remove(&sys, "aquifer"), Err(ShareError::Conflict(_))));
        assert!(matches!(t.update(&sys, "nope", SharePatch::default()), Err(ShareError::NotFound(_))));
        assert!(matches!(t.update(&sys, "data", SharePatch { path: Some("rel".into()), ..Default::default() }), Err(ShareError::Invalid(_))));
        assert_eq!(t.list().len(), 2);

        let changed = t.update(&sys, "data", SharePatch { read_only: Some(false), encrypt: Some(true), ..Default::default() }).unwrap();
        assert!(!changed.read_only && changed.encrypt && changed.path == "/data");
        // A new table over the same engine (a restart) sees the stored share.
        let again = ShareTable::new(engine.clone(), vec![ShareConfig::new("aquifer", "/")]).unwrap();
        assert_eq!(again.get("data").unwrap(), (changed, ShareSource::Api));
        t.remove(&sys, "DATA").unwrap();
        assert!(t.get("data").is_none());
        assert!(matches!(t.remove(&sys, "data"), Err(ShareError::NotFound(_))));
        engine.shutdown().unwrap();
    }
}
