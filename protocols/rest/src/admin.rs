//! Admin API: health, tokens, drives, pools, capacity, the data cache, users, groups, jobs.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use storage_engine::{Error, JobState, Role};

use crate::auth::{Auth, blocking};
use crate::error::{ApiError, ApiResult};
use crate::extract::JsonBody;
use crate::wire;
use crate::{AppState, Routes};

pub(crate) fn routes(r: Routes) -> Routes {
    r.on(Method::GET, "/api/v1/health", health)
        .on(Method::POST, "/api/v1/auth/tokens", create_token)
        .on(Method::GET, "/api/v1/auth/tokens", list_tokens)
        .on(Method::DELETE, "/api/v1/auth/tokens/{id}", revoke_token)
        .on(Method::GET, "/api/v1/drives", list_drives)
        .on(Method::GET, "/api/v1/drives/{index}", get_drive)
        .on(Method::POST, "/api/v1/drives/{index}/replace", replace_drive)
        .on(Method::POST, "/api/v1/drives/{index}/fail", fail_drive)
        .on(Method::GET, "/api/v1/pools", list_pools)
        .on(Method::GET, "/api/v1/capacity", capacity)
        .on(Method::GET, "/api/v1/cache", data_cache)
        .on(Method::GET, "/api/v1/users", list_users)
        .on(Method::POST, "/api/v1/users", create_user)
        .on(Method::GET, "/api/v1/users/{name}", get_user)
        .on(Method::PATCH, "/api/v1/users/{name}", update_user)
        .on(Method::DELETE, "/api/v1/users/{name}", delete_user)
        .on(Method::POST, "/api/v1/users/{name}/s3-keys", create_s3_key)
        .on(Method::GET, "/api/v1/s3-keys", list_s3_keys)
        .on(Method::DELETE, "/api/v1/s3-keys/{access_key}", delete_s3_key)
        .on(Method::POST, "/api/v1/users/{name}/ssh-keys", add_ssh_key)
        .on(Method::GET, "/api/v1/users/{name}/ssh-keys", list_ssh_keys)
        .on(Method::DELETE, "/api/v1/users/{name}/ssh-keys/{id}", delete_ssh_key)
        .on(Method::GET, "/api/v1/groups", list_groups)
        .on(Method::POST, "/api/v1/groups", create_group)
        .on(Method::DELETE, "/api/v1/groups/{name}", delete_group)
        .on(Method::GET, "/api/v1/jobs", list_jobs)
        .on(Method::POST, "/api/v1/jobs", create_job)
        .on(Method::GET, "/api/v1/jobs/{id}", get_job)
        .on(Method::POST, "/api/v1/jobs/{id}/cancel", cancel_job)
}

fn parse_role(s: &str) -> ApiResult<Role> {
    Role::parse(s).ok_or_else(|| ApiError::bad_request(format!("unknown role {s:?}: use user, read-only, operator or admin")))
}

fn parse_u32(what: &str, s: &str) -> ApiResult<u32> {
    s.parse().map_err(|_| ApiError::bad_request(format!("{what} must be a number, not {s:?}")))
}

fn parse_u64(what: &str, s: &str) -> ApiResult<u64> {
    s.parse().map_err(|_| ApiError::bad_request(format!("{what} must be a number, not {s:?}")))
}

// ------------------------------------------------------------------ S3 and SSH keys

/// Issues an S3 key pair for a user (admins for anybody, users for themselves); the secret is
/// shown this once. A body with both fields stores a given pair instead.
async fn create_s3_key(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<wire::S3KeyIssued>)> {
    let req: wire::NewS3Key = if body.is_empty() {
        wire::NewS3Key::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?
    };
    let engine = st.engine.clone();
    let (access_key, secret_key) = blocking(move || {
        let pair = match (&req.access_key, &req.secret_key) {
            (Some(a), Some(s)) => Some((a.as_str(), s.as_str())),
            (None, None) => None,
            _ => return Err(Error::InvalidArgument("give both access_key and secret_key, or neither".into())),
        };
        engine.create_s3_key(&caller, &name, pair)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(wire::S3KeyIssued { access_key, secret_key })))
}

