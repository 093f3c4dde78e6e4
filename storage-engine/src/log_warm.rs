//! Keeps the next blocks of the metadata log in the page cache.
//!
//! With logs kept for reuse (`EngineConfig::log_reuse_bytes`), RocksDB writes its log over a
//! file that an earlier log filled. A write that covers part of a page of a file whose page
//! is not cached makes the kernel read that page from the disk first, inside the `write`.
//! The logs are written out when the engine opens (`Engine::prepare_log`), so they start
//! cached; but once memory pressure (or `drop_caches`) has taken their pages, every log
//! write waited for a disk read: measured over NFS after `drop_caches`, the COMMIT of a
//! 4 KiB file took 286–295 µs (median of two loops) without this thread and 204–209 µs with
//! it, on a VM whose 4 KiB write + fdatasync takes about 220 µs (docs/benchmarks.md).
//!
//! A thread of the engine asks the kernel to read ahead [`WINDOW_BYTES`] of the log being
//! written from where RocksDB writes next (the offset of RocksDB's descriptor, from
//! `/proc/self/fdinfo`), every [`TICK`] in which that offset moved, and the first
//! [`WINDOW_BYTES`] of the other logs, which are the ones written over next. The reads are
//! the kernel's readahead, off the writers' path; pages already cached cost a lookup.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hardware::pagecache::WriterOffset;
use parking_lot::{Condvar, Mutex};

/// Bytes read ahead of the log's write offset, and at the start of each log written over
/// next: at one look every [`TICK`], enough for 320 MB/s of log.
pub(crate) const WINDOW_BYTES: u64 = 16 << 20;
/// How often the thread looks. Each look costs a wake-up and one read of fdinfo: an idle
/// daemon's thread used 0.3–0.5 % of a core on the development VM (`schedstat`).
const TICK: Duration = Duration::from_millis(50);
/// How often the directory is listed for a new log (and whenever RocksDB's descriptor of
/// the newest log is gone).
const LIST_EVERY: Duration = Duration::from_secs(1);
/// How often the window and the other logs' starts are asked for although nothing moved.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How often, at most, `/proc/self/fd` is searched for RocksDB's descriptor of the log when
/// it was not found (it is found once per log otherwise).
const SEARCH_EVERY: Duration = Duration::from_secs(1);

/// The read-ahead thread; stopped (and joined) by [`LogWarmer::stop`] or when dropped.
pub(crate) struct LogWarmer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LogWarmer {
    pub(crate) fn start(meta_dir: &Path) -> std::io::Result<LogWarmer> {
        let mut logs = Logs::new(meta_dir.to_path_buf());
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("aquifer-logwarm".into()).spawn(move || {
            loop {
                logs.look();
                let mut stopped = flag.0.lock();
                if !*stopped {
                    flag.1.wait_for(&mut stopped, TICK);
                }
                if *stopped {
                    return;
                }
            }
        })?;
        Ok(LogWarmer { stop, thread: Some(thread) })
    }

    pub(crate) fn stop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

impl Drop for LogWarmer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// RocksDB's log files in `dir` by number, oldest first (`NNNNNN.log`).
fn log_numbers(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".log")?.parse().ok()).collect())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

fn log_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("{number:06}.log"))
}

struct Logs {
    dir: PathBuf,
    /// The logs by number, oldest first, opened for reading (only advice is given on them).
    open: Vec<(u64, File)>,
    /// RocksDB's descriptor of the newest log, once found.
    writer: Option<WriterOffset>,
    /// The write offset at the last look.
    last_offset: Option<u64>,
    listed: Option<Instant>,
    searched: Option<Instant>,
    renewed: Option<Instant>,
}

/// Whether `t` is unset or at least `every` ago.
fn due(t: Option<Instant>, every: Duration) -> bool {
    t.is_none_or(|t| t.elapsed() >= every)
}

impl Logs {
    fn new(dir: PathBuf) -> Logs {
        Logs { dir, open: Vec::new(), writer: None, last_offset: None, listed: None, searched: None, renewed: None }
    }

