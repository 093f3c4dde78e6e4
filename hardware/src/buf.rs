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
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Size of the allocation, a multiple of BLOCK_BYTES; 0 means nothing was allocated.
    capacity: usize,
    /// Every byte is initialised. Only a buffer made by [`AlignedBuf::for_read`] starts
    /// without, until the drive that reads into it has filled it.
    filled: bool,
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
            return Self { ptr: Self::dangling(), len: 0, capacity: 0, filled: true };
        }
        let layout = Self::layout(capacity);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        debug_assert_eq!(ptr.as_ptr() as usize % BLOCK_BYTES, 0);
        Self { ptr, len, capacity, filled: true }
    }

    /// A buffer of `len` bytes (a multiple of BLOCK_BYTES) for a drive read to fill, left
    /// uninitialised: zeroing MiB-sized buffers that a read overwrites anyway cost about a
    /// tenth of the daemon's CPU in a large GET. Nothing may look at its bytes before
    /// [`assume_filled`](Self::assume_filled), which a drive calls once the read has filled
    /// every byte (a drive read fills the whole buffer or fails, dropping it).
    pub(crate) fn for_read(len: usize) -> Self {
        assert!(len.is_multiple_of(BLOCK_BYTES), "a read buffer is whole blocks");
        if len == 0 {
            return Self::zeroed(0);
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        Self { ptr, len, capacity: len, filled: false }
    }

    /// Where the drive reads the byte at `at` into (`at` < the padded length).
    pub(crate) fn read_ptr(&mut self, at: usize) -> *mut u8 {
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
            return Self { ptr: Self::dangling(), len: 0, capacity: 0, filled: true };
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
        Self { ptr, len, capacity, filled: true }
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
        if self.capacity != 0 {
            // SAFETY: allocated by a constructor with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) };
        }
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
        // SAFETY: as for Deref, with exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
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
