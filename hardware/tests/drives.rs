//! One contract for every drive implementation, plus the behaviour specific to file drives
//! and to the fault-injecting wrapper.
//!
//! Random choices come from a seed printed at the start of each suite; set
//! AQUIFER_TEST_SEED to replay a failure.

use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;

use hardware::{
    AlignedBuf, BLOCK_BYTES, BackendChoice, BlockDevice, DriveOpenOptions, FaultyDrive, IoBackendKind,
    MemDrive, create_file_drive, io_uring_available, open_drive,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = BLOCK_BYTES as u64;
const MIB: u64 = 1 << 20;
/// Capacity of the drives the contract runs on.
const CONTRACT_CAPACITY: u64 = 64 * MIB;
/// Largest single I/O the contract issues.
const IO_BYTES_MAX: usize = 4 << 20;

fn rng(suite: &str) -> StdRng {
    let seed = std::env::var("AQUIFER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("{suite}: AQUIFER_TEST_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

fn random_bytes(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    data
}

/// A misaligned request is a caller bug: debug builds panic, release builds return
/// InvalidInput. Either way, nothing reaches the drive.
fn assert_misaligned_rejected<T>(what: &str, f: impl FnOnce() -> io::Result<T>) {
    let outcome = catch_unwind(AssertUnwindSafe(f));
    if cfg!(debug_assertions) {
        assert!(outcome.is_err(), "{what}: debug builds must panic on misaligned I/O");
    } else {
        match outcome {
            Ok(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{what}: {e}"),
            Ok(Ok(_)) => panic!("{what}: misaligned I/O was accepted"),
            Err(_) => panic!("{what}: release builds must return an error, not panic"),
        }
    }
}

fn assert_invalid_input<T: std::fmt::Debug>(what: &str, result: io::Result<T>) {
    let err = result.expect_err(what);
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{what}: {err}");
}

/// The behaviour every BlockDevice must have. `dev` must be fresh (all zeros) with a capacity
/// of CONTRACT_CAPACITY.
fn contract_tests(dev: Arc<dyn BlockDevice>) {
    let name = dev.describe();
    let mut rng = rng(&name);
    let capacity = dev.capacity_bytes();
    assert_eq!(capacity, CONTRACT_CAPACITY, "{name}");
    assert!(!name.is_empty());

    // A fresh drive reads as zeros.
    let first = dev.read(0, 2 * BLOCK_BYTES).wait().unwrap();
    assert!(first.iter().all(|&b| b == 0), "{name}: fresh drive is not zeroed");

    // Zero-length I/O is valid and does nothing.
    assert!(dev.read(0, 0).wait().unwrap().is_empty());
    assert!(dev.write(BLOCK, AlignedBuf::zeroed(0)).wait().unwrap().is_empty());

    // Round trips at random aligned offsets and sizes, checked against a model of the drive.
    let mut model = vec![0u8; capacity as usize];
    for i in 0..40 {
        let blocks = rng.random_range(1..=IO_BYTES_MAX / BLOCK_BYTES);
        // Some buffers are not a whole number of blocks: the padding must reach the drive as
        // zeros.
        let len = if i % 4 == 0 { blocks * BLOCK_BYTES - rng.random_range(1..BLOCK_BYTES) } else { blocks * BLOCK_BYTES };
        let padded = blocks * BLOCK_BYTES;
        let offset = rng.random_range(0..=(capacity as usize - padded) / BLOCK_BYTES) * BLOCK_BYTES;
        let data = random_bytes(&mut rng, len);
        let back = dev.write(offset as u64, AlignedBuf::from_slice(&data)).wait().unwrap();
        assert_eq!(&back[..], &data[..], "{name}: write must hand the buffer back intact");
        model[offset..offset + len].copy_from_slice(&data);
        model[offset + len..offset + padded].fill(0);

        // Read back a random range around the write.
        let start = offset.saturating_sub(rng.random_range(0..4) * BLOCK_BYTES);
        let end = (offset + padded + rng.random_range(0..4) * BLOCK_BYTES).min(capacity as usize);
        let got = dev.read(start as u64, end - start).wait().unwrap();
        assert_eq!(got.len(), end - start);
        assert!(got[..] == model[start..end], "{name}: read {start}..{end} after write at {offset} differs");
    }
    assert!(dev.sync().wait().is_ok(), "{name}: sync");
    let whole = dev.read(0, capacity as usize).wait().unwrap();
    assert!(whole[..] == model[..], "{name}: whole-drive read differs from the model");

    // The last block is addressable; one byte past it is not.
    let last = capacity - BLOCK;
    dev.write(last, AlignedBuf::from_slice(&[0x5A; BLOCK_BYTES])).wait().unwrap();
    assert!(dev.read(last, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 0x5A));
    assert_invalid_input("read at capacity", dev.read(capacity, BLOCK_BYTES).wait());
    assert_invalid_input("read across the end", dev.read(last, 2 * BLOCK_BYTES).wait());
    assert_invalid_input("write at capacity", dev.write(capacity, AlignedBuf::zeroed(BLOCK_BYTES)).wait());
    assert_invalid_input("write across the end", dev.write(last, AlignedBuf::zeroed(BLOCK_BYTES + 1)).wait());
    assert_invalid_input("offset overflow", dev.read(u64::MAX - BLOCK + 1, BLOCK_BYTES).wait());
    assert!(dev.read(last, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 0x5A), "{name}: rejected write reached the drive");

    assert_misaligned_rejected("misaligned read offset", || dev.read(1, BLOCK_BYTES).wait());
    assert_misaligned_rejected("misaligned read length", || dev.read(0, 100).wait());
    assert_misaligned_rejected("misaligned write offset", || dev.write(BLOCK + 512, AlignedBuf::zeroed(BLOCK_BYTES)).wait());
    assert!(dev.read(BLOCK, BLOCK_BYTES).wait().unwrap()[..] == model[BLOCK_BYTES..2 * BLOCK_BYTES]);

    concurrent_submissions(&dev, &mut rng);
}

/// Several threads each keep many requests in flight on their own quarter of the drive, with
/// syncs mixed in; then every byte is checked.
fn concurrent_submissions(dev: &Arc<dyn BlockDevice>, rng: &mut StdRng) {
    const THREADS: u64 = 4;
    const WRITES_PER_THREAD: u64 = 48;
    let region = dev.capacity_bytes() / THREADS;
    let slot = region / WRITES_PER_THREAD / BLOCK * BLOCK;
    let seeds: Vec<u64> = (0..THREADS).map(|_| rng.random()).collect();
    std::thread::scope(|s| {
        for (t, seed) in seeds.into_iter().enumerate() {
            let dev = Arc::clone(dev);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                let base = t as u64 * region;
                let mut expected = Vec::new();
                let mut writes = Vec::new();
                let mut syncs = Vec::new();
                for i in 0..WRITES_PER_THREAD {
                    let len = rng.random_range(1..=slot as usize / BLOCK_BYTES) * BLOCK_BYTES;
                    let data = random_bytes(&mut rng, len);
                    let offset = base + i * slot;
                    writes.push(dev.write(offset, AlignedBuf::from_slice(&data)));
                    expected.push((offset, data));
                    if i % 16 == 15 {
                        // Queued among writes in flight, not waited for until the end.
                        syncs.push(dev.sync());
                    }
                }
                for w in writes {
                    w.wait().unwrap();
                }
                for s in syncs {
                    s.wait().unwrap();
                }
                dev.sync().wait().unwrap();
                let reads: Vec<_> = expected.iter().map(|(offset, data)| dev.read(*offset, data.len())).collect();
                for (read, (offset, data)) in reads.into_iter().zip(&expected) {
                    let got = read.wait().unwrap();
                    assert!(got[..] == data[..], "{}: concurrent data at {offset} differs", dev.describe());
                }
            });
        }
    });
}

fn options(backend: BackendChoice, direct_io: bool) -> DriveOpenOptions {
    DriveOpenOptions { backend, direct_io, ..DriveOpenOptions::default() }
}

fn new_file_drive(dir: &Path, capacity: u64) -> std::path::PathBuf {
    let path = dir.join("drive.img");
    create_file_drive(&path, capacity).unwrap();
    path
}

/// Whether this filesystem lets a file be opened with O_DIRECT, asked without the crate.
fn fs_accepts_o_direct(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path).is_ok()
}

fn file_contract(backend: BackendChoice, kind: IoBackendKind, direct_io: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = new_file_drive(dir.path(), CONTRACT_CAPACITY);
    let dev = open_drive(&path, &options(backend, direct_io)).unwrap();
    assert_eq!(dev.backend(), kind);
    assert_eq!(dev.direct_io(), direct_io && fs_accepts_o_direct(&path));
    assert_eq!(dev.describe(), path.display().to_string());
    contract_tests(dev);
}

#[test]
fn contract_io_uring_direct() {
    file_contract(BackendChoice::IoUring, IoBackendKind::IoUring, true);
}

#[test]
fn contract_io_uring_buffered() {
    file_contract(BackendChoice::IoUring, IoBackendKind::IoUring, false);
}

#[test]
fn contract_pread_direct() {
    file_contract(BackendChoice::Pread, IoBackendKind::Pread, true);
}

#[test]
fn contract_pread_buffered() {
    file_contract(BackendChoice::Pread, IoBackendKind::Pread, false);
}

#[test]
fn contract_memory() {
    contract_tests(Arc::new(MemDrive::new(CONTRACT_CAPACITY)));
}

#[test]
fn contract_faulty_over_memory() {
    let (faulty, control) = FaultyDrive::new(Arc::new(MemDrive::new(CONTRACT_CAPACITY)));
    contract_tests(Arc::new(faulty));
    assert!(control.writes_seen() > 0 && control.reads_seen() > 0);
}

#[test]
fn io_uring_queue_depth_one_still_serves_many_requests() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_file_drive(dir.path(), 4 * MIB);
    let opts = DriveOpenOptions { backend: BackendChoice::IoUring, direct_io: true, queue_depth_max: 1 };
    let dev = open_drive(&path, &opts).unwrap();
    let writes: Vec<_> = (0..256u64).map(|i| dev.write(i * BLOCK, AlignedBuf::from_slice(&[i as u8; BLOCK_BYTES]))).collect();
    let sync = dev.sync();
    writes.into_iter().for_each(|w| drop(w.wait().unwrap()));
    sync.wait().unwrap();
    let all = dev.read(0, 256 * BLOCK_BYTES).wait().unwrap();
    for (i, block) in all.chunks(BLOCK_BYTES).enumerate() {
        assert!(block.iter().all(|&b| b == i as u8), "block {i}");
    }
}

