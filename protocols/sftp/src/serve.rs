//! The SFTP subsystem's request loop: one request read, served and answered at a time, as
//! `russh_sftp::server::run` does, with three differences.
//!
//! - A READ's reply is sent from the engine's read buffers ([`SftpSession::read_reply`],
//!   [`data_reply`]), and every reply goes to the channel without a copy
//!   ([`SftpStream::send`]). Through russh-sftp's loop and the channel's `AsyncWrite`, a
//!   READ's data was copied out of the engine's read buffers into the reply's `Vec`, into
//!   the serialised packet, then into each channel message: 23 % of the daemon's CPU samples
//!   during a 1 GiB `sftp get`.
//! - A WRITE is read in place ([`write_request`]): its data reaches the engine as a view of
//!   the packet's buffer, which is read into without being zeroed first ([`read_packet`]);
//!   russh-sftp's decoding copied the data once more, into the request's `Vec`.
//! - A packet longer than the limit ends the session. Its bytes cannot be skipped without
//!   reading them, and russh-sftp's loop read on from the middle of such a packet, taking
//!   its data for the next packet's length.
//!
//! Every other request goes to the session's `russh_sftp::server::Handler` methods, with
//! errors answered as russh-sftp answers them.

use bytes::{BufMut, Bytes};
use russh_sftp::protocol::{Packet, Status, StatusCode};
use russh_sftp::server::{Handler, StatusReply};
use tokio::io::AsyncReadExt;
use storage_engine::ReadBytes;
use tracing::{debug, info};

use crate::inbound::SftpStream;
use crate::session::SftpSession;
use crate::wire::{CLIENT_PACKET_BYTES_MAX, decode, packet_len, request_id, write_request};

/// Serves SFTP on `stream` until the client closes it or breaks the protocol.
pub(crate) async fn run(mut stream: SftpStream, mut session: SftpSession) {
    while let Ok(len) = stream.read_u32().await {
        let Some(len) = packet_len(len) else {
            info!(len, "SFTP session ended: a packet longer than {CLIENT_PACKET_BYTES_MAX} bytes");
            break;
        };
        let Some(buf) = read_packet(&mut stream, len).await else { break };
        let reply = if let Some((id, handle, offset, data)) = write_request(&buf) {
            // A WRITE's data goes to the engine from the packet's own buffer.
            let handle = handle.to_owned();
            let data = Bytes::from(buf).slice(data);
            vec![encode(reply(id, session.write_bytes(id, &handle, offset, data).await))]
        } else {
            let id = request_id(&buf);
            match decode(buf) {
                Ok(Packet::Read(r)) => session.read_reply(r.id, &r.handle, r.offset, r.len).await,
                Ok(request) => vec![encode(serve(request, &mut session).await)],
                Err(code) => vec![encode(Packet::error(id, code))],
            }
        };
        if let Err(e) = stream.send(reply).await {
            debug!("SFTP session ended: reply not sent: {e}");
            break;
        }
    }
}

/// The `len` bytes of a packet, read into a buffer of that capacity without zeroing it first
/// (a WRITE's 255 KiB would be written twice); `None` when the stream ends or fails first.
async fn read_packet(stream: &mut SftpStream, len: usize) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        let want = len - buf.len();
        match stream.read_buf(&mut (&mut buf).limit(want)).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
    Some(buf)
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
        _ => Packet::error(id, StatusCode::BadMessage),
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
    use russh_sftp::protocol::{Data, Write};

    /// A WRITE read in place has the fields russh-sftp decodes from it; what it does not read
    /// (other packets, truncated or padded WRITEs, a handle that is not UTF-8) is left to
    /// russh-sftp's decoding.
    #[test]
    fn writes_read_in_place_are_what_russh_sftp_decodes() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + 5) as u8).collect();
        for (handle, offset, len) in [("1", 0u64, 0usize), ("7", 1 << 40, 1), ("handle-42", 123_456, 32_768), ("", u64::MAX, 70_000)] {
            let packet = encode(Packet::Write(Write { id: 9, handle: handle.into(), offset, data: data[..len].to_vec() }));
            let body = &packet[4..];
            let (id, h, o, range) = write_request(body).expect("a WRITE");
            assert_eq!((id, h, o, &body[range.clone()]), (9, handle, offset, &data[..len]));
            match decode(body.to_vec()) {
                Ok(Packet::Write(w)) => assert_eq!((w.id, w.handle.as_str(), w.offset, &w.data[..]), (id, h, o, &body[range])),
                other => panic!("russh-sftp decoded {other:?}"),
            }
            // Cut short anywhere, or with a byte more: not read in place.
            for cut in [1, 5, 9, 9 + handle.len(), 17 + handle.len(), body.len() - 1] {
                assert!(cut >= body.len() || write_request(&body[..cut]).is_none(), "{handle:?} cut at {cut}");
            }
            let mut longer = body.to_vec();
            longer.push(0);
            assert!(write_request(&longer).is_none());
        }
        let mut not_utf8 = encode(Packet::Write(Write { id: 1, handle: "ab".into(), offset: 0, data: vec![1, 2] }))[4..].to_vec();
        not_utf8[9] = 0xFF;
        assert!(write_request(&not_utf8).is_none());
        let read = encode(Packet::Read(russh_sftp::protocol::Read { id: 1, handle: "ab".into(), offset: 0, len: 10 }));
        assert!(write_request(&read[4..]).is_none());
        assert!(write_request(&[]).is_none());
    }

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
