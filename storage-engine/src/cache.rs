//! The data cache: verified data shards of stripes kept in memory, so that data read again
//! and again (a training job's later epochs, a dataset that several jobs read) is answered
//! without drive requests, as a kernel file server answers from its page cache.
//!
//! The drives are read with O_DIRECT, so without this every read goes to the drives. A
//! stripe's data never changes while it exists: writes make new stripes (copy on write),
//! repair and rebuild rewrite shards with the same bytes, and stripe ids are never handed
//! out twice while the engine runs. So an entry, keyed by stripe id and shard, is never
//! stale and needs no invalidation; a freed stripe's entries are dropped when the change
//! that frees it is written, to give their memory back.
//!
//! Entries are whole data shards (the part of a shard that holds data, not its padding).
//! An entry shares the buffer the drive read into, so it holds no copy of its own; reads of
//! any part of a kept shard are answered from it. Least recently used entries are evicted
//! past the budget.
//!
//! What is kept: a shard from which twice its data has been read recently (whole or in
//! parts: a sequential reader's third read, a training job's third epoch over samples in
//! shards) is read whole by the next read that touches it and kept; until then the reads
//! only add to its count among the "ghosts" (keys without data, the most recent ones). A
//! cache still filling up takes fresh memory for every buffer it keeps (the buffers it holds
//! no longer go back to their pool for the next reads), and on the VMs measured the first
//! touch of fresh memory made the reads that fill the cache 30–50 % slower than reads that
//! keep nothing. So a file read once or twice (a copy, a backup, a write then a verify, two
//! epochs) reads as fast as without a cache and pushes nothing out of it; and reads of small
//! parts of a large file fetch a shard whole only after twice its size was read from it, so
//! at most half again as many bytes as were asked for. Data written is not kept, for the
//! same reason: the write buffers go back to their pool for the next writes.
//!
//! The other way round, writes take memory back from the cache: a write buffer that finds
//! none of its size in the pool (the cache took them for the reads it kept) gets one the
//! cache lets go of, its least recently used entries of that buffer size, instead of fresh
//! memory (`impl hardware::Reclaim`). Without it, eight 64 MiB PUTs right after the cache
//! had filled took half again as much CPU as the same PUTs before.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::data::ReadBytes;

/// (stripe id, shard index).
type Key = (u64, u16);

pub(crate) struct DataCache {
    /// Most bytes of shards kept; 0 turns the cache off.
    max_bytes: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Default)]
struct Inner {
    /// Entry and the tick of its last use.
    map: HashMap<Key, (ReadBytes, u64)>,
    /// Tick of last use → key: the least recently used entry first.
    by_use: BTreeMap<u64, Key>,
    tick: u64,
    bytes: usize,
    /// Keys read recently and not kept, with the bytes read from them (see the module's
    /// text), oldest first in `ghost_order` (which may also name keys since kept or forgotten).
    ghosts: HashMap<Key, u64>,
    ghost_order: VecDeque<Key>,
}

impl Inner {
    /// Removes the entry of `key`, if kept, from the map, the use order and the byte count.
    fn remove(&mut self, key: &Key) -> Option<ReadBytes> {
        let (bytes, used) = self.map.remove(key)?;
        self.by_use.remove(&used);
        self.bytes -= bytes.len();
        Some(bytes)
    }
}

/// Times its data a shard is read before the next read fetches it whole and keeps it.
const READS_BEFORE_KEEPING: u64 = 2;

/// Entries looked at, least recently used first, for one of a buffer size writers ask back.
const RECLAIM_SCAN_MAX: usize = 256;
/// Entries evicted for one buffer asked back: the shards of one drive read share its buffer,
/// which goes back only with the last of them.
const RECLAIM_EVICTIONS_MAX: usize = 64;

/// Ghost keys remembered per byte of budget: one per 64 KiB, at least 1024 (a 1 GiB budget
/// of 1 MiB shards remembers the last 16 GiB read once).
fn ghosts_max(max_bytes: usize) -> usize {
    (max_bytes / (64 << 10)).max(1024)
}

