//! NeuralCache: access events in, prefetch requests out. Pure: no I/O, no clocks of its own.
//!
//! The spoke side of a portal reports every read of a portal file as an [`AccessEvent`] and
//! starts fetching whatever [`PrefetchRequest`]s the [`Prefetcher`] returns; it reports
//! completed fetches ([`Prefetcher::on_prefetch_done`]), evictions from its cache
//! ([`Prefetcher::on_evicted`]) and files whose content changed on the hub
//! ([`Prefetcher::forget_file`]). Time comes in with the events (`now_ms`), so a trace replays
//! to the same decisions every time.
//!
//! Version 0 runs two [`Predictor`]s (see README.md):
//! - [`SequentialReadahead`]: per (stream, file), a window that starts at
//!   `readahead_min_bytes` once a read continues where the last one ended, doubles on every
//!   further sequential read up to `readahead_max_bytes`, and falls back to the minimum on a
//!   jump;
//! - [`SmallFileWhole`]: the first read of a file smaller than `whole_file_below_bytes` asks
//!   for the whole file.
//!
//! The [`Prefetcher`] never asks twice for a byte range that it asked for and that has been
//! neither read nor evicted since (it keeps those "outstanding" ranges per file), and it keeps
//! the metrics the ensemble of later versions will be weighted by: hit bytes, precision,
//! timeliness and wasted bytes.

mod ranges;

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use ranges::RangeSet;

/// One read of a file by a client. `stream` identifies the reader (a client connection, an
/// NFS client and file handle, a worker): sequential patterns are detected per stream and file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccessEvent {
    pub stream: u64,
    pub file: u64,
    pub offset: u64,
    pub len: u64,
    /// The file's size as the reader sees it now; requests never go past it.
    pub file_size: u64,
    pub now_ms: u64,
}

/// "Fetch these bytes ahead of demand." Ranges are never empty and lie inside the file size of
/// the event that caused them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchRequest {
    pub file: u64,
    pub offset: u64,
    pub len: u64,
    /// Higher is more urgent (see the `PRIORITY_*` constants).
    pub priority: u8,
    /// When the reader is expected to need the first byte, on the events' clock, if known.
    pub deadline_ms: Option<u64>,
}

/// The bytes right after the read that caused the request: the reader needs them next.
pub const PRIORITY_NEXT: u8 = 192;
/// The rest of a small file the reader has just opened.
pub const PRIORITY_WHOLE_FILE: u8 = 160;
/// Readahead further out in the window.
pub const PRIORITY_AHEAD: u8 = 128;

/// Limits and thresholds. Every limit is named with its unit last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefetchConfig {
    /// Readahead window once a stream is seen reading sequentially.
    pub readahead_min_bytes: u64,
    /// The window doubles on each further sequential read up to this.
    pub readahead_max_bytes: u64,
    /// A read that starts at most this far past the previous one's end still counts as
    /// sequential (readers that skip headers or padding between samples).
    pub sequential_gap_bytes_max: u64,
    /// Files smaller than this are fetched whole on their first read (0 = never).
    pub whole_file_below_bytes: u64,
    /// Requests are cut into pieces of at most this size, so that the transport can pipeline
    /// them and each piece gets its own deadline.
    pub request_bytes_max: u64,
    /// (stream, file) pairs whose pattern is remembered; the least recently used is forgotten.
    pub streams_max: usize,
    /// Files whose outstanding prefetched ranges are tracked; the least recently used is
    /// forgotten (its ranges count as `dropped_bytes`).
    pub files_max: usize,
    /// Outstanding ranges tracked per file; no new requests for a file at this limit.
    pub ranges_per_file_max: usize,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            readahead_min_bytes: 256 * 1024,
            readahead_max_bytes: 64 * 1024 * 1024,
            sequential_gap_bytes_max: 64 * 1024,
            whole_file_below_bytes: 4 * 1024 * 1024,
            request_bytes_max: 4 * 1024 * 1024,
            streams_max: 4096,
            files_max: 65536,
            ranges_per_file_max: 1024,
        }
    }
}

