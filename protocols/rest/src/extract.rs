//! Extractors whose rejections are answered in the API's JSON error format.

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A JSON request body, limited to [`crate::JSON_BODY_BYTES_MAX`].
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(JsonBody(v)),
            Err(rejection) => {
                let status = rejection.status();
                let message = rejection.body_text();
                let code = if status == axum::http::StatusCode::PAYLOAD_TOO_LARGE { "body_too_large" } else { "invalid_body" };
                Err(ApiError::new(status, code, message))
            }
        }
    }
}

/// Query string parameters.
pub(crate) struct QueryArgs<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryArgs<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(QueryArgs(v)),
            Err(rejection) => Err(ApiError::bad_request(rejection.body_text())),
        }
    }
}
