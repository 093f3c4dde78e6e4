//! REST file API: `/api/v1/files/{path}` (put, get with ranges, head, delete, rename) and
//! `/api/v1/dirs/{path}` (list, mkdir, rmdir).
//!
//! Uploads stream into an unnamed staged file (`begin_put`) chunk by chunk and are published
//! atomically by `finish_put`; a body error, a client that goes away, or any failure before
//! publishing aborts the staged file, so a half-uploaded file is never visible. Downloads
//! stream in bounded pieces; memory per request does not grow with the file.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use storage_engine::{Attr, Caller, Engine, Error, FileKind, Ino, Stability};

use crate::auth::{Auth, blocking};
use crate::error::{ApiError, ApiResult};
use crate::extract::{JsonBody, QueryArgs};
use crate::paths::{FsPath, walk, walk_create};
use crate::wire::{self, FileAttrs, etag_of};
use crate::{AppState, Routes};

const FILES_PREFIX: &str = "/api/v1/files/";
const DIRS_PREFIX: &str = "/api/v1/dirs";

/// Upload bytes collected before one engine write call.
pub const PUT_CHUNK_BYTES: usize = 4 << 20;
/// Largest piece read from the engine for a download (one full 4+2 stripe of 1 MiB shards).
pub const READ_PIECE_BYTES_MAX: usize = 4 << 20;
pub const LIST_LIMIT_DEFAULT: usize = 1000;
pub const LIST_LIMIT_MAX: usize = 10_000;
/// Mode of files and directories the file API creates.
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

pub(crate) fn routes(r: Routes) -> Routes {
    r.on(Method::PUT, "/api/v1/files/{*path}", put_file)
        .on(Method::GET, "/api/v1/files/{*path}", get_file)
        .on(Method::HEAD, "/api/v1/files/{*path}", head_file)
        .on(Method::DELETE, "/api/v1/files/{*path}", delete_file)
        .on(Method::POST, "/api/v1/files/{*path}", rename_file)
        .on(Method::GET, "/api/v1/dirs", list_dir)
        .on(Method::GET, "/api/v1/dirs/{*path}", list_dir)
        .on(Method::POST, "/api/v1/dirs/{*path}", make_dir)
        .on(Method::DELETE, "/api/v1/dirs/{*path}", remove_dir)
}

/// The validated file system path of a request under `prefix`.
fn request_path(uri: &Uri, prefix: &str) -> ApiResult<FsPath> {
    let raw = uri.path().strip_prefix(prefix).unwrap_or("");
    FsPath::from_url(raw.strip_prefix('/').unwrap_or(raw))
}

fn root_refused(what: &str) -> ApiError {
    ApiError::bad_request(format!("cannot {what} the root directory"))
}

// ------------------------------------------------------------------ upload

/// A staged, not yet published upload. Dropping it while armed aborts the upload: that is
/// what happens when the handler returns early or its future is dropped because the client
/// went away.
struct StagedPut {
    engine: Arc<Engine>,
    caller: Caller,
    ino: Ino,
    armed: bool,
}

impl StagedPut {
    /// Publishes the upload under `name` in `parent`; on failure the guard aborts it.
    /// Taking `self` whole matters: a closure that only captured the `armed` flag would
    /// disarm a copy.
    fn publish(mut self, parent: Ino, name: &[u8]) -> storage_engine::Result<Attr> {
        let r = self.engine.finish_put(&self.caller, self.ino, parent, name);
        if r.is_ok() {
            self.armed = false;
        }
        r
    }
}

impl Drop for StagedPut {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (engine, caller, ino) = (self.engine.clone(), self.caller.clone(), self.ino);
        let abort = move || {
            if let Err(e) = engine.abort_put(&caller, ino) {
                tracing::warn!(ino, error = %e, "abort unfinished upload");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(abort);
            }
            Err(_) => abort(),
        }
    }
}

