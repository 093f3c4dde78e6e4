//! Reed–Solomon erasure coding for Aquifer stripes (DESIGN.md §3.3).
//!
//! A stripe is `k` data shards followed by `m` parity shards, all of one length. Any `k` of the
//! `k + m` shards rebuild the rest. The arithmetic is reed-solomon-erasure's GF(2^8) code (field
//! polynomial 0x11D, systematic matrix derived from a Vandermonde matrix); the parity bytes it
//! produces are part of Aquifer's on-disk format, which is why the tests below recompute them
//! with an independent reference implementation: a library upgrade that changed the matrix would
//! make existing stripes undecodable, and must fail the build rather than reach a drive.
//!
//! Work is done in column chunks of `CHUNK_BYTES`: byte `i` of every parity shard depends only
//! on byte `i` of the data shards, so a stripe can be coded a slice of columns at a time. Coding
//! 1 MiB shards whole streams every data shard through the cache once per parity shard; coding
//! them in chunks keeps the chunk of every shard in L1/L2 while all parity rows are computed.
//! See docs/ec-benchmark.md for the numbers.

use std::fmt;
use std::sync::Arc;

use reed_solomon_erasure::galois_8::ReedSolomon;

/// Most shards (data + parity) one stripe may have.
pub const SHARDS_MAX: usize = 32;

/// Width of the column chunk coded at a time, in bytes per shard. At 8+3 this is 11 × 32 KiB of
/// live data, which fits the 512 KiB L2 of the machines Aquifer is measured on.
const CHUNK_BYTES: usize = 32 * 1024;

/// Errors of the erasure-coding layer. Each is an operating condition (bad geometry from a
/// configuration, shards lost or truncated on a drive), never a bug.
#[derive(Debug, thiserror::Error)]
pub enum EcError {
    /// The requested k+m, or the number of shards passed, does not fit the code.
    #[error("invalid erasure-code geometry: {0}")]
    Geometry(String),
    /// Fewer than `k` shards survive, so the stripe cannot be rebuilt.
    #[error("too few shards to rebuild the stripe: {present} present, {needed} needed")]
    TooFewShards { present: usize, needed: usize },
    /// Shards of one stripe differ in length, or are empty.
    #[error("invalid shard length: {0}")]
    ShardLength(String),
}

/// Reed–Solomon over GF(2^8) with k data and m parity shards; all shards equal length.
///
/// Cheap to clone: clones share the coding matrix and its cache of decode matrices.
#[derive(Clone)]
pub struct Codec {
    rs: Arc<ReedSolomon>,
}

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codec")
            .field("data_shards", &self.data_shards())
            .field("parity_shards", &self.parity_shards())
            .finish()
    }
}

impl Codec {
    /// A codec for `data_shards` + `parity_shards`; requires 1 ≤ k, 1 ≤ m, k + m ≤ 32.
    pub fn new(data_shards: usize, parity_shards: usize) -> Result<Codec, EcError> {
        if data_shards == 0 || parity_shards == 0 {
            return Err(EcError::Geometry(format!(
                "{data_shards}+{parity_shards}: need at least one data and one parity shard"
            )));
        }
        if data_shards + parity_shards > SHARDS_MAX {
            return Err(EcError::Geometry(format!(
                "{data_shards}+{parity_shards}: at most {SHARDS_MAX} shards per stripe"
            )));
        }
        let rs = ReedSolomon::new(data_shards, parity_shards).map_err(|error| {
            EcError::Geometry(format!("{data_shards}+{parity_shards}: {error:?}"))
        })?;
        Ok(Codec { rs: Arc::new(rs) })
    }

    pub fn data_shards(&self) -> usize {
        self.rs.data_shard_count()
    }

    pub fn parity_shards(&self) -> usize {
        self.rs.parity_shard_count()
    }

    fn total_shards(&self) -> usize {
        self.rs.total_shard_count()
    }

