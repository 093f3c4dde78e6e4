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
    /// Arguments did not decode.
    GarbageArgs,
    ProcUnavailable,
    /// The credential is not strong enough (AUTH_NULL where AUTH_SYS is needed).
    AuthTooWeak,
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

async fn connection(state: Arc<State>, stream: TcpStream, peer: SocketAddr) -> anyhow::Result<()> {
    let (mut rd, wr) = stream.into_split();
    // Each reply is a whole record, its mark included, written under this lock. A small reply
    // is written by its call's task when the lock is free: handing it to the writer task
    // would cost a wake-up of another thread per call, which is most of a metadata call's
    // time on a busy machine. The rest (and small replies that find the lock taken) are
    // written by the writer task in turn.
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(REPLY_QUEUE_MAX);
    let writer = {
        let wr = wr.clone();
        async move {
            while let Some(reply) = rx.recv().await {
                wr.lock().await.write_all(&reply).await?;
            }
            anyhow::Ok(())
        }
    };
    let inflight = Arc::new(Semaphore::new(INFLIGHT_REQUESTS_MAX));
    let reader = async {
        let mut calls = JoinSet::new();
        loop {
            while calls.try_join_next().is_some() {}
            let Some(record) = read_record(&mut rd).await? else { break };
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
                        let _ = w.write_all(&reply).await;
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
        Reply::Success(body) => success(xid, body),
        Reply::GarbageArgs => accepted(xid, accept_stat_data::GARBAGE_ARGS, &[]),
        Reply::ProcUnavailable => accepted(xid, accept_stat_data::PROC_UNAVAIL, &[]),
        Reply::AuthTooWeak => denied(xid, rejected_reply::auth_error(auth_stat::AUTH_TOOWEAK)),
    }
}

/// Fills in the record mark and header in front of a body packed by [`packed`].
fn success(xid: u32, mut out: Vec<u8>) -> Vec<u8> {
    let mark = (out.len() - 4) as u32 | 0x8000_0000;
    let head = [mark, xid, 1 /* REPLY */, 0 /* MSG_ACCEPTED */, auth_flavor::AUTH_NULL as u32, 0, 0 /* SUCCESS */];
    for (i, w) in head.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
    }
    out
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
        assert_eq!(success(0x1234_5678, room), accepted(0x1234_5678, accept_stat_data::SUCCESS, &packed_body));
    }
}
