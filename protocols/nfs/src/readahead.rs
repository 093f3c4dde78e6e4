//! Sequential readahead for READ.
//!
//! NFS is stateless, so the service keeps a small table per file: where the reads so far ended
//! and windows of the file read ahead in the background. A READ that starts near where the
//! reads so far ended (within a window either way: READs in flight together arrive in any
//! order) starts reading the next [`WINDOW_BYTES`] ahead; a READ inside a window is served
//! from it and keeps [`WINDOWS_AHEAD`] windows in flight, so the engine's reads overlap the
//! transfer of earlier replies instead of following them.
//!
//! A window is only used while the file's size, mtime and ctime (loaded for every call anyway)
//! are the ones it was read under: any change to the file drops its windows.
//!
//! Windows are 16 MiB, four stripes of the default geometry: the engine reads shards that lie
//! back to back on a drive with one request, and the disks measured move far more with 4 MiB
//! requests than with 1 MiB ones. A window keeps the bytes where the drives read them
//! ([`Engine::read_shared`]), and a READ inside one piece of it is answered from there: the
//! data is copied once on its way out, into the socket. All windows together hold at most
//! [`READAHEAD_BYTES_MAX`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use storage_engine::{Attr, Caller, Engine, Ino, ReadBytes};
use tokio::sync::watch;

/// Bytes read ahead in one engine call.
const WINDOW_BYTES: u64 = 16 << 20;
/// Windows kept in flight ahead of the reader. With three, a pass of 8 READs in flight over
/// a GiB kept about nine 3.4 MB drive reads queued (`iostat`) and took 0.66–0.70 s on a
/// virtio disk that `fio` reads at 1.8–2.0 GB/s with 12–16 requests in flight; with five,
/// 0.61–0.66 s; eight took no less (docs/benchmarks.md, NFS section, "Five windows ahead").
const WINDOWS_AHEAD: u64 = 5;
/// Files with readahead state; the least recently used is dropped beyond this.
const FILES_MAX: usize = 32;
/// Bytes all windows together may hold (read or being read); beyond it, the windows of the
/// least recently read other files are dropped, and failing that no window is started.
const READAHEAD_BYTES_MAX: u64 = 384 << 20;

/// A window's bytes once read, in order from its start (`None` inside: the read failed).
type Filled = Option<Option<Arc<Vec<ReadBytes>>>>;

struct Window {
    start: u64,
    rx: watch::Receiver<Filled>,
}

struct FileState {
    stamp: (u64, i64, i64),
    /// Furthest end of the reads of the current sequential run (of the last READ after a jump).
    last_end: u64,
    windows: Vec<Window>,
    used: u64,
}

/// A file as one caller reads it: windows are read with that caller's permissions and only
/// serve the same identity.
type Key = (Ino, u32, u32, Vec<u32>);

#[derive(Default)]
pub(crate) struct Readahead {
    files: Mutex<(HashMap<Key, FileState>, u64)>,
    /// Windows started so far (each one engine read of up to [`WINDOW_BYTES`]).
    windows_started: AtomicU64,
}

fn stamp(a: &Attr) -> (u64, i64, i64) {
    (a.size, a.mtime_ns, a.ctime_ns)
}