/// Data written and synced through one backend is there after reopening, through either.
#[test]
fn file_drives_persist_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_file_drive(dir.path(), 8 * MIB);
    let mut rng = rng("persist");
    let combos = [
        (BackendChoice::IoUring, true),
        (BackendChoice::Pread, false),
        (BackendChoice::IoUring, false),
        (BackendChoice::Pread, true),
    ];
    let mut expected: Vec<(u64, Vec<u8>)> = Vec::new();
    for (round, (backend, direct)) in combos.into_iter().enumerate() {
        let dev = open_drive(&path, &options(backend, direct)).unwrap();
        for (offset, data) in &expected {
            assert!(dev.read(*offset, data.len()).wait().unwrap()[..] == data[..], "round {round}: data at {offset} lost");
        }
        let offset = round as u64 * 2 * MIB;
        let data = random_bytes(&mut rng, MIB as usize);
        dev.write(offset, AlignedBuf::from_slice(&data)).wait().unwrap();
        dev.sync().wait().unwrap();
        expected.push((offset, data));
    }
}

/// Dropping a drive lets its thread finish what was submitted; the file is closed when the
/// drop returns.
#[test]
fn drop_finishes_submitted_io() {
    for backend in [BackendChoice::IoUring, BackendChoice::Pread] {
        let dir = tempfile::tempdir().unwrap();
        let path = new_file_drive(dir.path(), 8 * MIB);
        let dev = open_drive(&path, &options(backend, true)).unwrap();
        let pending: Vec<_> =
            (0..64u64).map(|i| dev.write(i * 32 * BLOCK, AlignedBuf::from_slice(&[i as u8 + 1; 32 * BLOCK_BYTES]))).collect();
        let sync = dev.sync();
        drop(dev);
        for p in pending {
            p.wait().unwrap();
        }
        sync.wait().unwrap();
        let dev = open_drive(&path, &options(BackendChoice::Pread, false)).unwrap();
        for i in 0..64u64 {
            let got = dev.read(i * 32 * BLOCK, 32 * BLOCK_BYTES).wait().unwrap();
            assert!(got.iter().all(|&b| b == i as u8 + 1), "{backend:?}: write {i} lost");
        }
    }
}