async fn list_s3_keys(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<wire::S3Key>>> {
    let engine = st.engine.clone();
    let v = blocking(move || engine.list_s3_keys(&caller)).await?;
    Ok(Json(v.into_iter().map(|k| wire::S3Key { access_key: k.access_key, user: k.user, created_ns: k.created_ns }).collect()))
}

async fn delete_s3_key(State(st): State<AppState>, Auth(caller): Auth, Path(access): Path<String>) -> ApiResult<StatusCode> {
    let engine = st.engine.clone();
    blocking(move || engine.delete_s3_key(&caller, &access)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn add_ssh_key(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<wire::NewSshKey>,
) -> ApiResult<(StatusCode, Json<wire::SshKey>)> {
    let engine = st.engine.clone();
    let key = req.key.clone();
    let id = blocking(move || engine.add_ssh_key(&caller, &name, &req.key)).await?;
    Ok((StatusCode::CREATED, Json(wire::SshKey { id, key: key.trim().to_string() })))
}

async fn list_ssh_keys(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>) -> ApiResult<Json<Vec<wire::SshKey>>> {
    if caller.user != name && caller.role < Role::ReadOnly {
        return Err(Error::PermissionDenied.into());
    }
    let engine = st.engine.clone();
    let v = blocking(move || engine.ssh_keys_of(&name)).await?;
    Ok(Json(v.into_iter().map(|(id, key)| wire::SshKey { id, key }).collect()))
}

async fn delete_ssh_key(State(st): State<AppState>, Auth(caller): Auth, Path((name, id)): Path<(String, String)>) -> ApiResult<StatusCode> {
    let engine = st.engine.clone();
    blocking(move || engine.delete_ssh_key(&caller, &name, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------------ health

/// Served without authentication so that load balancers and monitors can poll it.
async fn health(State(st): State<AppState>) -> ApiResult<Json<wire::Health>> {
    let engine = st.engine.clone();
    let h = blocking(move || Ok(engine.health())).await?;
    Ok(Json(wire::Health::from(&h)))
}

// ------------------------------------------------------------------ tokens

async fn create_token(
    State(st): State<AppState>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<wire::NewToken>,
) -> ApiResult<(StatusCode, Json<wire::TokenIssued>)> {
    let role = req.role.as_deref().map(parse_role).transpose()?;
    let engine = st.engine.clone();
    let (token, info) = blocking(move || {
        engine.create_token(&caller, req.user.as_deref(), role, req.ttl_secs, req.label.as_deref().unwrap_or(""))
    })
    .await?;
    Ok((StatusCode::CREATED, Json(wire::TokenIssued { token, info: wire::Token::from(&info) })))
}

async fn list_tokens(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<wire::Token>>> {
    let engine = st.engine.clone();
    let v = blocking(move || engine.list_tokens(&caller)).await?;
    Ok(Json(v.iter().map(wire::Token::from).collect()))
}

async fn revoke_token(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let engine = st.engine.clone();
    blocking(move || engine.revoke_token(&caller, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------------ drives, pools, capacity

async fn list_drives(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<wire::Drive>>> {
    auth.require(Role::ReadOnly)?;
    let engine = st.engine.clone();
    let v = blocking(move || Ok(engine.drives())).await?;
    Ok(Json(v.iter().map(wire::Drive::from).collect()))
}

async fn drive_by_index(st: &AppState, index: u32) -> ApiResult<wire::Drive> {
    let engine = st.engine.clone();
    let v = blocking(move || Ok(engine.drives())).await?;
    v.iter().find(|d| d.index == index).map(wire::Drive::from).ok_or_else(|| Error::NotFound.into())
}

async fn get_drive(State(st): State<AppState>, auth: Auth, Path(index): Path<String>) -> ApiResult<Json<wire::Drive>> {
    auth.require(Role::ReadOnly)?;
    let index = parse_u32("drive index", &index)?;
    Ok(Json(drive_by_index(&st, index).await?))
}

async fn replace_drive(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(index): Path<String>,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<wire::JobStarted>)> {
    let index = parse_u32("drive index", &index)?;
    // The body is optional: an empty one replaces the drive in place.
    let req: wire::ReplaceDrive = if body.iter().all(u8::is_ascii_whitespace) {
        wire::ReplaceDrive::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", e.to_string()))?
    };
    let engine = st.engine.clone();
    let job_id = blocking(move || engine.replace_drive(&caller, index, req.path.map(Into::into), req.size_bytes)).await?;
    Ok((StatusCode::ACCEPTED, Json(wire::JobStarted { job_id })))
}

async fn fail_drive(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(index): Path<String>,
    JsonBody(req): JsonBody<wire::FailDrive>,
) -> ApiResult<Json<wire::Drive>> {
    let index = parse_u32("drive index", &index)?;
    let engine = st.engine.clone();
    blocking(move || engine.fail_drive(&caller, index, &req.reason)).await?;
    Ok(Json(drive_by_index(&st, index).await?))
}

async fn list_pools(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<wire::Pool>>> {
    auth.require(Role::ReadOnly)?;
    let engine = st.engine.clone();
    let v = blocking(move || Ok(engine.pools())).await?;
    Ok(Json(v.iter().map(wire::Pool::from).collect()))
}

async fn capacity(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<wire::Capacity>> {
    auth.require(Role::ReadOnly)?;
    let engine = st.engine.clone();
    let caller = auth.0;
    let s = blocking(move || engine.statfs(&caller)).await?;
    Ok(Json(wire::Capacity::from(&s)))
}

async fn data_cache(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<wire::DataCache>> {
    auth.require(Role::ReadOnly)?;
    Ok(Json(wire::DataCache::from(&st.engine.data_cache_stats())))
}

// ------------------------------------------------------------------ users, groups

async fn list_users(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<wire::User>>> {
    let engine = st.engine.clone();
    let v = blocking(move || engine.list_users(&caller)).await?;
    Ok(Json(v.iter().map(wire::User::from).collect()))
}

async fn create_user(
    State(st): State<AppState>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<wire::NewUser>,
) -> ApiResult<(StatusCode, Json<wire::User>)> {
    let role = req.role.as_deref().map(parse_role).transpose()?;
    let new = storage_engine::NewUser { name: req.name, password: req.password, uid: req.uid, gid: req.gid, groups: req.groups, role };
    let engine = st.engine.clone();
    let u = blocking(move || engine.create_user(&caller, new)).await?;
    Ok((StatusCode::CREATED, Json(wire::User::from(&u))))
}

async fn get_user(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>) -> ApiResult<Json<wire::User>> {
    let engine = st.engine.clone();
    let u = blocking(move || engine.get_user(&caller, &name)).await?;
    Ok(Json(wire::User::from(&u)))
}

async fn update_user(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(name): Path<String>,
    JsonBody(req): JsonBody<wire::UserPatch>,
) -> ApiResult<Json<wire::User>> {
    let role = req.role.as_deref().map(parse_role).transpose()?;
    let upd = storage_engine::UserUpdate { password: req.password, groups: req.groups, role, disabled: req.disabled };
    let engine = st.engine.clone();
    let u = blocking(move || engine.update_user(&caller, &name, upd)).await?;
    Ok(Json(wire::User::from(&u)))
}

async fn delete_user(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let engine = st.engine.clone();
    blocking(move || engine.delete_user(&caller, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list_groups(State(st): State<AppState>, Auth(caller): Auth) -> ApiResult<Json<Vec<wire::Group>>> {
    let engine = st.engine.clone();
    let v = blocking(move || engine.list_groups(&caller)).await?;
    Ok(Json(v.iter().map(wire::Group::from).collect()))
}

async fn create_group(
    State(st): State<AppState>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<wire::NewGroup>,
) -> ApiResult<(StatusCode, Json<wire::Group>)> {
    let engine = st.engine.clone();
    let g = blocking(move || engine.create_group(&caller, &req.name, req.gid)).await?;
    Ok((StatusCode::CREATED, Json(wire::Group::from(&g))))
}

async fn delete_group(State(st): State<AppState>, Auth(caller): Auth, Path(name): Path<String>) -> ApiResult<StatusCode> {
    let engine = st.engine.clone();
    blocking(move || engine.delete_group(&caller, &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------------ jobs

async fn list_jobs(State(st): State<AppState>, auth: Auth) -> ApiResult<Json<Vec<wire::Job>>> {
    auth.require(Role::ReadOnly)?;
    let engine = st.engine.clone();
    let v = blocking(move || engine.list_jobs()).await?;
    Ok(Json(v.iter().map(wire::Job::from).collect()))
}

async fn create_job(
    State(st): State<AppState>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<wire::NewJob>,
) -> ApiResult<(StatusCode, Json<wire::JobStarted>)> {
    let rate = req.bytes_per_sec_max.unwrap_or(0);
    let engine = st.engine.clone();
    let job_id = match req.kind.as_str() {
        "scrub" => {
            if req.drive.is_some() {
                return Err(ApiError::bad_request("a scrub covers every drive; do not name one"));
            }
            blocking(move || engine.start_scrub(&caller, rate)).await?
        }
        "rebuild" => {
            let drive = req.drive.ok_or_else(|| ApiError::bad_request("a rebuild needs \"drive\""))?;
            blocking(move || engine.start_rebuild(&caller, drive, rate)).await?
        }
        other => return Err(ApiError::bad_request(format!("unknown job kind {other:?}: use scrub or rebuild"))),
    };
    Ok((StatusCode::ACCEPTED, Json(wire::JobStarted { job_id })))
}

async fn job_by_id(st: &AppState, id: u64) -> ApiResult<wire::Job> {
    let engine = st.engine.clone();
    let j = blocking(move || engine.job(id)).await?;
    Ok(wire::Job::from(&j))
}

async fn get_job(State(st): State<AppState>, auth: Auth, Path(id): Path<String>) -> ApiResult<Json<wire::Job>> {
    auth.require(Role::ReadOnly)?;
    let id = parse_u64("job id", &id)?;
    Ok(Json(job_by_id(&st, id).await?))
}

async fn cancel_job(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Json<wire::Job>> {
    let id = parse_u64("job id", &id)?;
    if caller.role < Role::Operator {
        return Err(ApiError::forbidden());
    }
    let engine = st.engine.clone();
    blocking(move || {
        // Only a running job is handed to the engine: `Engine::cancel_job` on a job that is
        // not running deadlocks on its job table (reported to the storage-engine owner).
        let job = engine.job(id)?;
        if job.state != JobState::Running {
            return Err(Error::InvalidArgument(format!("job {id} is not running")));
        }
        engine.cancel_job(&caller, id)
    })
    .await?;
    Ok(Json(job_by_id(&st, id).await?))
}
