//! The S3 operations on the namespace.
//!
//! Every engine call runs on the blocking pool ([`blocking`]). Writes go to an unnamed
//! staged file that is published atomically (`finish_put`) only after the body arrived
//! whole and every check passed; a [`Staged`] guard aborts it on any other way out,
//! including a client that goes away mid-body, so nothing half-written is ever visible and
//! no space leaks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use crate::md5::Md5;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use storage_engine::{Attr, Caller, Engine, Error, FileKind, FillBuf, FoundVersion, Ino, NULL_VERSION, ROOT_INO, Stability, VersionKind, VersionMode, XATTR_FOLDER_OBJECT};

use crate::acl::{self, Acl, GrantHeaders, Perm};
use crate::auth::{AclWriter, PerKeyPolicy, PolicyGrant, Requester, SourceGrant, caller_of, load_acl};
use crate::cors;
use crate::lifecycle;
use crate::policy::Policy;
use crate::error::{Missing, internal, map_err};
use crate::keys::{KeyForm, object_key, parse_key};
use crate::meta::*;

/// Upload bytes collected before one engine write call (one full 4+2 stripe of 1 MiB
/// shards). Two are held per upload at most: one being received, one being written.
pub const PUT_CHUNK_BYTES: usize = 4 << 20;
/// Largest piece read from the engine for a download (one full 4+2 stripe of 1 MiB shards).
pub const READ_PIECE_BYTES_MAX: usize = 4 << 20;
/// Download pieces (of one stripe) queued for the client.
const READ_AHEAD_PIECES: usize = 2;
/// Bytes of one engine read of a download after its first: four stripes, which the drives
/// serve with one 4 MiB request each (a 1 MiB shard each is far slower on the disks measured).
const READ_WINDOW_BYTES: usize = 16 << 20;
/// Engine reads of one download in flight at once.
const READ_WINDOWS_IN_FLIGHT: usize = 2;
/// MiB that all downloads' [`READ_WINDOW_BYTES`] reads may hold together (read, being read or
/// queued for the client); past it a download reads one stripe at a time.
static READ_WINDOW_BUDGET: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1024);
/// Smallest part of a multipart upload except the last (as S3).
pub const PART_BYTES_MIN: u64 = 5 << 20;
/// Keys one listing returns when the client does not say (and at most).
pub const LIST_KEYS_DEFAULT: usize = 1000;
/// Listings compute a missing ETag only for objects up to this size; larger ones written
/// through other protocols show a placeholder until a GET or HEAD computes the MD5.
const LIST_ETAG_COMPUTE_BYTES_MAX: u64 = 8 << 20;
/// Mode of objects and of the directories PUT creates.
const FILE_MODE: u32 = 0o644;
/// Objects put with the canned ACL `private`.
const OWNER_ONLY_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o755;
/// Tries of a small PUT's store where the request is served while the engine's mutation lock
/// is taken, other requests on the thread going first between tries, before the blocking pool.
const STORE_HERE_TRIES: u32 = 4;

/// What `PutPlan::try_store_here` did.
enum Here {
    /// Stored (or refused with an answer for the client).
    Stored(S3Result<()>),
    /// Nothing stored: it would have waited for the engine.
    Busy,
    /// Nothing stored: the blocking path does what is needed.
    Elsewhere,
}
/// The read bit of `Engine::access` masks (as access(2)'s R_OK).
const ACCESS_READ: u32 = 4;
/// Objects in one DeleteObjects request (as S3).
const DELETE_OBJECTS_MAX: usize = 1000;

/// The canned ACL of a multipart upload becomes the completed object's mode, which the
/// engine enforces for every protocol: `private` is owner-only, so anonymous readers of a
/// public-read bucket and other users are refused. Canned ACLs that need a stored ACL (see
/// `acl`) are refused rather than ignored: an upload carries only a mode to completion.
fn object_mode(acl: Option<&ObjectCannedACL>) -> S3Result<u32> {
    match acl.map(|a| a.as_str()) {
        None | Some(ObjectCannedACL::PUBLIC_READ) => Ok(FILE_MODE),
        Some(ObjectCannedACL::PRIVATE) => Ok(OWNER_ONLY_MODE),
        Some(other) => Err(err(S3ErrorCode::NotImplemented, format!("canned ACL {other} is not supported on objects; use private or public-read"))),
    }
}

/// `x-amz-meta-snowball-auto-extract: true` asks the server to unpack a tar archive into
/// objects (Snowball Edge, MinIO); Aquifer does not, and says so instead of storing the
/// archive as one object the client does not expect.
fn refuse_auto_extract(meta: Option<&Metadata>) -> S3Result<()> {
    let asked = meta.is_some_and(|m| m.iter().any(|(k, v)| k.eq_ignore_ascii_case("snowball-auto-extract") && v.eq_ignore_ascii_case("true")));
    if asked {
        return Err(err(S3ErrorCode::NotImplemented, "snowball-auto-extract (unpacking a tar archive into objects) is not supported"));
    }
    Ok(())
}

/// Runs blocking engine work off the async runtime.
pub(crate) async fn blocking<T, F>(f: F) -> S3Result<T>
where
    F: FnOnce() -> S3Result<T> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(internal(format!("blocking task failed: {e}"))),
    }
}

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::with_message(code, msg.into())
}

fn timestamp(ns: i64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64))
}

/// Whole seconds, as HTTP dates compare.
fn seconds(ns: i64) -> i64 {
    ns.div_euclid(1_000_000_000)
}

fn ts_seconds(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

fn quoted(etag: &str) -> ETag {
    ETag::Strong(etag.to_string())
}

pub struct AquiferS3 {
    engine: Arc<Engine>,
    /// Notified when a lifecycle configuration is put, so that it is carried out soon.
    lifecycle_changed: Arc<tokio::sync::Notify>,
}

impl AquiferS3 {
    pub fn new(engine: Arc<Engine>) -> AquiferS3 {
        AquiferS3 { engine, lifecycle_changed: Arc::new(tokio::sync::Notify::new()) }
    }

    /// The body of a GET of `[start, end)` of `ino`. A small object's bytes, which lie in the
    /// metadata store, are read where the request is served (`Engine::try_read_inline`, which
    /// declines portal mirrors and whatever else could wait); other objects stream from the
    /// drives through the blocking pool (`read_stream`).
    fn object_body(&self, caller: Caller, ino: Ino, start: u64, end: u64) -> StreamingBlob {
        if let Some(Ok((bytes, _))) = self.engine.try_read_inline(&caller, ino, start, (end - start) as usize)
            && bytes.len() as u64 == end - start
        {
            return StreamingBlob::from(s3s::Body::from(Bytes::from(bytes)));
        }
        read_stream(self.engine.clone(), caller, ino, start, end)
    }

    /// Notifies `changed` whenever a bucket's lifecycle configuration is put.
    pub fn with_lifecycle_notify(mut self, changed: Arc<tokio::sync::Notify>) -> AquiferS3 {
        self.lifecycle_changed = changed;
        self
    }

    /// Who the request runs as: the bucket owner when the bucket's policy allowed it (see
    /// `auth::Grant`), else the user of the access key (or the anonymous caller).
    fn caller<T>(&self, req: &S3Request<T>) -> S3Result<Caller> {
        if let Some(PolicyGrant(c)) = req.extensions.get::<PolicyGrant>() {
            return Ok(c.clone());
        }
        self.requester(req)
    }

    /// The user of the request's access key (or the anonymous caller), as the access check
    /// found it; looked up only where that check did not run (ListBuckets).
    fn requester<T>(&self, req: &S3Request<T>) -> S3Result<Caller> {
        match req.extensions.get::<Requester>() {
            Some(Requester(c)) => Ok(c.clone()),
            None => caller_of(&self.engine, req.credentials.as_ref()),
        }
    }

    /// Who reads the source of a copy: the source bucket's owner when that bucket's policy
    /// allowed `s3:GetObject` on it, else the requester themselves (never the owner of the
    /// destination, whose policy speaks only for the destination).
    fn source_caller<T>(&self, req: &S3Request<T>) -> S3Result<Caller> {
        if let Some(SourceGrant(c)) = req.extensions.get::<SourceGrant>() {
            return Ok(c.clone());
        }
        self.requester(req)
    }
}

// ------------------------------------------------------------------ namespace helpers

fn bucket_attr(engine: &Engine, caller: &Caller, bucket: &str) -> S3Result<Attr> {
    match engine.lookup(caller, ROOT_INO, bucket.as_bytes()) {
        Ok(a) if a.kind == FileKind::Dir => Ok(a),
        Ok(_) => Err(S3Error::new(S3ErrorCode::NoSuchBucket)),
        Err(e) => Err(map_err(e, Missing::Bucket)),
    }
}

/// The file holding `key`, or NoSuchKey.
fn object_attr(engine: &Engine, caller: &Caller, bucket: Ino, key: &str) -> S3Result<Attr> {
    let (parent, name) = match engine.object_parent(caller, bucket, key, false) {
        Ok(x) => x,
        Err(Error::NotFound | Error::NotDir) => return Err(S3Error::new(S3ErrorCode::NoSuchKey)),
        Err(e) => return Err(map_err(e, Missing::Key)),
    };
    match engine.lookup(caller, parent, name.as_bytes()) {
        Ok(a) if a.kind == FileKind::File => Ok(a),
        Ok(_) => Err(S3Error::new(S3ErrorCode::NoSuchKey)),
        Err(e) => Err(map_err(e, Missing::Key)),
    }
}

/// The directory a `prefix/` key names, or NoSuchKey.
fn dir_attr(engine: &Engine, caller: &Caller, bucket: Ino, path: &str) -> S3Result<Attr> {
    let mut cur = bucket;
    let mut attr = None;
    for c in path.split('/') {
        match engine.lookup(caller, cur, c.as_bytes()) {
            Ok(a) if a.kind == FileKind::Dir => {
                cur = a.ino;
                attr = Some(a);
            }
            Ok(_) | Err(Error::NotFound) => return Err(S3Error::new(S3ErrorCode::NoSuchKey)),
            Err(e) => return Err(map_err(e, Missing::Key)),
        }
    }
    attr.ok_or_else(|| S3Error::new(S3ErrorCode::NoSuchKey))
}

/// Creates every directory of `path` below `bucket` (a `prefix/` marker PUT).
fn make_dirs(engine: &Engine, caller: &Caller, bucket: Ino, path: &str) -> S3Result<Attr> {
    let mut cur = engine.getattr(caller, bucket).map_err(|e| map_err(e, Missing::Bucket))?;
    for c in path.split('/') {
        cur = match engine.lookup(caller, cur.ino, c.as_bytes()) {
            Ok(a) if a.kind == FileKind::Dir => a,
            Ok(_) => return Err(map_err(Error::NotDir, Missing::Key)),
            Err(Error::NotFound) => match engine.mkdir(caller, cur.ino, c.as_bytes(), DIR_MODE) {
                Ok(a) => a,
                Err(Error::Exists) => engine.lookup(caller, cur.ino, c.as_bytes()).map_err(|e| map_err(e, Missing::Key))?,
                Err(e) => return Err(map_err(e, Missing::Key)),
            },
            Err(e) => return Err(map_err(e, Missing::Key)),
        };
    }
    Ok(cur)
}

/// Removes the directories of `key` (deepest first) that became empty, up to the bucket:
/// S3 has no directories, so a prefix must vanish with its last object. Stops at the first
/// directory that is not empty, is a folder object (`prefix/` put as an object), or that the
/// caller may not remove.
fn prune_empty_dirs(engine: &Engine, caller: &Caller, bucket: Ino, dirs: &[&str]) {
    let mut chain = vec![bucket];
    for d in dirs {
        match engine.lookup(caller, *chain.last().expect("non-empty"), d.as_bytes()) {
            Ok(a) if a.kind == FileKind::Dir => chain.push(a.ino),
            _ => return,
        }
    }
    for i in (0..dirs.len()).rev() {
        let empty = engine.readdir(caller, chain[i + 1], None, 1).is_ok_and(|p| p.entries.is_empty());
        if !empty || !matches!(engine.is_folder_object(chain[i + 1]), Ok(false)) || engine.rmdir(caller, chain[i], dirs[i].as_bytes()).is_err() {
            return;
        }
    }
}

/// Most bytes a folder object (`prefix/`) holds: its content is an extended attribute of
/// its directory.
const FOLDER_BYTES_MAX: usize = storage_engine::XATTR_VALUE_BYTES_MAX;

/// The refusal of more content under a key ending in '/' than a folder object holds.
fn folder_too_large() -> S3Error {
    err(S3ErrorCode::EntityTooLarge, format!("a key ending in '/' names a directory, which holds at most {FOLDER_BYTES_MAX} bytes as an object"))
}

/// The refusal of a conditional write of a folder object.
fn folder_conditions() -> S3Error {
    err(S3ErrorCode::NotImplemented, "conditional writes of folder objects (keys ending in '/') are not supported")
}

/// Makes directory `path` below `bucket` the folder object `path/` holding `content`, with
/// `meta` and `tags` (replacing what it had). Its ETag is the MD5 of `content`.
fn put_folder(engine: &Engine, caller: &Caller, bucket: Ino, path: &str, content: &[u8], meta: &ObjectMeta, tags: &[(String, String)]) -> S3Result<()> {
    if content.len() > FOLDER_BYTES_MAX {
        return Err(folder_too_large());
    }
    let dir = make_dirs(engine, caller, bucket, path)?;
    // Content, metadata and tags in one change: a reader never sees new content with the
    // metadata of the folder object it replaced.
    let mut set = object_xattrs(meta, tags);
    set.push((XATTR_FOLDER_OBJECT, content.to_vec()));
    let set: Vec<(&[u8], &[u8])> = set.iter().map(|(n, v)| (*n, &v[..])).collect();
    engine.set_xattrs(caller, dir.ino, &[XATTR_META, XATTR_TAGS], &set).map_err(|e| map_err(e, Missing::Key))
}

/// The content of folder object `ino` (a directory); `None` when it is no folder object.
fn folder_content(engine: &Engine, ino: Ino) -> Option<Vec<u8>> {
    engine.getxattr(&Caller::system(), ino, XATTR_FOLDER_OBJECT).ok()
}

fn dirs_of(key: &str) -> Vec<&str> {
    let mut v: Vec<&str> = key.split('/').collect();
    v.pop();
    v
}

/// What a delete did, for its answer.
#[derive(Default)]
pub(crate) struct Deleted {
    /// The version removed, or the delete marker made.
    pub version_id: Option<String>,
    /// A delete marker was made, or the version removed was one.
    pub delete_marker: bool,
}

/// Deletes one key (a delete marker in a versioned bucket); deleting what does not exist
/// succeeds, as in S3.
pub(crate) fn delete_key(engine: &Engine, caller: &Caller, bucket: Ino, key: &str) -> S3Result<()> {
    delete_key_version(engine, caller, bucket, key, None).map(|_| ())
}

/// Deletes one key, or with `version` one version of it for good. Deleting a version that
/// does not exist succeeds, as in S3 (a delete is idempotent).
pub(crate) fn delete_key_version(engine: &Engine, caller: &Caller, bucket: Ino, key: &str, version: Option<&str>) -> S3Result<Deleted> {
    if let KeyForm::Object(k) = parse_key(key)? {
        let versioning = bucket_versioning(engine, bucket);
        let out = match (version, versioning) {
            (Some(id), _) => {
                let marker = matches!(engine.find_version(caller, bucket, k, id), Ok(FoundVersion::DeleteMarker { .. }));
                match engine.delete_version(caller, bucket, k, id) {
                    Ok(()) | Err(Error::NotFound) => {}
                    Err(e) => return Err(map_err(e, Missing::Key)),
                }
                Deleted { version_id: Some(id.to_string()), delete_marker: marker }
            }
            (None, Some(mode)) => {
                let id = engine.delete_versioned(caller, bucket, k, mode).map_err(|e| map_err(e, Missing::Key))?;
                Deleted { version_id: Some(id), delete_marker: true }
            }
            (None, None) => return delete_unversioned(engine, caller, bucket, key).map(|()| Deleted::default()),
        };
        prune_empty_dirs(engine, caller, bucket, &dirs_of(k));
        return Ok(out);
    }
    if version.is_some_and(|v| v != NULL_VERSION) {
        return Err(err(S3ErrorCode::NoSuchVersion, "a key ending in '/' names a directory, whose only version is null"));
    }
    delete_unversioned(engine, caller, bucket, key).map(|()| Deleted::default())
}

fn delete_unversioned(engine: &Engine, caller: &Caller, bucket: Ino, key: &str) -> S3Result<()> {
    match parse_key(key)? {
        KeyForm::Dir(path) => {
            let comps: Vec<&str> = path.split('/').collect();
            let (name, dirs) = comps.split_last().expect("split yields one part");
            let parent = if dirs.is_empty() {
                Ok(bucket)
            } else {
                dir_attr(engine, caller, bucket, &dirs.join("/")).map(|a| a.ino)
            };
            if let Ok(parent) = parent {
                // The folder object goes; the directory with it only when it is empty.
                match engine.lookup(caller, parent, name.as_bytes()) {
                    Ok(a) if a.kind == FileKind::Dir => {
                        // Its content, metadata and tags go in one change (none to remove on a
                        // directory that is no folder object: nothing changes).
                        let names = engine.listxattr(&Caller::system(), a.ino).map_err(|e| map_err(e, Missing::Key))?;
                        let held: Vec<&[u8]> = [XATTR_FOLDER_OBJECT, XATTR_META, XATTR_TAGS].into_iter().filter(|n| names.iter().any(|h| h == n)).collect();
                        if !held.is_empty() {
                            engine.set_xattrs(caller, a.ino, &held, &[]).map_err(|e| map_err(e, Missing::Key))?;
                        }
                    }
                    Ok(_) | Err(Error::NotFound) => return Ok(()),
                    Err(e) => return Err(map_err(e, Missing::Key)),
                }
                match engine.rmdir(caller, parent, name.as_bytes()) {
                    Ok(()) | Err(Error::NotFound | Error::NotEmpty | Error::NotDir) => {}
                    Err(e) => return Err(map_err(e, Missing::Key)),
                }
                prune_empty_dirs(engine, caller, bucket, dirs);
            }
            Ok(())
        }
        KeyForm::Object(key) => {
            let (parent, name) = match engine.object_parent(caller, bucket, key, false) {
                Ok(x) => x,
                Err(Error::NotFound | Error::NotDir) => return Ok(()),
                Err(e) => return Err(map_err(e, Missing::Key)),
            };
            match engine.lookup(caller, parent, name.as_bytes()) {
                Ok(a) if a.kind == FileKind::File => {}
                Ok(_) | Err(Error::NotFound) => return Ok(()),
                Err(e) => return Err(map_err(e, Missing::Key)),
            }
            match engine.unlink(caller, parent, name.as_bytes()) {
                Ok(()) | Err(Error::NotFound) => {}
                Err(e) => return Err(map_err(e, Missing::Key)),
            }
            prune_empty_dirs(engine, caller, bucket, &dirs_of(key));
            Ok(())
        }
    }
}

/// MD5 of a file's content, read in bounded pieces.
fn md5_of(engine: &Engine, caller: &Caller, ino: Ino, size: u64) -> S3Result<String> {
    let mut h = Md5::new();
    let mut off = 0u64;
    while off < size {
        let len = READ_PIECE_BYTES_MAX.min((size - off) as usize);
        let piece = engine.read(caller, ino, off, len).map_err(|e| map_err(e, Missing::Key))?;
        if piece.is_empty() {
            break;
        }
        h.update(&piece);
        off += piece.len() as u64;
    }
    Ok(hex::encode(h.finalize()))
}

fn stored_etag(engine: &Engine, caller: &Caller, attr: &Attr) -> Option<String> {
    let v = engine.getxattr(caller, attr.ino, XATTR_ETAG).ok()?;
    let s = StoredEtag::decode(&v)?;
    (s.size == attr.size && s.mtime_ns == attr.mtime_ns).then_some(s.etag)
}

/// Records `etag` for the file's current data state, as the engine itself (it is a cache
/// of the content, which whoever may read the file may know).
fn save_etag(engine: &Engine, ino: Ino, etag: &str, attr: &Attr) -> Result<(), Error> {
    let s = StoredEtag { etag: etag.to_string(), size: attr.size, mtime_ns: attr.mtime_ns };
    engine.setxattr(&Caller::system(), ino, XATTR_ETAG, &s.encode())
}

/// The ETag of a file: the stored one when it belongs to the current data, else the MD5 of
/// the content, computed now and cached.
fn etag_of(engine: &Engine, caller: &Caller, attr: &Attr) -> S3Result<String> {
    if let Some(e) = stored_etag(engine, caller, attr) {
        return Ok(e);
    }
    let etag = md5_of(engine, caller, attr.ino, attr.size)?;
    if let Ok(now) = engine.getattr(caller, attr.ino)
        && now.size == attr.size && now.mtime_ns == attr.mtime_ns
            && let Err(e) = save_etag(engine, attr.ino, &etag, attr) {
                tracing::debug!(ino = attr.ino, error = %e, "cache computed ETag");
            }
    Ok(etag)
}

/// The ETag shown in listings: stored, or computed for small files, or for large files
/// written through other protocols an opaque placeholder ending in `-0` (clients treat
/// dashed ETags as not-an-MD5 and do not verify content against them).
fn list_etag(engine: &Engine, caller: &Caller, attr: &Attr) -> String {
    if attr.kind == FileKind::Dir {
        // A folder object (`prefix/`).
        return hex::encode(Md5::digest(folder_content(engine, attr.ino).unwrap_or_default()));
    }
    if let Some(e) = stored_etag(engine, caller, attr) {
        return e;
    }
    if attr.size <= LIST_ETAG_COMPUTE_BYTES_MAX
        && let Ok(e) = etag_of(engine, caller, attr) {
            return e;
        }
    let mut h = Md5::new();
    h.update(attr.ino.to_be_bytes());
    h.update(attr.generation.to_be_bytes());
    h.update(attr.size.to_be_bytes());
    h.update(attr.mtime_ns.to_be_bytes());
    format!("{}-0", hex::encode(h.finalize()))
}

fn load_meta(engine: &Engine, caller: &Caller, ino: Ino) -> ObjectMeta {
    engine.getxattr(caller, ino, XATTR_META).map(|v| ObjectMeta::decode(&v)).unwrap_or_default()
}

fn load_tags(engine: &Engine, caller: &Caller, ino: Ino) -> Vec<(String, String)> {
    engine.getxattr(caller, ino, XATTR_TAGS).map(|v| decode_tags(&v)).unwrap_or_default()
}

// s3s's own conversions between PostObject and PutObject are private to it.
fn post_object_input_into_put_object_input(x: PostObjectInput) -> PutObjectInput {
    PutObjectInput {
        acl: x.acl,
        body: x.body,
        bucket: x.bucket,
        bucket_key_enabled: x.bucket_key_enabled,
        cache_control: x.cache_control,
        checksum_algorithm: x.checksum_algorithm,
        checksum_crc32: x.checksum_crc32,
        checksum_crc32c: x.checksum_crc32c,
        checksum_crc64nvme: x.checksum_crc64nvme,
        checksum_sha1: x.checksum_sha1,
        checksum_sha256: x.checksum_sha256,
        content_disposition: x.content_disposition,
        content_encoding: x.content_encoding,
        content_language: x.content_language,
        content_length: x.content_length,
        content_md5: x.content_md5,
        content_type: x.content_type,
        expected_bucket_owner: x.expected_bucket_owner,
        expires: x.expires,
        grant_full_control: x.grant_full_control,
        grant_read: x.grant_read,
        grant_read_acp: x.grant_read_acp,
        grant_write_acp: x.grant_write_acp,
        if_match: x.if_match,
        if_none_match: x.if_none_match,
        key: x.key,
        metadata: x.metadata,
        object_lock_legal_hold_status: x.object_lock_legal_hold_status,
        object_lock_mode: x.object_lock_mode,
        object_lock_retain_until_date: x.object_lock_retain_until_date,
        request_payer: x.request_payer,
        sse_customer_algorithm: x.sse_customer_algorithm,
        sse_customer_key: x.sse_customer_key,
        sse_customer_key_md5: x.sse_customer_key_md5,
        ssekms_encryption_context: x.ssekms_encryption_context,
        ssekms_key_id: x.ssekms_key_id,
        server_side_encryption: x.server_side_encryption,
        storage_class: x.storage_class,
        tagging: x.tagging,
        website_redirect_location: x.website_redirect_location,
        write_offset_bytes: x.write_offset_bytes,
    }
}
fn put_object_output_into_post_object_output(x: PutObjectOutput) -> PostObjectOutput {
    PostObjectOutput {
        bucket_key_enabled: x.bucket_key_enabled,
        checksum_crc32: x.checksum_crc32,
        checksum_crc32c: x.checksum_crc32c,
        checksum_crc64nvme: x.checksum_crc64nvme,
        checksum_sha1: x.checksum_sha1,
        checksum_sha256: x.checksum_sha256,
        checksum_type: x.checksum_type,
        e_tag: x.e_tag,
        expiration: x.expiration,
        request_charged: x.request_charged,
        sse_customer_algorithm: x.sse_customer_algorithm,
        sse_customer_key_md5: x.sse_customer_key_md5,
        ssekms_encryption_context: x.ssekms_encryption_context,
        ssekms_key_id: x.ssekms_key_id,
        server_side_encryption: x.server_side_encryption,
        size: x.size,
        version_id: x.version_id,
    }
}

/// A POST form's `tagging` field (an XML `Tagging` document) in `x-amz-tagging` form.
fn tagging_xml_as_header(xml: &str) -> S3Result<String> {
    let mut d = s3s::xml::Deserializer::new(xml.as_bytes());
    let tagging = <Tagging as s3s::xml::Deserialize>::deserialize(&mut d)
        .and_then(|t| d.expect_eof().map(|()| t))
        .map_err(|e| err(S3ErrorCode::MalformedXML, format!("the tagging field is not a Tagging document: {e}")))?;
    let pairs: Vec<String> = tagging
        .tag_set
        .iter()
        .map(|t| format!("{}={}", urlencoding::encode(t.key.as_deref().unwrap_or("")), urlencoding::encode(t.value.as_deref().unwrap_or(""))))
        .collect();
    Ok(pairs.join("&"))
}

/// Parses and checks an `x-amz-tagging` header (URL query form).
fn parse_tagging_header(h: &str) -> S3Result<Vec<(String, String)>> {
    let mut tags = Vec::new();
    for pair in h.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| {
            urlencoding::decode(&s.replace('+', " "))
                .map(|c| c.into_owned())
                .map_err(|_| err(S3ErrorCode::InvalidTag, "tag is not valid UTF-8"))
        };
        tags.push((dec(k)?, dec(v)?));
    }
    check_tags(&tags)?;
    Ok(tags)
}

