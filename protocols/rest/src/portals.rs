//! Admin API for portals, residency labels and the audit log.
//!
//! Portals are run by the fabric, which this crate does not depend on (DESIGN.md §2): the
//! daemon hands the router a [`PortalAdmin`] implemented on top of the fabric. Without one
//! (e.g. tests of the file API alone) the portal routes answer 503.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};
use storage_engine::{AUDIT_PAGE_MAX, Caller, Role};

use crate::auth::{Auth, blocking};
use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::openapi::{Op, array_of_any, object_schema, op, path_param, query_param};
use crate::paths::{FsPath, walk};
use crate::{AppState, Routes};

/// The extended attribute holding a directory's residency label.
pub const RESIDENCY_XATTR: &[u8] = b"trusted.aquifer.residency";

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A failure with an HTTP status and a message.
pub type PortalResult = Result<Value, (u16, String)>;

/// What the REST API needs from the fabric.
pub trait PortalAdmin: Send + Sync + 'static {
    /// This cluster's fabric identity: fingerprint, region, listener.
    fn identity(&self) -> Value;
    fn list(&self) -> Vec<Value>;
    fn get(&self, id: &str) -> Option<Value>;
    /// Spoke: propose a portal to a hub (body: hub, hub_path, spoke_path, mode, ...).
    fn create(&self, caller: Caller, body: Value) -> BoxFuture<PortalResult>;
    /// Hub: accept a pending portal.
    fn authorize(&self, caller: Caller, id: String) -> PortalResult;
    fn delete(&self, caller: Caller, id: String) -> BoxFuture<PortalResult>;
    /// Change settings (serve_stale).
    fn patch(&self, caller: Caller, id: String, body: Value) -> PortalResult;
}

pub(crate) fn routes(r: Routes) -> Routes {
    r.on(Method::GET, "/api/v1/fabric", fabric_identity)
        .on(Method::GET, "/api/v1/portals", list_portals)
        .on(Method::POST, "/api/v1/portals", create_portal)
        .on(Method::GET, "/api/v1/portals/{id}", get_portal)
        .on(Method::PATCH, "/api/v1/portals/{id}", patch_portal)
        .on(Method::DELETE, "/api/v1/portals/{id}", delete_portal)
        .on(Method::POST, "/api/v1/portals/{id}/authorize", authorize_portal)
        .on(Method::GET, "/api/v1/residency/{*path}", get_residency)
        .on(Method::PUT, "/api/v1/residency/{*path}", put_residency)
        .on(Method::DELETE, "/api/v1/residency/{*path}", delete_residency)
        .on(Method::GET, "/api/v1/audit", list_audit)
}

pub(crate) fn operations() -> Vec<Op> {
    let id = || vec![path_param("id", "portal id")];
    let dpath = || vec![path_param("path", "directory path below the root, '/'-separated, percent-encoded per component")];
    vec![
        op("get", "/api/v1/fabric", "portals", "This cluster's fabric identity: certificate fingerprint, region, listener (read-only role)")
            .ok("200", "identity", Some(object_schema())),
        op("get", "/api/v1/portals", "portals", "Portals this cluster is hub or spoke of, with state and live figures (read-only role)")
            .ok("200", "portals", Some(array_of_any())),
        op("post", "/api/v1/portals", "portals", "Spoke: propose a portal to a hub {hub, hub_path, spoke_path, mode: ro|rw, serve_stale, hub_fingerprint} (admin role)")
            .body(object_schema())
            .ok("201", "portal proposed, pending on the hub", Some(object_schema())),
        op("get", "/api/v1/portals/{id}", "portals", "One portal (read-only role)").params(id()).ok("200", "portal", Some(object_schema())),
        op("patch", "/api/v1/portals/{id}", "portals", "Change a portal's settings {serve_stale} (admin role)")
            .params(id())
            .body(object_schema())
            .ok("200", "portal", Some(object_schema())),
        op("delete", "/api/v1/portals/{id}", "portals", "Delete a portal; on a spoke its cached data is reclaimed (admin role)")
            .params(id())
            .ok("204", "deleted", None),
        op("post", "/api/v1/portals/{id}/authorize", "portals", "Hub: authorize a pending portal (admin role)")
            .params(id())
            .ok("200", "portal", Some(object_schema())),
        op("get", "/api/v1/residency/{path}", "residency", "A directory's residency label (read-only role)")
            .params(dpath())
            .ok("200", "label", Some(object_schema())),
        op("put", "/api/v1/residency/{path}", "residency", "Label a directory {label: region[,region...]} (admin role)")
            .params(dpath())
            .body(object_schema())
            .ok("200", "label", Some(object_schema())),
        op("delete", "/api/v1/residency/{path}", "residency", "Remove a directory's residency label (admin role)")
            .params(dpath())
            .ok("204", "removed", None),
        op("get", "/api/v1/audit", "audit", "Audit records after a sequence number, oldest first (operator role)")
            .params(vec![query_param("after", "integer", "sequence number to start after"), query_param("limit", "integer", "at most this many")])
            .ok("200", "records", Some(array_of_any())),
    ]
}

