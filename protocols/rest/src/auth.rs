//! Authentication of every request: HTTP Basic (user and password) or a bearer API token.
//! Role checks for admin resources the engine serves without a caller live here too.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64_decode::decode_base64;
use std::sync::Arc;

use storage_engine::{Caller, Engine, Role};

use crate::AppState;
use crate::error::ApiError;

/// The authenticated caller of a request.
pub(crate) struct Auth(pub Caller);

impl Auth {
    /// Refuses callers below `role` with 403.
    pub fn require(&self, role: Role) -> Result<(), ApiError> {
        if self.0.role >= role { Ok(()) } else { Err(ApiError::forbidden()) }
    }
}

/// Longest Authorization header accepted; longer ones are refused before any hashing.
const AUTHORIZATION_BYTES_MAX: usize = 4096;

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Auth, ApiError> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| ApiError::unauthenticated("authentication required: HTTP Basic or a bearer token"))?;
        if value.len() > AUTHORIZATION_BYTES_MAX {
            return Err(ApiError::unauthenticated("authorization header too long"));
        }
        let value = value.to_str().map_err(|_| ApiError::unauthenticated("malformed authorization header"))?;
        let (scheme, rest) = value.split_once(' ').ok_or_else(|| ApiError::unauthenticated("malformed authorization header"))?;
        let engine = state.engine.clone();
        let rest = rest.trim().to_string();
        let caller = if scheme.eq_ignore_ascii_case("basic") {
            let raw = decode_base64(&rest).ok_or_else(|| ApiError::unauthenticated("malformed basic credentials"))?;
            let raw = String::from_utf8(raw).map_err(|_| ApiError::unauthenticated("malformed basic credentials"))?;
            let (user, password) =
                raw.split_once(':').ok_or_else(|| ApiError::unauthenticated("malformed basic credentials"))?;
            let (user, password) = (user.to_string(), password.to_string());
            // Password verification is argon2: CPU-heavy, so off the async workers.
            blocking(move || engine.authenticate_password(&user, &password)).await?
        } else if scheme.eq_ignore_ascii_case("bearer") {
            blocking(move || engine.authenticate_token(&rest)).await?
        } else {
            return Err(ApiError::unauthenticated("unsupported authorization scheme"));
        };
        Ok(Auth(caller))
    }
}

/// Runs a blocking engine call on the blocking pool. A panic there becomes a 500, never a
/// dropped connection.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, ApiError>
where
    F: FnOnce() -> storage_engine::Result<T> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => {
            tracing::error!(error = %e, "engine call panicked");
            Err(ApiError::internal("internal error"))
        }
    }
}

/// Runs an admin change on the blocking pool and records it in the audit log as `action` on
/// `target` over `rest`, whatever its outcome: `ok`, or the refusal's message. A caller below
/// admin is refused with 403 before anything runs or is recorded.
pub(crate) async fn audited<T: Send + 'static>(
    engine: Arc<Engine>,
    caller: Caller,
    action: &'static str,
    target: String,
    f: impl FnOnce(&Caller) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    if caller.role < Role::Admin {
        return Err(ApiError::forbidden());
    }
    blocking(move || {
        let r = f(&caller);
        let outcome = match &r {
            Ok(_) => "ok",
            Err(e) => e.message.as_str(),
        };
        engine.audit(&caller.user, "rest", action, &target, outcome)?;
        Ok(r)
    })
    .await?
}

mod base64_decode {
    /// Decodes standard base64 (with or without padding); `None` on any invalid input.
    pub fn decode_base64(s: &str) -> Option<Vec<u8>> {
        fn val(c: u8) -> Option<u32> {
            Some(match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                _ => return None,
            } as u32)
        }
        let s = s.trim_end_matches('=').as_bytes();
        if s.len() % 4 == 1 {
            return None;
        }
        let mut out = Vec::with_capacity(s.len() * 3 / 4);
        for chunk in s.chunks(4) {
            let mut acc = 0u32;
            for (i, &c) in chunk.iter().enumerate() {
                acc |= val(c)? << (18 - 6 * i);
            }
            let bytes = acc.to_be_bytes();
            out.extend_from_slice(&bytes[1..chunk.len()]);
        }
        Some(out)
    }

    #[cfg(test)]
    mod tests {
        use super::decode_base64;

        #[test]
        fn decodes_padded_and_unpadded() {
            assert_eq!(decode_base64("YWRtaW46c2VjcmV0").unwrap(), b"admin:secret");
            assert_eq!(decode_base64("YQ==").unwrap(), b"a");
            assert_eq!(decode_base64("YWI").unwrap(), b"ab");
            assert_eq!(decode_base64("").unwrap(), b"");
            assert!(decode_base64("Y").is_none());
            assert!(decode_base64("YW*i").is_none());
        }
    }
}
