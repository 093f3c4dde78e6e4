//! Admin API for per-user SFTP chroots: `/api/v1/sftp/chroots`.
//!
//! A chroot is an engine setting that the SFTP service reads at each session start, so this
//! module changes it through the engine's `sftp_chroot_*` calls alone, the same ones the SFTP
//! crate uses (this crate does not depend on it, DESIGN.md §2), and a change applies from the
//! user's next login whether or not the SFTP service is running now.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use storage_engine::{Error, Role};

use crate::auth::{Auth, audited, blocking};
use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::openapi::{Op, array_of_any, object_schema, op, path_param};
use crate::{AppState, Routes};

/// A chroot as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ChrootView {
    pub user: String,
    /// The directory the user's SFTP sessions see as `/`, absolute and normalised.
    pub path: String,
}

/// Body of `PUT /api/v1/sftp/chroots/{user}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetChroot {
    pub path: String,
}

pub(crate) fn routes(r: Routes) -> Routes {
    r.on(Method::GET, "/api/v1/sftp/chroots", list_chroots)
        .on(Method::GET, "/api/v1/sftp/chroots/{user}", get_chroot)
        .on(Method::PUT, "/api/v1/sftp/chroots/{user}", set_chroot)
        .on(Method::DELETE, "/api/v1/sftp/chroots/{user}", remove_chroot)
}

pub(crate) fn operations() -> Vec<Op> {
    let user = || vec![path_param("user", "user name")];
    vec![
        op("get", "/api/v1/sftp/chroots", "sftp", "Per-user SFTP chroots [{user, path}] (admin role)").ok("200", "chroots", Some(array_of_any())),
        op("get", "/api/v1/sftp/chroots/{user}", "sftp", "One user's SFTP chroot {user, path} (admin role)")
            .params(user())
            .ok("200", "chroot", Some(object_schema())),
        op("put", "/api/v1/sftp/chroots/{user}", "sftp", "Confine a user's SFTP sessions to a directory {path}: absolute, stored normalised, must be a directory (no symlinks); applies from the user's next login (admin role)")
            .params(user())
            .body(object_schema())
            .ok("200", "chroot set", Some(object_schema())),
        op("delete", "/api/v1/sftp/chroots/{user}", "sftp", "Lift a user's SFTP chroot; the next login sees the whole namespace again (admin role)")
            .params(user())
            .ok("204", "removed", None),
    ]
}

fn no_chroot(user: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("user {user} has no SFTP chroot"))
}

async fn list_chroots(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<ChrootView>>> {
    auth.require(Role::Admin)?;
    let all = blocking(move || st.engine.sftp_chroots()).await?;
    Ok(Json(all.into_iter().map(|(user, path)| ChrootView { user, path }).collect()))
}

async fn get_chroot(State(st): State<AppState>, auth: Auth, Path(user): Path<String>) -> ApiResult<Json<ChrootView>> {
    auth.require(Role::Admin)?;
    let u = user.clone();
    match blocking(move || st.engine.sftp_chroot(&u)).await? {
        Some(path) => Ok(Json(ChrootView { user, path })),
        None => Err(no_chroot(&user)),
    }
}

async fn set_chroot(State(st): State<AppState>, Auth(caller): Auth, Path(user): Path<String>, JsonBody(body): JsonBody<SetChroot>) -> ApiResult<Json<ChrootView>> {
    let engine = st.engine.clone();
    let u = user.clone();
    let path = audited(st.engine, caller, "sftp.chroot.set", format!("{user} {}", body.path), move |c| {
        // The user is looked up first so that a missing user and a missing directory, both
        // NotFound in the engine, get different messages.
        match engine.get_user(c, &u) {
            Err(Error::NotFound) => return Err(ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("no user {u}"))),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        engine.sftp_chroot_set(c, &u, &body.path).map_err(|e| match e {
            Error::NotFound => ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("{} does not exist", body.path)),
            Error::NotDir => ApiError::bad_request(format!("{} is not a directory", body.path)),
            e => e.into(),
        })
    })
    .await?;
    Ok(Json(ChrootView { user, path }))
}

async fn remove_chroot(State(st): State<AppState>, Auth(caller): Auth, Path(user): Path<String>) -> ApiResult<StatusCode> {
    let engine = st.engine.clone();
    let u = user.clone();
    audited(st.engine, caller, "sftp.chroot.remove", user, move |c| {
        engine.sftp_chroot_remove(c, &u).map_err(|e| if matches!(e, Error::NotFound) { no_chroot(&u) } else { e.into() })
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
