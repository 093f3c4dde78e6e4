//! Per-connection writer task: signs and encrypts responses, adds the
//! transport length prefix and writes them to the socket.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::proto::crypto::{SessionCipher, SigningAlgo, TRANSFORM_HEADER_LEN, sign};
use crate::proto::error::{ProtoError, ProtoResult};
use crate::proto::framing::{MAX_FRAME_PAYLOAD, encode_frame};
use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tracing::{debug, error, warn};

/// Responses one connection may have waiting for the writer.
pub const WRITER_CHANNEL: usize = 64;

/// Bytes of responses one connection may have waiting for the writer. A
/// larger response waits until the queue is empty.
pub const QUEUED_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Bytes of unsolicited messages, such as lease breaks, one connection may
/// have waiting for the writer. They never wait for room, so this bound is
/// separate from the response limits.
pub const QUEUED_NOTICE_BYTES: usize = 1024 * 1024;

/// A frame of responses as the dispatcher leaves it: joined, its
/// signatures not yet computed and the frame not yet encrypted. Aquifer
/// patch: the writer seals it, so a connection's reader goes on with the
/// next request while a MiB-sized READ response is signed and sent.
pub struct Unsealed {
    pub(crate) bytes: Vec<u8>,
    /// Start, length, signing key and algorithm of each response in
    /// `bytes` to sign (Aquifer patch: a session bound to several
    /// connections signs with each channel's key and algorithm).
    pub(crate) signatures: Vec<(usize, usize, [u8; 16], SigningAlgo)>,
    /// The session the frame is encrypted for and its keys.
    pub(crate) cipher: Option<(u64, Arc<SessionCipher>)>,
}

impl Unsealed {
    /// A frame sent as it is.
    pub(crate) fn plain(bytes: Vec<u8>) -> Self {
        Self {
            bytes,
            signatures: Vec::new(),
            cipher: None,
        }
    }

    /// Bytes of the sealed frame.
    fn len(&self) -> usize {
        self.bytes.len() + if self.cipher.is_some() { TRANSFORM_HEADER_LEN } else { 0 }
    }

    /// Signs each response, then encrypts the frame when it must be. Each
    /// encryption takes a fresh nonce from the session's counter, so frames
    /// sealed in any order never share one.
    pub(crate) fn seal(mut self) -> ProtoResult<Vec<u8>> {
        for &(start, len, key, algo) in &self.signatures {
            let response = self
                .bytes
                .get_mut(start..start + len)
                .ok_or(ProtoError::Malformed("signed response outside its frame"))?;
            sign(response, &key, algo)?;
        }
        match self.cipher {
            Some((session_id, cipher)) => cipher.encrypt(session_id, &self.bytes),
            None => Ok(self.bytes),
        }
    }
}

/// A message to queue: final bytes, or a frame the writer seals.
pub enum Body {
    Sealed(Vec<u8>),
    Unsealed(Unsealed),
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Sealed(bytes) => bytes.len(),
            Body::Unsealed(frame) => frame.len(),
        }
    }
}

impl From<Vec<u8>> for Body {
    fn from(bytes: Vec<u8>) -> Self {
        Body::Sealed(bytes)
    }
}

impl From<Unsealed> for Body {
    fn from(frame: Unsealed) -> Self {
        Body::Unsealed(frame)
    }
}

/// One message to send and its share of the queue limits.
pub struct FramePayload {
    body: Body,
    _budget: Option<OwnedSemaphorePermit>,
    _slot: Option<OwnedSemaphorePermit>,
    _notice: Option<NoticeBytes>,
}

/// Bytes of a queued unsolicited message, given back when it leaves the
/// queue.
struct NoticeBytes {
    queued: Arc<AtomicUsize>,
    len: usize,
}

impl Drop for NoticeBytes {
    fn drop(&mut self) {
        self.queued.fetch_sub(self.len, Ordering::AcqRel);
    }
}

/// Why an unsolicited message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeError {
    /// [`QUEUED_NOTICE_BYTES`] are already waiting: the client has not read
    /// for a long time.
    Full,
    /// The writer is gone.
    Closed,
}

