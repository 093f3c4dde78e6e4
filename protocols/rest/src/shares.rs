//! Admin API for SMB shares: `/api/v1/shares`.
//!
//! The SMB service owns the share table (this crate does not depend on it, DESIGN.md §2): the
//! daemon hands the router a [`ShareAdmin`] over the table, which keeps shares added here in
//! the engine's settings; the running SMB server applies every change at once. Shares from
//! the configuration file are listed too but can only be changed there. Without a
//! [`ShareAdmin`] (the REST API alone, in tests) the routes answer 503.

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

/// A share as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ShareView {
    /// What clients connect to (`\\server\name`); case-insensitive.
    pub name: String,
    /// The directory of the namespace it shows.
    pub path: String,
    pub read_only: bool,
    /// Sessions without an account connect, as nobody/nogroup.
    pub guest: bool,
    /// Only encrypted SMB 3 sessions connect.
    pub encrypt: bool,
    /// SMB2 leases and durable handles (client caching).
    pub leases: bool,
    /// `config` (the configuration file, read-only here) or `api`.
    pub source: String,
}

/// Body of `POST /api/v1/shares`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewShare {
    pub name: String,
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub guest: bool,
    #[serde(default)]
    pub encrypt: bool,
    #[serde(default)]
    pub leases: bool,
}

/// Body of `PATCH /api/v1/shares/{name}`: absent fields keep their value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareChange {
    pub path: Option<String>,
    pub read_only: Option<bool>,
    pub guest: Option<bool>,
    pub encrypt: Option<bool>,
    pub leases: Option<bool>,
}

/// A refusal: HTTP status and message.
pub type ShareResult<T> = Result<T, (u16, String)>;

/// What the REST API needs from the SMB service. Calls may block on the metadata store.
pub trait ShareAdmin: Send + Sync + 'static {
    fn list(&self) -> Vec<ShareView>;
    /// By name, in any case.
    fn get(&self, name: &str) -> Option<ShareView>;
    fn add(&self, caller: &Caller, new: NewShare) -> ShareResult<ShareView>;
    fn change(&self, caller: &Caller, name: &str, change: ShareChange) -> ShareResult<ShareView>;
    fn remove(&self, caller: &Caller, name: &str) -> ShareResult<()>;
}

pub(crate) fn routes(r: Routes) -> Routes {
    r.on(Method::GET, "/api/v1/shares", list_shares)
        .on(Method::POST, "/api/v1/shares", add_share)
        .on(Method::GET, "/api/v1/shares/{name}", get_share)
        .on(Method::PATCH, "/api/v1/shares/{name}", change_share)
        .on(Method::DELETE, "/api/v1/shares/{name}", remove_share)
}

pub(crate) fn operations() -> Vec<Op> {
    let name = || vec![path_param("name", "share name (any case)")];
    vec![
        op("get", "/api/v1/shares", "shares", "SMB shares, from the configuration file and added here (admin role)")
            .ok("200", "shares", Some(array_of_any())),
        op("post", "/api/v1/shares", "shares", "Share a directory over SMB {name, path, read_only, guest, encrypt, leases (all false by default)}; served at once (admin role)")
            .body(object_schema())
            .ok("201", "share added", Some(object_schema())),
        op("get", "/api/v1/shares/{name}", "shares", "One SMB share (admin role)").params(name()).ok("200", "share", Some(object_schema())),
        op("patch", "/api/v1/shares/{name}", "shares", "Change a share added here {path, read_only, guest, encrypt, leases}; its connections are closed and reconnect under the new settings (admin role)")
            .params(name())
            .body(object_schema())
            .ok("200", "share", Some(object_schema())),
        op("delete", "/api/v1/shares/{name}", "shares", "Remove a share added here; its connections and open files are closed (admin role)")
            .params(name())
            .ok("204", "removed", None),
    ]
}

fn table(st: &AppState) -> ApiResult<Arc<dyn ShareAdmin>> {
    st.shares.clone().ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the SMB share table is not available"))
}

async fn list_shares(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<ShareView>>> {
    auth.require(Role::Admin)?;
    let t = table(&st)?;
    Ok(Json(blocking(move || Ok(t.list())).await?))
}

async fn get_share(State(st): State<AppState>, auth: Auth, Path(name): Path<String>) -> ApiResult<Json<ShareView>> {
    auth.require(Role::Admin)?;
    let t = table(&st)?;
    let key = name.clone();
    blocking(move || Ok(t.get(&key)))
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no share {name}")))
}

/// Runs a change of the table as an admin, recorded in the audit log whatever its outcome.
async fn change<T: Send + 'static>(
    st: &AppState,
    caller: Caller,
    action: &'static str,
    target: String,
    f: impl FnOnce(&dyn ShareAdmin, &Caller) -> ShareResult<T> + Send + 'static,
) -> ApiResult<T> {
    if caller.role < Role::Admin {
        return Err(ApiError::forbidden());
    }
    let t = table(st)?;
    crate::auth::audited(st.engine.clone(), caller, action, target, move |c| f(t.as_ref(), c).map_err(failure)).await
}

async fn add_share(State(st): State<AppState>, Auth(caller): Auth, JsonBody(new): JsonBody<NewShare>) -> ApiResult<(StatusCode, Json<ShareView>)> {
    let v = change(&st, caller, "smb.share.add", new.name.clone(), move |t, c| t.add(c, new)).await?;
    Ok((StatusCode::CREATED, Json(v)))
}

async fn change_share(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>, JsonBody(c): JsonBody<ShareChange>) -> ApiResult<Json<ShareView>> {
    let v = change(&st, caller, "smb.share.change", name.clone(), move |t, caller| t.change(caller, &name, c)).await?;
    Ok(Json(v))
}

async fn remove_share(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>) -> ApiResult<StatusCode> {
    change(&st, caller, "smb.share.remove", name.clone(), move |t, c| t.remove(c, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
