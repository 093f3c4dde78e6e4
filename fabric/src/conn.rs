//! One multiplexed connection: frames in both directions, requests answered out of order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::proto::*;

/// Frames queued for sending on one connection before senders wait.
pub const SEND_QUEUE_FRAMES: usize = 256;
/// Requests a peer may have in flight on one connection; more are answered with an error.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

pub type Handler = Arc<dyn Fn(Request) -> futures_like::BoxFuture<Response> + Send + Sync>;
pub type PushHandler = Arc<dyn Fn(Vec<(u64, u64)>) + Send + Sync>;

pub mod futures_like {
    pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
}

/// A live connection. Dropping every clone closes it.
#[derive(Clone)]
pub struct Conn {
    tx: mpsc::Sender<Vec<u8>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>,
    next_id: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
    shutdown: tokio::sync::watch::Sender<bool>,
    pub peer_fingerprint: Option<String>,
}

impl Conn {
    /// Runs a connection over `stream`: incoming requests go to `handler` (none: refused),
    /// invalidations to `on_push`. Returns once the reader and writer tasks are started.
    pub fn spawn<S>(stream: S, handler: Option<Handler>, on_push: Option<PushHandler>, peer_fingerprint: Option<String>) -> Conn
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(SEND_QUEUE_FRAMES);
        let (shutdown, stop_rx) = tokio::sync::watch::channel(false);
        let conn = Conn {
            shutdown,
            tx: tx.clone(),
            pending: Arc::new(Mutex::new(HashMap::new())),
            next_id: Arc::new(AtomicU64::new(1)),
            closed: Arc::new(AtomicBool::new(false)),
            peer_fingerprint,
        };
        let closed = conn.closed.clone();
        let mut stop_w = stop_rx.clone();
        tokio::spawn(async move {
            loop {
                let buf = tokio::select! {
                    b = rx.recv() => match b { Some(b) => b, None => break },
                    _ = stop_w.changed() => break,
                };
                if wr.write_all(&buf).await.is_err() {
                    break;
                }
            }
            closed.store(true, Ordering::Relaxed);
            let _ = wr.shutdown().await;
        });
        let pending = conn.pending.clone();
        let closed = conn.closed.clone();
        let in_flight = Arc::new(AtomicU64::new(0));
        let mut stop_r = stop_rx;
        tokio::spawn(async move {
            let reader = async {
                loop {
                    let mut len = [0u8; 4];
                    if rd.read_exact(&mut len).await.is_err() {
                        return Ok(());
                    }
                    let len = u32::from_be_bytes(len);
                    if len > FRAME_BYTES_MAX {
                        return Err(format!("frame length {len} over the {FRAME_BYTES_MAX}-byte maximum"));
                    }
                    let mut body = vec![0u8; len as usize];
                    rd.read_exact(&mut body).await.map_err(|e| format!("connection lost mid-frame: {e}"))?;
                    match decode(&body)? {
                        Frame::Response { id, body } => {
                            if let Some(w) = pending.lock().remove(&id) {
                                let _ = w.send(body);
                            }
                        }
                        Frame::Invalidate { changes } => {
                            if let Some(p) = &on_push {
                                p(changes);
                            }
                        }
                        Frame::Request { id, body } => {
                            let tx = tx.clone();
                            let Some(h) = handler.clone() else {
                                let r = Response::Error { code: ErrorCode::BadRequest, message: "this side serves no requests".into() };
                                let _ = tx.send(encode(&Frame::Response { id, body: r })).await;
                                continue;
                            };
                            if in_flight.load(Ordering::Relaxed) as usize >= REQUESTS_IN_FLIGHT_MAX {
                                let r = Response::Error { code: ErrorCode::BadRequest, message: format!("more than {REQUESTS_IN_FLIGHT_MAX} requests in flight") };
                                let _ = tx.send(encode(&Frame::Response { id, body: r })).await;
                                continue;
                            }
                            in_flight.fetch_add(1, Ordering::Relaxed);
                            let in_flight = in_flight.clone();
                            tokio::spawn(async move {
                                let r = h(body).await;
                                in_flight.fetch_sub(1, Ordering::Relaxed);
                                let _ = tx.send(encode(&Frame::Response { id, body: r })).await;
                            });
                        }
                    }
                }
            };
            let res: Result<(), String> = tokio::select! {
                r = reader => r,
                _ = stop_r.changed() => Ok(()),
            };
            if let Err(e) = res {
                tracing::warn!(error = %e, "fabric connection closed: bad input from the peer");
            }
            closed.store(true, Ordering::Relaxed);
            pending.lock().clear(); // wakes every waiter with an error
        });
        conn
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed) || self.tx.is_closed()
    }

    /// Sends a request and waits for its answer (`Err`: the connection is gone or timed out).
    pub async fn call(&self, req: Request, timeout: Duration) -> Result<Response, String> {
        if self.is_closed() {
            return Err("connection closed".into());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (w, r) = oneshot::channel();
        self.pending.lock().insert(id, w);
        if self.tx.send(encode(&Frame::Request { id, body: req })).await.is_err() {
            self.pending.lock().remove(&id);
            return Err("connection closed".into());
        }
        match tokio::time::timeout(timeout, r).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(_)) => Err("connection closed".into()),
            Err(_) => {
                self.pending.lock().remove(&id);
                Err(format!("no answer within {} ms", timeout.as_millis()))
            }
        }
    }

    /// Sends an invalidation (hub side).
    pub async fn push(&self, changes: Vec<(u64, u64)>) -> bool {
        self.tx.send(encode(&Frame::Invalidate { changes })).await.is_ok()
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        self.pending.lock().clear();
    }
}
