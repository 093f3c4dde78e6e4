//! Heap buffers aligned for O_DIRECT.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::BLOCK_BYTES;

/// Rounds `len` up to a multiple of [`BLOCK_BYTES`].
pub(crate) fn round_up_to_block(len: usize) -> usize {
    len.div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

/// A heap buffer aligned to [`BLOCK_BYTES`].
///
/// The allocation is rounded up to a multiple of `BLOCK_BYTES`, so a buffer of any `len` can be
/// written with O_DIRECT: the drive receives [`padded_len`](Self::padded_len) bytes. The bytes
/// between `len` and the end of the allocation are always zero (the constructors and
/// [`truncate`](Self::truncate) keep it so), so the padding that reaches a drive never leaks
/// stale data.
///
/// The buffer is moved into an I/O request and handed back on completion; the heap memory
/// never moves while the kernel uses it.
///
/// A buffer may also be a read-only [`view`](Self::view) of whole blocks of another, shared
/// one: a drive writes a stripe's data shards straight from the buffer that collected the
/// data, without copying each shard out first.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Size of the allocation, a multiple of BLOCK_BYTES; 0 means nothing was allocated.
    capacity: usize,
    /// Every byte is initialised. Only a buffer made by [`AlignedBuf::for_read`] starts
    /// without, until the drive that reads into it has filled it.
    filled: bool,
    /// The allocation is a mapping of whole huge pages from [`big`], not the allocator's.
    big: bool,
    /// For a view: the buffer whose bytes these are, kept alive (and unchanged: a view is
    /// read-only and the owner is shared) until the view is dropped. Nothing is freed then.
    owner: Option<std::sync::Arc<AlignedBuf>>,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        let capacity = round_up_to_block(len);
        if capacity == 0 {
            return Self { ptr: Self::dangling(), len: 0, capacity: 0, filled: true, big: false, owner: None };
        }
        let layout = Self::layout(capacity);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        debug_assert_eq!(ptr.as_ptr() as usize % BLOCK_BYTES, 0);
        Self { ptr, len, capacity, filled: true, big: false, owner: None }
    }

    /// A buffer of `len` bytes (a multiple of BLOCK_BYTES) for a drive read to fill (or the
    /// allocation under a [`FillBuf`], which shows only what it was filled with), left
    /// uninitialised: zeroing MiB-sized buffers that a read overwrites anyway cost about a
    /// tenth of the daemon's CPU in a large GET. Nothing may look at its bytes before
    /// [`assume_filled`](Self::assume_filled), which a drive calls once the read has filled
    /// every byte (a drive read fills the whole buffer or fails, dropping it).
    ///
    /// Buffers of [`big::BYTES_MIN`] and more are whole huge pages, kept for reuse when freed
    /// (see [`big`]).
    pub(crate) fn for_read(len: usize) -> Self {
        Self::uninit(len, false)
    }

    /// [`for_read`](Self::for_read); `reclaim`: when no kept buffer of the size is free,
    /// first ask the registered [`Reclaim`]s to give one back (see [`FillBuf::with_room`]).
    fn uninit(len: usize, reclaim: bool) -> Self {
        assert!(len.is_multiple_of(BLOCK_BYTES), "a read buffer is whole blocks");
        if len == 0 {
            return Self::zeroed(0);
        }
        if len >= big::BYTES_MIN
            && let Some((ptr, capacity)) = big::take(len, reclaim)
        {
            return Self { ptr, len, capacity, filled: false, big: true, owner: None };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        Self { ptr, len, capacity: len, filled: false, big: false, owner: None }
    }

    /// Where the drive reads the byte at `at` into (`at` < the padded length).
    pub(crate) fn read_ptr(&mut self, at: usize) -> *mut u8 {
        assert!(self.owner.is_none(), "a view of a shared buffer is read-only");
        assert!(at < self.padded_len().max(1), "read pointer past the buffer");
        // SAFETY: `at` lies inside the allocation (or is 0 for an empty one).
        unsafe { self.ptr.as_ptr().add(at) }
    }

    /// Declares the buffer filled.
    ///
    /// # Safety
    /// Every byte of the allocation has been written (through [`read_ptr`](Self::read_ptr)).
    pub(crate) unsafe fn assume_filled(&mut self) {
        self.filled = true;
    }

    /// A buffer holding a copy of `data`, zero-padded to a multiple of BLOCK_BYTES.
    pub fn from_slice(data: &[u8]) -> Self {
        Self::from_slice_padded(data, data.len())
    }

    /// A buffer of `len` bytes (≥ `data.len()`) that starts with a copy of `data` and is zero
    /// after it. Only the padding is zero-filled, not the whole allocation: for MiB-sized
    /// shards this saves a memset of everything that is copied over anyway.
    pub fn from_slice_padded(data: &[u8], len: usize) -> Self {
        assert!(data.len() <= len, "data longer than the buffer");
        let capacity = round_up_to_block(len);
        if capacity == 0 {
            return Self { ptr: Self::dangling(), len: 0, capacity: 0, filled: true, big: false, owner: None };
        }
        let layout = Self::layout(capacity);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        // SAFETY: the allocation holds `capacity` bytes; the two writes cover it exactly, so
        // every byte is initialised before any slice of it is made.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), ptr.as_ptr(), data.len());
            std::ptr::write_bytes(ptr.as_ptr().add(data.len()), 0, capacity - data.len());
        }
        debug_assert_eq!(ptr.as_ptr() as usize % BLOCK_BYTES, 0);
        Self { ptr, len, capacity, filled: true, big: false, owner: None }
    }

    /// A read-only buffer of the `len` bytes at `start` of `owner`, sharing them: no copy.
    /// `start` and `len` are whole blocks within `owner`'s padded length, so the view needs
    /// no padding of its own and a drive can write it as it is. `owner` stays allocated, and
    /// unchanged, until every view of it is dropped.
    pub fn view(owner: &std::sync::Arc<AlignedBuf>, start: usize, len: usize) -> Self {
        assert!(start.is_multiple_of(BLOCK_BYTES) && len.is_multiple_of(BLOCK_BYTES), "a view is whole blocks");
        assert!(start.checked_add(len).is_some_and(|end| end <= owner.padded_len()), "a view past the end of its buffer");
        assert!(owner.filled, "a view of an unfilled read buffer");
        if len == 0 {
            return Self::zeroed(0);
        }
        // SAFETY: [start, start + len) lies inside the owner's allocation, checked above.
        let ptr = unsafe { NonNull::new_unchecked(owner.ptr.as_ptr().add(start)) };
        Self { ptr, len, capacity: len, filled: true, big: false, owner: Some(owner.clone()) }
    }

    /// Whether this buffer is a [`view`](Self::view) of another.
    pub fn is_view(&self) -> bool {
        self.owner.is_some()
    }

    /// For a huge-page buffer that goes back to the kept buffers when dropped (not a view),
    /// its capacity: the size [`Reclaim::reclaim`] is asked for.
    pub fn pool_capacity(&self) -> Option<usize> {
        (self.big && self.owner.is_none()).then_some(self.capacity)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` rounded up to a multiple of BLOCK_BYTES: the number of bytes a write transfers.
    pub fn padded_len(&self) -> usize {
        round_up_to_block(self.len)
    }

    /// Shortens the buffer to `len` bytes and zeroes the bytes cut off, so that the padding up
    /// to the next block boundary stays zero. Does nothing if `len` is not shorter.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        assert!(self.owner.is_none(), "a view of a shared buffer is read-only");
        let old_len = self.len;
        // SAFETY: [len, old_len) lies inside the allocation.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(len), 0, old_len - len) };
        self.len = len;
    }

    /// The buffer including its zero padding: what a write sends to a drive.
    pub(crate) fn padded(&self) -> &[u8] {
        assert!(self.filled, "bytes of an unfilled read buffer");
        // SAFETY: the allocation holds at least padded_len() initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.padded_len()) }
    }

    /// The buffer including its padding, writable: where a read lands.
    pub(crate) fn padded_mut(&mut self) -> &mut [u8] {
        assert!(self.filled, "bytes of an unfilled read buffer");
        assert!(self.owner.is_none(), "a view of a shared buffer is read-only");
        // SAFETY: as for `padded`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.padded_len()) }
    }

    /// Checks the invariant that the padding is zero. Only for debug assertions: it reads up
    /// to one block.
    pub(crate) fn padding_is_zero(&self) -> bool {
        self.padded()[self.len..].iter().all(|&b| b == 0)
    }

    fn dangling() -> NonNull<u8> {
        // An aligned, never dereferenced address for empty buffers, so that even an empty
        // buffer's pointer satisfies O_DIRECT's alignment rule.
        NonNull::new(BLOCK_BYTES as *mut u8).expect("BLOCK_BYTES is non-zero")
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, BLOCK_BYTES).expect("buffer size overflows isize")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // A view: the owner frees its bytes when its last holder drops it.
            return;
        }
        if self.big {
            big::give(self.ptr, self.capacity);
        } else if self.capacity != 0 {
            // SAFETY: allocated by a constructor with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) };
        }
    }
}

/// A holder of huge-page buffers that can let some of them go: the storage engine's data
/// cache, which keeps drive read buffers. When a [`FillBuf`] (a write buffer, an upload's
/// chunk) finds no kept buffer of its size, the holders are asked before fresh memory is
/// mapped: a buffer taken back is memory already faulted in, while a fresh mapping is
/// faulted in and zeroed page by page, which on the VMs measured doubled the CPU of a large
/// write that came right after the cache had taken the kept buffers.
pub trait Reclaim: Send + Sync {
    /// Drops buffers of `capacity` bytes that it holds (least useful first), stopping at the
    /// first one that goes back to the kept buffers; false when none did.
    fn reclaim(&self, capacity: usize) -> bool;
}

/// Registers a holder to be asked (see [`Reclaim`]); it is forgotten once dropped.
pub fn register_reclaim(holder: std::sync::Weak<dyn Reclaim>) {
    big::register(holder);
}

/// Large read buffers: mappings of whole 2 MiB huge pages, kept for reuse.
///
/// An O_DIRECT read lands wherever the buffer's pages lie in physical memory. A MiB-sized
/// buffer from the allocator is scattered over 4 KiB pages, so the block layer splits a 4 MiB
/// read into as many requests as the device's segment limit asks (about 1 MiB each on the
/// virtio disks measured, 254 segments): one 4 MiB request became six, and a drive read half
/// as fast (1.4 against 3.4 GB/s, docs/benchmarks.md). Huge pages are physically contiguous,
/// so a read into them stays one request. Where the kernel gives no huge pages (transparent
/// huge pages off), the buffers work the same, with 4 KiB pages.
///
/// Freed buffers are kept, up to [`kept_bytes_max`](big::kept_bytes_max) in all, so that the
/// next read of that size finds its pages already there: a fresh mapping is faulted in and
/// zeroed page by page when the kernel pins it for the read. A kept buffer is handed out again
/// only to a read, which overwrites every byte before anything looks at it, or to a
/// [`FillBuf`](super::FillBuf), which shows only the bytes filled into it.
mod big {
    use std::ptr::NonNull;
    use std::sync::{Arc, Weak};

    use parking_lot::Mutex;

    use super::Reclaim;

    /// Size of the huge pages asked for; buffers are whole multiples of it.
    const HUGE_PAGE_BYTES: usize = 2 << 20;
    /// Reads of this many bytes and more get a huge-page buffer.
    pub(super) const BYTES_MIN: usize = HUGE_PAGE_BYTES;
    /// Bytes of freed buffers kept for reuse in all; the rest are unmapped: 1/64 of the
    /// machine's memory, at least 64 MiB and at most 1 GiB. Write buffers and upload chunks
    /// come from here too, and the pool must hold what concurrent large writes cycle through
    /// (eight streams each with up to 32 MiB buffered, while a file's stripes go out): with
    /// 64 MiB, most stripe buffers were fresh mappings, and the kernel zeroing their pages
    /// took 29 % of the daemon's CPU in eight concurrent 64 MiB S3 PUTs.
    pub(super) fn kept_bytes_max() -> usize {
        static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *MAX.get_or_init(|| {
            (crate::memory_bytes() / 64).clamp(64 << 20, 1 << 30)
        })
    }

    struct Kept {
        /// (capacity, address) of each kept buffer, longest kept first.
        bufs: Vec<(usize, NonNull<u8>)>,
        bytes: usize,
    }
    // SAFETY: the kept mappings are owned by the pool alone until handed out again.
    unsafe impl Send for Kept {}

    static KEPT: Mutex<Kept> = Mutex::new(Kept { bufs: Vec::new(), bytes: 0 });

    /// Holders asked for buffers before a new mapping (see [`super::Reclaim`]).
    static RECLAIMERS: Mutex<Vec<Weak<dyn Reclaim>>> = Mutex::new(Vec::new());

    pub(super) fn register(holder: Weak<dyn Reclaim>) {
        let mut r = RECLAIMERS.lock();
        r.retain(|h| h.strong_count() > 0);
        r.push(holder);
    }

    /// A buffer of at least `len` bytes (its capacity, a multiple of the huge page size):
    /// a kept one of exactly that capacity, with `reclaim` one given back by a registered
    /// holder, or a new mapping. `None` when mapping fails.
    pub(super) fn take(len: usize, reclaim: bool) -> Option<(NonNull<u8>, usize)> {
        let capacity = len.next_multiple_of(HUGE_PAGE_BYTES);
        if let Some(p) = take_kept(capacity) {
            return Some((p, capacity));
        }
        // Only a size the pool keeps can come back through it (`give` unmaps larger ones).
        if reclaim && capacity <= kept_bytes_max() {
            // Asked outside the lock: a holder's buffers come back through `give`.
            let holders: Vec<Arc<dyn Reclaim>> = RECLAIMERS.lock().iter().filter_map(Weak::upgrade).collect();
            for h in holders {
                while h.reclaim(capacity) {
                    if let Some(p) = take_kept(capacity) {
                        return Some((p, capacity));
                    }
                }
            }
        }
        map(capacity).map(|p| (p, capacity))
    }

    fn take_kept(capacity: usize) -> Option<NonNull<u8>> {
        let mut k = KEPT.lock();
        let i = k.bufs.iter().rposition(|(c, _)| *c == capacity)?;
        k.bytes -= capacity;
        Some(k.bufs.remove(i).1)
    }

    /// Keeps a buffer from [`take`], unmapping the longest-kept ones as needed to stay within
    /// [`kept_bytes_max`]: what is kept follows the sizes reads use now, so buffers of a size
    /// no longer asked for do not crowd out the ones that are.
    pub(super) fn give(ptr: NonNull<u8>, capacity: usize) {
        let mut unmap = Vec::new();
        let max = kept_bytes_max();
        if capacity > max {
            unmap.push((capacity, ptr));
        } else {
            let mut k = KEPT.lock();
            let mut evicted = 0;
            while k.bytes + capacity > max {
                let old = k.bufs[evicted];
                k.bytes -= old.0;
                unmap.push(old);
                evicted += 1;
            }
            k.bufs.drain(..evicted);
            k.bytes += capacity;
            k.bufs.push((capacity, ptr));
        }
        for (capacity, ptr) in unmap {
            // SAFETY: a mapping of `capacity` bytes made by `map`, owned by nobody else now.
            unsafe { libc::munmap(ptr.as_ptr().cast(), capacity) };
        }
    }

    /// Bytes kept now.
    #[cfg(test)]
    pub(super) fn kept_bytes() -> usize {
        KEPT.lock().bytes
    }

    /// A private anonymous mapping of `capacity` bytes (a multiple of the huge page size),
    /// aligned to a huge page and marked for huge pages.
    fn map(capacity: usize) -> Option<NonNull<u8>> {
        debug_assert!(capacity.is_multiple_of(HUGE_PAGE_BYTES));
        // Map one huge page more, then cut the unaligned ends off.
        let span = capacity + HUGE_PAGE_BYTES;
        // SAFETY: a fresh anonymous mapping; no memory of ours is touched.
        let raw = unsafe {
            libc::mmap(std::ptr::null_mut(), span, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE_BYTES);
        let (head, tail) = (aligned - start, start + span - (aligned + capacity));
        // SAFETY: both ranges lie inside the mapping just made and outside the part kept.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + capacity) as *mut libc::c_void, tail);
            }
            // Advice only: without huge pages the buffer still works, with 4 KiB pages.
            libc::madvise(aligned as *mut libc::c_void, capacity, libc::MADV_HUGEPAGE);
        }
        NonNull::new(aligned as *mut u8)
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        assert!(self.filled, "bytes of an unfilled read buffer");
        // SAFETY: `len` bytes are initialised (zeroed or copied at allocation, or read into).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        assert!(self.filled, "bytes of an unfilled read buffer");
        assert!(self.owner.is_none(), "a view of a shared buffer is read-only");
        // SAFETY: as for Deref, with exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for AlignedBuf {}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish_non_exhaustive()
    }
}

/// An aligned buffer filled from the front: bytes collected before they are written to
/// drives (a file's write-buffer segment, an upload's chunk). [`freeze`](Self::freeze) turns
/// it into an [`AlignedBuf`] without copying, from which a stripe's data shards are written
/// as [views](AlignedBuf::view).
///
/// Its room is fixed when it is made; buffers of 2 MiB and more are huge-page mappings kept
/// for reuse like large read buffers (only the bytes filled are ever readable, so a reused
/// mapping's old bytes are never seen).
pub struct FillBuf {
    /// The allocation, `len` = its room; its bytes are hidden (`filled` false) and reached
    /// through the pointer, of which [0, `filled`) are initialised.
    buf: AlignedBuf,
    filled: usize,
}

impl FillBuf {
    /// An empty buffer with room for `room` bytes (rounded up to whole blocks).
    ///
    /// Of 2 MiB and more it is a kept huge-page buffer when one of that size is free, else
    /// one that a [`Reclaim`] holder gives back, else a new mapping: writes take memory back
    /// from the data cache rather than fault in more (read buffers do not, so a cache still
    /// filling up is not emptied by its own reads).
    pub fn with_room(room: usize) -> Self {
        Self { buf: AlignedBuf::uninit(round_up_to_block(room), true), filled: 0 }
    }

    /// A buffer holding `len` zero bytes, with room for `room` (at least `len`).
    pub fn zeroed(len: usize, room: usize) -> Self {
        let mut b = Self::with_room(room.max(len));
        // SAFETY: `len` ≤ the room, checked by the allocation above.
        unsafe { std::ptr::write_bytes(b.buf.ptr.as_ptr(), 0, len) };
        b.filled = len;
        b
    }

    pub fn len(&self) -> usize {
        self.filled
    }

    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Bytes it can hold in all.
    pub fn room(&self) -> usize {
        self.buf.len
    }

    /// Appends `data`, which must fit in the room left.
    pub fn extend_from_slice(&mut self, data: &[u8]) {
        assert!(data.len() <= self.room() - self.filled, "more bytes than the buffer has room for");
        // SAFETY: [filled, filled + data.len()) lies inside the allocation, checked above;
        // `data` cannot overlap it (we hold the buffer mutably).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.buf.ptr.as_ptr().add(self.filled), data.len()) };
        self.filled += data.len();
    }

    /// Makes room for `room` bytes in all, moving the bytes to a new buffer if needed.
    pub fn grow_to(&mut self, room: usize) {
        if room <= self.room() {
            return;
        }
        let mut bigger = Self::with_room(room);
        bigger.extend_from_slice(self);
        *self = bigger;
    }

    /// Shortens it to `len` bytes (no effect if not shorter).
    pub fn truncate(&mut self, len: usize) {
        self.filled = self.filled.min(len);
    }

    /// The bytes from `at` on, moved to a new buffer with room for `room`; this one keeps
    /// the first `at`.
    pub fn split_off(&mut self, at: usize, room: usize) -> FillBuf {
        assert!(at <= self.filled, "split past the end");
        let mut tail = Self::with_room(room.max(self.filled - at));
        tail.extend_from_slice(&self[at..]);
        self.filled = at;
        tail
    }

    /// The bytes as an [`AlignedBuf`] of their length, zero-padded to the next block.
    pub fn freeze(self) -> AlignedBuf {
        let FillBuf { mut buf, filled } = self;
        let padded = round_up_to_block(filled);
        // SAFETY: [filled, padded) lies inside the allocation (its room is whole blocks).
        unsafe { std::ptr::write_bytes(buf.ptr.as_ptr().add(filled), 0, padded - filled) };
        buf.len = filled;
        // SAFETY: [0, filled) was written by the methods above and [filled, padded) just now:
        // every byte a frozen buffer shows (its padded length) is initialised. The bytes past
        // `padded` in a larger allocation are never shown.
        unsafe { buf.assume_filled() };
        buf
    }
}

impl Deref for FillBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes are initialised.
        unsafe { std::slice::from_raw_parts(self.buf.ptr.as_ptr(), self.filled) }
    }
}

impl DerefMut for FillBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for Deref, with exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.as_ptr(), self.filled) }
    }
}

impl fmt::Debug for FillBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FillBuf").field("len", &self.filled).field("room", &self.room()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_alignment_and_zero_padding() {
        for len in [0, 1, 4095, 4096, 4097, 3 * 4096, 1 << 20] {
            let buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.is_empty(), len == 0);
            assert_eq!(buf.padded_len() % BLOCK_BYTES, 0);
            assert!(buf.padded_len() >= len && buf.padded_len() < len + BLOCK_BYTES);
            assert_eq!(buf.padded().as_ptr() as usize % BLOCK_BYTES, 0);
            assert!(buf.iter().all(|&b| b == 0));
            assert!(buf.padding_is_zero());
        }
    }

    /// A read buffer's bytes cannot be looked at before the drive declares it filled.
    #[test]
    #[should_panic(expected = "unfilled read buffer")]
    fn read_buffers_refuse_access_until_filled() {
        let buf = AlignedBuf::for_read(2 * BLOCK_BYTES);
        let _ = buf[0];
    }

    /// A write buffer that finds no kept buffer of its size takes one a registered holder
    /// lets go of; a read buffer does not ask.
    #[test]
    fn write_buffers_take_back_what_holders_let_go() {
        // A size no other test uses, so that no kept buffer of it is free.
        const CAP: usize = 14 << 20;
        struct Holder(parking_lot::Mutex<Vec<AlignedBuf>>);
        impl Reclaim for Holder {
            fn reclaim(&self, capacity: usize) -> bool {
                capacity == CAP && self.0.lock().pop().is_some()
            }
        }
        let held: Vec<AlignedBuf> = (0..2).map(|_| AlignedBuf::for_read(CAP)).collect();
        let addrs: Vec<usize> = held.iter().map(|b| b.ptr.as_ptr() as usize).collect();
        assert!(held.iter().all(|b| b.pool_capacity() == Some(CAP)));
        let holder = std::sync::Arc::new(Holder(parking_lot::Mutex::new(held)));
        let dyn_holder: std::sync::Arc<dyn Reclaim> = holder.clone();
        register_reclaim(std::sync::Arc::downgrade(&dyn_holder));
        let read = AlignedBuf::for_read(CAP);
        assert!(!addrs.contains(&(read.ptr.as_ptr() as usize)), "a read buffer maps memory of its own");
        assert_eq!(holder.0.lock().len(), 2);
        let mut write = FillBuf::with_room(CAP);
        assert_eq!(write.buf.ptr.as_ptr() as usize, addrs[1], "the write buffer is the one let go of");
        assert_eq!(holder.0.lock().len(), 1);
        // Other sizes leave the holder alone; views and small buffers go back nowhere.
        let other = FillBuf::with_room(2 << 20);
        assert_eq!(holder.0.lock().len(), 1);
        write.extend_from_slice(&[7u8; BLOCK_BYTES]);
        let shared = std::sync::Arc::new(write.freeze());
        assert_eq!(AlignedBuf::view(&shared, 0, BLOCK_BYTES).pool_capacity(), None);
        assert_eq!(AlignedBuf::zeroed(BLOCK_BYTES).pool_capacity(), None);
        drop((read, other, shared));
    }

    #[test]
    fn read_buffers_hold_what_was_read_into_them() {
        let mut buf = AlignedBuf::for_read(2 * BLOCK_BYTES);
        assert_eq!(buf.read_ptr(0) as usize % BLOCK_BYTES, 0);
        for at in 0..buf.padded_len() {
            // SAFETY: `at` is inside the allocation.
            unsafe { buf.read_ptr(at).write(at as u8) };
        }
        // SAFETY: every byte was written above.
        unsafe { buf.assume_filled() };
        assert!(buf.iter().enumerate().all(|(i, &b)| b == i as u8));
    }

    /// Large read buffers start on a huge page, hold what was read into them, and come back
    /// for the next read of their size once dropped; their bytes are hidden again until that
    /// read has filled them.
    #[test]
    fn large_read_buffers_are_huge_page_aligned_and_reused() {
        for len in [big::BYTES_MIN, 4 << 20, (4 << 20) + BLOCK_BYTES] {
            let mut buf = AlignedBuf::for_read(len);
            assert_eq!(buf.len(), len);
            let at = buf.read_ptr(0) as usize;
            assert_eq!(at % big::BYTES_MIN, 0, "{len} bytes start on a huge page");
            for i in (0..len).step_by(BLOCK_BYTES) {
                // SAFETY: `i` and the block after it are inside the allocation.
                unsafe { std::ptr::write_bytes(buf.read_ptr(i), (i / BLOCK_BYTES) as u8, BLOCK_BYTES) };
            }
            // SAFETY: every byte was written above.
            unsafe { buf.assume_filled() };
            assert!(buf.chunks(BLOCK_BYTES).enumerate().all(|(i, c)| c.iter().all(|&b| b == i as u8)));
            drop(buf);
            let mut again = AlignedBuf::for_read(len);
            assert_eq!(again.read_ptr(0) as usize, at, "a dropped buffer is kept for the next read of its size");
            let hidden = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| again[0]));
            assert!(hidden.is_err(), "a kept buffer's old bytes are not readable before a read fills it");
        }
        // More freed than is kept: the pool stays within its bound, keeping the latest.
        let n = big::kept_bytes_max() / (8 << 20) + 3;
        let bufs: Vec<AlignedBuf> = (0..n).map(|_| AlignedBuf::for_read(8 << 20)).collect();
        let last = bufs.last().unwrap().ptr.as_ptr() as usize;
        drop(bufs);
        assert!(big::kept_bytes() <= big::kept_bytes_max());
        let mut again = AlignedBuf::for_read(8 << 20);
        assert_eq!(again.read_ptr(0) as usize, last, "the last freed is kept");
    }

    #[test]
    fn from_slice_copies_and_pads() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8 + 1).collect();
        let buf = AlignedBuf::from_slice(&data);
        assert_eq!(&buf[..], &data[..]);
        assert_eq!(buf.padded_len(), 8192);
        assert!(buf.padding_is_zero());
        assert_eq!(buf.clone(), buf);
    }

    #[test]
    fn truncate_zeroes_the_cut_off_bytes() {
        let mut buf = AlignedBuf::from_slice(&[0xAB; 9000]);
        buf.truncate(5000);
        assert_eq!(buf.len(), 5000);
        assert_eq!(buf.padded_len(), 8192);
        assert!(buf.padding_is_zero());
        assert!(buf.iter().all(|&b| b == 0xAB));
        buf.truncate(6000); // longer: no effect
        assert_eq!(buf.len(), 5000);
        buf.truncate(0);
        assert!(buf.is_empty());
        assert_eq!(buf.padded_len(), 0);
    }

    #[test]
    fn fill_buffers_append_split_grow_and_freeze_padded() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut f = FillBuf::with_room(3000);
        assert_eq!(f.room(), 4096);
        f.extend_from_slice(&data[..3000]);
        f.grow_to(20_000);
        assert!(f.room() >= 20_000);
        f.extend_from_slice(&data[3000..]);
        assert_eq!(&f[..], &data[..]);
        f[0] = 0xEE;
        let tail = f.split_off(8192, 4 << 20);
        assert_eq!(&tail[..], &data[8192..]);
        assert_eq!(tail.room(), 4 << 20);
        assert_eq!(f.len(), 8192);
        let frozen = f.freeze();
        assert_eq!(frozen.len(), 8192);
        assert_eq!(frozen[0], 0xEE);
        assert_eq!(&frozen[1..], &data[1..8192]);
        let t = tail.freeze();
        assert_eq!(t.len(), 10_000 - 8192);
        assert_eq!(t.padded_len(), 4096);
        assert!(t.padding_is_zero());
        assert_eq!(&FillBuf::zeroed(5, 10).freeze()[..], &[0u8; 5]);
    }

    /// A huge-page fill buffer reused after a read buffer of the same size shows none of its
    /// old bytes, and its padding is zero when frozen.
    #[test]
    fn reused_fill_buffers_show_only_what_was_filled() {
        // A size no other test uses, so that tests running at once do not take each other's.
        let mut r = AlignedBuf::for_read(10 << 20);
        for i in (0..10 << 20).step_by(BLOCK_BYTES) {
            // SAFETY: inside the allocation.
            unsafe { std::ptr::write_bytes(r.read_ptr(i), 0xAA, BLOCK_BYTES) };
        }
        // SAFETY: every byte was written above.
        unsafe { r.assume_filled() };
        let at = r.read_ptr(0) as usize;
        drop(r);
        let mut f = FillBuf::with_room(10 << 20);
        assert_eq!(f.buf.ptr.as_ptr() as usize, at, "the freed read buffer is reused");
        assert!(f.is_empty());
        f.extend_from_slice(&[7; 100]);
        let b = f.freeze();
        assert_eq!(&b[..], &[7; 100]);
        assert!(b.padding_is_zero());
    }

    #[test]
    fn views_share_whole_blocks_and_keep_their_owner() {
        let data: Vec<u8> = (0..4 * BLOCK_BYTES as u32).map(|i| (i % 253) as u8).collect();
        let owner = std::sync::Arc::new(AlignedBuf::from_slice(&data));
        let v = AlignedBuf::view(&owner, BLOCK_BYTES, 2 * BLOCK_BYTES);
        assert!(v.is_view() && !owner.is_view());
        assert_eq!(&v[..], &data[BLOCK_BYTES..3 * BLOCK_BYTES]);
        assert_eq!(v.padded_len(), v.len());
        let at = v.as_ptr() as usize;
        drop(owner);
        // The view keeps the bytes alive.
        assert_eq!(v.as_ptr() as usize, at);
        assert_eq!(&v[..BLOCK_BYTES], &data[BLOCK_BYTES..2 * BLOCK_BYTES]);
        let copy = v.clone();
        assert!(!copy.is_view());
        assert_eq!(copy, v);
    }

    #[test]
    #[should_panic(expected = "read-only")]
    fn views_are_read_only() {
        let owner = std::sync::Arc::new(AlignedBuf::zeroed(BLOCK_BYTES));
        let mut v = AlignedBuf::view(&owner, 0, BLOCK_BYTES);
        v[0] = 1;
    }

    #[test]
    #[should_panic(expected = "whole blocks")]
    fn views_are_whole_blocks() {
        let owner = std::sync::Arc::new(AlignedBuf::zeroed(2 * BLOCK_BYTES));
        let _ = AlignedBuf::view(&owner, 1, BLOCK_BYTES);
    }

    #[test]
    fn writes_through_deref_mut() {
        let mut buf = AlignedBuf::zeroed(10);
        buf[3] = 7;
        assert_eq!(buf[3], 7);
        assert_eq!(buf.padded()[3], 7);
    }
}

#[cfg(test)]
mod padded_tests {
    use super::*;

    #[test]
    fn from_slice_padded_copies_and_zero_fills_the_rest() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8 + 1).collect();
        let b = AlignedBuf::from_slice_padded(&data, 9000);
        assert_eq!(b.len(), 9000);
        assert_eq!(&b[..5000], &data[..]);
        assert!(b[5000..].iter().all(|x| *x == 0));
        assert!(b.padding_is_zero());
        assert_eq!(AlignedBuf::from_slice_padded(&[], 0).len(), 0);
        assert!(AlignedBuf::from_slice_padded(&[], 4096).iter().all(|x| *x == 0));
    }
}
