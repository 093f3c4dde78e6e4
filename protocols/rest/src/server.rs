//! The HTTP server loop: hyper HTTP/1.1 with a header-read timeout, a bound on open
//! connections, panic containment and graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
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
        let svc = hyper::service::service_fn(move |req| handle(app.clone(), req));
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

/// One request through the router; a panic in a handler becomes a 500 JSON answer.
async fn handle(app: Router, req: hyper::Request<Incoming>) -> Result<Response, Infallible> {
    let fut = app.oneshot(req.map(Body::new));
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(res)) => Ok(res),
        Ok(Err(never)) => match never {},
        Err(_) => {
            tracing::error!("request handler panicked");
            Ok(ApiError::internal("internal error").into_response())
        }
    }
}