fn fabric(st: &AppState) -> ApiResult<Arc<dyn PortalAdmin>> {
    st.portals.clone().ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "the fabric is not running"))
}

pub(crate) fn failure((status, message): (u16, String)) -> ApiError {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let code = match status.as_u16() {
        400 => "invalid_argument",
        403 => "permission_denied",
        404 => "not_found",
        409 => "conflict",
        502 => "bad_gateway",
        503 => "unavailable",
        _ => "internal",
    };
    ApiError::new(status, code, message)
}

async fn fabric_identity(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Value>> {
    auth.require(Role::ReadOnly)?;
    Ok(Json(fabric(&st)?.identity()))
}

async fn list_portals(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<Value>>> {
    auth.require(Role::ReadOnly)?;
    Ok(Json(fabric(&st)?.list()))
}

async fn get_portal(State(st): State<AppState>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    auth.require(Role::ReadOnly)?;
    fabric(&st)?.get(&id).map(Json).ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no portal {id}")))
}

async fn create_portal(State(st): State<AppState>, Auth(caller): Auth, JsonBody(body): JsonBody<Value>) -> ApiResult<(StatusCode, Json<Value>)> {
    let v = fabric(&st)?.create(caller, body).await.map_err(failure)?;
    Ok((StatusCode::CREATED, Json(v)))
}

async fn patch_portal(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>, JsonBody(body): JsonBody<Value>) -> ApiResult<Json<Value>> {
    Ok(Json(fabric(&st)?.patch(caller, id, body).map_err(failure)?))
}

async fn delete_portal(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<StatusCode> {
    fabric(&st)?.delete(caller, id).await.map_err(failure)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn authorize_portal(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Json<Value>> {
    Ok(Json(fabric(&st)?.authorize(caller, id).map_err(failure)?))
}

// ------------------------------------------------------------------ residency

async fn get_residency(State(st): State<AppState>, Auth(caller): Auth, Path(raw): Path<String>) -> ApiResult<Json<Value>> {
    let path = FsPath::from_url(&raw)?;
    let engine = st.engine.clone();
    let shown = path.display();
    let label = blocking(move || {
        let a = walk(&engine, &caller, &path.comps)?;
        match engine.getxattr(&Caller::system(), a.ino, RESIDENCY_XATTR) {
            Ok(v) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
            Err(storage_engine::Error::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await?;
    Ok(Json(json!({ "path": shown, "label": label })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Label {
    label: String,
}

async fn put_residency(State(st): State<AppState>, Auth(caller): Auth, Path(raw): Path<String>, JsonBody(req): JsonBody<Label>) -> ApiResult<Json<Value>> {
    if caller.role < Role::Admin {
        return Err(ApiError::forbidden());
    }
    let label = req.label.trim().to_string();
    if label.is_empty() || label.len() > 255 || !label.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_,*".contains(&b)) {
        return Err(ApiError::bad_request("a label is one or more region names (letters, digits, '-', '_') separated by ','"));
    }
    let path = FsPath::from_url(&raw)?;
    let shown = path.display();
    let engine = st.engine.clone();
    let l = label.clone();
    let user = caller.user.clone();
    blocking(move || {
        let a = walk(&engine, &caller, &path.comps)?;
        if a.kind != storage_engine::FileKind::Dir {
            return Err(storage_engine::Error::NotDir);
        }
        engine.setxattr(&caller, a.ino, RESIDENCY_XATTR, l.as_bytes())?;
        engine.audit(&user, "rest", "residency.set", &path.display(), &format!("region={l}"))?;
        Ok(())
    })
    .await?;
    Ok(Json(json!({ "path": shown, "label": label })))
}

async fn delete_residency(State(st): State<AppState>, Auth(caller): Auth, Path(raw): Path<String>) -> ApiResult<StatusCode> {
    if caller.role < Role::Admin {
        return Err(ApiError::forbidden());
    }
    let path = FsPath::from_url(&raw)?;
    let engine = st.engine.clone();
    let user = caller.user.clone();
    blocking(move || {
        let a = walk(&engine, &caller, &path.comps)?;
        engine.removexattr(&caller, a.ino, RESIDENCY_XATTR)?;
        engine.audit(&user, "rest", "residency.remove", &path.display(), "ok")?;
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------------ audit

#[derive(Deserialize)]
struct AuditQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

async fn list_audit(State(st): State<AppState>, Auth(caller): Auth, Query(q): Query<AuditQuery>) -> ApiResult<Json<Vec<Value>>> {
    let engine = st.engine.clone();
    let recs = blocking(move || engine.audit_list(&caller, q.after.unwrap_or(0), q.limit.unwrap_or(1000).min(AUDIT_PAGE_MAX))).await?;
    Ok(Json(
        recs.into_iter()
            .map(|r| json!({ "seq": r.seq, "time_ns": r.time_ns, "user": r.user, "protocol": r.protocol, "action": r.action, "target": r.target, "outcome": r.outcome }))
            .collect(),
    ))
}
