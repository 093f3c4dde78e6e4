//! Per-file write buffer: unstable writes collect here until a full stripe, a commit, a
//! close or an fsync writes them out. Reads overlay it, so a writer sees its own bytes.
//!
//! A flush takes segments out of the buffer and keeps them as `in_flight` while it encodes,
//! writes and commits them without holding the buffer's lock, so writers go on adding bytes
//! and readers still see the taken bytes until their extents are committed. Flushes of one
//! file run one at a time (the engine's per-file flush lock), so they commit in the order they
//! took their bytes.

use std::collections::BTreeMap;
use std::sync::Arc;

use hardware::{AlignedBuf, FillBuf};

/// A taken segment: shared between the flush writing it (whose drive writes send its data
/// shards as views of it, without copying) and readers overlaying it.
pub(crate) type Segment = (u64, Arc<AlignedBuf>);

/// A file's write buffer with the locks of its flushes.
pub(crate) struct FileBuf {
    pub state: parking_lot::Mutex<WriteBuffer>,
    /// Held by a flush from taking its segments until they are committed, so flushes of one
    /// file commit in the order they took their bytes. Taken before `state`.
    pub flushing: parking_lot::Mutex<()>,
    /// Signalled under `state` when a background flush took bytes or finished, for writers
    /// waiting for room.
    pub room: parking_lot::Condvar,
    /// Readers hold it shared while they read extents; a flush holds it exclusively while it
    /// commits extents, which may free the stripes a reader is reading. Taken before `state`.
    pub commit: parking_lot::RwLock<()>,
}

impl FileBuf {
    pub fn new(size: u64, chunk: usize) -> FileBuf {
        FileBuf {
            state: parking_lot::Mutex::new(WriteBuffer::with_chunk(size, chunk)),
            flushing: parking_lot::Mutex::new(()),
            room: parking_lot::Condvar::new(),
            commit: parking_lot::RwLock::new(()),
        }
    }
}

/// A buffered segment's bytes: filled by writes, or a whole buffer a writer handed over
/// (`insert_shared`), kept as it is.
enum Seg {
    Filling(FillBuf),
    Shared(Arc<AlignedBuf>),
}

impl Seg {
    fn bytes(&self) -> &[u8] {
        match self {
            Seg::Filling(f) => f,
            Seg::Shared(b) => b,
        }
    }

    fn len(&self) -> usize {
        self.bytes().len()
    }

    fn into_segment(self) -> Arc<AlignedBuf> {
        match self {
            Seg::Filling(f) => Arc::new(f.freeze()),
            Seg::Shared(b) => b,
        }
    }
}

/// The room a segment grows to when `need` bytes no longer fit. A large sequential writer's
/// segment grows once, straight to the chunk (a stripe-sized huge-page buffer), instead of
/// through several copies; a small file written in a few pieces grows by four times (from
/// the heap), so that many small files being written at once do not each hold a
/// stripe-sized buffer. Without a chunk, twice what is needed.
fn grown_room(need: usize, chunk: usize) -> usize {
    match chunk {
        0 => need.saturating_mul(2),
        chunk if need >= chunk / 16 => chunk.max(need),
        chunk => need.saturating_mul(4).min(chunk),
    }
}

pub(crate) struct WriteBuffer {
    /// Non-overlapping segments: offset → bytes. Adjacent where a sequential writer filled
    /// one to `chunk` bytes and went on in the next, or handed over whole buffers. Aligned
    /// buffers, so that a full stripe taken from one is written to the drives from where it
    /// lies.
    segs: BTreeMap<u64, Seg>,
    bytes: usize,
    /// Most bytes a sequential writer's segment grows to before the next one starts (0: no
    /// limit). The stripe size: a full segment is one stripe, written without splitting or
    /// copying; stripe-sized buffers are huge-page mappings kept for reuse (`FillBuf`), so
    /// they are not mapped, faulted in and unmapped for every stripe.
    chunk: usize,
    /// Segments a running flush took and has not committed yet; older than every `segs` byte.
    in_flight: Vec<Segment>,
    /// A background flush of this file is queued or running.
    pub flush_pending: bool,
    /// Why a background flush failed; reported by the next flush (commit, close, fsync),
    /// which is where the writer learns whether its unstable bytes were kept, and by writes
    /// until then (`Engine`'s `earlier_write_out`).
    pub flush_error: Option<crate::Error>,
    /// File size including buffered bytes.
    pub size: u64,
    pub mtime_ns: i64,
    /// Taken out of the engine's buffer table (empty after a flush): a writer that got this
    /// buffer before that must not add to it, or its bytes would never be flushed.
    pub detached: bool,
}