fn check_tags(tags: &[(String, String)]) -> S3Result<()> {
    if tags.len() > TAGS_MAX {
        return Err(err(S3ErrorCode::InvalidTag, format!("at most {TAGS_MAX} tags per object")));
    }
    let mut seen = std::collections::HashSet::new();
    for (k, v) in tags {
        if k.is_empty() || k.len() > TAG_KEY_BYTES_MAX || v.len() > TAG_VALUE_BYTES_MAX {
            return Err(err(S3ErrorCode::InvalidTag, format!("tag keys are 1-{TAG_KEY_BYTES_MAX} bytes, values at most {TAG_VALUE_BYTES_MAX}")));
        }
        if !seen.insert(k) {
            return Err(err(S3ErrorCode::InvalidTag, "tag keys must be unique"));
        }
    }
    Ok(())
}

fn meta_from(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<Timestamp>,
    user: Option<Metadata>,
) -> ObjectMeta {
    let expires = expires.and_then(|t| {
        let mut b = Vec::new();
        t.format(TimestampFormat::HttpDate, &mut b).ok()?;
        String::from_utf8(b).ok()
    });
    ObjectMeta {
        content_type,
        content_encoding,
        content_disposition,
        content_language,
        cache_control,
        expires,
        user: user.unwrap_or_default().into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect(),
    }
}

/// The stored `Expires` date; one that no longer parses is left out rather than failing
/// the read.
fn expires_of(m: &ObjectMeta) -> Option<Timestamp> {
    m.expires.as_deref().and_then(|s| Timestamp::parse(TimestampFormat::HttpDate, s).ok())
}

