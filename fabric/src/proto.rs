//! The fabric wire protocol (docs/formats/fabric.md).
//!
//! One TLS connection per portal carries frames: a 4-byte big-endian length, then a
//! bincode-encoded [`Frame`]. Requests carry an id chosen by the sender and are answered by a
//! response with the same id, in any order, so many requests are in flight at once; pushes
//! (invalidations) have id 0. Everything that arrives is untrusted: lengths are bounded before
//! anything is allocated, decoding is bounded by [`FRAME_BYTES_MAX`], and every path is
//! checked component by component before the hub resolves it.

use serde::{Deserialize, Serialize};

use crate::chunks::{ChunkRef, Hash};

/// Protocol version spoken in [`Request::Hello`].
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest frame, length prefix excluded.
pub const FRAME_BYTES_MAX: u32 = 64 << 20;
/// Most entries one listing response carries.
pub const LIST_ENTRIES_MAX: u32 = 4096;
/// Largest file a `Whole` request may fetch.
pub const WHOLE_FILE_BYTES_MAX: u64 = 4 << 20;
/// Most chunk bytes (uncompressed) one chunk request may ask for.
pub const CHUNK_REQUEST_BYTES_MAX: u64 = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Frame {
    Request { id: u64, body: Request },
    Response { id: u64, body: Response },
    /// Hub → spoke, unsolicited: these hub inodes changed (new version given).
    Invalidate { changes: Vec<(u64, u64)> },
}