    fn check_count(&self, count: usize) -> Result<(), EcError> {
        if count != self.total_shards() {
            return Err(EcError::Geometry(format!(
                "{}+{} stripe given {count} shards",
                self.data_shards(),
                self.parity_shards()
            )));
        }
        Ok(())
    }

    /// The common length of `lengths`, which must all be equal and non-zero.
    fn common_length(lengths: impl Iterator<Item = (usize, usize)>) -> Result<usize, EcError> {
        let mut common: Option<(usize, usize)> = None;
        for (index, length) in lengths {
            if length == 0 {
                return Err(EcError::ShardLength(format!("shard {index} is empty")));
            }
            match common {
                None => common = Some((index, length)),
                Some((first, first_length)) if first_length != length => {
                    return Err(EcError::ShardLength(format!(
                        "shard {first} has {first_length} bytes but shard {index} has {length}"
                    )));
                }
                Some(_) => {}
            }
        }
        common
            .map(|(_, length)| length)
            .ok_or_else(|| EcError::ShardLength("no shard present".to_string()))
    }

    /// `shards.len() == k+m`; the first k hold data; fills the m parity shards.
    pub fn encode(&self, shards: &mut [&mut [u8]]) -> Result<(), EcError> {
        self.check_count(shards.len())?;
        let (data, parity) = shards.split_at_mut(self.data_shards());
        let data: Vec<&[u8]> = data.iter().map(|s| &s[..]).collect();
        self.encode_sep(&data, parity)
    }

    /// Fills the m `parity` shards from the k `data` shards, which it only reads (they may be
    /// shared, e.g. views of the buffer a stripe's data was collected in).
    pub fn encode_sep(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<(), EcError> {
        self.check_count(data.len() + parity.len())?;
        if data.len() != self.data_shards() {
            return Err(EcError::Geometry(format!("{}+{} stripe given {} data shards", self.data_shards(), self.parity_shards(), data.len())));
        }
        let length = Self::common_length(data.iter().map(|s| s.len()).chain(parity.iter().map(|s| s.len())).enumerate())?;
        let mut data_chunks: Vec<_> = data.iter().map(|s| s.chunks(CHUNK_BYTES)).collect();
        let mut parity_chunks: Vec<_> = parity
            .iter_mut()
            .map(|s| s.chunks_mut(CHUNK_BYTES))
            .collect();
        for _ in 0..length.div_ceil(CHUNK_BYTES) {
            let data: Vec<&[u8]> = data_chunks.iter_mut().map(next_chunk).collect();
            let mut parity: Vec<&mut [u8]> = parity_chunks.iter_mut().map(next_chunk).collect();
            // Counts and lengths were checked above, so the library has nothing to refuse.
            self.rs
                .encode_sep(&data, &mut parity)
                .expect("encode of a checked stripe");
        }
        Ok(())
    }

    /// Rebuild every missing (None) shard, data and parity, from any k present ones.
    ///
    /// On error the shards are left as they were.
    pub fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        self.reconstruct_inner(shards, false)
    }

    /// Rebuild only missing data shards (cheaper when parity is not needed). Missing parity
    /// shards stay `None`.
    ///
    /// On error the shards are left as they were.
    pub fn reconstruct_data(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        self.reconstruct_inner(shards, true)
    }

