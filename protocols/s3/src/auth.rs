//! Who a request runs as: SigV4 secrets come from the engine's identity store; a bucket's
//! policy may deny a request or allow it with the bucket owner's permissions; anonymous
//! requests that no policy allows may only read buckets (or objects) marked public-read.
//! A stored ACL (see `acl`) decides for the bucket or object it is on: a grant lets the
//! grantee act with the owner's permissions, and without one the request is refused.

use std::sync::Arc;

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{Credentials, S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Result};
use storage_engine::{Caller, Engine, Error, FileKind, Ino, ROOT_INO, Role};

use crate::acl::{Acl, Perm};
use crate::meta::{XATTR_ACL, XATTR_POLICY, XATTR_PUBLIC_READ, XATTR_TAGS, decode_tags};
use crate::policy::{Context, Decision, Policy, Principal, action_of_request, bucket_arn, is_policy_admin, object_arn};
use crate::service::blocking;

pub(crate) struct EngineAuth {
    pub engine: Arc<Engine>,
}

#[async_trait::async_trait]
impl S3Auth for EngineAuth {
    /// Two metadata reads (the key, its user), made where the request is: a trip to the
    /// blocking pool costs more than they do, and `caller_of` makes the same reads there.
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.engine.s3_credentials(access_key) {
            Ok((secret, _)) => Ok(SecretKey::from(secret)),
            Err(Error::Unauthenticated | Error::NotFound) => Err(S3Error::new(S3ErrorCode::InvalidAccessKeyId)),
            Err(e) => Err(crate::error::map_err(e, crate::error::Missing::Key)),
        }
    }
}

/// The caller a verified request runs as.
pub(crate) fn caller_of(engine: &Engine, creds: Option<&Credentials>) -> S3Result<Caller> {
    match creds {
        None => Ok(Caller::anonymous()),
        Some(c) => match engine.s3_credentials(&c.access_key) {
            Ok((_, caller)) => Ok(caller),
            // The key was deleted between signature check and now.
            Err(_) => Err(S3Error::new(S3ErrorCode::InvalidAccessKeyId)),
        },
    }
}

/// What an anonymous client may learn about a bucket name.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BucketVisibility {
    Missing,
    Private,
    PublicRead,
}

/// Whether `bucket` exists and whether anonymous clients may read it.
pub(crate) fn bucket_visibility(engine: &Engine, bucket: &str) -> BucketVisibility {
    let sys = Caller::system();
    match engine.lookup(&sys, ROOT_INO, bucket.as_bytes()) {
        Ok(a) if a.kind == FileKind::Dir => {
            if engine.getxattr(&sys, a.ino, XATTR_PUBLIC_READ).is_ok_and(|v| v == b"1") {
                BucketVisibility::PublicRead
            } else {
                BucketVisibility::Private
            }
        }
        _ => BucketVisibility::Missing,
    }
}

/// Operations on a bucket an anonymous client may run on a bucket marked public-read. As
/// in S3, a bucket's `public-read` opens its listing, not its objects: an object is read by
/// everyone only when it is public-read itself (or its ACL or the bucket policy says so).
const ANONYMOUS_READS: &[&str] = &["HeadBucket", "ListObjects", "ListObjectsV2", "GetBucketLocation"];

/// Operations on one object an anonymous client may run on an object marked public-read
/// (PutObject or PutObjectAcl with `public-read`), whatever its bucket's ACL.
const OBJECT_READS: &[&str] = &["GetObject", "HeadObject", "GetObjectAttributes"];

/// Whether `key` in `bucket` is an object marked public-read.
fn object_is_public(engine: &Engine, bucket: &str, key: &str) -> bool {
    let sys = Caller::system();
    let Ok(b) = engine.lookup(&sys, ROOT_INO, bucket.as_bytes()) else { return false };
    let Ok((parent, name)) = engine.object_parent(&sys, b.ino, key, false) else { return false };
    let Ok(a) = engine.lookup(&sys, parent, name.as_bytes()) else { return false };
    a.kind == FileKind::File && engine.getxattr(&sys, a.ino, XATTR_PUBLIC_READ).is_ok_and(|v| v == b"1")
}

/// Longest validity of a presigned URL (as S3: seven days).
pub const PRESIGNED_EXPIRES_SECS_MAX: u64 = 7 * 24 * 3600;

