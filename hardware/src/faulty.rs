//! A fault-injecting drive wrapper for crash and corruption tests.

use std::io;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::{AlignedBuf, BlockDevice, IoBackendKind, IoCompletion};

/// Wraps a drive and injects faults that a [`FaultControl`] switches on and off: a drive that
/// went offline, a crash after a given number of writes, unreadable ranges and silently
/// corrupted ranges. The faults are decided when a request is submitted; requests that pass go
/// to the inner drive unchanged.
pub struct FaultyDrive {
    inner: Arc<dyn BlockDevice>,
    shared: Arc<Shared>,
}

/// Control handle of a [`FaultyDrive`]; clones control the same drive.
#[derive(Clone)]
pub struct FaultControl {
    shared: Arc<Shared>,
}

struct Shared {
    faults: Mutex<Faults>,
    writes_seen: AtomicU64,
    reads_seen: AtomicU64,
}

#[derive(Default)]
struct Faults {
    offline: bool,
    /// Writes still allowed before the crash point; None when no crash point is set.
    writes_left: Option<u64>,
    /// A write hit the crash point: from then on nothing reaches the drive.
    crashed: bool,
    /// Writes still allowed before the one write that fails (`fail_one_write_after`).
    fail_one_after: Option<u64>,
    fail_reads: Vec<Range<u64>>,
    corrupt_reads: Vec<Range<u64>>,
}

fn overlaps(range: &Range<u64>, offset: u64, len: usize) -> bool {
    range.start < offset.saturating_add(len as u64) && offset < range.end && len > 0
}

impl FaultyDrive {
    pub fn new(inner: Arc<dyn BlockDevice>) -> (Self, FaultControl) {
        let shared = Arc::new(Shared {
            faults: Mutex::new(Faults::default()),
            writes_seen: AtomicU64::new(0),
            reads_seen: AtomicU64::new(0),
        });
        (Self { inner, shared: Arc::clone(&shared) }, FaultControl { shared })
    }

    fn injected(&self, what: String) -> io::Error {
        io::Error::other(format!("injected fault on drive {}: {what}", self.describe()))
    }
}

impl BlockDevice for FaultyDrive {
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }

    fn backend(&self) -> IoBackendKind {
        self.inner.backend()
    }

    fn direct_io(&self) -> bool {
        self.inner.direct_io()
    }

    fn read(&self, offset: u64, len: usize) -> IoCompletion<AlignedBuf> {
        self.shared.reads_seen.fetch_add(1, Ordering::Relaxed);
        let corrupt: Vec<Range<u64>> = {
            let faults = self.shared.faults.lock();
            if faults.offline {
                return IoCompletion::ready(Err(self.injected(format!("read at offset {offset}: drive is offline"))));
            }
            if let Some(r) = faults.fail_reads.iter().find(|r| overlaps(r, offset, len)) {
                return IoCompletion::ready(Err(
                    self.injected(format!("read of {len} bytes at offset {offset}: unreadable range {r:?}")),
                ));
            }
            faults.corrupt_reads.iter().filter(|r| overlaps(r, offset, len)).cloned().collect()
        };
        let completion = self.inner.read(offset, len);
        if corrupt.is_empty() {
            return completion;
        }
        IoCompletion::deferred(move || {
            let mut buf = completion.wait()?;
            for range in &corrupt {
                let start = range.start.max(offset) - offset;
                let end = range.end.min(offset + len as u64) - offset;
                for byte in &mut buf[start as usize..end as usize] {
                    *byte = !*byte;
                }
            }
            Ok(buf)
        })
    }

    fn write(&self, offset: u64, buf: AlignedBuf) -> IoCompletion<AlignedBuf> {
        self.shared.writes_seen.fetch_add(1, Ordering::Relaxed);
        {
            let mut faults = self.shared.faults.lock();
            if faults.offline {
                return IoCompletion::ready(Err(self.injected(format!("write at offset {offset}: drive is offline"))));
            }
            match faults.fail_one_after {
                Some(0) => {
                    faults.fail_one_after = None;
                    return IoCompletion::ready(Err(self.injected(format!("write at offset {offset}: the one failing write"))));
                }
                Some(ref mut n) => *n -= 1,
                None => {}
            }
            match faults.writes_left {
                Some(0) => {
                    faults.crashed = true;
                    return IoCompletion::ready(Err(self.injected(format!("write at offset {offset}: after the crash point"))));
                }
                Some(ref mut n) => *n -= 1,
                None => {}
            }
        }
        self.inner.write(offset, buf)
    }

    fn sync(&self) -> IoCompletion<()> {
        {
            let faults = self.shared.faults.lock();
            if faults.offline {
                return IoCompletion::ready(Err(self.injected("sync: drive is offline".to_string())));
            }
            if faults.crashed {
                return IoCompletion::ready(Err(self.injected("sync: after the crash point".to_string())));
            }
        }
        self.inner.sync()
    }
}

impl FaultControl {
    /// While offline, every read, write and sync fails with an I/O error.
    pub fn set_offline(&self, offline: bool) {
        self.shared.faults.lock().offline = offline;
    }

    /// Sets a crash point: counting from this call, `n` more writes reach the drive, and the
    /// (n+1)-th and every later write fails, as does every sync after that failure, so nothing
    /// issued after the crash point becomes durable. Reads keep working, so a test can inspect
    /// the drive as a restarted node would find it. `None` removes the crash point.
    pub fn fail_writes_after(&self, n: Option<u64>) {
        let mut faults = self.shared.faults.lock();
        faults.writes_left = n;
        faults.crashed = false;
    }

    /// Counting from this call, `n` more writes reach the drive, the (n+1)-th fails, and the
    /// writes after it reach the drive again: a transient fault. `None` removes it.
    pub fn fail_one_write_after(&self, n: Option<u64>) {
        self.shared.faults.lock().fail_one_after = n;
    }

    /// Reads that overlap `range` (bytes) fail with an I/O error. Ranges accumulate until
    /// [`clear`](Self::clear).
    pub fn fail_reads_in(&self, range: Range<u64>) {
        self.shared.faults.lock().fail_reads.push(range);
    }

    /// Reads that overlap `range` (bytes) succeed, but every byte inside `range` comes back
    /// with all bits flipped; the drive's contents stay intact. Ranges accumulate until
    /// [`clear`](Self::clear).
    pub fn corrupt_reads_in(&self, range: Range<u64>) {
        self.shared.faults.lock().corrupt_reads.push(range);
    }

    /// Removes every fault. The counters keep counting.
    pub fn clear(&self) {
        *self.shared.faults.lock() = Faults::default();
    }

    /// Writes submitted to the drive since it was created, including failed ones.
    pub fn writes_seen(&self) -> u64 {
        self.shared.writes_seen.load(Ordering::Relaxed)
    }

    /// Reads submitted to the drive since it was created, including failed ones.
    pub fn reads_seen(&self) -> u64 {
        self.shared.reads_seen.load(Ordering::Relaxed)
    }
}