    fn reconstruct_inner(
        &self,
        shards: &mut [Option<Vec<u8>>],
        data_only: bool,
    ) -> Result<(), EcError> {
        self.check_count(shards.len())?;
        let k = self.data_shards();
        let present: Vec<bool> = shards.iter().map(Option::is_some).collect();
        let present_count = present.iter().filter(|&&p| p).count();
        if present_count < k {
            return Err(EcError::TooFewShards {
                present: present_count,
                needed: k,
            });
        }
        let length = Self::common_length(
            shards
                .iter()
                .enumerate()
                .filter_map(|(index, shard)| shard.as_ref().map(|s| (index, s.len()))),
        )?;
        let wanted = if data_only { k } else { shards.len() };
        if present[..wanted].iter().all(|&p| p) {
            return Ok(());
        }
        for shard in shards[..wanted].iter_mut().filter(|s| s.is_none()) {
            *shard = Some(vec![0; length]);
        }

        // A missing parity shard that `reconstruct_data` leaves alone is handed to the library
        // as an empty slice marked absent; it is never written.
        let mut chunks: Vec<_> = shards
            .iter_mut()
            .map(|s| s.as_deref_mut().unwrap_or(&mut []).chunks_mut(CHUNK_BYTES))
            .collect();
        for _ in 0..length.div_ceil(CHUNK_BYTES) {
            let mut columns: Vec<(&mut [u8], bool)> = chunks
                .iter_mut()
                .zip(&present)
                .map(|(chunk, &p)| (chunk.next().unwrap_or(&mut []), p))
                .collect();
            let result = if data_only {
                self.rs.reconstruct_data(&mut columns)
            } else {
                self.rs.reconstruct(&mut columns)
            };
            // Every precondition the library checks was checked above.
            result.expect("reconstruct of a checked stripe");
        }
        Ok(())
    }

