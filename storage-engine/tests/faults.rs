//! Drive loss and corruption: reads stay bit-exact, scrub repairs, rebuild restores
//! redundancy; I/O errors during writes leave old data intact.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use hardware::{BlockDevice, FaultControl, FaultyDrive};
use storage_engine::*;

fn wait_job(e: &Engine, id: u64) -> JobInfo {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let j = e.job(id).unwrap();
        if j.state != JobState::Running {
            return j;
        }
        assert!(Instant::now() < deadline, "job {id} did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn populate(e: &Engine) -> Vec<(String, Vec<u8>)> {
    let c = root();
    e.mkdir(&c, ROOT_INO, b"d", 0o755).unwrap();
    let mut files = Vec::new();
    for i in 0..12u64 {
        let len = [100, 5_000, 70_000, 300_000, 1_000_000][i as usize % 5];
        let path = format!("/d/f{i}");
        let data = bytes(i + 10, len);
        put(e, &path, &data);
        files.push((path, data));
    }
    files
}

fn check_all(e: &Engine, files: &[(String, Vec<u8>)]) {
    for (p, d) in files {
        assert!(get(e, p) == *d, "{p} differs");
    }
}

/// Overwrites `count` random ranges of a drive file's data area with garbage.
fn scribble(path: &std::path::Path, seed: u64, count: usize) {
    let len = std::fs::metadata(path).unwrap().len();
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let noise = bytes(seed, 64 * 1024);
    for i in 0..count {
        let span = 4 << 20; // the region the test's stripes occupy
        let off = (1 << 20) + (bytes(seed + i as u64, 8).iter().fold(0u64, |a, b| a * 256 + *b as u64) % span);
        assert!(off < len);
        f.seek(SeekFrom::Start(off)).unwrap();
        let n = 1 + (noise[i % noise.len()] as usize * 97) % (32 * 1024);
        f.write_all(&noise[..n]).unwrap();
    }
    f.sync_all().unwrap();
}

#[test]
fn two_drives_deleted_or_scribbled_still_read_back_then_scrub_and_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let files;
    {
        let e = open(dir.path());
        files = populate(&e);
        e.shutdown().unwrap();
    }
    let drive = |i: usize| dir.path().join("drives").join(format!("drive-{i}.img"));
    // Drive 1 gone entirely, drive 4 scribbled over: two failures, m = 2.
    std::fs::remove_file(drive(1)).unwrap();
    scribble(&drive(4), 7, 200);
    let e = open(dir.path());
    let h = e.health();
    assert_eq!(h.state, "degraded");
    assert!(matches!(h.drives[1].state, DriveState::Failed(_)));
    check_all(&e, &files);
    assert!(e.drives()[4].checksum_errors > 0, "corruption was detected");

    // Scrub repairs drive 4 in place (drive 1 is missing: left to rebuild).
    let c = root();
    let j = wait_job(&e, e.start_scrub(&c, 0).unwrap());
    assert_eq!(j.state, JobState::Completed);
    assert!(j.shards_repaired > 0);
    assert_eq!(j.stripes_unrecoverable, 0);
    let j2 = wait_job(&e, e.start_scrub(&c, 0).unwrap());
    assert_eq!(j2.shards_bad, 0, "second scrub finds nothing: {j2:?}");

    // Rebuild drive 1 onto a replacement file.
    let job = e.replace_drive(&c, 1, Some(dir.path().join("drives/replacement-1.img")), None).unwrap();
    let j = wait_job(&e, job);
    assert_eq!(j.state, JobState::Completed, "{j:?}");
    assert!(j.shards_repaired > 0);
    assert_eq!(e.health().state, "ok");
    assert!(e.drives()[1].used_bytes > 0);
    e.shutdown().unwrap();
    drop(e);

    // Full redundancy again: lose two other drives and everything still reads.
    std::fs::remove_file(drive(0)).unwrap();
    std::fs::remove_file(drive(2)).unwrap();
    let e = open(dir.path());
    assert_eq!(e.health().state, "degraded");
    check_all(&e, &files);
}

