//! The listener loop: HTTP/1.1 and HTTP/2 through hyper-util, a bound on open connections,
//! a header-read timeout, a limit on how long a request body may stall ([`IdleLimited`]) and
//! graceful shutdown. s3s's error type is not `Infallible`, so S3 gets its own listener
//! rather than a route in another server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use hyper_util::server::graceful::GracefulShutdown;
use s3s::service::S3ServiceBuilder;
use storage_engine::Engine;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::S3Options;
use crate::auth::{EngineAuth, PeerAddr, PolicyAccess};
use crate::service::AquiferS3;

/// Gives every response an `x-amz-request-id` header and every error body the same id as
/// `<RequestId>`, so that a client's report of a failure can be found in the daemon's log
/// (s3s sets neither). Also gives every request its connection's peer address (bucket
/// policies' `aws:SourceIp`).
#[derive(Clone)]
struct RequestIds {
    inner: s3s::service::S3Service,
    peer: Option<std::net::IpAddr>,
    /// The virtual-host domain, to tell which POSTs address a bucket (browser uploads).
    domain: Option<Arc<crate::vhost::Domain>>,
    /// How long a request body may go without a byte ([`IdleLimited`]).
    body_idle: Duration,
    /// For buckets' CORS configurations ([`crate::cors`]).
    engine: Arc<Engine>,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for RequestIds {
    type Response = s3s::HttpResponse;
    type Error = s3s::HttpError;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<s3s::HttpResponse, s3s::HttpError>> + Send>>;

    fn call(&self, mut req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let (method, path) = (req.method().clone(), req.uri().path().to_string());
        if let Some(ip) = self.peer {
            req.extensions_mut().insert(PeerAddr(ip));
        }
        // Browsers' cross-origin requests: a preflight is answered here, others get the
        // bucket's CORS headers added to their answer.
        let origin = req.headers().get(http::header::ORIGIN).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let cors_bucket = if origin.is_some() || method == http::Method::OPTIONS { request_bucket(&req, self.domain.as_deref()) } else { None };
        if method == http::Method::OPTIONS
            && let Some(bucket) = cors_bucket.clone()
        {
            let h = req.headers();
            let asked_method = h.get(http::header::ACCESS_CONTROL_REQUEST_METHOD).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let asked_headers = crate::cors::requested_headers(h.get(http::header::ACCESS_CONTROL_REQUEST_HEADERS).and_then(|v| v.to_str().ok()));
            let engine = self.engine.clone();
            return Box::pin(async move {
                let mut resp = preflight(engine, bucket, origin, asked_method, asked_headers).await;
                tag_response(&mut resp, &new_request_id());
                Ok(resp)
            });
        }
        let engine = self.engine.clone();
        let body_may_be_unread = http1_with_body(&req);
        let form_bucket = crate::post::form_upload_bucket(&req, self.domain.as_deref());
        let idle = self.body_idle;
        let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let req = req.map(|body| IdleLimited::new(body, idle, stalled.clone()));
        let s3 = self.inner.clone();
        let inner: Self::Future = match form_bucket {
            // A browser upload: its form is checked as S3 does before s3s takes it.
            Some(bucket) => Box::pin(async move {
                match crate::post::prepare(req, &bucket).await {
                    Ok(req) => s3.call(req).await,
                    Err(e) => Ok(error_response(&e)),
                }
            }),
            None => Box::pin(async move { s3.call(req.map(s3s::Body::http_body)).await }),
        };
        Box::pin(async move {
            let mut resp = inner.await?;
            if stalled.load(std::sync::atomic::Ordering::Relaxed) && (resp.status().is_client_error() || resp.status().is_server_error()) {
                resp = stalled_response();
            }
            let id = new_request_id();
            if resp.status().is_client_error() || resp.status().is_server_error() {
                tracing::debug!(request_id = %id, %method, %path, status = resp.status().as_u16(), "S3 request failed");
                if body_may_be_unread {
                    // Refused before its body was read: after `Expect: 100-continue` the client
                    // does not send it, so the connection cannot tell where the next request
                    // starts (hyper would take that request's first bytes for this body).
                    // Closing it is what S3 does; the client reconnects.
                    resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
                }
            }
            if let (Some(origin), Some(bucket)) = (origin, cors_bucket)
                && let Some(cfg) = bucket_cors(engine, bucket).await.ok().flatten()
                && let Some(rule) = crate::cors::find(&cfg, &origin, method.as_str(), &[])
            {
                add_headers(&mut resp, crate::cors::response_headers(rule, &origin, None));
            }
            unquote_etag(&mut resp);
            tag_response(&mut resp, &id);
            Ok(resp)
        })
    }
}

/// The bucket a request addresses: by its Host under the virtual-host domain, else the first
/// component of its path.
fn request_bucket<B>(req: &http::Request<B>, domain: Option<&crate::vhost::Domain>) -> Option<String> {
    if let Some(domain) = domain {
        let host = req.headers().get(http::header::HOST).and_then(|h| h.to_str().ok()).or(req.uri().host());
        if let Some(bucket) = host.and_then(|h| domain.bucket_of(h)) {
            return Some(bucket);
        }
    }
    let first = req.uri().path().strip_prefix('/')?.split('/').next()?;
    let bucket = urlencoding::decode(first).ok()?;
    (!bucket.is_empty()).then(|| bucket.into_owned())
}

/// A bucket's CORS configuration: `Ok(None)` when it has none, `Err` when there is no such
/// bucket.
async fn bucket_cors(engine: Arc<Engine>, bucket: String) -> Result<Option<s3s::dto::CORSConfiguration>, ()> {
    tokio::task::spawn_blocking(move || {
        let sys = storage_engine::Caller::system();
        let b = engine.lookup(&sys, storage_engine::ROOT_INO, bucket.as_bytes()).map_err(|_| ())?;
        if b.kind != storage_engine::FileKind::Dir {
            return Err(());
        }
        match engine.getxattr(&sys, b.ino, crate::meta::XATTR_CORS) {
            Ok(v) => Ok(crate::cors::decode(&v)),
            Err(_) => Ok(None),
        }
    })
    .await
    .map_err(|_| ())?
}

fn add_headers(resp: &mut s3s::HttpResponse, headers: Vec<(http::HeaderName, String)>) {
    for (name, value) in headers {
        if let Ok(v) = http::HeaderValue::from_str(&value) {
            resp.headers_mut().insert(name, v);
        }
    }
}

/// The answer to a CORS preflight (`OPTIONS`) for `bucket`, as S3 gives it (module
/// [`crate::cors`]).
async fn preflight(engine: Arc<Engine>, bucket: String, origin: Option<String>, method: Option<String>, headers: Vec<String>) -> s3s::HttpResponse {
    let refuse = |status: u16, code: &str, msg: &str| {
        let mut resp = error_response(&s3s::S3Error::with_message(s3s::S3ErrorCode::Custom(code.to_string().into()), msg.to_string()));
        *resp.status_mut() = http::StatusCode::from_u16(status).expect("a status");
        resp
    };
    let Some(origin) = origin else {
        return refuse(400, "BadRequest", "Insufficient information. Origin request header needed.");
    };
    let Some(method) = method else {
        return refuse(400, "BadRequest", "Invalid Access-Control-Request-Method: null");
    };
    let cfg = match bucket_cors(engine, bucket).await {
        Err(()) => return error_response(&s3s::S3Error::with_message(s3s::S3ErrorCode::NoSuchBucket, "The specified bucket does not exist")),
        Ok(None) => return refuse(403, "AccessForbidden", "CORSResponse: CORS is not enabled for this bucket."),
        Ok(Some(cfg)) => cfg,
    };
    let asked: Vec<&str> = headers.iter().map(String::as_str).collect();
    match crate::cors::find(&cfg, &origin, &method, &asked) {
        Some(rule) => {
            let mut resp = http::Response::new(s3s::Body::empty());
            resp.headers_mut().insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(0));
            add_headers(&mut resp, crate::cors::response_headers(rule, &origin, Some(&asked)));
            resp
        }
        None => refuse(
            403,
            "AccessForbidden",
            "CORSResponse: This CORS request is not allowed. This is usually because the evaluation of Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers are not allowed by the resource's CORS spec.",
        ),
    }
}