/// s3s checks that a presigned URL has not expired, but accepts any validity period; S3
/// refuses URLs valid for more than [`PRESIGNED_EXPIRES_SECS_MAX`].
fn check_presigned_expiry(query: Option<&str>) -> S3Result<()> {
    let Some(q) = query else { return Ok(()) };
    for pair in q.split('&') {
        if let Some(v) = pair.strip_prefix("X-Amz-Expires=")
            && v.parse::<u64>().is_ok_and(|secs| secs > PRESIGNED_EXPIRES_SECS_MAX)
        {
            return Err(S3Error::with_message(
                S3ErrorCode::AuthorizationQueryParametersError,
                format!("X-Amz-Expires must be at most {PRESIGNED_EXPIRES_SECS_MAX} seconds (seven days)"),
            ));
        }
    }
    Ok(())
}

/// The peer address of a connection, put in every request's extensions by the listener
/// (`aws:SourceIp` in bucket policies).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerAddr(pub std::net::IpAddr);

/// A bucket policy allowed this request: it runs with the bucket owner's permissions (as
/// a user, never with an administrator's powers), as the owner delegated them.
#[derive(Clone)]
pub(crate) struct PolicyGrant(pub Caller);

/// A bucket ACL's WRITE grant or a bucket policy admitted a signed-in user other than the
/// bucket owner: the object is written with the bucket owner's permissions, and this user
/// (its uploader) is recorded as its S3 owner in the object's ACL.
#[derive(Clone, Copy)]
pub(crate) struct AclWriter(pub u32);

/// For CopyObject and UploadPartCopy: the source bucket's policy allowed `s3:GetObject` on
/// the source object, which is then read with that bucket owner's permissions.
#[derive(Clone)]
pub(crate) struct SourceGrant(pub Caller);

/// The user of the request's access key, as the access check found it: the operation runs
/// as this user (unless a grant says otherwise) without looking the key up again.
#[derive(Clone)]
pub(crate) struct Requester(pub Caller);

/// DeleteObjects names its keys in the body, which the access check does not see: the
/// policy is evaluated per key by the operation itself.
#[derive(Clone)]
pub(crate) struct PerKeyPolicy {
    pub policy: Arc<Policy>,
    pub principal: Option<Principal>,
    pub context: Context,
    pub owner: Caller,
    pub bucket: String,
}

impl PerKeyPolicy {
    /// The caller that deletes `key` (or its version `version`, which takes
    /// `s3:DeleteObjectVersion`): the owner when the policy allows it or a bucket ACL grants
    /// WRITE, the requester when neither says anything and the requester owns the bucket or
    /// the object; AccessDenied otherwise.
    pub fn caller_for_delete(&self, engine: &Engine, own: &Caller, key: &str, version: Option<&str>) -> S3Result<Caller> {
        let mut cx = self.context.clone();
        if self.policy.uses_key_prefix(EXISTING_TAG) {
            add_existing_tags(engine, &mut cx, &self.bucket, key);
        }
        let action = match version {
            Some(v) => {
                cx.set("s3:versionid", v);
                "s3:DeleteObjectVersion"
            }
            None => "s3:DeleteObject",
        };
        match self.policy.evaluate(self.principal.as_ref(), action, &object_arn(&self.bucket, key), &cx) {
            Decision::Deny => Err(denied_by_policy()),
            Decision::Allow => Ok(if own.uid == self.owner.uid { own.clone() } else { self.owner.clone() }),
            Decision::NoMatch if self.principal.is_none() => Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused")),
            // As without a policy: the bucket's ACL, else S3's private default.
            Decision::NoMatch => {
                let sys = Caller::system();
                let Ok(b) = engine.lookup(&sys, ROOT_INO, self.bucket.as_bytes()) else { return Ok(own.clone()) };
                match acl_says(engine, Some(own), &b, load_acl(engine, &b)?, Perm::Write, "bucket")? {
                    AclSays::Grant(run_as) => Ok(run_as.unwrap_or_else(|| own.clone())),
                    AclSays::NotStored => {
                        private_check(engine, own, &self.bucket, Some(key), "DeleteObject", version.is_some())?;
                        Ok(own.clone())
                    }
                }
            }
        }
    }
}

const EXISTING_TAG: &str = "s3:existingobjecttag/";

fn denied_by_policy() -> S3Error {
    S3Error::with_message(S3ErrorCode::AccessDenied, "denied by the bucket policy")
}

