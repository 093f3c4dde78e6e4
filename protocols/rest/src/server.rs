//! The HTTP server loop: hyper HTTP/1.1 with a header-read timeout, a limit on how long a
//! request body may stall ([`IdleLimited`]), a bound on open connections, panic containment
//! and graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use storage_engine::Engine;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::error::ApiError;

/// A client must send a request's complete headers within this time.
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Open connections at most; further ones wait in the listen backlog.
pub const CONNECTIONS_MAX: usize = 1024;
/// How long shutdown waits for requests in flight before closing their connections.
pub const SHUTDOWN_GRACE_MS: u64 = 30_000;
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY_MS: u64 = 100;
/// How long a request body may go without a byte by default.
pub const BODY_IDLE_TIMEOUT_MS: u64 = 30_000;
/// How late past its deadline a body's idle timer may be polled and still count as a stall.
const BODY_IDLE_LATE_MS: u64 = 1_000;

/// Limits of the server loop beyond the constants above.
#[derive(Clone, Debug, Default)]
pub struct ServeOptions {
    /// How long a request body may go without a byte arriving while the request waits for
    /// one before the request is answered `408` and its connection closed; `None` is
    /// [`BODY_IDLE_TIMEOUT_MS`].
    pub body_idle_timeout_ms: Option<u64>,
}

/// Serves the REST API on `listener` until `shutdown` completes, then stops accepting,
/// lets requests in flight finish (up to [`SHUTDOWN_GRACE_MS`]) and returns.
pub async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with(engine, None, listener, shutdown).await
}

/// [`serve`] with the fabric's portal administration.
pub async fn serve_with(
    engine: Arc<Engine>,
    portals: Option<Arc<dyn crate::portals::PortalAdmin>>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_hooks(engine, crate::Hooks { portals, ..crate::Hooks::default() }, listener, shutdown).await
}

/// [`serve`] with every administered service the daemon runs (portals, NFS exports).
pub async fn serve_hooks(
    engine: Arc<Engine>,
    hooks: crate::Hooks,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_opts(engine, hooks, ServeOptions::default(), listener, shutdown).await
}

/// [`serve_hooks`] with limits other than the defaults.
pub async fn serve_opts(
    engine: Arc<Engine>,
    hooks: crate::Hooks,
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let idle = Duration::from_millis(opts.body_idle_timeout_ms.unwrap_or(BODY_IDLE_TIMEOUT_MS));
    let app = crate::router_hooks(engine, hooks);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS));
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
                    tracing::warn!(error = %e, "accept connection");
                    tokio::time::sleep(Duration::from_millis(ACCEPT_RETRY_MS)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let svc = hyper::service::service_fn(move |req| handle(app.clone(), idle, req));
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_millis(SHUTDOWN_GRACE_MS), graceful.shutdown()).await.is_err() {
        tracing::warn!("requests still in flight after the shutdown grace period; closing them");
    }
    Ok(())
}

/// One request through the router; a panic in a handler becomes a 500 JSON answer, a body
/// that stalled a `408` whatever the handler made of the failed read.
async fn handle(app: Router, idle: Duration, req: hyper::Request<Incoming>) -> Result<Response, Infallible> {
    let stalled = Arc::new(AtomicBool::new(false));
    let fut = app.oneshot(req.map(|b| Body::new(IdleLimited { inner: b, idle, stalled: stalled.clone(), timer: None, armed: false })));
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(res)) if stalled.load(Ordering::Relaxed) && (res.status().is_client_error() || res.status().is_server_error()) => {
            let msg = format!("no byte of the request body arrived for {} s", idle.as_secs_f64());
            let mut res = ApiError::new(axum::http::StatusCode::REQUEST_TIMEOUT, "request_timeout", msg).into_response();
            res.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
            Ok(res)
        }
        Ok(Ok(res)) => Ok(res),
        Ok(Err(never)) => match never {},
        Err(_) => {
            tracing::error!("request handler panicked");
            Ok(ApiError::internal("internal error").into_response())
        }
    }
}

/// A request body that fails once no byte of it has arrived for `idle` while the request
/// waits for one (noting that in `stalled`), so that a client cannot hold a connection and
/// what its request holds (a staged upload) for ever by starting a body and stopping. A wait
/// found to end more than [`BODY_IDLE_LATE_MS`] after its deadline was not being watched
/// (the handler was busy elsewhere, so the client may have been held back) and starts again.
/// The S3 listener's `IdleLimited` (protocols/s3/src/server.rs) is the same timer: no
/// protocol crate may depend on another (DESIGN.md §2), so a change to one belongs in both.
struct IdleLimited {
    inner: Incoming,
    idle: Duration,
    stalled: Arc<AtomicBool>,
    /// Armed at the first wait after a frame; `None` until a wait needs it.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    armed: bool,
}

impl hyper::body::Body for IdleLimited {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
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
                this.stalled.store(true, Ordering::Relaxed);
                return Poll::Ready(Some(Err(format!("no byte of the request body arrived for {} s", idle.as_secs_f64()).into())));
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
