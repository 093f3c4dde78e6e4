//! ONC RPC over TCP (RFC 5531): record marking, call decoding, reply encoding.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use nfs3_types::rpc::{
    RPC_VERSION_2, accept_stat_data, accepted_reply, auth_flavor, auth_stat, auth_unix, msg_body, opaque_auth,
    rejected_reply, reply_body, rpc_msg,
};
use nfs3_types::xdr_codec::{Pack, Void};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::proc::State;
use crate::wire::{CallHeader, decode, parse_call, read_record};
pub use crate::wire::RECORD_BYTES_MAX;

/// Calls of one connection processed at the same time; further calls wait to be read.
pub const INFLIGHT_REQUESTS_MAX: usize = 32;
/// Replies queued for one connection's writer.
const REPLY_QUEUE_MAX: usize = 64;
/// Open client connections; further connections wait in the accept queue.
const CONNECTIONS_MAX: usize = 1024;
/// Bytes a connection reads from its socket at a time, for record marks and small calls.
const READ_BUFFER_BYTES: usize = 16 * 1024;
/// A connection with no call in progress that completes no call for this long is closed, so
/// that connections nobody uses (or that stopped in the middle of a record) do not hold the
/// [`CONNECTIONS_MAX`] slots for ever. Six minutes, as the Linux kernel server.
pub const IDLE_CONNECTION_TIMEOUT_MS: u64 = 360_000;
/// Replies up to this size are written by the call's own task when no other reply is being
/// written; larger ones (READ data) always go through the connection's writer.
const DIRECT_REPLY_BYTES_MAX: usize = 64 * 1024;

/// Who sent a call, as far as RPC tells.
pub(crate) struct CallInfo {
    pub peer: IpAddr,
    /// The AUTH_SYS credential; `None` for AUTH_NULL.
    pub cred: Option<auth_unix>,
}

/// What a procedure handler answers.
pub(crate) enum Reply {
    /// Accepted and executed: the packed result body.
    Success(Vec<u8>),
    /// Accepted and executed: a packed result body whose last field is an opaque packed
    /// empty, and the bytes that opaque holds, sent from where they lie (READ data from a
    /// read-ahead window) instead of copied into the body.
    SuccessWithData(Vec<u8>, ReplyData),
    /// Arguments did not decode.
    GarbageArgs,
    ProcUnavailable,
    /// The credential is not strong enough (AUTH_NULL where AUTH_SYS is needed).
    AuthTooWeak,
}

/// Bytes a reply sends from where they lie: a piece of a read-ahead window (a slice of the
/// buffer a drive read into), or a buffer of their own.
pub(crate) struct ReplyData(pub storage_engine::ReadBytes);

impl ReplyData {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A whole reply record: `record` (mark and header included) followed by `data`, if any,
/// and the XDR padding that rounds `data` up to four bytes.
pub(crate) struct Outgoing {
    record: Vec<u8>,
    data: Option<ReplyData>,
}

impl From<Vec<u8>> for Outgoing {
    fn from(record: Vec<u8>) -> Outgoing {
        Outgoing { record, data: None }
    }
}

impl Outgoing {
    fn len(&self) -> usize {
        self.record.len() + self.data.as_ref().map_or(0, |d| d.bytes().len().next_multiple_of(4))
    }