/// The bucket's policy, if it has one. A stored policy that no longer parses (written by
/// another version, or damaged) is treated as one that denies everything but its own
/// management: failing closed, and the owner can still replace or delete it.
pub(crate) fn load_policy(engine: &Engine, bucket: Ino) -> Option<Policy> {
    let doc = engine.getxattr(&Caller::system(), bucket, XATTR_POLICY).ok()?;
    match Policy::parse(&doc) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(bucket, error = %e, "stored bucket policy does not parse; denying access");
            Some(Policy::parse(br#"{"Statement":{"Effect":"Deny","Principal":"*","Action":"*","Resource":"*"}}"#).expect("constant policy parses"))
        }
    }
}

fn add_existing_tags(engine: &Engine, cx: &mut Context, bucket: &str, key: &str) {
    let sys = Caller::system();
    let Ok(b) = engine.lookup(&sys, ROOT_INO, bucket.as_bytes()) else { return };
    let Ok((parent, name)) = engine.object_parent(&sys, b.ino, key, false) else { return };
    let Ok(a) = engine.lookup(&sys, parent, name.as_bytes()) else { return };
    if a.kind != FileKind::File {
        return;
    }
    if let Ok(v) = engine.getxattr(&sys, a.ino, XATTR_TAGS) {
        for (k, v) in decode_tags(&v) {
            cx.set(&format!("{EXISTING_TAG}{k}"), v);
        }
    }
}

/// `bucket/key` of an `x-amz-copy-source` header (URL-encoded, optional leading `/`, an
/// optional `?versionId=`).
fn copy_source_of(h: &str) -> Option<(String, String)> {
    let h = h.split_once("?versionId=").map_or(h, |(p, _)| p);
    let decoded = urlencoding::decode(h).ok()?;
    let (b, k) = decoded.trim_start_matches('/').split_once('/')?;
    (!b.is_empty() && !k.is_empty()).then(|| (b.to_string(), k.to_string()))
}

/// The condition keys a request carries that do not need the engine.
fn request_context(cx: &S3AccessContext<'_>) -> Context {
    let mut c = Context::default();
    for (name, value) in cx.headers() {
        let Ok(v) = value.to_str() else { continue };
        let n = name.as_str();
        if n.starts_with("x-amz-") {
            c.add(&format!("s3:{n}"), v);
        }
    }
    if let Some(src) = cx.headers().get("x-amz-copy-source").and_then(|v| v.to_str().ok()).and_then(copy_source_of) {
        c.set("s3:x-amz-copy-source", format!("{}/{}", src.0, src.1));
    }
    if let Some(t) = cx.headers().get("x-amz-tagging").and_then(|v| v.to_str().ok()) {
        for pair in t.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let dec = |s: &str| urlencoding::decode(&s.replace('+', " ")).map(|c| c.into_owned()).unwrap_or_default();
            let k = dec(k);
            c.add("s3:RequestObjectTagKeys", k.clone());
            c.set(&format!("s3:RequestObjectTag/{k}"), dec(v));
        }
    }
    for (h, key) in [("referer", "aws:Referer"), ("user-agent", "aws:UserAgent")] {
        if let Some(v) = cx.headers().get(h).and_then(|v| v.to_str().ok()) {
            c.set(key, v);
        }
    }
    if let Some(q) = cx.uri().query() {
        for pair in q.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = match k {
                "prefix" => "s3:prefix",
                "delimiter" => "s3:delimiter",
                "max-keys" => "s3:max-keys",
                "versionId" => "s3:versionid",
                _ => continue,
            };
            c.set(key, urlencoding::decode(&v.replace('+', " ")).map(|c| c.into_owned()).unwrap_or_default());
        }
    }
    // The S3 listener serves plain HTTP (TLS, where used, ends in front of it).
    c.set("aws:SecureTransport", "false");
    let now = time::OffsetDateTime::now_utc();
    c.set("aws:EpochTime", now.unix_timestamp().to_string());
    if let Ok(t) = now.replace_nanosecond(0).map_err(|_| ()).and_then(|t| t.format(&time::format_description::well_known::Rfc3339).map_err(|_| ())) {
        c.set("aws:CurrentTime", t);
    }
    c
}

