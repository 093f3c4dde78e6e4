//! Background jobs: scrub (verify every shard, repair from parity) and rebuild (recreate a
//! replaced drive's shards). Both walk the stripe table in id order, are throttled, persist
//! their cursor so they resume after a restart, and report progress.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions};

use crate::data::DriveState;
use crate::engine::{CF_JOBS, CF_STRIPES, Engine};
use crate::error::{Error, Result};
use crate::records::{Dec, Enc, StripeRec, be64, read_be64};
use crate::types::{Caller, Role};

/// How often a running job writes its cursor.
const JOB_PERSIST_INTERVAL: Duration = Duration::from_secs(1);
/// Default throttle when the caller names none (0 = unlimited).
pub const JOB_BYTES_PER_SEC_DEFAULT: u64 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    Scrub,
    Rebuild { drive: u32 },
}

impl JobKind {
    pub fn name(&self) -> &'static str {
        match self {
            JobKind::Scrub => "scrub",
            JobKind::Rebuild { .. } => "rebuild",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Running,
    Completed,
    Failed(String),
    Cancelled,
}

impl JobState {
    pub fn as_str(&self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed(_) => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone)]
pub struct JobInfo {
    pub id: u64,
    pub kind: JobKind,
    pub state: JobState,
    pub started_ns: i64,
    pub finished_ns: i64,
    /// Stripes in the table when the job started (progress denominator).
    pub stripes_total: u64,
    pub stripes_done: u64,
    pub bytes_done: u64,
    /// Shards found missing, unreadable or corrupt.
    pub shards_bad: u64,
    /// Shards rewritten (scrub) or recreated (rebuild).
    pub shards_repaired: u64,
    /// Stripes with fewer than k good shards: data lost.
    pub stripes_unrecoverable: u64,
    /// Next stripe id to visit.
    pub cursor: u64,
    pub bytes_per_sec_max: u64,
}

impl JobInfo {
    pub fn progress(&self) -> f64 {
        if self.state == JobState::Completed {
            return 1.0;
        }
        if self.stripes_total == 0 { 0.0 } else { (self.stripes_done as f64 / self.stripes_total as f64).min(1.0) }
    }

    fn encode(&self) -> Vec<u8> {
        let mut e = Enc::new(1);
        match self.kind {
            JobKind::Scrub => e.u8(0).u32(0),
            JobKind::Rebuild { drive } => e.u8(1).u32(drive),
        };
        let (st, msg) = match &self.state {
            JobState::Running => (0, ""),
            JobState::Completed => (1, ""),
            JobState::Failed(m) => (2, m.as_str()),
            JobState::Cancelled => (3, ""),
        };
        e.u8(st).bytes(msg.as_bytes());
        e.u64(self.id).i64(self.started_ns).i64(self.finished_ns).u64(self.stripes_total).u64(self.stripes_done);
        e.u64(self.bytes_done).u64(self.shards_bad).u64(self.shards_repaired).u64(self.stripes_unrecoverable);
        e.u64(self.cursor).u64(self.bytes_per_sec_max);
        e.finish()
    }

    fn decode(b: &[u8]) -> Result<JobInfo> {
        let mut d = Dec::new(b, "job", 1)?;
        let kind = match (d.u8()?, d.u32()?) {
            (0, _) => JobKind::Scrub,
            (1, drive) => JobKind::Rebuild { drive },
            _ => return Err(Error::Corrupt("job: unknown kind".into())),
        };
        let st = d.u8()?;
        let msg = String::from_utf8_lossy(d.bytes()?).into_owned();
        let state = match st {
            0 => JobState::Running,
            1 => JobState::Completed,
            2 => JobState::Failed(msg),
            3 => JobState::Cancelled,
            _ => return Err(Error::Corrupt("job: unknown state".into())),
        };
        let j = JobInfo {
            kind,
            state,
            id: d.u64()?,
            started_ns: d.i64()?,
            finished_ns: d.i64()?,
            stripes_total: d.u64()?,
            stripes_done: d.u64()?,
            bytes_done: d.u64()?,
            shards_bad: d.u64()?,
            shards_repaired: d.u64()?,
            stripes_unrecoverable: d.u64()?,
            cursor: d.u64()?,
            bytes_per_sec_max: d.u64()?,
        };
        d.end()?;
        Ok(j)
    }
}

struct JobHandle {
    info: Mutex<JobInfo>,
    cancel: AtomicBool,
}

#[derive(Default)]
pub(crate) struct Jobs {
    running: Mutex<BTreeMap<u64, Arc<JobHandle>>>,
    next_id: AtomicU64,
    stopping: AtomicBool,
}

impl Jobs {
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::Release);
        for h in self.running.lock().values() {
            h.cancel.store(true, Ordering::Release);
        }
        // Wait briefly for the workers to persist their cursors.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.running.lock().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn persist(engine: &Engine, info: &JobInfo) -> Result<()> {
    let mut wo = WriteOptions::default();
    wo.set_sync(true);
    let mut b = WriteBatch::default();
    b.put_cf(engine.cf(CF_JOBS), be64(info.id), info.encode());
    engine.db.write_opt(b, &wo)?;
    Ok(())
}