async fn put_file(State(st): State<AppState>, Auth(caller): Auth, uri: Uri, body: Body) -> ApiResult<Response> {
    let path = request_path(&uri, FILES_PREFIX)?;
    let (parent_comps, name) = path.split_last().ok_or_else(|| root_refused("write"))?;
    let (parent_comps, name) = (parent_comps.to_vec(), name.to_string());

    let engine = st.engine.clone();
    let (c, n) = (caller.clone(), name.clone());
    let (parent, existed, staged) = blocking(move || {
        let parent = walk_create(&engine, &c, &parent_comps)?;
        let existed = match engine.lookup(&c, parent.ino, n.as_bytes()) {
            Ok(a) if a.kind == FileKind::Dir => return Err(Error::IsDir),
            Ok(_) => true,
            Err(Error::NotFound) => false,
            Err(e) => return Err(e),
        };
        let staged = engine.begin_put(&c, parent.ino, FILE_MODE)?;
        Ok((parent, existed, staged))
    })
    .await?;
    let staged = StagedPut { engine: st.engine.clone(), caller, ino: staged.ino, armed: true };

    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::with_capacity(PUT_CHUNK_BYTES);
    let mut offset = 0u64;
    // One engine write in flight while the next chunk arrives from the network, so that
    // receiving and storing overlap; memory stays at two chunks.
    let mut in_flight: Option<tokio::task::JoinHandle<storage_engine::Result<()>>> = None;
    let result: ApiResult<()> = async {
        loop {
            let frame = stream.next().await;
            let done = frame.is_none();
            if let Some(frame) = frame {
                let bytes = frame.map_err(|e| ApiError::bad_request(format!("read request body: {e}")))?;
                buf.extend_from_slice(&bytes);
            }
            if buf.len() >= PUT_CHUNK_BYTES || (done && !buf.is_empty()) {
                if let Some(h) = in_flight.take() {
                    finish_write(h).await?;
                }
                let chunk = std::mem::replace(&mut buf, Vec::with_capacity(PUT_CHUNK_BYTES));
                let (engine, c, ino) = (staged.engine.clone(), staged.caller.clone(), staged.ino);
                let at = offset;
                offset += chunk.len() as u64;
                in_flight = Some(tokio::task::spawn_blocking(move || {
                    engine.write(&c, ino, at, &chunk, Stability::Unstable).map(|_| ())
                }));
            }
            if done {
                break;
            }
        }
        Ok(())
    }
    .await;
    // Never leave a write running behind an early return: the staged file's abort follows.
    if let Some(h) = in_flight.take() {
        let last = finish_write(h).await;
        result?;
        last?;
    } else {
        result?;
    }

    // Publishing happens on the blocking pool with the guard moved there, so that a client
    // leaving at this point can neither interrupt it nor abort a published file.
    let attr = blocking(move || staged.publish(parent.ino, name.as_bytes())).await?;
    let status = if existed { StatusCode::OK } else { StatusCode::CREATED };
    let mut res = (status, Json(FileAttrs::from(&attr))).into_response();
    res.headers_mut().insert(header::ETAG, header_value(&etag_of(&attr)));
    Ok(res)
}

async fn finish_write(h: tokio::task::JoinHandle<storage_engine::Result<()>>) -> ApiResult<()> {
    match h.await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => {
            tracing::error!(error = %e, "engine write panicked");
            Err(ApiError::internal("internal error"))
        }
    }
}

// ------------------------------------------------------------------ download

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).expect("header values built here are ASCII")
}

fn http_date(ns: i64) -> String {
    httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64))
}

/// A byte range to serve, end exclusive.
#[derive(Debug, PartialEq, Eq)]
enum RangeReq {
    Full,
    Part(u64, u64),
    Unsatisfiable,
}