/// What the access check leaves for the operation.
#[derive(Default)]
struct Outcome {
    requester: Option<Caller>,
    grant: Option<Caller>,
    writer: Option<u32>,
    source_grant: Option<Caller>,
    per_key: Option<PerKeyPolicy>,
}

struct Asked {
    access_key: Option<String>,
    bucket: String,
    key: Option<String>,
    op: String,
    context: Context,
    copy_source: Option<(String, String)>,
    /// The copy source names a version (reading it takes `s3:GetObjectVersion`).
    copy_source_versioned: bool,
    /// The request names a version of its object (`versionId`).
    versioned: bool,
}

/// The bucket owner as a caller with a user's permissions (never an administrator's).
pub(crate) fn owner_caller(engine: &Engine, b: &storage_engine::Attr) -> Caller {
    engine.caller_for_uid(b.uid, b.gid, &[]).unwrap_or_else(|_| Caller { user: format!("uid:{}", b.uid), uid: b.uid, gid: b.gid, groups: vec![], role: Role::User })
}

fn decide(engine: &Engine, mut a: Asked) -> S3Result<Outcome> {
    let sys = Caller::system();
    let me = match &a.access_key {
        Some(k) => Some(engine.s3_credentials(k).map_err(|_| S3Error::new(S3ErrorCode::InvalidAccessKeyId))?.1),
        None => None,
    };
    let principal = me.as_ref().map(|c| Principal { uid: c.uid, user: c.user.clone(), access_key: a.access_key.clone().unwrap_or_default() });
    if let Some(c) = &me {
        a.context.set("aws:username", c.user.clone());
        a.context.set("aws:userid", c.uid.to_string());
    }
    let bucket_dir = |name: &str| match engine.lookup(&sys, ROOT_INO, name.as_bytes()) {
        Ok(attr) if attr.kind == FileKind::Dir => Some(attr),
        _ => None,
    };
    let mut out = Outcome { requester: me.clone(), ..Outcome::default() };
    let mut allowed = false;
    if a.op != "CreateBucket"
        && let Some(b) = bucket_dir(&a.bucket)
        && let Some(policy) = load_policy(engine, b.ino)
    {
        let owner = owner_caller(engine, &b);
        let delegated = |owner: Caller| me.as_ref().is_none_or(|c| c.uid != owner.uid).then_some(owner);
        if a.op == "DeleteObjects" {
            out.per_key = Some(PerKeyPolicy { policy: Arc::new(policy), principal: principal.clone(), context: a.context.clone(), owner, bucket: a.bucket.clone() });
            // Each key is decided by the operation; an anonymous client gets there only
            // because a policy exists that might allow it.
            allowed = true;
        } else {
            let resource = match &a.key {
                Some(k) => object_arn(&a.bucket, k),
                None => bucket_arn(&a.bucket),
            };
            let mut cx = a.context.clone();
            if let Some(k) = &a.key
                && policy.uses_key_prefix(EXISTING_TAG)
            {
                add_existing_tags(engine, &mut cx, &a.bucket, k);
            }
            match policy.evaluate(principal.as_ref(), &action_of_request(&a.op, &cx), &resource, &cx) {
                Decision::Deny => {
                    let manager = me.as_ref().is_some_and(|c| c.uid == b.uid || is_administrator(c));
                    if !(is_policy_admin(&a.op) && manager) {
                        return Err(denied_by_policy());
                    }
                }
                Decision::Allow => {
                    allowed = true;
                    out.grant = delegated(owner);
                    // As with a bucket ACL's WRITE grant: the uploader owns what it writes
                    // in S3's terms (and may read it back), the bucket owner owns the file.
                    if let Some(c) = &me
                        && c.uid != b.uid
                        && acl_need(&a.op) == Some((Level::Bucket, Perm::Write))
                    {
                        out.writer = Some(c.uid);
                    }
                }
                Decision::NoMatch => {}
            }
        }
    }
    if let Some((sb, sk)) = &a.copy_source {
        let mut source_allowed = false;
        if let Some(b) = bucket_dir(sb)
            && let Some(policy) = load_policy(engine, b.ino)
        {
            let mut cx = a.context.clone();
            if policy.uses_key_prefix(EXISTING_TAG) {
                add_existing_tags(engine, &mut cx, sb, sk);
            }
            let action = if a.copy_source_versioned { "s3:GetObjectVersion" } else { "s3:GetObject" };
            match policy.evaluate(principal.as_ref(), action, &object_arn(sb, sk), &cx) {
                Decision::Deny => return Err(denied_by_policy()),
                Decision::Allow => {
                    source_allowed = true;
                    let owner = owner_caller(engine, &b);
                    if me.as_ref().is_none_or(|c| c.uid != owner.uid) {
                        out.source_grant = Some(owner);
                    }
                }
                Decision::NoMatch => {}
            }
        }
        if !source_allowed
            && let Some(f) = object_file(engine, sb, sk)
            && let AclSays::Grant(run_as) = acl_says(engine, me.as_ref(), &f, load_acl(engine, &f)?, Perm::Read, "source object")?
        {
            source_allowed = true;
            if out.source_grant.is_none() {
                out.source_grant = run_as;
            }
        }
        // A client may copy only what it may read.
        if !source_allowed {
            match &me {
                None if !object_is_public(engine, sb, sk) => {
                    return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused"));
                }
                None => {}
                Some(c) => private_check(engine, c, sb, Some(sk), "GetObject", a.copy_source_versioned)?,
            }
        }
    }
    if !allowed
        && a.op != "CreateBucket"
        && let Some((level, need)) = acl_need(&a.op)
    {
        let file = match level {
            Level::Bucket => bucket_dir(&a.bucket),
            Level::Object => a.key.as_deref().and_then(|k| object_file(engine, &a.bucket, k)),
        };
        if let Some(f) = file {
            let what = if level == Level::Bucket { "bucket" } else { "object" };
            match acl_says(engine, me.as_ref(), &f, load_acl(engine, &f)?, need, what)? {
                AclSays::Grant(run_as) => {
                    allowed = true;
                    if let Some(c) = &me
                        && level == Level::Bucket
                        && need == Perm::Write
                        && c.uid != f.uid
                    {
                        out.writer = Some(c.uid);
                    }
                    out.grant = run_as;
                }
                // Without a stored ACL, only the owner reads or changes a bucket's ACL (an
                // administrator too): S3's default, which the mode view cannot express.
                AclSays::NotStored
                    if level == Level::Bucket
                        && matches!(need, Perm::ReadAcp | Perm::WriteAcp)
                        && me.as_ref().is_some_and(|c| c.uid != f.uid && !is_administrator(c)) =>
                {
                    return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "only the bucket's owner may read or change its ACL"));
                }
                AclSays::NotStored => {}
            }
        }
    }
    if !allowed {
        match &me {
            None => anonymous_check(engine, &a.bucket, a.key.as_deref(), &a.op, a.versioned)?,
            // Who may create buckets is the root directory's mode (the engine decides).
            Some(_) if a.op == "CreateBucket" => {}
            Some(c) => private_check(engine, c, &a.bucket, a.key.as_deref(), &a.op, a.versioned)?,
        }
    }
    Ok(out)
}

