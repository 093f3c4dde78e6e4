//! NFS file handles.
//!
//! Layout, 24 bytes, big-endian:
//!
//! | bytes | field                                                    |
//! |-------|----------------------------------------------------------|
//! | 0..2  | magic `AQ`                                               |
//! | 2     | format version, 1                                        |
//! | 3     | reserved, 0                                              |
//! | 4..8  | export id: FNV-1a of the export path, truncated to 32 bits |
//! | 8..16 | inode number                                             |
//! | 16..24| inode generation (random per inode, kept in metadata)    |
//!
//! Nothing in a handle depends on the server process, so handles stay valid across restarts
//! and on every node that serves the same namespace. A handle whose inode is gone or whose
//! generation differs is stale.

use storage_engine::Ino;

pub(crate) const HANDLE_BYTES: usize = 24;
const MAGIC: [u8; 2] = *b"AQ";
const VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub export_id: u32,
    pub ino: Ino,
    pub generation: u64,
}

impl Handle {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HANDLE_BYTES);
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(0);
        b.extend_from_slice(&self.export_id.to_be_bytes());
        b.extend_from_slice(&self.ino.to_be_bytes());
        b.extend_from_slice(&self.generation.to_be_bytes());
        debug_assert_eq!(b.len(), HANDLE_BYTES);
        b
    }

    /// `None` when the bytes are not a handle this server issued (NFS3ERR_BADHANDLE).
    pub(crate) fn decode(b: &[u8]) -> Option<Handle> {
        if b.len() != HANDLE_BYTES || b[0..2] != MAGIC || b[2] != VERSION || b[3] != 0 {
            return None;
        }
        let export_id = u32::from_be_bytes(b[4..8].try_into().ok()?);
        let ino = u64::from_be_bytes(b[8..16].try_into().ok()?);
        let generation = u64::from_be_bytes(b[16..24].try_into().ok()?);
        if ino == 0 {
            return None;
        }
        Some(Handle { export_id, ino, generation })
    }
}

/// Stable identifier of an export, derived from its normalised path.
pub(crate) fn export_id(path: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h ^ (h >> 32)) as u32
}

/// Directory cookie of an entry name: stable across restarts, never 0 (the start).
pub(crate) fn cookie_of(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | (1 << 63)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_round_trips_and_rejects_foreign_bytes() {
        let h = Handle { export_id: export_id("/"), ino: 42, generation: 0xdead_beef_0102_0304 };
        let b = h.encode();
        assert_eq!(Handle::decode(&b), Some(h));
        let mut bad = b.clone();
        bad[0] = b'X';
        assert_eq!(Handle::decode(&bad), None);
        assert_eq!(Handle::decode(&b[..23]), None);
        let mut zero = b.clone();
        zero[8..16].copy_from_slice(&0u64.to_be_bytes());
        assert_eq!(Handle::decode(&zero), None);
    }

    #[test]
    fn cookies_are_never_zero_and_differ_by_name() {
        assert_ne!(cookie_of(b""), 0);
        assert_ne!(cookie_of(b"a"), cookie_of(b"b"));
    }
}
