//! Replays access traces through the prefetcher with a simulated fetch pipe (latency and
//! bandwidth on the events' clock) and checks hit rate, timeliness and waste. Deterministic:
//! the same trace gives the same numbers every run.

use neuralcache::{AccessEvent, PrefetchConfig, PrefetchRequest, PrefetchStats, Prefetcher};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// A spoke in miniature: prefetches complete after `latency_ms` plus their transfer time on a
/// link of `bytes_per_ms`, one after another (one shared pipe).
struct Sim {
    p: Prefetcher,
    latency_ms: u64,
    bytes_per_ms: u64,
    pipe_free_at_ms: u64,
    in_flight: Vec<(u64, PrefetchRequest)>,
    sizes: std::collections::HashMap<u64, u64>,
}

impl Sim {
    fn new(cfg: PrefetchConfig, latency_ms: u64, bytes_per_ms: u64) -> Sim {
        Sim { p: Prefetcher::new(cfg), latency_ms, bytes_per_ms, pipe_free_at_ms: 0, in_flight: Vec::new(), sizes: Default::default() }
    }

    fn read(&mut self, stream: u64, file: u64, offset: u64, len: u64, file_size: u64, now_ms: u64) {
        self.sizes.insert(file, file_size);
        self.in_flight.sort_by_key(|(t, _)| *t);
        while let Some((t, r)) = self.in_flight.first().copied() {
            if t > now_ms {
                break;
            }
            self.in_flight.remove(0);
            self.p.on_prefetch_done(r.file, r.offset, r.len, t);
        }
        let ev = AccessEvent { stream, file, offset, len, file_size, now_ms };
        for r in self.p.on_access(&ev) {
            assert!(r.len > 0 && r.offset + r.len <= file_size, "{r:?} past a {file_size}-byte file");
            let start = self.pipe_free_at_ms.max(now_ms);
            self.pipe_free_at_ms = start + r.len.div_ceil(self.bytes_per_ms);
            self.in_flight.push((self.pipe_free_at_ms + self.latency_ms, r));
        }
    }

    /// The job is over: the cache drops every file, settling what was prefetched and never read.
    fn finish(mut self) -> PrefetchStats {
        let files: Vec<(u64, u64)> = self.sizes.iter().map(|(f, s)| (*f, *s)).collect();
        for (f, s) in files {
            self.p.on_evicted(f, 0, s);
        }
        let st = self.p.stats();
        assert_eq!(st.outstanding_bytes, 0);
        assert_eq!(st.hit_bytes + st.wasted_bytes + st.dropped_bytes, st.requested_bytes, "every prefetched byte is read, wasted or dropped: {st:?}");
        st
    }
}

/// A small deterministic generator (xorshift) so that traces need no crate and no seed file.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
}

#[test]
fn sequential_shards_are_read_ahead_in_time_with_no_waste() {
    // Four workers, each reading its own 64 MiB shard in 1 MiB reads, interleaved, one read
    // every 5 ms in all (200 MiB/s demand); the link: 30 ms one way, 500 MiB/s.
    let mut sim = Sim::new(PrefetchConfig::default(), 30, 500 * MIB / 1000);
    let shard = 64 * MIB;
    let mut t = 0;
    for i in 0..shard / MIB {
        for w in 0..4 {
            sim.read(w, 100 + w, i * MIB, MIB, shard, t);
            t += 5;
        }
    }
    let st = sim.finish();
    let reads = 4 * shard / MIB;
    assert_eq!(st.accesses, reads);
    assert!(st.hit_rate() >= 0.95, "hit rate {:.3} ({st:?})", st.hit_rate());
    // Only the first reads of each shard can be late while the window grows.
    assert!(st.timely_hits >= reads - 4 * 8, "timely {} of {reads} ({st:?})", st.timely_hits);
    assert_eq!(st.wasted_bytes, 0, "readahead never goes past the shard end: {st:?}");
    assert_eq!(st.precision(), 1.0);
    assert_eq!(st.streams, 4);
}

