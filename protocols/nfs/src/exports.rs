//! The export table: exports from the configuration file plus exports added at run time
//! (REST `/api/v1/exports`, `aquifer exports`), kept as engine settings in the namespace
//! [`EXPORT_SETTING_NS`] so they survive restarts.
//!
//! The running service reads the table once per MOUNT and once per request (a read lock and an
//! `Arc` clone), so a change applies to the next call: a new export can be mounted at once, a
//! changed client list or read-only flag holds for handles already issued, and the handles of
//! a removed export are stale.

use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use storage_engine::{Caller, Engine, FileKind, Role};
use tracing::warn;

use crate::handle::export_id;
use crate::proc::ExportState;
use crate::{ClientMatch, Export};

/// Engine settings namespace of exports added at run time; the key is the export's id.
pub const EXPORT_SETTING_NS: &str = "nfs.export";
/// Most entries in one export's client list.
pub const EXPORT_CLIENTS_MAX: usize = 256;

/// Where an export comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportSource {
    /// The configuration file (or the embedded default): changed by editing it and restarting.
    Config,
    /// Added at run time and kept in the engine's settings.
    Api,
}

/// One export as listed: its id (eight hex digits, derived from the path; also inside every
/// file handle of the export), its definition and where it comes from.
#[derive(Debug, Clone)]
pub struct ExportInfo {
    pub id: String,
    pub export: Export,
    pub source: ExportSource,
}

/// Changes to an export added at run time; `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub struct ExportPatch {
    pub clients: Option<Vec<String>>,
    pub read_only: Option<bool>,
    pub root_squash: Option<bool>,
}

/// Why a change of the export table was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{0}")]
    Invalid(String),
    #[error("no export {0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("changing exports needs the admin role")]
    PermissionDenied,
    #[error("{0}")]
    Engine(#[from] storage_engine::Error),
}

/// The stored form of an export added at run time.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    path: String,
    clients: Vec<String>,
    read_only: bool,
    root_squash: bool,
}

/// The live export table, shared by the NFS service and whoever administers it.
#[derive(Clone)]
pub struct ExportTable {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<Engine>,
    config: Vec<Arc<ExportState>>,
    current: RwLock<Arc<Vec<Arc<ExportState>>>>,
    /// Serialises read-modify-write of the stored records.
    change: Mutex<()>,
}

/// `/a//b/` → `/a/b`; `""` → `/`.
pub(crate) fn normalise(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

/// Checks an export and prepares it for the service.
fn prepare(e: Export) -> Result<ExportState, ExportError> {
    if !e.path.starts_with('/') {
        return Err(ExportError::Invalid(format!("export path {:?} must be absolute", e.path)));
    }
    if e.path.contains('\0') || e.path.len() > nfs3_types::mount::MNTPATHLEN {
        return Err(ExportError::Invalid(format!("export path must be at most {} bytes without NUL", nfs3_types::mount::MNTPATHLEN)));
    }
    let path = normalise(&e.path);
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(ExportError::Invalid(format!("export path {:?} contains . or ..", e.path)));
    }
    if e.clients.is_empty() || e.clients.len() > EXPORT_CLIENTS_MAX {
        return Err(ExportError::Invalid(format!("an export lists 1 to {EXPORT_CLIENTS_MAX} clients (`*`, an address or a network)")));
    }
    let clients = e.clients.iter().map(|c| ClientMatch::parse(c)).collect::<anyhow::Result<Vec<_>>>().map_err(|err| ExportError::Invalid(format!("{err:#}")))?;
    let id = export_id(&path);
    let export = Export { path: path.clone(), clients: e.clients.iter().map(|c| c.trim().to_string()).collect(), ..e };
    Ok(ExportState { export, path, id, clients, source: ExportSource::Config })
}

fn id_string(id: u32) -> String {
    format!("{id:08x}")
}

fn require_admin(caller: &Caller) -> Result<(), ExportError> {
    if caller.role >= Role::Admin { Ok(()) } else { Err(ExportError::PermissionDenied) }
}

impl ExportTable {
    /// The table of `config` plus the exports stored in the engine's settings. A bad
    /// configuration entry is an error; a stored record that no longer reads is skipped with a
    /// warning (and can be removed through the API).
    pub fn new(engine: Arc<Engine>, config: Vec<Export>) -> anyhow::Result<ExportTable> {
        let mut prepared: Vec<Arc<ExportState>> = Vec::new();
        for e in config {
            let shown = e.path.clone();
            let st = prepare(e).map_err(|err| anyhow::anyhow!("NFS export {shown:?}: {err}"))?;
            if prepared.iter().any(|o| o.id == st.id) {
                anyhow::bail!("export {:?} is listed twice or its id collides with another export", st.path);
            }
            prepared.push(Arc::new(st));
        }
        let inner = Inner { engine, config: prepared.clone(), current: RwLock::new(Arc::new(prepared)), change: Mutex::new(()) };
        let table = ExportTable { inner: Arc::new(inner) };
        table.reload()?;
        Ok(table)
    }