/// What the prefetcher has done since it was created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    pub accesses: u64,
    pub access_bytes: u64,
    pub requests: u64,
    pub requested_bytes: u64,
    /// Accesses whose every byte had been requested ahead.
    pub hits: u64,
    /// Bytes of accesses (of any access) that had been requested ahead.
    pub hit_bytes: u64,
    /// Hits whose every prefetched byte had finished arriving before the access.
    pub timely_hits: u64,
    /// Prefetched bytes never read: evicted before a read, or forgotten (file changed).
    pub wasted_bytes: u64,
    /// Prefetched bytes no longer tracked because of the `files_max` limit (fate unknown).
    pub dropped_bytes: u64,
    /// Prefetched bytes neither read nor evicted yet.
    pub outstanding_bytes: u64,
    /// Accesses after which a prefetch was held back by `ranges_per_file_max`.
    pub limited: u64,
    pub streams: usize,
    pub files: usize,
}

impl PrefetchStats {
    /// Prefetched bytes that were then read, over prefetched bytes whose fate is known.
    pub fn precision(&self) -> f64 {
        let settled = self.hit_bytes + self.wasted_bytes;
        if settled == 0 { 1.0 } else { self.hit_bytes as f64 / settled as f64 }
    }

    /// Bytes read that had been prefetched, over all bytes read.
    pub fn hit_rate(&self) -> f64 {
        if self.access_bytes == 0 { 0.0 } else { self.hit_bytes as f64 / self.access_bytes as f64 }
    }
}

/// A range a predictor would like fetched; the [`Prefetcher`] removes what is already
/// outstanding and clips it to the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub file: u64,
    pub offset: u64,
    pub len: u64,
    pub priority: u8,
    /// Expected consumption rate of the stream, bytes per millisecond, for deadlines.
    pub rate_bytes_per_ms: Option<f64>,
}

/// One predictor of an ensemble: it sees every access and proposes ranges. It keeps its own
/// bounded state and does no I/O.
pub trait Predictor {
    fn name(&self) -> &'static str;
    fn on_access(&mut self, ev: &AccessEvent, out: &mut Vec<Candidate>);
    fn forget_file(&mut self, file: u64);
}

/// A map that forgets its least recently used entry beyond `cap` entries.
struct Lru<K, V> {
    cap: usize,
    tick: u64,
    map: HashMap<K, (V, u64)>,
    order: BTreeMap<u64, K>,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    fn new(cap: usize) -> Self {
        Lru { cap: cap.max(1), tick: 0, map: HashMap::new(), order: BTreeMap::new() }
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    /// The entry for `k`, created with `make` if absent, marked most recently used. Returns the
    /// entry evicted to make room, if any.
    fn get_or_insert(&mut self, k: K, make: impl FnOnce() -> V) -> (&mut V, Option<(K, V)>) {
        self.tick += 1;
        let tick = self.tick;
        let mut evicted = None;
        if let Some((_, t)) = self.map.get_mut(&k) {
            self.order.remove(t);
            *t = tick;
        } else {
            if self.map.len() >= self.cap
                && let Some((_, old)) = self.order.pop_first()
            {
                evicted = self.map.remove(&old).map(|(v, _)| (old, v));
            }
            self.map.insert(k.clone(), (make(), tick));
        }
        self.order.insert(tick, k.clone());
        (&mut self.map.get_mut(&k).expect("entry just inserted").0, evicted)
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        self.map.get_mut(k).map(|(v, _)| v)
    }

    fn remove(&mut self, k: &K) -> Option<V> {
        let (v, t) = self.map.remove(k)?;
        self.order.remove(&t);
        Some(v)
    }

    fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        let gone: Vec<K> = self.map.keys().filter(|k| !keep(k)).cloned().collect();
        for k in gone {
            self.remove(&k);
        }
    }
}

