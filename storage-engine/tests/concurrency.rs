//! Several threads writing disjoint ranges of one file while others flush it: every byte
//! written must be there afterwards (a writer must never add to a buffer a flush has
//! already emptied and dropped). Background write-out: bytes being written out stay
//! readable, and a file's write-outs land in the order their bytes were written.

mod common;

use std::sync::Arc;

use common::*;
use storage_engine::*;

#[test]
fn concurrent_writers_and_flushes_of_one_file_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let f = e.create(&c, ROOT_INO, b"shared", 0o644, true).unwrap();
    let data = Arc::new(bytes(7, 24 << 20));
    let piece = 96 * 1024;
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (e, data, c) = (e.clone(), data.clone(), c.clone());
            s.spawn(move || {
                // Thread t writes every 4th piece, closing (flushing) the file now and then.
                for (i, chunk) in data.chunks(piece).enumerate().filter(|(i, _)| i % 4 == t) {
                    e.write(&c, f.ino, (i * piece) as u64, chunk, Stability::Unstable).unwrap();
                    if i % 3 == 0 {
                        e.close(&c, f.ino).unwrap();
                    }
                }
            });
        }
    });
    e.close(&c, f.ino).unwrap();
    let a = e.getattr(&c, f.ino).unwrap();
    assert_eq!(a.size, data.len() as u64);
    let mut got = Vec::new();
    while got.len() < data.len() {
        let p = e.read(&c, f.ino, got.len() as u64, 4 << 20).unwrap();
        assert!(!p.is_empty());
        got.extend_from_slice(&p);
    }
    let first_bad = got.iter().zip(data.iter()).position(|(a, b)| a != b);
    assert!(first_bad.is_none(), "bytes differ from offset {first_bad:?}");
}

/// An engine of the test geometry with `threads` flush threads.
fn with_flush_threads(dir: &std::path::Path, threads: usize) -> Arc<Engine> {
    let mut cfg = config(dir);
    cfg.write_flush_threads = threads;
    Engine::open(cfg).unwrap()
}

/// Fills `len` bytes at `off` with the round number, one write per 48 KiB.
fn write_round(e: &Engine, c: &Caller, ino: Ino, len: usize, round: u8) {
    let piece = vec![round; 48 * 1024];
    let mut off = 0;
    while off < len {
        let n = piece.len().min(len - off);
        e.write(c, ino, off as u64, &piece[..n], Stability::Unstable).unwrap();
        off += n;
    }
}

#[test]
fn background_write_out_keeps_bytes_readable_and_in_order() {
    // One flush thread and a small buffer: write-outs run behind the writer most of the time.
    let dir = tempfile::tempdir().unwrap();
    let e = with_flush_threads(dir.path(), 1);
    let c = root();
    let f = e.create(&c, ROOT_INO, b"rounds", 0o644, true).unwrap();
    let len = 1_500_000;
    let rounds = 12u8;
    // The round whose writes have all returned: a reader must see it or a later one, never
    // an older round or a hole, wherever the bytes are (buffered, being written, committed).
    let done = std::sync::atomic::AtomicU8::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for r in 1..=rounds {
                write_round(&e, &c, f.ino, len, r);
                done.store(r, std::sync::atomic::Ordering::Release);
            }
        });
        for t in 0..2u64 {
            let (e, c, done) = (e.clone(), c.clone(), &done);
            s.spawn(move || {
                let mut i = 0u64;
                while done.load(std::sync::atomic::Ordering::Acquire) < rounds {
                    let floor = done.load(std::sync::atomic::Ordering::Acquire);
                    let off = (i * 7919 + t * 104_729) % (len as u64 - 1);
                    let got = e.read(&c, f.ino, off, 200_000).unwrap();
                    if floor > 0 {
                        assert_eq!(got.len(), 200_000.min(len - off as usize), "short read at {off}");
                        if let Some(p) = got.iter().position(|b| *b < floor) {
                            panic!("byte {} read {} after round {floor} had been written", off + p as u64, got[p]);
                        }
                    }
                    i += 1;
                }
            });
        }
    });
    e.close(&c, f.ino).unwrap();
    assert_eq!(e.getattr(&c, f.ino).unwrap().size, len as u64);
    let all = e.read(&c, f.ino, 0, len).unwrap();
    assert!(all.iter().all(|b| *b == rounds), "the last round's bytes are what is left");
    // And after a restart, from the drives alone.
    e.shutdown().unwrap();
    drop(e);
    let e = open(dir.path());
    let all = e.read(&c, f.ino, 0, len).unwrap();
    assert_eq!(all.len(), len);
    assert!(all.iter().all(|b| *b == rounds), "the last round's bytes are what was kept");
}