/// Sending side of the response queue. Responses and unsolicited messages
/// share one queue, so they reach the socket in the order they were queued.
#[derive(Clone)]
pub struct ResponseQueue {
    tx: mpsc::UnboundedSender<FramePayload>,
    budget: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    notices: Arc<AtomicUsize>,
}

/// Receiving side of the response queue, owned by the writer. Dropping it
/// wakes a reader waiting for queue space. The writer stops once every
/// [`ResponseQueue`] is dropped.
pub struct ResponseReceiver {
    rx: mpsc::UnboundedReceiver<FramePayload>,
    budget: Arc<Semaphore>,
    slots: Arc<Semaphore>,
}

/// Response queue bounded by [`WRITER_CHANNEL`] responses and
/// [`QUEUED_RESPONSE_BYTES`] bytes, plus [`QUEUED_NOTICE_BYTES`] of
/// unsolicited messages.
pub fn response_queue() -> (ResponseQueue, ResponseReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let budget = Arc::new(Semaphore::new(QUEUED_RESPONSE_BYTES));
    let slots = Arc::new(Semaphore::new(WRITER_CHANNEL));
    (
        ResponseQueue {
            tx,
            budget: budget.clone(),
            slots: slots.clone(),
            notices: Arc::default(),
        },
        ResponseReceiver { rx, budget, slots },
    )
}

impl ResponseQueue {
    /// Queues a response, waiting while the queue is full. Fails once the
    /// writer is gone.
    pub async fn send(&self, body: impl Into<Body>) -> Result<(), ()> {
        let body = body.into();
        let slot = self.slots.clone().acquire_owned().await.map_err(|_| ())?;
        let cost = body.len().clamp(1, QUEUED_RESPONSE_BYTES) as u32;
        let budget = self
            .budget
            .clone()
            .acquire_many_owned(cost)
            .await
            .map_err(|_| ())?;
        self.tx
            .send(FramePayload {
                body,
                _budget: Some(budget),
                _slot: Some(slot),
                _notice: None,
            })
            .map_err(|_| ())
    }

    /// Queues an unsolicited message without waiting.
    pub fn try_send_notice(&self, bytes: Vec<u8>) -> Result<(), NoticeError> {
        let len = bytes.len();
        self.notices
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued + len <= QUEUED_NOTICE_BYTES).then_some(queued + len)
            })
            .map_err(|_| NoticeError::Full)?;
        let notice = NoticeBytes {
            queued: Arc::clone(&self.notices),
            len,
        };
        self.tx
            .send(FramePayload {
                body: Body::Sealed(bytes),
                _budget: None,
                _slot: None,
                _notice: Some(notice),
            })
            .map_err(|_| NoticeError::Closed)
    }

    /// Resolves once the writer is gone.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

#[cfg(test)]
impl ResponseReceiver {
    /// The next queued message, if one is waiting.
    pub(crate) fn try_recv(&mut self) -> Option<Vec<u8>> {
        self.rx.try_recv().ok().map(FramePayload::into_bytes)
    }

    /// The next queued message, waiting for one.
    pub(crate) async fn recv(&mut self) -> Option<Vec<u8>> {
        self.rx.recv().await.map(FramePayload::into_bytes)
    }
}

#[cfg(test)]
impl FramePayload {
    fn into_bytes(self) -> Vec<u8> {
        match self.body {
            Body::Sealed(bytes) => bytes,
            Body::Unsealed(frame) => frame.seal().expect("frame seals"),
        }
    }
}

impl Drop for ResponseReceiver {
    fn drop(&mut self) {
        self.budget.close();
        self.slots.close();
    }
}

/// Writes each response, giving up on the connection when one takes longer
/// than `io_timeout` to send.
/// Responses up to this size are copied behind their frame header and sent
/// with one write; larger ones are sent as header, then payload.
const INLINE_FRAME_BYTES: usize = 64 * 1024;