    /// Writes the record; the data goes from its buffer to the socket in the same call.
    async fn write_to(&self, w: &mut (impl AsyncWriteExt + Unpin)) -> std::io::Result<()> {
        let Some(d) = &self.data else { return w.write_all(&self.record).await };
        let data = d.bytes();
        let pad = [0u8; 3];
        let mut parts: [&[u8]; 3] = [&self.record, data, &pad[..data.len().next_multiple_of(4) - data.len()]];
        while parts.iter().any(|p| !p.is_empty()) {
            let slices = parts.map(std::io::IoSlice::new);
            let mut n = w.write_vectored(&slices).await?;
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
}

/// Bytes in front of a successful reply's body: the record mark and the accepted-reply header
/// with an AUTH_NULL verifier (xid, REPLY, MSG_ACCEPTED, flavor, length, SUCCESS). Bodies are
/// packed behind this room and the header is filled in place, so a 1 MiB READ reply is
/// copied once, not once per layer.
const SUCCESS_HEAD_BYTES: usize = 4 + 6 * 4;

pub(crate) fn packed<T: Pack>(v: &T) -> Reply {
    let mut out = Vec::with_capacity(SUCCESS_HEAD_BYTES + v.packed_size());
    out.resize(SUCCESS_HEAD_BYTES, 0);
    match v.pack(&mut out) {
        Ok(_) => Reply::Success(out),
        // Packing into a Vec only fails on values that break XDR limits: a bug here.
        Err(e) => panic!("pack NFS reply: {e}"),
    }
}

pub(crate) async fn accept_loop(
    state: Arc<State>,
    idle: std::time::Duration,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let local = listener.local_addr()?;
    info!(%local, "NFSv3 service listening");
    let limit = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            permit = limit.clone().acquire_owned() => {
                let permit = permit.expect("connection semaphore is never closed");
                let (stream, peer) = tokio::select! {
                    _ = &mut shutdown => break,
                    r = listener.accept() => match r {
                        Ok(x) => x,
                        Err(e) => {
                            warn!("accept NFS connection: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let state = state.clone();
                conns.spawn(async move {
                    let _permit = permit;
                    let _ = stream.set_nodelay(true);
                    if let Err(e) = connection(state, stream, peer, idle).await {
                        debug!(%peer, "NFS connection closed: {e}");
                    }
                });
            }
        }
    }
    conns.shutdown().await;
    info!(%local, "NFSv3 service stopped");
    Ok(())
}

/// Reads the next record, handing the reader back with it, so that a wait for it can be
/// kept across other events instead of being cancelled part-way through a record.
async fn next_record<R: tokio::io::AsyncRead + Unpin>(mut rd: R) -> (R, anyhow::Result<Option<Vec<u8>>>) {
    let r = read_record(&mut rd).await;
    (rd, r)
}

async fn connection(state: Arc<State>, stream: TcpStream, peer: SocketAddr, idle: std::time::Duration) -> anyhow::Result<()> {
    let (rd, wr) = stream.into_split();
    // Record marks and small calls come out of this buffer rather than a read of the socket
    // each: a record sent as many small fragments (a byte each, say) cost two system calls a
    // fragment. A large fragment's bytes past the buffered ones are read straight into the
    // record.
    let rd = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, rd);
    // Each reply is a whole record, its mark included, written under this lock. A small reply
    // is written by its call's task when the lock is free: handing it to the writer task
    // would cost a wake-up of another thread per call, which is most of a metadata call's
    // time on a busy machine. The rest (and small replies that find the lock taken) are
    // written by the writer task in turn.
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    let (tx, mut rx) = mpsc::channel::<Outgoing>(REPLY_QUEUE_MAX);
    let writer = {
        let wr = wr.clone();
        async move {
            while let Some(reply) = rx.recv().await {
                reply.write_to(&mut *wr.lock().await).await?;
            }
            anyhow::Ok(())
        }
    };
    let inflight = Arc::new(Semaphore::new(INFLIGHT_REQUESTS_MAX));
    let reader = async {
        let mut calls = JoinSet::new();
        let mut pending = Box::pin(next_record(rd));
        // One timer a connection, moved only when it fires, rather than one armed for every
        // call (a build that did that measured 0.84x ganesha's one-mount create rate in its
        // bench run, against 1.13-1.62x for this one; docs/benchmarks.md).
        let mut last_call = tokio::time::Instant::now();
        let quiet = tokio::time::sleep(idle);
        tokio::pin!(quiet);
        loop {
            while calls.try_join_next().is_some() {}
            let (rd, read) = tokio::select! {
                biased;
                out = &mut pending => out,
                _ = &mut quiet => {
                    let now = tokio::time::Instant::now();
                    if calls.is_empty() && now >= last_call + idle {
                        debug!(%peer, "closing an NFS connection idle for {} s", idle.as_secs());
                        break;
                    }
                    // Calls came, or are still running: the connection is in use.
                    let from = if calls.is_empty() { last_call } else { now };
                    quiet.as_mut().reset((from + idle).max(now + std::time::Duration::from_millis(1)));
                    continue;
                }
            };
            last_call = tokio::time::Instant::now();
            pending = Box::pin(next_record(rd));
            let Some(record) = read? else { break };
            let permit = inflight.clone().acquire_owned().await.expect("never closed");
            let state = state.clone();
            let (tx, wr) = (tx.clone(), wr.clone());
            let Some((xid, call)) = parse_call(&record)? else { continue };
            calls.spawn(async move {
                let _permit = permit;
                let reply = handle_call(&state, peer.ip(), xid, call, &record).await;
                if reply.len() <= DIRECT_REPLY_BYTES_MAX {
                    if let Ok(mut w) = wr.try_lock() {
                        // A failed write ends the connection: the reader sees it closed.
                        let _ = reply.write_to(&mut *w).await;
                        return;
                    }
                }
                let _ = tx.send(reply).await;
            });
        }
        // Let calls already read finish and answer before the connection closes.
        while calls.join_next().await.is_some() {}
        drop(tx);
        anyhow::Ok(())
    };
    let (r, w) = tokio::join!(reader, writer);
    r.and(w)
}

async fn handle_call(state: &Arc<State>, peer: IpAddr, xid: u32, call: CallHeader, record: &[u8]) -> Outgoing {
    if call.rpcvers != RPC_VERSION_2 {
        return denied(xid, rejected_reply::rpc_mismatch(RPC_VERSION_2, RPC_VERSION_2)).into();
    }
    let cred = match call.cred_flavor {
        auth_flavor::AUTH_UNIX => match decode::<auth_unix>(&call.cred_body) {
            Some(a) => Some(a),
            None => return denied(xid, rejected_reply::auth_error(auth_stat::AUTH_BADCRED)).into(),
        },
        auth_flavor::AUTH_NULL => None,
        _ => return denied(xid, rejected_reply::auth_error(auth_stat::AUTH_TOOWEAK)).into(),
    };
    let info = CallInfo { peer, cred };
    let args = &record[call.args_at..];
    let (low, high) = match call.prog {
        nfs3_types::nfs3::PROGRAM => (3, 3),
        nfs3_types::mount::PROGRAM => (3, 3),
        _ => return accepted(xid, accept_stat_data::PROG_UNAVAIL, &[]).into(),
    };
    if call.vers < low || call.vers > high {
        return accepted(xid, accept_stat_data::PROG_MISMATCH { low, high }, &[]).into();
    }
    let reply = if call.prog == nfs3_types::nfs3::PROGRAM {
        crate::proc::dispatch(state, &info, call.proc_, args).await
    } else {
        crate::mount::dispatch(state, &info, call.proc_, args).await
    };
    match reply {
        Reply::Success(body) => success(xid, body, 0).into(),
        Reply::SuccessWithData(body, data) => success_with_data(xid, body, data),
        Reply::GarbageArgs => accepted(xid, accept_stat_data::GARBAGE_ARGS, &[]).into(),
        Reply::ProcUnavailable => accepted(xid, accept_stat_data::PROC_UNAVAIL, &[]).into(),
        Reply::AuthTooWeak => denied(xid, rejected_reply::auth_error(auth_stat::AUTH_TOOWEAK)).into(),
    }
}

/// Fills in the record mark and header in front of a body packed by [`packed`], with
/// `after` more bytes of the record to follow it.
fn success(xid: u32, mut out: Vec<u8>, after: usize) -> Vec<u8> {
    let mark = (out.len() - 4 + after) as u32 | 0x8000_0000;
    let head = [mark, xid, 1 /* REPLY */, 0 /* MSG_ACCEPTED */, auth_flavor::AUTH_NULL as u32, 0, 0 /* SUCCESS */];
    for (i, w) in head.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    out
}

/// [`success`] for a body that ends with an opaque packed empty, whose bytes are `data`: the
/// opaque's real length goes in, and the record mark counts the data and its padding.
fn success_with_data(xid: u32, mut body: Vec<u8>, data: ReplyData) -> Outgoing {
    let n = data.bytes().len();
    let at = body.len() - 4;
    body[at..].copy_from_slice(&(n as u32).to_be_bytes());
    Outgoing { record: success(xid, body, n.next_multiple_of(4)), data: Some(data) }
}

/// A whole record (mark included) holding `msg` and then `body`.
fn record_of(msg: &rpc_msg, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + msg.packed_size() + body.len());
    out.extend_from_slice(&[0; 4]);
    msg.pack(&mut out).expect("pack RPC reply header");
    out.extend_from_slice(body);
    let mark = (out.len() - 4) as u32 | 0x8000_0000;
    out[..4].copy_from_slice(&mark.to_be_bytes());
    out
}

fn accepted(xid: u32, stat: accept_stat_data, body: &[u8]) -> Vec<u8> {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply { verf: opaque_auth::default(), reply_data: stat })),
    };
    record_of(&msg, body)
}