struct StreamState {
    /// End of the last read.
    last_end: u64,
    /// Reads in a row that continued the previous one.
    sequential_run: u32,
    window_bytes: u64,
    /// How far ahead this stream has asked for data.
    ahead_until: u64,
    last_ms: u64,
    rate_bytes_per_ms: Option<f64>,
}

/// Adaptive sequential readahead per (stream, file), like the kernel's page-cache readahead.
pub struct SequentialReadahead {
    readahead_min_bytes: u64,
    readahead_max_bytes: u64,
    sequential_gap_bytes_max: u64,
    streams: Lru<(u64, u64), StreamState>,
}

impl SequentialReadahead {
    pub fn new(cfg: &PrefetchConfig) -> Self {
        SequentialReadahead {
            readahead_min_bytes: cfg.readahead_min_bytes.max(1),
            readahead_max_bytes: cfg.readahead_max_bytes.max(cfg.readahead_min_bytes).max(1),
            sequential_gap_bytes_max: cfg.sequential_gap_bytes_max,
            streams: Lru::new(cfg.streams_max),
        }
    }

    pub fn streams(&self) -> usize {
        self.streams.len()
    }
}

impl Predictor for SequentialReadahead {
    fn name(&self) -> &'static str {
        "sequential"
    }

    fn on_access(&mut self, ev: &AccessEvent, out: &mut Vec<Candidate>) {
        let end = ev.offset.saturating_add(ev.len);
        let min = self.readahead_min_bytes;
        let mut fresh = false;
        let (st, _) = self.streams.get_or_insert((ev.stream, ev.file), || {
            fresh = true;
            StreamState { last_end: end, sequential_run: 0, window_bytes: min, ahead_until: end, last_ms: ev.now_ms, rate_bytes_per_ms: None }
        });
        if fresh {
            // A first read from the start of a file is the usual beginning of a sequential
            // pass (a shard, a checkpoint): read ahead at once.
            if ev.offset != 0 || ev.len == 0 {
                return;
            }
            st.sequential_run = 1;
        } else {
            let sequential = ev.offset >= st.last_end && ev.offset - st.last_end <= self.sequential_gap_bytes_max;
            if ev.offset == st.last_end.saturating_sub(ev.len) && ev.len > 0 && ev.offset < st.last_end {
                // The same read again (a retry): no evidence either way.
                return;
            }
            if !sequential {
                st.sequential_run = 0;
                st.window_bytes = min;
                st.ahead_until = end;
                st.last_end = end;
                st.last_ms = ev.now_ms;
                st.rate_bytes_per_ms = None;
                return;
            }
            if st.sequential_run > 0 {
                st.window_bytes = st.window_bytes.saturating_mul(2).min(self.readahead_max_bytes);
            }
            st.sequential_run = st.sequential_run.saturating_add(1);
            let dt = ev.now_ms.saturating_sub(st.last_ms);
            if dt > 0 {
                let r = (end - st.last_end) as f64 / dt as f64;
                st.rate_bytes_per_ms = Some(st.rate_bytes_per_ms.map_or(r, |old| 0.7 * old + 0.3 * r));
            }
        }
        st.last_end = end;
        st.last_ms = ev.now_ms;
        st.ahead_until = st.ahead_until.max(end);
        // Ask again only when less than half a window is left ahead, so requests come in
        // pieces of at least half a window rather than one per read.
        if st.ahead_until - end >= st.window_bytes / 2 {
            return;
        }
        let until = end.saturating_add(st.window_bytes).min(ev.file_size);
        if until > st.ahead_until {
            let from = st.ahead_until;
            let priority = if from == end { PRIORITY_NEXT } else { PRIORITY_AHEAD };
            out.push(Candidate { file: ev.file, offset: from, len: until - from, priority, rate_bytes_per_ms: st.rate_bytes_per_ms });
            st.ahead_until = until;
        }
    }

    fn forget_file(&mut self, file: u64) {
        self.streams.retain(|&(_, f)| f != file);
    }
}

/// Whole-file fetch of small files on their first read (small samples, JSON, configs).
pub struct SmallFileWhole {
    whole_file_below_bytes: u64,
    seen: Lru<u64, ()>,
}

