//! The SFTP subsystem's byte stream, with the client's requests taken off the SSH channel as
//! they arrive.
//!
//! russh-sftp answers one request at a time: it reads a request, runs it, and writes the reply
//! before it reads the next. Writing a reply waits for the client's channel window. russh
//! hands a channel's incoming data to a queue of 100 messages, and its session loop waits
//! while that queue is full, so it then stops reading the connection, and with it the
//! client's WINDOW_ADJUST messages that the reply is waiting for: the session stops for good.
//! OpenSSH's sftp reached that state downloading with 255 KiB READs (64 in flight), and
//! clients that send READs without a cap (paramiko's prefetch) reach it with any size.
//!
//! Here a task drains the channel as fast as the client sends, into a queue bounded by bytes
//! ([`INBOUND_BYTES_MAX`]), which the subsystem reads from. The session loop then waits only
//! when a client has more than that in requests not yet answered.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use russh::server::Msg;
use russh::{Channel, ChannelMsg};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{Semaphore, mpsc};

/// Bytes of requests a session may have received and not yet read: twice what OpenSSH's sftp
/// keeps in flight at most (64 WRITEs of 255 KiB).
pub(crate) const INBOUND_BYTES_MAX: usize = 32 << 20;

/// A channel message's bytes and the queue permits they hold.
type Chunk = (Bytes, u32);

/// The subsystem's side of the channel: reads what the pump queued, sends replies on the
/// channel.
/// Dropping it closes the channel (as russh's own channel stream does).
pub(crate) struct SftpStream {
    rx: mpsc::UnboundedReceiver<Chunk>,
    current: Option<Chunk>,
    budget: Arc<Semaphore>,
    /// Replies go out through it; dropped (closing the channel) with the stream.
    close: Option<russh::ChannelWriteHalf<Msg>>,
}

/// Splits `channel`, starts the task that drains its incoming data, and returns the stream
/// the subsystem runs on.
pub(crate) fn stream(channel: Channel<Msg>) -> SftpStream {
    let (mut read, write) = channel.split();
    let budget = Arc::new(Semaphore::new(INBOUND_BYTES_MAX));
    let (tx, rx) = mpsc::unbounded_channel();
    let pump_budget = budget.clone();
    tokio::spawn(async move {
        while let Some(msg) = read.wait().await {
            match msg {
                ChannelMsg::Data { data } => {
                    // A message is at most the channel's packet size (32 KiB); the cap only
                    // keeps the wait satisfiable.
                    let permits = data.len().min(INBOUND_BYTES_MAX) as u32;
                    let Ok(p) = pump_budget.acquire_many(permits).await else { break };
                    p.forget();
                    if tx.send((data, permits)).is_err() {
                        break;
                    }
                }
                ChannelMsg::Eof | ChannelMsg::Close => break,
                _ => {}
            }
        }
    });
    SftpStream { rx, current: None, budget, close: Some(write) }
}

impl AsyncRead for SftpStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some((data, permits)) = &mut this.current {
                if data.has_remaining() {
                    let n = data.len().min(buf.remaining());
                    buf.put_slice(&data[..n]);
                    data.advance(n);
                    return Poll::Ready(Ok(()));
                }
                this.budget.add_permits(*permits as usize);
                this.current = None;
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(chunk)) => this.current = Some(chunk),
                // The client sent EOF or closed the channel: end of stream.
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl SftpStream {
    /// Sends a reply's parts on the channel as they are: each is cut into channel messages
    /// that share its buffer (the channel's `AsyncWrite` would copy every message).
    pub(crate) async fn send(&self, parts: Vec<Bytes>) -> io::Result<()> {
        let write = self.close.as_ref().ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "channel closed"))?;
        for p in parts {
            write.data_bytes(p).await.map_err(|e| io::Error::new(io::ErrorKind::BrokenPipe, e.to_string()))?;
        }
        Ok(())
    }
}

impl Drop for SftpStream {
    fn drop(&mut self) {
        // A pump waiting for room stops instead of waiting for a reader that is gone.
        self.budget.close();
        if let Some(write) = self.close.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let _ = write.close().await;
            });
        }
    }
}
