//! The SFTP subsystem's request loop: one request read, served and answered at a time, as
//! `russh_sftp::server::run` does, with two differences.
//!
//! - A READ's reply is sent from the engine's read buffers ([`SftpSession::read_reply`],
//!   [`data_reply`]), and every reply goes to the channel without a copy
//!   ([`SftpStream::send`]). Through russh-sftp's loop and the channel's `AsyncWrite`, a
//!   READ's data was copied out of the engine's read buffers into the reply's `Vec`, into
//!   the serialised packet, then into each channel message: 23 % of the daemon's CPU samples
//!   during a 1 GiB `sftp get`.
//! - A packet longer than the limit ends the session. Its bytes cannot be skipped without
//!   reading them, and russh-sftp's loop read on from the middle of such a packet, taking
//!   its data for the next packet's length.
//!
//! Every other request goes to the session's `russh_sftp::server::Handler` methods, with
//! errors answered as russh-sftp answers them.

use bytes::Bytes;
use russh_sftp::protocol::{Packet, Status, StatusCode};
use russh_sftp::server::{Handler, StatusReply};
use tokio::io::AsyncReadExt;
use storage_engine::ReadBytes;
use tracing::{debug, info};

use crate::inbound::SftpStream;
use crate::session::SftpSession;
use crate::wire::{CLIENT_PACKET_BYTES_MAX, decode, packet_len};

/// Serves SFTP on `stream` until the client closes it or breaks the protocol.
pub(crate) async fn run(mut stream: SftpStream, mut session: SftpSession) {
    while let Ok(len) = stream.read_u32().await {
        let Some(len) = packet_len(len) else {
            info!(len, "SFTP session ended: a packet longer than {CLIENT_PACKET_BYTES_MAX} bytes");
            break;
        };
        let mut buf = vec![0; len];
        if stream.read_exact(&mut buf).await.is_err() {
            break;
        }
        let reply = match decode(buf) {
            Ok(Packet::Read(r)) => session.read_reply(r.id, &r.handle, r.offset, r.len).await,
            Ok(request) => vec![encode(serve(request, &mut session).await)],
            Err(code) => vec![encode(Packet::error(0, code))],
        };
        if let Err(e) = stream.send(reply).await {
            debug!("SFTP session ended: reply not sent: {e}");
            break;
        }
    }
}

/// A packet as it goes on the wire, length first.
pub(crate) fn encode(p: Packet) -> Bytes {
    Bytes::try_from(p).unwrap_or_else(|e| {
        // Only replies are encoded here, and every field of theirs serialises.
        debug!("SFTP reply not encoded: {e}");
        Bytes::try_from(Packet::error(0, StatusCode::Failure)).expect("a status encodes")
    })
}

/// The reply of a handler method: its packet, or its error as a status.
fn reply<T: Into<Packet>>(id: u32, r: Result<T, StatusCode>) -> Packet {
    match r {
        Ok(p) => p.into(),
        Err(e) => {
            let StatusReply { status_code, error_message, language_tag } = e.into();
            Packet::Status(Status {
                id,
                status_code,
                error_message: error_message.unwrap_or_else(|| status_code.to_string()),
                language_tag: language_tag.unwrap_or_else(|| "en-US".to_string()),
            })
        }
    }
}

