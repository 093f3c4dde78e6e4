//! A set of disjoint byte ranges of one file, each carrying whether its fetch has completed.

use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seg {
    pub end: u64,
    pub done: bool,
}

/// Disjoint half-open ranges `[start, end)` keyed by start.
#[derive(Default, Debug, Clone)]
pub(crate) struct RangeSet {
    segs: BTreeMap<u64, Seg>,
}

impl RangeSet {
    pub fn len(&self) -> usize {
        self.segs.len()
    }

    pub fn total_bytes(&self) -> u64 {
        self.segs.iter().map(|(s, g)| g.end - s).sum()
    }

    /// Starts of the segments overlapping `[a, b)`, in order.
    fn overlapping(&self, a: u64, b: u64) -> Vec<u64> {
        let mut out = Vec::new();
        if let Some((&s, g)) = self.segs.range(..a).next_back()
            && g.end > a
        {
            out.push(s);
        }
        out.extend(self.segs.range(a..b).map(|(&s, _)| s));
        out
    }

    /// The parts of `[a, b)` no segment covers, in order.
    pub fn gaps(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = a;
        for s in self.overlapping(a, b) {
            let g = self.segs[&s];
            if s > cur {
                out.push((cur, s.min(b)));
            }
            cur = cur.max(g.end);
        }
        if cur < b {
            out.push((cur, b));
        }
        out
    }

    /// Adds `[a, b)`, which must not overlap any segment.
    pub fn insert(&mut self, a: u64, b: u64) {
        debug_assert!(a < b);
        debug_assert!(self.overlapping(a, b).is_empty(), "insert over an existing range");
        self.segs.insert(a, Seg { end: b, done: false });
    }

    /// Adds `[a, b)`, merged with every segment it overlaps or touches (which must all be
    /// marked done, as in a set of bytes read).
    pub fn add_merged(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        let (mut lo, mut hi) = (a, b);
        let touching = self.overlapping(a.saturating_sub(1), b.saturating_add(1));
        for s in touching {
            let g = self.segs.remove(&s).expect("segment just listed");
            lo = lo.min(s);
            hi = hi.max(g.end);
        }
        self.segs.insert(lo, Seg { end: hi, done: true });
    }

    /// Cuts the segments at `a` and `b` so that no segment straddles either point.
    fn split_at(&mut self, a: u64, b: u64) {
        for p in [a, b] {
            if let Some((&s, &g)) = self.segs.range(..p).next_back()
                && g.end > p
            {
                self.segs.insert(s, Seg { end: p, done: g.done });
                self.segs.insert(p, Seg { end: g.end, done: g.done });
            }
        }
    }

    /// Removes every covered part of `[a, b)` and returns the removed pieces.
    pub fn take(&mut self, a: u64, b: u64) -> Vec<(u64, Seg)> {
        if a >= b {
            return Vec::new();
        }
        self.split_at(a, b);
        let starts: Vec<u64> = self.segs.range(a..b).map(|(&s, _)| s).collect();
        starts.into_iter().map(|s| (s, self.segs.remove(&s).expect("segment just listed"))).collect()
    }

    /// Marks every covered part of `[a, b)` as fetched.
    pub fn mark_done(&mut self, a: u64, b: u64) {
        if a >= b {
            return;
        }
        self.split_at(a, b);
        for (_, g) in self.segs.range_mut(a..b) {
            g.done = true;
        }
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (u64, Seg)> + '_ {
        self.segs.iter().map(|(&s, &g)| (s, g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(v: Vec<(u64, Seg)>) -> Vec<(u64, u64, bool)> {
        v.into_iter().map(|(s, g)| (s, g.end, g.done)).collect()
    }

    #[test]
    fn gaps_take_and_done() {
        let mut r = RangeSet::default();
        r.insert(10, 20);
        r.insert(30, 40);
        assert_eq!(r.gaps(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(r.gaps(12, 18), vec![]);
        assert_eq!(r.gaps(15, 35), vec![(20, 30)]);
        r.mark_done(15, 32);
        assert_eq!(pieces(r.iter().collect()), vec![(10, 15, false), (15, 20, true), (30, 32, true), (32, 40, false)]);
        assert_eq!(pieces(r.take(12, 31)), vec![(12, 15, false), (15, 20, true), (30, 31, true)]);
        assert_eq!(pieces(r.iter().collect()), vec![(10, 12, false), (31, 32, true), (32, 40, false)]);
        assert_eq!(r.total_bytes(), 2 + 1 + 8);
        assert!(r.take(5, 5).is_empty());
        assert_eq!(r.gaps(0, 50), vec![(0, 10), (12, 31), (40, 50)]);
    }

    #[test]
    fn merged_adds_coalesce_touching_ranges() {
        let mut r = RangeSet::default();
        r.add_merged(10, 20);
        r.add_merged(30, 40);
        r.add_merged(20, 25);
        assert_eq!(r.len(), 2);
        r.add_merged(24, 31);
        assert_eq!(pieces(r.iter().collect()), vec![(10, 40, true)]);
        r.add_merged(0, 5);
        r.add_merged(5, 5);
        assert_eq!(pieces(r.iter().collect()), vec![(0, 5, true), (10, 40, true)]);
    }
}