/// Parses a `Range` header against a file of `size` bytes. Forms: `bytes=a-b`, `bytes=a-`,
/// `bytes=-n`. Headers that are malformed or name several ranges are ignored, as RFC 9110
/// allows, and the whole file is served.
fn parse_range(h: Option<&HeaderValue>, size: u64) -> RangeReq {
    let Some(spec) = h.and_then(|v| v.to_str().ok()).and_then(|s| s.trim().strip_prefix("bytes=")) else {
        return RangeReq::Full;
    };
    if spec.contains(',') {
        return RangeReq::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeReq::Full;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        // Suffix: the last n bytes.
        let Ok(n) = b.parse::<u64>() else { return RangeReq::Full };
        if n == 0 || size == 0 {
            return RangeReq::Unsatisfiable;
        }
        return RangeReq::Part(size.saturating_sub(n), size);
    }
    let Ok(start) = a.parse::<u64>() else { return RangeReq::Full };
    let end = if b.is_empty() {
        size
    } else {
        let Ok(last) = b.parse::<u64>() else { return RangeReq::Full };
        if last < start {
            return RangeReq::Full;
        }
        last.saturating_add(1).min(size)
    };
    if start >= size {
        return RangeReq::Unsatisfiable;
    }
    RangeReq::Part(start, end)
}

async fn get_file(st: State<AppState>, auth: Auth, uri: Uri, headers: HeaderMap) -> ApiResult<Response> {
    serve_file(st, auth, uri, headers, true).await
}

async fn head_file(st: State<AppState>, auth: Auth, uri: Uri, headers: HeaderMap) -> ApiResult<Response> {
    serve_file(st, auth, uri, headers, false).await
}

async fn serve_file(State(st): State<AppState>, Auth(caller): Auth, uri: Uri, headers: HeaderMap, with_body: bool) -> ApiResult<Response> {
    let path = request_path(&uri, FILES_PREFIX)?;
    let engine = st.engine.clone();
    let c = caller.clone();
    let attr = blocking(move || {
        let attr = walk(&engine, &c, &path.comps)?;
        match attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::IsDir),
            FileKind::Symlink => return Err(Error::InvalidArgument("is a symbolic link".into())),
            _ => return Err(Error::InvalidArgument("is a special file (fifo, socket or device)".into())),
        }
        // A zero-length read checks read permission before any header is sent.
        engine.read(&c, attr.ino, 0, 0)?;
        Ok(attr)
    })
    .await?;

    let etag = etag_of(&attr);
    let size = attr.size;
    let mut res = Response::builder()
        .header(header::ETAG, header_value(&etag))
        .header(header::LAST_MODIFIED, header_value(&http_date(attr.mtime_ns)))
        .header(header::ACCEPT_RANGES, "bytes")
        .header("x-aquifer-ino", attr.ino)
        .header("x-aquifer-version", attr.version)
        .header("x-aquifer-mode", format!("{:04o}", attr.mode))
        .header("x-aquifer-uid", attr.uid)
        .header("x-aquifer-gid", attr.gid);

    if let Some(inm) = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        if inm.split(',').any(|t| t.trim() == etag || t.trim() == "*") {
            return Ok(res.status(StatusCode::NOT_MODIFIED).body(Body::empty()).expect("valid response"));
        }
    }

    let (status, start, end) = match parse_range(headers.get(header::RANGE), size) {
        RangeReq::Full => (StatusCode::OK, 0, size),
        RangeReq::Part(a, b) => {
            res = res.header(header::CONTENT_RANGE, format!("bytes {a}-{}/{size}", b - 1));
            (StatusCode::PARTIAL_CONTENT, a, b)
        }
        RangeReq::Unsatisfiable => {
            let mut e = ApiError::new(StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable", format!("file has {size} bytes"))
                .into_response();
            e.headers_mut().insert(header::CONTENT_RANGE, header_value(&format!("bytes */{size}")));
            return Ok(e);
        }
    };
    res = res
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, end - start);
    let body = if with_body { file_body(st.engine.clone(), caller, attr, start, end) } else { Body::empty() };
    Ok(res.body(body).expect("valid response"))
}

