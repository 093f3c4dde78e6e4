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
use crate::auth::{EngineAuth, PublicReadAccess};
use crate::service::AquiferS3;

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
    let service = {
        let mut b = S3ServiceBuilder::new(AquiferS3::new(engine.clone()));
        b.set_auth(EngineAuth { engine: engine.clone() });
        b.set_access(PublicReadAccess { engine: engine.clone() });
        if let Some(domain) = &opts.domain {
            let host = s3s::host::SingleDomain::new(domain).with_context(|| format!("use S3 domain {domain}"))?;
            b.set_host(host);
        }
        b.build()
    };
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
        let c = conn.serve_connection(TokioIo::new(stream), service.clone()).into_owned();
        let c = graceful.watch(c);
        tokio::spawn(async move {
            if let Err(e) = c.await {
                tracing::debug!(%peer, error = %e, "S3 connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_millis(SHUTDOWN_GRACE_MS), graceful.shutdown()).await.is_err() {
        tracing::warn!("S3 requests still in flight after the shutdown grace period; closing them");
    }
    Ok(())
}