fn denied(xid: u32, rej: rejected_reply) -> Vec<u8> {
    let msg = rpc_msg { xid, body: msg_body::REPLY(reply_body::MSG_DENIED(rej)) };
    let mut void = Vec::new();
    Void.pack(&mut void).expect("pack void");
    record_of(&msg, &void)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_header_filled_in_place_matches_the_packed_header() {
        let body = vec![7u8; 1000];
        let Reply::Success(room) = packed(&nfs3_types::xdr_codec::Opaque::owned(body.clone())) else { panic!("packed") };
        let mut packed_body = Vec::new();
        nfs3_types::xdr_codec::Opaque::owned(body).pack(&mut packed_body).unwrap();
        assert_eq!(success(0x1234_5678, room, 0), accepted(0x1234_5678, accept_stat_data::SUCCESS, &packed_body));
    }

    /// A reply whose data is sent from its buffer is, byte for byte, the reply with the data
    /// packed into it (length, bytes, padding), whatever the length.
    #[tokio::test]
    async fn a_reply_sent_with_its_data_beside_it_is_the_packed_reply() {
        for n in [0usize, 1, 2, 3, 4, 1001, 4096] {
            let buffer = storage_engine::ReadBytes::from((0..n + 7).map(|i| i as u8).collect::<Vec<u8>>());
            let data = ReplyData(buffer.slice(5..5 + n));
            let res = |d: &[u8]| {
                use nfs3_types::nfs3::*;
                let data = nfs3_types::xdr_codec::Opaque::borrowed(d);
                match packed(&READ3res::Ok(READ3resok { file_attributes: post_op_attr::None, count: n as u32, eof: true, data })) {
                    Reply::Success(b) => b,
                    _ => unreachable!("packed answers Success"),
                }
            };
            let whole = success(7, res(data.bytes()), 0);
            let out = success_with_data(7, res(&[]), data);
            assert_eq!(out.len(), whole.len());
            let mut sent = Vec::new();
            out.write_to(&mut sent).await.unwrap();
            assert_eq!(sent, whole, "{n} bytes of data");
        }
    }
}
