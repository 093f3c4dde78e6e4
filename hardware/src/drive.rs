//! Opening and creating drives, and the front half shared by the threaded backends.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crate::completion::Completer;
use crate::{AlignedBuf, BLOCK_BYTES, BlockDevice, IoBackendKind, IoCompletion, pread, uring};

/// Requests a caller may queue for one drive's I/O thread before `read`/`write`/`sync` block
/// (back-pressure). Large enough that a stripe writer never waits on it while the ring has room.
pub(crate) const SUBMIT_QUEUE_REQUESTS_MAX: usize = 1024;

/// Upper bound for `DriveOpenOptions::queue_depth_max`; io_uring rings beyond this buy nothing
/// for one drive and pin kernel memory.
pub(crate) const QUEUE_DEPTH_MAX_LIMIT: u32 = 4096;

/// Which I/O path [`open_drive`] should use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring where the kernel allows it, pread/pwrite otherwise.
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// pread/pwrite on a dedicated thread.
    Pread,
}

#[derive(Clone, Debug)]
pub struct DriveOpenOptions {
    pub backend: BackendChoice,
    /// Try O_DIRECT; when the filesystem refuses it, fall back to buffered I/O (logged).
    pub direct_io: bool,
    /// Requests in flight at once on an io_uring drive (the ring size).
    pub queue_depth_max: u32,
}

impl Default for DriveOpenOptions {
    fn default() -> Self {
        Self { backend: BackendChoice::Auto, direct_io: true, queue_depth_max: 64 }
    }
}

/// One request travelling from a drive's front to its I/O thread. The request owns its buffer
/// until the thread hands it back through the completer.
pub(crate) enum Request {
    /// `buf` is from [`AlignedBuf::for_read`], exactly the requested length; the data lands
    /// in it, and it is handed back only once every byte was read.
    Read { offset: u64, buf: AlignedBuf, done: Completer<AlignedBuf> },
    Write { offset: u64, buf: AlignedBuf, done: Completer<AlignedBuf> },
    Sync { done: Completer<()> },
}

/// Checks one request against a drive's geometry.
///
/// Misalignment is a caller bug: it trips a debug assertion, and release builds turn it into an
/// `InvalidInput` error rather than letting O_DIRECT fail in a less obvious way. Reaching past
/// the end is an `InvalidInput` error in every build, because the offset may come from
/// metadata read off a disk.
pub(crate) fn check_io(drive: &str, op: &str, offset: u64, len: usize, capacity: u64) -> io::Result<()> {
    let aligned = offset.is_multiple_of(BLOCK_BYTES as u64) && len.is_multiple_of(BLOCK_BYTES);
    debug_assert!(
        aligned,
        "{op} of {len} bytes at offset {offset} on drive {drive}: offset and length must be multiples of {BLOCK_BYTES}"
    );
    if !aligned {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{op} of {len} bytes at offset {offset} on drive {drive}: offset and length must be multiples of {BLOCK_BYTES}"
            ),
        ));
    }
    let end = offset.checked_add(len as u64);
    if end.is_none_or(|end| end > capacity) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{op} of {len} bytes at offset {offset} on drive {drive}: beyond the drive's capacity of {capacity} bytes"),
        ));
    }
    Ok(())
}

/// Adds "what, where" to an OS error while keeping its kind.
pub(crate) fn with_context(err: io::Error, context: impl std::fmt::Display) -> io::Error {
    io::Error::new(err.kind(), format!("{context}: {err}"))
}

/// The caller-facing half of a drive served by a dedicated I/O thread (io_uring or pread).
/// Validates requests, queues them, and on drop lets the thread finish what was queued.
pub(crate) struct ThreadedDrive {
    name: String,
    capacity: u64,
    kind: IoBackendKind,
    direct: bool,
    tx: Option<SyncSender<Request>>,
    /// Wakes the io_uring thread when it sleeps in the ring; None for pread drives, whose
    /// thread sleeps on the queue itself.
    waker: Option<Arc<uring::Waker>>,
    thread: Option<JoinHandle<()>>,
}

impl ThreadedDrive {
    /// Starts the I/O thread `thread_name`, running `serve` on the receiving end of the
    /// submission queue.
    pub(crate) fn spawn(
        name: String,
        capacity: u64,
        kind: IoBackendKind,
        direct: bool,
        waker: Option<Arc<uring::Waker>>,
        thread_name: String,
        serve: impl FnOnce(mpsc::Receiver<Request>) + Send + 'static,
    ) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(SUBMIT_QUEUE_REQUESTS_MAX);
        let thread = std::thread::Builder::new()
            .name(thread_name.clone())
            .spawn(move || serve(rx))
            .map_err(|e| with_context(e, format_args!("start I/O thread {thread_name} for drive {name}")))?;
        Ok(Self { name, capacity, kind, direct, tx: Some(tx), waker, thread: Some(thread) })
    }

    fn submit(&self, request: Request) {
        let tx = self.tx.as_ref().expect("sender lives until drop");
        // Try without blocking first so that back-pressure can be logged.
        match tx.try_send(request) {
            Ok(()) => {}
            Err(TrySendError::Full(request)) => {
                tracing::trace!(drive = %self.name, "submission queue full, waiting");
                // A closed channel drops the request and with it the completer, so the waiter
                // gets the "I/O thread stopped" error.
                if tx.send(request).is_err() {
                    return;
                }
            }
            Err(TrySendError::Disconnected(_)) => return,
        }
        if let Some(waker) = &self.waker {
            waker.notify();
        }
    }
}

