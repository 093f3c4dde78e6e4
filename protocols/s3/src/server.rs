//! The listener loop: HTTP/1.1 and HTTP/2 through hyper-util, a bound on open connections,
//! a header-read timeout and graceful shutdown. s3s's error type is not `Infallible`, so S3
//! gets its own listener rather than a route in another server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
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
    domain: Option<Arc<str>>,
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
        let body_may_be_unread = http1_with_body(&req);
        let form_bucket = crate::post::form_upload_bucket(&req, self.domain.as_deref());
        let inner: Self::Future = match form_bucket {
            // A browser upload: its form is checked as S3 does before s3s takes it.
            Some(bucket) => {
                let s3 = self.inner.clone();
                Box::pin(async move {
                    match crate::post::prepare(req, &bucket).await {
                        Ok(req) => s3.call(req).await,
                        Err(e) => Ok(error_response(&e)),
                    }
                })
            }
            None => Box::pin(hyper::service::Service::call(&self.inner, req)),
        };
        Box::pin(async move {
            let mut resp = inner.await?;
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
            tag_response(&mut resp, &id);
            Ok(resp)
        })
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
        b.set_config(Arc::new(s3s::config::StaticConfigProvider::new(Arc::new(config))));
        if let Some(domain) = &opts.domain {
            let host = s3s::host::SingleDomain::new(domain).with_context(|| format!("use S3 domain {domain}"))?;
            b.set_host(host);
        }
        RequestIds { inner: b.build(), peer: None, domain: opts.domain.as_deref().map(Arc::from) }
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