/// An S3 error answer for a request refused before s3s saw it.
fn error_response(e: &s3s::S3Error) -> s3s::HttpResponse {
    let (status, headers, body) = crate::post::error_parts(e.code(), e.message().unwrap_or_default());
    let mut resp = http::Response::new(body);
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// An HTTP/1 request that announces a body (HTTP/2 frames its bodies, so a refused body
/// cannot be confused with the next request there).
fn http1_with_body<B>(req: &http::Request<B>) -> bool {
    if req.version() >= http::Version::HTTP_2 {
        return false;
    }
    let h = req.headers();
    h.contains_key(http::header::TRANSFER_ENCODING)
        || h.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok()).is_some_and(|n| n > 0)
}

impl s3s::host::S3Host for crate::vhost::Domain {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> s3s::S3Result<s3s::host::VirtualHost<'a>> {
        Ok(match self.bucket_of(host) {
            Some(bucket) => s3s::host::VirtualHost::new(self.name()).with_bucket(bucket),
            None => s3s::host::VirtualHost::new(host),
        })
    }
}

/// Set by GetObjectAttributes, whose answer carries the ETag unquoted, as S3's does, where s3s
/// writes every ETag quoted; [`unquote_etag`] takes the quotes off and the header away.
pub(crate) const UNQUOTED_ETAG_HEADER: &str = "x-aquifer-unquoted-etag";

