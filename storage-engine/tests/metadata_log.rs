//! Metadata logs kept for reuse (`EngineConfig::log_reuse_bytes`): the engine writes them
//! out when it opens, and what it commits afterwards survives reopening with the option on,
//! off and on again, with nothing older coming back.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use storage_engine::*;

const REUSE: u64 = 2 << 20;

fn open_with(dir: &Path, reuse: u64) -> Arc<Engine> {
    let mut cfg = config(dir);
    cfg.log_reuse_bytes = reuse;
    Engine::open(cfg).expect("open engine")
}

/// Sizes of RocksDB's log files in the metadata directory.
fn log_sizes(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir.join("meta"))
        .unwrap()
        .map(|f| f.unwrap())
        .filter(|f| f.file_name().to_string_lossy().ends_with(".log"))
        .map(|f| f.metadata().unwrap().len())
        .collect();
    v.sort();
    v
}

fn check(e: &Engine, files: &[(String, Vec<u8>)]) {
    for (p, d) in files {
        assert!(get(e, p) == *d, "{p} differs");
    }
    let c = root();
    assert!(matches!(e.resolve(&c, "/d/gone"), Err(Error::NotFound)), "an unlinked file came back");
    assert!(matches!(e.resolve(&c, "/d/old-name"), Err(Error::NotFound)), "a renamed file's old name came back");
}

#[test]
fn logs_kept_for_reuse_are_written_at_open_and_recovery_reads_only_what_was_committed() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_with(dir.path(), REUSE);
    // The log being written and the one set aside are both written out to full size.
    let sizes = log_sizes(dir.path());
    assert!(sizes.len() >= 2 && sizes.iter().all(|&s| s >= REUSE), "log files: {sizes:?}");

    let c = root();
    e.mkdir(&c, ROOT_INO, b"d", 0o755).unwrap();
    let mut files = Vec::new();
    for i in 0..40u64 {
        // Inline (metadata only) and striped files.
        let len = [10, 3_000, 70_000][i as usize % 3];
        let path = format!("/d/f{i}");
        let data = bytes(i + 1, len);
        put(&e, &path, &data);
        files.push((path, data));
    }
    let d = e.resolve(&c, "/d").unwrap();
    put(&e, "/d/gone", b"short-lived");
    e.unlink(&c, d.ino, b"gone").unwrap();
    let moved = bytes(99, 5_000);
    put(&e, "/d/old-name", &moved);
    e.rename(&c, d.ino, b"old-name", d.ino, b"new-name").unwrap();
    files.push(("/d/new-name".into(), moved));
    e.sync_metadata().unwrap();
    // Closed without a shutdown: the next open replays the log, whose tail past the new
    // records still holds the filler written at open.
    drop(e);

    let e = open_with(dir.path(), REUSE);
    check(&e, &files);
    let more = bytes(7, 40_000);
    put(&e, "/d/after-first-reopen", &more);
    files.push(("/d/after-first-reopen".into(), more));
    drop(e);

    // Off, then on again.
    let e = open_with(dir.path(), 0);
    check(&e, &files);
    drop(e);
    let e = open_with(dir.path(), REUSE);
    check(&e, &files);
    e.shutdown().unwrap();
}

/// Unmounts a test's filesystem however the test ends.
struct Mounted(std::path::PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// On a metadata filesystem with little room (a 96 MiB tmpfs), logs of 2 × 64 MiB are not
/// written: the engine opens, with a warning, instead of failing for want of space, and
/// works. Mounting needs root, as in CI; elsewhere the test says so and stops.
#[test]
fn logs_for_reuse_are_not_written_where_the_metadata_filesystem_lacks_room() {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        eprintln!("not root: no tmpfs can be mounted for the metadata directory; test not run");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join("meta");
    std::fs::create_dir(&meta).unwrap();
    let ok = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=96m", "tmpfs"]).arg(&meta).status().unwrap();
    assert!(ok.success(), "mount a tmpfs on {}", meta.display());
    let _mounted = Mounted(meta.clone());

    let e = open_with(dir.path(), 64 << 20);
    let sizes = log_sizes(dir.path());
    assert!(sizes.iter().all(|&s| s < 1 << 20), "logs written out on a filesystem without room: {sizes:?}");
    let data = bytes(3, 70_000);
    put(&e, "/kept", &data);
    e.shutdown().unwrap();
    drop(e);
    let e = open_with(dir.path(), 64 << 20);
    assert!(get(&e, "/kept") == data, "/kept differs after reopening");
    e.shutdown().unwrap();
}