/// Starts a job. Only one job of each kind (per drive, for rebuild) runs at a time.
pub(crate) fn start(engine: &Arc<Engine>, caller: &Caller, kind: JobKind) -> Result<u64> {
    start_with(engine, caller, kind, JOB_BYTES_PER_SEC_DEFAULT)
}

pub(crate) fn start_with(engine: &Arc<Engine>, caller: &Caller, kind: JobKind, bytes_per_sec_max: u64) -> Result<u64> {
    if caller.role < Role::Operator {
        return Err(Error::PermissionDenied);
    }
    if let JobKind::Rebuild { drive } = kind {
        if drive as usize >= engine.data.drives.read().len() {
            return Err(Error::NotFound);
        }
    }
    for h in engine.jobs.running.lock().values() {
        if h.info.lock().kind == kind {
            return Err(Error::Busy(format!("a {} job is already running", kind.name())));
        }
    }
    let id = next_job_id(engine)?;
    let total = engine.db.iterator_cf(engine.cf(CF_STRIPES), IteratorMode::Start).count() as u64;
    let info = JobInfo {
        id,
        kind,
        state: JobState::Running,
        started_ns: engine.now(),
        finished_ns: 0,
        stripes_total: total,
        stripes_done: 0,
        bytes_done: 0,
        shards_bad: 0,
        shards_repaired: 0,
        stripes_unrecoverable: 0,
        cursor: 0,
        bytes_per_sec_max,
    };
    persist(engine, &info)?;
    spawn(engine, info);
    Ok(id)
}

fn next_job_id(engine: &Engine) -> Result<u64> {
    let mut it = engine.db.raw_iterator_cf(engine.cf(CF_JOBS));
    it.seek_to_last();
    let last = if it.valid() { read_be64(it.key().unwrap_or_default())? } else { 0 };
    let n = engine.jobs.next_id.fetch_max(last + 1, Ordering::AcqRel).max(last + 1);
    engine.jobs.next_id.store(n + 1, Ordering::Release);
    Ok(n)
}

/// Restarts jobs that were running when the daemon stopped.
pub(crate) fn resume(engine: &Arc<Engine>) -> Result<()> {
    let mut todo = Vec::new();
    for kv in engine.db.iterator_cf(engine.cf(CF_JOBS), IteratorMode::Start) {
        let (_, v) = kv?;
        let info = JobInfo::decode(&v)?;
        if info.state == JobState::Running {
            todo.push(info);
        }
    }
    for info in todo {
        tracing::info!(job = info.id, kind = info.kind.name(), cursor = info.cursor, "resuming job");
        spawn(engine, info);
    }
    Ok(())
}

fn spawn(engine: &Arc<Engine>, info: JobInfo) {
    let id = info.id;
    let handle = Arc::new(JobHandle { info: Mutex::new(info), cancel: AtomicBool::new(false) });
    engine.jobs.running.lock().insert(id, handle.clone());
    let weak = Arc::downgrade(engine);
    std::thread::Builder::new()
        .name(format!("aquifer-job-{id}"))
        .spawn(move || {
            let Some(engine) = weak.upgrade() else { return };
            let result = run(&engine, &handle);
            let mut info = handle.info.lock().clone();
            match result {
                Ok(true) => info.state = JobState::Completed,
                Ok(false) => {
                    if engine.jobs.stopping.load(Ordering::Acquire) {
                        // Daemon shutdown: stays Running in the table and resumes at start.
                    } else {
                        info.state = JobState::Cancelled;
                    }
                }
                Err(e) => info.state = JobState::Failed(e.to_string()),
            }
            if info.state != JobState::Running {
                info.finished_ns = engine.now();
            }
            if let JobKind::Rebuild { drive } = info.kind {
                if info.state == JobState::Completed && info.stripes_unrecoverable == 0 {
                    let mut drives = engine.data.drives.write();
                    if let Some(d) = drives.get_mut(drive as usize) {
                        if d.state == DriveState::Rebuilding {
                            d.state = DriveState::Online;
                        }
                    }
                }
            }
            if let Err(e) = persist(&engine, &info) {
                tracing::error!(job = info.id, "persist job: {e}");
            }
            *handle.info.lock() = info.clone();
            tracing::info!(job = info.id, kind = info.kind.name(), state = info.state.as_str(), repaired = info.shards_repaired, bad = info.shards_bad, "job finished");
            engine.jobs.running.lock().remove(&info.id);
        })
        .expect("spawn job thread");
}

