//! ONC RPC over TCP (RFC 5531): record marking, call decoding, reply encoding.

use std::io::Cursor;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use nfs3_types::rpc::{
    RPC_VERSION_2, accept_stat_data, accepted_reply, auth_flavor, auth_stat, auth_unix, msg_body, opaque_auth,
    rejected_reply, reply_body, rpc_msg,
};
use nfs3_types::xdr_codec::{Pack, Unpack, Void};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::proc::State;

/// Largest RPC record (all fragments of one call) accepted: a 1 MiB WRITE plus headers.
pub const RECORD_BYTES_MAX: usize = (1 << 20) + 64 * 1024;
/// Calls of one connection processed at the same time; further calls wait to be read.
pub const INFLIGHT_REQUESTS_MAX: usize = 32;
/// Replies queued for one connection's writer.
const REPLY_QUEUE_MAX: usize = 64;
/// Open client connections; further connections wait in the accept queue.
const CONNECTIONS_MAX: usize = 1024;

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
    /// Arguments did not decode.
    GarbageArgs,
    ProcUnavailable,
    /// The credential is not strong enough (AUTH_NULL where AUTH_SYS is needed).
    AuthTooWeak,
}

pub(crate) fn packed<T: Pack>(v: &T) -> Reply {
    let mut out = Vec::with_capacity(v.packed_size());
    match v.pack(&mut out) {
        Ok(_) => Reply::Success(out),
        // Packing into a Vec only fails on values that break XDR limits: a bug here.
        Err(e) => panic!("pack NFS reply: {e}"),
    }
}

/// Decodes the whole of `args` as `T`; trailing bytes are garbage.
pub(crate) fn decode<T: Unpack>(args: &[u8]) -> Option<T> {
    let mut cur = Cursor::new(args);
    let (v, _) = T::unpack(&mut cur).ok()?;
    if cur.position() as usize != args.len() {
        return None;
    }
    Some(v)
}