    /// True when the parity matches the data (used by scrub).
    pub fn verify(&self, shards: &[&[u8]]) -> Result<bool, EcError> {
        self.check_count(shards.len())?;
        let length = Self::common_length(shards.iter().map(|s| s.len()).enumerate())?;
        let mut chunks: Vec<_> = shards.iter().map(|s| s.chunks(CHUNK_BYTES)).collect();
        let mut buffer = vec![vec![0u8; CHUNK_BYTES.min(length)]; self.parity_shards()];
        for _ in 0..length.div_ceil(CHUNK_BYTES) {
            let columns: Vec<&[u8]> = chunks.iter_mut().map(next_chunk).collect();
            let width = columns[0].len();
            let mut scratch: Vec<&mut [u8]> = buffer.iter_mut().map(|b| &mut b[..width]).collect();
            let matches = self
                .rs
                .verify_with_buffer(&columns, &mut scratch)
                .expect("verify of a checked stripe");
            if !matches {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The next chunk of a shard whose length was checked to cover every chunk index.
fn next_chunk<T>(chunks: &mut impl Iterator<Item = T>) -> T {
    chunks
        .next()
        .expect("shards of a checked stripe have equal length")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes, so a failure replays.
    fn pseudo_random(seed: u64, length: usize) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..length)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    fn encoded_stripe(codec: &Codec, length: usize, seed: u64) -> Vec<Vec<u8>> {
        let k = codec.data_shards();
        let mut stripe: Vec<Vec<u8>> = (0..k)
            .map(|i| pseudo_random(seed * 64 + i as u64, length))
            .chain((0..codec.parity_shards()).map(|_| vec![0; length]))
            .collect();
        let mut refs: Vec<&mut [u8]> = stripe.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(&mut refs).unwrap();
        stripe
    }

    fn as_slices(stripe: &[Vec<u8>]) -> Vec<&[u8]> {
        stripe.iter().map(Vec::as_slice).collect()
    }

    /// Every subset of `0..n` with at most `size_max` members.
    fn subsets(n: usize, size_max: usize) -> Vec<Vec<usize>> {
        (0u64..1 << n)
            .filter(|mask| mask.count_ones() as usize <= size_max)
            .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect())
            .collect()
    }

    /// Lengths that are shorter than, equal to, and not a multiple of the chunk width.
    const LENGTHS: [usize; 4] = [1, 1000, CHUNK_BYTES, 2 * CHUNK_BYTES + 77];

    fn round_trips(k: usize, m: usize) {
        let codec = Codec::new(k, m).unwrap();
        assert_eq!((codec.data_shards(), codec.parity_shards()), (k, m));
        for (seed, &length) in LENGTHS.iter().enumerate() {
            let stripe = encoded_stripe(&codec, length, seed as u64);
            assert!(codec.verify(&as_slices(&stripe)).unwrap());
            for lost in subsets(k + m, m) {
                let mut shards: Vec<Option<Vec<u8>>> = stripe.iter().cloned().map(Some).collect();
                for &i in &lost {
                    shards[i] = None;
                }
                let mut data_only = shards.clone();

                codec.reconstruct(&mut shards).unwrap();
                let rebuilt: Vec<Vec<u8>> = shards.into_iter().map(Option::unwrap).collect();
                assert_eq!(rebuilt, stripe, "{k}+{m} len {length} lost {lost:?}");

                codec.reconstruct_data(&mut data_only).unwrap();
                for (i, shard) in data_only.iter().enumerate() {
                    if i < k {
                        assert_eq!(shard.as_ref(), Some(&stripe[i]), "{k}+{m} lost {lost:?}");
                    } else if lost.contains(&i) {
                        assert!(shard.is_none(), "parity {i} should stay missing");
                    } else {
                        assert_eq!(shard.as_ref(), Some(&stripe[i]));
                    }
                }
            }
        }
    }

    #[test]
    fn round_trip_4_2() {
        round_trips(4, 2);
    }

    #[test]
    fn round_trip_8_3() {
        round_trips(8, 3);
    }

    #[test]
    fn round_trip_1_1() {
        round_trips(1, 1);
    }

    #[test]
    fn round_trip_10_4() {
        round_trips(10, 4);
    }

    #[test]
    fn geometry_is_checked() {
        for (k, m) in [(0, 2), (4, 0), (0, 0), (30, 3), (1, 32)] {
            assert!(
                matches!(Codec::new(k, m), Err(EcError::Geometry(_))),
                "{k}+{m}"
            );
        }
        assert!(Codec::new(31, 1).is_ok());
        assert!(Codec::new(16, 16).is_ok());

        let codec = Codec::new(4, 2).unwrap();
        let mut stripe = vec![vec![0u8; 64]; 5];
        let mut refs: Vec<&mut [u8]> = stripe.iter_mut().map(Vec::as_mut_slice).collect();
        assert!(matches!(codec.encode(&mut refs), Err(EcError::Geometry(_))));
        let mut shards = vec![Some(vec![0u8; 64]); 7];
        assert!(matches!(
            codec.reconstruct(&mut shards),
            Err(EcError::Geometry(_))
        ));
        assert!(matches!(
            codec.verify(&[&[0u8; 64][..]; 5]),
            Err(EcError::Geometry(_))
        ));
    }

    #[test]
    fn too_few_shards() {
        for (k, m) in [(4, 2), (8, 3), (1, 1)] {
            let codec = Codec::new(k, m).unwrap();
            let stripe = encoded_stripe(&codec, 4096, 7);
            let mut shards: Vec<Option<Vec<u8>>> = stripe.into_iter().map(Some).collect();
            // Lose m + 1: one more than the code can bear, data and parity mixed.
            for i in (0..k + m)
                .step_by(2)
                .chain((1..k + m).step_by(2))
                .take(m + 1)
            {
                shards[i] = None;
            }
            let before = shards.clone();
            let error = codec.reconstruct(&mut shards).unwrap_err();
            assert!(
                matches!(error, EcError::TooFewShards { present, needed }
                    if present == k - 1 && needed == k),
                "{k}+{m}: {error}"
            );
            assert!(matches!(
                codec.reconstruct_data(&mut shards),
                Err(EcError::TooFewShards { .. })
            ));
            assert_eq!(
                shards, before,
                "a failed rebuild leaves the shards untouched"
            );
        }
    }

    #[test]
    fn mismatched_lengths() {
        let codec = Codec::new(4, 2).unwrap();
        let mut stripe = vec![vec![0u8; 4096]; 6];
        stripe[2].truncate(4095);
        let mut refs: Vec<&mut [u8]> = stripe.iter_mut().map(Vec::as_mut_slice).collect();
        assert!(matches!(
            codec.encode(&mut refs),
            Err(EcError::ShardLength(_))
        ));
        assert!(matches!(
            codec.verify(&as_slices(&stripe)),
            Err(EcError::ShardLength(_))
        ));

        let mut shards: Vec<Option<Vec<u8>>> = stripe.iter().cloned().map(Some).collect();
        shards[0] = None;
        let before = shards.clone();
        assert!(matches!(
            codec.reconstruct(&mut shards),
            Err(EcError::ShardLength(_))
        ));
        assert!(matches!(
            codec.reconstruct_data(&mut shards),
            Err(EcError::ShardLength(_))
        ));
        assert_eq!(
            shards, before,
            "a failed rebuild leaves the shards untouched"
        );

        let mut empty = vec![vec![]; 6];
        let mut refs: Vec<&mut [u8]> = empty.iter_mut().map(Vec::as_mut_slice).collect();
        assert!(matches!(
            codec.encode(&mut refs),
            Err(EcError::ShardLength(_))
        ));
    }

    #[test]
    fn verify_detects_a_flipped_byte() {
        let codec = Codec::new(8, 3).unwrap();
        let length = 2 * CHUNK_BYTES + 77;
        let stripe = encoded_stripe(&codec, length, 3);
        assert!(codec.verify(&as_slices(&stripe)).unwrap());
        // Every shard, and positions in the first, a middle and the short last chunk.
        for shard in 0..11 {
            for position in [0, CHUNK_BYTES + 5, length - 1] {
                let mut damaged = stripe.clone();
                damaged[shard][position] ^= 0x10;
                assert!(
                    !codec.verify(&as_slices(&damaged)).unwrap(),
                    "flip in shard {shard} at {position} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn chunked_coding_equals_whole_shard_coding() {
        for (k, m) in [(4, 2), (8, 3)] {
            let codec = Codec::new(k, m).unwrap();
            let length = 3 * CHUNK_BYTES + 1234;
            let ours = encoded_stripe(&codec, length, 11);
            let mut whole = ours.clone();
            for parity in &mut whole[k..] {
                parity.fill(0);
            }
            ReedSolomon::new(k, m).unwrap().encode(&mut whole).unwrap();
            assert_eq!(ours, whole);
        }
    }

    #[test]
    fn codec_is_shareable() {
        fn send_sync_clone<T: Send + Sync + Clone + 'static>() {}
        send_sync_clone::<Codec>();
        let codec = Codec::new(4, 2).unwrap();
        let stripe = encoded_stripe(&codec, 4096, 5);
        let handles: Vec<_> = (0..2)
            .map(|lost| {
                let codec = codec.clone();
                let stripe = stripe.clone();
                std::thread::spawn(move || {
                    let mut shards: Vec<Option<Vec<u8>>> =
                        stripe.iter().cloned().map(Some).collect();
                    shards[lost] = None;
                    shards[4 + lost] = None;
                    codec.reconstruct(&mut shards).unwrap();
                    shards.into_iter().map(Option::unwrap).collect::<Vec<_>>() == stripe
                })
            })
            .collect();
        for handle in handles {
            assert!(handle.join().unwrap());
        }
    }

    /// GF(2^8) with polynomial x^8 + x^4 + x^3 + x^2 + 1, written out independently of the
    /// library so that the parity format is pinned by arithmetic rather than by the library.
    mod reference {
        pub fn mul(mut a: u8, mut b: u8) -> u8 {
            let mut product = 0u8;
            while b != 0 {
                if b & 1 != 0 {
                    product ^= a;
                }
                let carry = a & 0x80 != 0;
                a <<= 1;
                if carry {
                    a ^= 0x1D;
                }
                b >>= 1;
            }
            product
        }

        pub fn inverse(a: u8) -> u8 {
            assert_ne!(a, 0);
            (1..=255u8).find(|&b| mul(a, b) == 1).unwrap()
        }

        fn pow(a: u8, n: usize) -> u8 {
            (0..n).fold(1, |acc, _| mul(acc, a))
        }

        fn invert(mut matrix: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
            let n = matrix.len();
            let mut result: Vec<Vec<u8>> = (0..n)
                .map(|r| (0..n).map(|c| u8::from(r == c)).collect())
                .collect();
            for col in 0..n {
                let pivot = (col..n).find(|&r| matrix[r][col] != 0).expect("singular");
                matrix.swap(col, pivot);
                result.swap(col, pivot);
                let scale = inverse(matrix[col][col]);
                for c in 0..n {
                    matrix[col][c] = mul(matrix[col][c], scale);
                    result[col][c] = mul(result[col][c], scale);
                }
                for r in (0..n).filter(|&r| r != col) {
                    let factor = matrix[r][col];
                    for c in 0..n {
                        matrix[r][c] ^= mul(factor, matrix[col][c]);
                        result[r][c] ^= mul(factor, result[col][c]);
                    }
                }
            }
            result
        }

        /// Rows k..k+m of V · V_top⁻¹, where V[r][c] = r^c.
        pub fn parity_matrix(k: usize, m: usize) -> Vec<Vec<u8>> {
            let vandermonde: Vec<Vec<u8>> = (0..k + m)
                .map(|r| (0..k).map(|c| pow(r as u8, c)).collect())
                .collect();
            let top_inverse = invert(vandermonde[..k].to_vec());
            vandermonde[k..]
                .iter()
                .map(|row| {
                    (0..k)
                        .map(|c| (0..k).fold(0, |acc, i| acc ^ mul(row[i], top_inverse[i][c])))
                        .collect()
                })
                .collect()
        }
    }

    #[test]
    fn parity_matches_reference_arithmetic() {
        assert_eq!(reference::mul(0x80, 2), 0x1D);
        assert_eq!(reference::mul(0x53, reference::inverse(0x53)), 1);
        for (k, m) in [(1, 1), (4, 2), (8, 3), (10, 4)] {
            let codec = Codec::new(k, m).unwrap();
            let stripe = encoded_stripe(&codec, 2 * CHUNK_BYTES + 300, 13);
            let matrix = reference::parity_matrix(k, m);
            for (p, row) in matrix.iter().enumerate() {
                for column in (0..stripe[0].len()).step_by(97) {
                    let expected =
                        (0..k).fold(0, |acc, d| acc ^ reference::mul(row[d], stripe[d][column]));
                    assert_eq!(
                        stripe[k + p][column],
                        expected,
                        "{k}+{m} parity {p} col {column}"
                    );
                }
            }
        }
    }

    /// reed-solomon-simd uses a different code (so its parity differs from ours), but both must
    /// recover the same data from the same losses.
    #[test]
    fn recovers_the_same_data_as_reed_solomon_simd() {
        for (k, m) in [(4, 2), (8, 3), (10, 4)] {
            let codec = Codec::new(k, m).unwrap();
            let length = CHUNK_BYTES + 64;
            let stripe = encoded_stripe(&codec, length, 17);
            let data = &stripe[..k];
            let simd_parity = reed_solomon_simd::encode(k, m, data).unwrap();
            assert_eq!(simd_parity.len(), m);

            // Lose the first m data shards in both codes.
            let mut shards: Vec<Option<Vec<u8>>> = stripe.iter().cloned().map(Some).collect();
            for shard in &mut shards[..m.min(k)] {
                *shard = None;
            }
            codec.reconstruct_data(&mut shards).unwrap();

            let survivors = (m.min(k)..k).map(|i| (i, &data[i]));
            let restored =
                reed_solomon_simd::decode(k, m, survivors, simd_parity.iter().enumerate()).unwrap();
            for i in 0..m.min(k) {
                let ours = shards[i].as_ref().unwrap();
                assert_eq!(ours, &data[i], "{k}+{m}: Aquifer lost data shard {i}");
                assert_eq!(&restored[&i], ours, "{k}+{m}: codecs disagree on shard {i}");
            }
        }
    }
}