impl SmallFileWhole {
    pub fn new(cfg: &PrefetchConfig) -> Self {
        SmallFileWhole { whole_file_below_bytes: cfg.whole_file_below_bytes, seen: Lru::new(cfg.files_max) }
    }
}

impl Predictor for SmallFileWhole {
    fn name(&self) -> &'static str {
        "small-file-whole"
    }

    fn on_access(&mut self, ev: &AccessEvent, out: &mut Vec<Candidate>) {
        if ev.file_size == 0 || ev.file_size >= self.whole_file_below_bytes {
            return;
        }
        let mut first = false;
        self.seen.get_or_insert(ev.file, || first = true);
        if first {
            out.push(Candidate { file: ev.file, offset: 0, len: ev.file_size, priority: PRIORITY_WHOLE_FILE, rate_bytes_per_ms: None });
        }
    }

    fn forget_file(&mut self, file: u64) {
        self.seen.remove(&file);
    }
}

/// What the prefetcher knows about one file's bytes.
#[derive(Default)]
struct FileState {
    /// Ranges requested and neither read nor evicted since.
    outstanding: RangeSet,
    /// Ranges read and not reported evicted (so presumably in the cache), merged. Forgotten as
    /// a whole if it grows past `ranges_per_file_max` (random reads); that only costs
    /// requests the cache will find it already holds.
    read: RangeSet,
}

/// v0 of NeuralCache: sequential readahead and small-file whole fetch, with bookkeeping of
/// what is outstanding and how well it worked.
pub struct Prefetcher {
    cfg: PrefetchConfig,
    readahead: SequentialReadahead,
    whole: SmallFileWhole,
    files: Lru<u64, FileState>,
    stats: PrefetchStats,
    scratch: Vec<Candidate>,
}

impl Prefetcher {
    pub fn new(cfg: PrefetchConfig) -> Self {
        Prefetcher {
            readahead: SequentialReadahead::new(&cfg),
            whole: SmallFileWhole::new(&cfg),
            files: Lru::new(cfg.files_max),
            cfg,
            stats: PrefetchStats::default(),
            scratch: Vec::new(),
        }
    }

    pub fn config(&self) -> &PrefetchConfig {
        &self.cfg
    }

