//! Fuzzes the fabric's wire format (fabric/src/proto.rs and fabric/src/chunks.rs, compiled
//! here unchanged): the input is one frame's body as a hub or a spoke reads it off a TLS
//! connection from a peer it does not trust yet (the length prefix is checked before, in
//! conn.rs). Decoding must refuse or succeed without a panic or an allocation past the
//! frame's own size; a frame that decodes encodes back to exactly its bytes (bincode with
//! fixed-width integers and no trailing bytes reads one encoding of each frame, so what the
//! receiver acts on is what was sent); and the checks each side makes first on what it
//! received run on it: paths and names, and the chunk data a Put or a chunk reply carries,
//! decoded against the length and BLAKE3 name given, never past `CHUNK_BYTES_MAX`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../src/chunks.rs"]
#[allow(dead_code)]
mod chunks;
#[path = "../../src/proto.rs"]
#[allow(dead_code)]
mod proto;

use chunks::{CHUNK_BYTES_MAX, ChunkRef, decompress_checked};
use proto::*;

fuzz_target!(|data: &[u8]| {
    let Ok(frame) = decode(data) else { return };
    let again = encode(&frame);
    assert_eq!(u32::from_be_bytes(again[..4].try_into().expect("a length")) as usize, data.len(), "length prefix");
    assert_eq!(&again[4..], data, "a frame that decodes encodes back to other bytes");
    match &frame {
        Frame::Request { body, .. } => request(body),
        Frame::Response { body, .. } => response(body),
        Frame::Invalidate { .. } => {}
    }
});

fn path(p: &RelPath) {
    if check_path(p).is_ok() {
        let joined = join_path(p);
        assert_eq!(&split_path(&joined), p, "a checked path splits back into its names");
    }
}

/// A checked name is one path component: it splits back into itself.
fn name(n: &[u8]) {
    if check_name(n).is_ok() {
        assert_eq!(split_path(n), vec![n.to_vec()], "{n:?} passed");
    }
}

/// A chunk decoded as the receiver decodes it: the bytes, exactly `c.len` of them, named
/// `c.hash`, or an error.
fn chunk(wire: &[u8], c: &ChunkRef) {
    if let Ok(bytes) = decompress_checked(wire, c.len, &c.hash) {
        assert!(c.len <= CHUNK_BYTES_MAX && bytes.len() == c.len as usize);
        assert_eq!(blake3::hash(&bytes).as_bytes(), &c.hash);
    }
}

fn request(r: &Request) {
    match r {
        Request::GetAttr { path: p } | Request::List { path: p, .. } | Request::Manifest { path: p, .. } | Request::Chunks { path: p, .. } | Request::Whole { path: p, .. } => path(p),
        Request::Put { path: p, name: n, chunks, data, .. } => {
            path(p);
            name(n);
            for (hash, wire) in data {
                for c in chunks.iter().filter(|c| c.hash == *hash).take(1) {
                    chunk(wire, c);
                }
            }
        }
        Request::Mkdir { path: p, name: n, .. } | Request::Remove { path: p, name: n, .. } => {
            path(p);
            name(n);
        }
        Request::Rename { from, from_name, to, to_name } => {
            path(from);
            path(to);
            name(from_name);
            name(to_name);
        }
        Request::Hello { .. } | Request::Propose { .. } | Request::Status { .. } | Request::Withdraw { .. } | Request::Renew => {}
    }
}

fn response(r: &Response) {
    match r {
        Response::Whole { chunks, data, .. } => {
            for (c, wire) in chunks.iter().zip(data) {
                chunk(wire, c);
            }
        }
        // The spoke pairs a chunk reply with the references it asked for; any length will
        // do to reach the decoder.
        Response::Chunks { data, .. } => {
            for wire in data {
                chunk(wire, &ChunkRef { offset: 0, len: CHUNK_BYTES_MAX, hash: [0; 32] });
            }
        }
        Response::Listing { entries, .. } => {
            for (n, _) in entries {
                name(n);
            }
        }
        _ => {}
    }
}