impl Readahead {
    /// Serves `[off, off + count)` of the file `attr` from a window when one covers it, and
    /// schedules windows ahead of a sequential reader. `None`: read it directly.
    /// The answer shares the window's buffer when one piece of the window holds the read.
    pub(crate) async fn read(&self, engine: &Arc<Engine>, caller: &Caller, attr: &Attr, off: u64, count: usize) -> Option<ReadBytes> {
        let end = attr.size.min(off.saturating_add(count as u64));
        if off >= end {
            return None;
        }
        let rx = {
            let mut g = self.files.lock().expect("readahead lock");
            let (files, clock) = &mut *g;
            *clock += 1;
            let now = *clock;
            let key: Key = (attr.ino, caller.uid, caller.gid, caller.groups.clone());
            let st = match files.get_mut(&key) {
                Some(st) if st.stamp == stamp(attr) => st,
                _ => {
                    if files.len() >= FILES_MAX {
                        if let Some(old) = files.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| k.clone()) {
                            files.remove(&old);
                        }
                    }
                    files.insert(key.clone(), FileState { stamp: stamp(attr), last_end: u64::MAX, windows: Vec::new(), used: now });
                    files.get_mut(&key).expect("just inserted")
                }
            };
            st.used = now;
            // Sequential: near where the reads so far ended. A client keeps several READs in
            // flight (a kernel client's read-ahead does), and the service runs them side by
            // side, so they come here in any order among themselves: a READ a little behind
            // or ahead of the furthest end is as sequential as one right at it.
            let sequential = st.last_end != u64::MAX && off <= st.last_end.saturating_add(WINDOW_BYTES) && off.saturating_add(WINDOW_BYTES) >= st.last_end;
            // A READ further behind that a window still covers is a straggler of the same run:
            // it leaves the run's end where it is. Any other READ starts a new run.
            if sequential {
                st.last_end = st.last_end.max(end);
            } else if !st.windows.iter().any(|w| w.start <= off && end <= w.start + WINDOW_BYTES) {
                st.last_end = end;
            }
            // Windows are kept in flight up to this far ahead of the furthest read, not of this
            // one: a READ that arrives a little behind the others must not drop the window the
            // one ahead of it just started (it would be read again by the next READ).
            let reach = st.last_end.saturating_add(WINDOWS_AHEAD * WINDOW_BYTES);
            // Windows more than one behind this read (a READ still in flight may want the
            // one just behind), or beyond the reach (left from an earlier pass over the
            // file), are of no use.
            st.windows.retain(|w| w.start + 2 * WINDOW_BYTES > off && w.start < reach);
            let hit = st.windows.iter().find(|w| w.start <= off && end <= w.start + WINDOW_BYTES).map(|w| (w.start, w.rx.clone()));
            // Windows to start, to keep them in flight from the end of this read on.
            let mut starts = Vec::new();
            if hit.is_some() || sequential {
                let mut next = hit.as_ref().map_or(st.last_end, |(s, _)| s + WINDOW_BYTES);
                if let Some(last) = st.windows.last() {
                    next = next.max(last.start + WINDOW_BYTES);
                }
                while next < attr.size && next < reach {
                    starts.push(next);
                    next += WINDOW_BYTES;
                }
            }
            if !starts.is_empty() {
                make_room(files, &key, starts.len() as u64 * WINDOW_BYTES);
                let held: u64 = files.values().map(|f| f.windows.len() as u64 * WINDOW_BYTES).sum();
                let fit = (READAHEAD_BYTES_MAX.saturating_sub(held) / WINDOW_BYTES) as usize;
                let st = files.get_mut(&key).expect("made above, kept by make_room");
                for start in starts.into_iter().take(fit) {
                    self.windows_started.fetch_add(1, Ordering::Relaxed);
                    st.windows.push(Window { start, rx: spawn_fill(engine, caller, attr.ino, start, WINDOW_BYTES) });
                }
            }
            hit
        };
        let (start, mut rx) = rx?;
        let filled = rx.wait_for(|v| v.is_some()).await.ok()?.clone().flatten()?;
        ReadBytes::slice_of(&filled, (off - start) as usize, (end - start) as usize)
    }
}

/// Drops windows of other files, least recently read first, until `bytes` more fit in
/// [`READAHEAD_BYTES_MAX`] (or no other file holds any).
fn make_room(files: &mut HashMap<Key, FileState>, keep: &Key, bytes: u64) {
    loop {
        let held: u64 = files.values().map(|f| f.windows.len() as u64 * WINDOW_BYTES).sum();
        if held + bytes <= READAHEAD_BYTES_MAX {
            return;
        }
        let victim = files.iter_mut().filter(|(k, f)| *k != keep && !f.windows.is_empty()).min_by_key(|(_, f)| f.used);
        match victim {
            Some((_, f)) => f.windows.clear(),
            None => return,
        }
    }
}