fn unquote_etag(resp: &mut s3s::HttpResponse) {
    if resp.headers_mut().remove(UNQUOTED_ETAG_HEADER).is_none() {
        return;
    }
    let Some(body) = resp.body().bytes() else { return };
    let Some(out) = unquoted_etag_body(&body) else { return };
    resp.headers_mut().insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(out.len()));
    *resp.body_mut() = s3s::Body::from(bytes::Bytes::from(out));
}

/// `body` with the quotes of its first `<ETag>"…"</ETag>` taken off; `None` without one.
fn unquoted_etag_body(body: &[u8]) -> Option<Vec<u8>> {
    const OPEN: &[u8] = b"<ETag>\"";
    const CLOSE: &[u8] = b"\"</ETag>";
    let at = body.windows(OPEN.len()).position(|w| w == OPEN)?;
    let start = at + OPEN.len();
    let len = body[start..].windows(CLOSE.len()).position(|w| w == CLOSE)?;
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&body[..start - 1]);
    out.extend_from_slice(&body[start..start + len]);
    out.extend_from_slice(&body[start + len + 1..]);
    Some(out)
}

/// Sixteen upper-case hex digits, as S3's own request ids.
fn new_request_id() -> String {
    format!("{:016X}", rand::random::<u64>())
}

/// Carries elements an S3 error body has beyond Code, Message and RequestId (which are all
/// s3s writes) from a handler to [`tag_response`], which moves them into the body.
const ERROR_DETAIL_HEADER: &str = "x-aquifer-error-detail";

/// Adds `detail` (XML elements, already escaped) to the body of the error `e` answers with.
pub(crate) fn with_error_detail(mut e: s3s::S3Error, detail: &str) -> s3s::S3Error {
    if let Ok(v) = http::HeaderValue::from_str(detail) {
        let mut headers = e.headers().cloned().unwrap_or_default();
        headers.insert(ERROR_DETAIL_HEADER, v);
        e.set_headers(headers);
    }
    e
}

/// Escapes text for an XML element's content.
pub(crate) fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

fn tag_response(resp: &mut s3s::HttpResponse, id: &str) {
    let Ok(value) = http::HeaderValue::from_str(id) else { return };
    resp.headers_mut().insert("x-amz-request-id", value);
    let detail = resp.headers_mut().remove(ERROR_DETAIL_HEADER);
    if !(resp.status().is_client_error() || resp.status().is_server_error()) {
        return;
    }
    let Some(body) = resp.body().bytes() else { return };
    const END: &[u8] = b"</Error>";
    let Some(at) = body.windows(END.len()).rposition(|w| w == END) else { return };
    let mut out = Vec::with_capacity(body.len() + 2 * id.len() + 24);
    out.extend_from_slice(&body[..at]);
    if let Some(d) = &detail {
        out.extend_from_slice(d.as_bytes());
        // s3s replaces an error's headers with the ones set on it, its content type too.
        resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/xml"));
    }
    if !body.windows(11).any(|w| w == b"<RequestId>") {
        out.extend_from_slice(format!("<RequestId>{id}</RequestId>").as_bytes());
    }
    out.extend_from_slice(&body[at..]);
    resp.headers_mut().insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(out.len()));
    *resp.body_mut() = s3s::Body::from(bytes::Bytes::from(out));
}

