//! Data plane: drives with superblocks, a per-drive allocator, and erasure-coded stripes
//! (docs/formats/superblock.md, docs/formats/shard.md).
//!
//! A stripe holds up to k × `shard_bytes_max` bytes of one file: data shard i holds data bytes
//! [i·shard_bytes, (i+1)·shard_bytes), zero padded; m parity shards follow. Every shard is one
//! contiguous allocation on a different drive. crc32c of every 64 KiB checksum block of every
//! shard lives in the stripe record (metadata), so a read can verify exactly what it read and a
//! misdirected or lost write is caught as well as bit rot.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hardware::{AlignedBuf, BLOCK_BYTES, BlockDevice, IoCompletion};
use parking_lot::{Mutex, RwLock};

use crate::ec::Codec;
use crate::error::{Error, Result};
use crate::records::{CHECKSUM_BLOCK_BYTES, Placement, StripeRec};

/// First byte of the allocatable area of every drive; the superblock lives in block 0.
pub(crate) const DATA_AREA_OFFSET: u64 = 1 << 20;
/// Largest drive read [`DataStore::read_many_chunked`] makes of shard pieces that lie back to back.
pub(crate) const READ_RUN_BYTES_MAX: u64 = 8 << 20;

/// Bytes appended in order into buffers of `chunk` bytes each, every buffer allocated once
/// at its final size.
struct Chunks {
    chunks: Vec<Vec<u8>>,
    chunk: usize,
    total: usize,
    len: usize,
}

impl Chunks {
    fn new(total: usize, chunk: usize) -> Chunks {
        Chunks { chunks: Vec::new(), chunk, total, len: 0 }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The last buffer with room, a new one if it is full.
    fn room(&mut self) -> &mut Vec<u8> {
        if self.chunks.last().is_none_or(|c| c.len() == self.chunk) {
            let cap = self.chunk.min(self.total.saturating_sub(self.len)).max(1);
            self.chunks.push(Vec::with_capacity(cap));
        }
        self.chunks.last_mut().expect("just pushed")
    }

    fn extend(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let chunk = self.chunk;
            let c = self.room();
            let n = (chunk - c.len()).min(b.len());
            c.extend_from_slice(&b[..n]);
            self.len += n;
            b = &b[n..];
        }
    }
}

/// Zeros that [`ReadBytes`] of holes point into.
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// Bytes of a read where they lie: a slice of the buffer one drive request read into (the
/// pieces of one request share it), zeros, or a buffer of their own (inline data,
/// reconstructed or overlaid bytes). Cloning shares the buffer; a protocol can send a reply
/// straight from it instead of copying the bytes into one buffer first.
#[derive(Clone)]
pub struct ReadBytes {
    buf: Arc<Backing>,
    range: std::ops::Range<usize>,
}

enum Backing {
    Drive(AlignedBuf),
    Owned(Vec<u8>),
    Zeros,
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Drive(b) => b,
            Backing::Owned(v) => v,
            Backing::Zeros => &ZEROS,
        }
    }
}

impl ReadBytes {
    /// `n` zero bytes, in pieces of at most 1 MiB (they all point at one static block).
    fn zeros(mut n: usize, out: &mut Vec<ReadBytes>) {
        let zeros = Arc::new(Backing::Zeros);
        while n > 0 {
            let k = n.min(ZEROS.len());
            out.push(ReadBytes { buf: zeros.clone(), range: 0..k });
            n -= k;
        }
    }

    /// The capacity of the drive read buffer these lie in, when dropping its last holder
    /// gives it back to the kept huge-page buffers (`AlignedBuf::pool_capacity`).
    pub(crate) fn pool_capacity(&self) -> Option<usize> {
        match &*self.buf {
            Backing::Drive(b) => b.pool_capacity(),
            _ => None,
        }
    }

    /// All of `buf`, as if a drive had read it (tests of the cache).
    #[cfg(test)]
    pub(crate) fn from_drive_buf(buf: AlignedBuf) -> ReadBytes {
        let n = buf.len();
        ReadBytes { buf: Arc::new(Backing::Drive(buf)), range: 0..n }
    }

    /// Whether these are the only holder of their buffer, so that dropping them frees it.
    pub(crate) fn sole_holder(&self) -> bool {
        Arc::strong_count(&self.buf) == 1
    }

    /// The bytes `range` of these (relative to their start), sharing the buffer.
    pub fn slice(&self, range: std::ops::Range<usize>) -> ReadBytes {
        assert!(range.start <= range.end && range.end <= self.len(), "slice past the bytes");
        ReadBytes { buf: self.buf.clone(), range: self.range.start + range.start..self.range.start + range.end }
    }

    /// Bytes `[a, b)` of a read's pieces taken as one run (a protocol's read-ahead window): a
    /// slice sharing the piece's buffer when one piece holds them all (READs of a shard's size
    /// at shard boundaries, what sequential readers send), else a copy. `None` when the pieces
    /// end before `b` (the file was shorter when it was read).
    pub fn slice_of(pieces: &[ReadBytes], a: usize, b: usize) -> Option<ReadBytes> {
        let mut parts = Self::slices_of(pieces, a, b);
        let first = parts.next()?;
        let one = match parts.next() {
            None => first,
            Some(second) => {
                let mut copy = Vec::with_capacity(b - a);
                for p in [first, second].into_iter().chain(parts) {
                    copy.extend_from_slice(&p);
                }
                copy.into()
            }
        };
        (one.len() == b - a).then_some(one)
    }

    /// The parts of bytes `[a, b)` of a read's pieces taken as one run, in order, each a slice
    /// sharing its piece's buffer; they hold fewer than `b - a` bytes when the pieces end
    /// before `b`.
    pub fn slices_of(pieces: &[ReadBytes], a: usize, b: usize) -> impl Iterator<Item = ReadBytes> + '_ {
        let mut at = 0;
        pieces
            .iter()
            .map(move |p| {
                let pa = at;
                at += p.len();
                (pa, p)
            })
            .filter(move |&(pa, p)| pa + p.len() > a)
            .take_while(move |&(pa, _)| pa < b)
            .map(move |(pa, p)| p.slice(a.max(pa) - pa..b.min(pa + p.len()) - pa))
    }
}

