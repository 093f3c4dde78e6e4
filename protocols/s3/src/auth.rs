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

/// Whether anonymous clients may read `bucket`.
pub(crate) fn bucket_is_public(engine: &Engine, bucket: &str) -> bool {
    let sys = Caller::system();
    match engine.lookup(&sys, ROOT_INO, bucket.as_bytes()) {
        Ok(a) if a.kind == FileKind::Dir => engine.getxattr(&sys, a.ino, XATTR_PUBLIC_READ).is_ok_and(|v| v == b"1"),
        _ => false,
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

pub(crate) struct PublicReadAccess {
    pub engine: Arc<Engine>,
}

#[async_trait::async_trait]
impl S3Access for PublicReadAccess {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_some() {
            return Ok(());
        }
        let bucket = match cx.s3_path() {
            S3Path::Bucket { bucket } | S3Path::Object { bucket, .. } => bucket.to_string(),
            S3Path::Root => return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused")),
        };
        if !ANONYMOUS_READS.contains(&cx.s3_op().name()) {
            return Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused"));
        }
        let engine = self.engine.clone();
        if blocking(move || Ok(bucket_is_public(&engine, &bucket))).await? {
            Ok(())
        } else {
            Err(S3Error::with_message(S3ErrorCode::AccessDenied, "anonymous access refused"))
        }
    }
}