#[test]
fn a_write_that_would_wait_is_refused_by_try_write_buffered_and_changes_nothing() {
    // No flush threads: a write that fills the buffer must write stripes itself, which an
    // event-loop caller must not do.
    let dir = tempfile::tempdir().unwrap();
    let e = with_flush_threads(dir.path(), 0);
    let c = root();
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    let piece = bytes(9, 100 * 1024);
    assert!(e.try_write_buffered(&c, f.ino, 0, &piece).unwrap());
    assert!(e.try_write_buffered(&c, f.ino, piece.len() as u64, &piece).unwrap());
    assert_eq!(e.getattr(&c, f.ino).unwrap().size, 2 * piece.len() as u64, "buffered writes are visible");
    // 300 KiB would pass the 256 KiB buffer limit: refused, nothing added.
    assert!(!e.try_write_buffered(&c, f.ino, 2 * piece.len() as u64, &piece).unwrap());
    assert_eq!(e.getattr(&c, f.ino).unwrap().size, 2 * piece.len() as u64);
    e.write(&c, f.ino, 2 * piece.len() as u64, &piece, Stability::Unstable).unwrap();
    e.close(&c, f.ino).unwrap();
    assert!(e.read(&c, f.ino, 0, 1 << 20).unwrap() == [&piece[..], &piece[..], &piece[..]].concat());
    // The checks of `write` apply.
    let d = e.mkdir(&c, ROOT_INO, b"d", 0o755).unwrap();
    assert!(matches!(e.try_write_buffered(&c, d.ino, 0, b"x"), Err(Error::IsDir)));
    let bob = e
        .create_user(&c, NewUser { name: "bob".into(), password: "password-123".into(), ..Default::default() })
        .and_then(|_| e.caller_for_user("bob"))
        .unwrap();
    assert!(matches!(e.try_write_buffered(&bob, f.ino, 0, b"x"), Err(Error::PermissionDenied)));
    assert!(matches!(e.try_write_buffered(&c, f.ino, FILE_BYTES_MAX, b"x"), Err(Error::FileTooLarge)));
}

#[test]
fn try_write_buffered_never_reaches_the_writers_wait() {
    // With flush threads, a write that would leave twice the buffer limit buffered is where
    // `write` waits for room: refused, nothing added, whether or not a flush is under way.
    let dir = tempfile::tempdir().unwrap();
    let e = with_flush_threads(dir.path(), 1);
    let c = root();
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    let big = bytes(3, 600 * 1024); // more than 2 × 256 KiB
    assert!(!e.try_write_buffered(&c, f.ino, 0, &big).unwrap());
    assert_eq!(e.getattr(&c, f.ino).unwrap().size, 0);
    // Between the limit and twice it: added, and written out in the background.
    let mid = bytes(4, 300 * 1024);
    assert!(e.try_write_buffered(&c, f.ino, 0, &mid).unwrap());
    e.close(&c, f.ino).unwrap();
    assert!(e.read(&c, f.ino, 0, 1 << 20).unwrap() == mid);
}

#[test]
fn try_create_is_create_for_event_loop_callers() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let files_before = e.statfs(&c).unwrap().files;
    let a = e.try_create(&c, ROOT_INO, b"f", 0o640, true).expect("nothing else is mutating").unwrap();
    assert_eq!((a.kind, a.mode, a.size), (FileKind::File, 0o640, 0));
    assert_eq!(e.lookup(&c, ROOT_INO, b"f").unwrap().ino, a.ino);
    // `create`'s rules: an exclusive create of an existing name fails, a plain one returns it.
    assert!(matches!(e.try_create(&c, ROOT_INO, b"f", 0o644, true).unwrap(), Err(Error::Exists)));
    assert_eq!(e.try_create(&c, ROOT_INO, b"f", 0o644, false).unwrap().unwrap().ino, a.ino);
    let bob = e
        .create_user(&c, NewUser { name: "bob".into(), password: "password-123".into(), ..Default::default() })
        .and_then(|_| e.caller_for_user("bob"))
        .unwrap();
    assert!(matches!(e.try_create(&bob, ROOT_INO, b"g", 0o644, true).unwrap(), Err(Error::PermissionDenied)));
    assert!(matches!(e.try_create(&c, a.ino, b"g", 0o644, true).unwrap(), Err(Error::NotDir)));
    assert!(matches!(e.try_create(&c, ROOT_INO, b"a/b", 0o644, true).unwrap(), Err(Error::InvalidName(_))));
    assert_eq!(e.statfs(&c).unwrap().files, files_before + 1, "only the one file was counted");
    // Written and committed like any file, and there after a restart.
    e.write(&c, a.ino, 0, b"hello", Stability::Unstable).unwrap();
    e.commit(&c, a.ino).unwrap();
    e.shutdown().unwrap();
    drop(e);
    let e = open(dir.path());
    let f = e.lookup(&c, ROOT_INO, b"f").unwrap();
    assert_eq!(f.ino, a.ino);
    assert_eq!(e.read(&c, f.ino, 0, 100).unwrap(), b"hello");
    assert_eq!(e.statfs(&c).unwrap().files, files_before + 1);
}

