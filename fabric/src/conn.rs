//! One multiplexed connection: frames in both directions, requests answered out of order.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use crate::proto::*;

/// Frames queued for sending on one connection before senders wait.
pub const SEND_QUEUE_FRAMES: usize = 256;
/// Requests a peer may have in flight on one connection; more are answered with an error.
pub const REQUESTS_IN_FLIGHT_MAX: usize = 64;

/// A frame's body is read into memory that grows with the bytes that arrived, from this much
/// on: a peer that announces a 64 MiB frame and sends a few bytes holds a few bytes.
const BODY_PIECE_BYTES: usize = 1 << 20;

/// Waits for `io`, at most `idle` when given: a peer that sends nothing for that long is an
/// error of kind `TimedOut`.
async fn within<T>(idle: Option<Duration>, io: impl Future<Output = std::io::Result<T>>) -> std::io::Result<T> {
    match idle {
        Some(d) => tokio::time::timeout(d, io)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("nothing from the peer for {} ms", d.as_millis())))),
        None => io.await,
    }
}

/// Reads a frame body of `len` bytes. The buffer grows as the bytes arrive, doubling (so each
/// byte is copied about once), to at most twice what was received and never past `len`; a
/// connection that ends first is an error, and so is one that sends nothing for `idle`
/// (a slow body is fine as long as bytes keep coming).
pub(crate) async fn read_body<R: AsyncRead + Unpin>(rd: &mut R, len: usize, idle: Option<Duration>) -> std::io::Result<Vec<u8>> {
    let mut body: Vec<u8> = Vec::with_capacity(len.min(BODY_PIECE_BYTES));
    while body.len() < len {
        if body.len() == body.capacity() {
            let grown = (body.capacity() * 2).max(BODY_PIECE_BYTES).min(len);
            body.reserve_exact(grown - body.len());
        }
        let room = (body.capacity() - body.len()).min(len - body.len());
        if within(idle, (&mut *rd).take(room as u64).read_buf(&mut body)).await? == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("{} of {len} bytes", body.len())));
        }
    }
    Ok(body)
}

pub type Handler = Arc<dyn Fn(Request) -> futures_like::BoxFuture<Response> + Send + Sync>;
pub type PushHandler = Arc<dyn Fn(Vec<(u64, u64)>) + Send + Sync>;

pub mod futures_like {
    pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
}

/// What bounds a connection besides its peer.
#[derive(Default)]
pub struct Limits {
    /// Close the connection once the peer has sent nothing for this long (counted from each
    /// wait for the next frame, and within a frame from the last bytes that arrived).
    pub idle: Option<Duration>,
    /// Kept until the connection stops reading (a hub counts its connections with these).
    pub hold: Vec<OwnedSemaphorePermit>,
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
    /// invalidations to `on_push`, within `limits`. Returns once the reader and writer tasks
    /// are started.
    pub fn spawn<S>(stream: S, handler: Option<Handler>, on_push: Option<PushHandler>, peer_fingerprint: Option<String>, limits: Limits) -> Conn
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
        // Dropped when the reader stops: the writer then stops too, and the socket closes
        // (the peer went away, broke the protocol or fell idle).
        let (reading, mut reader_gone) = oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                let buf = tokio::select! {
                    b = rx.recv() => match b { Some(b) => b, None => break },
                    _ = stop_w.changed() => break,
                    _ = &mut reader_gone => break,
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
        let Limits { idle, hold } = limits;
        let mut stop_r = stop_rx;
        tokio::spawn(async move {
            let _hold = (hold, reading);
            let reader = async {
                loop {
                    let mut len = [0u8; 4];
                    match within(idle, rd.read_exact(&mut len)).await {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                            tracing::info!("fabric connection closed: {e}");
                            return Ok(());
                        }
                        Err(_) => return Ok(()),
                    }
                    let len = u32::from_be_bytes(len);
                    if len > FRAME_BYTES_MAX {
                        return Err(format!("frame length {len} over the {FRAME_BYTES_MAX}-byte maximum"));
                    }
                    let body = read_body(&mut rd, len as usize, idle).await.map_err(|e| format!("connection lost mid-frame: {e}"))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out what it holds a few bytes at a time, then ends.
    struct Trickle(Vec<u8>, usize);

    impl AsyncRead for Trickle {
        fn poll_read(mut self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> std::task::Poll<std::io::Result<()>> {
            let n = self.0.len().min(self.1).min(buf.remaining());
            let rest = self.0.split_off(n);
            buf.put_slice(&std::mem::replace(&mut self.0, rest));
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn bodies_are_read_whole_and_never_held_past_their_length() {
        for (len, piece) in [(0usize, 7usize), (1, 1), (1000, 7), (BODY_PIECE_BYTES + 1, 65_536), (3 * BODY_PIECE_BYTES + 5, 100_000)] {
            let data: Vec<u8> = (0..len + 10).map(|i| (i % 251) as u8).collect();
            let mut r = Trickle(data.clone(), piece);
            let body = read_body(&mut r, len, None).await.unwrap();
            assert_eq!(body, data[..len], "len {len}");
            assert!(body.capacity() <= len.max(1), "len {len}: capacity {}", body.capacity());
            assert_eq!(r.0, data[len..], "len {len}: read past the body");
        }
        // A frame announced at the largest size whose peer sends little and goes away.
        let mut r = Trickle(vec![1; 3000], 512);
        let e = read_body(&mut r, FRAME_BYTES_MAX as usize, None).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("3000 of"), "{e}");
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_is_an_error_after_the_idle_limit() {
        let (mut near, mut far) = tokio::io::duplex(1 << 16);
        far.write_all(&[7; 1000]).await.unwrap();
        // `far` stays open and sends nothing more.
        let t = std::time::Instant::now();
        let e = read_body(&mut near, 5000, Some(Duration::from_millis(200))).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(t.elapsed() >= Duration::from_millis(200));
        // Without a limit it waits on; bytes that arrive finish it.
        let more = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            far.write_all(&[8; 100]).await.unwrap();
            far
        });
        let body = read_body(&mut near, 100, None).await.unwrap();
        assert_eq!(body, [8; 100]);
        drop(more.await.unwrap());
    }
}