/// A request body that fails with [`BodyStalled`] once no byte of it has arrived for its
/// idle limit while the request waits for one. Without it a client could start a body and
/// stop sending, holding its connection (one of [`CONNECTIONS_MAX`]) and what the request
/// holds for ever; a browser upload's form is read before anyone is authenticated, so that
/// needed no key. The limit counts only while the request waits for the body: a wait that
/// is found to have ended well after its deadline was not being watched (the request was
/// busy elsewhere, so the client may have been held back) and starts again. The REST API's
/// `IdleLimited` (protocols/rest/src/server.rs) is the same timer: no protocol crate may
/// depend on another (DESIGN.md §2), so a change to one belongs in both.
pub(crate) struct IdleLimited<B> {
    inner: B,
    idle: Duration,
    /// Set when the body stalled, for the request's answer ([`stalled_response`]).
    stalled: Arc<std::sync::atomic::AtomicBool>,
    /// Armed at the first wait after a frame; `None` until a wait needs it.
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

/// How late past its deadline a body's idle timer may be polled and still count as a stall.
const BODY_IDLE_LATE_MS: u64 = 1_000;

impl<B> IdleLimited<B> {
    pub(crate) fn new(inner: B, idle: Duration, stalled: Arc<std::sync::atomic::AtomicBool>) -> IdleLimited<B> {
        IdleLimited { inner, idle, stalled, timer: None, armed: false }
    }
}

impl<B> hyper::body::Body for IdleLimited<B>
where
    B: hyper::body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<s3s::StdError>,
{
    type Data = bytes::Bytes;
    type Error = s3s::StdError;

    fn poll_frame(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, s3s::StdError>>> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            this.armed = false;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let idle = this.idle;
        let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        let now = tokio::time::Instant::now();
        if !this.armed {
            timer.as_mut().reset(now + idle);
            this.armed = true;
        }
        if timer.as_mut().poll(cx).is_ready() {
            if now <= timer.deadline() + Duration::from_millis(BODY_IDLE_LATE_MS) {
                this.stalled.store(true, std::sync::atomic::Ordering::Relaxed);
                return Poll::Ready(Some(Err(Box::new(BodyStalled(idle)))));
            }
            timer.as_mut().reset(now + idle);
            let _ = timer.as_mut().poll(cx);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request body's error: no byte arrived for this long.
#[derive(Debug)]
pub(crate) struct BodyStalled(pub Duration);

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no byte of the request body arrived for {} s", self.0.as_secs_f64())
    }
}

impl std::error::Error for BodyStalled {}

/// The answer to a request whose body stalled, whatever the handler made of the failed read:
/// `400 RequestTimeout`, in S3's words.
fn stalled_response() -> s3s::HttpResponse {
    error_response(&s3s::S3Error::with_message(
        s3s::S3ErrorCode::RequestTimeout,
        "Your socket connection to the server was not read from or written to within the timeout period.",
    ))
}

/// How long a request body may go without a byte by default (S3 allows about 20 s).
pub const BODY_IDLE_TIMEOUT_MS: u64 = 30_000;

/// Open connections at most; further ones wait in the listen backlog.
pub const CONNECTIONS_MAX: usize = 1024;
/// How long shutdown waits for requests in flight before closing their connections.
pub const SHUTDOWN_GRACE_MS: u64 = 30_000;
/// A client must send a request's complete headers within this time.
const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY_MS: u64 = 100;

/// Serves S3 on `listener` until `shutdown` completes, then stops accepting, lets requests
/// in flight finish (up to [`SHUTDOWN_GRACE_MS`]) and returns.
pub async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    opts: S3Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let lifecycle_changed = Arc::new(tokio::sync::Notify::new());
    let service = {
        let mut b = S3ServiceBuilder::new(AquiferS3::new(engine.clone()).with_lifecycle_notify(lifecycle_changed.clone()));
        b.set_auth(EngineAuth { engine: engine.clone() });
        b.set_access(PolicyAccess { engine: engine.clone() });
        b.set_route(crate::post::RefusedForm);
        // s3s holds a POST upload's file in memory before the upload is stored.
        let mut config = s3s::config::S3Config::default();
        config.post_object_max_file_size = crate::post::POST_OBJECT_BYTES_MAX;
        config.form_max_parts = crate::form::FORM_PARTS_MAX;
        b.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(config))));
        let domain = opts.domain.as_deref().map(crate::vhost::Domain::new).transpose()?;
        if let Some(d) = &domain {
            b.set_host(d.clone());
        }
        RequestIds {
            inner: b.build(),
            peer: None,
            domain: domain.map(Arc::new),
            body_idle: Duration::from_millis(opts.body_idle_timeout_ms.unwrap_or(BODY_IDLE_TIMEOUT_MS)),
            engine: engine.clone(),
        }
    };
    // Lifecycle rules are carried out by the S3 listener's own task, which ends with it.
    let (lifecycle_stop, stopped) = tokio::sync::watch::channel(false);
    let day_secs = opts.lifecycle_day_secs.unwrap_or(86_400);
    let lifecycle = tokio::spawn(crate::lifecycle::run(engine.clone(), day_secs, lifecycle_changed, stopped));
    let mut conn = ConnBuilder::new(TokioExecutor::new());
    conn.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS));
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            p = slots.clone().acquire_owned() => p.expect("the connection semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept S3 connection");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let svc = RequestIds { peer: Some(peer.ip()), ..service.clone() };
        let c = conn.serve_connection(TokioIo::new(stream), svc).into_owned();
        let c = graceful.watch(c);
        tokio::spawn(async move {
            if let Err(e) = c.await {
                tracing::debug!(%peer, error = %e, "S3 connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    // Wait for the task (and a pass in progress) to end, so that no reference to the engine
    // outlives this function.
    let _ = lifecycle_stop.send(true);
    if let Err(e) = lifecycle.await {
        tracing::error!(error = %e, "lifecycle task failed");
    }
    if tokio::time::timeout(Duration::from_millis(SHUTDOWN_GRACE_MS), graceful.shutdown()).await.is_err() {
        tracing::warn!("S3 requests still in flight after the shutdown grace period; closing them");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Poll;

    use bytes::Bytes;
    use hyper::body::{Body, Frame};

    use super::*;

    #[test]
    fn the_first_etag_loses_its_quotes_and_nothing_else_changes() {
        let body = b"<GetObjectAttributesResponse><ETag>\"0123abcd-4\"</ETag><ObjectSize>4</ObjectSize></GetObjectAttributesResponse>";
        let out = unquoted_etag_body(body).unwrap();
        assert_eq!(out, b"<GetObjectAttributesResponse><ETag>0123abcd-4</ETag><ObjectSize>4</ObjectSize></GetObjectAttributesResponse>");
        assert_eq!(unquoted_etag_body(b"<X><ObjectSize>4</ObjectSize></X>"), None);
        assert_eq!(unquoted_etag_body(b"<ETag>\"cut short"), None);
    }

    /// A body whose frames the test hands in.
    struct Chan(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Chan {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    /// What one poll of the body gives: `None` while it waits, else whether a frame came.
    async fn poll_once(body: &mut IdleLimited<Chan>) -> Option<Result<Bytes, String>> {
        poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => None,
                Poll::Ready(Some(Ok(f))) => Some(Ok(f.into_data().expect("data"))),
                Poll::Ready(Some(Err(e))) => Some(Err(e.to_string())),
                Poll::Ready(None) => Some(Err("ended".into())),
            })
        })
        .await
    }

    /// The limit counts from the last frame while the request waits; a wait the request left
    /// (it was busy elsewhere) starts again when it comes back; a full idle wait fails the body
    /// and marks the request.
    #[tokio::test(start_paused = true)]
    async fn the_idle_limit_counts_only_while_the_request_waits() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let stalled = Arc::new(AtomicBool::new(false));
        let mut body = IdleLimited::new(Chan(rx), Duration::from_secs(10), stalled.clone());
        assert_eq!(poll_once(&mut body).await, None);
        tokio::time::advance(Duration::from_secs(9)).await;
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert_eq!(poll_once(&mut body).await, Some(Ok(Bytes::from_static(b"a"))));
        // Waits again from here; 9 s more is still within the limit.
        assert_eq!(poll_once(&mut body).await, None);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(poll_once(&mut body).await, None);
        // The request goes elsewhere for 30 s, then comes back: a new wait, no failure.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(poll_once(&mut body).await, None);
        assert!(!stalled.load(Ordering::Relaxed));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(poll_once(&mut body).await, None);
        tokio::time::advance(Duration::from_secs(1)).await;
        let failed = poll_once(&mut body).await;
        assert!(matches!(&failed, Some(Err(e)) if e.contains("no byte of the request body arrived for 10 s")), "{failed:?}");
        assert!(stalled.load(Ordering::Relaxed));
    }
}