impl Drop for ThreadedDrive {
    fn drop(&mut self) {
        // Closing the queue tells the thread to finish queued and in-flight I/O and exit.
        // Joining means the file is closed when drop returns, so the drive can be reopened.
        drop(self.tx.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!(drive = %self.name, "drive I/O thread panicked");
        }
    }
}

impl BlockDevice for ThreadedDrive {
    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn describe(&self) -> String {
        self.name.clone()
    }

    fn backend(&self) -> IoBackendKind {
        self.kind
    }

    fn direct_io(&self) -> bool {
        self.direct
    }

    fn read(&self, offset: u64, len: usize) -> IoCompletion<AlignedBuf> {
        if let Err(e) = check_io(&self.name, "read", offset, len, self.capacity) {
            return IoCompletion::ready(Err(e));
        }
        // Allocated here, on the caller's thread, so the I/O thread only does I/O; not zeroed,
        // since the read fills it or fails.
        let buf = AlignedBuf::for_read(len);
        if len == 0 {
            return IoCompletion::ready(Ok(buf));
        }
        let (completion, done) = IoCompletion::pending();
        self.submit(Request::Read { offset, buf, done });
        completion
    }

    fn write(&self, offset: u64, buf: AlignedBuf) -> IoCompletion<AlignedBuf> {
        if let Err(e) = check_io(&self.name, "write", offset, buf.padded_len(), self.capacity) {
            return IoCompletion::ready(Err(e));
        }
        debug_assert!(buf.padding_is_zero(), "AlignedBuf padding must be zero");
        if buf.padded_len() == 0 {
            return IoCompletion::ready(Ok(buf));
        }
        let (completion, done) = IoCompletion::pending();
        self.submit(Request::Write { offset, buf, done });
        completion
    }

    fn sync(&self) -> IoCompletion<()> {
        let (completion, done) = IoCompletion::pending();
        self.submit(Request::Sync { done });
        completion
    }
}

/// Creates a file drive of exactly `capacity_bytes`, preallocated so that later writes cannot
/// fail for lack of space and the file's blocks are contiguous where the filesystem can manage.
/// The parent directory must exist; an existing file is an error (it may hold data).
pub fn create_file_drive(path: &Path, capacity_bytes: u64) -> io::Result<()> {
    let context = || format!("create drive file {}", path.display());
    if capacity_bytes == 0 || !capacity_bytes.is_multiple_of(BLOCK_BYTES as u64) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: capacity {capacity_bytes} is not a positive multiple of {BLOCK_BYTES}", context()),
        ));
    }
    let len = libc::off_t::try_from(capacity_bytes).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{}: capacity {capacity_bytes} too large", context()))
    })?;
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| with_context(e, context()))?;

    let result = preallocate(&file, len).and_then(|()| {
        // The drive's size must survive a power failure before anything is written to it.
        file.sync_all()?;
        sync_parent_dir(path)
    });
    if let Err(e) = result {
        drop(file);
        // Leave no half-made drive behind; the original error is the one that matters.
        let _ = std::fs::remove_file(path);
        return Err(with_context(e, context()));
    }
    Ok(())
}

fn preallocate(file: &File, len: libc::off_t) -> io::Result<()> {
    let fd = file.as_raw_fd();
    loop {
        // SAFETY: plain syscall on an owned descriptor.
        if unsafe { libc::fallocate(fd, 0, 0, len) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            // Filesystems without fallocate: glibc's posix_fallocate writes zeros instead.
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => break,
            _ => return Err(err),
        }
    }
    tracing::info!("fallocate not supported here, preallocating with posix_fallocate");
    loop {
        // SAFETY: plain libc call on an owned descriptor; it returns the error number.
        let rc = unsafe { libc::posix_fallocate(fd, 0, len) };
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            _ => return Err(io::Error::from_raw_os_error(rc)),
        }
    }
}