    /// Re-reads the stored exports and replaces the table the service uses.
    pub fn reload(&self) -> anyhow::Result<()> {
        let stored = self.inner.engine.settings_list(EXPORT_SETTING_NS)?;
        let mut all = self.inner.config.clone();
        for (key, value) in stored {
            let rec: Record = match serde_json::from_slice(&value) {
                Ok(r) => r,
                Err(e) => {
                    warn!(key, "skipping an unreadable stored NFS export: {e}");
                    continue;
                }
            };
            let e = Export { path: rec.path, clients: rec.clients, read_only: rec.read_only, root_squash: rec.root_squash };
            match prepare(e) {
                Ok(mut st) if id_string(st.id) == key && !all.iter().any(|o| o.id == st.id) => {
                    st.source = ExportSource::Api;
                    all.push(Arc::new(st));
                }
                Ok(st) => warn!(key, path = %st.path, "skipping a stored NFS export that duplicates another export"),
                Err(e) => warn!(key, "skipping a stored NFS export: {e}"),
            }
        }
        *self.inner.current.write().expect("export table lock") = Arc::new(all);
        Ok(())
    }

    /// The table as it is now.
    pub(crate) fn snapshot(&self) -> Arc<Vec<Arc<ExportState>>> {
        self.inner.current.read().expect("export table lock").clone()
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }

    /// Every export, configuration first, then the stored ones in id order.
    pub fn list(&self) -> Vec<ExportInfo> {
        self.snapshot().iter().map(|e| info(e)).collect()
    }

    /// One export by id (eight hex digits) or by path.
    pub fn get(&self, id_or_path: &str) -> Option<ExportInfo> {
        let want = if id_or_path.starts_with('/') { Some(normalise(id_or_path)) } else { None };
        self.snapshot()
            .iter()
            .find(|e| match &want {
                Some(p) => &e.path == p,
                None => id_string(e.id) == id_or_path.to_ascii_lowercase(),
            })
            .map(|e| info(e))
    }

    /// Adds an export (admin only). The directory must exist; a path that is already exported
    /// is a conflict. Stored durably, then applied.
    pub fn add(&self, caller: &Caller, export: Export) -> Result<ExportInfo, ExportError> {
        require_admin(caller)?;
        let st = prepare(export)?;
        let _g = self.inner.change.lock().expect("export change lock");
        if let Some(other) = self.snapshot().iter().find(|o| o.id == st.id) {
            return Err(ExportError::Conflict(if other.path == st.path {
                format!("{} is already exported (id {})", st.path, id_string(st.id))
            } else {
                format!("the id of {} collides with the export of {}", st.path, other.path)
            }));
        }
        let dir = self.inner.engine.resolve(&Caller::system(), &st.path)?;
        if dir.kind != FileKind::Dir {
            return Err(ExportError::Invalid(format!("{} is not a directory", st.path)));
        }
        self.store(caller, &st)?;
        self.reload().map_err(|e| ExportError::Engine(storage_engine::Error::Io(format!("{e:#}"))))?;
        Ok(info(&st).with_source(ExportSource::Api))
    }

    /// Changes an export added at run time (admin only).
    pub fn update(&self, caller: &Caller, id: &str, patch: ExportPatch) -> Result<ExportInfo, ExportError> {
        require_admin(caller)?;
        let _g = self.inner.change.lock().expect("export change lock");
        let cur = self.stored(id)?;
        let e = Export {
            path: cur.export.path.clone(),
            clients: patch.clients.unwrap_or_else(|| cur.export.clients.clone()),
            read_only: patch.read_only.unwrap_or(cur.export.read_only),
            root_squash: patch.root_squash.unwrap_or(cur.export.root_squash),
        };
        let st = prepare(e)?;
        self.store(caller, &st)?;
        self.reload().map_err(|e| ExportError::Engine(storage_engine::Error::Io(format!("{e:#}"))))?;
        Ok(info(&st).with_source(ExportSource::Api))
    }

    /// Removes an export added at run time (admin only); its handles become stale.
    pub fn remove(&self, caller: &Caller, id: &str) -> Result<(), ExportError> {
        require_admin(caller)?;
        let _g = self.inner.change.lock().expect("export change lock");
        let cur = self.stored(id)?;
        self.inner.engine.setting_delete(caller, EXPORT_SETTING_NS, &cur.id)?;
        self.reload().map_err(|e| ExportError::Engine(storage_engine::Error::Io(format!("{e:#}"))))?;
        Ok(())
    }

    /// The export `id` (or path) if it was added at run time.
    fn stored(&self, id: &str) -> Result<ExportInfo, ExportError> {
        let found = self.get(id).ok_or_else(|| ExportError::NotFound(id.to_string()))?;
        if found.source == ExportSource::Config {
            return Err(ExportError::Conflict(format!(
                "export {} ({}) comes from the configuration file: change it there and restart",
                found.id, found.export.path
            )));
        }
        Ok(found)
    }

    fn store(&self, caller: &Caller, st: &ExportState) -> Result<(), ExportError> {
        let rec = Record {
            path: st.path.clone(),
            clients: st.export.clients.clone(),
            read_only: st.export.read_only,
            root_squash: st.export.root_squash,
        };
        let value = serde_json::to_vec(&rec).expect("export record serialises");
        self.inner.engine.setting_put(caller, EXPORT_SETTING_NS, &id_string(st.id), &value)?;
        Ok(())
    }
}

fn info(e: &ExportState) -> ExportInfo {
    ExportInfo { id: id_string(e.id), export: e.export.clone(), source: e.source }
}

impl ExportInfo {
    fn with_source(mut self, s: ExportSource) -> ExportInfo {
        self.source = s;
        self
    }
}