fn is_administrator(c: &Caller) -> bool {
    c.uid == 0 || c.role >= Role::Admin
}

/// S3's default for what neither a bucket policy nor a stored ACL decides: a bucket and
/// its objects belong to their owner. A signed-in user who owns neither the bucket nor the
/// object gets no more than an anonymous client would (the listing of a public-read
/// bucket, public-read objects, a 404 for a key missing from a bucket it may list),
/// however the file modes read; administrators keep their powers. Whatever is admitted
/// still runs with the requester's own permissions, which the engine checks.
fn private_check(engine: &Engine, c: &Caller, bucket: &str, key: Option<&str>, op: &str, versioned: bool) -> S3Result<()> {
    if is_administrator(c) {
        return Ok(());
    }
    let sys = Caller::system();
    let b = match engine.lookup(&sys, ROOT_INO, bucket.as_bytes()) {
        Ok(b) if b.kind == FileKind::Dir => b,
        // A missing bucket is the operation's to report (NoSuchBucket).
        _ => return Ok(()),
    };
    if b.uid == c.uid {
        return Ok(());
    }
    if let Some(k) = key
        && object_file(engine, bucket, k).is_some_and(|f| f.uid == c.uid)
    {
        return Ok(());
    }
    match anonymous_check(engine, bucket, key, op, versioned) {
        Ok(()) => return Ok(()),
        Err(e) if *e.code() == S3ErrorCode::NoSuchKey => return Err(e),
        Err(_) => {}
    }
    Err(S3Error::with_message(
        S3ErrorCode::AccessDenied,
        "the bucket belongs to another user, and neither its policy nor an ACL grants this request",
    ))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Bucket,
    Object,
}