impl WriteBuffer {
    pub fn new(size: u64) -> WriteBuffer {
        WriteBuffer::with_chunk(size, 0)
    }

    pub fn with_chunk(size: u64, chunk: usize) -> WriteBuffer {
        WriteBuffer {
            segs: BTreeMap::new(),
            bytes: 0,
            chunk,
            in_flight: Vec::new(),
            flush_pending: false,
            flush_error: None,
            size,
            mtime_ns: 0,
            detached: false,
        }
    }

    /// Nothing buffered and nothing being flushed.
    pub fn is_empty(&self) -> bool {
        self.segs.is_empty() && self.in_flight.is_empty()
    }

    /// Marks `segs` as taken by a running flush (still visible to `overlay`).
    pub fn set_in_flight(&mut self, segs: &[Segment]) {
        debug_assert!(self.in_flight.is_empty(), "one flush of a file at a time");
        self.in_flight = segs.to_vec();
    }

    /// The running flush committed (or lost) its segments.
    pub fn clear_in_flight(&mut self) {
        self.in_flight.clear();
    }

    /// End of the last buffered or in-flight segment (0 when empty).
    pub fn end(&self) -> u64 {
        let buffered = self.segs.iter().next_back().map(|(o, d)| o + d.len() as u64).unwrap_or(0);
        self.in_flight.iter().map(|(o, d)| o + d.len() as u64).fold(buffered, u64::max)
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Adds a write, merging it with every segment it overlaps or touches.
    pub fn insert(&mut self, off: u64, data: &[u8], now: i64) {
        if data.is_empty() {
            return;
        }
        let end = off + data.len() as u64;
        // Fast path for sequential writers: append to the segment ending exactly here. A
        // write that fills the gap up to the next segment (WRITEs of one stream handled out
        // of order) appends too, and the next segment's bytes follow it, once, instead of
        // everything touched being copied into a fresh zeroed buffer.
        let prev = self.segs.range(..off).next_back().map(|(o, d)| (*o, *o + d.len() as u64, matches!(d, Seg::Filling(_))));
        if let Some((o, prev_end, true)) = prev
            && prev_end == off
            && self.segs.range(off..end).next().is_none()
        {
            let mut last = self.append(o, off, data);
            let mut at = end;
            while matches!(self.segs.get(&at), Some(Seg::Filling(_))) {
                let next = self.segs.remove(&at).expect("the segment was found above");
                self.bytes -= next.len();
                last = self.append(last, at, next.bytes());
                at += next.len() as u64;
            }
            self.size = self.size.max(end);
            self.mtime_ns = self.mtime_ns.max(now);
            return;
        }
        let mut start = off;
        let mut stop = end;
        // A handed-over buffer is merged only where the write overlaps it: one that merely
        // touches it stays as it is (no copy) beside the new segment.
        let touching: Vec<u64> = self
            .segs
            .range(..=end)
            .rev()
            .take_while(|(o, d)| **o + d.len() as u64 >= off)
            .filter(|(o, d)| matches!(d, Seg::Filling(_)) || (**o + d.len() as u64 > off && **o < end))
            .map(|(o, _)| *o)
            .collect();
        let mut merged: Vec<(u64, Seg)> = Vec::with_capacity(touching.len());
        for o in touching {
            let d = self.segs.remove(&o).expect("segment exists");
            self.bytes -= d.len();
            start = start.min(o);
            stop = stop.max(o + d.len() as u64);
            merged.push((o, d));
        }
        let buf = if merged.is_empty() {
            // Nothing to merge (the first write of a segment, or one ahead of the writes
            // before it): the write's bytes are all it holds; a large one gets a chunk's room,
            // as the fast path's segments have, a small one only its own.
            let large = self.chunk != 0 && data.len() >= self.chunk / 16;
            let mut b = FillBuf::with_room(if large { self.chunk.max(data.len()) } else { data.len() });
            b.extend_from_slice(data);
            b
        } else {
            let mut b = FillBuf::zeroed((stop - start) as usize, (stop - start) as usize);
            for (o, d) in merged {
                b[(o - start) as usize..(o - start) as usize + d.len()].copy_from_slice(d.bytes());
            }
            b[(off - start) as usize..(end - start) as usize].copy_from_slice(data);
            b
        };
        self.bytes += buf.len();
        self.segs.insert(start, Seg::Filling(buf));
        self.size = self.size.max(end);
        self.mtime_ns = self.mtime_ns.max(now);
    }

    /// Adds a write of a whole buffer handed over by the writer, kept as it is (no copy)
    /// when it overlaps nothing buffered; otherwise its bytes are merged as by `insert`.
    pub fn insert_shared(&mut self, off: u64, data: Arc<AlignedBuf>, now: i64) {
        if data.is_empty() {
            return;
        }
        let end = off + data.len() as u64;
        let before = self.segs.range(..off).next_back().is_some_and(|(o, d)| o + d.len() as u64 > off);
        if before || self.segs.range(off..end).next().is_some() {
            self.insert(off, &data, now);
            return;
        }
        self.bytes += data.len();
        self.segs.insert(off, Seg::Shared(data));
        self.size = self.size.max(end);
        self.mtime_ns = self.mtime_ns.max(now);
    }

    /// Appends `data` at `off` to the filling segment at `o`, which ends at `off`: up to
    /// `chunk` bytes in it, the rest in new chunk-sized segments after it. Returns the offset
    /// of the segment now ending where `data` ends.
    fn append(&mut self, o: u64, off: u64, data: &[u8]) -> u64 {
        let chunk = if self.chunk == 0 { usize::MAX } else { self.chunk };
        let Some(Seg::Filling(seg)) = self.segs.get_mut(&o) else { unreachable!("appending to a filling segment") };
        let n = chunk.saturating_sub(seg.len()).min(data.len());
        if n > 0 && seg.room() - seg.len() < n {
            seg.grow_to(grown_room(seg.len() + n, self.chunk));
        }
        seg.extend_from_slice(&data[..n]);
        let mut last = o;
        let mut at = off + n as u64;
        for piece in data[n..].chunks(chunk) {
            let mut d = FillBuf::with_room(chunk);
            d.extend_from_slice(piece);
            self.segs.insert(at, Seg::Filling(d));
            last = at;
            at += piece.len() as u64;
        }
        self.bytes += data.len();
        last
    }

    /// Copies buffered bytes over `out`, which holds the file's bytes at `off`: first those
    /// a flush is writing, then the newer ones still buffered.
    pub fn overlay(&self, off: u64, out: &mut [u8]) {
        let end = off + out.len() as u64;
        let copy = |o: u64, d: &[u8], out: &mut [u8]| {
            let dend = o + d.len() as u64;
            if dend <= off || o >= end {
                return;
            }
            let a = off.max(o);
            let b = end.min(dend);
            out[(a - off) as usize..(b - off) as usize].copy_from_slice(&d[(a - o) as usize..(b - o) as usize]);
        };
        for (o, d) in &self.in_flight {
            copy(*o, d, out);
        }
        for (o, d) in self.segs.range(..end) {
            copy(*o, d.bytes(), out);
        }
    }

    /// Removes and returns every segment.
    pub fn take_all(&mut self) -> Vec<Segment> {
        self.bytes = 0;
        std::mem::take(&mut self.segs).into_iter().map(|(o, d)| (o, d.into_segment())).collect()
    }

    /// Removes whole multiples of `stripe` bytes from the front of each segment at least that
    /// long; tails stay buffered so sequential writers produce full stripes.
    pub fn take_full(&mut self, stripe: usize) -> Vec<Segment> {
        let long: Vec<u64> = self.segs.iter().filter(|(_, d)| d.len() >= stripe).map(|(o, _)| *o).collect();
        let mut out = Vec::new();
        for o in long {
            let d = self.segs.remove(&o).expect("segment exists");
            let keep = d.len() % stripe;
            let full = d.len() - keep;
            if keep == 0 {
                self.bytes -= full;
                out.push((o, d.into_segment()));
                continue;
            }
            let mut d = match d {
                Seg::Filling(f) => f,
                Seg::Shared(b) => {
                    let mut f = FillBuf::with_room(b.len());
                    f.extend_from_slice(&b);
                    f
                }
            };
            let room = if self.chunk == 0 { keep } else { self.chunk.max(keep) };
            let tail = d.split_off(full, room);
            self.segs.insert(o + full as u64, Seg::Filling(tail));
            self.bytes -= full;
            out.push((o, Arc::new(d.freeze())));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(segs: Vec<Segment>) -> Vec<(u64, Vec<u8>)> {
        segs.into_iter().map(|(o, d)| (o, d.to_vec())).collect()
    }

    #[test]
    fn merge_overlay_and_take() {
        let mut b = WriteBuffer::new(0);
        b.insert(10, b"abc", 1);
        b.insert(13, b"de", 2); // adjacent: merges
        b.insert(0, b"zz", 3);
        b.insert(11, b"XY", 4); // overlap: newest wins
        assert_eq!(b.bytes(), 7);
        assert_eq!(b.size, 15);
        let mut out = vec![b'.'; 16];
        b.overlay(0, &mut out);
        assert_eq!(&out, b"zz........aXYde.");
        let all = plain(b.take_all());
        assert_eq!(all, vec![(0, b"zz".to_vec()), (10, b"aXYde".to_vec())]);
        assert!(b.is_empty());
    }

    #[test]
    fn in_flight_bytes_stay_visible_under_newer_writes() {
        let mut b = WriteBuffer::new(0);
        b.insert(0, b"abcdef", 1);
        let taken: Vec<Segment> = b.take_all();
        b.set_in_flight(&taken);
        assert!(!b.is_empty(), "bytes being flushed still count as buffered");
        assert_eq!(b.bytes(), 0);
        b.insert(2, b"XY", 2); // newer than the flushing bytes: wins in the overlay
        let mut out = vec![b'.'; 8];
        b.overlay(0, &mut out);
        assert_eq!(&out, b"abXYef..");
        assert_eq!(b.end(), 6);
        b.clear_in_flight();
        let mut out = vec![b'.'; 8];
        b.overlay(0, &mut out);
        assert_eq!(&out, b"..XY....");
        assert_eq!(b.end(), 4);
    }

    #[test]
    fn sequential_writes_fill_chunks_that_are_taken_whole() {
        let mut b = WriteBuffer::with_chunk(0, 8);
        b.insert(0, b"abc", 1);
        b.insert(3, b"defgh", 1); // fills the first chunk exactly
        b.insert(8, b"ijklmnopqrstu", 1); // the next chunk, and part of a third
        assert_eq!(b.bytes(), 21);
        let mut out = vec![b'.'; 22];
        b.overlay(0, &mut out);
        assert_eq!(&out, b"abcdefghijklmnopqrstu.");
        let full = b.take_full(8);
        assert_eq!(plain(full), vec![(0, b"abcdefgh".to_vec()), (8, b"ijklmnop".to_vec())]);
        assert_eq!(plain(b.take_all()), vec![(16, b"qrstu".to_vec())]);
        // A write across two adjacent chunks merges them.
        let mut b = WriteBuffer::with_chunk(0, 4);
        b.insert(0, b"01234567", 1);
        b.insert(2, b"xxxx", 2);
        assert_eq!(plain(b.take_all()), vec![(0, b"01xxxx67".to_vec())]);
    }

    #[test]
    fn writes_handled_out_of_order_join_the_segment_before_them() {
        // A stream's WRITEs may be added out of order: the one that fills the gap appends
        // to the segment before it and the segments after it follow, so the chunks come
        // out whole as if the writes had been in order.
        let mut b = WriteBuffer::with_chunk(0, 8);
        b.insert(0, b"ab", 1);
        b.insert(6, b"ghij", 1); // ahead of the gap
        b.insert(10, b"kl", 1); // appends to the segment ahead
        b.insert(14, b"op", 1); // ahead again
        b.insert(2, b"cdef", 1); // fills the first gap: "ghijkl" follows
        assert_eq!(b.bytes(), 14);
        b.insert(12, b"mn", 1); // fills the second: "op" follows
        assert_eq!(b.bytes(), 16);
        assert_eq!(b.size, 16);
        let mut out = vec![b'.'; 17];
        b.overlay(0, &mut out);
        assert_eq!(&out, b"abcdefghijklmnop.");
        assert_eq!(plain(b.take_full(8)), vec![(0, b"abcdefgh".to_vec()), (8, b"ijklmnop".to_vec())]);
        assert!(b.is_empty());
        // A handed-over buffer after the gap stays as it is.
        let mut b = WriteBuffer::with_chunk(0, 8);
        let kept = shared(b"4567");
        b.insert(0, b"01", 1);
        b.insert_shared(4, kept.clone(), 1);
        b.insert(2, b"23", 1);
        let all = b.take_all();
        assert!(Arc::ptr_eq(&all[1].1, &kept));
        assert_eq!(plain(all), vec![(0, b"0123".to_vec()), (4, b"4567".to_vec())]);
        // A write overlapping the segment after the gap is merged the ordinary way.
        let mut b = WriteBuffer::with_chunk(0, 8);
        b.insert(0, b"01", 1);
        b.insert(4, b"4567", 1);
        b.insert(2, b"XXX", 2);
        assert_eq!(plain(b.take_all()), vec![(0, b"01XXX567".to_vec())]);
    }

    /// Random writes, in and out of order, overlapping, touching and apart, against a plain
    /// byte array: what the buffer shows and what it hands out is what was written.
    #[test]
    fn random_writes_match_a_plain_model() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for round in 0..200 {
            let chunk = [0usize, 16, 64][round % 3];
            let mut b = WriteBuffer::with_chunk(0, chunk);
            let mut model: Vec<Option<u8>> = vec![None; 512];
            for step in 0..40 {
                // Half of the writes are aligned blocks, as a stream's WRITEs are: they touch
                // and fill gaps exactly; the others land anywhere.
                let (off, len) = if next(2) == 0 { (8 * next(50), 8 * (1 + next(3) as usize)) } else { (next(400), 1 + next(80) as usize) };
                let fill = (round * 40 + step) as u8;
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                if next(4) == 0 {
                    b.insert_shared(off, shared(&data), 1);
                } else {
                    b.insert(off, &data, 1);
                }
                for (i, x) in data.iter().enumerate() {
                    model[off as usize + i] = Some(*x);
                }
                let mut out = vec![0xEEu8; 512];
                b.overlay(0, &mut out);
                let want: Vec<u8> = model.iter().map(|x| x.unwrap_or(0xEE)).collect();
                assert_eq!(out, want, "round {round} step {step}: overlay");
                assert_eq!(b.bytes(), model.iter().filter(|x| x.is_some()).count(), "round {round} step {step}: bytes");
                let end = model.iter().rposition(|x| x.is_some()).map_or(0, |i| i + 1) as u64;
                assert_eq!(b.size, end, "round {round} step {step}: size");
            }
            let segs = if round % 2 == 0 { b.take_full(32).into_iter().chain(b.take_all()).collect::<Vec<_>>() } else { b.take_all() };
            let mut seen = vec![None; 512];
            for (o, d) in &segs {
                for (i, x) in d.iter().enumerate() {
                    assert!(seen[*o as usize + i].is_none(), "round {round}: segments overlap at {}", *o as usize + i);
                    seen[*o as usize + i] = Some(*x);
                }
            }
            assert_eq!(seen, model, "round {round}: the segments taken are what was written");
            assert!(b.is_empty());
        }
    }

    #[test]
    fn take_full_keeps_tail() {
        let mut b = WriteBuffer::new(0);
        b.insert(0, &vec![1u8; 10], 0);
        let full = b.take_full(4);
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].1.len(), 8);
        assert_eq!(b.bytes(), 2);
        let rest = plain(b.take_all());
        assert_eq!(rest, vec![(8, vec![1u8; 2])]);
    }