fn spawn_fill(engine: &Arc<Engine>, caller: &Caller, ino: Ino, start: u64, len: u64) -> watch::Receiver<Filled> {
    let (tx, rx) = watch::channel(None);
    let (engine, caller) = (engine.clone(), caller.clone());
    tokio::task::spawn_blocking(move || {
        let data = engine.read_shared(&caller, ino, start, len as usize).ok().map(Arc::new);
        let _ = tx.send(Some(data));
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(used: u64, windows: usize) -> FileState {
        let windows = (0..windows as u64).map(|i| Window { start: i * WINDOW_BYTES, rx: watch::channel(None).1 }).collect();
        FileState { stamp: (0, 0, 0), last_end: 0, windows, used }
    }

    /// An engine on small file drives in `dir` holding one file of `size` patterned bytes:
    /// the engine, the file's attributes and its bytes.
    fn engine_with_file(dir: &std::path::Path, size: u64) -> (Arc<Engine>, Attr, Vec<u8>) {
        let mut cfg = storage_engine::EngineConfig::with_file_drives(dir, 6, 256 << 20, 4, 2);
        cfg.argon2_memory_kib = 64;
        cfg.admin_password = Some("admin-password".into());
        let engine = Engine::open(cfg).unwrap();
        let c = Caller::system();
        let data: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let f = engine.create(&c, storage_engine::ROOT_INO, b"big", 0o644, true).unwrap();
        engine.write(&c, f.ino, 0, &data, storage_engine::Stability::Durable).unwrap();
        let attr = engine.getattr(&c, f.ino).unwrap();
        (engine, attr, data)
    }

    /// Waits until the windows' reads still running (on the blocking pool, each holding the
    /// engine) are done, then drops the engine here: it closes before the test's directory
    /// is removed, not on a pool thread in the middle of the removal.
    async fn close(engine: Arc<Engine>) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while Arc::strong_count(&engine) > 1 {
            assert!(std::time::Instant::now() < deadline, "window reads still hold the engine after 30 s");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        engine.shutdown().unwrap();
    }

    /// READs in flight together reach the table in any order: one a READ ahead of the
    /// furthest end still counts as sequential and starts the windows, which then serve the
    /// READs after it, in any order, with the bytes the file holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_out_of_order_start_windows_that_serve_the_rest() {
        const MIB: u64 = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let (engine, attr, data) = engine_with_file(dir.path(), 40 * MIB);
        let c = Caller::system();
        let ra = Readahead::default();
        let read = |off: u64| {
            let (ra, engine, c, attr) = (&ra, &engine, &c, &attr);
            async move { ra.read(engine, c, attr, off, MIB as usize).await.map(|b| b.to_vec()) }
        };
        // A pass from the start, its second and third READs swapped.
        assert!(read(0).await.is_none(), "a first READ is read directly");
        assert!(read(2 * MIB).await.is_none(), "a READ ahead of the one in flight: windows start after it");
        assert!(read(MIB).await.is_none(), "behind the windows' start: read directly");
        for off in [4 * MIB, 3 * MIB, 5 * MIB, 20 * MIB] {
            let got = read(off).await.unwrap_or_else(|| panic!("READ at {} MiB not served from a window", off / MIB));
            assert!(got == data[off as usize..(off + MIB) as usize], "READ at {} MiB: other bytes", off / MIB);
        }
        drop(ra);
        close(engine).await;
    }

    /// A pipelined reader (8 READs in flight, arriving in any order among themselves) has
    /// each window read once: a READ that arrives behind the others keeps the windows the
    /// ones ahead of it started.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_in_flight_read_each_window_once() {
        const MIB: u64 = 1 << 20;
        let size = 160 * MIB;
        let dir = tempfile::tempdir().unwrap();
        let (engine, attr, data) = engine_with_file(dir.path(), size);
        let c = Caller::system();
        let ra = Readahead::default();
        // A client keeps 8 READs in flight and sends the next one as each is answered; of
        // those in flight, any may reach the table first (a fixed pseudo-random pick), but
        // none falls more than 12 MiB behind the newest.
        let (mut inflight, mut next, mut seed, mut served) = (Vec::new(), 0, 0x9e37_79b9_u64, 0);
        loop {
            while inflight.len() < 8 && next < size {
                inflight.push(next);
                next += MIB;
            }
            if inflight.is_empty() {
                break;
            }
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let oldest = (0..inflight.len()).min_by_key(|&i| inflight[i]).expect("not empty");
            let pick = if inflight[oldest] + 12 * MIB < next { oldest } else { (seed >> 33) as usize % inflight.len() };
            let off = inflight.swap_remove(pick);
            if let Some(b) = ra.read(&engine, &c, &attr, off, MIB as usize).await {
                assert!(b[..] == data[off as usize..(off + MIB) as usize], "READ at {} MiB: other bytes", off / MIB);
                served += 1;
            }
        }
        let started = ra.windows_started.load(Ordering::Relaxed);
        assert!(served >= size / MIB - 16, "only {served} READs served from windows");
        assert!(started <= size.div_ceil(WINDOW_BYTES) + 1, "{started} windows started for a {} MiB file", size / MIB);
        drop(ra);
        close(engine).await;
    }

    #[test]
    fn room_for_new_windows_comes_from_the_least_recently_read_other_files() {
        let per_budget = (READAHEAD_BYTES_MAX / WINDOW_BYTES) as usize;
        let key = |ino: Ino| -> Key { (ino, 0, 0, vec![]) };
        let mut files = HashMap::new();
        files.insert(key(1), file(1, per_budget / 2));
        files.insert(key(2), file(2, per_budget / 2));
        files.insert(key(3), file(3, 0));
        make_room(&mut files, &key(3), 2 * WINDOW_BYTES);
        assert!(files[&key(1)].windows.is_empty(), "the least recently read file gives its windows up");
        assert_eq!(files[&key(2)].windows.len(), per_budget / 2, "and only as many files as needed do");
        // The reader's own windows are never dropped for itself; with no other file holding
        // any, nothing more is freed and the caller starts fewer windows.
        files.insert(key(4), file(4, per_budget));
        files.get_mut(&key(2)).unwrap().windows.clear();
        make_room(&mut files, &key(4), WINDOW_BYTES);
        assert_eq!(files[&key(4)].windows.len(), per_budget);
    }
}