    /// Records a read and returns what to fetch ahead of it, most urgent first.
    pub fn on_access(&mut self, ev: &AccessEvent) -> Vec<PrefetchRequest> {
        let end = ev.offset.saturating_add(ev.len);
        self.stats.accesses += 1;
        self.stats.access_bytes += ev.len;
        let (fs, evicted) = self.files.get_or_insert(ev.file, FileState::default);
        // The read consumes whatever part of it was prefetched.
        if ev.len > 0 {
            let taken = fs.outstanding.take(ev.offset, end);
            let covered: u64 = taken.iter().map(|(s, g)| g.end - s).sum();
            self.stats.hit_bytes += covered;
            self.stats.outstanding_bytes -= covered;
            if covered == ev.len {
                self.stats.hits += 1;
                if taken.iter().all(|(_, g)| g.done) {
                    self.stats.timely_hits += 1;
                }
            }
            fs.read.add_merged(ev.offset, end);
            if fs.read.len() > self.cfg.ranges_per_file_max {
                fs.read = RangeSet::default();
            }
        }
        if let Some((_, gone)) = evicted {
            let b = gone.outstanding.total_bytes();
            self.stats.dropped_bytes += b;
            self.stats.outstanding_bytes -= b;
        }

        let mut cands = std::mem::take(&mut self.scratch);
        cands.clear();
        self.readahead.on_access(ev, &mut cands);
        self.whole.on_access(ev, &mut cands);
        let mut out = Vec::new();
        if !cands.is_empty() {
            self.admit(ev, &cands, &mut out);
        }
        self.scratch = cands;
        out.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.offset.cmp(&b.offset)));
        out
    }

    /// Turns candidates into requests for the bytes neither outstanding nor already read.
    fn admit(&mut self, ev: &AccessEvent, cands: &[Candidate], out: &mut Vec<PrefetchRequest>) {
        let end = ev.offset.saturating_add(ev.len);
        let fs = self.files.get_mut(&ev.file).expect("file state made by on_access");
        let mut limited = false;
        for c in cands {
            let a = c.offset;
            let b = c.offset.saturating_add(c.len).min(ev.file_size);
            if a >= b {
                continue;
            }
            let wanted: Vec<(u64, u64)> = fs.outstanding.gaps(a, b).into_iter().flat_map(|(ga, gb)| fs.read.gaps(ga, gb)).collect();
            for (ga, gb) in wanted {
                let mut p = ga;
                while p < gb {
                    if fs.outstanding.len() >= self.cfg.ranges_per_file_max {
                        limited = true;
                        break;
                    }
                    let q = gb.min(p.saturating_add(self.cfg.request_bytes_max.max(1)));
                    fs.outstanding.insert(p, q);
                    let deadline_ms = match c.rate_bytes_per_ms {
                        Some(r) if r > 0.0 => Some(ev.now_ms + (p.saturating_sub(end) as f64 / r) as u64),
                        _ if p <= end => Some(ev.now_ms),
                        _ => None,
                    };
                    out.push(PrefetchRequest { file: ev.file, offset: p, len: q - p, priority: c.priority, deadline_ms });
                    self.stats.requests += 1;
                    self.stats.requested_bytes += q - p;
                    self.stats.outstanding_bytes += q - p;
                    p = q;
                }
            }
        }
        if limited {
            self.stats.limited += 1;
        }
    }

    /// A prefetch finished arriving: reads of it from now on are timely.
    pub fn on_prefetch_done(&mut self, file: u64, offset: u64, len: u64, _now_ms: u64) {
        if let Some(fs) = self.files.get_mut(&file) {
            fs.outstanding.mark_done(offset, offset.saturating_add(len));
        }
    }

    /// The cache dropped these bytes: prefetched bytes in them that were never read are waste,
    /// and they may be requested again.
    pub fn on_evicted(&mut self, file: u64, offset: u64, len: u64) {
        let Some(fs) = self.files.get_mut(&file) else { return };
        let end = offset.saturating_add(len);
        let gone: u64 = fs.outstanding.take(offset, end).iter().map(|(s, g)| g.end - s).sum();
        fs.read.take(offset, end);
        self.stats.wasted_bytes += gone;
        self.stats.outstanding_bytes -= gone;
    }

    /// The file changed or went away: forget its patterns; its unread prefetched bytes are waste.
    pub fn forget_file(&mut self, file: u64) {
        if let Some(fs) = self.files.remove(&file) {
            let b = fs.outstanding.total_bytes();
            self.stats.wasted_bytes += b;
            self.stats.outstanding_bytes -= b;
        }
        self.readahead.forget_file(file);
        self.whole.forget_file(file);
    }

    pub fn stats(&self) -> PrefetchStats {
        PrefetchStats { streams: self.readahead.streams(), files: self.files.len(), ..self.stats.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(stream: u64, file: u64, offset: u64, len: u64, file_size: u64, now_ms: u64) -> AccessEvent {
        AccessEvent { stream, file, offset, len, file_size, now_ms }
    }

    #[test]
    fn window_starts_small_doubles_and_resets_on_a_jump() {
        let cfg = PrefetchConfig {
            readahead_min_bytes: 100,
            readahead_max_bytes: 800,
            whole_file_below_bytes: 0,
            request_bytes_max: 1 << 20,
            sequential_gap_bytes_max: 0,
            ..PrefetchConfig::default()
        };
        let mut p = Prefetcher::new(cfg);
        let size = 1 << 20;
        // First read at 0: readahead of the minimum window right away.
        let r = p.on_access(&ev(1, 7, 0, 10, size, 0));
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].offset, r[0].len, r[0].priority), (10, 100, PRIORITY_NEXT));
        // Next sequential read: window 200, so [110, 210) is asked for.
        let r = p.on_access(&ev(1, 7, 10, 10, size, 1));
        assert_eq!(r.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>(), vec![(110, 110)]);
        assert_eq!(r[0].priority, PRIORITY_AHEAD);
        // Reads inside the window keep doubling it, capped at 800.
        let mut ahead = 220;
        let mut off = 20;
        for i in 0..20 {
            for r in p.on_access(&ev(1, 7, off, 10, size, 2 + i)) {
                assert_eq!(r.offset, ahead, "requests continue where the last one ended");
                ahead = r.offset + r.len;
            }
            off += 10;
            assert!(ahead - off <= 800, "never more than the max window ahead");
        }
        assert!(ahead - off >= 400, "window grew to the max: {} ahead", ahead - off);
        // A jump: no request, and the next sequential read starts over at the minimum.
        assert!(p.on_access(&ev(1, 7, 500_000, 10, size, 30)).is_empty());
        let r = p.on_access(&ev(1, 7, 500_010, 10, size, 31));
        assert_eq!(r.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>(), vec![(500_020, 100)]);
        let s = p.stats();
        assert_eq!(s.streams, 1);
        assert!(s.hit_bytes >= 200 && s.hits >= 20, "{s:?}");
    }

    #[test]
    fn small_files_are_fetched_whole_once_and_not_past_their_end() {
        let mut p = Prefetcher::new(PrefetchConfig { whole_file_below_bytes: 1000, ..PrefetchConfig::default() });
        // Reading the middle of a 900-byte file: ask for the rest of it, not the read itself.
        let r = p.on_access(&ev(1, 3, 100, 50, 900, 0));
        assert_eq!(r.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>(), vec![(0, 100), (150, 750)]);
        assert!(r.iter().all(|r| r.priority == PRIORITY_WHOLE_FILE));
        // Another stream reading it from the start: nothing new to ask for.
        assert!(p.on_access(&ev(2, 3, 0, 100, 900, 1)).is_empty());
        p.on_prefetch_done(3, 150, 750, 2);
        assert!(p.on_access(&ev(2, 3, 100, 800, 900, 3)).is_empty());
        let s = p.stats();
        assert_eq!((s.requested_bytes, s.hit_bytes, s.hits, s.timely_hits, s.outstanding_bytes), (850, 850, 1, 0, 0), "{s:?}");
        // The [100, 150) read was the reader's own, so the second read was not fully covered.
        // A file at the threshold is not fetched whole.
        assert!(p.on_access(&ev(1, 4, 10, 10, 1000, 4)).is_empty());
    }

    #[test]
    fn evictions_and_forgotten_files_count_as_waste_and_can_be_asked_again() {
        let mut p = Prefetcher::new(PrefetchConfig { whole_file_below_bytes: 1000, ..PrefetchConfig::default() });
        p.on_access(&ev(1, 3, 0, 100, 900, 0));
        p.on_evicted(3, 500, 1000);
        assert_eq!(p.stats().wasted_bytes, 400);
        p.forget_file(3);
        let s = p.stats();
        assert_eq!((s.wasted_bytes, s.outstanding_bytes, s.files), (800, 0, 0));
        // After forgetting, the file is new again.
        let r = p.on_access(&ev(1, 3, 0, 100, 900, 5));
        assert_eq!(r.iter().map(|r| (r.offset, r.len)).collect::<Vec<_>>(), vec![(100, 800)]);
        assert!((p.stats().precision() - 0.0).abs() < 1e-9);
    }

    #[test]
    fn state_is_bounded() {
        let cfg = PrefetchConfig { streams_max: 8, files_max: 4, whole_file_below_bytes: 1000, ..PrefetchConfig::default() };
        let mut p = Prefetcher::new(cfg);
        for i in 0..100 {
            p.on_access(&ev(i, i, 0, 10, 500, i));
        }
        let s = p.stats();
        assert!(s.streams <= 8 && s.files <= 4, "{s:?}");
        assert_eq!(s.dropped_bytes + s.outstanding_bytes, s.requested_bytes);
    }
}
