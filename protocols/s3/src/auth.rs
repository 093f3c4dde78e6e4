//! Who a request runs as: SigV4 secrets come from the engine's identity store; anonymous
//! requests may only read buckets marked public-read.

use std::sync::Arc;

use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::{Credentials, S3Auth, SecretKey};
use s3s::path::S3Path;
use s3s::{S3Error, S3ErrorCode, S3Result};
use storage_engine::{Caller, Engine, Error, FileKind, ROOT_INO};

use crate::meta::XATTR_PUBLIC_READ;
use crate::service::blocking;

pub(crate) struct EngineAuth {
    pub engine: Arc<Engine>,
}

#[async_trait::async_trait]
impl S3Auth for EngineAuth {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        let engine = self.engine.clone();
        let access = access_key.to_string();
        match blocking(move || Ok(engine.s3_credentials(&access))).await? {
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

/// Operations an anonymous client may run on a public-read bucket.
const ANONYMOUS_READS: &[&str] = &[
    "GetObject",
    "HeadObject",
    "HeadBucket",
    "ListObjects",
    "ListObjectsV2",
    "GetBucketLocation",
    "GetObjectAttributes",
];

/// Operations on one object an anonymous client may run on an object marked public-read
/// (PutObject or PutObjectAcl with `public-read`) in a private bucket.
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

pub(crate) struct PublicReadAccess {
    pub engine: Arc<Engine>,
}

#[async_trait::async_trait]
impl S3Access for PublicReadAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_some() {
            return check_presigned_expiry(cx.uri().query());
        }
        let (bucket, key) = match cx.s3_path() {
            S3Path::Bucket { bucket } => (bucket.to_string(), None),
            S3Path::Object { bucket, key } => (bucket.to_string(), Some(key.to_string())),
            S3Path::Root => return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused")),
        };
        let op = cx.s3_op().name();
        let engine = self.engine.clone();
        let object_read = key.is_some() && OBJECT_READS.contains(&op);
        let (visibility, object_public) = blocking(move || {
            let v = bucket_visibility(&engine, &bucket);
            let marked = object_read && v == BucketVisibility::Private && key.as_deref().is_some_and(|k| object_is_public(&engine, &bucket, k));
            Ok((v, marked))
        })
        .await?;
        if object_public {
            return Ok(());
        }
        // As S3: a bucket that does not exist is NoSuchBucket for anyone (bucket names are
        // one shared name space, so this discloses nothing a CreateBucket would not).
        if visibility == BucketVisibility::Missing && op != "CreateBucket" {
            return Err(S3Error::new(S3ErrorCode::NoSuchBucket));
        }
        if visibility == BucketVisibility::PublicRead && ANONYMOUS_READS.contains(&op) {
            Ok(())
        } else {
            Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused"))
        }
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
}