/// Returns Ok(true) when the whole table was visited, Ok(false) when cancelled.
fn run(engine: &Arc<Engine>, h: &JobHandle) -> Result<bool> {
    let (kind, rate) = {
        let i = h.info.lock();
        (i.kind, i.bytes_per_sec_max)
    };
    let started = Instant::now();
    let mut bytes_since_start = 0u64;
    let mut last_persist = Instant::now();
    loop {
        if h.cancel.load(Ordering::Acquire) {
            persist(engine, &h.info.lock())?;
            return Ok(false);
        }
        let cursor = h.info.lock().cursor;
        let mut it = engine.db.iterator_cf(engine.cf(CF_STRIPES), IteratorMode::From(&be64(cursor), Direction::Forward));
        let Some(kv) = it.next() else { break };
        let (k, v) = kv?;
        let id = read_be64(&k)?;
        let rec = StripeRec::decode(&v)?;
        let bytes = rec.shard_bytes as u64 * rec.shards() as u64;
        let outcome = match kind {
            JobKind::Scrub => scrub_one(engine, id, &rec),
            JobKind::Rebuild { drive } => rebuild_one(engine, id, &rec, drive),
        }?;
        {
            let mut i = h.info.lock();
            i.cursor = id + 1;
            i.stripes_done += 1;
            i.bytes_done += bytes;
            i.shards_bad += outcome.bad;
            i.shards_repaired += outcome.repaired;
            i.stripes_unrecoverable += outcome.unrecoverable as u64;
            i.stripes_total = i.stripes_total.max(i.stripes_done);
        }
        if last_persist.elapsed() >= JOB_PERSIST_INTERVAL {
            persist(engine, &h.info.lock())?;
            last_persist = Instant::now();
        }
        bytes_since_start += bytes;
        if rate > 0 {
            let due = Duration::from_secs_f64(bytes_since_start as f64 / rate as f64);
            let el = started.elapsed();
            if due > el {
                std::thread::sleep((due - el).min(Duration::from_secs(1)));
            }
        }
    }
    Ok(true)
}

#[derive(Default)]
struct Outcome {
    bad: u64,
    repaired: u64,
    unrecoverable: bool,
}

/// Re-reads one stripe under the mutation lock; None when it changed or vanished (then the
/// visit is skipped: the new stripe was written healthy).
fn still_same(engine: &Engine, id: u64, rec: &StripeRec) -> Result<bool> {
    Ok(engine.db.get_cf(engine.cf(CF_STRIPES), be64(id))?.is_some_and(|v| StripeRec::decode(&v).is_ok_and(|r| r.placements == rec.placements)))
}

fn scrub_one(engine: &Engine, id: u64, rec: &StripeRec) -> Result<Outcome> {
    let mut out = Outcome::default();
    let mut shards = engine.data.read_shards(rec);
    let bad: Vec<usize> = (0..rec.shards())
        .filter(|&i| shards[i].is_none() && engine.data.placement_valid(&rec.placements[i]))
        .collect();
    let missing = shards.iter().filter(|s| s.is_none()).count();
    if missing == 0 {
        return Ok(out);
    }
    out.bad = bad.len() as u64;
    if rec.shards() - missing < rec.k as usize {
        tracing::error!(stripe = id, "stripe has fewer than k good shards");
        out.unrecoverable = true;
        return Ok(out);
    }
    let pool = &engine.data.pools[rec.pool as usize];
    pool.codec.reconstruct(&mut shards).map_err(|e| Error::Io(format!("reconstruct stripe {id}: {e}")))?;
    // Rewrite in place under the mutation lock: while the stripe record exists its blocks
    // cannot be freed and reused by another writer.
    let _g = engine.mutate.lock();
    if !still_same(engine, id, rec)? {
        return Ok(out);
    }
    for i in bad {
        let shard = shards[i].as_ref().expect("reconstructed");
        engine.data.rewrite_shard(rec, i, shard)?;
        out.repaired += 1;
    }
    Ok(out)
}

