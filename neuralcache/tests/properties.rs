//! Properties of the prefetcher under arbitrary event sequences, checked against a byte-level
//! model: requests stay inside the file, never overlap a range still outstanding, never ask
//! for the bytes of the read that caused them, and the byte accounting adds up.

use neuralcache::{AccessEvent, PrefetchConfig, Prefetcher};
use proptest::prelude::*;

const SIZES: [u64; 4] = [0, 1_500, 7_000, 200_000];

#[derive(Clone, Debug)]
enum Op {
    /// A read at an arbitrary offset (may run past the end of the file).
    Read { stream: u64, file: usize, offset: u64, len: u64 },
    /// A read where this stream's last read of the file ended (sequential).
    Next { stream: u64, file: usize, len: u64 },
    Done { file: usize, offset: u64, len: u64 },
    Evict { file: usize, offset: u64, len: u64 },
    Forget { file: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3u64, 0..4usize, 0..210_000u64, 0..5_000u64).prop_map(|(stream, file, offset, len)| Op::Read { stream, file, offset, len }),
        6 => (0..3u64, 0..4usize, 1..3_000u64).prop_map(|(stream, file, len)| Op::Next { stream, file, len }),
        2 => (0..4usize, 0..200_000u64, 0..50_000u64).prop_map(|(file, offset, len)| Op::Done { file, offset, len }),
        1 => (0..4usize, 0..200_000u64, 0..20_000u64).prop_map(|(file, offset, len)| Op::Evict { file, offset, len }),
        1 => (0..4usize).prop_map(|file| Op::Forget { file }),
    ]
}

fn clear(bits: &mut [bool], offset: u64, len: u64) -> u64 {
    let a = (offset as usize).min(bits.len());
    let b = (offset.saturating_add(len) as usize).min(bits.len());
    let mut n = 0;
    for x in &mut bits[a..b] {
        n += *x as u64;
        *x = false;
    }
    n
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn requests_stay_in_the_file_and_never_duplicate_outstanding_ranges(ops in prop::collection::vec(op(), 1..200)) {
        let cfg = PrefetchConfig {
            readahead_min_bytes: 512,
            readahead_max_bytes: 16_384,
            sequential_gap_bytes_max: 64,
            whole_file_below_bytes: 2_000,
            request_bytes_max: 3_000,
            streams_max: 64,
            files_max: 16,
            ranges_per_file_max: 1024,
        };
        let mut p = Prefetcher::new(cfg);
        // Model: per file, which bytes were requested and are neither read, evicted nor forgotten.
        let mut outstanding: Vec<Vec<bool>> = SIZES.iter().map(|s| vec![false; *s as usize]).collect();
        let mut last_end = std::collections::HashMap::new();
        let (mut hit_bytes, mut wasted_bytes, mut requested_bytes) = (0u64, 0u64, 0u64);
        for (t, op) in ops.into_iter().enumerate() {
            let (stream, file, offset, len) = match op {
                Op::Read { stream, file, offset, len } => (stream, file, offset, len),
                Op::Next { stream, file, len } => (stream, file, *last_end.get(&(stream, file)).unwrap_or(&0), len),
                Op::Done { file, offset, len } => {
                    p.on_prefetch_done(file as u64, offset, len, t as u64);
                    continue;
                }
                Op::Evict { file, offset, len } => {
                    p.on_evicted(file as u64, offset, len);
                    wasted_bytes += clear(&mut outstanding[file], offset, len);
                    continue;
                }
                Op::Forget { file } => {
                    p.forget_file(file as u64);
                    wasted_bytes += clear(&mut outstanding[file], 0, SIZES[file]);
                    continue;
                }
            };
            let size = SIZES[file];
            last_end.insert((stream, file), offset + len);
            let ev = AccessEvent { stream, file: file as u64, offset, len, file_size: size, now_ms: t as u64 };
            hit_bytes += clear(&mut outstanding[file], offset, len);
            let reqs = p.on_access(&ev);
            for r in reqs {
                prop_assert_eq!(r.file, file as u64);
                prop_assert!(r.len > 0, "empty request {:?}", r);
                prop_assert!(r.offset + r.len <= size, "{:?} past the end of a {}-byte file", r, size);
                prop_assert!(r.len <= 3_000, "{:?} longer than request_bytes_max", r);
                prop_assert!(r.offset + r.len <= offset || r.offset >= offset + len, "{:?} asks for the bytes of its own read {:?}", r, ev);
                for b in r.offset..r.offset + r.len {
                    prop_assert!(!outstanding[file][b as usize], "{:?} repeats outstanding byte {}", r, b);
                    outstanding[file][b as usize] = true;
                }
                requested_bytes += r.len;
            }
        }
        let st = p.stats();
        let model_outstanding: u64 = outstanding.iter().map(|f| f.iter().filter(|b| **b).count() as u64).sum();
        prop_assert_eq!(st.requested_bytes, requested_bytes);
        prop_assert_eq!(st.hit_bytes, hit_bytes);
        prop_assert_eq!(st.wasted_bytes, wasted_bytes);
        prop_assert_eq!(st.outstanding_bytes, model_outstanding);
        prop_assert_eq!(st.dropped_bytes, 0);
        prop_assert!(st.streams <= 64 && st.files <= 16);
    }
}