/// `try_setattr` changes what `setattr` changes, with `setattr`'s refusals, and leaves a
/// truncation of a file with buffered bytes to `setattr` (which writes them out first).
#[test]
fn try_setattr_is_setattr_for_event_loop_callers() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    // What an NFS client's open(O_TRUNC) of a new file sends: size 0 of an empty file.
    let a = e.try_setattr(&c, f.ino, SetAttr { size: Some(0), ..Default::default() }).expect("nothing buffered, nothing mutating").unwrap();
    assert_eq!((a.size, a.mode), (0, 0o644));
    let a = e.try_setattr(&c, f.ino, SetAttr { mode: Some(0o600), mtime: Some(TimeSet::At(1_000_000_000)), ..Default::default() }).unwrap().unwrap();
    assert_eq!((a.mode, a.mtime_ns), (0o600, 1_000_000_000));
    assert_eq!(e.getattr(&c, f.ino).unwrap().mode, 0o600);
    // Unstable bytes in the write buffer: a size change is refused here, and changes nothing.
    e.write(&c, f.ino, 0, &bytes(5, 10_000), Stability::Unstable).unwrap();
    assert!(e.try_setattr(&c, f.ino, SetAttr { size: Some(100), ..Default::default() }).is_none());
    assert_eq!(e.getattr(&c, f.ino).unwrap().size, 10_000);
    // Other attributes still change here.
    assert_eq!(e.try_setattr(&c, f.ino, SetAttr { mode: Some(0o640), ..Default::default() }).unwrap().unwrap().mode, 0o640);
    e.setattr(&c, f.ino, SetAttr { size: Some(100), ..Default::default() }).unwrap();
    assert_eq!(e.read(&c, f.ino, 0, 1 << 20).unwrap(), bytes(5, 10_000)[..100]);
    // Once written out, a truncation is done here too, and sticks after a restart.
    e.commit(&c, f.ino).unwrap();
    let a = e.try_setattr(&c, f.ino, SetAttr { size: Some(10), ..Default::default() }).expect("nothing buffered").unwrap();
    assert_eq!(a.size, 10);
    // setattr's refusals.
    let bob = e
        .create_user(&c, NewUser { name: "bob".into(), password: "password-123".into(), ..Default::default() })
        .and_then(|_| e.caller_for_user("bob"))
        .unwrap();
    assert!(matches!(e.try_setattr(&bob, f.ino, SetAttr { mode: Some(0o777), ..Default::default() }).unwrap(), Err(Error::PermissionDenied)));
    assert!(matches!(e.try_setattr(&bob, f.ino, SetAttr { size: Some(0), ..Default::default() }).unwrap(), Err(Error::PermissionDenied)));
    assert!(matches!(e.try_setattr(&c, ROOT_INO, SetAttr { size: Some(0), ..Default::default() }).unwrap(), Err(Error::IsDir)));
    assert_eq!(e.getattr(&c, f.ino).unwrap().mode, 0o640);
    e.shutdown().unwrap();
    drop(e);
    let e = open(dir.path());
    let f = e.lookup(&c, ROOT_INO, b"f").unwrap();
    assert_eq!((f.size, f.mode), (10, 0o640));
    assert_eq!(e.read(&c, f.ino, 0, 100).unwrap(), bytes(5, 10_000)[..10]);
}