/// A path below the portal root, as names (no `/`, `.`, `..`, NUL, empty).
pub type RelPath = Vec<Vec<u8>>;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Request {
    /// First request of a spoke on a connection.
    Hello { version: u32, portal: String },
    /// A spoke proposes a portal to the hub (the connection's client certificate is the
    /// spoke's identity, pinned when the hub's admin authorizes).
    Propose { portal: String, hub_path: String, spoke_path: String, mode: PortalMode, spoke_region: String, spoke_name: String },
    /// A spoke asks how its proposal stands.
    Status { portal: String },
    /// The spoke tells the hub it deleted the portal.
    Withdraw { portal: String },
    /// Extends the lease (the reply says for how long, from when the request was sent).
    Renew,
    GetAttr { path: RelPath },
    List { path: RelPath, cursor: Option<Vec<u8>>, max: u32 },
    Manifest { path: RelPath, hub_ino: u64 },
    Chunks { path: RelPath, hub_ino: u64, version: u64, wanted: Vec<Hash> },
    /// A small file's manifest and all its chunks in one round trip (at most
    /// [`WHOLE_FILE_BYTES_MAX`]).
    Whole { path: RelPath, hub_ino: u64 },
    /// Read-write portals: replace (or create) file `name` in directory `path` with content
    /// described by `chunks`; `data` carries the chunks the hub said it lacks (zstd).
    Put { path: RelPath, name: Vec<u8>, size: u64, chunks: Vec<ChunkRef>, data: Vec<(Hash, Vec<u8>)> },
    Mkdir { path: RelPath, name: Vec<u8>, mode: u32 },
    Remove { path: RelPath, name: Vec<u8>, dir: bool },
    Rename { from: RelPath, from_name: Vec<u8>, to: RelPath, to_name: Vec<u8> },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum PortalMode {
    ReadOnly,
    ReadWrite,
}

impl PortalMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PortalMode::ReadOnly => "ro",
            PortalMode::ReadWrite => "rw",
        }
    }
    pub fn parse(s: &str) -> Option<PortalMode> {
        match s {
            "ro" => Some(PortalMode::ReadOnly),
            "rw" => Some(PortalMode::ReadWrite),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One inode as the hub describes it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    pub hub_ino: u64,
    pub kind: EntryKind,
    pub version: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub btime_ns: i64,
    /// Symlink target.
    pub target: Vec<u8>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Response {
    Ok,
    Welcome { hub_region: String, lease_ms: u64 },
    Proposed { state: String },
    Status { state: String, reason: String },
    Lease { lease_ms: u64 },
    Attr(Entry),
    Listing { dir: Entry, entries: Vec<(Vec<u8>, Entry)>, next: Option<Vec<u8>> },
    Manifest { version: u64, size: u64, chunks: Vec<ChunkRef> },
    /// zstd-compressed chunk contents, in the order asked.
    Chunks { version: u64, data: Vec<Vec<u8>> },
    /// Answer to `Whole`: the manifest and every chunk, encoded as in `Chunks`.
    Whole { version: u64, size: u64, chunks: Vec<ChunkRef>, data: Vec<Vec<u8>> },
    /// A Put must be repeated with these chunks' data.
    NeedChunks { missing: Vec<Hash> },
    Error { code: ErrorCode, message: String },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ErrorCode {
    NotFound,
    /// The inode at that path is not the one the spoke named (replaced or renamed): refetch.
    Stale,
    PermissionDenied,
    /// Refused by a residency label.
    Residency,
    NotAuthorized,
    BadRequest,
    ReadOnly,
    Exists,
    NotEmpty,
    Internal,
}

fn codec() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_limit(FRAME_BYTES_MAX as u64).with_fixint_encoding().reject_trailing_bytes()
}

pub fn encode(f: &Frame) -> Vec<u8> {
    use bincode::Options;
    let body = codec().serialize(f).expect("frames serialize");
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decodes one frame body (after its length prefix).
pub fn decode(body: &[u8]) -> Result<Frame, String> {
    use bincode::Options;
    if body.len() > FRAME_BYTES_MAX as usize {
        return Err(format!("frame of {} bytes is over the {FRAME_BYTES_MAX}-byte maximum", body.len()));
    }
    codec().deserialize(body).map_err(|e| format!("malformed frame: {e}"))
}

/// Checks a path from the wire: every name valid, not too deep.
pub fn check_path(p: &RelPath) -> Result<(), String> {
    if p.len() > 256 {
        return Err("path deeper than 256 names".into());
    }
    for n in p {
        check_name(n)?;
    }
    Ok(())
}

pub fn check_name(n: &[u8]) -> Result<(), String> {
    if n.is_empty() || n == b"." || n == b".." || n.contains(&b'/') || n.contains(&0) || n.len() > 255 {
        return Err(format!("invalid name {:?}", String::from_utf8_lossy(n)));
    }
    Ok(())
}

pub fn split_path(p: &[u8]) -> RelPath {
    p.split(|b| *b == b'/').filter(|c| !c.is_empty()).map(|c| c.to_vec()).collect()
}

pub fn join_path(p: &RelPath) -> Vec<u8> {
    p.join(&b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let f = Frame::Request { id: 7, body: Request::List { path: vec![b"a".to_vec()], cursor: None, max: 10 } };
        let enc = encode(&f);
        assert_eq!(u32::from_be_bytes(enc[..4].try_into().unwrap()) as usize, enc.len() - 4);
        assert_eq!(decode(&enc[4..]).unwrap(), f);
        for n in 0..enc.len() - 4 {
            assert!(decode(&enc[4..4 + n]).is_err());
        }
        // A vector claiming 2^60 elements must fail without allocating.
        let mut evil = vec![0u8; 4]; // Frame::Request
        evil.extend_from_slice(&1u64.to_le_bytes());
        evil.extend_from_slice(&5u32.to_le_bytes()); // Request::GetAttr
        evil.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(decode(&evil).is_err());
    }

    #[test]
    fn paths_are_checked() {
        assert!(check_path(&split_path(b"a/b/c")).is_ok());
        for bad in [&b".."[..], b".", b"", b"a\0b"] {
            assert!(check_path(&vec![bad.to_vec()]).is_err());
        }
        assert_eq!(join_path(&split_path(b"/a//b/")), b"a/b".to_vec());
    }
}