pub(crate) async fn accept_loop(
    state: Arc<State>,
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
                    if let Err(e) = connection(state, stream, peer).await {
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

/// Reads one record: fragments until the last one, at most `RECORD_BYTES_MAX` in all.
/// `Ok(None)` at a clean end of stream between records.
async fn read_record(rd: &mut (impl AsyncReadExt + Unpin)) -> anyhow::Result<Option<Vec<u8>>> {
    let mut record = Vec::new();
    loop {
        let mut mark = [0u8; 4];
        match rd.read_exact(&mut mark).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && record.is_empty() => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let mark = u32::from_be_bytes(mark);
        let last = mark & 0x8000_0000 != 0;
        let len = (mark & 0x7fff_ffff) as usize;
        if record.len() + len > RECORD_BYTES_MAX {
            anyhow::bail!("record of more than {RECORD_BYTES_MAX} bytes refused");
        }
        let start = record.len();
        record.resize(start + len, 0);
        rd.read_exact(&mut record[start..]).await?;
        if last {
            return Ok(Some(record));
        }
    }
}

async fn connection(state: Arc<State>, stream: TcpStream, peer: SocketAddr) -> anyhow::Result<()> {
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(REPLY_QUEUE_MAX);
    let writer = async move {
        while let Some(reply) = rx.recv().await {
            let mark = (reply.len() as u32 | 0x8000_0000).to_be_bytes();
            wr.write_all(&mark).await?;
            wr.write_all(&reply).await?;
        }
        anyhow::Ok(())
    };
    let inflight = Arc::new(Semaphore::new(INFLIGHT_REQUESTS_MAX));
    let reader = async {
        let mut calls = JoinSet::new();
        loop {
            while calls.try_join_next().is_some() {}
            let Some(record) = read_record(&mut rd).await? else { break };
            let permit = inflight.clone().acquire_owned().await.expect("never closed");
            let state = state.clone();
            let tx = tx.clone();
            let Some((xid, call)) = parse_call(&record)? else { continue };
            calls.spawn(async move {
                let _permit = permit;
                let reply = handle_call(&state, peer.ip(), xid, call, &record).await;
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

/// The parts of a call header the dispatcher needs, with the offset of the arguments.
pub(crate) struct CallHeader {
    prog: u32,
    vers: u32,
    proc_: u32,
    rpcvers: u32,
    cred_flavor: auth_flavor,
    cred_body: Vec<u8>,
    args_at: usize,
}

/// Decodes a call header. A record that is not an RPC call ends the connection.
fn parse_call(record: &[u8]) -> anyhow::Result<Option<(u32, CallHeader)>> {
    let mut cur = Cursor::new(record);
    let (msg, _) = rpc_msg::unpack(&mut cur).map_err(|e| anyhow::anyhow!("undecodable RPC record: {e}"))?;
    let call = match msg.body {
        msg_body::CALL(c) => c,
        // A reply sent to a server means nothing; drop it.
        msg_body::REPLY(_) => return Ok(None),
    };
    Ok(Some((
        msg.xid,
        CallHeader {
            prog: call.prog,
            vers: call.vers,
            proc_: call.proc,
            rpcvers: call.rpcvers,
            cred_flavor: call.cred.flavor,
            cred_body: call.cred.body.0.to_vec(),
            args_at: cur.position() as usize,
        },
    )))
}

async fn handle_call(state: &Arc<State>, peer: IpAddr, xid: u32, call: CallHeader, record: &[u8]) -> Vec<u8> {
    if call.rpcvers != RPC_VERSION_2 {
        return denied(xid, rejected_reply::rpc_mismatch(RPC_VERSION_2, RPC_VERSION_2));
    }
    let cred = match call.cred_flavor {
        auth_flavor::AUTH_UNIX => match decode::<auth_unix>(&call.cred_body) {
            Some(a) => Some(a),
            None => return denied(xid, rejected_reply::auth_error(auth_stat::AUTH_BADCRED)),
        },
        auth_flavor::AUTH_NULL => None,
        _ => return denied(xid, rejected_reply::auth_error(auth_stat::AUTH_TOOWEAK)),
    };
    let info = CallInfo { peer, cred };
    let args = &record[call.args_at..];
    let (low, high) = match call.prog {
        nfs3_types::nfs3::PROGRAM => (3, 3),
        nfs3_types::mount::PROGRAM => (3, 3),
        _ => return accepted(xid, accept_stat_data::PROG_UNAVAIL, &[]),
    };
    if call.vers < low || call.vers > high {
        return accepted(xid, accept_stat_data::PROG_MISMATCH { low, high }, &[]);
    }
    let reply = if call.prog == nfs3_types::nfs3::PROGRAM {
        crate::proc::dispatch(state, &info, call.proc_, args).await
    } else {
        crate::mount::dispatch(state, &info, call.proc_, args).await
    };
    match reply {
        Reply::Success(body) => accepted(xid, accept_stat_data::SUCCESS, &body),
        Reply::GarbageArgs => accepted(xid, accept_stat_data::GARBAGE_ARGS, &[]),
        Reply::ProcUnavailable => accepted(xid, accept_stat_data::PROC_UNAVAIL, &[]),
        Reply::AuthTooWeak => denied(xid, rejected_reply::auth_error(auth_stat::AUTH_TOOWEAK)),
    }
}

fn accepted(xid: u32, stat: accept_stat_data, body: &[u8]) -> Vec<u8> {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(reply_body::MSG_ACCEPTED(accepted_reply { verf: opaque_auth::default(), reply_data: stat })),
    };
    let mut out = Vec::with_capacity(msg.packed_size() + body.len());
    msg.pack(&mut out).expect("pack RPC reply header");
    out.extend_from_slice(body);
    out
}

fn denied(xid: u32, rej: rejected_reply) -> Vec<u8> {
    let msg = rpc_msg { xid, body: msg_body::REPLY(reply_body::MSG_DENIED(rej)) };
    let mut out = Vec::new();
    msg.pack(&mut out).expect("pack RPC reply header");
    Void.pack(&mut out).expect("pack void");
    out
}