/// `try_resolve` finds what `resolve` finds, and fails as it does.
#[test]
fn try_resolve_is_resolve_for_event_loop_callers() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let a = e.mkdir(&c, ROOT_INO, b"a", 0o755).unwrap();
    let b = e.mkdir(&c, a.ino, b"b", 0o755).unwrap();
    let f = e.create(&c, b.ino, b"f", 0o644, true).unwrap();
    for path in ["/", "", "/a", "a/b", "/a/b/", "//a//b/f"] {
        assert_eq!(e.try_resolve(&c, path).expect("no portal").unwrap().ino, e.resolve(&c, path).unwrap().ino, "{path}");
    }
    assert_eq!(e.try_resolve(&c, "/a/b/f").unwrap().unwrap().ino, f.ino);
    assert!(matches!(e.try_resolve(&c, "/a/missing").unwrap(), Err(Error::NotFound)));
    assert!(matches!(e.try_resolve(&c, "/a/b/f/g").unwrap(), Err(Error::NotDir)));
}

/// Event-loop creates racing blocking mutations: a `try_create` that finds the mutation lock
/// taken is refused with nothing changed, and the caller's fall-back `create` does it. Every
/// file ends up created once and counted once.
#[test]
fn try_create_refused_under_contention_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let files_before = e.statfs(&c).unwrap().files;
    let per_thread = 300;
    std::thread::scope(|s| {
        for t in 0..4usize {
            let (e, c) = (e.clone(), c.clone());
            s.spawn(move || {
                for i in 0..per_thread {
                    let name = format!("t{t}-{i}");
                    if t % 2 == 0 {
                        e.create(&c, ROOT_INO, name.as_bytes(), 0o644, true).unwrap();
                        e.setattr(&c, ROOT_INO, SetAttr { mode: Some(0o755), ..Default::default() }).unwrap();
                    } else {
                        match e.try_create(&c, ROOT_INO, name.as_bytes(), 0o644, true) {
                            Some(r) => {
                                r.unwrap();
                            }
                            None => {
                                e.create(&c, ROOT_INO, name.as_bytes(), 0o644, true).unwrap();
                            }
                        }
                    }
                }
            });
        }
    });
    let mut names = Vec::new();
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let page = e.readdir(&c, ROOT_INO, cursor.as_deref(), 1000).unwrap();
        names.extend(page.entries.into_iter().map(|d| d.name));
        match page.next_cursor {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    assert_eq!(names.len(), 4 * per_thread);
    assert_eq!(e.statfs(&c).unwrap().files, files_before + 4 * per_thread as u64);
}

/// Whole buffers handed to `write_shared` (as S3 uploads hand their 4 MiB chunks) are
/// written and read back like ordinary writes, mixed with ordinary writes that overlap
/// them, from several threads, and are the same after a restart. The caller's buffer is
/// not changed by the engine.
#[test]
fn shared_buffer_writes_land_like_ordinary_writes() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(11, 24 << 20);
    let chunk = 4 << 20;
    let ino;
    let mut want = data.clone();
    {
        let e = open(dir.path());
        let c = root();
        let f = e.create(&c, ROOT_INO, b"chunks", 0o644, true).unwrap();
        ino = f.ino;
        let bufs: Vec<Arc<AlignedBuf>> = data.chunks(chunk).map(|p| Arc::new(AlignedBuf::from_slice(p))).collect();
        std::thread::scope(|s| {
            for t in 0..2usize {
                let (e, c, bufs) = (e.clone(), c.clone(), &bufs);
                s.spawn(move || {
                    for (i, b) in bufs.iter().enumerate().filter(|(i, _)| i % 2 == t) {
                        e.write_shared(&c, ino, (i * chunk) as u64, b.clone()).unwrap();
                    }
                });
            }
        });
        // Ordinary writes over parts of shared chunks (buffered or already written out) and
        // an odd-sized shared buffer at an unaligned offset.
        let over = bytes(12, 100_000);
        let at = 3 * chunk - 50_000;
        e.write(&c, ino, at as u64, &over, Stability::Unstable).unwrap();
        want[at..at + over.len()].copy_from_slice(&over);
        let odd = bytes(13, 12_345);
        e.write_shared(&c, ino, 5_000, Arc::new(AlignedBuf::from_slice(&odd))).unwrap();
        want[5_000..5_000 + odd.len()].copy_from_slice(&odd);
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(&b[..], &data[i * chunk..(i + 1) * chunk], "the caller's buffer is unchanged");
        }
        e.commit(&c, ino).unwrap();
        let got = e.read(&c, ino, 0, want.len()).unwrap();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "bytes read back differ from those written");
        // Writing a directory or past the maximum size is refused, as `write` refuses it.
        assert!(matches!(e.write_shared(&c, ROOT_INO, 0, Arc::new(AlignedBuf::from_slice(b"x"))), Err(Error::IsDir)));
    }
    let e = open(dir.path());
    let got = e.read(&root(), ino, 0, want.len()).unwrap();
    assert!(got == want, "bytes differ after a restart");
}

