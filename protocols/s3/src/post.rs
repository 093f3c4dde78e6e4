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

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::Frame;
use s3s::post_policy::{PostPolicy, PostPolicyCondition};
use s3s::{S3Error, S3ErrorCode};

/// The form fields before the file part (all of them, with their part headers) may take at
/// most this many bytes; more is `400 MaxPostPreDataLengthExceededError`, as in S3.
pub const FORM_FIELDS_BYTES_MAX: usize = 1 << 20;
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

/// Reads and checks the form's fields; answers the request to hand s3s (the same form, with
/// `${filename}` replaced in `key`, a [`PostForm`] extension and, for a form S3 refuses, a
/// [`PostRefusal`]) or the S3 error to answer for a form that cannot be read.
pub(crate) async fn prepare<B>(req: http::Request<B>, bucket: &str) -> Result<http::Request<s3s::Body>, S3Error>
where
    B: hyper::body::Body<Data = Bytes, Error = s3s::StdError> + Send + Sync + Unpin + 'static,
{
    let boundary = boundary_of(req.headers())?;
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
            if let Some(form) = parse_form(&buf, &boundary)? {
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
    let mut prefix = Vec::with_capacity(form.data_start + 256);
    for (i, (name, _)) in form.fields.iter().enumerate() {
        let value = &fields.fields[i].1;
        prefix.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes());
        prefix.extend_from_slice(value.as_bytes());
        prefix.extend_from_slice(b"\r\n");
    }
    prefix.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
    prefix.extend_from_slice(&buf[form.file_headers.clone()]);
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

/// When [`prepare`] reads the form from the start again, looking for the file part: once
/// the bytes read have doubled since its last look, when the body has ended, and when more
/// than [`FORM_FIELDS_BYTES_MAX`] have been read. Looking at every frame instead made the work
/// quadratic in the form's size: a client that splits its body into 1-byte chunks had the
/// listener scan the whole buffer a million times for one request (about half an hour of a
/// core for a 1 MiB form, before anyone is authenticated). With doubling, all looks together
/// read at most twice the bytes of the last one.
#[derive(Default)]
struct Looks {
    /// Bytes read at the last look.
    at: usize,
}

impl Looks {
    fn due(&mut self, read: usize, ended: bool) -> bool {
        let due = ended || read > FORM_FIELDS_BYTES_MAX || (read > self.at && read >= 2 * self.at);
        if due {
            self.at = read;
        }
        due
    }
}

fn boundary_of(headers: &http::HeaderMap) -> Result<String, S3Error> {
    let ct = headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    for param in ct.split(';').skip(1) {
        if let Some((k, v)) = param.split_once('=')
            && k.trim().eq_ignore_ascii_case("boundary")
        {
            let v = v.trim().trim_matches('"');
            if !v.is_empty() && v.len() <= 70 && !v.contains(['\r', '\n']) {
                return Ok(v.to_string());
            }
        }
    }
    Err(refuse(S3ErrorCode::MalformedPOSTRequest, "a multipart/form-data body needs a boundary"))
}

/// A form read up to its file part.
struct Form {
    /// Names as sent, values.
    fields: Vec<(String, String)>,
    file_name: Option<String>,
    /// The file part's header lines, blank line included.
    file_headers: std::ops::Range<usize>,
    /// Where the file's content starts in the buffer.
    data_start: usize,
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    if from > hay.len() {
        return None;
    }
    hay[from..].windows(needle.len()).position(|w| w == needle).map(|i| i + from)
}

fn malformed(msg: &str) -> S3Error {
    refuse(S3ErrorCode::MalformedPOSTRequest, format!("the body of the POST request is not well-formed multipart/form-data: {msg}"))
}

/// `Ok(None)` while the buffer ends before the file part's headers do.
fn parse_form(buf: &[u8], boundary: &str) -> Result<Option<Form>, S3Error> {
    let delim = format!("--{boundary}");
    let delim = delim.as_bytes();
    // A preamble before the first boundary is allowed and ignored.
    let Some(first) = find(buf, delim, 0) else { return Ok(None) };
    if first > 0 && !buf[..first].ends_with(b"\r\n") {
        return Err(malformed("text before the first boundary"));
    }
    let mut pos = first + delim.len();
    let mut fields = Vec::new();
    loop {
        match buf.get(pos..pos + 2) {
            None => return Ok(None),
            Some(b"\r\n") => pos += 2,
            Some(b"--") => return Err(refuse(S3ErrorCode::InvalidArgument, "POST requires exactly one file upload per request")),
            Some(_) => return Err(malformed("a boundary line with more after it")),
        }
        let Some(headers_end) = find(buf, b"\r\n\r\n", pos) else { return Ok(None) };
        let (name, file_name) = disposition(&buf[pos..headers_end + 2])?;
        let data_start = headers_end + 4;
        if name.eq_ignore_ascii_case("file") {
            return Ok(Some(Form { fields, file_name, file_headers: pos..data_start, data_start }));
        }
        let mut end_pat = b"\r\n".to_vec();
        end_pat.extend_from_slice(delim);
        let Some(end) = find(buf, &end_pat, data_start) else { return Ok(None) };
        let value = std::str::from_utf8(&buf[data_start..end]).map_err(|_| malformed("a field value that is not UTF-8"))?;
        fields.push((name, value.to_string()));
        pos = end + end_pat.len();
    }
}

/// The `name` and `filename` of a part's `Content-Disposition: form-data` header.
fn disposition(headers: &[u8]) -> Result<(String, Option<String>), S3Error> {
    let text = std::str::from_utf8(headers).map_err(|_| malformed("part headers that are not UTF-8"))?;
    for line in text.split("\r\n") {
        let Some((h, v)) = line.split_once(':') else { continue };
        if !h.trim().eq_ignore_ascii_case("content-disposition") {
            continue;
        }
        let (mut name, mut file_name) = (None, None);
        let mut params = split_params(v);
        if !params.next().is_some_and(|p| p.trim().eq_ignore_ascii_case("form-data")) {
            return Err(malformed("a part that is not form-data"));
        }
        for p in params {
            let Some((k, val)) = p.split_once('=') else { continue };
            let val = val.trim();
            let val = val.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(val).to_string();
            match k.trim().to_ascii_lowercase().as_str() {
                "name" => name = Some(val),
                "filename" => file_name = Some(val),
                _ => {}
            }
        }
        let name = name.ok_or_else(|| malformed("a part without a name"))?;
        if name.is_empty() || name.contains(['"', '\r', '\n']) {
            return Err(malformed("a part name that is empty or holds a quote"));
        }
        return Ok((name, file_name));
    }
    Err(malformed("a part without Content-Disposition"))
}

/// Splits header parameters at `;` outside quoted strings.
fn split_params(v: &str) -> impl Iterator<Item = &str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in v.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ';' if !quoted => {
                out.push(&v[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&v[start..]);
    out.into_iter()
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
    let mut fields: Vec<(String, String)> = form.fields.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.clone())).collect();
    // The browser's name of the file, where the key asks for it.
    if let Some(key) = fields.iter_mut().find(|(n, _)| n == "key")
        && key.1.contains("${filename}")
    {
        key.1 = key.1.replace("${filename}", form.file_name.as_deref().unwrap_or(""));
    }
    let form = PostForm { fields };
    match check_fields(&form, bucket, now) {
        Ok(()) => Ok(form),
        Err(e) => Err((form, e)),
    }
}