#[test]
fn three_drives_lost_is_reported_not_silently_wrong() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = open(dir.path());
        put(&e, "/f", &bytes(1, 300_000));
        e.shutdown().unwrap();
    }
    for i in [0, 1, 2] {
        std::fs::remove_file(dir.path().join(format!("drives/drive-{i}.img"))).unwrap();
    }
    let e = open(dir.path());
    assert_eq!(e.health().state, "failed");
    let a = e.resolve(&root(), "/f").unwrap();
    assert!(matches!(e.read(&root(), a.ino, 0, 1000), Err(Error::Unavailable(_))));
}

fn faulty_config(dir: &std::path::Path, ctl: Arc<parking_lot::Mutex<Vec<FaultControl>>>) -> EngineConfig {
    let mut cfg = config(dir);
    // Every read reaches the drives whose faults these tests inject.
    cfg.data_cache_bytes = 0;
    cfg.drive_wrapper = Some(Arc::new(move |_i, dev: Arc<dyn BlockDevice>| {
        let (d, c) = FaultyDrive::new(dev);
        ctl.lock().push(c);
        Arc::new(d) as Arc<dyn BlockDevice>
    }));
    cfg
}

/// An engine on `dir` (formatted without faults) whose drives faults can be injected into,
/// holding `/f` (250,000 bytes, synced): the engine, the drives' fault controls, `/f`'s
/// inode and bytes, and each drive's used bytes.
fn faulty_engine_with_a_file(dir: &std::path::Path) -> (Arc<Engine>, Arc<parking_lot::Mutex<Vec<FaultControl>>>, u64, Vec<u8>, Vec<u64>) {
    open(dir).shutdown().unwrap();
    let ctl = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let e = Engine::open(faulty_config(dir, ctl.clone())).unwrap();
    let old = bytes(1, 250_000);
    let ino = put(&e, "/f", &old);
    e.sync_metadata().unwrap();
    let used = e.drives().iter().map(|d| d.used_bytes).collect();
    (e, ctl, ino, old, used)
}

#[test]
fn write_errors_leave_old_data_and_no_leaked_space() {
    let dir = tempfile::tempdir().unwrap();
    let (e, ctl, ino, old, used) = faulty_engine_with_a_file(dir.path());
    let c = root();
    // Drive 3 refuses every write from now on.
    ctl.lock()[3].fail_writes_after(Some(0));
    let err = e.write(&c, ino, 1000, &bytes(2, 200_000), Stability::Durable);
    assert!(matches!(err, Err(Error::Io(_))), "{err:?}");
    assert_eq!(get(&e, "/f"), old, "failed write changed nothing");
    e.sync_metadata().unwrap();
    assert_eq!(e.drives().iter().map(|d| d.used_bytes).collect::<Vec<_>>(), used, "failed write leaked no space");
    // Reads fail on drive 0 and are served from parity.
    ctl.lock()[3].clear();
    ctl.lock()[0].fail_reads_in(0..u64::MAX);
    assert_eq!(get(&e, "/f"), old);
    ctl.lock()[1].corrupt_reads_in(0..u64::MAX);
    assert_eq!(get(&e, "/f"), old, "one failed and one corrupt drive: still exact");
}

