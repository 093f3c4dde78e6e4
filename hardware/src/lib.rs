//! Drives and the machine they sit in.
//!
//! This crate is the bottom of Aquifer's crate graph: it knows how to move aligned blocks to
//! and from a drive (a block device or a preallocated file) and what hardware a node has. It
//! knows nothing about stripes, checksums or the namespace; those belong to `storage-engine`.
//!
//! A drive is a [`BlockDevice`]. There are three real implementations, chosen by
//! [`open_drive`]:
//! - io_uring ([`IoBackendKind::IoUring`]): one dedicated thread per drive owns a ring and keeps
//!   up to `queue_depth_max` requests in flight.
//! - pread/pwrite ([`IoBackendKind::Pread`]): one dedicated thread per drive, one request at a
//!   time; used where the kernel or a container's seccomp profile refuses io_uring.
//! - memory ([`MemDrive`]): for tests and for nodes without drives.
//!
//! [`FaultyDrive`] wraps any of them to inject crashes, I/O errors and corruption in tests.
//!
//! Every offset, length and buffer is a multiple of [`BLOCK_BYTES`]; buffers are
//! [`AlignedBuf`]s so that O_DIRECT can DMA straight into them.

mod buf;
mod completion;
mod drive;
mod faulty;
mod inventory;
mod mem;
pub mod pagecache;
mod pread;
mod uring;

pub use buf::{AlignedBuf, FillBuf, Reclaim, register_reclaim};
pub use completion::IoCompletion;
pub use drive::{BackendChoice, DriveOpenOptions, create_file_drive, io_uring_available, open_drive};
pub use faulty::{FaultControl, FaultyDrive};
pub use inventory::{BlockDeviceInfo, Inventory, inventory};
pub use mem::MemDrive;

/// Bytes of memory the machine has (0 when the system does not say).
pub fn memory_bytes() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages.max(0) as usize).saturating_mul(page.max(0) as usize)
}

/// Bytes an unprivileged writer may still allocate on the filesystem holding `path`
/// (`statvfs`: available blocks times the fragment size).
pub fn available_bytes(path: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a NUL-terminated path and `st` a zeroed statvfs that the call fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Alignment of every drive offset, length and buffer. 4096 covers the logical block size of
/// every NVMe and SATA drive Aquifer targets and the page size, which O_DIRECT requires.
pub const BLOCK_BYTES: usize = 4096;

/// Which I/O path a drive uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoBackendKind {
    IoUring,
    Pread,
    Memory,
}

/// One drive: a block device or a preallocated file.
///
/// Offsets and lengths are multiples of [`BLOCK_BYTES`]. A misaligned request is a bug in the
/// caller: it panics in debug builds (debug_assert) and fails with `InvalidInput` in release
/// builds. A request that reaches beyond [`capacity_bytes`](Self::capacity_bytes) fails with
/// `InvalidInput`; a drive never returns a short read or write.
///
/// Requests are submitted without blocking (except for back-pressure when a drive's submission
/// queue is full) and complete through [`IoCompletion::wait`], so one thread can keep many
/// requests in flight on many drives.
pub trait BlockDevice: Send + Sync + 'static {
    /// Usable size of the drive, a multiple of [`BLOCK_BYTES`].
    fn capacity_bytes(&self) -> u64;

    /// Human-readable name of the drive for logs and errors, e.g. its path.
    fn describe(&self) -> String;

    /// The I/O path this drive uses.
    fn backend(&self) -> IoBackendKind;

    /// Whether I/O bypasses the page cache (O_DIRECT). Health and admin views show this,
    /// because buffered I/O on a drive means writes are only durable after [`sync`](Self::sync)
    /// and reads may be served from memory.
    fn direct_io(&self) -> bool {
        false
    }

    /// Reads `len` bytes at `offset`.
    fn read(&self, offset: u64, len: usize) -> IoCompletion<AlignedBuf>;

    /// Writes `buf.padded_len()` bytes at `offset` and hands the buffer back on completion.
    fn write(&self, offset: u64, buf: AlignedBuf) -> IoCompletion<AlignedBuf>;

    /// Makes every write that completed before this call durable (fdatasync). Writes that were
    /// submitted but not yet complete when `sync` was called are covered too.
    fn sync(&self) -> IoCompletion<()>;
}
