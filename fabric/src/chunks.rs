//! Content-defined chunks: FastCDC boundaries, BLAKE3 names, zstd on the wire.
//!
//! A file is described by its manifest: the list of its chunks in order, each with offset,
//! length and BLAKE3 hash. The same bytes anywhere (another version of a checkpoint, another
//! file) give the same chunk, so a spoke that holds a chunk never fetches it again.

use serde::{Deserialize, Serialize};

/// Smallest chunk FastCDC cuts (except a file's last chunk).
pub const CHUNK_BYTES_MIN: u32 = 16 * 1024;
/// Average chunk size FastCDC aims for.
pub const CHUNK_BYTES_AVG: u32 = 64 * 1024;
/// Largest chunk.
pub const CHUNK_BYTES_MAX: u32 = 256 * 1024;

pub type Hash = [u8; 32];

/// One chunk of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub offset: u64,
    pub len: u32,
    pub hash: Hash,
}

impl ChunkRef {
    pub fn end(&self) -> u64 {
        self.offset + self.len as u64
    }
}

/// Cuts `data` (which starts at file offset `base`) into chunks.
pub fn chunk(data: &[u8], base: u64) -> Vec<ChunkRef> {
    if data.is_empty() {
        return Vec::new();
    }
    fastcdc::v2020::FastCDC::new(data, CHUNK_BYTES_MIN, CHUNK_BYTES_AVG, CHUNK_BYTES_MAX)
        .map(|c| ChunkRef {
            offset: base + c.offset as u64,
            len: c.length as u32,
            hash: *blake3::hash(&data[c.offset..c.offset + c.length]).as_bytes(),
        })
        .collect()
}

/// Incremental chunking of a file read in pieces: feed consecutive pieces, get chunks whose
/// boundaries are exactly those of [`chunk`] over the whole file.
pub struct Chunker {
    pending: Vec<u8>,
    base: u64,
    pub chunks: Vec<ChunkRef>,
}

impl Default for Chunker {
    fn default() -> Self {
        Chunker { pending: Vec::new(), base: 0, chunks: Vec::new() }
    }
}

impl Chunker {
    pub fn feed(&mut self, piece: &[u8]) {
        self.pending.extend_from_slice(piece);
        // Everything but the last chunk cut from the pending bytes is final once more than
        // CHUNK_BYTES_MAX bytes follow it: FastCDC never looks further ahead than that.
        if self.pending.len() < 4 * CHUNK_BYTES_MAX as usize {
            return;
        }
        let cut = chunk(&self.pending, self.base);
        let keep_from = self.pending.len() - CHUNK_BYTES_MAX as usize;
        let mut done = 0usize;
        for c in cut {
            let end = (c.end() - self.base) as usize;
            if end > keep_from {
                break;
            }
            done = end;
            self.chunks.push(c);
        }
        self.pending.drain(..done);
        self.base += done as u64;
    }

    pub fn finish(mut self) -> Vec<ChunkRef> {
        let rest = chunk(&self.pending, self.base);
        self.chunks.extend(rest);
        self.chunks
    }
}

/// Wire encoding of a chunk: a tag byte, then the bytes.
const WIRE_RAW: u8 = 0;
const WIRE_ZSTD: u8 = 1;

/// Encodes a chunk for the wire: zstd when that saves at least 3 %, else the raw bytes (so
/// incompressible data such as shuffled samples or checkpoints costs no decompression).
pub fn compress(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; 1 + zstd_safe::compress_bound(data.len())];
    let n = zstd_safe::compress(&mut out[1..], data, 1).expect("zstd compression into a buffer of the bound's size");
    if n < data.len() - data.len() / 32 {
        out[0] = WIRE_ZSTD;
        out.truncate(1 + n);
        out
    } else {
        let mut raw = Vec::with_capacity(1 + data.len());
        raw.push(WIRE_RAW);
        raw.extend_from_slice(data);
        raw
    }
}

