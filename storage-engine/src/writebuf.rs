//! Per-file write buffer: unstable writes collect here until a full stripe, a commit, a
//! close or an fsync writes them out. Reads overlay it, so a writer sees its own bytes.

use std::collections::BTreeMap;

pub(crate) struct WriteBuffer {
    /// Non-overlapping, non-adjacent segments: offset → bytes.
    segs: BTreeMap<u64, Vec<u8>>,
    bytes: usize,
    /// File size including buffered bytes.
    pub size: u64,
    pub mtime_ns: i64,
    /// Taken out of the engine's buffer table (empty after a flush): a writer that got this
    /// buffer before that must not add to it, or its bytes would never be flushed.
    pub detached: bool,
}

impl WriteBuffer {
    pub fn new(size: u64) -> WriteBuffer {
        WriteBuffer { segs: BTreeMap::new(), bytes: 0, size, mtime_ns: 0, detached: false }
    }

    pub fn is_empty(&self) -> bool {
        self.segs.is_empty()
    }

    /// End of the last buffered segment (0 when empty).
    pub fn end(&self) -> u64 {
        self.segs.iter().next_back().map(|(o, d)| o + d.len() as u64).unwrap_or(0)
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
        // Fast path for sequential writers: append to the segment ending exactly here.
        let prev = self.segs.range(..off).next_back().map(|(o, d)| (*o, *o + d.len() as u64));
        if let Some((o, prev_end)) = prev {
            if prev_end == off && !self.segs_after_touch(off, end) {
                self.segs.get_mut(&o).expect("segment exists").extend_from_slice(data);
                self.bytes += data.len();
                self.size = self.size.max(end);
                self.mtime_ns = self.mtime_ns.max(now);
                return;
            }
        }
        let mut start = off;
        let mut stop = end;
        let touching: Vec<u64> = self
            .segs
            .range(..=end)
            .rev()
            .take_while(|(o, d)| **o + d.len() as u64 >= off)
            .map(|(o, _)| *o)
            .collect();
        let mut merged: Vec<(u64, Vec<u8>)> = Vec::with_capacity(touching.len());
        for o in touching {
            let d = self.segs.remove(&o).expect("segment exists");
            self.bytes -= d.len();
            start = start.min(o);
            stop = stop.max(o + d.len() as u64);
            merged.push((o, d));
        }
        let mut buf = vec![0u8; (stop - start) as usize];
        for (o, d) in merged {
            buf[(o - start) as usize..(o - start) as usize + d.len()].copy_from_slice(&d);
        }
        buf[(off - start) as usize..(end - start) as usize].copy_from_slice(data);
        self.bytes += buf.len();
        self.segs.insert(start, buf);
        self.size = self.size.max(end);
        self.mtime_ns = self.mtime_ns.max(now);
    }

    /// Whether any segment starts within [off, end].
    fn segs_after_touch(&self, off: u64, end: u64) -> bool {
        self.segs.range(off..=end).next().is_some()
    }

    /// Copies buffered bytes over `out`, which holds the file's bytes at `off`.
    pub fn overlay(&self, off: u64, out: &mut [u8]) {
        let end = off + out.len() as u64;
        for (o, d) in self.segs.range(..end) {
            let dend = o + d.len() as u64;
            if dend <= off {
                continue;
            }
            let a = off.max(*o);
            let b = end.min(dend);
            out[(a - off) as usize..(b - off) as usize].copy_from_slice(&d[(a - o) as usize..(b - o) as usize]);
        }
    }

    /// Removes and returns every segment.
    pub fn take_all(&mut self) -> Vec<(u64, Vec<u8>)> {
        self.bytes = 0;
        std::mem::take(&mut self.segs).into_iter().collect()
    }

    /// Removes whole multiples of `stripe` bytes from the front of each segment at least that
    /// long; tails stay buffered so sequential writers produce full stripes.
    pub fn take_full(&mut self, stripe: usize) -> Vec<(u64, Vec<u8>)> {
        let long: Vec<u64> = self.segs.iter().filter(|(_, d)| d.len() >= stripe).map(|(o, _)| *o).collect();
        let mut out = Vec::new();
        for o in long {
            let mut d = self.segs.remove(&o).expect("segment exists");
            let keep = d.len() % stripe;
            let full = d.len() - keep;
            if keep > 0 {
                let tail = d.split_off(full);
                self.segs.insert(o + full as u64, tail);
            }
            self.bytes -= full;
            out.push((o, d));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let all = b.take_all();
        assert_eq!(all, vec![(0, b"zz".to_vec()), (10, b"aXYde".to_vec())]);
        assert!(b.is_empty());
    }

    #[test]
    fn take_full_keeps_tail() {
        let mut b = WriteBuffer::new(0);
        b.insert(0, &vec![1u8; 10], 0);
        let full = b.take_full(4);
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].1.len(), 8);
        assert_eq!(b.bytes(), 2);
        let rest = b.take_all();
        assert_eq!(rest, vec![(8, vec![1u8; 2])]);
    }
}