#[test]
fn shuffled_small_files_are_fetched_whole_on_first_read() {
    // 500 samples of 100 KiB in a random order, each read in four 25 KiB pieces.
    let mut sim = Sim::new(PrefetchConfig { whole_file_below_bytes: MIB, ..PrefetchConfig::default() }, 30, 100 * KIB);
    let mut order: Vec<u64> = (0..500).collect();
    shuffle(&mut order, &mut Rng(7));
    let mut t = 0;
    for (i, f) in order.iter().enumerate() {
        for piece in 0..4 {
            // Pieces of one sample come 40 ms apart: a loader waiting on the first piece.
            sim.read(i as u64 % 8, *f, piece * 25 * KIB, 25 * KIB, 100 * KIB, t + piece * 40);
        }
        t += 200;
    }
    let st = sim.finish();
    // The first piece of each sample is a demand read; the other three were fetched whole.
    assert_eq!(st.hit_bytes, 500 * 75 * KIB, "{st:?}");
    assert_eq!(st.wasted_bytes, 0);
    assert!(st.timely_hits >= 500 * 2, "{st:?}");
}

#[test]
fn whole_small_file_reads_ask_for_nothing() {
    let mut sim = Sim::new(PrefetchConfig { whole_file_below_bytes: MIB, ..PrefetchConfig::default() }, 30, 100 * KIB);
    for f in 0..200 {
        sim.read(f % 4, f, 0, 100 * KIB, 100 * KIB, f * 10);
    }
    let st = sim.finish();
    assert_eq!(st.requested_bytes, 0, "{st:?}");
}

#[test]
fn random_access_wastes_little() {
    // 4 KiB reads at random offsets of a 1 GiB file (an index lookup, a database).
    let mut sim = Sim::new(PrefetchConfig::default(), 30, 100 * KIB);
    let mut rng = Rng(99);
    let size = 1024 * MIB;
    for i in 0..20_000 {
        let off = rng.below(size / (4 * KIB)) * 4 * KIB;
        sim.read(i % 16, 1, off, 4 * KIB, size, i);
    }
    let st = sim.finish();
    assert!(st.wasted_bytes <= st.access_bytes / 20, "wasted {} for {} bytes read ({st:?})", st.wasted_bytes, st.access_bytes);
}

#[test]
fn a_jump_inside_a_sequential_pass_restarts_small() {
    // A reader that streams a file, seeks far ahead, and streams again: each pass leaves at most
    // one window (8 MiB) prefetched and never read, at its seek or at the end.
    let cfg = PrefetchConfig { readahead_max_bytes: 8 * MIB, ..PrefetchConfig::default() };
    let mut sim = Sim::new(cfg, 30, 500 * KIB);
    let size = 256 * MIB;
    let mut t = 0;
    for start in [0, 100 * MIB, 200 * MIB] {
        for i in 0..32 {
            sim.read(1, 9, start + i * MIB, MIB, size, t);
            t += 5;
        }
    }
    let st = sim.finish();
    assert!(st.wasted_bytes <= 3 * 8 * MIB, "{st:?}");
    assert!(st.wasted_bytes > 0, "a seek away from a running readahead wastes something");
    assert!(st.hit_rate() >= 0.8, "{st:?}");
}

#[test]
fn replays_are_deterministic() {
    let run = || {
        let mut sim = Sim::new(PrefetchConfig { whole_file_below_bytes: 256 * KIB, ..PrefetchConfig::default() }, 20, 200 * KIB);
        let mut rng = Rng(5);
        for i in 0..3000 {
            let f = rng.below(50);
            let size = 64 * KIB + f * 32 * KIB;
            let off = if rng.below(3) == 0 { 0 } else { rng.below(size) };
            sim.read(rng.below(4), f, off, 16 * KIB, size, i * 2);
        }
        sim.finish()
    };
    assert_eq!(run(), run());
}