impl From<Vec<u8>> for ReadBytes {
    fn from(v: Vec<u8>) -> ReadBytes {
        let n = v.len();
        ReadBytes { buf: Arc::new(Backing::Owned(v)), range: 0..n }
    }
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.bytes()[self.range.clone()]
    }
}

/// So that a protocol's send buffer (`bytes::Bytes::from_owner`) can hold read bytes where they
/// lie.
impl AsRef<[u8]> for ReadBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for ReadBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadBytes").field("len", &self.len()).finish_non_exhaustive()
    }
}

/// One piece of a [`DataStore::read_many_chunked`]: stripe data, or zeros for a hole.
pub(crate) enum ReadPiece<'a> {
    /// `len` data bytes at `offset` of stripe `id` (`rec`).
    Stripe { id: u64, rec: &'a StripeRec, offset: u64, len: usize },
    Zeros(usize),
}

impl ReadPiece<'_> {
    fn len(&self) -> usize {
        match self {
            ReadPiece::Stripe { len, .. } | ReadPiece::Zeros(len) => *len,
        }
    }
}
pub(crate) const SUPERBLOCK_MAGIC: &[u8; 8] = b"AQFRDRV\0";
pub(crate) const SUPERBLOCK_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Superblock {
    pub drive_uuid: [u8; 16],
    pub cluster_uuid: [u8; 16],
    pub drive_index: u32,
    pub epoch: u32,
    pub capacity_bytes: u64,
}

