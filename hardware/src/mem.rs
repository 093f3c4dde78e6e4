//! The in-memory drive.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::drive::check_io;
use crate::{AlignedBuf, BLOCK_BYTES, BlockDevice, IoBackendKind, IoCompletion};

/// Memory is allocated per chunk on first write, so a large drive that is mostly empty (the
/// usual case in tests) costs little. Unwritten chunks read as zeros, like a fresh drive.
const CHUNK_BYTES: usize = 1 << 20;

/// A drive held in memory (the Memory backend), for tests and for nodes without drives. I/O
/// completes before `read`/`write` return. Contents live as long as the `MemDrive`; there is
/// no volatile cache, so `sync` has nothing to do.
pub struct MemDrive {
    id: u64,
    capacity: u64,
    /// One lock per chunk so that I/O to different regions runs in parallel.
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemDrive {
    /// A zero-filled drive. Panics unless `capacity_bytes` is a multiple of BLOCK_BYTES (a
    /// bug in the caller) or does not fit in this machine's address space.
    pub fn new(capacity_bytes: u64) -> Self {
        static DRIVES: AtomicU64 = AtomicU64::new(0);
        assert_eq!(
            capacity_bytes % BLOCK_BYTES as u64,
            0,
            "memory drive capacity {capacity_bytes} is not a multiple of {BLOCK_BYTES}"
        );
        let capacity = usize::try_from(capacity_bytes).expect("memory drive capacity exceeds the address space");
        let chunks = (0..capacity.div_ceil(CHUNK_BYTES)).map(|_| RwLock::new(None)).collect();
        Self { id: DRIVES.fetch_add(1, Ordering::Relaxed), capacity: capacity_bytes, chunks }
    }

    /// Calls `f(chunk index, range within the chunk, range within the request)` for each
    /// chunk that `[offset, offset + len)` touches.
    fn for_each_chunk(offset: u64, len: usize, mut f: impl FnMut(usize, std::ops::Range<usize>, std::ops::Range<usize>)) {
        let mut pos = offset as usize;
        let end = pos + len;
        while pos < end {
            let chunk = pos / CHUNK_BYTES;
            let within = pos % CHUNK_BYTES;
            let n = (CHUNK_BYTES - within).min(end - pos);
            let done = pos - offset as usize;
            f(chunk, within..within + n, done..done + n);
            pos += n;
        }
    }
}

impl BlockDevice for MemDrive {
    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn describe(&self) -> String {
        format!("memory drive {}", self.id)
    }

    fn backend(&self) -> IoBackendKind {
        IoBackendKind::Memory
    }

    fn read(&self, offset: u64, len: usize) -> IoCompletion<AlignedBuf> {
        if let Err(e) = check_io(&self.describe(), "read", offset, len, self.capacity) {
            return IoCompletion::ready(Err(e));
        }
        let mut buf = AlignedBuf::zeroed(len);
        Self::for_each_chunk(offset, len, |chunk, src, dst| {
            if let Some(data) = self.chunks[chunk].read().as_deref() {
                buf[dst].copy_from_slice(&data[src]);
            }
        });
        IoCompletion::ready(Ok(buf))
    }

    fn write(&self, offset: u64, buf: AlignedBuf) -> IoCompletion<AlignedBuf> {
        let len = buf.padded_len();
        if let Err(e) = check_io(&self.describe(), "write", offset, len, self.capacity) {
            return IoCompletion::ready(Err(e));
        }
        debug_assert!(buf.padding_is_zero(), "AlignedBuf padding must be zero");
        let src = buf.padded();
        Self::for_each_chunk(offset, len, |chunk, dst, from| {
            let mut guard = self.chunks[chunk].write();
            let data = guard.get_or_insert_with(|| vec![0u8; CHUNK_BYTES].into_boxed_slice());
            data[dst].copy_from_slice(&src[from]);
        });
        IoCompletion::ready(Ok(buf))
    }

    fn sync(&self) -> IoCompletion<()> {
        IoCompletion::ready(Ok(()))
    }
}
