//! Browser-based uploads (POST Object, `multipart/form-data`): what S3 checks in the form
//! before the upload, done before s3s sees the request.
//!
//! s3s 0.14.1 parses the form, verifies its signature (SigV2 or SigV4 over the policy) and
//! checks the policy, but differs from S3 where clients can tell: a field that fails a policy
//! condition answers `400 InvalidPolicyDocument` (S3: `403 AccessDenied`), any RFC 3339 date
//! passes as the expiration (S3 wants ISO 8601 `2007-12-01T12:00:00.000Z`), and `key`
//! containing `${filename}` is checked and stored as written. [`prepare`] reads the fields
//! before the file (at most [`FORM_FIELDS_BYTES_MAX`]) and checks them as S3 does, then hands
//! s3s the same form with `${filename}` replaced. s3s verifies the signature; a form S3
//! refuses is then answered by the [`RefusedForm`] route (s3s matches routes after the
//! signature, before its own policy checks), and a form S3 admits passes s3s's checks too.
//! The fields go with the request as a [`PostForm`] extension, for what s3s reads under other
//! names (the canned ACL is `acl` in a form, the tags `tagging`, an XML `Tagging` document).
//!
//! The file itself is left to s3s, which gathers it in memory up to
//! [`POST_OBJECT_BYTES_MAX`] (the service's `post_object_max_file_size`) before PutObject's
//! path stores it.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use s3s::post_policy::{PostPolicy, PostPolicyCondition};
use s3s::{S3Error, S3ErrorCode};

use crate::form::{Form, FormError, Looks, boundary_of, parse_form};

pub use crate::form::FORM_FIELDS_BYTES_MAX;
/// The largest file a POST upload may carry (s3s holds it in memory before it is stored);
/// larger uploads use PUT or multipart uploads.
pub const POST_OBJECT_BYTES_MAX: u64 = 64 << 20;

/// The fields of a POST upload's form that came before the file, names in lower case, `key`
/// with `${filename}` replaced.
#[derive(Debug, Clone)]
pub(crate) struct PostForm {
    fields: Vec<(String, String)>,
}

impl PostForm {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// S3's refusal of a form (code, message), answered by [`RefusedForm`] once s3s has checked
/// the form's signature.
#[derive(Debug, Clone)]
pub(crate) struct PostRefusal(S3ErrorCode, String);

/// An s3s route (s3s matches routes after checking signatures, before its own policy checks)
/// for forms [`prepare`] found S3 refuses.
pub(crate) struct RefusedForm;

#[async_trait::async_trait]
impl s3s::route::S3Route for RefusedForm {
    fn is_match(&self, _: &http::Method, _: &http::Uri, _: &http::HeaderMap, extensions: &mut http::Extensions) -> bool {
        extensions.get::<PostRefusal>().is_some()
    }

    async fn check_access(&self, _: &mut s3s::S3Request<s3s::Body>) -> s3s::S3Result<()> {
        Ok(())
    }

    /// Answers the refusal as an S3 error document (returning it as an error would have s3s
    /// log every refused form at error level).
    async fn call(&self, req: s3s::S3Request<s3s::Body>) -> s3s::S3Result<s3s::S3Response<s3s::Body>> {
        let Some(PostRefusal(code, msg)) = req.extensions.get::<PostRefusal>() else {
            return Err(refuse(S3ErrorCode::InternalError, "a refused POST form without its refusal"));
        };
        let (status, headers, body) = error_parts(code, msg);
        let mut resp = s3s::S3Response::new(body);
        resp.status = Some(status);
        resp.headers = headers;
        Ok(resp)
    }
}

/// An S3 error answer (status, headers, XML body) as s3s writes them.
pub(crate) fn error_parts(code: &S3ErrorCode, msg: &str) -> (http::StatusCode, http::HeaderMap, s3s::Body) {
    let esc = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{}</Code><Message>{}</Message></Error>",
        esc(code.as_str()),
        esc(msg)
    );
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
    headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    (code.status_code().unwrap_or(http::StatusCode::BAD_REQUEST), headers, s3s::Body::from(body))
}