/// Streams bytes `start..end` of a file in pieces of at most [`READ_PIECE_BYTES_MAX`]. The
/// stream fails, cutting the response short, if the file changes while it is sent: a client
/// must never receive a mix of two versions as if it were one.
fn file_body(engine: Arc<Engine>, caller: Caller, attr: Attr, start: u64, end: u64) -> Body {
    struct Cursor {
        engine: Arc<Engine>,
        caller: Caller,
        ino: Ino,
        version: u64,
        pos: u64,
        end: u64,
    }
    let cur = Cursor { engine, caller, ino: attr.ino, version: attr.version, pos: start, end };
    let stream = futures_util::stream::try_unfold(cur, |cur| async move {
        if cur.pos >= cur.end {
            return Ok::<_, std::io::Error>(None);
        }
        let len = (cur.end - cur.pos).min(READ_PIECE_BYTES_MAX as u64) as usize;
        let (engine, caller, ino, pos, version) = (cur.engine.clone(), cur.caller.clone(), cur.ino, cur.pos, cur.version);
        let data = tokio::task::spawn_blocking(move || {
            let data = engine.read(&caller, ino, pos, len)?;
            if engine.getattr(&caller, ino)?.version != version {
                return Err(Error::Busy("file changed while being read".into()));
            }
            Ok(data)
        })
        .await
        .map_err(std::io::Error::other)?
        .map_err(|e: Error| std::io::Error::other(format!("read inode {ino} at {pos}: {e}")))?;
        if data.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file shrank while being read"));
        }
        let next = Cursor { pos: cur.pos + data.len() as u64, ..cur };
        Ok(Some((Bytes::from(data), next)))
    });
    Body::from_stream(stream)
}

// ------------------------------------------------------------------ delete, rename

async fn delete_file(State(st): State<AppState>, Auth(caller): Auth, uri: Uri) -> ApiResult<StatusCode> {
    let path = request_path(&uri, FILES_PREFIX)?;
    let (parent_comps, name) = path.split_last().ok_or_else(|| root_refused("delete"))?;
    let (parent_comps, name) = (parent_comps.to_vec(), name.to_string());
    let engine = st.engine.clone();
    blocking(move || {
        let parent = walk(&engine, &caller, &parent_comps)?;
        if engine.lookup(&caller, parent.ino, name.as_bytes())?.kind == FileKind::Dir {
            return Err(Error::IsDir);
        }
        engine.unlink(&caller, parent.ino, name.as_bytes())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn rename_file(
    State(st): State<AppState>,
    Auth(caller): Auth,
    uri: Uri,
    JsonBody(req): JsonBody<wire::Rename>,
) -> ApiResult<Json<FileAttrs>> {
    let from = request_path(&uri, FILES_PREFIX)?;
    let to = FsPath::from_plain(&req.rename_to)?;
    let (from_parent, from_name) = from.split_last().ok_or_else(|| root_refused("rename"))?;
    let (to_parent, to_name) = to.split_last().ok_or_else(|| root_refused("replace"))?;
    let (from_parent, from_name) = (from_parent.to_vec(), from_name.to_string());
    let (to_parent, to_name) = (to_parent.to_vec(), to_name.to_string());
    let engine = st.engine.clone();
    let attr = blocking(move || {
        let fp = walk(&engine, &caller, &from_parent)?;
        let tp = walk(&engine, &caller, &to_parent)?;
        if tp.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        engine.rename(&caller, fp.ino, from_name.as_bytes(), tp.ino, to_name.as_bytes())?;
        engine.lookup(&caller, tp.ino, to_name.as_bytes())
    })
    .await?;
    Ok(Json(FileAttrs::from(&attr)))
}

// ------------------------------------------------------------------ directories

#[derive(Deserialize)]
struct ListQuery {
    cursor: Option<String>,
    limit: Option<usize>,
}

async fn list_dir(
    State(st): State<AppState>,
    Auth(caller): Auth,
    uri: Uri,
    QueryArgs(q): QueryArgs<ListQuery>,
) -> ApiResult<Json<wire::DirListing>> {
    let path = request_path(&uri, DIRS_PREFIX)?;
    let limit = q.limit.unwrap_or(LIST_LIMIT_DEFAULT);
    if limit == 0 {
        return Err(ApiError::bad_request("limit must be at least 1"));
    }
    let limit = limit.min(LIST_LIMIT_MAX);
    // Cursors are opaque to clients: the hex of the last name returned.
    let cursor = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(hex::decode(c).map_err(|_| ApiError::bad_request("malformed cursor"))?),
    };
    let engine = st.engine.clone();
    let shown = path.display();
    let (entries, next) = blocking(move || {
        let dir = walk(&engine, &caller, &path.comps)?;
        if dir.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        let page = engine.readdir(&caller, dir.ino, cursor.as_deref(), limit)?;
        let mut entries = Vec::with_capacity(page.entries.len());
        for e in &page.entries {
            let a = match engine.getattr(&caller, e.ino) {
                Ok(a) => a,
                // Removed since the page was read.
                Err(Error::NotFound) => continue,
                Err(err) => return Err(err),
            };
            entries.push(wire::DirEntry {
                name: String::from_utf8_lossy(&e.name).into_owned(),
                ino: e.ino,
                kind: wire::kind_str(e.kind).to_string(),
                size: a.size,
                mode: a.mode,
                mtime_ns: a.mtime_ns,
            });
        }
        Ok((entries, page.next_cursor))
    })
    .await?;
    Ok(Json(wire::DirListing { path: shown, entries, next_cursor: next.map(hex::encode) }))
}

#[derive(Deserialize)]
struct MkdirQuery {
    #[serde(default)]
    parents: bool,
}

async fn make_dir(
    State(st): State<AppState>,
    Auth(caller): Auth,
    uri: Uri,
    QueryArgs(q): QueryArgs<MkdirQuery>,
) -> ApiResult<(StatusCode, Json<FileAttrs>)> {
    let path = request_path(&uri, DIRS_PREFIX)?;
    let engine = st.engine.clone();
    let (created, attr) = blocking(move || {
        if q.parents {
            let existed = match walk(&engine, &caller, &path.comps) {
                Ok(a) if a.kind == FileKind::Dir => true,
                Ok(_) => return Err(Error::Exists),
                Err(Error::NotFound) => false,
                Err(e) => return Err(e),
            };
            let attr = walk_create(&engine, &caller, &path.comps)?;
            Ok((!existed, attr))
        } else {
            let Some((parent, name)) = path.split_last() else { return Err(Error::Exists) };
            let p = walk(&engine, &caller, parent)?;
            if p.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            Ok((true, engine.mkdir(&caller, p.ino, name.as_bytes(), DIR_MODE)?))
        }
    })
    .await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(FileAttrs::from(&attr))))
}