/// If the file shrinks under an open drive, a read past the new end is an error, never a
/// short buffer.
#[test]
fn read_past_a_shrunk_file_is_an_error() {
    for backend in [BackendChoice::IoUring, BackendChoice::Pread] {
        for direct in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = new_file_drive(dir.path(), 2 * MIB);
            let dev = open_drive(&path, &options(backend, direct)).unwrap();
            std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(MIB).unwrap();
            let err = dev.read(0, 2 * MIB as usize).wait().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{backend:?} direct={direct}: {err}");
            assert!(err.to_string().contains(&path.display().to_string()), "error names the drive: {err}");
            assert_eq!(dev.read(0, MIB as usize).wait().unwrap().len(), MIB as usize);
        }
    }
}

#[test]
fn create_file_drive_preallocates_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.img");
    create_file_drive(&path, 16 * MIB).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 16 * MIB);
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 >= 16 * MIB, "space is reserved, not sparse");

    let err = create_file_drive(&path, 16 * MIB).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    assert!(err.to_string().starts_with(&format!("create drive file {}", path.display())), "{err}");

    let other = dir.path().join("e.img");
    assert_invalid_input("misaligned capacity", create_file_drive(&other, 16 * MIB + 1));
    assert_invalid_input("zero capacity", create_file_drive(&other, 0));
    assert!(!other.exists(), "a refused drive leaves no file behind");
    let err = create_file_drive(&dir.path().join("missing/dir/x.img"), MIB).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
}

