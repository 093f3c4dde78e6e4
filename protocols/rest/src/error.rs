//! The one mapping from engine errors to HTTP status codes and JSON error bodies.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use storage_engine::Error;

use crate::wire::ErrorBody;

/// An error answered to the client as `{"error": code, "message": text}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
    }

    pub fn forbidden() -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "permission_denied", "permission denied")
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let (status, code) = match &e {
            Error::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Error::Exists => (StatusCode::CONFLICT, "exists"),
            Error::NotEmpty => (StatusCode::CONFLICT, "not_empty"),
            Error::NotDir => (StatusCode::CONFLICT, "not_dir"),
            Error::IsDir => (StatusCode::CONFLICT, "is_dir"),
            Error::Busy(_) => (StatusCode::CONFLICT, "busy"),
            Error::ReadOnly(_) => (StatusCode::FORBIDDEN, "read_only"),
            Error::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
            Error::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            Error::InvalidName(_) => (StatusCode::BAD_REQUEST, "invalid_name"),
            Error::InvalidArgument(_) => (StatusCode::BAD_REQUEST, "invalid_argument"),
            Error::FileTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "file_too_large"),
            Error::NoSpace(_) => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::NotSupported(_) => (StatusCode::NOT_IMPLEMENTED, "not_supported"),
            Error::Stale => (StatusCode::INTERNAL_SERVER_ERROR, "stale"),
            Error::TooManyLinks => (StatusCode::INTERNAL_SERVER_ERROR, "too_many_links"),
            Error::NotSymlink => (StatusCode::INTERNAL_SERVER_ERROR, "not_symlink"),
            Error::Io(_) => (StatusCode::INTERNAL_SERVER_ERROR, "io"),
            Error::Corrupt(_) => (StatusCode::INTERNAL_SERVER_ERROR, "corrupt"),
            Error::Metadata(_) => (StatusCode::INTERNAL_SERVER_ERROR, "metadata"),
        };
        if status.is_server_error() {
            // Logged here, where it is handled: the client only sees the message.
            tracing::error!(error = %e, "request failed");
        }
        ApiError::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut res = (self.status, Json(ErrorBody { error: self.code.to_string(), message: self.message })).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"aquifer\""));
        }
        res
    }
}

pub(crate) async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such API route")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed on this route")
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;
