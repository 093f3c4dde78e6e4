//! Several threads writing disjoint ranges of one file while others flush it: every byte
//! written must be there afterwards (a writer must never add to a buffer a flush has
//! already emptied and dropped).

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