async fn remove_dir(State(st): State<AppState>, Auth(caller): Auth, uri: Uri) -> ApiResult<StatusCode> {
    let path = request_path(&uri, DIRS_PREFIX)?;
    let (parent_comps, name) = path.split_last().ok_or_else(|| root_refused("remove"))?;
    let (parent_comps, name) = (parent_comps.to_vec(), name.to_string());
    let engine = st.engine.clone();
    blocking(move || {
        let parent = walk(&engine, &caller, &parent_comps)?;
        engine.rmdir(&caller, parent.ino, name.as_bytes())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(s: &str, size: u64) -> RangeReq {
        parse_range(Some(&HeaderValue::from_str(s).unwrap()), size)
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), RangeReq::Full);
        assert_eq!(range("bytes=0-4", 10), RangeReq::Part(0, 5));
        assert_eq!(range("bytes=3-", 10), RangeReq::Part(3, 10));
        assert_eq!(range("bytes=-4", 10), RangeReq::Part(6, 10));
        assert_eq!(range("bytes=-40", 10), RangeReq::Part(0, 10));
        assert_eq!(range("bytes=5-100", 10), RangeReq::Part(5, 10));
        assert_eq!(range("bytes=10-", 10), RangeReq::Unsatisfiable);
        assert_eq!(range("bytes=-0", 10), RangeReq::Unsatisfiable);
        assert_eq!(range("bytes=0-", 0), RangeReq::Unsatisfiable);
        assert_eq!(range("bytes=4-2", 10), RangeReq::Full);
        assert_eq!(range("bytes=0-1,4-5", 10), RangeReq::Full);
        assert_eq!(range("items=0-1", 10), RangeReq::Full);
        assert_eq!(range("bytes=x-1", 10), RangeReq::Full);
    }
}