#[test]
fn a_failed_background_write_out_fails_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (e, ctl, ino, old, used) = faulty_engine_with_a_file(dir.path());
    let c = root();
    ctl.lock()[2].fail_writes_after(Some(0));
    // Unstable writes past the buffer limit: full stripes go out in the background and fail
    // there. The writer may hear of it at a later write; the commit must hear of it.
    let new = bytes(2, 1_000_000);
    let mut write_failed = false;
    for (i, chunk) in new.chunks(40_000).enumerate() {
        if e.write(&c, ino, (i * 40_000) as u64, chunk, Stability::Unstable).is_err() {
            write_failed = true;
            break;
        }
    }
    let commit = e.commit(&c, ino);
    assert!(matches!(commit, Err(Error::Io(_))), "commit after a failed write-out: {commit:?} (a write failed: {write_failed})");
    // Every stripe has a shard on drive 2, so nothing new was kept: the old bytes are intact
    // and the failed stripes' space is free again.
    assert_eq!(get(&e, "/f"), old, "a failed write-out changed nothing committed");
    e.sync_metadata().unwrap();
    assert_eq!(e.drives().iter().map(|d| d.used_bytes).collect::<Vec<_>>(), used, "failed write-outs leaked no space");
    // The failure was reported once; the file takes writes again.
    ctl.lock()[2].clear();
    e.write(&c, ino, 0, &new, Stability::Durable).unwrap();
    assert_eq!(get(&e, "/f"), new);
}

/// When one background write-out fails part-way through a long write, on a drive that then
/// works again, exactly that batch's range is lost (it reads as before: zeros past the old
/// end), every byte before and after it is the writer's, and the commit reports the loss.
#[test]
fn a_write_out_failing_mid_file_loses_that_batch_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (e, ctl, ino, old, _) = faulty_engine_with_a_file(dir.path());
    let c = root();
    // Each 64 KiB stripe writes one shard to drive 2: the 21st stripe's fails there, several
    // 256 KiB batches into a 4 MB write, and the drive writes the stripes after it.
    ctl.lock()[2].fail_one_write_after(Some(20));
    let new = bytes(3, 4_000_000);
    let mut written = 0;
    for chunk in new.chunks(40_000) {
        if e.write(&c, ino, written as u64, chunk, Stability::Unstable).is_err() {
            break;
        }
        written += chunk.len();
    }
    let commit = e.commit(&c, ino);
    assert!(matches!(commit, Err(Error::Io(_))), "commit after a failed write-out: {commit:?}");
    let got = get(&e, "/f");
    assert_eq!(got.len(), written, "the size covers every write");
    let first = got.iter().zip(&new).position(|(a, b)| a != b).expect("a range was lost");
    let last = got.iter().zip(&new).rposition(|(a, b)| a != b).unwrap();
    let stripe = 64 * 1024;
    let lost = first - first % stripe..(last / stripe + 1) * stripe;
    assert!(first >= old.len() && lost.start >= 512 * 1024, "batches before the failure were committed: lost from {first}");
    assert!(lost.len() <= 1 << 20, "one batch was lost: {lost:?}");
    assert!(got[lost.start..lost.end.min(written)].iter().all(|&x| x == 0), "the lost range reads as before the write: {lost:?}");
    assert!(lost.end < written, "batches after the failure were committed: {lost:?} of {written}");
    // The file takes writes again.
    e.write(&c, ino, 0, &new, Stability::Durable).unwrap();
    assert_eq!(get(&e, "/f"), new);
}

#[test]
fn a_throttled_scrub_resumes_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let id;
    {
        let e = open(dir.path());
        populate(&e);
        // About 9 MiB of shards at 2 MiB/s: still running when the engine stops.
        id = e.start_scrub(&root(), 2 << 20).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let j = e.job(id).unwrap();
        assert_eq!(j.state, JobState::Running);
        assert!(j.stripes_done > 0 && j.progress() < 1.0, "{j:?}");
        e.shutdown().unwrap();
    }
    let e = open(dir.path());
    let before = e.job(id).unwrap();
    assert!(before.cursor > 0, "cursor was persisted: {before:?}");
    let j = wait_job(&e, id);
    assert_eq!(j.state, JobState::Completed, "{j:?}");
    assert_eq!(j.stripes_done, j.stripes_total);
    assert!(e.list_jobs().unwrap().iter().any(|x| x.id == id));
    assert!(matches!(e.start_scrub(&Caller { role: Role::User, ..root() }, 0), Err(Error::PermissionDenied)));
}

