//! What an SFTP client's bytes pass through before the engine sees them: the packet length
//! and its limit, the packet's decoding (russh-sftp's), the SSH strings of an extended
//! request's data, and the lexical normalisation of paths. Kept free of the engine and of
//! SSH so that `protocols/sftp/fuzz` compiles this file unchanged (docs/fuzzing.md).

use bytes::Bytes;
use russh_sftp::protocol::{Packet, StatusCode};

/// Largest packet a client may send (as OpenSSH's sftp-server's, and russh-sftp's
/// `Config::max_client_packet_len`); a longer one ends the session (`serve::run`).
pub(crate) const CLIENT_PACKET_BYTES_MAX: u64 = 256 * 1024;

/// The length of the packet whose length field is `len`, or `None` when it is longer than
/// [`CLIENT_PACKET_BYTES_MAX`]: its bytes cannot be skipped without reading them, so the
/// session ends there.
pub(crate) fn packet_len(len: u32) -> Option<usize> {
    (u64::from(len) <= CLIENT_PACKET_BYTES_MAX).then_some(len as usize)
}

/// A packet's bytes (after its length) as a request; what does not decode is answered
/// `SSH_FX_BAD_MESSAGE`.
pub(crate) fn decode(packet: Vec<u8>) -> Result<Packet, StatusCode> {
    Packet::try_from(&mut Bytes::from(packet)).map_err(|_| StatusCode::BadMessage)
}

/// The request id of a packet of a request type (the u32 after its type byte; 0 for other
/// types and packets too short to have one): a request that does not decode is answered
/// under its own id, so that the client waiting for that id gets its error rather than
/// waiting for ever.
pub(crate) fn request_id(packet: &[u8]) -> u32 {
    // OPEN (3) to SYMLINK (20), and EXTENDED (200).
    match packet.first() {
        Some(3..=20 | 200) => packet.get(1..5).map_or(0, |b| u32::from_be_bytes(b.try_into().expect("four bytes"))),
        _ => 0,
    }
}

/// SSH_FXP_WRITE's packet type.
const FXP_WRITE: u8 = 6;

/// A WRITE request's fields read in place, without copying its data: (request id, handle,
/// offset, the data's range in `packet`). `None` when the packet is not a WRITE, or not one
/// whose bytes are exactly its fields with a UTF-8 handle: [`decode`] then answers it as it
/// answers any other packet. Where this reads a WRITE, `decode` reads the same fields
/// (`protocols/sftp/fuzz` checks it).
pub(crate) fn write_request(packet: &[u8]) -> Option<(u32, &str, u64, std::ops::Range<usize>)> {
    let u32_at = |at: usize| packet.get(at..at.checked_add(4)?).map(|b| u32::from_be_bytes(b.try_into().expect("four bytes")));
    if *packet.first()? != FXP_WRITE {
        return None;
    }
    let id = u32_at(1)?;
    let handle_end = 9usize.checked_add(u32_at(5)? as usize)?;
    let handle = std::str::from_utf8(packet.get(9..handle_end)?).ok()?;
    let offset = u64::from_be_bytes(packet.get(handle_end..handle_end + 8)?.try_into().expect("eight bytes"));
    let data_start = handle_end + 12;
    let data_end = data_start.checked_add(u32_at(handle_end + 8)? as usize)?;
    (data_end == packet.len()).then_some((id, handle, offset, data_start..data_end))
}

/// The `N` SSH strings (u32 length, bytes) that make up an extended request's data, exactly.
pub(crate) fn ssh_strings<const N: usize>(mut data: &[u8]) -> Result<[String; N], StatusCode> {
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for s in &mut out {
        *s = take_string(&mut data)?;
    }
    if !data.is_empty() {
        return Err(StatusCode::BadMessage);
    }
    Ok(out)
}

/// An SSH string (u32 length, UTF-8 bytes) from the front of `data`.
fn take_string(data: &mut &[u8]) -> Result<String, StatusCode> {
    let len: [u8; 4] = data.get(..4).ok_or(StatusCode::BadMessage)?.try_into().expect("four bytes");
    let n = u32::from_be_bytes(len) as usize;
    let bytes = data.get(4..4usize.saturating_add(n)).ok_or(StatusCode::BadMessage)?;
    let s = String::from_utf8(bytes.to_vec()).map_err(|_| StatusCode::BadMessage)?;
    *data = &data[4 + n..];
    Ok(s)
}

/// A u64 from the front of `data`.
fn take_u64(data: &mut &[u8]) -> Result<u64, StatusCode> {
    let v: [u8; 8] = data.get(..8).ok_or(StatusCode::BadMessage)?.try_into().expect("eight bytes");
    *data = &data[8..];
    Ok(u64::from_be_bytes(v))
}

/// The fields of a `copy-data` request's data, exactly: read-from handle, offset and length
/// (0: to the end of the file), write-to handle and offset.
pub(crate) fn copy_data_args(data: &[u8]) -> Result<(String, u64, u64, String, u64), StatusCode> {
    let mut d = data;
    let from = take_string(&mut d)?;
    let (read_at, len) = (take_u64(&mut d)?, take_u64(&mut d)?);
    let to = take_string(&mut d)?;
    let write_at = take_u64(&mut d)?;
    if !d.is_empty() {
        return Err(StatusCode::BadMessage);
    }
    Ok((from, read_at, len, to, write_at))
}

/// Lexically normalised absolute path components; `..` at the root stays at the root.
pub(crate) fn components(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c.to_string()),
        }
    }
    out
}

/// The absolute path of normalised components.
pub(crate) fn join(comps: &[String]) -> String {
    format!("/{}", comps.join("/"))
}