/// The ACL permission an operation needs, and on what (as S3 maps them): bucket READ lists,
/// bucket WRITE creates, overwrites and deletes objects, object READ reads one; READ_ACP
/// and WRITE_ACP read and change the ACL.
fn acl_need(op: &str) -> Option<(Level, Perm)> {
    Some(match op {
        "ListObjects" | "ListObjectsV2" | "ListObjectVersions" | "HeadBucket" | "ListMultipartUploads" | "GetBucketLocation" => (Level::Bucket, Perm::Read),
        "PutObject" | "PostObject" | "CopyObject" | "CreateMultipartUpload" | "UploadPart" | "UploadPartCopy" | "CompleteMultipartUpload" | "AbortMultipartUpload"
        | "ListParts" | "DeleteObject" | "DeleteObjects" => (Level::Bucket, Perm::Write),
        "GetBucketAcl" => (Level::Bucket, Perm::ReadAcp),
        "PutBucketAcl" => (Level::Bucket, Perm::WriteAcp),
        "GetObject" | "HeadObject" | "GetObjectAttributes" | "GetObjectTagging" => (Level::Object, Perm::Read),
        "GetObjectAcl" => (Level::Object, Perm::ReadAcp),
        "PutObjectAcl" => (Level::Object, Perm::WriteAcp),
        _ => return None,
    })
}

/// What a bucket's or object's ACL says about a request.
enum AclSays {
    /// Admitted; it runs as this caller (the owner), or as the requester when `None`.
    Grant(Option<Caller>),
    /// No stored ACL (the mode view): the caller's own permissions decide.
    NotStored,
}

/// A bucket's or an object's stored ACL. One that no longer decodes is treated as one
/// without grants: failing closed, and its owner can still replace it. An engine error
/// reading it fails the request (it is never taken for "no ACL", which could admit more).
pub(crate) fn load_acl(engine: &Engine, f: &storage_engine::Attr) -> S3Result<Option<Acl>> {
    let v = match engine.getxattr(&Caller::system(), f.ino, XATTR_ACL) {
        Ok(v) => v,
        Err(Error::NotFound) => return Ok(None),
        Err(e) => return Err(crate::error::map_err(e, crate::error::Missing::Key)),
    };
    Ok(Some(Acl::decode(&v).unwrap_or_else(|| {
        tracing::warn!(ino = f.ino, "stored S3 ACL does not decode; granting nothing");
        Acl { owner: f.uid, grants: vec![] }
    })))
}

/// Decides a request for `need` on `f` (a bucket directory or an object file) by its ACL.
/// Administrators who do not own it keep their powers (they administer the appliance).
fn acl_says(engine: &Engine, me: Option<&Caller>, f: &storage_engine::Attr, acl: Option<Acl>, need: Perm, what: &str) -> S3Result<AclSays> {
    let Some(acl) = acl else { return Ok(AclSays::NotStored) };
    let uid = me.map(|c| c.uid);
    if acl.allows(uid, need) {
        return Ok(AclSays::Grant((uid != Some(f.uid)).then(|| owner_caller(engine, f))));
    }
    if me.is_some_and(|c| is_administrator(c) && c.uid != acl.owner) {
        return Ok(AclSays::NotStored);
    }
    Err(S3Error::with_message(S3ErrorCode::AccessDenied, format!("the {what}'s ACL grants this requester no {need:?} permission")))
}

/// The object file `key` names in `bucket`, looked up as the system.
fn object_file(engine: &Engine, bucket: &str, key: &str) -> Option<storage_engine::Attr> {
    let sys = Caller::system();
    let b = engine.lookup(&sys, ROOT_INO, bucket.as_bytes()).ok()?;
    let (parent, name) = engine.object_parent(&sys, b.ino, key, false).ok()?;
    let a = engine.lookup(&sys, parent, name.as_bytes()).ok()?;
    (a.kind == FileKind::File).then_some(a)
}