    fn shared(bytes: &[u8]) -> Arc<AlignedBuf> {
        Arc::new(AlignedBuf::from_slice(bytes))
    }

    /// Whole buffers handed over are kept as they are (taken out as the same buffer) unless
    /// they overlap buffered bytes, and mix with ordinary writes.
    #[test]
    fn shared_buffers_are_kept_without_a_copy() {
        let mut b = WriteBuffer::with_chunk(0, 8);
        let first = shared(b"abcdefgh");
        b.insert_shared(0, first.clone(), 1);
        b.insert_shared(8, shared(b"ijklmnop"), 1); // adjacent: a segment of its own
        b.insert(16, b"qr", 1);
        b.insert_shared(18, shared(b"st"), 1);
        assert_eq!(b.bytes(), 20);
        assert_eq!(b.size, 20);
        let mut out = vec![b'.'; 21];
        b.overlay(0, &mut out);
        assert_eq!(&out, b"abcdefghijklmnopqrst.");
        let full = b.take_full(8);
        assert!(Arc::ptr_eq(&full[0].1, &first), "a full shared buffer is taken out as it is");
        assert_eq!(plain(full), vec![(0, b"abcdefgh".to_vec()), (8, b"ijklmnop".to_vec())]);
        assert_eq!(plain(b.take_all()), vec![(16, b"qr".to_vec()), (18, b"st".to_vec())]);
        // Overlapping buffered bytes: merged, newest wins.
        let mut b = WriteBuffer::with_chunk(0, 8);
        b.insert(2, b"XYZ", 1);
        b.insert_shared(0, shared(b"0123"), 2);
        assert_eq!(plain(b.take_all()), vec![(0, b"0123Z".to_vec())]);
        // A shared buffer longer than a stripe but not a multiple: the tail stays buffered.
        let mut b = WriteBuffer::with_chunk(0, 4);
        b.insert_shared(0, shared(b"0123456"), 1);
        b.insert(7, b"7", 1); // touches it: a segment of its own
        assert_eq!(plain(b.take_full(4)), vec![(0, b"0123".to_vec())]);
        assert_eq!(plain(b.take_all()), vec![(4, b"456".to_vec()), (7, b"7".to_vec())]);
    }

    #[test]
    fn small_segments_grow_in_steps_large_ones_straight_to_the_chunk() {
        let chunk = 4 << 20;
        assert_eq!(grown_room(8 << 10, chunk), 32 << 10);
        assert_eq!(grown_room(200 << 10, chunk), 800 << 10);
        assert_eq!(grown_room(256 << 10, chunk), chunk);
        assert_eq!(grown_room(2 << 20, chunk), chunk);
        assert_eq!(grown_room(100, 0), 200);
        // Appends of 4 KiB: the segment stays far below a stripe until it is large.
        let mut b = WriteBuffer::with_chunk(0, chunk);
        for i in 0..8u64 {
            b.insert(i * 4096, &[i as u8; 4096], 1);
        }
        let room = match b.segs.values().next() {
            Some(Seg::Filling(f)) => f.room(),
            _ => panic!("one filling segment"),
        };
        assert!(room < (1 << 20), "8 appends of 4 KiB hold {room} bytes of room");
        let all = plain(b.take_all());
        assert_eq!(all.len(), 1);
        assert!(all[0].1.chunks(4096).enumerate().all(|(i, c)| c.iter().all(|&x| x == i as u8)));
    }
}