/// The bucket of a POST to a bucket with a `multipart/form-data` body (a browser upload),
/// path style or, with `domain`, virtual-host style.
pub(crate) fn form_upload_bucket<B>(req: &http::Request<B>, domain: Option<&crate::vhost::Domain>) -> Option<String> {
    if req.method() != http::Method::POST {
        return None;
    }
    let ct = req.headers().get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    if !ct.trim_start().to_ascii_lowercase().starts_with("multipart/form-data") {
        return None;
    }
    let path = req.uri().path();
    if let Some(domain) = domain {
        let host = req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).or(req.uri().host())?;
        if let Some(bucket) = domain.bucket_of(host) {
            return (path == "/" || path.is_empty()).then_some(bucket);
        }
    }
    let rest = path.strip_prefix('/')?;
    let bucket = rest.strip_suffix('/').unwrap_or(rest);
    if bucket.is_empty() || bucket.contains('/') {
        return None;
    }
    urlencoding::decode(bucket).ok().map(|b| b.into_owned())
}

fn refuse(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::with_message(code, msg.into())
}

fn form_error(e: FormError) -> S3Error {
    let code = match e {
        FormError::Malformed(_) | FormError::TooManyParts => S3ErrorCode::MalformedPOSTRequest,
        FormError::NoFile | FormError::BoundaryInValue(_) => S3ErrorCode::InvalidArgument,
    };
    refuse(code, e.to_string())
}

/// Reads and checks the form's fields; answers the request to hand s3s (the same form, with
/// `${filename}` replaced in `key`, a [`PostForm`] extension and, for a form S3 refuses, a
/// [`PostRefusal`]) or the S3 error to answer for a form that cannot be read.
pub(crate) async fn prepare<B>(req: http::Request<B>, bucket: &str) -> Result<http::Request<s3s::Body>, S3Error>
where
    B: hyper::body::Body<Data = Bytes, Error = s3s::StdError> + Send + Sync + Unpin + 'static,
{
    let content_type = req.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let boundary = boundary_of(content_type).ok_or_else(|| refuse(S3ErrorCode::MalformedPOSTRequest, "a multipart/form-data body needs a boundary"))?;
    let (mut parts, mut body) = req.into_parts();
    let mut buf: Vec<u8> = Vec::new();
    let too_large = || {
        refuse(
            S3ErrorCode::MaxPostPreDataLengthExceededError,
            format!("Your POST request fields preceding the upload file were too large (over {FORM_FIELDS_BYTES_MAX} bytes)."),
        )
    };
    let mut looks = Looks::default();
    let mut ended = false;
    let form = loop {
        if looks.due(buf.len(), ended) {
            if let Some(form) = parse_form(&buf, &boundary).map_err(form_error)? {
                if form.data_start > FORM_FIELDS_BYTES_MAX {
                    return Err(too_large());
                }
                break form;
            }
            if ended {
                return Err(refuse(S3ErrorCode::MalformedPOSTRequest, "the body of the POST request is not a complete multipart/form-data form with a file field"));
            }
            if buf.len() > FORM_FIELDS_BYTES_MAX {
                return Err(too_large());
            }
        }
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buf.extend_from_slice(&data);
                }
            }
            Some(Err(e)) => return Err(refuse(S3ErrorCode::IncompleteBody, format!("read the POST form: {e}"))),
            None => ended = true,
        }
    };
    // A form S3 refuses still goes to s3s, which verifies its signature first: a forged form
    // is answered SignatureDoesNotMatch as in S3, and [`RefusedForm`] answers the refusal.
    let (fields, refusal) = match check_form(&form, bucket, time::OffsetDateTime::now_utc()) {
        Ok(fields) => (fields, None),
        Err((fields, e)) => (fields, Some(PostRefusal(e.code().clone(), e.message().unwrap_or_default().to_string()))),
    };

    // The same form, fields first (`key` as checked), then the file part as sent.
    let names = form.fields.iter().map(|(name, _)| name.as_str());
    let mut prefix = crate::form::rebuild(&boundary, names.zip(fields.fields.iter().map(|(_, v)| v.as_str())), &buf[form.file_headers.clone()]).map_err(form_error)?;
    let new_prefix_len = prefix.len();
    prefix.extend_from_slice(&buf[form.data_start..]);
    if let Some(len) = parts.headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok()) {
        let len = (len + new_prefix_len as u64).saturating_sub(form.data_start as u64);
        parts.headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(len));
    }
    parts.extensions.insert(fields);
    if let Some(refusal) = refusal {
        parts.extensions.insert(refusal);
    }
    let replay = Replay { first: Some(Bytes::from(prefix)), rest: body };
    Ok(http::Request::from_parts(parts, s3s::Body::http_body(replay)))
}