/// Decodes a chunk from the wire, refusing anything that would exceed `len` bytes or whose
/// BLAKE3 hash is not `hash`.
pub fn decompress_checked(wire: &[u8], len: u32, hash: &Hash) -> Result<Vec<u8>, String> {
    if len > CHUNK_BYTES_MAX {
        return Err(format!("chunk of {len} bytes is over the {CHUNK_BYTES_MAX}-byte maximum"));
    }
    let data = match wire.split_first() {
        Some((&WIRE_RAW, raw)) => raw.to_vec(),
        Some((&WIRE_ZSTD, z)) => {
            let mut data = vec![0u8; len as usize];
            let n = zstd_safe::decompress(&mut data[..], z)
                .map_err(|code| format!("chunk does not decompress: {}", zstd_safe::get_error_name(code)))?;
            data.truncate(n);
            data
        }
        Some((t, _)) => return Err(format!("unknown chunk encoding {t}")),
        None => return Err("empty chunk encoding".into()),
    };
    if data.len() != len as usize {
        return Err(format!("chunk decoded to {} bytes, expected {len}", data.len()));
    }
    if blake3::hash(&data).as_bytes() != hash {
        return Err("chunk content does not match its BLAKE3 name".into());
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn data(n: usize, seed: u64) -> Vec<u8> {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| r.random()).collect()
    }

    #[test]
    fn incremental_chunking_matches_whole_file_chunking() {
        let d = data(3 * 1024 * 1024 + 12345, 1);
        let whole = chunk(&d, 0);
        for piece in [1000usize, 65536, 1 << 20] {
            let mut c = Chunker::default();
            for p in d.chunks(piece) {
                c.feed(p);
            }
            assert_eq!(c.finish(), whole, "piece size {piece}");
        }
        let total: u64 = whole.iter().map(|c| c.len as u64).sum();
        assert_eq!(total, d.len() as u64);
        assert!(whole.iter().all(|c| c.len <= CHUNK_BYTES_MAX));
    }

    #[test]
    fn a_local_change_keeps_most_chunks() {
        let a = data(4 * 1024 * 1024, 2);
        let mut b = a.clone();
        for x in &mut b[2_000_000..2_100_000] {
            *x ^= 0x5a;
        }
        let ca: std::collections::HashSet<Hash> = chunk(&a, 0).iter().map(|c| c.hash).collect();
        let cb = chunk(&b, 0);
        let new: u64 = cb.iter().filter(|c| !ca.contains(&c.hash)).map(|c| c.len as u64).sum();
        assert!(new < 600_000, "{new} bytes of new chunks for a 100 KB change");
    }

    #[test]
    fn decompression_checks_size_and_name() {
        let d = data(100_000, 3);
        let h = *blake3::hash(&d).as_bytes();
        let w = compress(&d);
        assert_eq!(decompress_checked(&w, 100_000, &h).unwrap(), d);
        assert!(decompress_checked(&w, 99_999, &h).is_err());
        assert!(decompress_checked(&w, 100_000, &[0; 32]).is_err());
        assert!(decompress_checked(b"garbage", 100, &h).is_err());
        assert!(decompress_checked(&w, CHUNK_BYTES_MAX + 1, &h).is_err());
        assert!(decompress_checked(&[], 0, &h).is_err());
        assert!(decompress_checked(&[9, 1, 2], 2, &h).is_err());
        // Random bytes go raw; repetitive ones compressed; both decode.
        assert_eq!(w[0], WIRE_RAW);
        let zeros = vec![0u8; 100_000];
        let z = compress(&zeros);
        assert_eq!(z[0], WIRE_ZSTD);
        assert!(z.len() < 1000);
        assert_eq!(decompress_checked(&z, 100_000, blake3::hash(&zeros).as_bytes()).unwrap(), zeros);
        let mut bomb = z.clone();
        bomb[0] = WIRE_ZSTD;
        assert!(decompress_checked(&bomb, 10, blake3::hash(&zeros[..10]).as_bytes()).is_err());
    }
}