/// The 4-byte Direct-TCP header of a `len`-byte payload.
fn encode_frame_header(len: usize, out: &mut Vec<u8>) -> crate::proto::error::ProtoResult<()> {
    if len > MAX_FRAME_PAYLOAD as usize {
        return Err(crate::proto::error::ProtoError::Malformed("frame payload exceeds 16 MiB - 1"));
    }
    out.extend_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

pub async fn writer_task(
    mut writer: WriteHalf<TcpStream>,
    mut queue: ResponseReceiver,
    io_timeout: Duration,
) {
    while let Some(payload) = queue.rx.recv().await {
        let FramePayload {
            body,
            _budget,
            _slot,
            _notice,
        } = payload;
        let bytes = match body {
            Body::Sealed(bytes) => bytes,
            Body::Unsealed(frame) => match frame.seal() {
                Ok(bytes) => bytes,
                Err(e) => {
                    error!(error = %e, "cannot sign or encrypt response; closing connection");
                    return;
                }
            },
        };
        // Aquifer patch: a large response (a READ's MiB) goes out behind its
        // 4-byte frame header instead of being copied into a new buffer
        // with it; small ones are still joined into one write.
        let large = bytes.len() > INLINE_FRAME_BYTES;
        let mut out = Vec::with_capacity(if large { 4 } else { bytes.len() + 4 });
        let framed = if large {
            encode_frame_header(bytes.len(), &mut out)
        } else {
            encode_frame(&bytes, &mut out)
        };
        if let Err(e) = framed {
            error!(
                error = %e,
                len = bytes.len(),
                "cannot frame response; closing connection"
            );
            return;
        }
        let len = out.len() + if large { bytes.len() } else { 0 };
        let write = async {
            writer.write_all(&out).await?;
            if large {
                writer.write_all(&bytes).await?;
            }
            Ok::<(), std::io::Error>(())
        };
        match tokio::time::timeout(io_timeout, write).await {
            Ok(Ok(())) => debug!(len, "wrote frame"),
            Ok(Err(e)) => {
                error!(error = %e, "writer task: socket write failed");
                return;
            }
            Err(_) => {
                warn!(len, "response not sent in time; closing connection");
                return;
            }
        }
    }
    // Channel closed: flush and bail.
    if let Err(e) = writer.shutdown().await {
        debug!(error = %e, "writer shutdown error (best-effort)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_frame_header_matches_the_encoder() {
        let payload = vec![7u8; 300_000];
        let mut joined = Vec::new();
        encode_frame(&payload, &mut joined).unwrap();
        let mut head = Vec::new();
        encode_frame_header(payload.len(), &mut head).unwrap();
        assert_eq!(head[..], joined[..4]);
        assert!(encode_frame_header(MAX_FRAME_PAYLOAD as usize + 1, &mut head).is_err());
    }

    #[tokio::test]
    async fn notices_bypass_the_response_limits_and_keep_queue_order() {
        let (tx, mut rx) = response_queue();
        for n in 0..WRITER_CHANNEL {
            tx.send(vec![n as u8]).await.unwrap();
        }
        let blocked = tokio::time::timeout(Duration::from_millis(10), tx.send(vec![0xEE])).await;
        assert!(blocked.is_err(), "the response limit holds");
        tx.try_send_notice(vec![0xAA]).unwrap();
        for n in 0..WRITER_CHANNEL {
            assert_eq!(rx.rx.recv().await.unwrap().into_bytes(), [n as u8]);
        }
        assert_eq!(rx.rx.recv().await.unwrap().into_bytes(), [0xAA]);
    }

    #[tokio::test]
    async fn notices_stop_at_their_byte_limit() {
        let (tx, mut rx) = response_queue();
        tx.try_send_notice(vec![0; QUEUED_NOTICE_BYTES - 10])
            .unwrap();
        assert_eq!(tx.try_send_notice(vec![0; 11]), Err(NoticeError::Full));
        tx.try_send_notice(vec![0; 10]).unwrap();
        drop(rx.rx.recv().await.unwrap());
        tx.try_send_notice(vec![0; 11]).unwrap();
        drop(rx);
        assert_eq!(tx.try_send_notice(vec![0]), Err(NoticeError::Closed));
        assert!(tx.send(vec![0]).await.is_err());
    }
}