#[test]
fn a_pool_filled_by_a_background_write_out_reports_no_space() {
    // Unstable writes are acknowledged from the write buffer; when the write-out behind them
    // finds the pool full, the writer's next write or its close must say "no space" (SMB's
    // STATUS_DISK_FULL, NFS3ERR_NOSPC, ENOSPC), not a bare I/O error, and deleting the file
    // gives the space back.
    let dir = tempfile::tempdir().unwrap();
    let e = with_flush_threads(dir.path(), 1);
    let c = root();
    let f = e.create(&c, ROOT_INO, b"big", 0o644, true).unwrap();
    let piece = bytes(8, 128 * 1024);
    let mut failure = None;
    for i in 0..(256 << 20) / piece.len() {
        if let Err(err) = e.write(&c, f.ino, (i * piece.len()) as u64, &piece, Stability::Unstable) {
            failure = Some(err);
            break;
        }
    }
    let failure = match failure {
        Some(err) => err,
        None => e.close(&c, f.ino).expect_err("256 MiB does not fit in a pool of 128 MiB"),
    };
    assert!(matches!(failure, Error::NoSpace(_)), "the write-out's failure keeps its kind: {failure:?}");
    // The close after it reports no space too, or nothing when the failure was already told.
    if let Err(err) = e.close(&c, f.ino) {
        assert!(matches!(err, Error::NoSpace(_)), "{err:?}");
    }
    e.unlink(&c, ROOT_INO, b"big").unwrap();
    let g = e.create(&c, ROOT_INO, b"after", 0o644, true).unwrap();
    let data = bytes(9, 1 << 20);
    e.write(&c, g.ino, 0, &data, Stability::Durable).unwrap();
    assert!(e.read(&c, g.ino, 0, data.len()).unwrap() == data);
}

#[test]
fn a_write_out_that_fails_leaves_the_size_at_what_was_kept() {
    // A write-out commits whole stripes and leaves a partial tail buffered. The size it
    // commits is the end of its own bytes: when the tail's write-out then finds the pool
    // full, the file must not end in zeros standing for bytes that were never kept.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.write_flush_threads = 0;
    cfg.write_buffer_bytes_max = 64 * 1024; // one stripe (4 × 16 KiB)
    let e = Engine::open(cfg).unwrap();
    let c = root();
    let stripe = vec![7u8; 64 * 1024];
    // One stripe to give back later, then stripes until the pool is full.
    let spare = e.create(&c, ROOT_INO, b"spare", 0o644, true).unwrap();
    e.write(&c, spare.ino, 0, &stripe, Stability::Durable).unwrap();
    let fill = e.create(&c, ROOT_INO, b"fill", 0o644, true).unwrap();
    let mut filled = 0u64;
    loop {
        match e.write(&c, fill.ino, filled, &stripe, Stability::Durable) {
            Ok(_) => filled += stripe.len() as u64,
            Err(Error::NoSpace(_)) => break,
            Err(err) => panic!("filling the pool: {err:?}"),
        }
        assert!(filled < 256 << 20, "a pool of 128 MiB filled");
    }
    e.close(&c, fill.ino).ok();
    e.unlink(&c, ROOT_INO, b"spare").unwrap();
    e.sync_metadata().unwrap();
    // Room for exactly one stripe: a stripe and a half, buffered, write out the stripe and
    // keep the half; closing cannot keep the half.
    let f = e.create(&c, ROOT_INO, b"f", 0o644, true).unwrap();
    let data = bytes(11, 96 * 1024);
    e.write(&c, f.ino, 0, &data, Stability::Unstable).unwrap();
    let closed = e.close(&c, f.ino);
    assert!(matches!(closed, Err(Error::NoSpace(_))), "the half stripe finds the pool full: {closed:?}");
    let size = e.getattr(&c, f.ino).unwrap().size;
    assert_eq!(size, 64 * 1024, "the size is what was kept");
    assert!(e.read(&c, f.ino, 0, 96 * 1024).unwrap() == data[..64 * 1024], "the kept stripe reads back");
    // The file takes writes again once there is room.
    e.unlink(&c, ROOT_INO, b"fill").unwrap();
    e.write(&c, f.ino, 64 * 1024, &data[64 * 1024..], Stability::Durable).unwrap();
    assert!(e.read(&c, f.ino, 0, 96 * 1024).unwrap() == data);
}
