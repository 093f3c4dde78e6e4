//! The pread/pwrite backend: one dedicated thread per drive, one request at a time.
//!
//! Used where io_uring is refused. A thread per drive keeps drives working in parallel, and
//! serving requests in queue order makes a sync trivially cover every earlier write.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;

use crate::buf::AlignedBuf;
use crate::drive::{Request, ThreadedDrive, with_context};
use crate::IoBackendKind;

pub(crate) fn open(file: File, name: String, capacity: u64, direct: bool) -> io::Result<ThreadedDrive> {
    static THREADS: AtomicU64 = AtomicU64::new(0);
    let thread_name = format!("aquifer-pread-{}", THREADS.fetch_add(1, Ordering::Relaxed));
    let drive_name = name.clone();
    ThreadedDrive::spawn(name, capacity, IoBackendKind::Pread, direct, None, thread_name, move |rx| {
        serve(&file, &drive_name, rx)
    })
}

/// Serves requests until the queue closes; the file closes when the thread returns.
fn serve(file: &File, name: &str, rx: Receiver<Request>) {
    while let Ok(request) = rx.recv() {
        match request {
            Request::Read { offset, mut buf, done } => {
                let len = buf.padded_len();
                let result = read_exact_at(file, &mut buf, len, offset)
                    .map(|()| {
                        // SAFETY: read_exact_at wrote all `len` bytes of the buffer.
                        unsafe { buf.assume_filled() };
                        buf
                    })
                    .map_err(|e| with_context(e, format_args!("read at offset {offset} on drive {name}")));
                done.complete(result);
            }
            Request::Write { offset, buf, done } => {
                let result = write_all_at(file, buf.padded(), offset)
                    .map(|()| buf)
                    .map_err(|e| with_context(e, format_args!("write at offset {offset} on drive {name}")));
                done.complete(result);
            }
            Request::Sync { done } => {
                let result = fdatasync(file).map_err(|e| with_context(e, format_args!("sync drive {name}")));
                done.complete(result);
            }
        }
    }
}

/// Reads `len` bytes at `offset` into `buf` (whose allocation holds at least `len`), all of
/// them or an error.
fn read_exact_at(file: &File, buf: &mut AlignedBuf, len: usize, mut offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < len {
        let dst = buf.read_ptr(done);
        // SAFETY: dst points at len - done writable bytes of the buffer's allocation, which
        // `buf` borrows exclusively.
        let n = unsafe { libc::pread(file.as_raw_fd(), dst.cast(), len - done, offset as libc::off_t) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if matches!(err.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            // Capacity was checked at submission, so the file shrank under us.
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "drive ended before the requested range"));
        }
        let n = n as usize;
        done += n;
        offset += n as u64;
    }
    Ok(())
}

fn write_all_at(file: &File, mut src: &[u8], mut offset: u64) -> io::Result<()> {
    while !src.is_empty() {
        // SAFETY: src is a valid buffer of src.len() bytes.
        let n = unsafe { libc::pwrite(file.as_raw_fd(), src.as_ptr().cast(), src.len(), offset as libc::off_t) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if matches!(err.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "drive accepted no bytes"));
        }
        let n = n as usize;
        src = &src[n..];
        offset += n as u64;
    }
    Ok(())
}

fn fdatasync(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: plain syscall on an owned descriptor.
        if unsafe { libc::fdatasync(file.as_raw_fd()) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

