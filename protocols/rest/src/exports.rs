//! Admin API for NFS exports: `/api/v1/exports`.
//!
//! The NFS service owns the export table (this crate does not depend on it, DESIGN.md §2): the
//! daemon hands the router an [`ExportAdmin`] over the live table, which keeps exports added
//! here in the engine's settings and applies every change to the running service. Exports
//! from the configuration file are listed too but can only be changed there. Without an
//! [`ExportAdmin`] (the REST API alone, in tests) the routes answer 503.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use storage_engine::{Caller, Role};

use crate::auth::{Auth, blocking};
use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::openapi::{Op, array_of_any, object_schema, op, path_param};
use crate::portals::failure;
use crate::{AppState, Routes};

/// An export as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ExportView {
    /// Eight hex digits, derived from the path (and carried in the export's file handles).
    pub id: String,
    pub path: String,
    /// `*`, addresses (`10.0.0.5`) and networks (`10.0.0.0/8`).
    pub clients: Vec<String>,
    pub read_only: bool,
    pub root_squash: bool,
    /// `config` (the configuration file, read-only here) or `api`.
    pub source: String,
}

/// Body of `POST /api/v1/exports`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewExport {
    pub path: String,
    pub clients: Vec<String>,
    #[serde(default)]
    pub read_only: bool,
    /// On unless turned off, as with the Linux server.
    #[serde(default = "yes")]
    pub root_squash: bool,
}

fn yes() -> bool {
    true
}

/// Body of `PATCH /api/v1/exports/{id}`: absent fields keep their value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportChange {
    pub clients: Option<Vec<String>>,
    pub read_only: Option<bool>,
    pub root_squash: Option<bool>,
}

/// A refusal: HTTP status and message.
pub type ExportResult<T> = Result<T, (u16, String)>;

/// What the REST API needs from the NFS service. Calls may block on the metadata store.
pub trait ExportAdmin: Send + Sync + 'static {
    fn list(&self) -> Vec<ExportView>;
    /// By id or by path.
    fn get(&self, id: &str) -> Option<ExportView>;
    fn add(&self, caller: &Caller, new: NewExport) -> ExportResult<ExportView>;
    fn change(&self, caller: &Caller, id: &str, change: ExportChange) -> ExportResult<ExportView>;
    fn remove(&self, caller: &Caller, id: &str) -> ExportResult<()>;
}

pub(crate) fn routes(r: Routes) -> Routes {
    r.on(Method::GET, "/api/v1/exports", list_exports)
        .on(Method::POST, "/api/v1/exports", add_export)
        .on(Method::GET, "/api/v1/exports/{id}", get_export)
        .on(Method::PATCH, "/api/v1/exports/{id}", change_export)
        .on(Method::DELETE, "/api/v1/exports/{id}", remove_export)
}

pub(crate) fn operations() -> Vec<Op> {
    let id = || vec![path_param("id", "export id (eight hex digits)")];
    vec![
        op("get", "/api/v1/exports", "exports", "NFS exports, from the configuration file and added here (admin role)")
            .ok("200", "exports", Some(array_of_any())),
        op("post", "/api/v1/exports", "exports", "Export a directory over NFS {path, clients: [\"*\" | address | network], read_only (false), root_squash (true)}; applied at once (admin role)")
            .body(object_schema())
            .ok("201", "export added", Some(object_schema())),
        op("get", "/api/v1/exports/{id}", "exports", "One NFS export (admin role)").params(id()).ok("200", "export", Some(object_schema())),
        op("patch", "/api/v1/exports/{id}", "exports", "Change an export added here {clients, read_only, root_squash}; mounted clients are held to it at their next call (admin role)")
            .params(id())
            .body(object_schema())
            .ok("200", "export", Some(object_schema())),
        op("delete", "/api/v1/exports/{id}", "exports", "Remove an export added here; its file handles become stale (admin role)")
            .params(id())
            .ok("204", "removed", None),
    ]
}

fn table(st: &AppState) -> ApiResult<Arc<dyn ExportAdmin>> {
    st.exports.clone().ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the NFS service is not running"))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no export {id}"))
}

async fn list_exports(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<ExportView>>> {
    auth.require(Role::Admin)?;
    let t = table(&st)?;
    Ok(Json(blocking(move || Ok(t.list())).await?))
}

async fn get_export(State(st): State<AppState>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<ExportView>> {
    auth.require(Role::Admin)?;
    let t = table(&st)?;
    let key = id.clone();
    blocking(move || Ok(t.get(&key))).await?.map(Json).ok_or_else(|| not_found(&id))
}

/// Runs a change of the table as an admin, recorded in the audit log whatever its outcome.
async fn audited<T: Send + 'static>(
    st: &AppState,
    caller: Caller,
    action: &'static str,
    target: String,
    f: impl FnOnce(&dyn ExportAdmin, &Caller) -> ExportResult<T> + Send + 'static,
) -> ApiResult<T> {
    if caller.role < Role::Admin {
        return Err(ApiError::forbidden());
    }
    let t = table(st)?;
    crate::auth::audited(st.engine.clone(), caller, action, target, move |c| f(t.as_ref(), c).map_err(failure)).await
}

async fn add_export(State(st): State<AppState>, Auth(caller): Auth, JsonBody(new): JsonBody<NewExport>) -> ApiResult<(StatusCode, Json<ExportView>)> {
    let v = audited(&st, caller, "nfs.export.add", new.path.clone(), move |t, c| t.add(c, new)).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

async fn change_export(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>, JsonBody(change): JsonBody<ExportChange>) -> ApiResult<Json<ExportView>> {
    let v = audited(&st, caller, "nfs.export.change", id.clone(), move |t, c| t.change(c, &id, change)).await?;
    Ok(Json(v))
}

async fn remove_export(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<StatusCode> {
    audited(&st, caller, "nfs.export.remove", id.clone(), move |t, c| t.remove(c, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}