fn check_fields(form: &PostForm, bucket: &str, now: time::OffsetDateTime) -> Result<(), S3Error> {
    for (i, (n, _)) in form.fields.iter().enumerate() {
        if form.fields[..i].iter().any(|(m, _)| m == n) {
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
                (value_of(form, field, bucket) == value.as_str(), format!("[\"eq\", \"${field}\", \"{value}\"]"))
            }
            PostPolicyCondition::StartsWith { field, prefix } => (
                value_of(form, field, bucket).starts_with(prefix.as_str()),
                format!("[\"starts-with\", \"${field}\", \"{prefix}\"]"),
            ),
            // Checked against the file once it has arrived (s3s: EntityTooSmall/-Large).
            PostPolicyCondition::ContentLengthRange { .. } => continue,
        };
        if !ok {
            return Err(refuse(S3ErrorCode::AccessDenied, format!("Invalid according to Policy: Policy Condition failed: {text}")));
        }
    }
    for (name, _) in &form.fields {
        let covered = policy.conditions.iter().any(|c| match c {
            PostPolicyCondition::Eq { field, .. } | PostPolicyCondition::StartsWith { field, .. } => field == name,
            PostPolicyCondition::ContentLengthRange { .. } => false,
        });
        if !covered && !exempt_from_policy(name) {
            return Err(refuse(S3ErrorCode::AccessDenied, format!("Invalid according to Policy: Extra input fields: {name}")));
        }
    }
    Ok(())
}

/// A condition's field as the form gives it; the bucket is the one addressed. A field the
/// form lacks is empty (as s3s, which checks the conditions again).
fn value_of<'a>(form: &'a PostForm, field: &str, bucket: &'a str) -> &'a str {
    if field == "bucket" {
        return bucket;
    }
    form.get(field).unwrap_or("")
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

    /// However finely the form arrives, the looks at it read a linear number of bytes in
    /// all, the last look sees every byte, and the end of the body is always looked at.
    #[test]
    fn the_form_is_looked_at_a_logarithmic_number_of_times() {
        let mut looks = Looks::default();
        let (mut count, mut scanned, mut last) = (0usize, 0usize, 0usize);
        for read in 0..=FORM_FIELDS_BYTES_MAX + 1 {
            if looks.due(read, false) {
                count += 1;
                scanned += read;
                last = read;
            }
        }
        assert_eq!(last, FORM_FIELDS_BYTES_MAX + 1, "a form past the limit is looked at, so it is refused");
        assert!(count <= 22, "{count} looks for 1 MiB read a byte at a time");
        assert!(scanned <= 2 * (FORM_FIELDS_BYTES_MAX + 1) + FORM_FIELDS_BYTES_MAX, "{scanned} bytes scanned");
        let mut looks = Looks::default();
        assert!(looks.due(1000, false));
        assert!(!looks.due(1500, false));
        assert!(looks.due(1500, true), "the end of the body is looked at");
        assert!(!Looks::default().due(0, false), "nothing read: nothing to look at");
    }

    #[test]
    fn form_is_read_up_to_the_file() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\na/${filename}\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f; x.txt\"\r\nContent-Type: text/plain\r\n\r\nhello";
        for cut in 0..body.len() - 5 {
            assert!(parse_form(&body[..cut], "XyZ").unwrap().is_none(), "cut at {cut}");
        }
        let f = parse_form(body, "XyZ").unwrap().unwrap();
        assert_eq!(f.fields, vec![("key".to_string(), "a/${filename}".to_string())]);
        assert_eq!(f.file_name.as_deref(), Some("f; x.txt"));
        assert_eq!(&body[f.data_start..], b"hello");
        let checked = check_form(&f, "b", time::OffsetDateTime::now_utc()).map_err(|(_, e)| e).unwrap();
        assert_eq!(checked.get("key"), Some("a/f; x.txt"));
    }
}
