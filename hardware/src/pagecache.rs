//! The kernel's page cache, for files that are written through it (the metadata store's
//! logs; drives use O_DIRECT and bypass it).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Asks the kernel to read `len` bytes of `file` from `offset` into the page cache in the
/// background (`posix_fadvise(WILLNEED)`); pages already cached are left as they are.
pub fn will_need(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_WILLNEED)
}

/// Asks the kernel to drop the clean cached pages of `len` bytes of `file` from `offset`
/// (`posix_fadvise(DONTNEED)`), as memory pressure would.
pub fn dont_need(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED)
}

fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: posix_fadvise only reads its arguments; the descriptor is open for the call.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, advice) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Whether the page of `file` holding the byte at `offset` is in the page cache, asked
/// without reading it (`mincore` of a one-page mapping). A byte past the end of the file
/// counts as cached.
pub fn is_cached(file: &File, offset: u64) -> io::Result<bool> {
    if offset >= file.metadata()?.len() {
        return Ok(true);
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let at = libc::off_t::try_from(offset / page * page).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a fresh read-only shared mapping of one page of an open file; it is only
    // passed to mincore and unmapped, never dereferenced.
    let map = unsafe { libc::mmap(std::ptr::null_mut(), page as usize, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), at) };
    if map == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut vec = 0u8;
    // SAFETY: `map` is a mapping of one page and `vec` has room for one page's byte.
    let r = unsafe { libc::mincore(map, page as usize, &mut vec) };
    let err = io::Error::last_os_error();
    // SAFETY: `map` was mapped above with this length.
    unsafe { libc::munmap(map, page as usize) };
    if r != 0 {
        return Err(err);
    }
    Ok(vec & 1 == 1)
}

/// Where one of this process's descriptors, open for writing on a given file, writes next:
/// its offset, read from `/proc/self/fdinfo` (one `pread` a look).
pub struct WriterOffset {
    info: File,
    fd: RawFd,
    dev: u64,
    ino: u64,
}

impl WriterOffset {
    /// Finds a descriptor of this process open for writing on `file`'s inode (another
    /// opening of the file than `file` itself), searching `/proc/self/fd`.
    pub fn find(file: &File) -> Option<WriterOffset> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata().ok()?;
        std::fs::read_dir("/proc/self/fd")
            .ok()?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
            .filter(|&fd| fd != file.as_raw_fd())
            .find_map(|fd| {
                let w = WriterOffset { info: File::open(format!("/proc/self/fdinfo/{fd}")).ok()?, fd, dev: m.dev(), ino: m.ino() };
                (w.offset().is_some() && w.same_file_on_disk() == Some(true)).then_some(w)
            })
    }

    /// The descriptor's offset; None once it is closed, open on another file, or read-only.
    pub fn offset(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 512];
        let n = self.info.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        let flags = u32::from_str_radix(field("flags:")?, 8).ok()?;
        if flags & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32 {
            return None;
        }
        let same = match field("ino:") {
            // Kernels since 5.14 name the inode. Another file with the same inode number on
            // another filesystem would pass; the caller's advice would then land on the
            // right file at a wrong offset, which costs a read and nothing else.
            Some(ino) => ino.parse::<u64>().ok()? == self.ino,
            None => self.same_file_on_disk()?,
        };
        if !same {
            return None;
        }
        field("pos:")?.parse().ok()
    }

    /// Whether the descriptor still names the file (device and inode, from a `stat` through
    /// `/proc/self/fd`).
    fn same_file_on_disk(&self) -> Option<bool> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(format!("/proc/self/fd/{}", self.fd)).ok()?;
        Some(m.dev() == self.dev && m.ino() == self.ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn a_writers_offset_is_found_and_readers_are_not_writers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut w = File::create(&path).unwrap();
        let r = File::open(&path).unwrap();
        let other = File::create(dir.path().join("other")).unwrap();
        w.write_all(&[7u8; 5000]).unwrap();
        let found = WriterOffset::find(&r).expect("the writer's descriptor");
        assert_eq!(found.fd, w.as_raw_fd());
        assert_eq!(found.offset(), Some(5000));
        w.seek(SeekFrom::Start(123)).unwrap();
        assert_eq!(found.offset(), Some(123));
        let r2 = File::open(&path).unwrap();
        assert_eq!(WriterOffset::find(&other).map(|f| f.fd), None, "nobody else writes `other`");
        drop(w);
        assert_eq!(found.offset(), None, "closed");
        // The number now names another file, opened for writing.
        let again = File::create(dir.path().join("third")).unwrap();
        if again.as_raw_fd() == found.fd {
            assert_eq!(found.offset(), None, "another file on the same number");
        }
        assert!(WriterOffset::find(&r2).is_none(), "only readers are left");
    }

    #[test]
    fn dropped_pages_come_back_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![1u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let r = File::open(&path).unwrap();
        dont_need(&r, 0, 1 << 20).unwrap();
        if is_cached(&r, 512 << 10).unwrap() {
            // tmpfs and some overlay filesystems keep every page; nothing to observe there.
            eprintln!("this filesystem keeps pages that are asked to be dropped; nothing to observe");
            return;
        }
        will_need(&r, 0, 1 << 20).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !is_cached(&r, 512 << 10).unwrap() {
            assert!(std::time::Instant::now() < deadline, "the page never came back");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(is_cached(&r, 2 << 20).unwrap(), "past the end counts as cached");
    }
}
