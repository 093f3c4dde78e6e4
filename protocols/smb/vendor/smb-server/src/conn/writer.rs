//! Per-connection writer task: signs and encrypts responses, adds the
//! transport length prefix and writes them to the socket.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::proto::crypto::{SessionCipher, SigningAlgo, TRANSFORM_HEADER_LEN, sign, sign_with_tail};
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
    /// Bytes of the frame after `bytes` that lie apart (a lone READ
    /// response's data): signed and sent from where they lie.
    pub(crate) tail: Option<bytes::Bytes>,
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
            tail: None,
            signatures: Vec::new(),
            cipher: None,
        }
    }

    /// Bytes of the sealed frame.
    fn len(&self) -> usize {
        self.bytes.len()
            + self.tail.as_ref().map_or(0, |t| t.len())
            + if self.cipher.is_some() { TRANSFORM_HEADER_LEN } else { 0 }
    }

    /// Signs each response, then encrypts the frame when it must be. Each
    /// encryption takes a fresh nonce from the session's counter, so frames
    /// sealed in any order never share one.
    /// The sealed frame is the bytes answered, followed by the tail answered
    /// (only without encryption: an encrypted frame is one buffer).
    pub(crate) fn seal(mut self) -> ProtoResult<(Vec<u8>, Option<bytes::Bytes>)> {
        let head = self.bytes.len();
        let tail = self.tail.as_deref().unwrap_or_default();
        for &(start, len, key, algo) in &self.signatures {
            let end = start + len;
            if end <= head {
                let response = self
                    .bytes
                    .get_mut(start..end)
                    .ok_or(ProtoError::Malformed("signed response outside its frame"))?;
                sign(response, &key, algo)?;
            } else {
                // The response runs on into the tail.
                let in_tail = tail
                    .get(..end - head)
                    .ok_or(ProtoError::Malformed("signed response outside its frame"))?;
                let response = self
                    .bytes
                    .get_mut(start..)
                    .ok_or(ProtoError::Malformed("signed response outside its frame"))?;
                sign_with_tail(response, in_tail, &key, algo)?;
            }
        }
        match self.cipher {
            Some((session_id, cipher)) => {
                if let Some(tail) = self.tail.take() {
                    self.bytes.extend_from_slice(&tail);
                }
                Ok((cipher.encrypt(session_id, &self.bytes)?, None))
            }
            None => Ok((self.bytes, self.tail)),
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
            Body::Unsealed(frame) => {
                let (mut bytes, tail) = frame.seal().expect("frame seals");
                bytes.extend_from_slice(tail.as_deref().unwrap_or_default());
                bytes
            }
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

/// Writes `parts` in order, as few writes as the socket takes.
async fn write_all_vectored(writer: &mut WriteHalf<TcpStream>, mut parts: [&[u8]; 3]) -> std::io::Result<()> {
    while parts.iter().any(|p| !p.is_empty()) {
        let slices = parts.map(std::io::IoSlice::new);
        let mut n = writer.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        for p in parts.iter_mut() {
            let k = n.min(p.len());
            *p = &p[k..];
            n -= k;
        }
    }
    Ok(())
}

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
        let (bytes, tail) = match body {
            Body::Sealed(bytes) => (bytes, None),
            Body::Unsealed(frame) => match frame.seal() {
                Ok(sealed) => sealed,
                Err(e) => {
                    error!(error = %e, "cannot sign or encrypt response; closing connection");
                    return;
                }
            },
        };
        // Aquifer patch: a large response (a READ's MiB) goes out behind its
        // 4-byte frame header, with its data from where it lies, in one
        // vectored write instead of being copied into a new buffer with
        // them; small ones are still joined into one buffer.
        let tail = tail.unwrap_or_default();
        let payload = bytes.len() + tail.len();
        let large = payload > INLINE_FRAME_BYTES;
        let mut out = Vec::with_capacity(if large { 4 } else { payload + 4 });
        let framed = if large {
            encode_frame_header(payload, &mut out)
        } else if tail.is_empty() {
            encode_frame(&bytes, &mut out)
        } else {
            encode_frame(&[&bytes[..], &tail[..]].concat(), &mut out)
        };
        if let Err(e) = framed {
            error!(
                error = %e,
                len = payload,
                "cannot frame response; closing connection"
            );
            return;
        }
        let len = out.len() + if large { payload } else { 0 };
        let write = async {
            if large {
                write_all_vectored(&mut writer, [&out[..], &bytes[..], &tail[..]]).await
            } else {
                writer.write_all(&out).await
            }
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

    /// A response whose data lies apart is signed over it and sent with it,
    /// behind one frame header: the bytes on the wire are those of the
    /// response joined first.
    #[tokio::test]
    async fn a_response_with_a_tail_goes_out_as_the_joined_response() {
        let mut head = vec![0u8; 64 + 16];
        head[..4].copy_from_slice(&[0xFE, b'S', b'M', b'B']);
        head[16..20].copy_from_slice(&0x0000_0009u32.to_le_bytes());
        let tail = bytes::Bytes::from((0..300_000u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
        let key = [9u8; 16];
        let len = head.len() + tail.len();
        let apart = Unsealed {
            bytes: head.clone(),
            tail: Some(tail.clone()),
            signatures: vec![(0, len, key, SigningAlgo::AesGmac)],
            cipher: None,
        };
        let joined = Unsealed {
            bytes: [&head[..], &tail[..]].concat(),
            tail: None,
            signatures: vec![(0, len, key, SigningAlgo::AesGmac)],
            cipher: None,
        };
        let (want, none) = joined.seal().unwrap();
        assert!(none.is_none());
        // Through the writer task and a socket.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let (server, _) = listener.accept().await.unwrap();
        let (_, w) = tokio::io::split(server);
        let (tx, rx) = response_queue();
        tx.send(apart).await.unwrap();
        drop(tx);
        writer_task(w, rx, Duration::from_secs(5)).await;
        let got = client.await.unwrap();
        assert_eq!(got[..4], (want.len() as u32).to_be_bytes());
        assert!(got[4..] == want[..], "the wire bytes are the joined response's");
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