#[test]
fn open_drive_errors_name_the_drive() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let err = open_drive(&missing, &DriveOpenOptions::default()).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().starts_with(&format!("open drive {}: ", missing.display())), "{err}");

    assert_invalid_input("a directory", open_drive(dir.path(), &DriveOpenOptions::default()).map(|_| ()));

    let tiny = dir.path().join("tiny.img");
    std::fs::write(&tiny, [1u8; 100]).unwrap();
    assert_invalid_input("smaller than a block", open_drive(&tiny, &DriveOpenOptions::default()).map(|_| ()));

    let path = new_file_drive(dir.path(), MIB);
    let zero_depth = DriveOpenOptions { queue_depth_max: 0, ..DriveOpenOptions::default() };
    assert_invalid_input("queue depth 0", open_drive(&path, &zero_depth).map(|_| ()));
}

#[test]
fn capacity_is_rounded_down_to_whole_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.img");
    std::fs::write(&path, vec![0u8; 3 * BLOCK_BYTES + 100]).unwrap();
    let dev = open_drive(&path, &options(BackendChoice::Pread, false)).unwrap();
    assert_eq!(dev.capacity_bytes(), 3 * BLOCK);
}

#[test]
fn auto_backend_follows_io_uring_availability() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_file_drive(dir.path(), MIB);
    let dev = open_drive(&path, &DriveOpenOptions::default()).unwrap();
    let expected = if io_uring_available() { IoBackendKind::IoUring } else { IoBackendKind::Pread };
    assert_eq!(dev.backend(), expected);
}

