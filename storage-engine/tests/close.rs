//! Who closes the engine: the caller that drops its last reference, or `shutdown`'s caller.
//! No background thread of the engine is left holding it, so the metadata database is closed
//! on the caller's thread, before its drop returns: a process may exit then (before, RocksDB
//! could still be closing on the log-sync thread while the process's exit tore it down).

mod common;

use std::sync::Arc;

use common::*;
use storage_engine::*;

/// The log-sync thread syncs every 10 ms here, around the drop: it never holds the engine,
/// so the caller's reference is the only one and its drop the last, every time.
#[test]
fn dropping_the_last_reference_closes_the_engine_on_the_callers_thread() {
    let dir = tempfile::tempdir().unwrap();
    let c = root();
    for round in 0..150u64 {
        let mut cfg = config(dir.path());
        cfg.wal_sync_interval_ms = 10;
        let e = Engine::open(cfg).unwrap_or_else(|err| panic!("round {round}: open: {err}"));
        let f = e.create(&c, ROOT_INO, format!("f{round}").as_bytes(), 0o644, true).unwrap();
        e.write(&c, f.ino, 0, &bytes(round, 100), Stability::Durable).unwrap();
        // Give the thread a sync to run around the drop.
        std::thread::sleep(std::time::Duration::from_millis(round % 12));
        assert_eq!(Arc::strong_count(&e), 1);
        drop(e);
    }
    let e = open(dir.path());
    for round in 0..150u64 {
        let a = e.resolve(&c, &format!("/f{round}")).unwrap();
        assert_eq!(e.getattr(&c, a.ino).unwrap().size, 100);
    }
}

/// After `shutdown`, even with files being written out by the flush threads when it was
/// called, the caller holds the only reference.
#[test]
fn after_shutdown_only_the_caller_holds_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let c = root();
    for round in 0..20u64 {
        let e = open(dir.path());
        for i in 0..8u64 {
            let f = e.create(&c, ROOT_INO, format!("r{round}-{i}").as_bytes(), 0o644, false).unwrap();
            // More than a write buffer holds: the flush threads write files out.
            e.write(&c, f.ino, 0, &bytes(i, 300 * 1024), Stability::Unstable).unwrap();
        }
        e.shutdown().unwrap();
        assert_eq!(Arc::strong_count(&e), 1, "round {round}: a background thread holds the engine after shutdown");
        drop(e);
    }
    let e = open(dir.path());
    for round in 0..20u64 {
        for i in 0..8u64 {
            assert!(get(&e, &format!("/r{round}-{i}")) == bytes(i, 300 * 1024), "r{round}-{i} differs");
        }
    }
}