/// Without a policy that allows it, an anonymous client may only read public-read buckets
/// and objects.
/// `versioned`: the request names a version of the object.
fn anonymous_check(engine: &Engine, bucket: &str, key: Option<&str>, op: &str, versioned: bool) -> S3Result<()> {
    let visibility = bucket_visibility(engine, bucket);
    if OBJECT_READS.contains(&op) && key.is_some_and(|k| object_is_public(engine, bucket, k)) {
        return Ok(());
    }
    // As S3: a bucket that does not exist is NoSuchBucket for anyone (bucket names are
    // one shared name space, so this discloses nothing a CreateBucket would not).
    if visibility == BucketVisibility::Missing && op != "CreateBucket" {
        return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
    }
    if visibility == BucketVisibility::PublicRead && ANONYMOUS_READS.contains(&op) {
        Ok(())
    } else if visibility == BucketVisibility::PublicRead
        && OBJECT_READS.contains(&op)
        && !versioned
        && key.is_some_and(|k| object_file(engine, bucket, k).is_none())
    {
        // As S3: who may list a bucket learns that a key is not there (404, not 403). The
        // answer is given here, so an object created meanwhile is not read by this request.
        Err(S3Error::new(S3ErrorCode::NoSuchKey))
    } else {
        Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused"))
    }
}

/// The access check s3s runs before every operation: presigned-URL validity, bucket
/// policies, and what anonymous clients may do.
pub(crate) struct PolicyAccess {
    pub engine: Arc<Engine>,
}

#[async_trait::async_trait]
impl S3Access for PolicyAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let access_key = cx.credentials().map(|c| c.access_key.clone());
        if access_key.is_some() {
            check_presigned_expiry(cx.uri().query())?;
        }
        let (bucket, key) = match cx.s3_path() {
            S3Path::Bucket { bucket } => (bucket.to_string(), None),
            S3Path::Object { bucket, key } => (bucket.to_string(), Some(key.to_string())),
            S3Path::Root if access_key.is_some() => return Ok(()),
            S3Path::Root => return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused")),
        };
        let op = cx.s3_op().name().to_string();
        let mut context = request_context(cx);
        if let Some(PeerAddr(ip)) = cx.extensions_mut().get::<PeerAddr>() {
            context.set("aws:SourceIp", ip.to_canonical().to_string());
        }
        let source_header = if matches!(op.as_str(), "CopyObject" | "UploadPartCopy") {
            cx.headers().get("x-amz-copy-source").and_then(|v| v.to_str().ok())
        } else {
            None
        };
        let copy_source = source_header.and_then(copy_source_of);
        let copy_source_versioned = source_header.is_some_and(|h| h.contains("?versionId="));
        let engine = self.engine.clone();
        let versioned = cx.uri().query().is_some_and(|q| q.split('&').any(|p| p.starts_with("versionId=")));
        let asked = Asked { access_key, bucket, key, op, context, copy_source, copy_source_versioned, versioned };
        // Deciding is a few metadata reads (the key, the bucket, its policy and ACL, and for
        // object-level requests the object's): made here unless a portal mirror could make
        // one of them wait for a hub. A trip to the blocking pool costs a small request more
        // than the reads do.
        let out = if engine.holds_mirrors() { blocking(move || decide(&engine, asked)).await? } else { decide(&engine, asked)? };
        let ext = cx.extensions_mut();
        if let Some(c) = out.requester {
            ext.insert(Requester(c));
        }
        if let Some(c) = out.grant {
            ext.insert(PolicyGrant(c));
        }
        if let Some(uid) = out.writer {
            ext.insert(AclWriter(uid));
        }
        if let Some(c) = out.source_grant {
            ext.insert(SourceGrant(c));
        }
        if let Some(p) = out.per_key {
            ext.insert(p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presigned_urls_are_valid_for_at_most_seven_days() {
        assert!(check_presigned_expiry(None).is_ok());
        assert!(check_presigned_expiry(Some("X-Amz-Expires=604800&X-Amz-Date=x")).is_ok());
        let e = check_presigned_expiry(Some("a=b&X-Amz-Expires=604801")).unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::AuthorizationQueryParametersError);
    }

    #[test]
    fn copy_sources_are_decoded_for_policies() {
        assert_eq!(copy_source_of("src/public/foo"), Some(("src".into(), "public/foo".into())));
        assert_eq!(copy_source_of("/src/a%20b?versionId=null"), Some(("src".into(), "a b".into())));
        assert_eq!(copy_source_of("src"), None);
        assert_eq!(copy_source_of("/src/"), None);
    }
}