/// A read across many stripes of a sequentially written file makes one drive request per
/// data drive (shards that lie back to back are read together), and stays exact when one of
/// those requests fails or returns corrupt data: the stripes it covered are reconstructed.
#[test]
fn a_read_across_stripes_is_one_request_per_drive_and_survives_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let (e, ctl, _, _, _) = faulty_engine_with_a_file(dir.path());
    let data = bytes(9, 1_000_000); // 16 stripes of 64 KiB
    put(&e, "/big", &data);
    e.sync_metadata().unwrap();
    let reads = |ctl: &parking_lot::Mutex<Vec<FaultControl>>| ctl.lock().iter().map(|c| c.reads_seen()).sum::<u64>();
    let before = reads(&ctl);
    assert!(get(&e, "/big") == data);
    let made = reads(&ctl) - before;
    // Stripe by stripe it would be 16 × 4; the six drives each hold one run of the file.
    assert!((1..=6).contains(&made), "{made} drive reads for 16 stripes");

    // A range inside: unaligned start and end, several stripes.
    let c = root();
    let ino = e.resolve(&c, "/big").unwrap().ino;
    assert!(e.read(&c, ino, 70_001, 500_000).unwrap() == data[70_001..570_001]);

    ctl.lock()[0].fail_reads_in(0..u64::MAX);
    assert!(get(&e, "/big") == data, "a failed run is read from parity");
    assert!(e.drives()[0].read_errors > 0);
    ctl.lock()[0].clear();
    ctl.lock()[2].corrupt_reads_in(0..u64::MAX);
    let counted = e.drives()[2].checksum_errors;
    assert!(get(&e, "/big") == data, "a corrupt run is reconstructed");
    let counted = e.drives()[2].checksum_errors - counted;
    // Once per stripe whose shard on that drive was read (16 here), not again by each
    // fallback on the way to the reconstruction (up to three counts a stripe before).
    assert!((1..=16).contains(&counted), "the corruption is counted once a stripe: {counted}");
}

/// Holes between written ranges read as zeros in a read that also spans stripes.
#[test]
fn holes_between_stripes_read_as_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(dir.path());
    let c = root();
    let f = e.create(&c, ROOT_INO, b"sparse", 0o644, false).unwrap();
    let a = bytes(3, 150_000);
    let b = bytes(4, 100_000);
    e.write(&c, f.ino, 0, &a, Stability::Durable).unwrap();
    e.write(&c, f.ino, 600_000, &b, Stability::Durable).unwrap();
    let got = e.read(&c, f.ino, 100_000, 700_000).unwrap();
    assert_eq!(got.len(), 600_000);
    assert!(got[..50_000] == a[100_000..]);
    assert!(got[50_000..500_000].iter().all(|&x| x == 0));
    assert!(got[500_000..] == b[..]);
}