impl Superblock {
    pub fn encode(&self) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(BLOCK_BYTES);
        b[0..8].copy_from_slice(SUPERBLOCK_MAGIC);
        b[8..12].copy_from_slice(&SUPERBLOCK_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(BLOCK_BYTES as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.drive_uuid);
        b[32..48].copy_from_slice(&self.cluster_uuid);
        b[48..52].copy_from_slice(&self.drive_index.to_le_bytes());
        b[52..56].copy_from_slice(&self.epoch.to_le_bytes());
        b[56..64].copy_from_slice(&self.capacity_bytes.to_le_bytes());
        b[64..72].copy_from_slice(&DATA_AREA_OFFSET.to_le_bytes());
        let crc = crate::records::crc32c(&b[0..72]);
        b[72..76].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Superblock, String> {
        if b.len() < 76 {
            return Err("superblock shorter than 76 bytes".into());
        }
        if &b[0..8] != SUPERBLOCK_MAGIC {
            return Err("no Aquifer superblock (bad magic)".into());
        }
        let crc = u32::from_le_bytes(b[72..76].try_into().expect("4"));
        if crc != crate::records::crc32c(&b[0..72]) {
            return Err("superblock checksum mismatch".into());
        }
        let le32 = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().expect("4"));
        let le64 = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8"));
        let version = le32(8..12);
        if version != SUPERBLOCK_VERSION {
            return Err(format!("superblock format version {version} is not supported"));
        }
        if le32(12..16) as usize != BLOCK_BYTES || le64(64..72) != DATA_AREA_OFFSET {
            return Err("superblock geometry differs from this build".into());
        }
        Ok(Superblock {
            drive_uuid: b[16..32].try_into().expect("16"),
            cluster_uuid: b[32..48].try_into().expect("16"),
            drive_index: le32(48..52),
            epoch: le32(52..56),
            capacity_bytes: le64(56..64),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriveState {
    /// Serving reads and writes.
    Online,
    /// Not usable: missing, unreadable, wrong superblock, or taken offline after I/O errors.
    Failed(String),
    /// A replacement being filled by a rebuild job; shards it already holds are readable.
    Rebuilding,
}

impl DriveState {
    pub fn as_str(&self) -> &'static str {
        match self {
            DriveState::Online => "online",
            DriveState::Failed(_) => "failed",
            DriveState::Rebuilding => "rebuilding",
        }
    }
}

/// One drive slot of the node. The slot keeps its index when a drive is replaced; the
/// epoch distinguishes the replacement from the drive it replaces.
pub(crate) struct DriveSlot {
    pub index: u32,
    pub path: PathBuf,
    pub uuid: [u8; 16],
    pub epoch: u32,
    pub pool: u16,
    pub capacity_bytes: u64,
    pub state: DriveState,
    pub dev: Option<Arc<dyn BlockDevice>>,
    pub counters: Arc<DriveCounters>,
}

#[derive(Default, Debug)]
pub struct DriveCounters {
    pub read_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub checksum_errors: AtomicU64,
    pub repaired_shards: AtomicU64,
}

/// Public view of a drive for the admin API.
#[derive(Debug, Clone)]
pub struct DriveInfo {
    pub index: u32,
    pub path: PathBuf,
    pub uuid: String,
    pub epoch: u32,
    pub pool: String,
    pub state: DriveState,
    pub backend: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    pub repaired_shards: u64,
}

/// Free space of one drive: offset → length, both in bytes and block aligned.
#[derive(Debug, Default, Clone)]
pub(crate) struct Allocator {
    free: BTreeMap<u64, u64>,
    pub capacity: u64,
    pub used: u64,
    cursor: u64,
}

impl Allocator {
    /// All of the data area free.
    pub fn new(capacity_bytes: u64) -> Allocator {
        let mut a = Allocator { capacity: 0, ..Default::default() };
        let end = capacity_bytes / BLOCK_BYTES as u64 * BLOCK_BYTES as u64;
        if end > DATA_AREA_OFFSET {
            a.free.insert(DATA_AREA_OFFSET, end - DATA_AREA_OFFSET);
            a.capacity = end - DATA_AREA_OFFSET;
        }
        a.cursor = DATA_AREA_OFFSET;
        a
    }

    pub fn free_bytes(&self) -> u64 {
        self.capacity - self.used
    }

    /// Next-fit: keeps consecutive stripes near each other, so sequential files stay sequential
    /// on every drive.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        debug_assert!(len > 0 && len.is_multiple_of(BLOCK_BYTES as u64));
        let pick = self
            .free
            .range(self.cursor..)
            .chain(self.free.range(..self.cursor))
            .find(|(_, l)| **l >= len)
            .map(|(o, l)| (*o, *l));
        let (off, flen) = pick?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        self.used += len;
        self.cursor = off + len;
        Some(off)
    }

    /// Marks a range used (at startup, from stripe records). False when it overlaps free
    /// space incompletely, which means two records claim the same blocks.
    pub fn claim(&mut self, off: u64, len: u64) -> bool {
        let Some((&foff, &flen)) = self.free.range(..=off).next_back() else { return false };
        if foff + flen < off + len {
            return false;
        }
        self.free.remove(&foff);
        if off > foff {
            self.free.insert(foff, off - foff);
        }
        if foff + flen > off + len {
            self.free.insert(off + len, foff + flen - off - len);
        }
        self.used += len;
        true
    }

    pub fn release(&mut self, off: u64, len: u64) {
        debug_assert!(off >= DATA_AREA_OFFSET && len.is_multiple_of(BLOCK_BYTES as u64));
        assert!(self.used >= len, "release of more than is allocated");
        self.used -= len;
        let (mut start, mut total) = (off, len);
        if let Some((&poff, &plen)) = self.free.range(..off).next_back() {
            assert!(poff + plen <= off, "double free at {off} on a drive");
            if poff + plen == off {
                self.free.remove(&poff);
                start = poff;
                total += plen;
            }
        }
        if let Some((&noff, &nlen)) = self.free.range(off + 1..).next() {
            assert!(off + len <= noff, "double free at {off} on a drive");
            if off + len == noff {
                self.free.remove(&noff);
                total += nlen;
            }
        }
        self.free.insert(start, total);
    }
}

/// A stripe whose shard writes are in flight.
pub(crate) struct PendingStripe {
    pub rec: StripeRec,
    pending: Vec<(Placement, IoCompletion<AlignedBuf>)>,
}

/// A storage pool: a set of drives and the stripe geometry used on them.
pub(crate) struct Pool {
    pub name: String,
    pub k: usize,
    pub m: usize,
    pub codec: Codec,
    pub drives: Vec<u32>,
    /// Largest shard; a stripe holds at most k × this many data bytes.
    pub shard_bytes_max: u32,
}

impl Pool {
    pub fn stripe_data_max(&self) -> u64 {
        self.k as u64 * self.shard_bytes_max as u64
    }
}

pub(crate) struct DataStore {
    pub drives: RwLock<Vec<DriveSlot>>,
    pub alloc: Mutex<Vec<Allocator>>,
    pub pools: Vec<Pool>,
    /// Blocks freed by committed metadata that is not yet known durable. They become
    /// allocatable only after the next metadata sync: otherwise a power loss could roll the
    /// metadata back to a stripe whose blocks had already been overwritten.
    pending_free: Mutex<(u64, std::collections::VecDeque<(u64, u32, u32, u64, u64)>)>,
    /// Counts releases of pending frees into the allocators (see [`free_epoch`](Self::free_epoch)).
    frees_released: AtomicU64,
    /// Consecutive I/O errors after which a drive is taken offline.
    pub drive_errors_max: u64,
    /// Bit i: drive i has writes that were not fdatasynced yet.
    dirty: AtomicU64,
    /// Drive syncs, shared by concurrent durable operations.
    drive_sync: crate::group_sync::GroupSync,
    /// Verified data shards kept for reads.
    pub cache: Arc<crate::cache::DataCache>,
}

fn round_up_block(n: u64) -> u64 {
    n.div_ceil(BLOCK_BYTES as u64) * BLOCK_BYTES as u64
}

impl DataStore {
    pub fn new(drives: Vec<DriveSlot>, pools: Vec<Pool>, cache_bytes: usize) -> DataStore {
        assert!(drives.len() <= 64, "a node holds at most 64 drives");
        let alloc = drives.iter().map(|d| Allocator::new(d.capacity_bytes)).collect();
        DataStore {
            drives: RwLock::new(drives),
            alloc: Mutex::new(alloc),
            pools,
            pending_free: Mutex::new((0, std::collections::VecDeque::new())),
            frees_released: AtomicU64::new(0),
            drive_errors_max: 16,
            dirty: AtomicU64::new(0),
            drive_sync: Default::default(),
            cache: crate::cache::DataCache::new_shared(cache_bytes),
        }
    }

    fn device(&self, p: &Placement) -> Option<(Arc<dyn BlockDevice>, Arc<DriveCounters>)> {
        let drives = self.drives.read();
        let d = drives.get(p.drive as usize)?;
        if p.epoch == 0 || p.epoch != d.epoch {
            return None;
        }
        match d.state {
            DriveState::Online | DriveState::Rebuilding => {
                d.dev.clone().map(|dev| (dev, d.counters.clone()))
            }
            DriveState::Failed(_) => None,
        }
    }

    /// Whether a placement still holds its shard (drive present, same epoch).
    pub fn placement_valid(&self, p: &Placement) -> bool {
        self.device(p).is_some()
    }

    fn note_io_error(&self, drive: u32, what: &str, err: &std::io::Error) {
        let mut drives = self.drives.write();
        if let Some(d) = drives.get_mut(drive as usize) {
            let n = if what == "read" {
                d.counters.read_errors.fetch_add(1, Ordering::Relaxed) + 1
            } else {
                d.counters.write_errors.fetch_add(1, Ordering::Relaxed) + 1
            };
            tracing::warn!(drive, path = %d.path.display(), "{what} error: {err}");
            if n >= self.drive_errors_max && d.state == DriveState::Online {
                tracing::error!(drive, "taking drive offline after {n} {what} errors");
                d.state = DriveState::Failed(format!("{n} {what} errors, last: {err}"));
            }
        }
    }

    /// Chooses k+m distinct drives for a new stripe: online drives with the most free space
    /// first. Drives that are down get a placement with epoch 0 (nothing written): the
    /// stripe is born degraded and rebuild fills it later. At least k+1 shards must land.
    fn choose(&self, pool: &Pool, len: u64) -> Result<Vec<(u32, Option<u64>)>> {
        let n = pool.k + pool.m;
        let drives = self.drives.read();
        let mut alloc = self.alloc.lock();
        let mut candidates: Vec<(u32, u64)> = pool
            .drives
            .iter()
            .filter(|&&i| {
                let d = &drives[i as usize];
                d.state == DriveState::Online && d.dev.is_some()
            })
            .map(|&i| (i, alloc[i as usize].free_bytes()))
            .filter(|(_, free)| *free >= len)
            .collect();
        candidates.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        candidates.truncate(n);
        if candidates.len() < (pool.k + 1).min(n) {
            return Err(Error::NoSpace(format!(
                "pool {} needs at least {} usable drives with {} bytes free, has {}",
                pool.name,
                pool.k + 1,
                len,
                candidates.len()
            )));
        }
        let mut out = Vec::with_capacity(n);
        for (i, _) in &candidates {
            match alloc[*i as usize].alloc(len) {
                Some(off) => out.push((*i, Some(off))),
                None => {
                    for (d, off) in &out {
                        if let Some(off) = off {
                            alloc[*d as usize].release(*off, len);
                        }
                    }
                    return Err(Error::NoSpace(format!("drive {i} has no contiguous {len} bytes")));
                }
            }
        }
        // Missing shards go to drives of the pool that are down, so rebuild knows where.
        for &i in &pool.drives {
            if out.len() == n {
                break;
            }
            if !out.iter().any(|(d, _)| *d == i) {
                out.push((i, None));
            }
        }
        while out.len() < n {
            out.push((u32::MAX, None));
        }
        Ok(out)
    }

    /// Erasure-codes the bytes `range` of `src` into a new stripe (refs = 0; the caller
    /// commits it with the extents that use it) and submits its shard writes without waiting
    /// for them, so that several stripes can be in flight at once; `finish_stripe` waits.
    /// Every full data shard that starts on a block boundary of `src` is written from `src`
    /// itself (a view), not copied first; `src` is only read.
    pub fn start_stripe(&self, pool_id: u16, src: &Arc<AlignedBuf>, range: std::ops::Range<usize>) -> Result<PendingStripe> {
        let data = &src[range.clone()];
        let base = range.start;
        let pool = &self.pools[pool_id as usize];
        assert!(!data.is_empty() && data.len() as u64 <= pool.stripe_data_max());
        let shard_bytes = round_up_block(data.len().div_ceil(pool.k) as u64) as usize;
        let n = pool.k + pool.m;
        // Data shards are views of the source where whole and block-aligned, else copies of
        // the data (zero-padded at the end of the stripe).
        let data_shards: Vec<AlignedBuf> = (0..pool.k)
            .map(|i| {
                let from = (i * shard_bytes).min(data.len());
                let to = ((i + 1) * shard_bytes).min(data.len());
                if to - from == shard_bytes && (base + from).is_multiple_of(BLOCK_BYTES) {
                    AlignedBuf::view(src, base + from, shard_bytes)
                } else {
                    AlignedBuf::from_slice_padded(&data[from..to], shard_bytes)
                }
            })
            .collect();
        // Parity shards: one buffer for all of them (a reused huge-page mapping for MiB-sized
        // shards), zeroed, filled by the encoder, then written as views.
        let mut parity = hardware::FillBuf::zeroed(pool.m * shard_bytes, pool.m * shard_bytes);
        {
            let data_refs: Vec<&[u8]> = data_shards.iter().map(|s| &s[..]).collect();
            let mut parity_refs: Vec<&mut [u8]> = parity.chunks_mut(shard_bytes).collect();
            pool.codec.encode_sep(&data_refs, &mut parity_refs).map_err(|e| Error::Io(format!("erasure encode: {e}")))?;
        }
        let parity = Arc::new(parity.freeze());
        let shards: Vec<AlignedBuf> =
            data_shards.into_iter().chain((0..pool.m).map(|j| AlignedBuf::view(&parity, j * shard_bytes, shard_bytes))).collect();
        debug_assert_eq!(shards.len(), n);
        let blocks = (shard_bytes as u32).div_ceil(CHECKSUM_BLOCK_BYTES) as usize;
        let mut crcs = Vec::with_capacity(n * blocks);
        for s in &shards {
            for b in s.chunks(CHECKSUM_BLOCK_BYTES as usize) {
                crcs.push(crate::records::crc32c(b));
            }
        }
        let chosen = self.choose(pool, shard_bytes as u64)?;
        let epochs: Vec<u32> = {
            let drives = self.drives.read();
            chosen
                .iter()
                .map(|(d, off)| match off {
                    Some(_) => drives[*d as usize].epoch,
                    None => 0,
                })
                .collect()
        };
        let mut placements = Vec::with_capacity(n);
        let mut pending = Vec::new();
        for (i, (shard, (drive, off))) in shards.into_iter().zip(chosen.iter()).enumerate() {
            let p = Placement { drive: *drive, epoch: epochs[i], offset: off.unwrap_or(0) };
            if off.is_some() {
                match self.device(&p) {
                    Some((dev, _)) => pending.push((p, dev.write(p.offset, shard))),
                    None => {
                        placements.push(Placement { epoch: 0, ..p });
                        continue;
                    }
                }
            }
            placements.push(p);
        }
        let rec = StripeRec {
            pool: pool_id,
            k: pool.k as u8,
            m: pool.m as u8,
            shard_bytes: shard_bytes as u32,
            data_len: data.len() as u64,
            refs: 0,
            placements,
            crcs,
        };
        Ok(PendingStripe { rec, pending })
    }

    /// Waits for a started stripe's shard writes. On error its space is freed.
    pub fn finish_stripe(&self, ps: PendingStripe) -> Result<StripeRec> {
        let mut failed = None;
        for (p, c) in ps.pending {
            if let Err(e) = c.wait() {
                self.note_io_error(p.drive, "write", &e);
                failed = Some(format!("write shard to drive {}: {e}", p.drive));
            }
        }
        if let Some(msg) = failed {
            self.free_now(&ps.rec);
            return Err(Error::Io(msg));
        }
        for p in Self::allocated(&ps.rec) {
            self.dirty.fetch_or(1 << p.drive, Ordering::AcqRel);
        }
        Ok(ps.rec)
    }

    /// fdatasyncs every drive written since its last sync, in parallel. Data written by
    /// unstable flushes becomes durable here, before the metadata that names it is synced.
    /// Makes every write that finished before this call durable. Concurrent callers share
    /// one round of syncs; a caller never returns on the strength of a round that started
    /// before its writes finished (it would if it only saw the dirty bits already taken).
    pub fn sync_dirty(&self) -> Result<()> {
        self.drive_sync.sync(|| self.sync_dirty_now())
    }

    fn sync_dirty_now(&self) -> Result<()> {
        let bits = self.dirty.swap(0, Ordering::AcqRel);
        if bits == 0 {
            return Ok(());
        }
        let devs: Vec<(u32, Arc<dyn BlockDevice>)> = {
            let drives = self.drives.read();
            (0..64u32)
                .filter(|i| bits & (1 << i) != 0)
                .filter_map(|i| drives.get(i as usize).and_then(|d| d.dev.clone()).map(|dev| (i, dev)))
                .collect()
        };
        let syncs: Vec<(u32, IoCompletion<()>)> = devs.iter().map(|(i, dev)| (*i, dev.sync())).collect();
        let mut failed = None;
        for (d, c) in syncs {
            if let Err(e) = c.wait() {
                // Still dirty: the next durable operation tries again.
                self.dirty.fetch_or(1 << d, Ordering::AcqRel);
                self.note_io_error(d, "write", &e);
                failed = Some(Error::Io(format!("sync drive {d}: {e}")));
            }
        }
        failed.map_or(Ok(()), Err)
    }

    fn allocated(rec: &StripeRec) -> impl Iterator<Item = &Placement> {
        rec.placements.iter().filter(|p| p.epoch != 0 && p.drive != u32::MAX)
    }

    /// Frees a stripe that no metadata ever referenced (a failed write).
    pub fn free_now(&self, rec: &StripeRec) {
        let drives = self.drives.read();
        let mut alloc = self.alloc.lock();
        for p in Self::allocated(rec) {
            if drives.get(p.drive as usize).is_some_and(|d| d.epoch == p.epoch) {
                alloc[p.drive as usize].release(p.offset, rec.shard_bytes as u64);
            }
        }
    }

    /// Queues a stripe's blocks for reuse once the metadata that dropped it is durable.
    /// Call only after the batch that dropped the stripe was written.
    pub fn free_after_sync(&self, rec: &StripeRec) {
        let mut pending = self.pending_free.lock();
        let seq = pending.0;
        pending.0 += 1;
        for p in Self::allocated(rec) {
            pending.1.push_back((seq, p.drive, p.epoch, p.offset, rec.shard_bytes as u64));
        }
    }

    /// Whether freed blocks wait for a metadata sync before they can be allocated again.
    pub fn frees_pending(&self) -> bool {
        !self.pending_free.lock().1.is_empty()
    }

    /// Changes each time pending frees become allocatable. An allocation that failed may
    /// succeed when tried again if frees were pending then ([`frees_pending`](Self::frees_pending))
    /// or this changed since it was tried: a sync on another thread may have released them
    /// in between.
    pub fn free_epoch(&self) -> u64 {
        // Moved under the queue's lock, after the blocks reached the allocators: a reader
        // that finds the queue without them (`frees_pending`, which waits for the lock) then
        // sees this moved.
        self.frees_released.load(Ordering::Acquire)
    }

    /// A mark taken before a metadata sync: the sync covers every free queued before it.
    pub fn pending_mark(&self) -> u64 {
        self.pending_free.lock().0
    }

    /// Makes the frees queued before `mark` allocatable (their metadata is durable now).
    pub fn release_pending(&self, mark: u64) {
        // The queue stays locked until the blocks are in the allocators, so that no writer
        // sees the queue empty while the space is not allocatable yet (lock order: queue,
        // drives, allocators; nothing takes the queue while holding the others).
        let mut pending = self.pending_free.lock();
        let mut drained = Vec::new();
        while pending.1.front().is_some_and(|e| e.0 < mark) {
            drained.push(pending.1.pop_front().expect("front"));
        }
        if drained.is_empty() {
            return;
        }
        let drives = self.drives.read();
        let mut alloc = self.alloc.lock();
        for (_, d, epoch, off, len) in drained {
            // A shard on a drive that has since been replaced was never claimed on the new one.
            if drives.get(d as usize).is_some_and(|s| s.epoch == epoch) {
                alloc[d as usize].release(off, len);
            }
        }
        self.frees_released.fetch_add(1, Ordering::Release);
        drop(pending);
    }

    /// Registers the blocks of a committed stripe at startup.
    pub fn claim(&self, rec: &StripeRec) -> Result<()> {
        let drives = self.drives.read();
        let mut alloc = self.alloc.lock();
        for p in Self::allocated(rec) {
            let Some(d) = drives.get(p.drive as usize) else { continue };
            if d.epoch != p.epoch {
                continue; // shard lost with a replaced drive; rebuild will place it again
            }
            if !alloc[p.drive as usize].claim(p.offset, rec.shard_bytes as u64) {
                return Err(Error::Corrupt(format!(
                    "two stripes claim drive {} offset {}",
                    p.drive, p.offset
                )));
            }
        }
        Ok(())
    }

    /// Reads `len` data bytes at `offset` within a stripe, verifying checksums; falls back to
    /// reconstruction from parity when a shard is missing, unreadable or corrupt.
    pub fn read_range(&self, rec: &StripeRec, offset: u64, len: usize) -> Result<Vec<u8>> {
        assert!(offset + len as u64 <= rec.data_len, "read past stripe data");
        let sb = rec.shard_bytes as u64;
        let cb = CHECKSUM_BLOCK_BYTES as u64;
        let blocks = rec.checksum_blocks();
        // Filled piece by piece in order (the pieces tile the range), so never zeroed first.
        let mut out = Vec::with_capacity(len);
        // (shard, read start in shard, bytes read, completion)
        let mut reads = Vec::new();
        let mut pos = offset;
        let end = offset + len as u64;
        let mut ok = true;
        while pos < end {
            let shard = (pos / sb) as usize;
            let in_shard = pos % sb;
            let piece_end = ((shard as u64 + 1) * sb).min(end);
            let a = in_shard / cb * cb;
            let b = ((piece_end - shard as u64 * sb).div_ceil(cb) * cb).min(sb);
            let p = rec.placements[shard];
            match self.device(&p) {
                Some((dev, _)) => reads.push((shard, a, b, pos, piece_end, dev.read(p.offset + a, (b - a) as usize))),
                None => ok = false,
            }
            pos = piece_end;
        }
        for (shard, a, b, from, to, comp) in reads {
            match comp.wait() {
                Ok(buf) => {
                    let first = (a / cb) as usize;
                    let mut good = true;
                    for (j, chunk) in buf[..(b - a) as usize].chunks(cb as usize).enumerate() {
                        if crate::records::crc32c(chunk) != rec.crcs[shard * blocks + first + j] {
                            good = false;
                        }
                    }
                    if !good {
                        // Counted once, by `read_shards`, when the reconstruction reads it again.
                        tracing::warn!(drive = rec.placements[shard].drive, "checksum mismatch, reconstructing");
                        ok = false;
                        continue;
                    }
                    let src = (from - shard as u64 * sb - a) as usize;
                    let n = (to - from) as usize;
                    if ok {
                        debug_assert_eq!(out.len() as u64, from - offset, "pieces arrive in order");
                        out.extend_from_slice(&buf[src..src + n]);
                    }
                }
                Err(e) => {
                    self.note_io_error(rec.placements[shard].drive, "read", &e);
                    ok = false;
                }
            }
        }
        if ok {
            debug_assert_eq!(out.len(), len);
            return Ok(out);
        }
        let data = self.reconstruct_data(rec)?;
        out.clear();
        out.extend_from_slice(&data[offset as usize..offset as usize + len]);
        Ok(out)
    }

    /// Reads a run of pieces, in order: stripe data ranges and zeros
    /// (holes). All drive reads are in flight at once, and shard pieces that lie back to
    /// back on one drive (consecutive stripes of a sequentially written file do) are read
    /// with one request of up to [`READ_RUN_BYTES_MAX`]: on the disks measured, a 4 MiB
    /// request moves two to three times what four 1 MiB requests do. Checksums are verified
    /// piece by piece; a piece whose drive is missing, fails or returns bad data is read
    /// again alone through [`read_range`](Self::read_range), which reconstructs it.
    ///
    /// The bytes are answered where they lie: slices of the drive requests' buffers, in
    /// order, with no copy (see [`ReadBytes`]).
    pub fn read_many_shared(&self, pieces: &[ReadPiece<'_>]) -> Result<Vec<ReadBytes>> {
        let sb_of = |rec: &StripeRec| rec.shard_bytes as u64;
        let cb = CHECKSUM_BLOCK_BYTES as u64;
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        // Shard pieces: (piece index, shard, block-aligned [a, b) in the shard, the piece's
        // [from, to) in stripe data). Pieces a drive cannot serve are left to read_range.
        struct Part {
            piece: usize,
            shard: usize,
            a: u64,
            b: u64,
            from: u64,
            to: u64,
            drive: u32,
            disk: u64,
            /// The shard's data, kept in the cache: no drive request.
            cached: Option<ReadBytes>,
            /// Read whole (`a`..`b` cover its data) to be kept in the cache.
            keep: bool,
        }
        let mut parts: Vec<Part> = Vec::new();
        let mut direct = vec![true; pieces.len()];
        for (i, piece) in pieces.iter().enumerate() {
            let ReadPiece::Stripe { id, rec, offset, len } = piece else { continue };
            assert!(offset + *len as u64 <= rec.data_len, "read past stripe data");
            let sb = sb_of(rec);
            let (mut pos, end) = (*offset, offset + *len as u64);
            let first = parts.len();
            while pos < end {
                let shard = (pos / sb) as usize;
                let piece_end = ((shard as u64 + 1) * sb).min(end);
                let mut a = (pos % sb) / cb * cb;
                let mut b = ((piece_end - shard as u64 * sb).div_ceil(cb) * cb).min(sb);
                let p = rec.placements[shard];
                let cached = self.cache.get(*id, shard);
                if cached.is_none() && self.device(&p).is_none() {
                    direct[i] = false;
                    break;
                }
                let data_len = rec.shard_data_len(shard);
                let keep = cached.is_none() && self.cache.note_read(*id, shard, piece_end - pos, data_len);
                if keep {
                    (a, b) = (0, (data_len.div_ceil(cb) * cb).min(sb));
                }
                parts.push(Part { piece: i, shard, a, b, from: pos, to: piece_end, drive: p.drive, disk: p.offset + a, cached, keep });
                pos = piece_end;
            }
            if !direct[i] {
                parts.truncate(first);
            }
        }
        // Runs: parts back to back on one drive, read with one request.
        let mut order: Vec<usize> = (0..parts.len()).filter(|&j| parts[j].cached.is_none()).collect();
        order.sort_by_key(|&j| (parts[j].drive, parts[j].disk));
        // (drive placement to read from, disk offset, bytes); part j lies at run_of[j].1 in run run_of[j].0.
        let mut runs: Vec<(Placement, u64, u64)> = Vec::new();
        let mut run_of = vec![(0usize, 0u64); parts.len()];
        for &j in &order {
            let part = &parts[j];
            let len = part.b - part.a;
            let rec = match &pieces[part.piece] {
                ReadPiece::Stripe { rec, .. } => rec,
                ReadPiece::Zeros(_) => unreachable!("parts come from stripe pieces"),
            };
            let placement = rec.placements[part.shard];
            let last = runs.len().wrapping_sub(1);
            match runs.last_mut() {
                Some((p, start, n)) if p.drive == part.drive && p.epoch == placement.epoch && *start + *n == part.disk && *n + len <= READ_RUN_BYTES_MAX => {
                    run_of[j] = (last, *n);
                    *n += len;
                }
                _ => {
                    run_of[j] = (runs.len(), 0);
                    runs.push((placement, part.disk, len));
                }
            }
        }
        let mut pending: Vec<Option<IoCompletion<AlignedBuf>>> =
            runs.iter().map(|(p, start, n)| self.device(p).map(|(dev, _)| dev.read(*start, *n as usize))).collect();
        let mut done: Vec<Option<std::result::Result<Arc<Backing>, ()>>> = (0..runs.len()).map(|_| None).collect();
        // Parts of each piece in stripe order (they were pushed so).
        let mut parts_of: Vec<Vec<usize>> = vec![Vec::new(); pieces.len()];
        for (j, part) in parts.iter().enumerate() {
            parts_of[part.piece].push(j);
        }
        let mut out: Vec<ReadBytes> = Vec::with_capacity(parts.len() + pieces.len());
        let mut out_len = 0usize;
        for (i, piece) in pieces.iter().enumerate() {
            let (id, rec, offset, len) = match piece {
                ReadPiece::Zeros(n) => {
                    ReadBytes::zeros(*n, &mut out);
                    out_len += n;
                    continue;
                }
                ReadPiece::Stripe { id, rec, offset, len } => (*id, *rec, *offset, *len),
            };
            let (start, start_len) = (out.len(), out_len);
            let mut ok = direct[i];
            for &j in &parts_of[i] {
                if !ok {
                    break;
                }
                let part = &parts[j];
                let shard_start = part.shard as u64 * sb_of(rec);
                if let Some(c) = &part.cached {
                    out.push(c.slice((part.from - shard_start) as usize..(part.to - shard_start) as usize));
                    out_len += (part.to - part.from) as usize;
                    continue;
                }
                let (r, at) = run_of[j];
                if done[r].is_none() {
                    done[r] = Some(match pending[r].take().map(|c| c.wait()) {
                        Some(Ok(buf)) => Ok(Arc::new(Backing::Drive(buf))),
                        Some(Err(e)) => {
                            self.note_io_error(runs[r].0.drive, "read", &e);
                            Err(())
                        }
                        None => Err(()),
                    });
                }
                let Some(Ok(buf)) = &done[r] else {
                    ok = false;
                    break;
                };
                let run_buf = buf.clone();
                let bytes = &buf.bytes()[at as usize..(at + part.b - part.a) as usize];
                let blocks = rec.checksum_blocks();
                let first = (part.a / cb) as usize;
                let good = bytes.chunks(cb as usize).enumerate().all(|(k, chunk)| crate::records::crc32c(chunk) == rec.crcs[part.shard * blocks + first + k]);
                if !good {
                    // Counted once, by `read_shards`, when `read_range` reconstructs the piece.
                    tracing::warn!(drive = part.drive, "checksum mismatch, reconstructing");
                    ok = false;
                    break;
                }
                let src = at as usize + (part.from - shard_start - part.a) as usize;
                let n = (part.to - part.from) as usize;
                if part.keep {
                    // The shard's whole data, verified: kept for the next reads.
                    let whole = at as usize..at as usize + rec.shard_data_len(part.shard) as usize;
                    self.cache.insert(id, part.shard, ReadBytes { buf: run_buf.clone(), range: whole });
                }
                out.push(ReadBytes { buf: run_buf, range: src..src + n });
                out_len += n;
            }
            if !ok {
                out.truncate(start);
                out.push(self.read_range(rec, offset, len)?.into());
                out_len = start_len + len;
            }
            debug_assert_eq!(out[start..].iter().map(|b| b.len()).sum::<usize>(), len, "a piece is read whole");
        }
        debug_assert_eq!(out_len, total);
        Ok(out)
    }

    /// [`read_many_shared`](Self::read_many_shared) with the bytes copied into buffers of
    /// `chunk_bytes` each (the last one shorter), so a read of many stripes needs no buffer
    /// as large as itself (one above the allocator's mmap threshold is mapped, faulted in
    /// page by page and unmapped on every read).
    pub fn read_many_chunked(&self, pieces: &[ReadPiece<'_>], chunk_bytes: usize) -> Result<Vec<Vec<u8>>> {
        assert!(chunk_bytes > 0, "chunks hold at least one byte");
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        let mut out = Chunks::new(total, chunk_bytes);
        for b in self.read_many_shared(pieces)? {
            out.extend(&b);
        }
        debug_assert_eq!(out.len(), total);
        Ok(out.chunks)
    }

    /// Reads every shard in full; None for missing, unreadable or corrupt ones.
    pub fn read_shards(&self, rec: &StripeRec) -> Vec<Option<Vec<u8>>> {
        let blocks = rec.checksum_blocks();
        let comps: Vec<_> = rec
            .placements
            .iter()
            .map(|p| self.device(p).map(|(dev, c)| (dev.read(p.offset, rec.shard_bytes as usize), c)))
            .collect();
        comps
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let (comp, counters) = c?;
                match comp.wait() {
                    Ok(buf) => {
                        let good = buf[..rec.shard_bytes as usize]
                            .chunks(CHECKSUM_BLOCK_BYTES as usize)
                            .enumerate()
                            .all(|(j, ch)| crate::records::crc32c(ch) == rec.crcs[i * blocks + j]);
                        if good {
                            Some(buf[..rec.shard_bytes as usize].to_vec())
                        } else {
                            counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                            None
                        }
                    }
                    Err(e) => {
                        self.note_io_error(rec.placements[i].drive, "read", &e);
                        None
                    }
                }
            })
            .collect()
    }

    /// The stripe's data bytes, rebuilt from any k good shards.
    pub fn reconstruct_data(&self, rec: &StripeRec) -> Result<Vec<u8>> {
        let pool = &self.pools[rec.pool as usize];
        let mut shards = self.read_shards(rec);
        let present = shards.iter().filter(|s| s.is_some()).count();
        if present < rec.k as usize {
            return Err(Error::Unavailable(format!(
                "stripe has {present} good shards, needs {}",
                rec.k
            )));
        }
        pool.codec
            .reconstruct_data(&mut shards)
            .map_err(|e| Error::Unavailable(format!("reconstruct: {e}")))?;
        let mut data = Vec::with_capacity(rec.data_len as usize);
        for s in shards.iter().take(rec.k as usize) {
            data.extend_from_slice(s.as_ref().expect("reconstructed"));
        }
        data.truncate(rec.data_len as usize);
        Ok(data)
    }

    /// Rewrites shard `i` of a stripe in place (scrub repair), verified by its checksums.
    pub fn rewrite_shard(&self, rec: &StripeRec, i: usize, shard: &[u8]) -> Result<()> {
        let blocks = rec.checksum_blocks();
        for (j, ch) in shard.chunks(CHECKSUM_BLOCK_BYTES as usize).enumerate() {
            assert_eq!(crate::records::crc32c(ch), rec.crcs[i * blocks + j], "repair data does not match its checksum");
        }
        let p = rec.placements[i];
        let (dev, c) = self
            .device(&p)
            .ok_or_else(|| Error::Unavailable(format!("drive {} is not available", p.drive)))?;
        dev.write(p.offset, AlignedBuf::from_slice(shard))
            .wait()
            .and_then(|_| dev.sync().wait())
            .map_err(|e| Error::Io(format!("repair shard on drive {}: {e}", p.drive)))?;
        c.repaired_shards.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes shard `i` to a fresh allocation on `drive` (rebuild) and returns its placement.
    pub fn place_shard(&self, rec: &StripeRec, drive: u32, shard: &[u8]) -> Result<Placement> {
        let (epoch, dev) = {
            let drives = self.drives.read();
            let d = drives
                .get(drive as usize)
                .ok_or_else(|| Error::InvalidArgument(format!("no drive {drive}")))?;
            (d.epoch, d.dev.clone().ok_or_else(|| Error::Unavailable(format!("drive {drive} not open")))?)
        };
        let len = rec.shard_bytes as u64;
        let off = self.alloc.lock()[drive as usize]
            .alloc(len)
            .ok_or_else(|| Error::NoSpace(format!("drive {drive} is full")))?;
        let res = dev.write(off, AlignedBuf::from_slice(shard)).wait();
        if let Err(e) = res {
            self.alloc.lock()[drive as usize].release(off, len);
            return Err(Error::Io(format!("write rebuilt shard to drive {drive}: {e}")));
        }
        Ok(Placement { drive, epoch, offset: off })
    }

    pub fn sync_drive(&self, drive: u32) -> Result<()> {
        let dev = self.drives.read().get(drive as usize).and_then(|d| d.dev.clone());
        if let Some(dev) = dev {
            dev.sync().wait().map_err(|e| Error::Io(format!("sync drive {drive}: {e}")))?;
        }
        Ok(())
    }

    /// Undo a placement made by `place_shard` that could not be committed.
    pub fn unplace(&self, p: &Placement, len: u64) {
        self.alloc.lock()[p.drive as usize].release(p.offset, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read inside one piece shares its buffer; one across pieces is a copy of the same
    /// bytes; one past the window's end is not answered from it.
    #[test]
    fn reads_are_sliced_from_a_piece_or_copied_across_pieces() {
        let whole: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        let pieces: Vec<ReadBytes> = [0..1000, 1000..1024, 1024..3000].into_iter().map(|r| ReadBytes::from(whole[r].to_vec())).collect();
        for (a, b) in [(0, 1000), (10, 20), (1000, 1024), (1024, 3000), (999, 1001), (0, 3000), (500, 2500), (2999, 3000), (5, 5)] {
            let got = ReadBytes::slice_of(&pieces, a, b);
            assert_eq!(got.as_deref(), Some(&whole[a..b]), "[{a}, {b})");
        }
        assert!(ReadBytes::slice_of(&pieces, 2000, 3001).is_none(), "past the window's end");
        assert!(ReadBytes::slice_of(&[], 0, 1).is_none());
        // Inside one piece: the same memory, no copy.
        let got = ReadBytes::slice_of(&pieces, 1100, 1200).unwrap();
        assert!(std::ptr::eq(got.as_ptr(), pieces[2][76..].as_ptr()), "a read inside a piece shares its buffer");
        assert_eq!(&*got, &whole[1100..1200]);
        assert_eq!(pieces[2].len(), 1976, "the piece a slice was taken from is untouched");
    }

    /// The parts of a run share their pieces' buffers, hold its bytes in order, and fall short
    /// where the pieces end.
    #[test]
    fn runs_are_the_pieces_slices() {
        let whole: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
        let pieces: Vec<ReadBytes> = [0..1000, 1000..1000, 1000..1024, 1024..3000].into_iter().map(|r| ReadBytes::from(whole[r].to_vec())).collect();
        for (a, b) in [(0, 3000), (500, 2500), (999, 1001), (1000, 1024), (1024, 1025), (5, 5), (1000, 1000), (2999, 3000)] {
            let parts: Vec<ReadBytes> = ReadBytes::slices_of(&pieces, a, b).collect();
            assert_eq!(parts.iter().flat_map(|p| p.to_vec()).collect::<Vec<u8>>(), &whole[a..b], "[{a}, {b})");
            for p in &parts {
                assert!(pieces.iter().any(|q| q.as_ptr_range().contains(&p.as_ptr()) || p.is_empty()), "[{a}, {b}): a part that is not a piece's slice");
            }
        }
        let short: Vec<ReadBytes> = ReadBytes::slices_of(&pieces, 2500, 3500).collect();
        assert_eq!(short.iter().flat_map(|p| p.to_vec()).collect::<Vec<u8>>(), &whole[2500..3000], "past the pieces' end");
        assert_eq!(ReadBytes::slices_of(&[], 0, 10).count(), 0);
    }

    #[test]
    fn superblock_round_trip_and_damage() {
        let sb = Superblock {
            drive_uuid: [1; 16],
            cluster_uuid: [2; 16],
            drive_index: 3,
            epoch: 4,
            capacity_bytes: 1 << 30,
        };
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        for i in 0..76 {
            let mut d = b.to_vec();
            d[i] ^= 0x40;
            assert!(Superblock::decode(&d).is_err(), "flip at {i} not detected");
        }
    }

    #[test]
    fn allocator_alloc_claim_release() {
        let mut a = Allocator::new(DATA_AREA_OFFSET + 16 * 4096);
        assert_eq!(a.free_bytes(), 16 * 4096);
        let x = a.alloc(4 * 4096).unwrap();
        let y = a.alloc(4 * 4096).unwrap();
        assert_ne!(x, y);
        assert_eq!(a.free_bytes(), 8 * 4096);
        a.release(x, 4 * 4096);
        a.release(y, 4 * 4096);
        assert_eq!(a.free_bytes(), 16 * 4096);
        assert_eq!(a.free.len(), 1, "neighbours merge");
        assert!(a.claim(DATA_AREA_OFFSET + 4096, 4096));
        assert!(!a.claim(DATA_AREA_OFFSET + 4096, 4096), "double claim detected");
        assert!(a.alloc(16 * 4096).is_none());
        assert_eq!(a.free_bytes(), 15 * 4096);
    }
}