fn sync_parent_dir(path: &Path) -> io::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// Opens a file or block device as a drive with the chosen backend.
pub fn open_drive(path: &Path, opts: &DriveOpenOptions) -> io::Result<Arc<dyn BlockDevice>> {
    let name = path.display().to_string();
    let context = || format!("open drive {name}");
    if opts.queue_depth_max == 0 || opts.queue_depth_max > QUEUE_DEPTH_MAX_LIMIT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: queue_depth_max {} is outside 1..={QUEUE_DEPTH_MAX_LIMIT}", context(), opts.queue_depth_max),
        ));
    }
    let kind = match opts.backend {
        BackendChoice::IoUring => IoBackendKind::IoUring,
        BackendChoice::Pread => IoBackendKind::Pread,
        BackendChoice::Auto if io_uring_available() => IoBackendKind::IoUring,
        BackendChoice::Auto => {
            tracing::info!(drive = %name, "io_uring is not available, using pread/pwrite");
            IoBackendKind::Pread
        }
    };

    let metadata = std::fs::metadata(path).map_err(|e| with_context(e, context()))?;
    let is_block_device = metadata.file_type().is_block_device();
    if !is_block_device && !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a regular file or block device", context()),
        ));
    }

    let (file, direct) = open_file(path, is_block_device, opts.direct_io).map_err(|e| with_context(e, context()))?;
    let capacity = if is_block_device {
        block_device_capacity(&file)
    } else {
        file.metadata().map(|m| m.len())
    }
    .map_err(|e| with_context(e, context()))?;
    // A partial trailing block can never be addressed with aligned I/O.
    let capacity = capacity - capacity % BLOCK_BYTES as u64;
    if capacity == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: smaller than one {BLOCK_BYTES}-byte block", context()),
        ));
    }

    // Some filesystems accept O_DIRECT at open and refuse it at the first I/O; probe once so
    // that the fallback happens here and not on a live request.
    let (file, direct) = if direct && !direct_read_works(&file) {
        tracing::info!(drive = %name, "O_DIRECT reads fail on this filesystem, using buffered I/O");
        (open_file(path, is_block_device, false).map_err(|e| with_context(e, context()))?.0, false)
    } else {
        (file, direct)
    };

    let drive = match kind {
        IoBackendKind::IoUring => uring::open(file, name.clone(), capacity, direct, opts.queue_depth_max),
        IoBackendKind::Pread => pread::open(file, name.clone(), capacity, direct),
        IoBackendKind::Memory => unreachable!("open_drive never picks the memory backend"),
    }
    .map_err(|e| with_context(e, context()))?;
    tracing::debug!(drive = %drive.describe(), ?kind, direct, capacity, "drive opened");
    Ok(Arc::new(drive))
}

/// Opens read-write. With `direct`, tries O_DIRECT and falls back to buffered I/O when the
/// filesystem refuses it (EINVAL). Block devices are opened O_EXCL, which the kernel refuses
/// while the device is mounted or claimed by another holder: Aquifer must never write over a
/// filesystem in use.
fn open_file(path: &Path, is_block_device: bool, direct: bool) -> io::Result<(File, bool)> {
    let base = libc::O_CLOEXEC | if is_block_device { libc::O_EXCL } else { 0 };
    let open = |flags| OpenOptions::new().read(true).write(true).custom_flags(flags).open(path);
    if direct {
        match open(base | libc::O_DIRECT) {
            Ok(file) => return Ok((file, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::info!(drive = %path.display(), "filesystem refuses O_DIRECT, using buffered I/O");
            }
            Err(e) => return Err(e),
        }
    }
    Ok((open(base)?, false))
}

fn direct_read_works(file: &File) -> bool {
    let mut buf = AlignedBuf::zeroed(BLOCK_BYTES);
    loop {
        let dst = buf.padded_mut();
        // SAFETY: dst is a valid, exclusively borrowed, aligned buffer of dst.len() bytes.
        let n = unsafe { libc::pread(file.as_raw_fd(), dst.as_mut_ptr().cast(), dst.len(), 0) };
        if n >= 0 {
            return true;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // Other errors (EIO on a failing disk) say nothing about O_DIRECT; the drive's
            // own requests will report them.
            Some(libc::EINVAL) => return false,
            _ => return true,
        }
    }
}

/// `_IOR(0x12, 114, size_t)`: the size of a block device in bytes.
#[cfg(any(target_arch = "powerpc", target_arch = "powerpc64", target_arch = "mips", target_arch = "mips64", target_arch = "sparc64"))]
const BLKGETSIZE64: libc::Ioctl = 0x4008_1272;
#[cfg(not(any(target_arch = "powerpc", target_arch = "powerpc64", target_arch = "mips", target_arch = "mips64", target_arch = "sparc64")))]
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;

fn block_device_capacity(file: &File) -> io::Result<u64> {
    let mut bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
    if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes as *mut u64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sector: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer.
    if unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET, &mut sector as *mut libc::c_int) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // O_DIRECT needs offsets aligned to the logical sector; BLOCK_BYTES alignment covers
    // every sector size up to BLOCK_BYTES.
    if sector <= 0 || sector as usize > BLOCK_BYTES || !BLOCK_BYTES.is_multiple_of(sector as usize) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("logical sector size {sector} does not divide {BLOCK_BYTES}"),
        ));
    }
    Ok(bytes)
}

/// Whether this process may use io_uring. Containers' seccomp profiles often refuse
/// io_uring_setup; the answer is probed once (a ring is created and a no-op runs through it)
/// and cached.
pub fn io_uring_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| match uring::probe() {
        Ok(()) => true,
        Err(e) => {
            tracing::info!("io_uring is not available: {e}");
            false
        }
    })
}
