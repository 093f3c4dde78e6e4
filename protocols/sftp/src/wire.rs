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
    String::from_utf8(take_bytes(data)?.to_vec()).map_err(|_| StatusCode::BadMessage)
}

/// An SSH string's bytes (after its u32 length) from the front of `data`.
fn take_bytes<'a>(data: &mut &'a [u8]) -> Result<&'a [u8], StatusCode> {
    let len: [u8; 4] = data.get(..4).ok_or(StatusCode::BadMessage)?.try_into().expect("four bytes");
    let n = u32::from_be_bytes(len) as usize;
    let bytes = data.get(4..4usize.saturating_add(n)).ok_or(StatusCode::BadMessage)?;
    *data = &data[4 + n..];
    Ok(bytes)
}

/// Most ids of each kind one `users-groups-by-id@openssh.com` request may ask about: OpenSSH's
/// client asks for the distinct owners and groups of one listing, and the answer (names of up
/// to 32 bytes) stays well below the largest packet a client takes.
pub(crate) const NAME_IDS_MAX: usize = 1024;

/// The ids a `users-groups-by-id@openssh.com` request asks about, exactly: a string of packed
/// uint32 uids, then one of gids. More than [`NAME_IDS_MAX`] of either is refused.
pub(crate) fn ids_args(data: &[u8]) -> Result<(Vec<u32>, Vec<u32>), StatusCode> {
    let mut d = data;
    let mut ids = || -> Result<Vec<u32>, StatusCode> {
        let packed = take_bytes(&mut d)?;
        if packed.len() % 4 != 0 {
            return Err(StatusCode::BadMessage);
        }
        if packed.len() / 4 > NAME_IDS_MAX {
            return Err(StatusCode::Failure);
        }
        Ok(packed.chunks_exact(4).map(|b| u32::from_be_bytes(b.try_into().expect("four bytes"))).collect())
    };
    let (uids, gids) = (ids()?, ids()?);
    if !d.is_empty() {
        return Err(StatusCode::BadMessage);
    }
    Ok((uids, gids))
}

/// The reply to `users-groups-by-id@openssh.com`: a string holding one string per user name,
/// in the order asked (empty where an id has no name), then the same for groups.
pub(crate) fn names_reply(users: &[String], groups: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for names in [users, groups] {
        let inner: Vec<u8> = names.iter().flat_map(|n| (n.len() as u32).to_be_bytes().into_iter().chain(n.bytes())).collect();
        out.extend_from_slice(&(inner.len() as u32).to_be_bytes());
        out.extend_from_slice(&inner);
    }
    out
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

/// A path's components as a walk takes them (`session::walk`): empty ones and `.` left out,
/// `..` kept, to be taken after the symlinks before it are followed.
pub(crate) fn steps(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty() && *c != ".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids_request(uids: &[u32], gids: &[u32]) -> Vec<u8> {
        let mut d = Vec::new();
        for ids in [uids, gids] {
            d.extend_from_slice(&(4 * ids.len() as u32).to_be_bytes());
            ids.iter().for_each(|i| d.extend_from_slice(&i.to_be_bytes()));
        }
        d
    }

    #[test]
    fn users_groups_by_id_requests_are_read_exactly() {
        assert_eq!(ids_args(&ids_request(&[0, 1000, u32::MAX], &[100])), Ok((vec![0, 1000, u32::MAX], vec![100])));
        assert_eq!(ids_args(&ids_request(&[], &[])), Ok((vec![], vec![])));
        let mut trailing = ids_request(&[1], &[2]);
        trailing.push(0);
        assert_eq!(ids_args(&trailing), Err(StatusCode::BadMessage));
        let mut ragged = ids_request(&[1], &[2]);
        ragged[3] = 5; // the uids string holds 5 bytes: not whole ids
        assert_eq!(ids_args(&ragged), Err(StatusCode::BadMessage));
        assert_eq!(ids_args(&ids_request(&[1], &[])[..6]), Err(StatusCode::BadMessage));
        let many: Vec<u32> = (0..=NAME_IDS_MAX as u32).collect();
        assert_eq!(ids_args(&ids_request(&many, &[])), Err(StatusCode::Failure));
        assert!(ids_args(&ids_request(&many[1..], &many[1..])).is_ok());
    }

    #[test]
    fn names_replies_hold_one_string_per_id() {
        let reply = names_reply(&["alice".into(), String::new()], &["staff".into()]);
        let want = [&[0, 0, 0, 13][..], &[0, 0, 0, 5], b"alice", &[0, 0, 0, 0], &[0, 0, 0, 9], &[0, 0, 0, 5], b"staff"].concat();
        assert_eq!(reply, want);
        assert_eq!(names_reply(&[], &[]), [0u8; 8]);
    }
}
