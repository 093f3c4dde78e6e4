//! The io_uring backend: one dedicated thread per drive owns a ring.
//!
//! The thread takes requests from the drive's submission queue, keeps up to `depth` of them in
//! flight, and completes each caller's [`IoCompletion`](crate::IoCompletion) when its CQE
//! arrives. Each request's buffer lives in the in-flight table (`slots`) from submission until
//! its final CQE, so the kernel never writes into memory that was handed back or freed.
//!
//! Ordering: a sync must cover every write queued before it. Writes get sequence numbers as
//! they are accepted; a sync waits until every earlier write has completed and only then
//! submits its fdatasync. IOSQE_IO_DRAIN is not enough, because a short write's remainder is
//! resubmitted after the drain point. Syncs that become eligible together share one fdatasync.
//!
//! Wake-ups: while requests are in flight the thread sleeps in io_uring_enter, not on the
//! submission queue. So that a new request is not held up until some completion arrives (an
//! fdatasync can take many milliseconds), the ring always has a read on an eventfd pending, and
//! a caller that queues a request while the thread sleeps writes to that eventfd.

use std::collections::{BTreeSet, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use io_uring::{IoUring, opcode, types};

use crate::completion::Completer;
use crate::drive::{Request, ThreadedDrive, with_context};
use crate::{AlignedBuf, IoBackendKind};

/// Largest transfer in one SQE. The kernel caps a single read/write near 2 GiB; larger
/// requests continue as "short" transfers.
const SQE_BYTES_MAX: usize = 1 << 30;

/// How often one request may be resubmitted after EINTR/EAGAIN before it fails; a bound so
/// that a drive stuck returning EAGAIN surfaces as an error instead of a busy loop.
const TRANSIENT_RETRIES_MAX: u32 = 64;

/// user_data of the eventfd read; request slots use 0..depth.
const WAKER_USER_DATA: u64 = u64::MAX;

/// Wakes a drive's ring thread when a request is queued while it sleeps in the ring.
pub(crate) struct Waker {
    eventfd: OwnedFd,
    /// Set by the ring thread just before it sleeps in io_uring_enter, cleared after.
    sleeping: AtomicBool,
}

impl Waker {
    fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        Ok(Self { eventfd: unsafe { OwnedFd::from_raw_fd(fd) }, sleeping: AtomicBool::new(false) })
    }

    /// Called after a request was queued.
    pub(crate) fn notify(&self) {
        // Pairs with the fence in Worker::sleep: either the ring thread sees the queued
        // request when it checks the queue after announcing sleep, or we see `sleeping`.
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a valid u64. A failure can only be EAGAIN (the
            // counter is saturated), which means a wake-up is pending anyway.
            unsafe { libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }
}

/// Checks that io_uring works in this process: a ring can be set up and a no-op completes.
pub(crate) fn probe() -> io::Result<()> {
    let mut ring = IoUring::new(2)?;
    let nop = opcode::Nop::new().build().user_data(1);
    // SAFETY: a no-op references no memory.
    unsafe { ring.submission().push(&nop) }.map_err(|_| io::Error::other("fresh ring has no free entry"))?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    let cqe = ring.completion().next().ok_or_else(|| io::Error::other("no-op did not complete"))?;
    if cqe.result() < 0 {
        return Err(io::Error::from_raw_os_error(-cqe.result()));
    }
    Ok(())
}

pub(crate) fn open(file: File, name: String, capacity: u64, direct: bool, queue_depth_max: u32) -> io::Result<ThreadedDrive> {
    static THREADS: AtomicU64 = AtomicU64::new(0);
    // The ring is set up here, not on the thread, so that a refusal is reported to the caller.
    // One entry more than the depth, for the waker's eventfd read.
    let ring = IoUring::new(queue_depth_max + 1).map_err(|e| with_context(e, "set up io_uring"))?;
    // The kernel rounds the ring up to a power of two; the caller's limit still applies. The
    // completion queue is twice the submission queue, so with at most `depth` requests (plus
    // the waker) in flight it can never overflow.
    let depth = (ring.params().sq_entries() as usize - 1).min(queue_depth_max as usize);
    debug_assert!(depth >= 1 && ring.params().cq_entries() as usize > depth);
    let waker = Arc::new(Waker::new().map_err(|e| with_context(e, "create eventfd"))?);
    let thread_name = format!("aquifer-uring-{}", THREADS.fetch_add(1, Ordering::Relaxed));
    let drive_name = name.clone();
    let worker_waker = Arc::clone(&waker);
    ThreadedDrive::spawn(name, capacity, IoBackendKind::IoUring, direct, Some(waker), thread_name, move |rx| {
        Worker::new(ring, file, drive_name, depth, worker_waker).run(rx)
    })
}

/// One request while the worker owns it.
enum Op {
    Read { offset: u64, buf: AlignedBuf, done_bytes: usize, retries: u32, done: Completer<AlignedBuf> },
    Write { offset: u64, buf: AlignedBuf, done_bytes: usize, retries: u32, seq: u64, done: Completer<AlignedBuf> },
    Fsync { retries: u32, waiters: Vec<Completer<()>> },
}

struct Worker {
    ring: IoUring,
    file: File,
    name: String,
    /// Requests in flight at most; also the length of `slots`.
    depth: usize,
    /// The in-flight table, indexed by the SQE's user_data.
    slots: Vec<Option<Op>>,
    free: Vec<usize>,
    /// Accepted from the submission queue but not yet in flight (the ring was full).
    waiting: VecDeque<Op>,
    write_seq_next: u64,
    /// Sequence numbers of accepted writes that have not completed.
    writes_outstanding: BTreeSet<u64>,
    /// Syncs not yet submitted, with the first write sequence number they need not cover.
    syncs: VecDeque<(u64, Completer<()>)>,
    cqes: Vec<(u64, i32)>,
    closed: bool,
    waker: Arc<Waker>,
    /// Whether the eventfd read is in the ring.
    waker_armed: bool,
    /// Cleared if the eventfd read fails; then new requests wait for the next completion.
    waker_usable: bool,
    /// Where the eventfd read lands. Boxed so the address stays put while the read is in
    /// flight; the worker never returns while it is (see `disarm_waker`).
    waker_buf: Box<u64>,
}

impl Worker {
    fn new(ring: IoUring, file: File, name: String, depth: usize, waker: Arc<Waker>) -> Self {
        Self {
            ring,
            file,
            name,
            depth,
            slots: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            waiting: VecDeque::new(),
            write_seq_next: 0,
            writes_outstanding: BTreeSet::new(),
            syncs: VecDeque::new(),
            cqes: Vec::with_capacity(2 * depth + 2),
            closed: false,
            waker,
            waker_armed: false,
            waker_usable: true,
            waker_buf: Box::new(0),
        }
    }

    fn in_flight(&self) -> usize {
        self.depth - self.free.len()
    }

    fn idle(&self) -> bool {
        self.in_flight() == 0 && self.waiting.is_empty() && self.syncs.is_empty()
    }

    fn run(mut self, rx: Receiver<Request>) {
        loop {
            if self.idle() {
                if self.closed {
                    break;
                }
                match rx.recv() {
                    Ok(request) => self.accept(request),
                    // The drive was dropped and nothing is left to do.
                    Err(_) => break,
                }
            }
            // Batch whatever else is queued, but keep the backlog bounded: the rest waits in
            // the (bounded) submission queue and pushes back on callers.
            let mut taken = 0;
            while !self.closed && self.waiting.len() < self.depth && taken < self.depth {
                match rx.try_recv() {
                    Ok(request) => self.accept(request),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => self.closed = true,
                }
                taken += 1;
            }
            self.fill();
            debug_assert!(
                self.in_flight() > 0 || (self.waiting.is_empty() && self.syncs.is_empty()),
                "work left over with nothing in flight"
            );
            let result = if self.in_flight() == 0 {
                Ok(())
            } else if self.waiting.is_empty() && !self.closed && self.waker_usable {
                // Room for more requests: sleep so that a new request wakes us.
                match self.sleep(&rx) {
                    Ok(Some(request)) => {
                        self.accept(request);
                        continue;
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            } else {
                // Either the ring is full (a new request could not start anyway) or no more
                // requests can come: wait for completions only.
                self.enter(1)
            };
            if let Err(e) = result {
                self.abandon(e);
                return;
            }
            self.reap();
        }
        if let Err(e) = self.disarm_waker() {
            self.abandon(e);
        }
    }

    /// Sleeps in the ring until a completion arrives or a caller queues a request. Returns a
    /// request found queued just before sleeping (nothing was submitted then).
    fn sleep(&mut self, rx: &Receiver<Request>) -> io::Result<Option<Request>> {
        if !self.waker_armed {
            let entry = opcode::Read::new(types::Fd(self.waker.eventfd.as_raw_fd()), (&mut *self.waker_buf as *mut u64).cast(), 8)
                .build()
                .user_data(WAKER_USER_DATA);
            // SAFETY: waker_buf is heap memory owned by the worker, untouched until the read's
            // CQE is reaped; the worker does not return before that (disarm_waker).
            let pushed = unsafe { self.ring.submission().push(&entry) };
            assert!(pushed.is_ok(), "io_uring submission queue overflow on drive {}", self.name);
            self.waker_armed = true;
        }
        self.waker.sleeping.store(true, Ordering::SeqCst);
        // Pairs with the fence in Waker::notify.
        fence(Ordering::SeqCst);
        let queued = match rx.try_recv() {
            Ok(request) => Some(request),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.closed = true;
                None
            }
        };
        let result = if queued.is_none() && !self.closed { self.enter(1) } else { Ok(()) };
        self.waker.sleeping.store(false, Ordering::SeqCst);
        result.map(|()| queued)
    }

    /// Completes the pending eventfd read (by posting to the eventfd) so that its buffer can
    /// be freed.
    fn disarm_waker(&mut self) -> io::Result<()> {
        while self.waker_armed {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a valid u64 to our own eventfd.
            unsafe { libc::write(self.waker.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
            self.enter(1)?;
            self.reap();
        }
        Ok(())
    }

    fn accept(&mut self, request: Request) {
        match request {
            Request::Read { offset, buf, done } => {
                debug_assert!(buf.padded_len() > 0, "the drive front completes empty reads itself");
                self.waiting.push_back(Op::Read { offset, buf, done_bytes: 0, retries: 0, done });
            }
            Request::Write { offset, buf, done } => {
                debug_assert!(buf.padded_len() > 0, "the drive front completes empty writes itself");
                let seq = self.write_seq_next;
                self.write_seq_next += 1;
                self.writes_outstanding.insert(seq);
                self.waiting.push_back(Op::Write { offset, buf, done_bytes: 0, retries: 0, seq, done });
            }
            Request::Sync { done } => self.syncs.push_back((self.write_seq_next, done)),
        }
    }

    /// Moves waiting requests and eligible syncs into free slots and queues their SQEs.
    fn fill(&mut self) {
        while !self.waiting.is_empty() {
            let Some(slot) = self.free.pop() else { break };
            let op = self.waiting.pop_front().expect("checked non-empty");
            debug_assert!(self.slots[slot].is_none());
            self.slots[slot] = Some(op);
            self.push_sqe(slot);
        }
        if self.syncs.is_empty() || self.free.is_empty() {
            return;
        }
        // A sync with barrier b must not start before every write numbered below b is done.
        let oldest_outstanding = self.writes_outstanding.first().copied().unwrap_or(u64::MAX);
        let mut waiters = Vec::new();
        while let Some(&(barrier, _)) = self.syncs.front()
            && barrier <= oldest_outstanding
        {
            waiters.push(self.syncs.pop_front().expect("checked non-empty").1);
        }
        if !waiters.is_empty() {
            let slot = self.free.pop().expect("checked non-empty");
            self.slots[slot] = Some(Op::Fsync { retries: 0, waiters });
            self.push_sqe(slot);
        }
    }

    /// Queues the SQE for the next step of the request in `slot`: the whole transfer, or
    /// the remainder after a short transfer, or a retry.
    fn push_sqe(&mut self, slot: usize) {
        let fd = types::Fd(self.file.as_raw_fd());
        let entry = match self.slots[slot].as_mut().expect("push_sqe on an empty slot") {
            Op::Read { offset, buf, done_bytes, .. } => {
                // The buffer is not filled yet (AlignedBuf::for_read): only its pointer is used.
                let len = (buf.padded_len() - *done_bytes).min(SQE_BYTES_MAX);
                debug_assert!(len > 0);
                opcode::Read::new(fd, buf.read_ptr(*done_bytes), len as u32).offset(*offset + *done_bytes as u64).build()
            }
            Op::Write { offset, buf, done_bytes, .. } => {
                let rest = &buf.padded()[*done_bytes..];
                let len = rest.len().min(SQE_BYTES_MAX);
                debug_assert!(len > 0);
                opcode::Write::new(fd, rest.as_ptr(), len as u32).offset(*offset + *done_bytes as u64).build()
            }
            Op::Fsync { .. } => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
        };
        let entry = entry.user_data(slot as u64);
        // SAFETY: the buffer the entry points into is owned by slots[slot] and stays there,
        // unmoved and untouched, until this entry's CQE has been reaped.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        // Every occupied slot has at most one SQE queued or in flight and there are no more
        // slots than SQ entries, so the SQ cannot be full.
        assert!(pushed.is_ok(), "io_uring submission queue overflow on drive {}", self.name);
    }

    /// Submits queued SQEs and waits for `want` completions.
    fn enter(&mut self, want: usize) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // Transient: the kernel lacks memory or wants completions reaped first.
                    // Reap what there is and come back.
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOMEM) => {
                        std::thread::sleep(Duration::from_millis(1));
                        return Ok(());
                    }
                    _ => return Err(e),
                },
            }
        }
    }

    fn reap(&mut self) {
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        cqes.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
        for &(user_data, result) in &cqes {
            if user_data == WAKER_USER_DATA {
                self.waker_armed = false;
                if result < 0 && !matches!(-result, libc::EINTR | libc::EAGAIN | libc::ECANCELED) {
                    tracing::warn!(
                        drive = %self.name,
                        "reading the wake-up eventfd failed, new requests wait for completions: {}",
                        io::Error::from_raw_os_error(-result)
                    );
                    self.waker_usable = false;
                }
                continue;
            }
            self.complete(user_data as usize, result);
        }
        self.cqes = cqes;
    }

    fn complete(&mut self, slot: usize, result: i32) {
        let op = self.slots[slot].as_mut().expect("completion for an empty slot");
        if result < 0 {
            let errno = -result;
            let retries = match op {
                Op::Read { retries, .. } | Op::Write { retries, .. } | Op::Fsync { retries, .. } => retries,
            };
            if matches!(errno, libc::EINTR | libc::EAGAIN) && *retries < TRANSIENT_RETRIES_MAX {
                *retries += 1;
                self.push_sqe(slot);
                return;
            }
            let err = io::Error::from_raw_os_error(errno);
            self.finish(slot, Err(err));
            return;
        }
        let progress = result as usize;
        match op {
            Op::Read { buf, done_bytes, .. } | Op::Write { buf, done_bytes, .. } => {
                let total = buf.padded_len();
                debug_assert!(*done_bytes + progress <= total, "kernel transferred more than asked");
                if progress == 0 {
                    let err = if matches!(op, Op::Read { .. }) {
                        // Capacity was checked at submission, so the file shrank under us.
                        io::Error::new(io::ErrorKind::UnexpectedEof, "drive ended before the requested range")
                    } else {
                        io::Error::new(io::ErrorKind::WriteZero, "drive accepted no bytes")
                    };
                    self.finish(slot, Err(err));
                    return;
                }
                *done_bytes += progress;
                if *done_bytes < total {
                    // Short transfer: continue with the remainder.
                    self.push_sqe(slot);
                } else {
                    self.finish(slot, Ok(()));
                }
            }
            Op::Fsync { .. } => self.finish(slot, Ok(())),
        }
    }

    /// Takes the request out of `slot` and completes its caller(s).
    fn finish(&mut self, slot: usize, result: io::Result<()>) {
        let op = self.slots[slot].take().expect("finish on an empty slot");
        self.free.push(slot);
        let name = &self.name;
        match op {
            Op::Read { offset, mut buf, done, .. } => {
                let len = buf.len();
                done.complete(
                    result
                        .map(|()| {
                            // SAFETY: a read finishes with Ok only once done_bytes reached the
                            // buffer's padded length (short transfers are continued).
                            unsafe { buf.assume_filled() };
                            buf
                        })
                        .map_err(|e| with_context(e, format_args!("read of {len} bytes at offset {offset} on drive {name}"))),
                );
            }
            Op::Write { offset, buf, seq, done, .. } => {
                self.writes_outstanding.remove(&seq);
                let len = buf.padded_len();
                done.complete(
                    result.map(|()| buf).map_err(|e| with_context(e, format_args!("write of {len} bytes at offset {offset} on drive {name}"))),
                );
            }
            Op::Fsync { waiters, .. } => {
                for waiter in waiters {
                    let result = result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), format!("sync drive {name}: {e}")));
                    waiter.complete(result);
                }
            }
        }
    }

    /// The ring itself failed (io_uring_enter returned an error that is not transient). Fails
    /// every request. Buffers of requests in flight are leaked on purpose: the kernel may still
    /// write into them, so freeing them could corrupt memory.
    fn abandon(mut self, err: io::Error) {
        tracing::error!(drive = %self.name, "io_uring failed, the drive's I/O thread stops: {err}");
        let failure = |what: &str| io::Error::new(err.kind(), format!("{what} on drive {}: io_uring failed: {err}", self.name));
        for op in self.waiting.drain(..).chain(self.slots.iter_mut().filter_map(Option::take)) {
            match op {
                Op::Read { buf, done, .. } => {
                    std::mem::forget(buf);
                    done.complete(Err(failure("read")));
                }
                Op::Write { buf, done, .. } => {
                    std::mem::forget(buf);
                    done.complete(Err(failure("write")));
                }
                Op::Fsync { waiters, .. } => waiters.into_iter().for_each(|w| w.complete(Err(failure("sync")))),
            }
        }
        for (_, done) in self.syncs.drain(..) {
            done.complete(Err(failure("sync")));
        }
        // Requests still in the submission queue fail with "I/O thread stopped" when the
        // receiver drops.
    }
}