/// Fields exempt from "every field must appear in the policy" (S3's list; s3s adds `submit`
/// and the server-side encryption fields).
fn exempt_from_policy(name: &str) -> bool {
    matches!(name, "x-amz-signature" | "signature" | "awsaccesskeyid" | "file" | "submit" | "policy")
        || name.starts_with("x-amz-server-side-encryption")
        || name.starts_with("x-ignore-")
}

/// S3's checks of a form before its file: one of each field, a key, a signature wherever a
/// policy is given, and the policy (format, expiration, every condition but the length).
/// Answers the fields with lower-case names and `${filename}` replaced in `key`, and with
/// them the refusal where there is one.
fn check_form(form: &Form, bucket: &str, now: time::OffsetDateTime) -> Result<PostForm, (PostForm, S3Error)> {
    let form = PostForm { fields: crate::form::checked_fields(form) };
    match check_fields(&form, bucket, now) {
        Ok(()) => Ok(form),
        Err(e) => Err((form, e)),
    }
}

fn check_fields(form: &PostForm, bucket: &str, now: time::OffsetDateTime) -> Result<(), S3Error> {
    // Looked up by name, so that the checks take time linear in the form (they run before
    // the signature is checked; a policy of 1 MiB holds some 20,000 conditions).
    let mut by_name: HashMap<&str, &str> = HashMap::with_capacity(form.fields.len());
    for (n, v) in &form.fields {
        if by_name.insert(n, v).is_some() {
            return Err(refuse(S3ErrorCode::InvalidArgument, format!("the POST form gives field '{n}' more than once")));
        }
    }
    if form.get("key").is_none() {
        return Err(refuse(S3ErrorCode::InvalidArgument, "Bucket POST must contain a field named 'key'."));
    }
    let signed = form.get("signature").is_some() || form.get("x-amz-signature").is_some();
    let Some(policy_b64) = form.get("policy") else {
        return Ok(());
    };
    if !signed {
        let which = if form.get("x-amz-credential").is_some() { "X-Amz-Signature" } else { "Signature" };
        return Err(refuse(S3ErrorCode::InvalidArgument, format!("Bucket POST must contain a field named '{which}'.")));
    }
    let invalid = |msg: &str| refuse(S3ErrorCode::InvalidPolicyDocument, format!("Invalid Policy: {msg}"));
    let json = base64_decode(policy_b64.trim()).ok_or_else(|| invalid("the policy is not base64"))?;
    let json = std::str::from_utf8(&json).map_err(|_| invalid("the policy is not UTF-8"))?;
    let doc: serde_json::Value = serde_json::from_str(json).map_err(|_| invalid("the policy is not JSON"))?;
    let expiration = doc.get("expiration").and_then(|e| e.as_str()).ok_or_else(|| invalid("Policy missing expiration."))?;
    if !iso8601_utc(expiration) {
        return Err(invalid(&format!("Invalid 'expiration' value: '{expiration}'")));
    }
    let policy = PostPolicy::from_json(json).map_err(|e| invalid(&e.to_string()))?;
    if now >= time::OffsetDateTime::from(policy.expiration.clone()) {
        return Err(refuse(S3ErrorCode::AccessDenied, "Invalid according to Policy: Policy expired."));
    }
    for c in &policy.conditions {
        let (ok, text) = match c {
            PostPolicyCondition::Eq { field, value } => {
                (value_of(&by_name, field, bucket) == value.as_str(), format!("[\"eq\", \"${field}\", \"{value}\"]"))
            }
            PostPolicyCondition::StartsWith { field, prefix } => (
                value_of(&by_name, field, bucket).starts_with(prefix.as_str()),
                format!("[\"starts-with\", \"${field}\", \"{prefix}\"]"),
            ),
            // Checked against the file once it has arrived (s3s: EntityTooSmall/-Large).
            PostPolicyCondition::ContentLengthRange { .. } => continue,
        };
        if !ok {
            return Err(refuse(S3ErrorCode::AccessDenied, format!("Invalid according to Policy: Policy Condition failed: {text}")));
        }
    }
    let covered: HashSet<&str> = policy
        .conditions
        .iter()
        .filter_map(|c| match c {
            PostPolicyCondition::Eq { field, .. } | PostPolicyCondition::StartsWith { field, .. } => Some(field.as_str()),
            PostPolicyCondition::ContentLengthRange { .. } => None,
        })
        .collect();
    for (name, _) in &form.fields {
        if !covered.contains(name.as_str()) && !exempt_from_policy(name) {
            return Err(refuse(S3ErrorCode::AccessDenied, format!("Invalid according to Policy: Extra input fields: {name}")));
        }
    }
    Ok(())
}