/// What the cache holds and how it has served (`GET /api/v1/cache`, `aquifer cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DataCacheStats {
    pub max_bytes: u64,
    pub bytes: u64,
    pub entries: u64,
    /// Shard reads answered from the cache, and those that went to a drive.
    pub hits: u64,
    pub misses: u64,
}

impl DataCache {
    pub fn new(max_bytes: usize) -> DataCache {
        DataCache { max_bytes, inner: Mutex::new(Inner::default()), hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    /// A cache that writers may take buffers back from (see [`hardware::Reclaim`]).
    pub fn new_shared(max_bytes: usize) -> Arc<DataCache> {
        let cache = Arc::new(DataCache::new(max_bytes));
        if cache.enabled() {
            let holder: Arc<dyn hardware::Reclaim> = cache.clone();
            hardware::register_reclaim(Arc::downgrade(&holder));
        }
        cache
    }

    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The data of shard `shard` of stripe `id`, when kept; counts a hit or a miss.
    pub fn get(&self, id: u64, shard: usize) -> Option<ReadBytes> {
        if !self.enabled() {
            return None;
        }
        let found = {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            inner.tick += 1;
            let tick = inner.tick;
            match inner.map.get_mut(&(id, shard as u16)) {
                Some((bytes, used)) => {
                    inner.by_use.remove(used);
                    *used = tick;
                    inner.by_use.insert(tick, (id, shard as u16));
                    Some(bytes.clone())
                }
                None => None,
            }
        };
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Counts a read of `bytes` of shard `shard` of stripe `id`, which holds `shard_len` data
    /// bytes and is not kept: true when twice its data has been read recently before, so this
    /// read should fetch it whole and [`insert`](Self::insert) it.
    pub fn note_read(&self, id: u64, shard: usize, bytes: u64, shard_len: u64) -> bool {
        if !self.enabled() || shard_len == 0 || shard_len as usize > self.max_bytes {
            return false;
        }
        let key = (id, shard as u16);
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let seen = inner.ghosts.get(&key).copied().unwrap_or(0);
        if seen >= READS_BEFORE_KEEPING * shard_len {
            inner.ghosts.remove(&key);
            return true;
        }
        if seen == 0 {
            inner.ghost_order.push_back(key);
        }
        inner.ghosts.insert(key, seen + bytes.max(1));
        while inner.ghost_order.len() > ghosts_max(self.max_bytes) {
            let old = inner.ghost_order.pop_front().expect("over the limit");
            inner.ghosts.remove(&old);
        }
        false
    }

    /// Keeps `bytes`, read from the drives and verified, as the data of shard `shard` of
    /// stripe `id`, evicting the least recently used entries to stay within the budget. An
    /// entry larger than the whole budget is not kept.
    pub fn insert(&self, id: u64, shard: usize, bytes: ReadBytes) {
        let n = bytes.len();
        if !self.enabled() || n == 0 || n > self.max_bytes {
            return;
        }
        let key = (id, shard as u16);
        let mut evicted = Vec::new();
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            inner.tick += 1;
            let tick = inner.tick;
            evicted.extend(inner.remove(&key));
            inner.map.insert(key, (bytes, tick));
            inner.by_use.insert(tick, key);
            inner.bytes += n;
            while inner.bytes > self.max_bytes {
                let Some((_, &key)) = inner.by_use.first_key_value() else { break };
                evicted.push(inner.remove(&key).expect("every key in the use order is kept"));
            }
        }
        // Buffers go back to their pool outside the lock.
        drop(evicted);
    }

    /// Evicts the least recently used entry whose buffer has capacity `capacity` (among the
    /// [`RECLAIM_SCAN_MAX`] least recently used), if any.
    fn evict_for(&self, capacity: usize) -> Option<ReadBytes> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let key = *inner.by_use.values().take(RECLAIM_SCAN_MAX).find(|k| inner.map.get(k).and_then(|(b, _)| b.pool_capacity()) == Some(capacity))?;
        inner.remove(&key)
    }

    /// Drops the entries of stripe `id`'s `shards` data shards (the stripe was freed).
    pub fn forget_stripe(&self, id: u64, shards: usize) {
        if !self.enabled() {
            return;
        }
        let dropped: Vec<ReadBytes> = {
            let mut g = self.inner.lock();
            (0..shards).filter_map(|shard| g.remove(&(id, shard as u16))).collect()
        };
        // Buffers go back to their pool outside the lock.
        drop(dropped);
    }

    pub fn stats(&self) -> DataCacheStats {
        let g = self.inner.lock();
        DataCacheStats {
            max_bytes: self.max_bytes as u64,
            bytes: g.bytes as u64,
            entries: g.map.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// Drops every entry and ghost (tests that must reach the drives again use it).
    pub fn clear(&self) {
        let old = {
            let mut g = self.inner.lock();
            g.by_use.clear();
            g.bytes = 0;
            g.ghosts.clear();
            g.ghost_order.clear();
            std::mem::take(&mut g.map)
        };
        drop(old);
    }
}

/// The default budget: an eighth of the machine's memory, at least 64 MiB and at most 8 GiB.
pub(crate) fn default_bytes() -> usize {
    (hardware::memory_bytes() / 8).clamp(64 << 20, 8 << 30)
}

/// Writers take memory back from the cache: a write buffer that finds no kept buffer of its
/// size gets one the cache let go of (its least recently used entries of that buffer size)
/// instead of a fresh mapping. Reads do not ask, so the cache still grows to its budget, and
/// writes take back only what they hold at once beyond the kept buffers.
impl hardware::Reclaim for DataCache {
    fn reclaim(&self, capacity: usize) -> bool {
        for _ in 0..RECLAIM_EVICTIONS_MAX {
            let Some(evicted) = self.evict_for(capacity) else { return false };
            if evicted.sole_holder() {
                // Dropped here, outside the lock: the buffer goes back to the kept ones.
                drop(evicted);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(fill: u8, n: usize) -> ReadBytes {
        vec![fill; n].into()
    }

    /// Reads a shard whole until it is to be kept, then keeps it.
    fn admit(c: &DataCache, id: u64, shard: usize, b: ReadBytes) {
        while !c.note_read(id, shard, b.len() as u64, b.len() as u64) {}
        c.insert(id, shard, b);
    }

    #[test]
    fn a_shard_is_fetched_whole_after_twice_its_data_was_read() {
        let c = DataCache::new(1 << 20);
        // Whole reads: the third one fetches and keeps it.
        assert!(!c.note_read(7, 0, 100, 100));
        assert!(!c.note_read(7, 0, 100, 100));
        assert!(c.note_read(7, 0, 100, 100));
        // Reads of parts: once 200 bytes were read, the next read fetches it whole.
        for _ in 0..20 {
            assert!(!c.note_read(8, 0, 10, 100));
        }
        assert!(c.note_read(8, 0, 10, 100));
        // After the fetch it starts over (when kept, reads find it and count nothing).
        assert!(!c.note_read(8, 0, 10, 100));
        // The ghosts are the most recent keys only: reads long ago count for nothing.
        assert!(!c.note_read(9, 0, 100, 100));
        assert!(!c.note_read(9, 0, 100, 100));
        for id in 100..100 + ghosts_max(1 << 20) as u64 {
            c.note_read(id, 0, 10, 10);
        }
        assert!(!c.note_read(9, 0, 100, 100));
        // Nothing is kept by counting alone.
        assert_eq!(c.stats().bytes, 0);
        // A shard larger than the budget is never fetched to be kept.
        let small = DataCache::new(50);
        for _ in 0..5 {
            assert!(!small.note_read(1, 0, 100, 100));
        }
    }

    /// Writers take back the least recently used entries of the buffer size they ask for,
    /// all the shards that share a buffer, and stop once one buffer is free; a buffer still
    /// held elsewhere (a reply being sent from it) is not counted as free.
    #[test]
    fn writers_take_back_least_recently_used_buffers_of_their_size() {
        use hardware::{FillBuf, Reclaim};
        // Sizes no other test uses.
        const CAP: usize = 10 << 20;
        const OTHER: usize = 6 << 20;
        let drive_buf = |room: usize, fill: u8| {
            let mut f = FillBuf::with_room(room);
            f.extend_from_slice(&vec![fill; room]);
            ReadBytes::from_drive_buf(f.freeze())
        };
        let c = DataCache::new(1 << 30);
        let (a, b, other) = (drive_buf(CAP, 1), drive_buf(CAP, 2), drive_buf(OTHER, 3));
        admit(&c, 1, 0, a.slice(0..CAP / 2));
        admit(&c, 1, 1, a.slice(CAP / 2..CAP));
        admit(&c, 2, 0, other);
        admit(&c, 3, 0, b);
        admit(&c, 4, 0, bytes(4, 1000));
        drop(a);
        // Both shards of the oldest buffer of the size go; the other sizes stay.
        assert!(c.reclaim(CAP));
        assert!(c.get(1, 0).is_none() && c.get(1, 1).is_none());
        assert!(c.get(2, 0).is_some() && c.get(3, 0).is_some() && c.get(4, 0).is_some());
        assert_eq!(c.stats().bytes as usize, OTHER + CAP + 1000);
        // A buffer someone still holds is evicted but frees nothing.
        let held = c.get(3, 0).expect("kept");
        assert!(!c.reclaim(CAP));
        assert!(c.get(3, 0).is_none());
        assert_eq!(&held[..4], &[2u8; 4]);
        // No entry of the size: nothing happens.
        assert!(!c.reclaim(CAP));
        assert_eq!(c.stats().entries, 2);
        assert!(c.reclaim(OTHER));
        assert!(!c.reclaim(OTHER));
        assert_eq!(c.stats().entries, 1);
    }

    #[test]
    fn keeps_the_recently_used_within_its_budget() {
        let c = DataCache::new(3000);
        admit(&c, 1, 0, bytes(1, 1000));
        admit(&c, 1, 1, bytes(2, 1000));
        admit(&c, 2, 0, bytes(3, 1000));
        assert_eq!(c.stats().bytes, 3000);
        // Using (1, 0) makes (1, 1) the least recently used: it goes first.
        assert_eq!(&c.get(1, 0).unwrap()[..], &[1u8; 1000][..]);
        admit(&c, 3, 0, bytes(4, 1000));
        assert!(c.get(1, 1).is_none());
        assert!(c.get(1, 0).is_some() && c.get(2, 0).is_some() && c.get(3, 0).is_some());
        let s = c.stats();
        assert_eq!((s.bytes, s.entries, s.hits, s.misses), (3000, 3, 4, 1));
        // Replacing an entry counts its bytes once; one larger than the budget is not kept.
        c.insert(3, 0, bytes(5, 500));
        assert_eq!(c.stats().bytes, 2500);
        assert_eq!(c.get(3, 0).unwrap()[0], 5);
        c.insert(4, 0, bytes(6, 3001));
        assert!(c.get(4, 0).is_none());
        assert_eq!(c.stats().bytes, 2500);
        c.clear();
        assert_eq!(c.stats().bytes, 0);
        assert!(c.get(1, 0).is_none());
    }

    #[test]
    fn a_zero_budget_keeps_nothing() {
        let c = DataCache::new(0);
        assert!(!c.note_read(1, 0, 10, 10));
        c.insert(1, 0, bytes(1, 10));
        assert!(c.get(1, 0).is_none());
        assert_eq!(c.stats(), DataCacheStats::default());
    }
}