/// Every request but READ, to its handler method.
async fn serve(request: Packet, h: &mut SftpSession) -> Packet {
    let id = request.get_request_id();
    match request {
        Packet::Init(p) => reply(id, h.init(p.version, p.extensions).await),
        Packet::Open(p) => reply(id, h.open(p.id, p.filename, p.pflags, p.attrs).await),
        Packet::Close(p) => reply(id, h.close(p.id, p.handle).await),
        Packet::Write(p) => reply(id, h.write(p.id, p.handle, p.offset, p.data).await),
        Packet::Lstat(p) => reply(id, h.lstat(p.id, p.path).await),
        Packet::Fstat(p) => reply(id, h.fstat(p.id, p.handle).await),
        Packet::SetStat(p) => reply(id, h.setstat(p.id, p.path, p.attrs).await),
        Packet::FSetStat(p) => reply(id, h.fsetstat(p.id, p.handle, p.attrs).await),
        Packet::OpenDir(p) => reply(id, h.opendir(p.id, p.path).await),
        Packet::ReadDir(p) => reply(id, h.readdir(p.id, p.handle).await),
        Packet::Remove(p) => reply(id, h.remove(p.id, p.filename).await),
        Packet::MkDir(p) => reply(id, h.mkdir(p.id, p.path, p.attrs).await),
        Packet::RmDir(p) => reply(id, h.rmdir(p.id, p.path).await),
        Packet::RealPath(p) => reply(id, h.realpath(p.id, p.path).await),
        Packet::Stat(p) => reply(id, h.stat(p.id, p.path).await),
        Packet::Rename(p) => reply(id, h.rename(p.id, p.oldpath, p.newpath).await),
        Packet::ReadLink(p) => reply(id, h.readlink(p.id, p.path).await),
        Packet::Symlink(p) => reply(id, h.symlink(p.id, p.linkpath, p.targetpath).await),
        Packet::Extended(p) => reply(id, h.extended(p.id, p.request, p.data).await),
        // Replies sent by a client, and READ (served by the loop).
        _ => Packet::error(0, StatusCode::BadMessage),
    }
}

/// Bytes of a READ's data sent in one buffer with the reply's header: what fits in the
/// channel message of OpenSSH's clients (32 KiB) with it. The rest goes as it lies in the
/// engine's read buffers.
const DATA_WITH_HEADER: usize = 32 * 1024 - 13;

/// An SSH_FXP_DATA reply to `id` of `pieces`' bytes `[a, b)` taken as one run (the caller
/// checks the pieces hold them): the header with the first bytes in one buffer, then the
/// rest sharing the pieces' buffers.
pub(crate) fn data_reply(id: u32, pieces: &[ReadBytes], a: usize, b: usize) -> Vec<Bytes> {
    const SSH_FXP_DATA: u8 = 103;
    let n = b - a;
    let mut first = Vec::with_capacity(13 + n.min(DATA_WITH_HEADER));
    first.extend_from_slice(&(9 + n as u32).to_be_bytes());
    first.push(SSH_FXP_DATA);
    first.extend_from_slice(&id.to_be_bytes());
    first.extend_from_slice(&(n as u32).to_be_bytes());
    let mut out = Vec::new();
    let mut room = n.min(DATA_WITH_HEADER);
    for part in ReadBytes::slices_of(pieces, a, b) {
        let k = room.min(part.len());
        first.extend_from_slice(&part[..k]);
        room -= k;
        if k < part.len() {
            out.push(Bytes::from_owner(part.slice(k..part.len())));
        }
    }
    debug_assert_eq!(first.len() - 13 + out.iter().map(Bytes::len).sum::<usize>(), n, "pieces shorter than the run");
    out.insert(0, Bytes::from(first));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use russh_sftp::protocol::Data;

    #[test]
    fn data_replies_are_russh_sftps_encoding() {
        let whole: Vec<u8> = (0..200_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let cuts = [0, 1000, 1001, 4096, 40_000, 100_000, 200_000];
        let pieces: Vec<ReadBytes> = cuts.windows(2).map(|w| ReadBytes::from(whole[w[0]..w[1]].to_vec())).collect();
        for (a, b) in [(0, 200_000), (0, 0), (999, 1002), (1000, 1001), (1500, 4500), (4096, 5000), (199_999, 200_000), (30_000, 140_000), (0, 32_755), (0, 32_756)] {
            let want = encode(Packet::Data(Data { id: 77, data: whole[a..b].to_vec() }));
            let parts = data_reply(77, &pieces, a, b);
            assert_eq!(parts.concat(), want, "[{a}, {b})");
            assert_eq!(parts[0].len(), 13 + (b - a).min(DATA_WITH_HEADER), "[{a}, {b}): header with the first bytes");
        }
    }
}