/// A condition's field as the form gives it; the bucket is the one addressed. A field the
/// form lacks is empty (as s3s, which checks the conditions again).
fn value_of<'a>(fields: &HashMap<&str, &'a str>, field: &str, bucket: &'a str) -> &'a str {
    if field == "bucket" {
        return bucket;
    }
    fields.get(field).copied().unwrap_or("")
}

/// `YYYY-MM-DDThh:mm:ss[.fraction]Z`, the only expiration S3 takes.
fn iso8601_utc(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[b.len() - 1] == b'Z';
    if !shape {
        return false;
    }
    let frac = &b[19..b.len() - 1];
    let frac_ok = frac.is_empty() || (frac[0] == b'.' && frac.len() > 1 && frac.len() <= 10 && frac[1..].iter().all(u8::is_ascii_digit));
    frac_ok && s3s::dto::Timestamp::parse(s3s::dto::TimestampFormat::DateTime, s).is_ok()
}

/// Standard base64 with padding, as S3 takes the policy: whole quads, at most two `=` and
/// only at the end; the decoding itself is the crate's one.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let pad = s.len() - s.trim_end_matches('=').len();
    if !s.len().is_multiple_of(4) || pad > 2 {
        return None;
    }
    crate::service::base64_decode(s)
}

/// The bytes already read, then the rest of the body.
struct Replay<B> {
    first: Option<Bytes>,
    rest: B,
}

impl<B: hyper::body::Body<Data = Bytes, Error = s3s::StdError> + Unpin> hyper::body::Body for Replay<B> {
    type Data = Bytes;
    type Error = s3s::StdError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, s3s::StdError>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        assert_eq!(base64_decode("eyJhIjoxfQ==").unwrap(), b"{\"a\":1}");
        assert_eq!(base64_decode("YWI=").unwrap(), b"ab");
        assert_eq!(base64_decode("YWJj").unwrap(), b"abc");
        assert!(base64_decode("YW=j").is_none());
        assert!(base64_decode("YWJ").is_none());
    }

    #[test]
    fn expiration_must_be_iso8601_utc() {
        assert!(iso8601_utc("2030-01-01T00:00:00Z"));
        assert!(iso8601_utc("2030-01-01T00:00:00.000Z"));
        assert!(!iso8601_utc("2030-01-01 00:00:00.123456+00:00"));
        assert!(!iso8601_utc("2030-01-01T00:00:00+00:00"));
        assert!(!iso8601_utc("2030-13-01T00:00:00Z"));
        assert!(!iso8601_utc("2030-01-01T00:00:00.Z"));
    }

    #[test]
    fn the_file_name_goes_into_the_key() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\na/${filename}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f; x.txt\"\r\nContent-Type: text/plain\r\n\r\nhello";
        let f = parse_form(body, "XyZ").unwrap().unwrap();
        let checked = check_form(&f, "b", time::OffsetDateTime::now_utc()).map_err(|(_, e)| e).unwrap();
        assert_eq!(checked.get("key"), Some("a/f; x.txt"));
    }
}