fn user_metadata(m: &ObjectMeta) -> Option<Metadata> {
    (!m.user.is_empty()).then(|| m.user.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// The extended attributes that keep an object's metadata and tags (none for empty ones).
fn object_xattrs(meta: &ObjectMeta, tags: &[(String, String)]) -> Vec<(&'static [u8], Vec<u8>)> {
    let mut out = Vec::with_capacity(3);
    if !meta.is_empty() {
        out.push((XATTR_META, meta.encode()));
    }
    if !tags.is_empty() {
        out.push((XATTR_TAGS, encode_tags(tags)));
    }
    out
}

/// The extended attributes that record a new object for its data `attr`: the ETag and, for
/// one completed from parts, the part sizes (both naming that data's size and time), then
/// its metadata and tags.
fn object_records(etag: &str, attr: &Attr, parts: Option<&[u64]>, meta: &ObjectMeta, tags: &[(String, String)]) -> Vec<(&'static [u8], Vec<u8>)> {
    let mut set = vec![(XATTR_ETAG, StoredEtag { etag: etag.to_string(), size: attr.size, mtime_ns: attr.mtime_ns }.encode())];
    if let Some(parts) = parts {
        set.push((XATTR_PARTS, StoredParts { size: attr.size, mtime_ns: attr.mtime_ns, parts: parts.to_vec() }.encode()));
    }
    set.extend(object_xattrs(meta, tags));
    set
}

/// Sets `records` ([`object_records`]) on a new object's file in one change. The file is the
/// caller's own, made by the request that publishes it, so this runs as the system.
fn record_object(engine: &Engine, ino: Ino, records: &[(&'static [u8], Vec<u8>)]) -> S3Result<()> {
    let set: Vec<(&[u8], &[u8])> = records.iter().map(|(n, v)| (*n, &v[..])).collect();
    engine.set_xattrs(&Caller::system(), ino, &[], &set).map_err(|e| map_err(e, Missing::Key))
}

// ------------------------------------------------------------------ conditions

struct Conditions<'a> {
    if_match: Option<&'a ETagCondition>,
    if_none_match: Option<&'a ETagCondition>,
    if_modified_since: Option<&'a Timestamp>,
    if_unmodified_since: Option<&'a Timestamp>,
}

fn etag_matches(cond: &ETagCondition, etag: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == etag,
    }
}

impl Conditions<'_> {
    fn any(&self) -> bool {
        self.if_match.is_some() || self.if_none_match.is_some() || self.if_modified_since.is_some() || self.if_unmodified_since.is_some()
    }

    /// RFC 9110 §13.2.2 order, as S3 applies it to GET and HEAD: If-Match, else
    /// If-Unmodified-Since (412); If-None-Match, else If-Modified-Since (304). CopyObject's
    /// source conditions answer 412 for both (`read` false).
    fn check(&self, etag: &str, mtime_ns: i64, read: bool) -> S3Result<()> {
        let mtime = seconds(mtime_ns);
        if let Some(c) = self.if_match {
            if !etag_matches(c, etag) {
                return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
            }
        } else if let Some(t) = self.if_unmodified_since
            && mtime > ts_seconds(t) {
                return Err(S3Error::new(S3ErrorCode::PreconditionFailed));
            }
        let not_modified = if read { S3ErrorCode::NotModified } else { S3ErrorCode::PreconditionFailed };
        if let Some(c) = self.if_none_match {
            if etag_matches(c, etag) {
                return Err(S3Error::new(not_modified));
            }
        } else if let Some(t) = self.if_modified_since
            && mtime <= ts_seconds(t) {
                return Err(S3Error::new(not_modified));
            }
        Ok(())
    }
}

/// Conditional PUT: `If-None-Match: *` (create only) and `If-Match` (replace only that ETag).
/// Checked before the upload; a concurrent writer between check and publish wins or loses
/// the race like any overwrite.
fn check_put_conditions(engine: &Engine, caller: &Caller, bucket: Ino, key: &str, if_match: Option<&ETagCondition>, if_none_match: Option<&ETagCondition>) -> S3Result<()> {
    if if_match.is_none() && if_none_match.is_none() {
        return Ok(());
    }
    let existing = match object_attr(engine, caller, bucket, key) {
        Ok(a) => Some(etag_of(engine, caller, &a)?),
        Err(e) if *e.code() == S3ErrorCode::NoSuchKey => None,
        Err(e) => return Err(e),
    };
    if let Some(c) = if_none_match
        && existing.as_deref().is_some_and(|e| etag_matches(c, e)) {
            return Err(err(S3ErrorCode::PreconditionFailed, "the object exists"));
        }
    if let Some(c) = if_match {
        match existing {
            None => return Err(S3Error::new(S3ErrorCode::NoSuchKey)),
            Some(e) if !etag_matches(c, &e) => return Err(err(S3ErrorCode::PreconditionFailed, "ETag does not match")),
            Some(_) => {}
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ staged writes

/// A staged, not yet published file (a put-whole upload or a multipart part). Dropping it
/// while armed deletes it: that is what happens when a handler returns early or its future
/// is dropped because the client went away.
struct Staged {
    engine: Arc<Engine>,
    caller: Caller,
    ino: Ino,
    armed: bool,
}

impl Staged {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (engine, caller, ino) = (self.engine.clone(), self.caller.clone(), self.ino);
        let abort = move || match engine.abort_put(&caller, ino) {
            Ok(()) | Err(Error::NotFound) => {}
            Err(e) => tracing::warn!(ino, error = %e, "abort unfinished S3 upload"),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(abort);
            }
            Err(_) => abort(),
        }
    }
}

/// Checksums a client asked the server to verify (`x-amz-checksum-*`, in headers or in the
/// trailer of a streaming upload).
struct ChecksumCheck {
    hasher: s3s::checksum::ChecksumHasher,
    expected: Checksum,
}

impl ChecksumCheck {
    fn new(algorithm: Option<&ChecksumAlgorithm>, expected: Checksum) -> S3Result<ChecksumCheck> {
        let mut hasher = s3s::checksum::ChecksumHasher::default();
        if expected.checksum_crc32.is_some() {
            hasher.crc32 = Some(Default::default());
        }
        if expected.checksum_crc32c.is_some() {
            hasher.crc32c = Some(Default::default());
        }
        if expected.checksum_sha1.is_some() {
            hasher.sha1 = Some(Default::default());
        }
        if expected.checksum_sha256.is_some() {
            hasher.sha256 = Some(Default::default());
        }
        if expected.checksum_crc64nvme.is_some() {
            hasher.crc64nvme = Some(Default::default());
        }
        if let Some(alg) = algorithm {
            match alg.as_str() {
                ChecksumAlgorithm::CRC32 => hasher.crc32 = Some(Default::default()),
                ChecksumAlgorithm::CRC32C => hasher.crc32c = Some(Default::default()),
                ChecksumAlgorithm::SHA1 => hasher.sha1 = Some(Default::default()),
                ChecksumAlgorithm::SHA256 => hasher.sha256 = Some(Default::default()),
                ChecksumAlgorithm::CRC64NVME => hasher.crc64nvme = Some(Default::default()),
                other => return Err(err(S3ErrorCode::InvalidArgument, format!("unsupported checksum algorithm {other}"))),
            }
        }
        Ok(ChecksumCheck { hasher, expected })
    }

    /// Compares against the expected values, taking those from the trailer when the
    /// upload carried them there.
    fn verify(self, trailers: Option<&s3s::TrailingHeaders>) -> S3Result<Checksum> {
        let got = self.hasher.finalize();
        let mut want = self.expected;
        if let Some(h) = trailers.and_then(|t| t.take()) {
            let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
            want.checksum_crc32 = want.checksum_crc32.or(get("x-amz-checksum-crc32"));
            want.checksum_crc32c = want.checksum_crc32c.or(get("x-amz-checksum-crc32c"));
            want.checksum_sha1 = want.checksum_sha1.or(get("x-amz-checksum-sha1"));
            want.checksum_sha256 = want.checksum_sha256.or(get("x-amz-checksum-sha256"));
            want.checksum_crc64nvme = want.checksum_crc64nvme.or(get("x-amz-checksum-crc64nvme"));
        }
        let pairs = [
            ("CRC32", &want.checksum_crc32, &got.checksum_crc32),
            ("CRC32C", &want.checksum_crc32c, &got.checksum_crc32c),
            ("SHA1", &want.checksum_sha1, &got.checksum_sha1),
            ("SHA256", &want.checksum_sha256, &got.checksum_sha256),
            ("CRC64NVME", &want.checksum_crc64nvme, &got.checksum_crc64nvme),
        ];
        for (name, w, g) in pairs {
            if let Some(w) = w
                && g.as_ref() != Some(w) {
                    return Err(err(S3ErrorCode::BadDigest, format!("the {name} checksum of the body does not match")));
                }
        }
        Ok(got)
    }
}

/// A PUT body of at most this many bytes is received whole and then hashed, written and
/// published in one trip to the blocking pool: each trip costs a thread wake-up or two, and
/// for small objects those, not the bytes, were most of a PUT's time.
pub const SMALL_PUT_BYTES: usize = 256 << 10;

/// What a PutObject stores, besides its bytes: the checks before the object is staged and
/// what is written when it is published.
#[derive(Clone)]
struct PutPlan {
    engine: Arc<Engine>,
    caller: Caller,
    bucket: String,
    key: String,
    canned: Option<String>,
    headers: GrantHeaders,
    writer: Option<u32>,
    if_match: Option<ETagCondition>,
    if_none_match: Option<ETagCondition>,
    meta: ObjectMeta,
    tags: Vec<(String, String)>,
}

impl PutPlan {
    /// Checks the bucket, the requested ACL and the conditions; returns the bucket and the
    /// object's own ACL, if one was asked for.
    fn check(&self) -> S3Result<(Attr, Option<Acl>)> {
        let (e, c) = (&self.engine, &self.caller);
        let b = bucket_attr(e, c, &self.bucket)?;
        let acl = requested_object_acl(e, self.canned.as_deref(), &self.headers, self.writer, c.uid, b.uid)?;
        check_put_conditions(e, c, b.ino, &self.key, self.if_match.as_ref(), self.if_none_match.as_ref())?;
        Ok((b, acl))
    }

    /// Checks the request and stages an unnamed file for the object (aborted when the
    /// guard is dropped armed).
    fn stage(&self) -> S3Result<(Ino, Staged, Option<Acl>)> {
        let (b, acl) = self.check()?;
        self.stage_checked(&b, acl)
    }

    fn stage_checked(&self, b: &Attr, acl: Option<Acl>) -> S3Result<(Ino, Staged, Option<Acl>)> {
        let (e, c) = (&self.engine, &self.caller);
        let mode = acl.as_ref().map_or(FILE_MODE, |acl| object_acl_mode(acl, c.uid, FILE_MODE));
        let (parent, name) = e.object_parent(c, b.ino, &self.key, true).map_err(|e| map_err(e, Missing::Key))?;
        if let Ok(a) = e.lookup(c, parent, name.as_bytes())
            && a.kind == FileKind::Dir
        {
            return Err(map_err(Error::IsDir, Missing::Key));
        }
        let staged = e.begin_put(c, parent, mode).map_err(|e| map_err(e, Missing::Key))?;
        Ok((b.ino, Staged { engine: e.clone(), caller: c.clone(), ino: staged.ino, armed: true }, acl))
    }

    /// Stores a checked whole object as one engine command (`Engine::put_inline`: content,
    /// ETag, metadata and tags in one durable batch) when nothing asks for more: no ACL of
    /// its own, an unversioned bucket, content within the engine's inline limit. `None`:
    /// not stored, stage it.
    fn put_inline(&self, b: &Attr, acl: &Option<Acl>, data: &[u8], etag: &str) -> S3Result<Option<()>> {
        let (e, c) = (&self.engine, &self.caller);
        if !self.inline_allowed(b, acl) {
            return Ok(None);
        }
        let mut tries = 0;
        loop {
            let (parent, name) = e.object_parent(c, b.ino, &self.key, true).map_err(|e| map_err(e, Missing::Key))?;
            match e.put_inline(c, parent, name.as_bytes(), FILE_MODE, data, |size, mtime_ns| self.inline_xattrs(etag, size, mtime_ns)) {
                Ok(done) => return Ok(done.map(|_| ())),
                // The directory was removed between finding and linking: once more.
                Err(Error::NotFound) if tries == 0 => tries += 1,
                Err(e) => return Err(map_err(e, Missing::Key)),
            }
        }
    }

    /// Whether the object may be one `Engine::put_inline` command: no ACL of its own, an
    /// unversioned bucket (the size is the engine's to judge).
    fn inline_allowed(&self, b: &Attr, acl: &Option<Acl>) -> bool {
        acl.is_none() && bucket_versioning(&self.engine, b.ino).is_none()
    }

    /// What `put_inline` stores beside the content: the ETag, metadata and tags.
    fn inline_xattrs(&self, etag: &str, size: u64, mtime_ns: i64) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut x = vec![(XATTR_ETAG.to_vec(), StoredEtag { etag: etag.to_string(), size, mtime_ns }.encode())];
        if !self.meta.is_empty() {
            x.push((XATTR_META.to_vec(), self.meta.encode()));
        }
        if !self.tags.is_empty() {
            x.push((XATTR_TAGS.to_vec(), encode_tags(&self.tags)));
        }
        x
    }

    /// The checks of [`whole`](Self::whole) for an object to be stored where the request is
    /// served ([`try_store_here`](Self::try_store_here)), for an object that
    /// [`put_inline`](Self::put_inline) stores: `None` whenever `whole` would do more (the
    /// engine holds portal mirrors, content over the inline limit, an ACL of the object's own,
    /// a versioned bucket). Returns the ETag and the bucket.
    fn checks_here(&self, data: &[u8], content_md5: Option<&str>) -> Option<S3Result<(String, Ino)>> {
        let e = &self.engine;
        if e.holds_mirrors() || data.len() as u64 > e.inline_bytes_max() {
            return None;
        }
        let checked = checked_etag(data, content_md5).and_then(|etag| Ok((etag, self.check()?)));
        let (etag, (b, acl)) = match checked {
            Ok(v) => v,
            Err(x) => return Some(Err(x)),
        };
        if !self.inline_allowed(&b, &acl) {
            return None;
        }
        Some(Ok((etag, b.ino)))
    }

    /// `whole` without its log sync, once [`checks_here`](Self::checks_here) passed: the
    /// metadata reads as `whole` makes them, then `Engine::try_put_inline`; the caller awaits
    /// `Engine::durable` before it answers. Nothing is stored unless it says `Stored`.
    fn try_store_here(&self, bucket: Ino, etag: &str, data: &[u8]) -> Here {
        let (e, c) = (&self.engine, &self.caller);
        // A directory of the key to be made, or any error on the way to it: `whole` makes
        // it, or answers the error as it does.
        let Ok((parent, name)) = e.object_parent(c, bucket, &self.key, false) else {
            return Here::Elsewhere;
        };
        match e.try_put_inline(c, parent, name.as_bytes(), FILE_MODE, data, |size, mtime_ns| self.inline_xattrs(etag, size, mtime_ns)) {
            // The mutation lock is taken, or RocksDB would stall the write.
            None => Here::Busy,
            Some(Ok(_)) => Here::Stored(Ok(())),
            // The directory was removed meanwhile: `whole` makes it again.
            Some(Err(Error::NotFound)) => Here::Elsewhere,
            Some(Err(x)) => Here::Stored(Err(map_err(x, Missing::Key))),
        }
    }

    /// Publishes the staged file with its ACL, ETag, metadata and tags. Runs on the blocking
    /// pool with the guard moved there, so that a client leaving now can neither interrupt
    /// it nor abort a published file.
    fn finish(&self, bucket_ino: Ino, acl: Option<Acl>, staged: Staged, etag: String) -> S3Result<Option<String>> {
        if let Some(acl) = &acl {
            // A public-read object is marked: anonymous clients may read it even in a
            // private bucket.
            apply_object_acl_xattrs(&staged.engine, &staged.caller, staged.ino, staged.caller.uid, acl).map_err(|e| map_err(e, Missing::Key))?;
        }
        let (_, version_id) = publish(&staged.engine, &staged.caller, bucket_ino, &self.key, staged.ino, &etag, &self.meta, &self.tags)?;
        staged.disarm();
        Ok(version_id)
    }

    /// A whole body in one go: hashed, checked against Content-MD5, staged (unless it was),
    /// written and published. Returns the ETag and the version id.
    fn whole(&self, staged: Option<(Ino, Staged, Option<Acl>)>, data: Vec<u8>, content_md5: Option<&str>) -> S3Result<(String, Option<String>)> {
        let etag = checked_etag(&data, content_md5)?;
        let (bucket_ino, staged, acl) = match staged {
            Some(s) => s,
            None => {
                let (b, acl) = self.check()?;
                if self.put_inline(&b, &acl, &data, &etag)?.is_some() {
                    return Ok((etag, None));
                }
                self.stage_checked(&b, acl)?
            }
        };
        if !data.is_empty() {
            staged.engine.write(&staged.caller, staged.ino, 0, &data, Stability::Unstable).map_err(|e| map_err(e, Missing::Key))?;
        }
        let version_id = self.finish(bucket_ino, acl, staged, etag.clone())?;
        Ok((etag, version_id))
    }
}

fn put_object_output(etag: String, version_id: Option<String>, sums: Checksum) -> PutObjectOutput {
    PutObjectOutput {
        e_tag: Some(quoted(&etag)),
        version_id,
        checksum_crc32: sums.checksum_crc32,
        checksum_crc32c: sums.checksum_crc32c,
        checksum_sha1: sums.checksum_sha1,
        checksum_sha256: sums.checksum_sha256,
        checksum_crc64nvme: sums.checksum_crc64nvme,
        ..Default::default()
    }
}

/// The error for a request body that could not be read to its end. s3s's `aws-chunked`
/// decoder, whose error type is private to it, reports a chunk whose signature does not follow
/// from the one before as `AwsChunkedStreamError: SignatureMismatch`; S3 answers that with
/// `SignatureDoesNotMatch` (403). (s3s is pinned; `tests/bad_input.rs` checks the answer.)
fn body_error(e: impl std::fmt::Display) -> S3Error {
    let m = e.to_string();
    if m.ends_with("SignatureMismatch") {
        err(S3ErrorCode::SignatureDoesNotMatch, "a chunk's signature does not follow from the upload's signatures")
    } else {
        err(S3ErrorCode::IncompleteBody, format!("read request body: {m}"))
    }
}

/// A PUT body read until its end or past [`SMALL_PUT_BYTES`].
enum Received {
    Whole(Vec<u8>),
    /// The first bytes, and the rest of the stream.
    Started(Vec<u8>, StreamingBlob),
}

/// Reads `body` until it ends or passes [`SMALL_PUT_BYTES`], giving every byte to `check`.
async fn receive_small(mut body: StreamingBlob, check: &mut ChecksumCheck) -> S3Result<Received> {
    let mut buf = Vec::new();
    while let Some(frame) = body.next().await {
        let bytes = frame.map_err(body_error)?;
        check.hasher.update(&bytes);
        buf.extend_from_slice(&bytes);
        if buf.len() > SMALL_PUT_BYTES {
            return Ok(Received::Started(buf, body));
        }
    }
    Ok(Received::Whole(buf))
}

/// Streams `body` into the staged file `ino` in [`PUT_CHUNK_BYTES`] writes. Receiving,
/// hashing (MD5, which runs at about one core's worth of a fast link) and writing (erasure
/// coding, drive I/O) overlap: each piece is hashed and written by two tasks on the blocking
/// pool while the next one is received, one piece in flight for each. Returns (bytes, MD5).
///
/// `received` is the start of the body, already read (and given to `check`).
async fn write_body(engine: &Arc<Engine>, caller: &Caller, ino: Ino, received: Vec<u8>, body: StreamingBlob, check: &mut ChecksumCheck) -> S3Result<(u64, [u8; 16])> {
    use tokio::task::JoinHandle;
    async fn joined<T>(t: JoinHandle<S3Result<T>>) -> S3Result<T> {
        t.await.map_err(|e| internal(format!("blocking task failed: {e}")))?
    }
    let mut body = body;
    let mut md5 = Some(crate::md5::StreamMd5::new());
    let mut hashing: Option<JoinHandle<S3Result<crate::md5::StreamMd5>>> = None;
    let mut writing: Option<JoinHandle<S3Result<()>>> = None;
    // Chunks of exactly PUT_CHUNK_BYTES (but the last), in aligned buffers (huge pages, kept
    // for reuse): uploads' chunks of one size share the MD5 lanes (md5.rs), and the engine
    // keeps each chunk as it is in the file's write buffer and writes its stripes' data
    // shards from it, so the body is copied once, from the frames into the chunk.
    let mut buf = FillBuf::with_room(PUT_CHUNK_BYTES);
    let mut offset = 0u64;
    let mut rest = Bytes::from(received);
    let mut done = false;
    loop {
        if rest.is_empty() && !done {
            match body.next().await {
                None => done = true,
                Some(Ok(b)) => {
                    check.hasher.update(&b);
                    rest = b;
                }
                Some(Err(e)) => {
                    // The piece in flight lands before the caller aborts the staged file.
                    if let Some(w) = writing.take() {
                        let _ = w.await;
                    }
                    return Err(body_error(e));
                }
            }
        }
        let fit = (PUT_CHUNK_BYTES - buf.len()).min(rest.len());
        buf.extend_from_slice(&rest[..fit]);
        rest = rest.slice(fit..);
        if buf.len() == PUT_CHUNK_BYTES || (done && !buf.is_empty()) {
            let chunk = Arc::new(std::mem::replace(&mut buf, FillBuf::with_room(PUT_CHUNK_BYTES)).freeze());
            let mut h = match hashing.take() {
                Some(t) => joined(t).await?,
                None => md5.take().expect("the hasher is here when no piece is being hashed"),
            };
            let c: crate::md5::Chunk = chunk.clone();
            hashing = Some(tokio::task::spawn_blocking(move || {
                h.update(c);
                Ok(h)
            }));
            if let Some(w) = writing.take() {
                joined(w).await?;
            }
            let (engine, c, at) = (engine.clone(), caller.clone(), offset);
            offset += chunk.len() as u64;
            writing = Some(tokio::task::spawn_blocking(move || engine.write_shared(&c, ino, at, chunk).map_err(|e| map_err(e, Missing::Key))));
        }
        if done && buf.is_empty() {
            break;
        }
    }
    if let Some(w) = writing {
        joined(w).await?;
    }
    let h = match hashing {
        Some(t) => joined(t).await?,
        None => md5.expect("the hasher is here when no piece is being hashed"),
    };
    // The digest waits for the hashing thread to reach this upload's last chunks.
    let md5 = tokio::task::spawn_blocking(move || h.finalize()).await.map_err(|e| internal(format!("blocking task failed: {e}")))?;
    Ok((offset, md5))
}

/// The ETag of a body received whole (its MD5, hex), once it matches the Content-MD5 sent.
fn checked_etag(data: &[u8], content_md5: Option<&str>) -> S3Result<String> {
    let md5 = Md5::digest(data);
    check_content_md5(content_md5, &md5)?;
    Ok(hex::encode(md5))
}

fn check_content_md5(content_md5: Option<&str>, md5: &[u8; 16]) -> S3Result<()> {
    let Some(b64) = content_md5 else { return Ok(()) };
    let want = base64_decode(b64.trim()).ok_or_else(|| err(S3ErrorCode::InvalidDigest, "Content-MD5 is not base64"))?;
    if want.len() != 16 {
        return Err(err(S3ErrorCode::InvalidDigest, "Content-MD5 is not 16 bytes"));
    }
    if want != md5 {
        return Err(err(S3ErrorCode::BadDigest, "the Content-MD5 of the body does not match"));
    }
    Ok(())
}

/// Base64 (standard alphabet), padding optional.
pub(crate) fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        })
    };
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= val(*c)? << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        match chunk.len() {
            4 => out.extend_from_slice(&bytes[1..4]),
            3 => out.extend_from_slice(&bytes[1..3]),
            2 => out.push(bytes[1]),
            _ => return None,
        }
    }
    Some(out)
}

/// Publishes a staged file under `key` after recording its ETag and metadata. The data is
/// written out first (so the recorded size and time are final) but made durable only by
/// the publish itself, which syncs data and metadata once. If the key's directory vanished meanwhile (pruned by a concurrent
/// delete), it is made again once.
/// In a versioned bucket the object it replaces becomes a noncurrent version; the new
/// version's id comes back when versioning is enabled (S3 names none for a suspended bucket).
#[allow(clippy::too_many_arguments)] // one staged object and everything published with it
fn publish(engine: &Engine, caller: &Caller, bucket: Ino, key: &str, ino: Ino, etag: &str, meta: &ObjectMeta, tags: &[(String, String)]) -> S3Result<(Attr, Option<String>)> {
    engine.close(caller, ino).map_err(|e| map_err(e, Missing::Key))?;
    let staged = engine.getattr(caller, ino).map_err(|e| map_err(e, Missing::Key))?;
    record_object(engine, ino, &object_records(etag, &staged, None, meta, tags))?;
    let versioning = bucket_versioning(engine, bucket);
    let mut tries = 0;
    loop {
        let (parent, name) = engine.object_parent(caller, bucket, key, true).map_err(|e| map_err(e, Missing::Key))?;
        let done = match versioning {
            Some(mode) => engine
                .finish_put_versioned(caller, ino, parent, name.as_bytes(), bucket, key, mode)
                .map(|(a, id)| (a, (mode == VersionMode::Enabled).then_some(id))),
            None => engine.finish_put(caller, ino, parent, name.as_bytes()).map(|a| (a, None)),
        };
        match done {
            Ok(a) => return Ok(a),
            Err(Error::NotFound) if tries == 0 => tries += 1,
            Err(e) => return Err(map_err(e, Missing::Key)),
        }
    }
}

