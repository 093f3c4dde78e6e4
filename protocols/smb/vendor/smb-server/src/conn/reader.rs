//! Per-connection frame reader: pulls bytes off the socket, frames them,
//! hands each frame to the dispatcher. A lone READ or WRITE on a file runs
//! beside the reader (Aquifer patch); every other frame waits for those
//! before it and runs in arrival order.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::proto::framing::{FRAME_HEADER_LEN, decode_frame_header};
use tokio::io::{AsyncReadExt, BufReader, ReadHalf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, error, info};

use crate::conn::limits::max_request_frame;
use crate::conn::state::Connection;
use crate::conn::writer::{ResponseQueue, Unsealed};
use crate::dispatch::{Outgoing, dispatch_frame_unsealed};
use crate::handlers::shared::lookup_session_tree;
use crate::proto::header::{
    Command, SMB2_FLAGS_ASYNC_COMMAND, SMB2_FLAGS_RELATED_OPERATIONS, SMB2_HEADER_LEN,
    Smb2Header,
};
use crate::server::ServerState;

/// READ and WRITE requests of one connection handled at once. Clients keep
/// several in flight (smbclient and Windows pipeline MiB-sized READs and
/// WRITEs within their credits); each holds its frame and response, so
/// this also bounds the memory a connection's requests take.
pub const CONCURRENT_IO_REQUESTS_MAX: u32 = 16;

/// Bytes read from the socket at once: a MiB-sized WRITE arrives in a few
/// reads, and a frame header and a small request take no read of their own.
const SOCKET_READ_BUFFER_BYTES: usize = 256 * 1024;

type Reader = BufReader<ReadHalf<TcpStream>>;

/// Reads the rest of a frame whose first `filled` prefix bytes are already
/// in `prefix`, and returns its payload (without the 4-byte length prefix).
/// A frame longer than the connection accepts fails before its payload is
/// read; the payload buffer grows with the bytes that arrive.
async fn read_frame_rest(
    reader: &mut Reader,
    conn: &Connection,
    prefix: &mut [u8; FRAME_HEADER_LEN],
    filled: usize,
    has_session: bool,
) -> io::Result<Vec<u8>> {
    reader.read_exact(&mut prefix[filled..]).await?;
    let len = match decode_frame_header(prefix) {
        Ok(n) => n as usize,
        Err(e) => {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()));
        }
    };
    let limit = max_request_frame(
        *conn.dialect.read().await,
        *conn.max_read_size.read().await,
        *conn.max_write_size.read().await,
    );
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {limit}-byte limit"),
        ));
    }
    // Aquifer patch: once the connection has a session, a frame's whole
    // buffer is allocated up front (a MiB-sized WRITE no longer grows its
    // buffer by doubling, copying it each time); before, it grows with the
    // bytes that arrive, so an unauthenticated peer cannot make the server
    // reserve memory it never sends.
    let initial = if has_session { len } else { len.min(INITIAL_FRAME_BUFFER) };
    let mut payload = Vec::with_capacity(initial);
    reader.take(len as u64).read_to_end(&mut payload).await?;
    if payload.len() < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(payload)
}

/// Initial payload buffer; larger frames grow it as their bytes arrive.
const INITIAL_FRAME_BUFFER: usize = 64 * 1024;

/// Whether any tree on the connection has an open file.
async fn has_open_files(conn: &Connection) -> bool {
    let sessions: Vec<_> = conn.sessions.read().await.values().cloned().collect();
    for session in sessions {
        let session = session.read().await;
        let trees: Vec<_> = session.trees.read().await.values().cloned().collect();
        for tree in trees {
            if !tree.read().await.opens.read().await.is_empty() {
                return true;
            }
        }
    }
    false
}

/// Whether `frame` is one READ or WRITE request, not compounded and not on
/// a named pipe, on a tree of the connection: one that may run beside the
/// reader. A pipe's messages keep their order; anything that does not look
/// up runs in order and fails there as before.
async fn runs_beside(conn: &Arc<Connection>, frame: &[u8]) -> bool {
    let Ok((hdr, _)) = Smb2Header::parse(frame) else {
        return false;
    };
    if !matches!(hdr.command, Command::Read | Command::Write)
        || hdr.next_command != 0
        || hdr.flags & (SMB2_FLAGS_RELATED_OPERATIONS | SMB2_FLAGS_ASYNC_COMMAND) != 0
        || frame.len() < SMB2_HEADER_LEN
    {
        return false;
    }
    match lookup_session_tree(conn, &hdr).await {
        Ok(tree) => !tree.read().await.share.is_ipc,
        Err(_) => false,
    }
}

/// Queues the answer to a frame and starts what follows it. Returns false
/// once the connection is to close.
async fn deliver(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    tx: &ResponseQueue,
    response: Option<Outgoing<Unsealed>>,
) -> bool {
    if conn.disconnect_requested() {
        debug!("closing connection without a reply");
        return false;
    }
    if let Some(out) = response {
        if tx.send(out.bytes).await.is_err() {
            debug!("writer channel closed; reader exiting");
            return false;
        }
        // Lease breaks held back for these responses follow them.
        drop(out.after_send);
        // The interim response is queued, so the final one cannot pass it.
        if let Some(continuation) = out.continuation {
            conn.pending
                .spawn(continuation.run(Arc::clone(server), Arc::clone(conn)));
        }
    }
    true
}