#[test]
fn io_threads_are_named_per_drive() {
    /// Whether a thread whose name starts with `prefix` runs in this process. A new thread
    /// names itself once it starts running, so allow it a moment.
    fn thread_running(prefix: &str) -> bool {
        (0..200).any(|_| {
            let found = std::fs::read_dir("/proc/self/task")
                .unwrap()
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .any(|name| name.starts_with(prefix));
            if !found {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            found
        })
    }
    let dir = tempfile::tempdir().unwrap();
    let path = new_file_drive(dir.path(), MIB);
    let dev = open_drive(&path, &options(BackendChoice::IoUring, true)).unwrap();
    assert!(thread_running("aquifer-uring-"));
    drop(dev);
    let dev = open_drive(&path, &options(BackendChoice::Pread, true)).unwrap();
    assert!(thread_running("aquifer-pread-"));
    drop(dev);
}

// ---- Fault injection ----

fn faulty_mem(capacity: u64) -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>, hardware::FaultControl) {
    let inner: Arc<dyn BlockDevice> = Arc::new(MemDrive::new(capacity));
    let (faulty, control) = FaultyDrive::new(Arc::clone(&inner));
    (Arc::new(faulty), inner, control)
}

fn block_of(byte: u8) -> AlignedBuf {
    AlignedBuf::from_slice(&[byte; BLOCK_BYTES])
}

#[test]
fn fault_offline_fails_everything_until_back() {
    let (dev, _inner, control) = faulty_mem(MIB);
    dev.write(0, block_of(1)).wait().unwrap();
    control.set_offline(true);
    assert!(dev.read(0, BLOCK_BYTES).wait().is_err());
    assert!(dev.write(BLOCK, block_of(2)).wait().is_err());
    let err = dev.sync().wait().unwrap_err();
    assert!(err.to_string().contains("offline"), "{err}");
    control.set_offline(false);
    assert!(dev.read(0, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 1));
    assert!(dev.read(BLOCK, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 0), "offline write must not land");
    dev.sync().wait().unwrap();
}

#[test]
fn fault_crash_point_stops_later_writes_and_syncs() {
    let (dev, inner, control) = faulty_mem(MIB);
    dev.write(0, block_of(9)).wait().unwrap();
    let before = control.writes_seen();
    assert_eq!(before, 1);

    // Counting starts at the call: two more writes land, then the crash.
    control.fail_writes_after(Some(2));
    dev.sync().wait().unwrap();
    for i in 1..=4u64 {
        let result = dev.write(i * BLOCK, block_of(i as u8)).wait();
        assert_eq!(result.is_ok(), i <= 2, "write {i}");
    }
    assert!(dev.sync().wait().is_err(), "a sync after the crash point must fail");
    assert_eq!(control.writes_seen(), before + 4);
    for i in 0..=4u64 {
        let got = inner.read(i * BLOCK, BLOCK_BYTES).wait().unwrap();
        let want = match i {
            0 => 9,
            1 | 2 => i as u8,
            _ => 0,
        };
        assert!(got.iter().all(|&b| b == want), "block {i} on the inner drive");
    }
    // Reads still work after the crash point.
    assert!(dev.read(BLOCK, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 1));

    // A crash point of zero fails the very next write; None removes it.
    control.fail_writes_after(Some(0));
    assert!(dev.write(0, block_of(7)).wait().is_err());
    control.fail_writes_after(None);
    dev.write(0, block_of(7)).wait().unwrap();
    dev.sync().wait().unwrap();
}

#[test]
fn fault_failed_read_ranges() {
    let (dev, _inner, control) = faulty_mem(MIB);
    control.fail_reads_in(2 * BLOCK..3 * BLOCK);
    control.fail_reads_in(10 * BLOCK..10 * BLOCK + 1);
    assert!(dev.read(0, 2 * BLOCK_BYTES).wait().is_ok(), "ends where the range starts");
    assert!(dev.read(3 * BLOCK, BLOCK_BYTES).wait().is_ok(), "starts where the range ends");
    assert!(dev.read(BLOCK, 2 * BLOCK_BYTES).wait().is_err());
    assert!(dev.read(0, 16 * BLOCK_BYTES).wait().is_err());
    assert!(dev.read(10 * BLOCK, BLOCK_BYTES).wait().is_err());
    assert!(dev.write(2 * BLOCK, block_of(3)).wait().is_ok(), "writes are unaffected");
    assert_eq!(control.reads_seen(), 5);
    control.clear();
    assert!(dev.read(2 * BLOCK, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 3));
}