/// `read_chunks` answers what `read` does, in buffers of the asked size, and `read_shared`
/// the same bytes where the drives read them: across stripes, holes, bytes still in the write
/// buffer, a corrupt drive, and the end of the file; and a large read stays one request per
/// drive run.
#[test]
fn read_chunks_is_read_in_buffers_of_the_asked_size() {
    let dir = tempfile::tempdir().unwrap();
    let (e, ctl, _, _, _) = faulty_engine_with_a_file(dir.path());
    let c = root();
    let f = e.create(&c, ROOT_INO, b"chunked", 0o644, false).unwrap();
    let a = bytes(5, 700_000);
    let b = bytes(6, 90_000);
    e.write(&c, f.ino, 0, &a, Stability::Durable).unwrap();
    e.write(&c, f.ino, 900_000, &b, Stability::Durable).unwrap();
    // Still buffered: over the committed bytes and past the committed end.
    let tail = bytes(7, 30_000);
    e.write(&c, f.ino, 980_000, &tail, Stability::Unstable).unwrap();
    let size = e.getattr(&c, f.ino).unwrap().size as usize;
    assert_eq!(size, 1_010_000);
    let check = |off: u64, len: usize, chunk: usize| {
        let whole = e.read(&c, f.ino, off, len).unwrap();
        let parts = e.read_chunks(&c, f.ino, off, len, chunk).unwrap();
        if let Some((last, full)) = parts.split_last() {
            assert!(full.iter().all(|p| p.len() == chunk), "all but the last are {chunk} bytes");
            assert!(!last.is_empty() && last.len() <= chunk);
        }
        assert!(parts.concat() == whole, "read_chunks({off}, {len}, {chunk}) differs from read");
        let shared = e.read_shared(&c, f.ino, off, len).unwrap();
        assert!(shared.iter().all(|p| !p.is_empty()), "no empty pieces");
        assert!(shared.iter().flat_map(|p| p.iter().copied()).eq(whole.iter().copied()), "read_shared({off}, {len}) differs from read");
        whole
    };
    for chunk in [1usize << 20, 65_536, 100_000, 4_096, 7_777] {
        let all = check(0, size + 10, chunk);
        assert_eq!(all.len(), size);
        assert!(all[..700_000] == a[..]);
        assert!(all[700_000..900_000].iter().all(|&x| x == 0));
        assert!(all[900_000..980_000] == b[..80_000]);
        assert!(all[980_000..] == tail[..]);
        check(123_457, 600_000, chunk);
        check(975_000, 20_000, chunk);
    }
    assert!(e.read_chunks(&c, f.ino, size as u64, 100, 4096).unwrap().is_empty(), "nothing past the end");
    assert!(e.read_chunks(&c, f.ino, 0, 0, 4096).unwrap().is_empty());
    assert!(e.read_shared(&c, f.ino, size as u64, 100).unwrap().is_empty(), "nothing past the end");
    assert!(e.read_shared(&c, f.ino, 0, 0).unwrap().is_empty());
    e.close(&c, f.ino).unwrap();
    // Committed now: the pieces are slices of the drive reads, one per shard piece.
    let cat = |v: Vec<storage_engine::ReadBytes>| v.iter().flat_map(|p| p.iter().copied()).collect::<Vec<u8>>();
    assert!(cat(e.read_shared(&c, f.ino, 0, size).unwrap()) == check(0, size, 65_536));

    let reads = |ctl: &parking_lot::Mutex<Vec<FaultControl>>| ctl.lock().iter().map(|c| c.reads_seen()).sum::<u64>();
    let before = reads(&ctl);
    let parts = e.read_chunks(&c, f.ino, 0, 700_000, 65_536).unwrap();
    assert!(parts.concat() == a);
    let made = reads(&ctl) - before;
    assert!((1..=6).contains(&made), "{made} drive reads for 11 stripes read in 64 KiB buffers");
    ctl.lock()[1].corrupt_reads_in(0..u64::MAX);
    assert!(e.read_chunks(&c, f.ino, 0, 700_000, 65_536).unwrap().concat() == a, "a corrupt run is reconstructed");
    assert!(cat(e.read_shared(&c, f.ino, 0, 700_000).unwrap()) == a, "a corrupt run is reconstructed for read_shared too");
    assert!(cat(e.read_shared(&c, f.ino, 650_000, 300_000).unwrap()) == check(650_000, 300_000, 4_096), "and across the hole");
}