fn rebuild_one(engine: &Engine, id: u64, rec: &StripeRec, drive: u32) -> Result<Outcome> {
    let mut out = Outcome::default();
    let epoch = engine.data.drives.read()[drive as usize].epoch;
    let targets: Vec<usize> = (0..rec.shards()).filter(|&i| rec.placements[i].drive == drive && rec.placements[i].epoch != epoch).collect();
    if targets.is_empty() {
        return Ok(out);
    }
    out.bad = targets.len() as u64;
    let mut shards = engine.data.read_shards(rec);
    if shards.iter().filter(|s| s.is_some()).count() < rec.k as usize {
        tracing::error!(stripe = id, "cannot rebuild: fewer than k good shards");
        out.unrecoverable = true;
        return Ok(out);
    }
    for &i in &targets {
        shards[i] = None;
    }
    let pool = &engine.data.pools[rec.pool as usize];
    pool.codec.reconstruct(&mut shards).map_err(|e| Error::Io(format!("reconstruct stripe {id}: {e}")))?;
    let mut placed = Vec::new();
    for &i in &targets {
        match engine.data.place_shard(rec, drive, shards[i].as_ref().expect("reconstructed")) {
            Ok(p) => placed.push((i, p)),
            Err(e) => {
                for (_, p) in &placed {
                    engine.data.unplace(p, rec.shard_bytes as u64);
                }
                return Err(e);
            }
        }
    }
    engine.data.sync_drive(drive)?;
    let _g = engine.mutate.lock();
    let current = engine.db.get_cf(engine.cf(CF_STRIPES), be64(id))?.map(|v| StripeRec::decode(&v)).transpose()?;
    match current {
        Some(mut cur) if cur.placements == rec.placements => {
            for (i, p) in &placed {
                cur.placements[*i] = *p;
            }
            let mut wo = WriteOptions::default();
            wo.set_sync(true);
            let mut b = WriteBatch::default();
            b.put_cf(engine.cf(CF_STRIPES), be64(id), cur.encode());
            engine.db.write_opt(b, &wo)?;
            out.repaired = placed.len() as u64;
        }
        _ => {
            // Freed or rewritten meanwhile: the new placements are garbage.
            for (_, p) in &placed {
                engine.data.unplace(p, rec.shard_bytes as u64);
            }
        }
    }
    Ok(out)
}

impl Engine {
    /// Starts a scrub of every stripe; `bytes_per_sec_max` 0 = unthrottled.
    pub fn start_scrub(self: &Arc<Self>, caller: &Caller, bytes_per_sec_max: u64) -> Result<u64> {
        start_with(self, caller, JobKind::Scrub, bytes_per_sec_max)
    }

    /// Starts a rebuild onto drive `index` (normally started by `replace_drive`).
    pub fn start_rebuild(self: &Arc<Self>, caller: &Caller, index: u32, bytes_per_sec_max: u64) -> Result<u64> {
        start_with(self, caller, JobKind::Rebuild { drive: index }, bytes_per_sec_max)
    }

    pub fn job(&self, id: u64) -> Result<JobInfo> {
        if let Some(h) = self.jobs.running.lock().get(&id) {
            return Ok(h.info.lock().clone());
        }
        match self.db.get_cf(self.cf(CF_JOBS), be64(id))? {
            Some(v) => JobInfo::decode(&v),
            None => Err(Error::NotFound),
        }
    }

    /// Every job, newest first.
    pub fn list_jobs(&self) -> Result<Vec<JobInfo>> {
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_JOBS), IteratorMode::End) {
            let (k, _) = kv?;
            out.push(self.job(read_be64(&k)?)?);
        }
        Ok(out)
    }

    pub fn cancel_job(&self, caller: &Caller, id: u64) -> Result<()> {
        if caller.role < Role::Operator {
            return Err(Error::PermissionDenied);
        }
        let running = self.jobs.running.lock().get(&id).cloned();
        match running {
            Some(h) => {
                h.cancel.store(true, Ordering::Release);
                Ok(())
            }
            None => {
                self.job(id)?;
                Err(Error::InvalidArgument(format!("job {id} is not running")))
            }
        }
    }
}