// ------------------------------------------------------------------ download

/// Streams [start, end) of a file. The first engine read is one stripe
/// ([`READ_PIECE_BYTES_MAX`]), so a small or ranged GET reads no more than it sends; later
/// ones are [`READ_WINDOW_BYTES`], which the drives serve with one larger request each, and
/// the next one is read while the client takes the one before. A read error (e.g. the object
/// was replaced meanwhile) ends the body early, which aborts the response.
fn read_stream(engine: Arc<Engine>, caller: Caller, ino: Ino, start: u64, end: u64) -> StreamingBlob {
    // A read comes back in pieces of at most one 1 MiB shard each.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(READ_AHEAD_PIECES * READ_PIECE_BYTES_MAX.div_ceil(1 << 20));
    tokio::spawn(async move {
        let mut next = start;
        let mut reads = std::collections::VecDeque::new();
        loop {
            while reads.len() < READ_WINDOWS_IN_FLIGHT && next < end {
                // A window's bytes count against the budget until the client has them all.
                let budget = (next != start && end - next > READ_PIECE_BYTES_MAX as u64)
                    .then(|| READ_WINDOW_BUDGET.try_acquire_many((READ_WINDOW_BYTES >> 20) as u32).ok())
                    .flatten()
                    .map(Arc::new);
                let window = if budget.is_some() { READ_WINDOW_BYTES } else { READ_PIECE_BYTES_MAX };
                let len = window.min((end - next) as usize);
                let (e, c, off) = (engine.clone(), caller.clone(), next);
                // The pieces are the drive reads' own buffers (no copy into one piece first).
                reads.push_back((len, budget, tokio::task::spawn_blocking(move || e.read_shared(&c, ino, off, len))));
                next += len as u64;
            }
            let Some((asked, budget, read)) = reads.pop_front() else { return };
            let res = match read.await {
                Ok(Ok(p)) if p.iter().any(|b| !b.is_empty()) => Ok(p),
                Ok(Ok(_)) => Err("the object shrank while it was read".to_string()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let pieces = match res {
                Ok(p) => p,
                Err(m) => {
                    tracing::debug!(ino, error = %m, "S3 download ended early");
                    let _ = tx.send(Err(std::io::Error::other(m))).await;
                    return;
                }
            };
            let got: usize = pieces.iter().map(|p| p.len()).sum();
            for piece in pieces {
                if tx.send(Ok(Bytes::from_owner(Shared { bytes: piece, _budget: budget.clone() }))).await.is_err() {
                    return; // the client went away
                }
            }
            if got < asked {
                // The object shrank: what the reads after this one hold does not follow on.
                tracing::debug!(ino, "S3 download ended early: the object shrank while it was read");
                let _ = tx.send(Err(std::io::Error::other("the object shrank while it was read"))).await;
                return;
            }
        }
    });
    StreamingBlob::wrap(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// A piece of a read, sent as it lies in the drive buffer, and the share of the download
/// budget its window holds (given back when the window's last piece is sent).
struct Shared {
    bytes: storage_engine::ReadBytes,
    _budget: Option<Arc<tokio::sync::SemaphorePermit<'static>>>,
}

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

struct ObjectView {
    attr: Attr,
    /// A folder object's content (its key ends in '/'); other objects' bytes are read from
    /// the file.
    content: Option<Bytes>,
    etag: String,
    meta: ObjectMeta,
    tags: usize,
    /// The version's id, in a bucket that is or was versioned.
    version_id: Option<String>,
}

/// `view_object` on the blocking pool, where it may read the object's bytes for its ETag.
async fn view_object_blocking(engine: &Arc<Engine>, caller: &Caller, bucket: &str, key: &str, version: Option<String>) -> S3Result<ObjectView> {
    let (e, c, bucket, key) = (engine.clone(), caller.clone(), bucket.to_string(), key.to_string());
    blocking(move || view_object(&e, &c, &bucket, &key, version.as_deref(), false)?.ok_or_else(|| internal("no object view from a lookup that may read"))).await
}

/// Looks up an object (or a `prefix/` directory, shown as an empty object) for GET/HEAD:
/// the current version, or version `version`. With `in_place` (where the request is served,
/// metadata reads only), `None` when the object's ETag is not stored and would have to be
/// computed from its bytes.
fn view_object(engine: &Engine, caller: &Caller, bucket: &str, key: &str, version: Option<&str>, in_place: bool) -> S3Result<Option<ObjectView>> {
    let b = bucket_attr(engine, caller, bucket)?;
    match parse_key(key)? {
        KeyForm::Dir(path) => {
            if version.is_some_and(|v| v != NULL_VERSION) {
                return Err(err(S3ErrorCode::NoSuchVersion, "a key ending in '/' names a directory, whose only version is null"));
            }
            let attr = dir_attr(engine, caller, b.ino, path)?;
            // Any directory answers, as an empty object unless it is a folder object.
            let content = folder_content(engine, attr.ino).unwrap_or_default();
            if !content.is_empty() && engine.access(caller, attr.ino, ACCESS_READ).map_err(|e| map_err(e, Missing::Key))? & ACCESS_READ == 0 {
                return Err(err(S3ErrorCode::AccessDenied, "the directory's mode does not let you read it"));
            }
            Ok(Some(ObjectView {
                etag: hex::encode(Md5::digest(&content)),
                meta: load_meta(engine, caller, attr.ino),
                tags: load_tags(engine, caller, attr.ino).len(),
                attr: Attr { size: content.len() as u64, ..attr },
                content: Some(Bytes::from(content)),
                version_id: None,
            }))
        }
        KeyForm::Object(k) => {
            let attr = version_attr(engine, caller, b.ino, k, version)?;
            // Reading the bytes checks the mode, but an empty object (or a cached ETag) needs
            // no read: ask, so that a private object is refused whatever its size.
            if engine.access(caller, attr.ino, ACCESS_READ).map_err(|e| map_err(e, Missing::Key))? & ACCESS_READ == 0 {
                return Err(err(S3ErrorCode::AccessDenied, "the object's mode does not let you read it"));
            }
            let etag = match stored_etag(engine, caller, &attr) {
                Some(etag) => etag,
                None if in_place => return Ok(None),
                None => etag_of(engine, caller, &attr)?,
            };
            let meta = load_meta(engine, caller, attr.ino);
            let tags = load_tags(engine, caller, attr.ino).len();
            let version_id = reported_version(engine, b.ino, attr.ino)?;
            Ok(Some(ObjectView { attr, content: None, etag, meta, tags, version_id }))
        }
    }
}

/// A bucket's versioning state; `None` when it was never versioned.
pub(crate) fn bucket_versioning(engine: &Engine, bucket: Ino) -> Option<VersionMode> {
    match engine.getxattr(&Caller::system(), bucket, XATTR_VERSIONING).ok()?.as_slice() {
        b"Enabled" => Some(VersionMode::Enabled),
        b"Suspended" => Some(VersionMode::Suspended),
        _ => None,
    }
}

/// A version id from a request: `null` or one of Aquifer's; anything else is refused as S3
/// does.
fn check_version_id(v: Option<&str>) -> S3Result<Option<String>> {
    match v {
        None => Ok(None),
        Some(id) if storage_engine::is_version_id(id) => Ok(Some(id.to_string())),
        Some(_) => Err(err(S3ErrorCode::InvalidArgument, "Invalid version id specified")),
    }
}

/// An error about a delete marker carries `x-amz-delete-marker` and the marker's version id,
/// as in S3.
fn marker_error(mut e: S3Error, id: &str) -> S3Error {
    let mut h = http::HeaderMap::new();
    h.insert("x-amz-delete-marker", http::HeaderValue::from_static("true"));
    if let Ok(v) = http::HeaderValue::from_str(id) {
        h.insert("x-amz-version-id", v);
    }
    e.set_headers(h);
    e
}

/// The file holding version `id` of `key` (the current one without `id`): NoSuchKey,
/// NoSuchVersion, or `405 MethodNotAllowed` for a delete marker (as S3). NoSuchKey for a key
/// whose newest version is a delete marker names the marker.
fn version_attr(engine: &Engine, caller: &Caller, bucket: Ino, key: &str, id: Option<&str>) -> S3Result<Attr> {
    let Some(id) = id else {
        return object_attr(engine, caller, bucket, key).map_err(|e| {
            if *e.code() != S3ErrorCode::NoSuchKey || bucket_versioning(engine, bucket).is_none() {
                return e;
            }
            match engine.latest_delete_marker(caller, bucket, key) {
                Ok(Some(marker)) => marker_error(e, &marker),
                _ => e,
            }
        });
    };
    match engine.find_version(caller, bucket, key, id) {
        Ok(FoundVersion::Current(a) | FoundVersion::Noncurrent(a)) => Ok(a),
        Ok(FoundVersion::DeleteMarker { .. }) => Err(marker_error(err(S3ErrorCode::MethodNotAllowed, "the version is a delete marker"), id)),
        Err(Error::NotFound) => Err(err(S3ErrorCode::NoSuchVersion, "The specified version does not exist.")),
        Err(e) => Err(map_err(e, Missing::Key)),
    }
}

/// The version id to answer with: the object's in a bucket that is or was versioned, none
/// in one that never was.
fn reported_version(engine: &Engine, bucket: Ino, ino: Ino) -> S3Result<Option<String>> {
    if bucket_versioning(engine, bucket).is_none() {
        return Ok(None);
    }
    engine.version_id_of(ino).map(Some).map_err(|e| map_err(e, Missing::Key))
}

/// What a GET or HEAD names: the object (a version of it), and a Range or a part of it.
struct ObjectAsked<'a> {
    bucket: &'a str,
    key: &'a str,
    version_id: Option<&'a str>,
    part_number: Option<i32>,
    range: Option<&'a s3s::dto::Range>,
}

/// What a GET or HEAD answers with: the object, the bytes it sends (all, a Range or a
/// part), their Content-Range and the object's parts count.
struct Selected {
    view: ObjectView,
    range: std::ops::Range<u64>,
    content_range: Option<String>,
    parts_count: Option<i32>,
}

/// Looks the object up and checks the request's conditions and its Range or part number,
/// as GET and HEAD both do. `range_header` is the Range as sent, for the error's details.
async fn select_object(engine: &Arc<Engine>, caller: &Caller, asked: ObjectAsked<'_>, conds: Conditions<'_>, range_header: Option<&http::HeaderValue>) -> S3Result<Selected> {
    let vid = check_version_id(asked.version_id)?;
    if asked.part_number.is_some() && asked.range.is_some() {
        return Err(err(S3ErrorCode::InvalidRequest, "a Range header and partNumber cannot both be given"));
    }
    // Metadata reads only, while no inode is a portal mirror (whose reads may wait for its
    // hub): made where the request is served, not in a trip to the blocking pool.
    let here = if engine.holds_mirrors() { None } else { view_object(engine, caller, asked.bucket, asked.key, vid.as_deref(), true)? };
    let view = match here {
        Some(view) => view,
        None => view_object_blocking(engine, caller, asked.bucket, asked.key, vid).await?,
    };
    conds.check(&view.etag, view.attr.mtime_ns, true)?;
    let size = view.attr.size;
    let part = match asked.part_number {
        Some(n) => {
            let (e, c, a, t) = (engine.clone(), caller.clone(), view.attr.clone(), view.etag.clone());
            Some(blocking(move || part_range(&e, &c, &a, &t, n)).await?)
        }
        None => None,
    };
    let (range, content_range) = match (&part, asked.range) {
        (Some((r, _)), _) => (r.clone(), (!r.is_empty()).then(|| content_range(r, size))),
        (None, None) => (0..size, None),
        (None, Some(r)) => {
            let r = r.check(size).map_err(|e| invalid_range(e, range_header, size))?;
            let cr = content_range(&r, size);
            (r, Some(cr))
        }
    };
    let parts_count = part.map_or_else(|| parts_count(&view.etag), |(_, count)| count);
    Ok(Selected { view, range, content_range, parts_count })
}

fn content_range(r: &std::ops::Range<u64>, size: u64) -> String {
    format!("bytes {}-{}/{}", r.start, r.end - 1, size)
}

/// Most parts an object has (as S3).
const PART_NUMBER_MAX: i32 = 10_000;

/// The bytes of part `n` of an object, for GetObject and HeadObject with `partNumber`, and
/// its part count when it was uploaded in parts. An object put whole (or rewritten through
/// another protocol since) is one part. The AWS CRT asks for part 1 of an object it found
/// empty by a ranged GET.
fn part_range(engine: &Engine, caller: &Caller, attr: &Attr, etag: &str, n: i32) -> S3Result<(std::ops::Range<u64>, Option<i32>)> {
    if !(1..=PART_NUMBER_MAX).contains(&n) {
        return Err(err(S3ErrorCode::InvalidArgument, format!("part number must be an integer between 1 and {PART_NUMBER_MAX}, inclusive")));
    }
    let not_satisfiable = || {
        let mut e = err(S3ErrorCode::Custom("InvalidPartNumber".into()), "the requested part number is not satisfiable");
        e.set_status_code(http::StatusCode::RANGE_NOT_SATISFIABLE);
        e
    };
    let Some(count) = parts_count(etag) else {
        return if n == 1 { Ok((0..attr.size, None)) } else { Err(not_satisfiable()) };
    };
    let stored = engine
        .getxattr(caller, attr.ino, XATTR_PARTS)
        .ok()
        .and_then(|v| StoredParts::decode(&v))
        .filter(|p| p.size == attr.size && p.mtime_ns == attr.mtime_ns && p.parts.len() == count as usize)
        .ok_or_else(|| err(S3ErrorCode::NotImplemented, "this object's part sizes were not recorded when it was completed"))?;
    if n > count {
        return Err(not_satisfiable());
    }
    let start: u64 = stored.parts[..n as usize - 1].iter().sum();
    Ok((start..start + stored.parts[n as usize - 1], Some(count)))
}

fn parts_count(etag: &str) -> Option<i32> {
    etag.rsplit_once('-').and_then(|(_, n)| n.parse().ok()).filter(|n| *n > 0)
}

// ------------------------------------------------------------------ listing

/// URL-encodes a key for `encoding-type=url` answers (everything but unreserved and '/').
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn max_keys(v: Option<i32>) -> S3Result<usize> {
    match v {
        None => Ok(LIST_KEYS_DEFAULT),
        Some(n) if n < 0 => Err(err(S3ErrorCode::InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(LIST_KEYS_DEFAULT)),
    }
}

/// An unsatisfiable range, answered as S3 does: `416 InvalidRange` with the range asked for
/// and the object's size in the error. Clients rely on `ActualObjectSize`: the AWS CRT (under
/// PyTorch's S3 connector, Mountpoint and the CRT transfer managers) reads every object with
/// ranged GETs and knows an empty object only by `ActualObjectSize` 0 in that error.
fn invalid_range(e: impl Into<S3Error>, requested: Option<&http::HeaderValue>, size: u64) -> S3Error {
    let e = e.into();
    if *e.code() != S3ErrorCode::InvalidRange {
        return e;
    }
    let requested = requested.and_then(|v| v.to_str().ok()).unwrap_or("");
    let detail = format!("<RangeRequested>{}</RangeRequested><ActualObjectSize>{size}</ActualObjectSize>", crate::server::xml_escape(requested));
    crate::server::with_error_detail(e, &detail)
}

/// Ceph RGW's `allow-unordered=true` listing parameter, which some clients send for speed.
/// Aquifer's listings are always in key order, which is one of the orders it allows; what
/// it forbids, a delimiter with it, is refused as RGW refuses it.
fn check_allow_unordered(uri: &http::Uri, delimiter: Option<&str>) -> S3Result<()> {
    let unordered = uri.query().unwrap_or("").split('&').any(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        k == "allow-unordered" && v.eq_ignore_ascii_case("true")
    });
    if unordered && delimiter.is_some() {
        return Err(err(S3ErrorCode::InvalidArgument, "allow-unordered cannot be combined with a delimiter"));
    }
    Ok(())
}

struct Listing {
    objects: Vec<(String, Attr, String)>,
    prefixes: Vec<String>,
    next: Option<String>,
}

fn list(engine: &Engine, caller: &Caller, bucket: &str, prefix: &str, delimiter: Option<&str>, start_after: &str, max: usize) -> S3Result<Listing> {
    let b = bucket_attr(engine, caller, bucket)?;
    if max == 0 {
        return Ok(Listing { objects: vec![], prefixes: vec![], next: None });
    }
    let page = engine
        .list_objects(caller, b.ino, prefix.as_bytes(), delimiter.map(str::as_bytes), start_after.as_bytes(), max)
        .map_err(|e| map_err(e, Missing::Bucket))?;
    let utf8 = |v: Vec<u8>| String::from_utf8(v).map_err(|_| internal("a stored name is not UTF-8"));
    let mut objects = Vec::with_capacity(page.objects.len());
    for o in page.objects {
        let etag = list_etag(engine, caller, &o.attr);
        objects.push((utf8(o.key)?, o.attr, etag));
    }
    let prefixes = page.common_prefixes.into_iter().map(utf8).collect::<S3Result<Vec<_>>>()?;
    let next = page.next_start_after.map(utf8).transpose()?;
    Ok(Listing { objects, prefixes, next })
}

/// [`list`], with the owner (id and display name) of each object's uid when `owners`.
#[allow(clippy::too_many_arguments)] // list's arguments and one switch
fn list_with_owners(engine: &Engine, caller: &Caller, bucket: &str, prefix: &str, delimiter: Option<&str>, start_after: &str, max: usize, owners: bool) -> S3Result<(Listing, BTreeMap<u32, Owner>)> {
    let l = list(engine, caller, bucket, prefix, delimiter, start_after, max)?;
    let mut by_uid = BTreeMap::new();
    if owners {
        for (_, a, _) in &l.objects {
            by_uid.entry(a.uid).or_insert_with(|| owner_of(engine, a.uid));
        }
    }
    Ok((l, by_uid))
}

fn owner_of(engine: &Engine, uid: u32) -> Owner {
    let name = engine.caller_for_uid(uid, 0, &[]).map(|c| c.user).unwrap_or_else(|_| format!("uid:{uid}"));
    Owner { display_name: Some(name), id: Some(uid.to_string()) }
}

fn encode_token(key: &str) -> String {
    hex::encode(key.as_bytes())
}

fn decode_token(t: &str) -> S3Result<String> {
    hex::decode(t)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| err(S3ErrorCode::InvalidArgument, "the continuation token is not one this server issued"))
}

// ------------------------------------------------------------------ multipart helpers

fn upload_of(engine: &Engine, caller: &Caller, bucket: &str, key: &str, id: &str) -> S3Result<(Attr, storage_engine::UploadInfo)> {
    let b = bucket_attr(engine, caller, bucket)?;
    let u = engine.multipart_get(caller, id).map_err(|e| map_err(e, Missing::Upload))?;
    if u.bucket != b.ino || u.key != key {
        return Err(S3Error::new(S3ErrorCode::NoSuchUpload));
    }
    Ok((b, u))
}

fn check_part_number(n: i32) -> S3Result<u32> {
    if !(1..=storage_engine::PARTS_MAX as i32).contains(&n) {
        return Err(err(S3ErrorCode::InvalidArgument, format!("part numbers are 1-{}", storage_engine::PARTS_MAX)));
    }
    Ok(n as u32)
}

/// Parses `bytes=a-b` of UploadPartCopy against a source of `size` bytes.
fn copy_range(r: Option<&str>, size: u64) -> S3Result<(u64, u64)> {
    let Some(r) = r else { return Ok((0, size)) };
    let bad = || err(S3ErrorCode::InvalidArgument, "x-amz-copy-source-range must be bytes=first-last");
    let spec = r.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    let (a, b) = spec.split_once('-').ok_or_else(bad)?;
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    if a > b || b >= size {
        return Err(err(S3ErrorCode::InvalidRange, "the copy range is outside the source object"));
    }
    Ok((a, b + 1))
}

/// Copies [start, end) of `src` into the staged file `dst`; returns the MD5.
/// Copies `src[start..end)` to `dst`: `reader` reads the source, `writer` writes the
/// destination (they differ when a bucket policy grants one side).
fn copy_data(engine: &Engine, reader: &Caller, writer: &Caller, src: Ino, start: u64, end: u64, dst: Ino) -> S3Result<[u8; 16]> {
    let mut h = Md5::new();
    let mut off = start;
    while off < end {
        let len = READ_PIECE_BYTES_MAX.min((end - off) as usize);
        let piece = engine.read(reader, src, off, len).map_err(|e| map_err(e, Missing::Key))?;
        if piece.is_empty() {
            return Err(internal("copy source shrank while it was read"));
        }
        h.update(&piece);
        engine.write(writer, dst, off - start, &piece, Stability::Unstable).map_err(|e| map_err(e, Missing::Key))?;
        off += piece.len() as u64;
    }
    Ok(h.finalize().into())
}

/// (bucket, key, version id) of a copy source.
fn copy_source(cs: &CopySource) -> S3Result<(String, String, Option<String>)> {
    match cs {
        CopySource::Bucket { bucket, key, version_id } => {
            let v = check_version_id(version_id.as_deref())?;
            Ok((bucket.to_string(), key.to_string(), v))
        }
        _ => Err(err(S3ErrorCode::NotImplemented, "copy sources must be bucket/key")),
    }
}

/// The bucket, when `caller` owns it or is an administrator: bucket settings (policy,
/// lifecycle) are the owner's, as in S3 (a policy can delegate them: the request then runs
/// as the owner).
fn owned_bucket(engine: &Engine, caller: &Caller, bucket: &str, what: &str) -> S3Result<Attr> {
    let b = bucket_attr(engine, caller, bucket)?;
    if caller.uid != b.uid && caller.uid != 0 && caller.role < storage_engine::Role::Admin {
        return Err(err(S3ErrorCode::AccessDenied, format!("only the bucket's owner may read or change its {what}")));
    }
    Ok(b)
}

/// One of a bucket's settings kept as an xattr of its directory (`name`: policy, lifecycle):
/// `None` when the bucket has none. Only the owner or an administrator reads it.
async fn bucket_setting(engine: Arc<Engine>, caller: Caller, bucket: String, what: &'static str, name: &'static [u8]) -> S3Result<Option<Vec<u8>>> {
    blocking(move || {
        let b = owned_bucket(&engine, &caller, &bucket, what)?;
        match engine.getxattr(&Caller::system(), b.ino, name) {
            Ok(v) => Ok(Some(v)),
            Err(Error::NotFound) => Ok(None),
            Err(e) => Err(map_err(e, Missing::Bucket)),
        }
    })
    .await
}

/// Stores (`Some`) or removes (`None`) one of a bucket's settings; removing one the bucket
/// does not have succeeds. Only the owner or an administrator changes it.
async fn set_bucket_setting(engine: Arc<Engine>, caller: Caller, bucket: String, what: &'static str, name: &'static [u8], value: Option<Vec<u8>>) -> S3Result<()> {
    blocking(move || {
        let b = owned_bucket(&engine, &caller, &bucket, what)?;
        let res = match &value {
            Some(v) => engine.setxattr(&Caller::system(), b.ino, name, v),
            None => engine.removexattr(&Caller::system(), b.ino, name),
        };
        match res {
            Ok(()) => Ok(()),
            Err(Error::NotFound) if value.is_none() => Ok(()),
            Err(e) => Err(map_err(e, Missing::Bucket)),
        }
    })
    .await
}

/// Whether a bucket, or an object, carries the public-read mark.
fn marked_public_read(engine: &Engine, caller: &Caller, ino: Ino) -> bool {
    engine.getxattr(caller, ino, XATTR_PUBLIC_READ).is_ok_and(|v| v == b"1")
}

/// Sets or clears the public-read mark of a bucket or an object.
fn mark_public_read(engine: &Engine, caller: &Caller, ino: Ino, public: bool) -> Result<(), Error> {
    if public {
        return engine.setxattr(caller, ino, XATTR_PUBLIC_READ, b"1");
    }
    match engine.removexattr(caller, ino, XATTR_PUBLIC_READ) {
        Err(Error::NotFound) => Ok(()),
        r => r,
    }
}

fn is_admin(caller: &Caller) -> bool {
    caller.uid == 0 || caller.role >= storage_engine::Role::Admin
}

/// The grants of `acl` with every user named (DisplayName) as listings name owners.
fn grants_of(engine: &Engine, acl: &Acl) -> Vec<Grant> {
    acl.to_grants(|uid| owner_of(engine, uid).display_name.unwrap_or_default())
}

/// Stores `acl` on a bucket: an ACL the mode view says is the public-read mark alone;
/// any other is stored whole (and marks the bucket public-read when everyone may read).
fn apply_bucket_acl(engine: &Engine, b: &Attr, acl: &Acl) -> S3Result<()> {
    let sys = Caller::system();
    let stored = match acl.as_mode_view(b.uid) {
        Some(public) => {
            mark_public_read(engine, &sys, b.ino, public).map_err(|e| map_err(e, Missing::Bucket))?;
            None
        }
        None => {
            mark_public_read(engine, &sys, b.ino, acl.everyone_reads()).map_err(|e| map_err(e, Missing::Bucket))?;
            Some(acl.encode())
        }
    };
    set_acl_xattr(engine, &sys, b.ino, stored.as_deref()).map_err(|e| map_err(e, Missing::Bucket))
}

fn set_acl_xattr(engine: &Engine, caller: &Caller, ino: Ino, value: Option<&[u8]>) -> Result<(), Error> {
    match value {
        Some(v) => engine.setxattr(caller, ino, XATTR_ACL, v),
        None => match engine.removexattr(caller, ino, XATTR_ACL) {
            Err(Error::NotFound) => Ok(()),
            r => r,
        },
    }
}

/// The ACL a new object (PutObject, CopyObject) gets from its request. The uploader owns the
/// object in S3's terms; one a bucket ACL or policy admitted (`writer`) is written with the
/// bucket owner's permissions, and its ACL names the uploader as owner even when the request
/// gives none.
fn requested_object_acl(engine: &Engine, canned: Option<&str>, headers: &GrantHeaders, writer: Option<u32>, requester: u32, bucket_uid: u32) -> S3Result<Option<Acl>> {
    let owner = writer.unwrap_or(requester);
    Ok(match acl::requested(engine, canned, None, headers, owner, bucket_uid)? {
        Some(acl) => Some(acl),
        None if writer.is_some() => Acl::canned("private", owner, bucket_uid),
        None => None,
    })
}

/// The mode an object with `acl` gets: others may read when everyone or every signed-in
/// user may (the engine then admits other users and protocols too), else owner only.
fn object_acl_mode(acl: &Acl, file_uid: u32, mode: u32) -> u32 {
    let others_read = match acl.as_mode_view(file_uid) {
        Some(public) => public,
        None => acl.group_reads(),
    };
    (if others_read { mode | 0o044 } else { mode & !0o077 }) & 0o7777
}

/// Stores `acl` on an object (mode set by the caller): the mode view is the public-read
/// mark alone; any other ACL is stored whole.
fn apply_object_acl_xattrs(engine: &Engine, caller: &Caller, a: Ino, file_uid: u32, acl: &Acl) -> Result<(), Error> {
    match acl.as_mode_view(file_uid) {
        Some(public) => {
            mark_public_read(engine, caller, a, public)?;
            set_acl_xattr(engine, caller, a, None)
        }
        None => {
            mark_public_read(engine, caller, a, acl.everyone_reads())?;
            set_acl_xattr(engine, caller, a, Some(&acl.encode()))
        }
    }
}

// ------------------------------------------------------------------ operations

#[async_trait::async_trait]
impl S3 for AquiferS3 {
    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let buckets = blocking(move || {
            let mut out = Vec::new();
            let mut cursor: Option<Vec<u8>> = None;
            loop {
                let page = engine.readdir(&caller, ROOT_INO, cursor.as_deref(), 1024).map_err(|e| map_err(e, Missing::Bucket))?;
                for e in page.entries {
                    let Ok(name) = String::from_utf8(e.name) else { continue };
                    if e.kind != FileKind::Dir || !s3s::path::check_bucket_name(&name) {
                        continue;
                    }
                    let Ok(a) = engine.getattr(&caller, e.ino) else { continue };
                    // As S3: a user's list names the buckets that user owns (an
                    // administrator's names them all), not every directory it could see.
                    if a.uid != caller.uid && !is_admin(&caller) {
                        continue;
                    }
                    out.push(Bucket { name: Some(name), creation_date: Some(timestamp(a.btime_ns)), bucket_region: None });
                }
                match page.next_cursor {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
            Ok((out, owner_of(&engine, caller.uid)))
        })
        .await?;
        Ok(S3Response::new(ListBucketsOutput { buckets: Some(buckets.0), owner: Some(buckets.1), ..Default::default() }))
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let bucket = req.input.bucket.clone();
        let canned = req.input.acl.as_ref().map(|a| a.as_str().to_string());
        let headers = GrantHeaders {
            read: req.input.grant_read.clone(),
            write: req.input.grant_write.clone(),
            read_acp: req.input.grant_read_acp.clone(),
            write_acp: req.input.grant_write_acp.clone(),
            full_control: req.input.grant_full_control.clone(),
        };
        blocking(move || {
            // Checked whole before the bucket exists: a refused ACL creates nothing.
            let acl = acl::requested(&engine, canned.as_deref(), None, &headers, caller.uid, caller.uid)?;
            match engine.mkdir(&caller, ROOT_INO, bucket.as_bytes(), DIR_MODE) {
                Ok(a) => {
                    if let Some(acl) = acl
                        && let Err(e) = apply_bucket_acl(&engine, &a, &acl)
                    {
                        // Not left behind with an ACL other than the one asked for.
                        let _ = engine.rmdir(&caller, ROOT_INO, bucket.as_bytes());
                        return Err(e);
                    }
                    Ok(())
                }
                // Aquifer answers as S3's us-east-1, the region its GetBucketLocation names:
                // creating a bucket one already owns succeeds and changes nothing (neither
                // its contents nor its ACL), so retried and idempotent setups work.
                Err(Error::Exists) => match engine.lookup(&caller, ROOT_INO, bucket.as_bytes()) {
                    Ok(a) if a.kind == FileKind::Dir && a.uid == caller.uid => Ok(()),
                    _ => Err(S3Error::new(S3ErrorCode::BucketAlreadyExists)),
                },
                // A user who may not create buckets at all still learns that the name is
                // taken, as S3 answers: the name space of buckets is shared.
                Err(Error::PermissionDenied) if engine.lookup(&caller, ROOT_INO, bucket.as_bytes()).is_ok() => {
                    Err(S3Error::new(S3ErrorCode::BucketAlreadyExists))
                }
                Err(e) => Err(map_err(e, Missing::Bucket)),
            }
        })
        .await?;
        Ok(S3Response::new(CreateBucketOutput { location: Some(format!("/{}", req.input.bucket)) }))
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let bucket = req.input.bucket;
        blocking(move || {
            let b = bucket_attr(&engine, &caller, &bucket)?;
            let nonempty = || S3Error::new(S3ErrorCode::BucketNotEmpty);
            if engine.bucket_has_versions(b.ino).map_err(|e| map_err(e, Missing::Bucket))? {
                return Err(err(S3ErrorCode::BucketNotEmpty, "the bucket holds object versions or delete markers"));
            }
            // Multipart uploads in progress do not keep a bucket (as in S3 and RGW): once
            // the directory is gone they can no longer complete, and they are aborted with
            // it, whoever started them. A crash in between leaves records the engine drops
            // at its next start (`upload_parts`).
            let removed = match engine.rmdir(&caller, ROOT_INO, bucket.as_bytes()) {
                Ok(()) => Ok(()),
                Err(Error::NotEmpty) => {
                    // Only empty directories left behind (e.g. made through another
                    // protocol) do not count as content.
                    let page = engine.list_objects(&caller, b.ino, b"", None, b"", 1).map_err(|e| map_err(e, Missing::Bucket))?;
                    if !page.objects.is_empty() || !remove_empty_tree(&engine, &caller, b.ino) {
                        return Err(nonempty());
                    }
                    engine.rmdir(&caller, ROOT_INO, bucket.as_bytes()).map_err(|e| map_err(e, Missing::Bucket))
                }
                Err(e) => Err(map_err(e, Missing::Bucket)),
            };
            removed?;
            if let Err(e) = engine.multipart_abort_bucket(b.ino) {
                // The bucket is gone; what is left is reclaimed at the next start.
                tracing::warn!(bucket = %bucket, error = %e, "could not abort the multipart uploads of a removed bucket");
            }
            Ok(())
        })
        .await?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let bucket = req.input.bucket;
        blocking(move || bucket_attr(&engine, &caller, &bucket).map(|_| ())).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(&self, req: S3Request<GetBucketLocationInput>) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let bucket = req.input.bucket;
        blocking(move || bucket_attr(&engine, &caller, &bucket).map(|_| ())).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn get_bucket_versioning(&self, req: S3Request<GetBucketVersioningInput>) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let bucket = req.input.bucket;
        let mode = blocking(move || {
            let b = owned_bucket(&engine, &caller, &bucket, "versioning")?;
            Ok(bucket_versioning(&engine, b.ino))
        })
        .await?;
        let status = mode.map(|m| {
            BucketVersioningStatus::from_static(match m {
                VersionMode::Enabled => BucketVersioningStatus::ENABLED,
                VersionMode::Suspended => BucketVersioningStatus::SUSPENDED,
            })
        });
        Ok(S3Response::new(GetBucketVersioningOutput { status, mfa_delete: None }))
    }

    /// Enables or suspends versioning (the bucket owner or an administrator). A bucket once
    /// versioned stays versioned or suspended, as in S3.
    async fn put_bucket_versioning(&self, req: S3Request<PutBucketVersioningInput>) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let caller = self.caller(&req)?;
        let input = req.input;
        let cfg = input.versioning_configuration;
        if cfg.mfa_delete.as_ref().is_some_and(|m| m.as_str() != MFADelete::DISABLED) {
            return Err(err(S3ErrorCode::NotImplemented, "MFA delete is not supported"));
        }
        let value: &'static [u8] = match cfg.status.as_ref().map(|s| s.as_str()) {
            Some(BucketVersioningStatus::ENABLED) => b"Enabled",
            Some(BucketVersioningStatus::SUSPENDED) => b"Suspended",
            Some(other) => return Err(err(S3ErrorCode::MalformedXML, format!("versioning status {other:?}: use Enabled or Suspended"))),
            None => return Err(err(S3ErrorCode::MalformedXML, "give the versioning Status: Enabled or Suspended")),
        };
        set_bucket_setting(self.engine.clone(), caller, input.bucket, "versioning", XATTR_VERSIONING, Some(value.to_vec())).await?;
        Ok(S3Response::new(PutBucketVersioningOutput::default()))
    }

    async fn get_bucket_acl(&self, req: S3Request<GetBucketAclInput>) -> S3Result<S3Response<GetBucketAclOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let bucket = req.input.bucket;
        let (owner, grants) = blocking(move || {
            let b = owned_bucket(&engine, &caller, &bucket, "ACL")?;
            let acl = load_acl(&engine, &b)?.unwrap_or_else(|| Acl::mode_view(b.uid, marked_public_read(&engine, &Caller::system(), b.ino)));
            Ok((owner_of(&engine, acl.owner), grants_of(&engine, &acl)))
        })
        .await?;
        Ok(S3Response::new(GetBucketAclOutput { grants: Some(grants), owner: Some(owner) }))
    }

    async fn put_bucket_acl(&self, req: S3Request<PutBucketAclInput>) -> S3Result<S3Response<PutBucketAclOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let headers = GrantHeaders {
            read: input.grant_read,
            write: input.grant_write,
            read_acp: input.grant_read_acp,
            write_acp: input.grant_write_acp,
            full_control: input.grant_full_control,
        };
        blocking(move || {
            let b = owned_bucket(&engine, &caller, &input.bucket, "ACL")?;
            let canned = input.acl.as_ref().map(|a| a.as_str());
            let acl = acl::requested(&engine, canned, input.access_control_policy.as_ref(), &headers, b.uid, b.uid)?
                .ok_or_else(|| err(S3ErrorCode::MissingSecurityHeader, "give a canned ACL (x-amz-acl), x-amz-grant-* headers or an AccessControlPolicy body"))?;
            apply_bucket_acl(&engine, &b, &acl)
        })
        .await?;
        Ok(S3Response::new(PutBucketAclOutput::default()))
    }

    async fn get_bucket_policy(&self, req: S3Request<GetBucketPolicyInput>) -> S3Result<S3Response<GetBucketPolicyOutput>> {
        let caller = self.caller(&req)?;
        let stored = bucket_setting(self.engine.clone(), caller, req.input.bucket, "bucket policy", XATTR_POLICY).await?;
        let v = stored.ok_or_else(|| err(S3ErrorCode::NoSuchBucketPolicy, "The bucket policy does not exist"))?;
        let doc = String::from_utf8(v).map_err(|_| internal("stored bucket policy is not UTF-8"))?;
        Ok(S3Response::new(GetBucketPolicyOutput { policy: Some(doc) }))
    }

    /// Stores the policy as sent, after checking all of it: a document that does not parse,
    /// or uses an Effect, Version, operator or field this server does not know, is refused
    /// with `MalformedPolicy` and nothing changes.
    async fn put_bucket_policy(&self, req: S3Request<PutBucketPolicyInput>) -> S3Result<S3Response<PutBucketPolicyOutput>> {
        let caller = self.caller(&req)?;
        let input = req.input;
        Policy::parse(input.policy.as_bytes()).map_err(|e| err(S3ErrorCode::MalformedPolicy, e.to_string()))?;
        set_bucket_setting(self.engine.clone(), caller, input.bucket, "bucket policy", XATTR_POLICY, Some(input.policy.into_bytes())).await?;
        Ok(S3Response::new(PutBucketPolicyOutput::default()))
    }

    async fn delete_bucket_policy(&self, req: S3Request<DeleteBucketPolicyInput>) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
        let caller = self.caller(&req)?;
        set_bucket_setting(self.engine.clone(), caller, req.input.bucket, "bucket policy", XATTR_POLICY, None).await?;
        Ok(S3Response::new(DeleteBucketPolicyOutput::default()))
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        let caller = self.caller(&req)?;
        let stored = bucket_setting(self.engine.clone(), caller, req.input.bucket, "lifecycle configuration", XATTR_LIFECYCLE).await?;
        let v = stored.ok_or_else(|| err(S3ErrorCode::NoSuchLifecycleConfiguration, "The lifecycle configuration does not exist"))?;
        let cfg = lifecycle::decode(&v).ok_or_else(|| internal("stored lifecycle configuration does not parse"))?;
        Ok(S3Response::new(GetBucketLifecycleConfigurationOutput { rules: Some(cfg.rules), ..Default::default() }))
    }

    /// Checks the configuration as S3 does (see `lifecycle::check`) and stores it; a refused
    /// one changes nothing.
    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        let caller = self.caller(&req)?;
        let input = req.input;
        let mut cfg = input.lifecycle_configuration.ok_or_else(|| err(S3ErrorCode::MalformedXML, "the request has no LifecycleConfiguration"))?;
        lifecycle::check(&mut cfg)?;
        let doc = lifecycle::encode(&cfg);
        if doc.len() > storage_engine::XATTR_VALUE_BYTES_MAX {
            return Err(err(S3ErrorCode::InvalidArgument, "the lifecycle configuration is too large to store"));
        }
        set_bucket_setting(self.engine.clone(), caller, input.bucket, "lifecycle configuration", XATTR_LIFECYCLE, Some(doc)).await?;
        self.lifecycle_changed.notify_one();
        Ok(S3Response::new(PutBucketLifecycleConfigurationOutput::default()))
    }

    async fn delete_bucket_lifecycle(&self, req: S3Request<DeleteBucketLifecycleInput>) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        let caller = self.caller(&req)?;
        set_bucket_setting(self.engine.clone(), caller, req.input.bucket, "lifecycle configuration", XATTR_LIFECYCLE, None).await?;
        Ok(S3Response::new(DeleteBucketLifecycleOutput::default()))
    }

    async fn get_bucket_cors(&self, req: S3Request<GetBucketCorsInput>) -> S3Result<S3Response<GetBucketCorsOutput>> {
        let caller = self.caller(&req)?;
        let stored = bucket_setting(self.engine.clone(), caller, req.input.bucket, "CORS configuration", XATTR_CORS).await?;
        let v = stored.ok_or_else(|| err(S3ErrorCode::NoSuchCORSConfiguration, "The CORS configuration does not exist"))?;
        let cfg = cors::decode(&v).ok_or_else(|| internal("stored CORS configuration does not parse"))?;
        Ok(S3Response::new(GetBucketCorsOutput { cors_rules: Some(cfg.cors_rules) }))
    }

    /// Checks the configuration as S3 does (`cors::check`) and stores it; a refused one
    /// changes nothing. Browsers' requests are checked against it by the listener.
    async fn put_bucket_cors(&self, req: S3Request<PutBucketCorsInput>) -> S3Result<S3Response<PutBucketCorsOutput>> {
        let caller = self.caller(&req)?;
        let input = req.input;
        cors::check(&input.cors_configuration)?;
        let doc = cors::encode(&input.cors_configuration);
        if doc.len() > storage_engine::XATTR_VALUE_BYTES_MAX {
            return Err(err(S3ErrorCode::InvalidArgument, "the CORS configuration is too large to store"));
        }
        set_bucket_setting(self.engine.clone(), caller, input.bucket, "CORS configuration", XATTR_CORS, Some(doc)).await?;
        Ok(S3Response::new(PutBucketCorsOutput::default()))
    }

    async fn delete_bucket_cors(&self, req: S3Request<DeleteBucketCorsInput>) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        let caller = self.caller(&req)?;
        set_bucket_setting(self.engine.clone(), caller, req.input.bucket, "CORS configuration", XATTR_CORS, None).await?;
        Ok(S3Response::new(DeleteBucketCorsOutput::default()))
    }

    async fn get_object_acl(&self, req: S3Request<GetObjectAclInput>) -> S3Result<S3Response<GetObjectAclOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let vid = check_version_id(input.version_id.as_deref())?;
        let (owner, grants) = blocking(move || {
            let b = bucket_attr(&engine, &caller, &input.bucket)?;
            let a = version_attr(&engine, &caller, b.ino, object_key(&input.key)?, vid.as_deref())?;
            let stored = load_acl(&engine, &a)?;
            // As in S3, where only the owner holds READ_ACP unless granted (a grant runs the
            // request as the file's owner, see auth.rs).
            let granted = stored.as_ref().is_some_and(|acl| acl.allows(Some(caller.uid), Perm::ReadAcp));
            if caller.uid != a.uid && !is_admin(&caller) && !granted {
                return Err(err(S3ErrorCode::AccessDenied, "only the object's owner may read its ACL"));
            }
            let acl = stored.unwrap_or_else(|| {
                let sys = Caller::system();
                let admitted = marked_public_read(&engine, &sys, b.ino) || marked_public_read(&engine, &sys, a.ino);
                Acl::mode_view(a.uid, a.mode & 0o004 != 0 && admitted)
            });
            Ok((owner_of(&engine, acl.owner), grants_of(&engine, &acl)))
        })
        .await?;
        Ok(S3Response::new(GetObjectAclOutput { grants: Some(grants), owner: Some(owner), ..Default::default() }))
    }

    /// Sets the object's ACL and mode: `private` leaves only its owner's bits, `public-read`
    /// lets everyone read, anonymous clients included (also in a private bucket: the object
    /// is marked); other ACLs are stored (see `acl`), and the mode lets others read when a
    /// group may. Only the owner (or an administrator, or a WRITE_ACP grantee, who acts as
    /// the owner) may, as for chmod.
    async fn put_object_acl(&self, req: S3Request<PutObjectAclInput>) -> S3Result<S3Response<PutObjectAclOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let vid = check_version_id(input.version_id.as_deref())?;
        let headers = GrantHeaders {
            read: input.grant_read.clone(),
            write: input.grant_write.clone(),
            read_acp: input.grant_read_acp.clone(),
            write_acp: input.grant_write_acp.clone(),
            full_control: input.grant_full_control.clone(),
        };
        blocking(move || {
            let b = bucket_attr(&engine, &caller, &input.bucket)?;
            let a = version_attr(&engine, &caller, b.ino, object_key(&input.key)?, vid.as_deref())?;
            // The S3 owner stays who it is: the file's owner, or the uploader an ACL names.
            let owner = load_acl(&engine, &a)?.map_or(a.uid, |acl| acl.owner);
            let canned = input.acl.as_ref().map(|a| a.as_str());
            let acl = acl::requested(&engine, canned, input.access_control_policy.as_ref(), &headers, owner, b.uid)?
                .ok_or_else(|| err(S3ErrorCode::MissingSecurityHeader, "give a canned ACL (x-amz-acl), x-amz-grant-* headers or an AccessControlPolicy body"))?;
            // The mode first: the engine refuses it to anyone but the owner (or an
            // administrator), and then nothing has changed.
            let mode = object_acl_mode(&acl, a.uid, a.mode);
            engine.setattr(&caller, a.ino, storage_engine::SetAttr { mode: Some(mode), ..Default::default() }).map_err(|e| map_err(e, Missing::Key))?;
            apply_object_acl_xattrs(&engine, &caller, a.ino, a.uid, &acl).map_err(|e| map_err(e, Missing::Key))
        })
        .await?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let caller = self.caller(&req)?;
        let writer = req.extensions.get::<AclWriter>().map(|w| w.0);
        let grant_write_header = match req.headers.get("x-amz-grant-write") {
            Some(v) => Some(v.to_str().map_err(|_| err(S3ErrorCode::InvalidArgument, "x-amz-grant-write is not ASCII"))?.to_string()),
            None => None,
        };
        let trailers = req.trailing_headers.clone();
        let input = req.input;
        if input.write_offset_bytes.is_some() {
            return Err(err(S3ErrorCode::NotImplemented, "appending writes are not supported"));
        }
        let engine = self.engine.clone();
        let bucket = input.bucket.clone();
        let folder = match parse_key(&input.key)? {
            KeyForm::Dir(path) => Some(path.to_string()),
            KeyForm::Object(_) => None,
        };
        let key = input.key.clone();
        let canned = input.acl.as_ref().map(|a| a.as_str().to_string());
        let headers = GrantHeaders {
            read: input.grant_read.clone(),
            // Not in S3's PutObject model (an object's WRITE grant gives nothing), but sent by
            // clients that copy all five headers; kept so the ACL reads back as sent.
            write: grant_write_header,
            read_acp: input.grant_read_acp.clone(),
            write_acp: input.grant_write_acp.clone(),
            full_control: input.grant_full_control.clone(),
        };
        refuse_auto_extract(input.metadata.as_ref())?;
        let tags = input.tagging.as_deref().map(parse_tagging_header).transpose()?.unwrap_or_default();
        let meta = meta_from(input.content_type, input.content_encoding, input.content_disposition, input.content_language, input.cache_control, input.expires, input.metadata);
        let expected = Checksum {
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_sha1: input.checksum_sha1,
            checksum_sha256: input.checksum_sha256,
            checksum_crc64nvme: input.checksum_crc64nvme,
            ..Default::default()
        };
        let mut check = ChecksumCheck::new(input.checksum_algorithm.as_ref(), expected)?;
        let body = input.body.ok_or_else(|| err(S3ErrorCode::IncompleteBody, "missing body"))?;
        let (if_match, if_none_match) = (input.if_match, input.if_none_match);

        let content_md5 = input.content_md5;
        if let Some(path) = folder {
            if if_match.is_some() || if_none_match.is_some() {
                return Err(folder_conditions());
            }
            if input.content_length.is_some_and(|n| n > FOLDER_BYTES_MAX as i64) {
                return Err(folder_too_large());
            }
            let content = match receive_small(body, &mut check).await? {
                Received::Whole(data) if data.len() <= FOLDER_BYTES_MAX => data,
                _ => return Err(folder_too_large()),
            };
            let etag = checked_etag(&content, content_md5.as_deref())?;
            let sums = check.verify(trailers.as_ref())?;
            blocking(move || {
                let b = bucket_attr(&engine, &caller, &bucket)?;
                put_folder(&engine, &caller, b.ino, &path, &content, &meta, &tags)
            })
            .await?;
            return Ok(S3Response::new(put_object_output(etag, None, sums)));
        }
        let put = PutPlan {
            engine: engine.clone(),
            caller: caller.clone(),
            bucket,
            key,
            canned,
            headers,
            writer,
            if_match,
            if_none_match,
            meta,
            tags,
        };
        // A body declared small is read before anything else is done, so that checking the
        // request, writing the bytes and publishing take one trip to the blocking pool, not
        // two: for small objects those trips were much of a PUT's time. A refusal (no such
        // bucket, a failed condition) then comes after the body, which for at most
        // SMALL_PUT_BYTES costs the client little; larger bodies are refused before they are
        // read (`Expect: 100-continue`).
        let declared_small = input.content_length.is_some_and(|n| (0..=SMALL_PUT_BYTES as i64).contains(&n));
        let mut body = Some(body);
        let early = match body.take_if(|_| declared_small) {
            Some(body) => Some(receive_small(body, &mut check).await?),
            None => None,
        };
        let (etag, version_id, sums) = match early {
            Some(Received::Whole(data)) => {
                let sums = check.verify(trailers.as_ref())?;
                // A small object is stored where the request is served when nothing could
                // wait, and answered once its batch is durable (`Engine::durable`): no trip
                // to the blocking pool, whose thread wake-ups were most of the CPU of small
                // PUTs from several clients. When another mutation holds the engine's lock,
                // other requests on this thread go first and the store is tried again: the
                // lock is held for one batch's write, and the blocking pool costs more.
                let here = match put.checks_here(&data, content_md5.as_deref()) {
                    Some(checked) => {
                        let (etag, bucket) = checked?;
                        let mut tries = 0;
                        loop {
                            match put.try_store_here(bucket, &etag, &data) {
                                Here::Stored(r) => {
                                    r?;
                                    break Some(etag);
                                }
                                Here::Busy if tries < STORE_HERE_TRIES => {
                                    tries += 1;
                                    tokio::task::yield_now().await;
                                }
                                Here::Busy | Here::Elsewhere => break None,
                            }
                        }
                    }
                    None => None,
                };
                let (etag, version_id) = match here {
                    Some(etag) => {
                        engine.durable().await.map_err(|e| map_err(e, Missing::Key))?;
                        (etag, None)
                    }
                    None => blocking(move || put.whole(None, data, content_md5.as_deref())).await?,
                };
                (etag, version_id, sums)
            }
            early => {
                let (bucket_ino, staged, acl) = {
                    let put = put.clone();
                    blocking(move || put.stage()).await?
                };
                let (first, rest) = match early {
                    Some(Received::Started(first, rest)) => (first, rest),
                    _ => match receive_small(body.take().expect("the body was not read yet"), &mut check).await? {
                        Received::Whole(data) => {
                            let sums = check.verify(trailers.as_ref())?;
                            let (etag, version_id) = blocking(move || put.whole(Some((bucket_ino, staged, acl)), data, content_md5.as_deref())).await?;
                            return Ok(S3Response::new(put_object_output(etag, version_id, sums)));
                        }
                        Received::Started(first, rest) => (first, rest),
                    },
                };
                let (_, md5) = write_body(&engine, &caller, staged.ino, first, rest, &mut check).await?;
                check_content_md5(content_md5.as_deref(), &md5)?;
                let sums = check.verify(trailers.as_ref())?;
                let etag = hex::encode(md5);
                let et = etag.clone();
                let version_id = blocking(move || put.finish(bucket_ino, acl, staged, et)).await?;
                (etag, version_id, sums)
            }
        };
        Ok(S3Response::new(put_object_output(etag, version_id, sums)))
    }

    /// A browser upload (POST Object) is a PutObject of the form's file. s3s reads the
    /// canned ACL and the tags from fields `x-amz-acl` and `x-amz-tagging`; S3's form
    /// names them `acl` and `tagging` (an XML `Tagging` document), taken here from the fields
    /// `post::prepare` kept.
    async fn post_object(&self, req: S3Request<PostObjectInput>) -> S3Result<S3Response<PostObjectOutput>> {
        let form = req.extensions.get::<crate::post::PostForm>().cloned();
        let mut req = req.map_input(post_object_input_into_put_object_input);
        if let Some(form) = form {
            if req.input.acl.is_none()
                && let Some(acl) = form.get("acl")
            {
                req.input.acl = Some(ObjectCannedACL::from(acl.to_string()));
            }
            if req.input.tagging.is_none()
                && let Some(xml) = form.get("tagging")
            {
                req.input.tagging = Some(tagging_xml_as_header(xml)?);
            }
        }
        let mut resp = self.put_object(req).await?.map_output(put_object_output_into_post_object_output);
        // S3 sends a POST upload's ETag quoted in the header, in the redirect URL
        // (`etag=%22…%22`) and in the 201 PostResponse; s3s writes the last two from the
        // value as it is.
        if let Some(etag) = resp.output.e_tag.take() {
            let q = format!("\"{}\"", etag.value());
            if let Ok(v) = http::HeaderValue::from_str(&q) {
                resp.headers.insert(http::header::ETAG, v);
            }
            resp.output.e_tag = Some(ETag::Strong(q));
        }
        Ok(resp)
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let caller = self.caller(&req)?;
        let input = req.input;
        let conds = Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        };
        let asked = ObjectAsked { bucket: &input.bucket, key: &input.key, version_id: input.version_id.as_deref(), part_number: input.part_number, range: input.range.as_ref() };
        let sel = select_object(&self.engine, &caller, asked, conds, req.headers.get(http::header::RANGE)).await?;
        let (view, range) = (sel.view, sel.range);
        let body = match &view.content {
            _ if range.is_empty() => None,
            Some(c) => Some(StreamingBlob::from(s3s::Body::from(c.slice(range.start as usize..range.end as usize)))),
            None => Some(self.object_body(caller, view.attr.ino, range.start, range.end)),
        };
        let meta = view.meta;
        let out = GetObjectOutput {
            body,
            content_length: Some((range.end - range.start) as i64),
            content_range: sel.content_range,
            accept_ranges: Some("bytes".into()),
            last_modified: Some(timestamp(view.attr.mtime_ns)),
            e_tag: Some(quoted(&view.etag)),
            content_type: input.response_content_type.or(meta.content_type.clone()).or_else(|| Some("binary/octet-stream".into())),
            content_encoding: input.response_content_encoding.or(meta.content_encoding.clone()),
            content_disposition: input.response_content_disposition.or(meta.content_disposition.clone()),
            content_language: input.response_content_language.or(meta.content_language.clone()),
            cache_control: input.response_cache_control.or(meta.cache_control.clone()),
            expires: input.response_expires.or_else(|| expires_of(&meta)),
            metadata: user_metadata(&meta),
            tag_count: (view.tags > 0).then_some(view.tags as i32),
            parts_count: sel.parts_count,
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            version_id: view.version_id,
            ..Default::default()
        };
        Ok(S3Response::new(out))
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        let caller = self.caller(&req)?;
        let input = req.input;
        let conds = Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        };
        let asked = ObjectAsked { bucket: &input.bucket, key: &input.key, version_id: input.version_id.as_deref(), part_number: input.part_number, range: input.range.as_ref() };
        let sel = select_object(&self.engine, &caller, asked, conds, req.headers.get(http::header::RANGE)).await?;
        let view = sel.view;
        let meta = view.meta;
        let tags = view.tags;
        let mut resp = S3Response::new(HeadObjectOutput {
            content_length: Some((sel.range.end - sel.range.start) as i64),
            content_range: sel.content_range,
            accept_ranges: Some("bytes".into()),
            last_modified: Some(timestamp(view.attr.mtime_ns)),
            e_tag: Some(quoted(&view.etag)),
            content_type: meta.content_type.clone().or_else(|| Some("binary/octet-stream".into())),
            content_encoding: meta.content_encoding.clone(),
            content_disposition: meta.content_disposition.clone(),
            content_language: meta.content_language.clone(),
            cache_control: meta.cache_control.clone(),
            expires: expires_of(&meta),
            metadata: user_metadata(&meta),
            parts_count: sel.parts_count,
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            version_id: view.version_id,
            ..Default::default()
        });
        // HEAD answers with the headers GET would send (RFC 9110 §9.3.2); S3's model of
        // HeadObject has no tag count, so it is added here as GetObject sends it.
        if tags > 0 {
            resp.headers.insert("x-amz-tagging-count", tags.into());
        }
        Ok(resp)
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let vid = check_version_id(input.version_id.as_deref())?;
        let d = blocking(move || {
            let b = bucket_attr(&engine, &caller, &input.bucket)?;
            delete_key_version(&engine, &caller, b.ino, &input.key, vid.as_deref())
        })
        .await?;
        Ok(S3Response::new(DeleteObjectOutput { delete_marker: d.delete_marker.then_some(true), version_id: d.version_id, ..Default::default() }))
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let per_key = req.extensions.get::<PerKeyPolicy>().cloned();
        let input = req.input;
        if input.delete.objects.len() > DELETE_OBJECTS_MAX {
            return Err(err(S3ErrorCode::MalformedXML, format!("at most {DELETE_OBJECTS_MAX} keys per request")));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        let (deleted, errors) = blocking(move || {
            let b = bucket_attr(&engine, &caller, &input.bucket)?;
            let (mut deleted, mut errors) = (Vec::new(), Vec::new());
            for o in input.delete.objects {
                let r = check_version_id(o.version_id.as_deref()).and_then(|vid| {
                    let who = match &per_key {
                        Some(p) => p.caller_for_delete(&engine, &caller, &o.key, vid.as_deref())?,
                        None => caller.clone(),
                    };
                    delete_key_version(&engine, &who, b.ino, &o.key, vid.as_deref())
                });
                match r {
                    Ok(d) => {
                        if !quiet {
                            // A version removed is named as asked; a delete marker made is
                            // named as the marker's version.
                            let (version_id, marker_id) = match o.version_id {
                                Some(v) => (Some(v), None),
                                None => (None, d.version_id),
                            };
                            deleted.push(DeletedObject {
                                key: Some(o.key),
                                version_id,
                                delete_marker: d.delete_marker.then_some(true),
                                delete_marker_version_id: marker_id,
                            });
                        }
                    }
                    Err(e) => errors.push(s3s::dto::Error {
                        code: Some(e.code().as_str().to_string()),
                        message: e.message().map(str::to_string),
                        key: Some(o.key),
                        version_id: o.version_id,
                    }),
                }
            }
            Ok((deleted, errors))
        })
        .await?;
        Ok(S3Response::new(DeleteObjectsOutput { deleted: Some(deleted), errors: (!errors.is_empty()).then_some(errors), ..Default::default() }))
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let reader = self.source_caller(&req)?;
        let writer = req.extensions.get::<AclWriter>().map(|w| w.0);
        let input = req.input;
        let (src_bucket, src_key, src_version) = copy_source(&input.copy_source)?;
        let dst_key = object_key(&input.key)?.to_string();
        let replace_meta = input.metadata_directive.as_ref().is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let replace_tags = input.tagging_directive.as_ref().is_some_and(|d| d.as_str() == TaggingDirective::REPLACE);
        // Copying an older version over its key restores it, which is allowed.
        if src_bucket == input.bucket && src_key == dst_key && !replace_meta && src_version.is_none() {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata.",
            ));
        }
        let new_tags = input.tagging.as_deref().map(parse_tagging_header).transpose()?.unwrap_or_default();
        let new_meta = meta_from(input.content_type, input.content_encoding, input.content_disposition, input.content_language, input.cache_control, input.expires, input.metadata);
        // The copy gets the ACL the request gives (as PutObject), not the source's.
        let canned = input.acl.as_ref().map(|a| a.as_str().to_string());
        let headers = GrantHeaders {
            read: input.grant_read.clone(),
            write: None,
            read_acp: input.grant_read_acp.clone(),
            write_acp: input.grant_write_acp.clone(),
            full_control: input.grant_full_control.clone(),
        };
        let (cim, cinm, cims, cius) =
            (input.copy_source_if_match, input.copy_source_if_none_match, input.copy_source_if_modified_since, input.copy_source_if_unmodified_since);
        let dst_bucket = input.bucket;
        let (etag, attr, version_id, source_version_id) = blocking(move || {
            let sb = bucket_attr(&engine, &reader, &src_bucket)?;
            let src = version_attr(&engine, &reader, sb.ino, object_key(&src_key)?, src_version.as_deref())?;
            let source_version_id = reported_version(&engine, sb.ino, src.ino)?;
            let conds = Conditions { if_match: cim.as_ref(), if_none_match: cinm.as_ref(), if_modified_since: cims.as_ref(), if_unmodified_since: cius.as_ref() };
            if conds.any() {
                conds.check(&etag_of(&engine, &reader, &src)?, src.mtime_ns, false)?;
            }
            let meta = if replace_meta { new_meta } else { load_meta(&engine, &reader, src.ino) };
            let tags = if replace_tags { new_tags } else { load_tags(&engine, &reader, src.ino) };
            let db = bucket_attr(&engine, &caller, &dst_bucket)?;
            let (parent, _) = engine.object_parent(&caller, db.ino, &dst_key, true).map_err(|e| map_err(e, Missing::Key))?;
            let staged = engine.begin_put(&caller, parent, FILE_MODE).map_err(|e| map_err(e, Missing::Key))?;
            let staged = Staged { engine: engine.clone(), caller: caller.clone(), ino: staged.ino, armed: true };
            let md5 = copy_data(&engine, &reader, &caller, src.ino, 0, src.size, staged.ino)?;
            let etag = hex::encode(md5);
            let acl = requested_object_acl(&engine, canned.as_deref(), &headers, writer, caller.uid, db.uid)?;
            if let Some(acl) = &acl {
                let mode = object_acl_mode(acl, caller.uid, FILE_MODE);
                engine.setattr(&caller, staged.ino, storage_engine::SetAttr { mode: Some(mode), ..Default::default() }).map_err(|e| map_err(e, Missing::Key))?;
                apply_object_acl_xattrs(&engine, &caller, staged.ino, caller.uid, acl).map_err(|e| map_err(e, Missing::Key))?;
            }
            let (a, version_id) = publish(&engine, &caller, db.ino, &dst_key, staged.ino, &etag, &meta, &tags)?;
            staged.disarm();
            Ok((etag, a, version_id, source_version_id))
        })
        .await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult { e_tag: Some(quoted(&etag)), last_modified: Some(timestamp(attr.mtime_ns)), ..Default::default() }),
            version_id,
            copy_source_version_id: source_version_id,
            ..Default::default()
        }))
    }

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let mut input = req.input;
        // An empty delimiter is no delimiter (and is not echoed).
        input.delimiter = input.delimiter.filter(|d| !d.is_empty());
        check_allow_unordered(&req.uri, input.delimiter.as_deref())?;
        let max = max_keys(input.max_keys)?;
        let url = input.encoding_type.as_ref().is_some_and(|e| e.as_str() == EncodingType::URL);
        let enc = move |s: String| if url { url_encode(&s) } else { s };
        let (bucket, prefix, delim, marker) =
            (input.bucket.clone(), input.prefix.clone().unwrap_or_default(), input.delimiter.clone(), input.marker.clone().unwrap_or_default());
        let (l, owners) = blocking(move || list_with_owners(&engine, &caller, &bucket, &prefix, delim.as_deref(), &marker, max, true)).await?;
        let contents: Vec<Object> = l
            .objects
            .into_iter()
            .map(|(k, a, etag)| Object {
                key: Some(enc(k)),
                size: Some(a.size as i64),
                last_modified: Some(timestamp(a.mtime_ns)),
                e_tag: Some(quoted(&etag)),
                storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                owner: owners.get(&a.uid).cloned(),
                ..Default::default()
            })
            .collect();
        let truncated = l.next.is_some();
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            // ListObjects (v1) encodes the marker but not the prefix under
            // encoding-type=url, which is what SDKs decode.
            prefix: Some(input.prefix.unwrap_or_default()),
            marker: Some(input.marker.map(enc).unwrap_or_default()),
            next_marker: l.next.map(enc),
            delimiter: input.delimiter.map(enc),
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            contents: Some(contents),
            common_prefixes: Some(l.prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(enc(p)) }).collect()),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let mut input = req.input;
        // An empty delimiter is no delimiter (and is not echoed).
        input.delimiter = input.delimiter.filter(|d| !d.is_empty());
        check_allow_unordered(&req.uri, input.delimiter.as_deref())?;
        let max = max_keys(input.max_keys)?;
        let url = input.encoding_type.as_ref().is_some_and(|e| e.as_str() == EncodingType::URL);
        let enc = move |s: String| if url { url_encode(&s) } else { s };
        let token = input.continuation_token.as_deref().map(decode_token).transpose()?;
        // A continuation token carries the position; StartAfter counts only on the first
        // page (as S3: clients such as MinIO's send both on every later page).
        let start = match token {
            Some(t) => t,
            None => input.start_after.clone().unwrap_or_default(),
        };
        let fetch_owner = input.fetch_owner.unwrap_or(false);
        let (bucket, prefix, delim) = (input.bucket.clone(), input.prefix.clone().unwrap_or_default(), input.delimiter.clone());
        let (l, owners) = blocking(move || list_with_owners(&engine, &caller, &bucket, &prefix, delim.as_deref(), &start, max, fetch_owner)).await?;
        let key_count = (l.objects.len() + l.prefixes.len()) as i32;
        let contents: Vec<Object> = l
            .objects
            .into_iter()
            .map(|(k, a, etag)| Object {
                key: Some(enc(k)),
                size: Some(a.size as i64),
                last_modified: Some(timestamp(a.mtime_ns)),
                e_tag: Some(quoted(&etag)),
                storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                owner: owners.get(&a.uid).cloned(),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(input.prefix.map(enc).unwrap_or_default()),
            delimiter: input.delimiter.map(enc),
            start_after: input.start_after.map(enc),
            continuation_token: input.continuation_token,
            next_continuation_token: l.next.as_deref().map(encode_token),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            is_truncated: Some(l.next.is_some()),
            contents: Some(contents),
            common_prefixes: Some(l.prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(enc(p)) }).collect()),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_object_versions(&self, req: S3Request<ListObjectVersionsInput>) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let mut input = req.input;
        // An empty delimiter is no delimiter (and is not echoed).
        input.delimiter = input.delimiter.filter(|d| !d.is_empty());
        let max = max_keys(input.max_keys)?;
        let url = input.encoding_type.as_ref().is_some_and(|e| e.as_str() == EncodingType::URL);
        let enc = move |s: String| if url { url_encode(&s) } else { s };
        let key_marker = input.key_marker.clone().unwrap_or_default();
        // A version marker without a key marker means nothing (S3 refuses it).
        let version_marker = input.version_id_marker.clone().filter(|v| !v.is_empty());
        if version_marker.is_some() && key_marker.is_empty() {
            return Err(err(S3ErrorCode::InvalidArgument, "A version-id marker cannot be specified without a key marker."));
        }
        let (bucket, prefix, delim) = (input.bucket.clone(), input.prefix.clone().unwrap_or_default(), input.delimiter.clone());
        let (page, listed, owners) = blocking(move || {
            let b = bucket_attr(&engine, &caller, &bucket)?;
            if max == 0 {
                return Ok((storage_engine::VersionPage::default(), Vec::new(), BTreeMap::new()));
            }
            let mut page = engine
                .list_versions(&caller, b.ino, &prefix, delim.as_deref(), &key_marker, version_marker.as_deref(), max)
                .map_err(|e| map_err(e, Missing::Bucket))?;
            let mut owners = BTreeMap::new();
            let mut listed = Vec::with_capacity(page.versions.len());
            for v in std::mem::take(&mut page.versions) {
                let (uid, etag) = match &v.kind {
                    VersionKind::Object(a) => (a.uid, list_etag(&engine, &caller, a)),
                    VersionKind::DeleteMarker { uid, .. } => (*uid, String::new()),
                };
                owners.entry(uid).or_insert_with(|| owner_of(&engine, uid));
                listed.push((v, etag));
            }
            Ok((page, listed, owners))
        })
        .await?;
        let mut versions = Vec::new();
        let mut delete_markers = Vec::new();
        for (v, etag) in listed {
            match v.kind {
                VersionKind::Object(a) => versions.push(ObjectVersion {
                    key: Some(enc(v.key)),
                    version_id: Some(v.id),
                    is_latest: Some(v.latest),
                    size: Some(a.size as i64),
                    last_modified: Some(timestamp(a.mtime_ns)),
                    e_tag: Some(quoted(&etag)),
                    storage_class: Some(ObjectVersionStorageClass::from_static(ObjectVersionStorageClass::STANDARD)),
                    owner: owners.get(&a.uid).cloned(),
                    ..Default::default()
                }),
                VersionKind::DeleteMarker { uid, mtime_ns } => delete_markers.push(DeleteMarkerEntry {
                    key: Some(enc(v.key)),
                    version_id: Some(v.id),
                    is_latest: Some(v.latest),
                    last_modified: Some(timestamp(mtime_ns)),
                    owner: owners.get(&uid).cloned(),
                }),
            }
        }
        let truncated = page.next.is_some();
        let (next_key, next_version) = match page.next {
            Some((k, v)) => (Some(enc(k)), v),
            None => (None, None),
        };
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(input.bucket),
            prefix: Some(input.prefix.map(enc).unwrap_or_default()),
            delimiter: input.delimiter.map(enc),
            key_marker: Some(input.key_marker.map(enc).unwrap_or_default()),
            version_id_marker: Some(input.version_id_marker.unwrap_or_default()),
            next_key_marker: next_key,
            next_version_id_marker: next_version,
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            versions: Some(versions),
            delete_markers: Some(delete_markers),
            common_prefixes: Some(page.common_prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(enc(p)) }).collect()),
            encoding_type: input.encoding_type,
            request_charged: None,
        }))
    }

    async fn get_object_tagging(&self, req: S3Request<GetObjectTaggingInput>) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let vid = check_version_id(input.version_id.as_deref())?;
        let (tags, version_id) = blocking(move || {
            let b = bucket_attr(&engine, &caller, &input.bucket)?;
            let a = version_attr(&engine, &caller, b.ino, object_key(&input.key)?, vid.as_deref())?;
            Ok((load_tags(&engine, &caller, a.ino), reported_version(&engine, b.ino, a.ino)?))
        })
        .await?;
        let tag_set = tags.into_iter().map(|(k, v)| Tag { key: Some(k), value: Some(v) }).collect();
        Ok(S3Response::new(GetObjectTaggingOutput { tag_set, version_id }))
    }

    async fn put_object_tagging(&self, req: S3Request<PutObjectTaggingInput>) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let vid = check_version_id(input.version_id.as_deref())?;
        let tags: Vec<(String, String)> =
            input.tagging.tag_set.into_iter().map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default())).collect();
        check_tags(&tags)?;
        blocking(move || {
            let b = bucket_attr(&engine, &caller, &input.bucket)?;
            let a = version_attr(&engine, &caller, b.ino, object_key(&input.key)?, vid.as_deref())?;
            engine.setxattr(&caller, a.ino, XATTR_TAGS, &encode_tags(&tags)).map_err(|e| map_err(e, Missing::Key))
        })
        .await?;
        Ok(S3Response::new(PutObjectTaggingOutput::default()))
    }

    async fn delete_object_tagging(&self, req: S3Request<DeleteObjectTaggingInput>) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let vid = check_version_id(input.version_id.as_deref())?;
        blocking(move || {
            let b = bucket_attr(&engine, &caller, &input.bucket)?;
            let a = version_attr(&engine, &caller, b.ino, object_key(&input.key)?, vid.as_deref())?;
            match engine.removexattr(&caller, a.ino, XATTR_TAGS) {
                Ok(()) | Err(Error::NotFound) => Ok(()),
                Err(e) => Err(map_err(e, Missing::Key)),
            }
        })
        .await?;
        Ok(S3Response::new(DeleteObjectTaggingOutput::default()))
    }

    async fn get_object_attributes(&self, req: S3Request<GetObjectAttributesInput>) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let vid = check_version_id(input.version_id.as_deref())?;
        // SDKs send the names comma-separated in one header, which s3s leaves as one value.
        let names: Vec<&str> = input.object_attributes.iter().flat_map(|a| a.as_str().split(',')).map(str::trim).filter(|n| !n.is_empty()).collect();
        const KNOWN: [&str; 5] = [ObjectAttributes::ETAG, ObjectAttributes::CHECKSUM, ObjectAttributes::OBJECT_PARTS, ObjectAttributes::STORAGE_CLASS, ObjectAttributes::OBJECT_SIZE];
        if let Some(bad) = names.iter().find(|n| !KNOWN.contains(n)) {
            return Err(err(S3ErrorCode::InvalidArgument, format!("invalid attribute name {bad:?} in x-amz-object-attributes")));
        }
        if names.is_empty() {
            return Err(err(S3ErrorCode::InvalidArgument, "x-amz-object-attributes names no attribute"));
        }
        let want = |name: &str| names.contains(&name);
        let (w_etag, w_size, w_class, w_parts) =
            (want(ObjectAttributes::ETAG), want(ObjectAttributes::OBJECT_SIZE), want(ObjectAttributes::STORAGE_CLASS), want(ObjectAttributes::OBJECT_PARTS));
        let (bucket, key) = (input.bucket, input.key);
        let view = view_object_blocking(&engine, &caller, &bucket, &key, vid).await?;
        let mut resp = S3Response::new(GetObjectAttributesOutput {
            version_id: view.version_id,
            e_tag: w_etag.then(|| quoted(&view.etag)),
            object_size: w_size.then_some(view.attr.size as i64),
            storage_class: w_class.then(|| StorageClass::from_static(StorageClass::STANDARD)),
            object_parts: if w_parts {
                parts_count(&view.etag).map(|n| GetObjectAttributesParts { total_parts_count: Some(n), ..Default::default() })
            } else {
                None
            },
            last_modified: Some(timestamp(view.attr.mtime_ns)),
            ..Default::default()
        });
        if w_etag {
            // S3 sends this ETag unquoted, unlike those in headers and listings.
            resp.headers.insert(crate::server::UNQUOTED_ETAG_HEADER, http::HeaderValue::from_static("1"));
        }
        Ok(resp)
    }

    // -------------------------------------------------------------- multipart

    async fn create_multipart_upload(&self, req: S3Request<CreateMultipartUploadInput>) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        // A folder object's upload (`prefix/`) may be made; its parts hold at most
        // FOLDER_BYTES_MAX in all.
        parse_key(&input.key)?;
        let key = input.key.clone();
        let mode = object_mode(input.acl.as_ref())?;
        let tags = input.tagging.as_deref().map(parse_tagging_header).transpose()?.unwrap_or_default();
        let meta = meta_from(input.content_type, input.content_encoding, input.content_disposition, input.content_language, input.cache_control, input.expires, input.metadata);
        let mut stored = serde_json::Map::new();
        stored.insert("mode".into(), serde_json::Value::from(mode));
        stored.insert("meta".into(), serde_json::Value::String(String::from_utf8(meta.encode()).expect("JSON is UTF-8")));
        stored.insert("tags".into(), serde_json::Value::String(String::from_utf8(encode_tags(&tags)).expect("JSON is UTF-8")));
        let stored = serde_json::to_vec(&serde_json::Value::Object(stored)).expect("a JSON map serializes");
        let (bucket, k) = (input.bucket.clone(), key.clone());
        let id = blocking(move || {
            let b = bucket_attr(&engine, &caller, &bucket)?;
            engine.multipart_create(&caller, b.ino, &k, stored).map_err(|e| map_err(e, Missing::Key))
        })
        .await?;
        Ok(S3Response::new(CreateMultipartUploadOutput { bucket: Some(input.bucket), key: Some(key), upload_id: Some(id), ..Default::default() }))
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let trailers = req.trailing_headers.clone();
        let input = req.input;
        let n = check_part_number(input.part_number)?;
        let expected = Checksum {
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_sha1: input.checksum_sha1,
            checksum_sha256: input.checksum_sha256,
            checksum_crc64nvme: input.checksum_crc64nvme,
            ..Default::default()
        };
        let mut check = ChecksumCheck::new(input.checksum_algorithm.as_ref(), expected)?;
        let folder = matches!(parse_key(&input.key)?, KeyForm::Dir(_));
        if folder && input.content_length.is_some_and(|n| n > FOLDER_BYTES_MAX as i64) {
            return Err(folder_too_large());
        }
        let body = input.body.ok_or_else(|| err(S3ErrorCode::IncompleteBody, "missing body"))?;
        let (e, c, bucket, key, id) = (engine.clone(), caller.clone(), input.bucket, input.key, input.upload_id);
        let id2 = id.clone();
        let ino = blocking(move || {
            upload_of(&e, &c, &bucket, &key, &id2)?;
            e.multipart_part_begin(&c, &id2, n).map(|a| a.ino).map_err(|e| map_err(e, Missing::Upload))
        })
        .await?;
        let staged = Staged { engine: engine.clone(), caller: caller.clone(), ino, armed: true };
        let (written, md5) = write_body(&engine, &caller, ino, Vec::new(), body, &mut check).await?;
        if folder && written > FOLDER_BYTES_MAX as u64 {
            // A body without a declared length; the part is dropped with `staged`.
            return Err(folder_too_large());
        }
        check_content_md5(input.content_md5.as_deref(), &md5)?;
        let sums = check.verify(trailers.as_ref())?;
        let etag = hex::encode(md5);
        let et = etag.clone();
        blocking(move || {
            staged
                .engine
                .multipart_part_finish(&staged.caller, &id, n, staged.ino, et.into_bytes())
                .map_err(|e| map_err(e, Missing::Upload))?;
            staged.disarm();
            Ok(())
        })
        .await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(quoted(&etag)),
            checksum_crc32: sums.checksum_crc32,
            checksum_crc32c: sums.checksum_crc32c,
            checksum_sha1: sums.checksum_sha1,
            checksum_sha256: sums.checksum_sha256,
            checksum_crc64nvme: sums.checksum_crc64nvme,
            ..Default::default()
        }))
    }

    async fn upload_part_copy(&self, req: S3Request<UploadPartCopyInput>) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let reader = self.source_caller(&req)?;
        let input = req.input;
        let n = check_part_number(input.part_number)?;
        let (src_bucket, src_key, src_version) = copy_source(&input.copy_source)?;
        let (cim, cinm, cims, cius) =
            (input.copy_source_if_match, input.copy_source_if_none_match, input.copy_source_if_modified_since, input.copy_source_if_unmodified_since);
        let (etag, mtime) = blocking(move || {
            upload_of(&engine, &caller, &input.bucket, &input.key, &input.upload_id)?;
            let sb = bucket_attr(&engine, &reader, &src_bucket)?;
            let src = version_attr(&engine, &reader, sb.ino, object_key(&src_key)?, src_version.as_deref())?;
            let conds = Conditions { if_match: cim.as_ref(), if_none_match: cinm.as_ref(), if_modified_since: cims.as_ref(), if_unmodified_since: cius.as_ref() };
            if conds.any() {
                conds.check(&etag_of(&engine, &reader, &src)?, src.mtime_ns, false)?;
            }
            let (start, end) = copy_range(input.copy_source_range.as_deref(), src.size)?;
            if end - start > FOLDER_BYTES_MAX as u64 && matches!(parse_key(&input.key)?, KeyForm::Dir(_)) {
                return Err(folder_too_large());
            }
            let part = engine.multipart_part_begin(&caller, &input.upload_id, n).map_err(|e| map_err(e, Missing::Upload))?;
            let staged = Staged { engine: engine.clone(), caller: caller.clone(), ino: part.ino, armed: true };
            let etag = hex::encode(copy_data(&engine, &reader, &caller, src.ino, start, end, part.ino)?);
            let p = engine
                .multipart_part_finish(&caller, &input.upload_id, n, part.ino, etag.clone().into_bytes())
                .map_err(|e| map_err(e, Missing::Upload))?;
            staged.disarm();
            Ok((etag, p.mtime_ns))
        })
        .await?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult { e_tag: Some(quoted(&etag)), last_modified: Some(timestamp(mtime)), ..Default::default() }),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(&self, req: S3Request<CompleteMultipartUploadInput>) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let given: Vec<CompletedPart> = input.multipart_upload.and_then(|m| m.parts).unwrap_or_default();
        if given.is_empty() {
            return Err(err(S3ErrorCode::MalformedXML, "name at least one part"));
        }
        let mut wanted = Vec::with_capacity(given.len());
        for p in &given {
            let n = check_part_number(p.part_number.ok_or_else(|| err(S3ErrorCode::MalformedXML, "a part has no PartNumber"))?)?;
            if wanted.last().is_some_and(|l| *l >= n) {
                return Err(err(S3ErrorCode::InvalidPartOrder, "parts must be listed in ascending order"));
            }
            wanted.push(n);
        }
        let tags_given: Vec<Option<String>> = given.iter().map(|p| p.e_tag.as_ref().map(|e| e.value().to_string())).collect();
        let (bucket, key, id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
        let (if_match, if_none_match) = (input.if_match, input.if_none_match);
        let (etag, version_id) = blocking(move || {
            let (b, upload) = upload_of(&engine, &caller, &bucket, &key, &id)?;
            if matches!(parse_key(&key)?, KeyForm::Dir(_)) && (if_match.is_some() || if_none_match.is_some()) {
                return Err(folder_conditions());
            }
            check_put_conditions(&engine, &caller, b.ino, &key, if_match.as_ref(), if_none_match.as_ref())?;
            let parts = engine.multipart_list_parts(&caller, &id).map_err(|e| map_err(e, Missing::Upload))?;
            let mut md5s = Md5::new();
            let mut part_sizes = Vec::with_capacity(wanted.len());
            for (i, (n, tag)) in wanted.iter().zip(&tags_given).enumerate() {
                let p = parts.iter().find(|p| p.number == *n).ok_or_else(|| err(S3ErrorCode::InvalidPart, format!("part {n} was not uploaded")))?;
                part_sizes.push(p.size);
                let stored = String::from_utf8_lossy(&p.tag).into_owned();
                if tag.as_ref().is_some_and(|t| *t != stored) {
                    return Err(err(S3ErrorCode::InvalidPart, format!("the ETag given for part {n} is not the uploaded part's")));
                }
                if i + 1 < wanted.len() && p.size < PART_BYTES_MIN {
                    return Err(err(S3ErrorCode::EntityTooSmall, format!("part {n} is smaller than {PART_BYTES_MIN} bytes and not the last")));
                }
                md5s.update(hex::decode(&stored).map_err(|_| internal("a stored part tag is not hex"))?);
            }
            let etag = format!("{}-{}", hex::encode(md5s.finalize()), wanted.len());
            let stored: serde_json::Value = serde_json::from_slice(&upload.meta).unwrap_or_default();
            let meta = stored.get("meta").and_then(|v| v.as_str()).map(|s| ObjectMeta::decode(s.as_bytes())).unwrap_or_default();
            let tags = stored.get("tags").and_then(|v| v.as_str()).map(|s| decode_tags(s.as_bytes())).unwrap_or_default();
            let mode = stored.get("mode").and_then(|v| v.as_u64()).map_or(FILE_MODE, |m| m as u32);
            if let KeyForm::Dir(path) = parse_key(&key)? {
                // A folder object: the parts' bytes become its content, and the upload goes.
                if part_sizes.iter().sum::<u64>() > FOLDER_BYTES_MAX as u64 {
                    return Err(folder_too_large());
                }
                let mut content = Vec::new();
                for n in &wanted {
                    let p = parts.iter().find(|p| p.number == *n).expect("checked above");
                    content.extend(engine.read(&caller, p.ino, 0, p.size as usize).map_err(|e| map_err(e, Missing::Upload))?);
                }
                put_folder(&engine, &caller, b.ino, path, &content, &meta, &tags)?;
                engine.multipart_abort(&caller, &id).map_err(|e| map_err(e, Missing::Upload))?;
                return Ok((hex::encode(Md5::digest(&content)), None));
            }
            // The canned ACL given at CreateMultipartUpload: the object is published with its
            // mode (private = 0600), never visible with a wider one.
            let versioning = bucket_versioning(&engine, b.ino);
            // ETag, part sizes (both naming the assembled data's size and time), metadata
            // and tags are set before the object is published, so it is never visible, nor
            // kept through a crash, without them.
            let mut assembled: Option<(u64, i64)> = None;
            let records = |a: &Attr| {
                assembled = Some((a.size, a.mtime_ns));
                object_records(&etag, a, Some(&part_sizes), &meta, &tags).into_iter().map(|(n, v)| (n.to_vec(), v)).collect()
            };
            let (attr, version_id) =
                engine.multipart_complete_versioned(&caller, &id, &wanted, records, mode, versioning).map_err(|e| map_err(e, Missing::Upload))?;
            if assembled != Some((attr.size, attr.mtime_ns)) {
                // Publishing gave the data another size or time (a portal's hub publishes
                // its own copy): the records follow for the data as published.
                record_object(&engine, attr.ino, &object_records(&etag, &attr, Some(&part_sizes), &ObjectMeta::default(), &[]))?;
            }
            Ok((etag, version_id.filter(|_| versioning == Some(VersionMode::Enabled))))
        })
        .await?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(quoted(&etag)),
            version_id,
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(&self, req: S3Request<AbortMultipartUploadInput>) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        blocking(move || {
            upload_of(&engine, &caller, &input.bucket, &input.key, &input.upload_id)?;
            engine.multipart_abort(&caller, &input.upload_id).map_err(|e| map_err(e, Missing::Upload))
        })
        .await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let max = max_keys(input.max_parts)?;
        let marker = input.part_number_marker.unwrap_or(0).max(0) as u32;
        let (bucket, key, id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
        let (parts, owner) = blocking(move || {
            let (_, u) = upload_of(&engine, &caller, &bucket, &key, &id)?;
            let parts = engine.multipart_list_parts(&caller, &id).map_err(|e| map_err(e, Missing::Upload))?;
            Ok((parts, owner_of(&engine, u.uid)))
        })
        .await?;
        let mut after: Vec<_> = parts.into_iter().filter(|p| p.number > marker).collect();
        let truncated = after.len() > max;
        after.truncate(max);
        let next = if truncated { after.last().map(|p| p.number as i32) } else { None };
        let out: Vec<Part> = after
            .into_iter()
            .map(|p| Part {
                part_number: Some(p.number as i32),
                size: Some(p.size as i64),
                e_tag: Some(quoted(&String::from_utf8_lossy(&p.tag))),
                last_modified: Some(timestamp(p.mtime_ns)),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            parts: Some(out),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: next,
            owner: Some(owner.clone()),
            initiator: Some(Initiator { id: owner.id, display_name: owner.display_name }),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(&self, req: S3Request<ListMultipartUploadsInput>) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let engine = self.engine.clone();
        let caller = self.caller(&req)?;
        let input = req.input;
        let max = max_keys(input.max_uploads)?;
        let bucket = input.bucket.clone();
        let uploads = blocking(move || {
            let b = bucket_attr(&engine, &caller, &bucket)?;
            let ups = engine.multipart_list_uploads(&caller, b.ino).map_err(|e| map_err(e, Missing::Bucket))?;
            Ok(ups.into_iter().map(|u| (owner_of(&engine, u.uid), u)).collect::<Vec<_>>())
        })
        .await?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let key_marker = input.key_marker.clone().unwrap_or_default();
        let id_marker = input.upload_id_marker.clone().unwrap_or_default();
        let mut out = Vec::new();
        let mut prefixes: Vec<String> = Vec::new();
        let mut next = None;
        for (owner, u) in uploads {
            if !u.key.starts_with(&prefix) {
                continue;
            }
            let after = u.key.as_str() > key_marker.as_str() || (u.key == key_marker && !id_marker.is_empty() && u.id.as_str() > id_marker.as_str());
            if !key_marker.is_empty() && !after {
                continue;
            }
            if let Some(d) = input.delimiter.as_deref().filter(|d| !d.is_empty())
                && let Some(pos) = u.key[prefix.len()..].find(d) {
                    let cp = u.key[..prefix.len() + pos + d.len()].to_string();
                    if prefixes.last() != Some(&cp) {
                        if out.len() + prefixes.len() >= max {
                            next = Some((u.key.clone(), u.id.clone()));
                            break;
                        }
                        prefixes.push(cp);
                    }
                    continue;
                }
            if out.len() + prefixes.len() >= max {
                next = Some((u.key.clone(), u.id.clone()));
                break;
            }
            out.push(MultipartUpload {
                key: Some(u.key.clone()),
                upload_id: Some(u.id.clone()),
                initiated: Some(timestamp(u.created_ns)),
                initiator: Some(Initiator { id: owner.id.clone(), display_name: owner.display_name.clone() }),
                owner: Some(owner),
                storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                ..Default::default()
            });
        }
        let truncated = next.is_some();
        let (nk, ni) = match (out.last(), truncated) {
            (Some(last), true) => (last.key.clone(), last.upload_id.clone()),
            _ => (None, None),
        };
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            key_marker: input.key_marker,
            upload_id_marker: input.upload_id_marker,
            next_key_marker: nk,
            next_upload_id_marker: ni,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            uploads: Some(out),
            common_prefixes: Some(prefixes.into_iter().map(|p| CommonPrefix { prefix: Some(p) }).collect()),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }
}

/// Removes a tree that holds only directories, deepest first. False if anything else was
/// found or could not be removed.
fn remove_empty_tree(engine: &Engine, caller: &Caller, dir: Ino) -> bool {
    let Ok(page) = engine.readdir(caller, dir, None, 4096) else { return false };
    if page.next_cursor.is_some() {
        return false;
    }
    for e in page.entries {
        if e.kind != FileKind::Dir || !remove_empty_tree(engine, caller, e.ino) || engine.rmdir(caller, dir, &e.name).is_err() {
            return false;
        }
    }
    true
}
