//! Erasure-coding throughput of Aquifer's stripe codec, next to reed-solomon-simd.
//!
//! Run: `cargo bench -p storage-engine --bench ec --profile dev`
//! (the workspace dev profile builds dependencies with opt-level 3).
//!
//! One thread, 1 MiB shards, 4+2 and 8+3. "encode" computes all parity shards; "decode" rebuilds
//! two lost data shards from the survivors. Throughput counts data bytes (k × shard bytes) per
//! operation, in GiB/s, as the median of `RUNS` timed runs. Results are written to
//! docs/ec-benchmark.md by hand.

use std::hint::black_box;
use std::time::Instant;

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use storage_engine::ec::Codec;

const SHARD_BYTES: usize = 1 << 20;
const RUNS: usize = 9;
/// Operations per timed run: long enough (tens of milliseconds) that timer resolution and a
/// stray interrupt do not matter, short enough that nine runs take a few seconds.
const OPERATIONS_PER_RUN: usize = 16;
/// The data shards lost in the decode measurement.
const LOST: [usize; 2] = [0, 1];

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

/// Median throughput in GiB/s of data bytes over `RUNS` runs of `operation`.
fn measure(k: usize, mut operation: impl FnMut()) -> f64 {
    operation();
    let mut rates: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..OPERATIONS_PER_RUN {
                operation();
            }
            let seconds = start.elapsed().as_secs_f64();
            (k * SHARD_BYTES * OPERATIONS_PER_RUN) as f64 / seconds / (1u64 << 30) as f64
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[RUNS / 2]
}

struct Row {
    library: &'static str,
    geometry: (usize, usize),
    encode: f64,
    decode: f64,
}

fn aquifer_codec(k: usize, m: usize, data: &[Vec<u8>]) -> Row {
    let codec = Codec::new(k, m).expect("valid geometry");
    let mut stripe: Vec<Vec<u8>> = data.to_vec();
    stripe.extend((0..m).map(|_| vec![0u8; SHARD_BYTES]));
    let encode = measure(k, || {
        let mut refs: Vec<&mut [u8]> = stripe.iter_mut().map(Vec::as_mut_slice).collect();
        codec.encode(&mut refs).expect("encode");
        black_box(&refs);
    });

    let survivors: Vec<Option<Vec<u8>>> = stripe
        .iter()
        .enumerate()
        .map(|(i, shard)| (!LOST.contains(&i)).then(|| shard.clone()))
        .collect();
    let mut shards = survivors.clone();
    codec.reconstruct_data(&mut shards).expect("decode");
    for i in LOST {
        assert_eq!(
            shards[i].as_ref(),
            Some(&data[i]),
            "Codec rebuilt shard {i} wrongly"
        );
    }
    let decode = measure(k, || {
        for i in LOST {
            shards[i] = None;
        }
        codec.reconstruct_data(&mut shards).expect("decode");
        black_box(&shards);
    });
    Row {
        library: "reed-solomon-erasure 6 via ec::Codec",
        geometry: (k, m),
        encode,
        decode,
    }
}

/// The library called directly on whole shards, to show what the column chunking in
/// `ec::Codec` buys.
fn reed_solomon_erasure_whole(k: usize, m: usize, data: &[Vec<u8>]) -> Row {
    let rs = reed_solomon_erasure::galois_8::ReedSolomon::new(k, m).expect("valid geometry");
    let mut stripe: Vec<Vec<u8>> = data.to_vec();
    stripe.extend((0..m).map(|_| vec![0u8; SHARD_BYTES]));
    let encode = measure(k, || {
        rs.encode(&mut stripe).expect("encode");
        black_box(&stripe);
    });
    let mut shards: Vec<Option<Vec<u8>>> = stripe.iter().cloned().map(Some).collect();
    let decode = measure(k, || {
        for i in LOST {
            shards[i] = None;
        }
        rs.reconstruct_data(&mut shards).expect("decode");
        black_box(&shards);
    });
    for i in LOST {
        assert_eq!(
            shards[i].as_ref(),
            Some(&data[i]),
            "library rebuilt shard {i} wrongly"
        );
    }
    Row {
        library: "reed-solomon-erasure 6, whole shards",
        geometry: (k, m),
        encode,
        decode,
    }
}

fn reed_solomon_simd(k: usize, m: usize, data: &[Vec<u8>]) -> Row {
    let mut encoder = ReedSolomonEncoder::new(k, m, SHARD_BYTES).expect("valid geometry");
    let mut parity: Vec<Vec<u8>> = Vec::new();
    let encode = measure(k, || {
        for shard in data {
            encoder.add_original_shard(shard).expect("add shard");
        }
        let result = encoder.encode().expect("encode");
        black_box(result.recovery(0));
    });
    for shard in data {
        encoder.add_original_shard(shard).expect("add shard");
    }
    parity.extend(
        encoder
            .encode()
            .expect("encode")
            .recovery_iter()
            .map(<[u8]>::to_vec),
    );

    let mut decoder = ReedSolomonDecoder::new(k, m, SHARD_BYTES).expect("valid geometry");
    let mut decode_once = |check: bool| {
        for (i, shard) in data.iter().enumerate().filter(|(i, _)| !LOST.contains(i)) {
            decoder.add_original_shard(i, shard).expect("add shard");
        }
        for (i, shard) in parity.iter().enumerate().take(LOST.len()) {
            decoder.add_recovery_shard(i, shard).expect("add shard");
        }
        let result = decoder.decode().expect("decode");
        if check {
            for i in LOST {
                assert_eq!(result.restored_original(i), Some(&data[i][..]), "shard {i}");
            }
        }
        black_box(result.restored_original(LOST[0]));
    };
    decode_once(true);
    let decode = measure(k, || decode_once(false));
    Row {
        library: "reed-solomon-simd 3.1",
        geometry: (k, m),
        encode,
        decode,
    }
}

fn main() {
    // The first pass runs against a fresh heap: glibc serves 1 MiB allocations with mmap until
    // its adaptive threshold has moved, and gives freed memory at the top of the heap back to
    // the kernel, so every shard rebuilt into a new Vec is page-faulted in. The second pass
    // measures the steady state of a long-running process. Both are printed, because the engine
    // sees the first on a cold start.
    for title in ["first pass (fresh heap)", "second pass (steady state)"] {
        let mut rows = Vec::new();
        for (k, m) in [(4, 2), (8, 3)] {
            let data: Vec<Vec<u8>> = (0..k)
                .map(|i| pseudo_random(i as u64 + 1, SHARD_BYTES))
                .collect();
            rows.push(aquifer_codec(k, m, &data));
            rows.push(reed_solomon_erasure_whole(k, m, &data));
            rows.push(reed_solomon_simd(k, m, &data));
        }
        println!(
            "\n{title}: 1 MiB shards, one thread, median of {RUNS} runs × \
             {OPERATIONS_PER_RUN} operations; GiB/s of data bytes\n"
        );
        println!("| library | k+m | encode GiB/s | decode (2 data lost) GiB/s |");
        println!("|---|---|--:|--:|");
        for row in rows {
            let (k, m) = row.geometry;
            println!(
                "| {} | {k}+{m} | {:.2} | {:.2} |",
                row.library, row.encode, row.decode
            );
        }
    }
}