/// The data cache: a file read three times is read the fourth time without drive requests
/// (read less often, or written, it is not kept); what it answers is the file's current bytes after an
/// overwrite, a truncation, a delete and the reuse of the freed space; the drives' faults do
/// not reach a cached read; the least recently used shards go when the budget is spent.
#[test]
fn the_data_cache_answers_rereads_and_never_old_bytes() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path()).shutdown().unwrap();
    let ctl = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut cfg = faulty_config(dir.path(), ctl.clone());
    // Stripes of 64 KiB (16 KiB shards): the budget holds 1.5 MiB of data shards.
    cfg.data_cache_bytes = 1536 << 10;
    let e = Engine::open(cfg).unwrap();
    let reads = || ctl.lock().iter().map(|c| c.reads_seen()).sum::<u64>();
    let c = root();
    let cat = |v: Vec<ReadBytes>| v.iter().flat_map(|b| b.iter().copied()).collect::<Vec<u8>>();

    let mut a = bytes(1, 1_000_000);
    let ino = put(&e, "/a", &a);
    for pass in 1..=3 {
        let before = reads();
        assert!(get(&e, "/a") == a);
        assert!(reads() > before, "read {pass}: the file is read from the drives");
    }
    let before = reads();
    assert!(get(&e, "/a") == a);
    assert!(cat(e.read_shared(&c, ino, 0, 1_000_000).unwrap()) == a);
    assert!(e.read(&c, ino, 70_001, 30_000).unwrap() == a[70_001..100_001], "inside one stripe");
    assert_eq!(reads(), before, "read three times, a file is read from memory");

    // Read in small parts (samples in a shard): once twice a shard's data was read, the next
    // read of it fetches it whole; later passes are answered from memory.
    let s_data = bytes(5, 256 * 1024);
    let s_ino = put(&e, "/s", &s_data);
    let pass = || {
        let before = reads();
        for off in (0..s_data.len()).step_by(4096) {
            assert!(e.read(&c, s_ino, off as u64, 4096).unwrap() == s_data[off..off + 4096]);
        }
        reads() - before
    };
    assert_eq!(pass(), 64, "one drive read per 4 KiB read, nothing more");
    assert_eq!(pass(), 64);
    assert_eq!(pass(), 16, "each 16 KiB shard fetched whole by its first read");
    assert_eq!(pass(), 0, "then answered from memory");

    // A drive that returns garbage does not reach what is cached.
    ctl.lock()[1].corrupt_reads_in(0..u64::MAX);
    assert!(get(&e, "/a") == a);
    ctl.lock()[1].clear();

    // Overwritten in the middle, then truncated: the answers follow.
    e.write(&c, ino, 100_000, &bytes(2, 70_000), Stability::Durable).unwrap();
    a[100_000..170_000].copy_from_slice(&bytes(2, 70_000));
    assert!(get(&e, "/a") == a);
    e.setattr(&c, ino, SetAttr { size: Some(300_000), ..Default::default() }).unwrap();
    a.truncate(300_000);
    assert!(get(&e, "/a") == a);

    // An emptied cache sends reads to the drives again.
    e.clear_data_cache();
    let before = reads();
    assert!(get(&e, "/a") == a);
    assert!(reads() > before);

    // Kept again, then deleted: the freed stripes' shards leave the cache with it.
    for _ in 0..3 {
        assert!(get(&e, "/a") == a);
    }
    assert!(e.data_cache_stats().bytes > 200_000, "{:?}", e.data_cache_stats());

    // Deleted; its space is freed and reused by the next files: each reads its own bytes,
    // four times (from the drives three times, then from memory).
    e.unlink(&c, ROOT_INO, b"a").unwrap();
    assert_eq!(e.data_cache_stats().bytes, 0, "a deleted file's shards stay cached");
    e.sync_metadata().unwrap();
    for i in 0..4u64 {
        let d = bytes(10 + i, 400_000);
        put(&e, &format!("/n{i}"), &d);
        e.sync_metadata().unwrap();
        for _ in 0..4 {
            assert!(get(&e, &format!("/n{i}")) == d);
        }
    }

    // The budget holds: with 1.2 MB kept after it, the first new file's shards are gone.
    let s = e.data_cache_stats();
    assert!(s.bytes <= 1536 << 10 && s.bytes > 1 << 20, "{s:?}");
    assert!(s.hits > 0 && s.misses > 0, "{s:?}");
    let before = reads();
    assert!(get(&e, "/n3") == bytes(13, 400_000));
    assert_eq!(reads(), before, "the last file read is still kept");
    assert!(get(&e, "/n0") == bytes(10, 400_000));
    assert!(reads() > before, "evicted shards are read from the drives");
}
