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

/// The `N` SSH strings (u32 length, bytes) that make up an extended request's data, exactly.
pub(crate) fn ssh_strings<const N: usize>(mut data: &[u8]) -> Result<[String; N], StatusCode> {
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for s in &mut out {
        let len: [u8; 4] = data.get(..4).ok_or(StatusCode::BadMessage)?.try_into().expect("four bytes");
        let n = u32::from_be_bytes(len) as usize;
        let bytes = data.get(4..4usize.saturating_add(n)).ok_or(StatusCode::BadMessage)?;
        *s = String::from_utf8(bytes.to_vec()).map_err(|_| StatusCode::BadMessage)?;
        data = &data[4 + n..];
    }
    if !data.is_empty() {
        return Err(StatusCode::BadMessage);
    }
    Ok(out)
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