/// Read frames and dispatch them in arrival order, sending each response to
/// the writer, which signs and sends it while the next frame is handled. A
/// lone READ or WRITE on a file runs beside the reader, up to
/// [`CONCURRENT_IO_REQUESTS_MAX`] at once; any other frame first waits for
/// all of those, so a CLOSE, FLUSH or SET_INFO never overtakes a READ or
/// WRITE that arrived before it. Returns between frames once the server
/// shuts down, after the READs and WRITEs still running are answered; a
/// frame that has started to arrive is still answered.
pub async fn reader_task(
    reader: ReadHalf<TcpStream>,
    server: Arc<ServerState>,
    conn: Arc<Connection>,
    tx: ResponseQueue,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(CONCURRENT_IO_REQUESTS_MAX as usize));
    let disconnect = Arc::new(Notify::new());
    let mut beside = JoinSet::new();
    let result = read_frames(
        &mut BufReader::with_capacity(SOCKET_READ_BUFFER_BYTES, reader),
        &server,
        &conn,
        &tx,
        &slots,
        &disconnect,
        &mut beside,
    )
    .await;
    // The connection closes only after its READs and WRITEs have run.
    while beside.join_next().await.is_some() {}
    result
}

async fn read_frames(
    reader: &mut Reader,
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    tx: &ResponseQueue,
    slots: &Arc<Semaphore>,
    disconnect: &Arc<Notify>,
    beside: &mut JoinSet<()>,
) -> io::Result<()> {
    let limits = &server.config.limits;
    // Until a session exists this is the handshake deadline; after that it
    // is the idle deadline.
    let mut deadline = Instant::now() + limits.handshake_timeout;
    let mut has_session = false;
    loop {
        let stopped = server.shutdown.notified();
        tokio::pin!(stopped);
        stopped.as_mut().enable();
        if server.shutting_down.load(Ordering::Acquire) {
            debug!("server shutting down; closing connection");
            return Ok(());
        }
        while beside.try_join_next().is_some() {}

        let mut prefix = [0u8; FRAME_HEADER_LEN];
        let filled = tokio::select! {
            biased;
            read = reader.read(&mut prefix) => read,
            _ = &mut stopped => {
                debug!("server shutting down; closing connection");
                return Ok(());
            }
            _ = tx.closed() => {
                debug!("writer closed; reader exiting");
                return Ok(());
            }
            _ = conn.outbound.killed() => {
                info!("client stopped reading lease breaks; closing connection");
                return Ok(());
            }
            _ = disconnect.notified() => {
                debug!("closing connection without a reply");
                return Ok(());
            }
            _ = tokio::time::sleep_until(deadline) => {
                if !has_session {
                    info!("no session established in time; closing connection");
                    return Ok(());
                }
                if !has_open_files(conn).await {
                    info!("closing idle connection");
                    return Ok(());
                }
                deadline = Instant::now() + limits.idle_timeout;
                continue;
            }
        };
        let frame = match filled {
            Ok(0) => {
                debug!("client closed connection");
                return Ok(());
            }
            Ok(filled) => {
                let rest = read_frame_rest(reader, conn, &mut prefix, filled, has_session);
                match tokio::time::timeout(limits.io_timeout, rest).await {
                    Ok(frame) => frame,
                    Err(_) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "frame not received in time",
                    )),
                }
            }
            Err(e) => Err(e),
        };
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                error!(error = %e, "frame read error");
                return Err(e);
            }
        };
        if runs_beside(conn, &frame).await {
            let slot = tokio::select! {
                slot = Arc::clone(slots).acquire_owned() => slot.expect("the semaphore is never closed"),
                _ = tx.closed() => {
                    debug!("writer closed; reader exiting");
                    return Ok(());
                }
            };
            let (server, conn, tx, disconnect) = (
                Arc::clone(server),
                Arc::clone(conn),
                tx.clone(),
                Arc::clone(disconnect),
            );
            beside.spawn(async move {
                let response = dispatch_frame_unsealed(&server, &conn, &frame).await;
                if !deliver(&server, &conn, &tx, response).await {
                    // Stored if the reader is not waiting yet.
                    disconnect.notify_one();
                }
                drop(slot);
            });
        } else {
            // Everything else runs in order, after the READs and WRITEs
            // before it: CLOSE, FLUSH, SET_INFO and LOCK see their effects,
            // and session and tree changes never race them.
            drop(
                slots
                    .acquire_many(CONCURRENT_IO_REQUESTS_MAX)
                    .await
                    .expect("the semaphore is never closed"),
            );
            if conn.disconnect_requested() {
                debug!("closing connection without a reply");
                return Ok(());
            }
            let response = dispatch_frame_unsealed(server, conn, &frame).await;
            if !deliver(server, conn, tx, response).await {
                return Ok(());
            }
        }
        has_session = has_session || !conn.sessions.read().await.is_empty();
        if has_session {
            deadline = Instant::now() + limits.idle_timeout;
        }
    }
}