impl Drop for Worker {
    /// Normally every slot is empty and the waker disarmed here. If the thread is unwinding
    /// from a panic (a bug) or the ring failed, reads may still be in flight: their buffers
    /// are leaked rather than freed under the kernel, and their callers get "I/O thread
    /// stopped" when the completers drop.
    fn drop(&mut self) {
        if self.waker_armed {
            std::mem::forget(std::mem::take(&mut self.waker_buf));
        }
        for op in self.slots.iter_mut().filter_map(Option::take) {
            match op {
                Op::Read { buf, .. } | Op::Write { buf, .. } => std::mem::forget(buf),
                Op::Fsync { .. } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::mpsc;
    use std::time::Duration;

    use crate::{BLOCK_BYTES, BlockDevice};

    /// A request queued while the ring thread sleeps on a request that cannot complete yet
    /// (here a read from an empty FIFO) must still be served at once.
    #[test]
    fn new_requests_wake_a_sleeping_ring() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        // O_RDWR so that opening does not wait for a writer.
        let file = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&fifo).unwrap();
        let mut writer = file.try_clone().unwrap();
        let drive = super::open(file, "fifo".into(), BLOCK_BYTES as u64, false, 8).unwrap();

        let blocked = drive.read(0, BLOCK_BYTES);
        // Give the ring thread time to submit the read and go to sleep on it.
        std::thread::sleep(Duration::from_millis(50));
        let (tx, rx) = mpsc::channel();
        let sync = drive.sync();
        std::thread::spawn(move || tx.send(sync.wait().is_ok()));
        // fdatasync on a FIFO fails (EINVAL); what matters is that it completes at all.
        let picked_up = rx.recv_timeout(Duration::from_secs(10)).is_ok();

        // Release the blocked read before asserting, so that a failure does not hang in drop.
        writer.write_all(&[7u8; BLOCK_BYTES]).unwrap();
        let got = blocked.wait().unwrap();
        assert!(picked_up, "a request queued while the ring slept was not picked up");
        assert!(got.iter().all(|&b| b == 7));
        drop(drive);
    }
}