    /// One look, cheap when nothing was written: the write offset is read every time (one
    /// read of fdinfo) and the window asked for when it moved; the directory is listed every
    /// [`LIST_EVERY`]; the window and the other logs' starts are asked for again every
    /// [`RENEW_EVERY`] (their pages may have been dropped since).
    fn look(&mut self) {
        let mut offset = self.writer.as_ref().and_then(WriterOffset::offset);
        let lost = self.writer.is_some() && offset.is_none();
        if lost {
            self.writer = None;
        }
        if lost || due(self.listed, LIST_EVERY) {
            self.listed = Some(Instant::now());
            let numbers = log_numbers(&self.dir);
            if !numbers.iter().eq(self.open.iter().map(|(n, _)| n)) {
                self.open = numbers.iter().filter_map(|&n| File::open(log_path(&self.dir, n)).ok().map(|f| (n, f))).collect();
                (self.writer, offset, self.last_offset, self.searched, self.renewed) = (None, None, None, None, None);
            }
        }
        let Some(((_, file), older)) = self.open.split_last() else { return };
        if self.writer.is_none() && due(self.searched, SEARCH_EVERY) {
            self.searched = Some(Instant::now());
            self.writer = WriterOffset::find(file);
            offset = self.writer.as_ref().and_then(WriterOffset::offset);
        }
        let renew = due(self.renewed, RENEW_EVERY);
        if let Some(at) = offset
            && (renew || self.last_offset != offset)
        {
            let _ = hardware::pagecache::will_need(file, at, WINDOW_BYTES);
        }
        self.last_offset = offset;
        if renew {
            self.renewed = Some(Instant::now());
            for (_, f) in older {
                let _ = hardware::pagecache::will_need(f, 0, WINDOW_BYTES);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Caller, Engine, EngineConfig, ROOT_INO};
    use hardware::pagecache::{dont_need, is_cached};

    const PAGE: u64 = 4096;

    /// Where RocksDB writes next in the log it is writing (the newest): its path and offset.
    fn write_offset(dir: &Path) -> Option<(PathBuf, u64)> {
        let path = log_path(dir, *log_numbers(dir).last()?);
        let at = WriterOffset::find(&File::open(&path).ok()?)?.offset()?;
        Some((path, at))
    }

    fn cached_within(f: &File, offset: u64, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            if is_cached(f, offset).unwrap() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The engine reads ahead of its log when logs are kept for reuse: pages ahead of the
    /// write offset, and at the start of the other logs, come back into the page cache
    /// after they were dropped, and stay out without the read-ahead.
    #[test]
    fn the_logs_next_pages_come_back_after_they_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = EngineConfig::with_file_drives(dir.path(), 6, 32 << 20, 4, 2);
        cfg.argon2_memory_kib = 64;
        cfg.admin_password = Some("admin-password".into());
        cfg.log_reuse_bytes = 8 << 20;
        let e = Engine::open(cfg).unwrap();
        for i in 0..20 {
            e.mkdir(&Caller::system(), ROOT_INO, format!("d{i}").as_bytes(), 0o755).unwrap();
        }
        e.sync_metadata().unwrap();
        let meta = dir.path().join("meta");
        let (path, at) = write_offset(&meta).expect("RocksDB's descriptor of its log");
        let log = File::open(&path).unwrap();
        // 64 KiB past the write offset, inside the log written over (8 MiB of filler).
        let probe = (at / PAGE + 16) * PAGE;
        assert!(log.metadata().unwrap().len() > probe + PAGE, "the log written is one kept for reuse ({} bytes, offset {at})", log.metadata().unwrap().len());
        let older: Vec<File> = log_numbers(&meta).iter().map(|&n| log_path(&meta, n)).filter(|p| *p != path).map(|p| File::open(p).unwrap()).collect();
        assert!(!older.is_empty(), "a log set aside for reuse");

        assert!(e.log_warmer.lock().is_some(), "the engine reads ahead of its log");
        e.log_warmer.lock().take().unwrap().stop();
        for f in older.iter().chain([&log]) {
            dont_need(f, 0, 0).unwrap();
        }
        if cached_within(&log, probe, Duration::ZERO) {
            eprintln!("this filesystem keeps pages that are asked to be dropped; nothing to observe");
            return;
        }
        assert!(!cached_within(&log, probe, Duration::from_millis(300)), "nothing reads the log without the read-ahead");

        let mut w = LogWarmer::start(&meta).unwrap();
        assert!(cached_within(&log, probe, Duration::from_secs(10)), "the page ahead of the write offset came back");
        assert!(cached_within(&log, (at / PAGE * PAGE + WINDOW_BYTES - PAGE).min(log.metadata().unwrap().len() - 1), Duration::from_secs(10)), "the window's last page came back");
        for f in &older {
            assert!(cached_within(f, 64 << 10, Duration::from_secs(10)), "the start of a log written over next came back");
        }
        w.stop();
        e.shutdown().unwrap();
    }
}