#[test]
fn fault_corrupted_read_ranges_flip_only_that_range() {
    let (dev, inner, control) = faulty_mem(MIB);
    let data: Vec<u8> = (0..4 * BLOCK_BYTES).map(|i| (i % 251) as u8).collect();
    dev.write(0, AlignedBuf::from_slice(&data)).wait().unwrap();
    control.corrupt_reads_in(BLOCK + 100..BLOCK + 200);
    control.corrupt_reads_in(3 * BLOCK + 4000..5 * BLOCK);

    let got = dev.read(0, 4 * BLOCK_BYTES).wait().unwrap();
    for (i, (&g, &d)) in got.iter().zip(&data).enumerate() {
        let in_range = (BLOCK_BYTES + 100..BLOCK_BYTES + 200).contains(&i) || i >= 3 * BLOCK_BYTES + 4000;
        assert_eq!(g, if in_range { !d } else { d }, "byte {i}");
    }
    // A read that only partly overlaps sees just its share flipped.
    let tail = dev.read(3 * BLOCK, BLOCK_BYTES).wait().unwrap();
    assert_eq!(tail[..4000], data[3 * BLOCK_BYTES..3 * BLOCK_BYTES + 4000]);
    assert!(tail[4000..].iter().zip(&data[3 * BLOCK_BYTES + 4000..]).all(|(&g, &d)| g == !d));
    // Untouched ranges and the drive itself are intact.
    assert_eq!(dev.read(2 * BLOCK, BLOCK_BYTES).wait().unwrap()[..], data[2 * BLOCK_BYTES..3 * BLOCK_BYTES]);
    assert_eq!(inner.read(0, 4 * BLOCK_BYTES).wait().unwrap()[..], data[..]);
    control.clear();
    assert_eq!(dev.read(0, 4 * BLOCK_BYTES).wait().unwrap()[..], data[..]);
}

#[test]
fn fault_control_clones_share_state_and_clear_resets_everything() {
    let (dev, _inner, control) = faulty_mem(MIB);
    let other = control.clone();
    other.set_offline(true);
    assert!(dev.read(0, BLOCK_BYTES).wait().is_err());
    control.set_offline(false);
    other.fail_writes_after(Some(0));
    other.fail_reads_in(0..BLOCK);
    other.corrupt_reads_in(BLOCK..2 * BLOCK);
    assert!(dev.write(0, block_of(1)).wait().is_err());
    control.clear();
    dev.write(0, block_of(1)).wait().unwrap();
    dev.write(BLOCK, block_of(2)).wait().unwrap();
    dev.sync().wait().unwrap();
    assert!(dev.read(0, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 1));
    assert!(dev.read(BLOCK, BLOCK_BYTES).wait().unwrap().iter().all(|&b| b == 2));
    assert_eq!(other.writes_seen(), 3);
    assert_eq!(other.reads_seen(), 3);
}

/// The fault wrapper works over a real io_uring drive too, corrupting what comes off the disk.
#[test]
fn fault_wrapper_over_io_uring_drive() {
    let dir = tempfile::tempdir().unwrap();
    let path = new_file_drive(dir.path(), 4 * MIB);
    let inner = open_drive(&path, &options(BackendChoice::IoUring, true)).unwrap();
    let (faulty, control) = FaultyDrive::new(inner);
    let dev: Arc<dyn BlockDevice> = Arc::new(faulty);
    assert_eq!(dev.backend(), IoBackendKind::IoUring);
    dev.write(0, block_of(0x0F)).wait().unwrap();
    control.corrupt_reads_in(0..1);
    let got = dev.read(0, BLOCK_BYTES).wait().unwrap();
    assert_eq!(got[0], 0xF0);
    assert!(got[1..].iter().all(|&b| b == 0x0F));
}
