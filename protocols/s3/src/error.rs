//! The one mapping from `storage_engine::Error` to S3 error codes.
//!
//! "Not found" means different things depending on what was looked up (a bucket, a key, an
//! upload), so the caller names the code for it.

use http::StatusCode;
use s3s::{S3Error, S3ErrorCode};
use storage_engine::{Error, NameProblem};

/// What a `NotFound` from the engine refers to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Missing {
    Bucket,
    Key,
    Upload,
}

pub(crate) fn map_err(e: Error, missing: Missing) -> S3Error {
    let code = match &e {
        Error::NotFound => match missing {
            Missing::Bucket => S3ErrorCode::NoSuchBucket,
            Missing::Key => S3ErrorCode::NoSuchKey,
            Missing::Upload => S3ErrorCode::NoSuchUpload,
        },
        Error::Exists => S3ErrorCode::BucketAlreadyExists,
        Error::NotEmpty => S3ErrorCode::BucketNotEmpty,
        Error::PermissionDenied | Error::Unauthenticated => S3ErrorCode::AccessDenied,
        Error::InvalidName(NameProblem::TooLong) => S3ErrorCode::KeyTooLongError,
        Error::NotDir => {
            return S3Error::with_message(
                S3ErrorCode::InvalidArgument,
                "a prefix of this key up to a '/' is an existing object; Aquifer stores keys as paths",
            );
        }
        Error::IsDir => {
            return S3Error::with_message(
                S3ErrorCode::InvalidArgument,
                "this key followed by '/' is a prefix of other objects; Aquifer stores keys as paths",
            );
        }
        Error::InvalidName(_) | Error::InvalidArgument(_) | Error::NotSymlink => S3ErrorCode::InvalidArgument,
        Error::FileTooLarge => S3ErrorCode::EntityTooLarge,
        Error::NoSpace(_) => {
            let mut err = S3Error::with_message(S3ErrorCode::Custom("InsufficientStorage".into()), e.to_string());
            err.set_status_code(StatusCode::INSUFFICIENT_STORAGE);
            return err;
        }
        Error::Busy(_) => S3ErrorCode::SlowDown,
        Error::ReadOnly(_) => S3ErrorCode::AccessDenied,
        Error::Unavailable(_) => S3ErrorCode::ServiceUnavailable,
        Error::NotSupported(_) => S3ErrorCode::NotImplemented,
        Error::TooManyLinks | Error::Stale | Error::Io(_) | Error::Corrupt(_) | Error::Metadata(_) => {
            tracing::error!(error = %e, "storage engine failure");
            S3ErrorCode::InternalError
        }
    };
    S3Error::with_message(code, e.to_string())
}

/// A bug or a lost blocking task: never expected, reported as InternalError.
pub(crate) fn internal(what: impl std::fmt::Display) -> S3Error {
    tracing::error!(error = %what, "internal error");
    S3Error::with_message(S3ErrorCode::InternalError, what.to_string())
}
