//! The engine: opens metadata and drives, and implements the namespace API of DESIGN.md §3.1.
//!
//! Every metadata mutation is a [`Command`] carrying everything nondeterministic (inode
//! numbers, timestamps, the caller, stripe records) and applied under one mutation lock to the
//! RocksDB state machine as exactly one write batch. A cluster replicates the same commands.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hardware::{AlignedBuf, BlockDevice, DriveOpenOptions};
use parking_lot::Mutex;
use rocksdb::{ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};

use crate::data::{DataStore, DriveInfo, DriveSlot, DriveState, Pool, ReadBytes, ReadPiece, Superblock};
use crate::ec::Codec;
use crate::error::{Error, NameProblem, Result};
use crate::records::*;
use crate::types::*;
use crate::remote::Mutation;
use crate::writebuf::{FileBuf, Segment, WriteBuffer};

pub(crate) const CF_INODES: &str = "inodes";
pub(crate) const CF_DENTRIES: &str = "dentries";
pub(crate) const CF_EXTENTS: &str = "extents";
pub(crate) const CF_STRIPES: &str = "stripes";
pub(crate) const CF_INLINE: &str = "inline";
pub(crate) const CF_XATTRS: &str = "xattrs";
pub(crate) const CF_IDENTITY: &str = "identity";
pub(crate) const CF_SYSTEM: &str = "system";
pub(crate) const CF_ORPHANS: &str = "orphans";
pub(crate) const CF_UPLOADS: &str = "uploads";
pub(crate) const CF_JOBS: &str = "jobs";
pub(crate) const CF_AUDIT: &str = "audit";
pub(crate) const CF_REMOTE: &str = "remote";
pub(crate) const CF_VERSIONS: &str = "versions";
const ALL_CFS: &[&str] = &[
    CF_INODES, CF_DENTRIES, CF_EXTENTS, CF_STRIPES, CF_INLINE, CF_XATTRS, CF_IDENTITY,
    CF_SYSTEM, CF_ORPHANS, CF_UPLOADS, CF_JOBS, CF_AUDIT, CF_REMOTE, CF_VERSIONS,
];

/// Stripes of one flush whose shard writes may be outstanding together.
const STRIPES_IN_FLIGHT_MAX: usize = 4;
/// Metadata logs kept for reuse (`EngineConfig::log_reuse_bytes`).
const LOGS_KEPT_FOR_REUSE: usize = 2;
/// A good `EngineConfig::log_reuse_bytes` for a long-running engine (the daemon's default):
/// about one memtable's worth of log, which is how much a log holds before the next starts.
pub const LOG_REUSE_BYTES_DEFAULT: u64 = 64 << 20;

const KEY_CLUSTER: &[u8] = b"cluster";
/// A key written and deleted at once by `Engine::prepare_log`, never read.
const KEY_LOG_SWITCH: &[u8] = b"log-switch";
const KEY_NEXT_INO: &[u8] = b"next_ino";
const KEY_FILES: &[u8] = b"files";
const KEY_POOL_PREFIX: &str = "pool/";
const KEY_DRIVE_PREFIX: &str = "drive/";

/// The clock the engine reads; injected so tests are deterministic.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> i64;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0)
    }
}

/// A drive named in the configuration.
#[derive(Debug, Clone)]
pub struct DriveConfig {
    pub path: PathBuf,
    /// For file drives: create the file with this size at format time when it is missing.
    pub create_bytes: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub data_shards: usize,
    pub parity_shards: usize,
    /// Indexes into `EngineConfig::drives`.
    pub drives: Vec<u32>,
}

/// Wraps each opened drive, e.g. with a fault injector in tests.
pub type DriveWrapper = Arc<dyn Fn(u32, Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> + Send + Sync>;

#[derive(Clone)]
pub struct EngineConfig {
    /// Metadata lives in `data_dir/meta`.
    pub data_dir: PathBuf,
    pub drives: Vec<DriveConfig>,
    /// Used only when the node is formatted; afterwards the stored pool table rules.
    pub pools: Vec<PoolConfig>,
    /// Files up to this size are stored inside metadata.
    pub inline_bytes_max: u64,
    /// Largest shard of a stripe; a stripe holds at most k × this many bytes.
    pub shard_bytes_max: u32,
    /// Buffered bytes per file above which full stripes are written out.
    pub write_buffer_bytes_max: usize,
    /// Threads that write full stripes out of write buffers in the background, so a writer
    /// goes on while its earlier bytes are encoded and written (a writer waits only when its
    /// file has twice `write_buffer_bytes_max` buffered). 0: the writer that fills the buffer
    /// writes the stripes itself.
    pub write_flush_threads: usize,
    /// How often unsynced metadata is made durable.
    pub wal_sync_interval_ms: u64,
    /// Bytes of verified stripe data kept in memory for reads (see `cache.rs`); 0: none,
    /// every read goes to the drives.
    pub data_cache_bytes: usize,
    pub drive_open: DriveOpenOptions,
    pub drive_wrapper: Option<DriveWrapper>,
    pub clock: Arc<dyn Clock>,
    /// Password of the `admin` user created when the node is formatted.
    pub admin_password: Option<String>,
    /// Cost of argon2 hashing; tests lower it.
    pub argon2_memory_kib: u32,
    /// Bytes of metadata log written and set aside for reuse when the engine opens (see
    /// `Engine::prepare_log`), so that the log's syncs overwrite blocks the filesystem has
    /// already allocated; 0: none, the first log of the run grows as it is written.
    pub log_reuse_bytes: u64,
}

impl EngineConfig {
    /// `count` file drives of `drive_bytes` each in `data_dir/drives`, one pool k+m.
    pub fn with_file_drives(data_dir: &Path, count: usize, drive_bytes: u64, k: usize, m: usize) -> EngineConfig {
        let drives = (0..count)
            .map(|i| DriveConfig {
                path: data_dir.join("drives").join(format!("drive-{i}.img")),
                create_bytes: Some(drive_bytes),
            })
            .collect();
        EngineConfig {
            data_dir: data_dir.to_path_buf(),
            drives,
            pools: vec![PoolConfig {
                name: "default".into(),
                data_shards: k,
                parity_shards: m,
                drives: (0..count as u32).collect(),
            }],
            inline_bytes_max: 64 * 1024,
            shard_bytes_max: 1 << 20,
            write_buffer_bytes_max: 16 << 20,
            write_flush_threads: 2,
            wal_sync_interval_ms: 1000,
            data_cache_bytes: crate::cache::default_bytes(),
            drive_open: DriveOpenOptions::default(),
            drive_wrapper: None,
            clock: Arc::new(SystemClock),
            admin_password: None,
            argon2_memory_kib: 19 * 1024,
            log_reuse_bytes: 0,
        }
    }
}

/// Health of the node as a whole.
#[derive(Debug, Clone)]
pub struct Health {
    /// "ok", "degraded" (redundancy reduced) or "failed" (data unavailable).
    pub state: &'static str,
    pub drives: Vec<DriveInfo>,
    pub notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct PoolInfo {
    pub name: String,
    pub data_shards: usize,
    pub parity_shards: usize,
    pub drives: Vec<u32>,
    pub raw_capacity_bytes: u64,
    pub raw_used_bytes: u64,
}

/// What a namespace mutation does, with every nondeterministic input resolved.
#[derive(Debug, Clone)]
pub(crate) enum Command {
    Create {
        caller: Caller,
        parent: Ino,
        name: Vec<u8>,
        kind: FileKind,
        mode: u32,
        ino: Ino,
        generation: u64,
        now: i64,
        target: Vec<u8>,
        /// Device number for character and block devices.
        rdev: u64,
        /// Fail with Exists when the name exists; else return the existing file.
        exclusive: bool,
        /// Create without a directory entry (put-whole and multipart staging).
        orphan: bool,
    },
    /// A new name for `ino`; with `replace`, in place of a file already named so (atomically).
    Link { caller: Caller, ino: Ino, parent: Ino, name: Vec<u8>, replace: bool, now: i64 },
    Unlink { caller: Caller, parent: Ino, name: Vec<u8>, dir: bool, now: i64 },
    Rename {
        caller: Caller,
        from_parent: Ino,
        from_name: Vec<u8>,
        to_parent: Ino,
        to_name: Vec<u8>,
        now: i64,
    },
    /// Link an orphan in place of whatever `name` is (atomic replace), then clear its orphan
    /// mark.
    Publish { caller: Caller, ino: Ino, parent: Ino, name: Vec<u8>, now: i64 },
    /// A new file with inline content and extended attributes, linked in place of whatever
    /// `name` is (atomic replace): a whole small upload as one command.
    PutInline { caller: Caller, parent: Ino, name: Vec<u8>, mode: u32, ino: Ino, generation: u64, data: Vec<u8>, xattrs: Vec<(Vec<u8>, Vec<u8>)>, now: i64 },
    /// With `owner_override`, the file's owner may change its size whatever its mode
    /// ([`Engine::setattr_as_owner`]).
    SetAttr { caller: Caller, ino: Ino, set: SetAttr, now: i64, owner_override: bool },
    WriteExtents {
        ino: Ino,
        /// New extents: (file offset, stripe id, stripe record with refs 0). Non-overlapping.
        extents: Vec<(u64, u64, StripeRec)>,
        /// Replaces inline data; the file becomes extent-stored when `extents` is non-empty.
        inline: Option<Vec<u8>>,
        size_at_least: u64,
        now: i64,
    },
    /// Append the extents of `parts` (orphans) to `ino` in order, then delete the parts.
    Concat { ino: Ino, parts: Vec<Ino>, now: i64 },
    /// Removes `remove`, then sets `set`: one change. A name in `remove` the inode lacks is
    /// passed over, or with `must_exist` refused as not found.
    SetXattrs { caller: Caller, ino: Ino, remove: Vec<Vec<u8>>, must_exist: bool, set: Vec<(Vec<u8>, Vec<u8>)>, now: i64 },
    DeleteOrphan { ino: Ino },
    /// Versioned-bucket changes (versions.rs).
    Version(crate::versions::VersionCmd),
}

pub(crate) struct Applied {
    pub attr: Option<Attr>,
    pub events: Vec<ChangeEvent>,
}

pub struct Engine {
    /// Shared with the log-sync thread, which holds these two and never the engine, so that
    /// the engine's last reference (and RocksDB's close) is always dropped by a caller.
    pub(crate) db: Arc<DB>,
    pub(crate) data: Arc<DataStore>,
    pub(crate) cfg: EngineConfig,
    pub(crate) mutate: Mutex<()>,
    next_ino: AtomicU64,
    next_stripe: AtomicU64,
    files: AtomicU64,
    buffers: Mutex<HashMap<Ino, Arc<FileBuf>>>,
    /// Files whose buffers the flush threads should write out.
    flush_tx: std::sync::mpsc::Sender<Ino>,
    flush_rx: Mutex<Option<std::sync::mpsc::Receiver<Ino>>>,
    flush_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    events: tokio::sync::broadcast::Sender<ChangeEvent>,
    pub(crate) jobs: crate::jobs::Jobs,
    pub(crate) auth_cache: Mutex<HashMap<(String, [u8; 32]), (Caller, std::time::Instant)>>,
    pub(crate) closed: AtomicBool,
    sync_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Reads the metadata log's next blocks into the page cache (logs kept for reuse only).
    pub(crate) log_warmer: Mutex<Option<crate::log_warm::LogWarmer>>,
    /// Metadata log syncs, shared by concurrent durable operations.
    wal_sync: Arc<crate::group_sync::GroupSync>,
    pub(crate) cluster_uuid: [u8; 16],
    pub(crate) audit_seq: AtomicU64,
    pub(crate) remote: parking_lot::RwLock<Option<Arc<dyn crate::remote::RemoteSource>>>,
    pub(crate) has_stubs: AtomicBool,
}

pub(crate) fn validate_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidName(NameProblem::Empty));
    }
    if name == b"." || name == b".." {
        return Err(Error::InvalidName(NameProblem::Dot));
    }
    if name.contains(&b'/') {
        return Err(Error::InvalidName(NameProblem::Slash));
    }
    if name.contains(&0) {
        return Err(Error::InvalidName(NameProblem::Nul));
    }
    if name.len() > NAME_BYTES_MAX {
        return Err(Error::InvalidName(NameProblem::TooLong));
    }
    Ok(())
}

impl Engine {
    /// Mutations the fabric cannot forward are refused on mirror inodes (unless it says
    /// otherwise).
    pub(crate) fn remote_refuse(&self, caller: &Caller, ino: Ino, what: &'static str) -> Result<()> {
        self.remote_mutation(&[ino], Mutation::Other { caller, ino, what }).map(|_| ())
    }
}

/// An extended attribute's name (1-255 bytes, no NUL) and value (at most 64 KiB).
fn validate_xattr(name: &[u8], value: Option<&[u8]>) -> Result<()> {
    if name.is_empty() || name.len() > XATTR_NAME_BYTES_MAX || name.contains(&0) {
        return Err(Error::InvalidArgument("extended attribute name must be 1-255 bytes without NUL".into()));
    }
    if value.is_some_and(|v| v.len() > XATTR_VALUE_BYTES_MAX) {
        return Err(Error::InvalidArgument("extended attribute value over 64 KiB".into()));
    }
    Ok(())
}

/// The record of a new inode created by `caller` in `dir`: mode bits and group as POSIX
/// gives them (set-group-id directories pass their group on).
#[allow(clippy::too_many_arguments)]
fn new_inode(caller: &Caller, dir: &InodeRec, kind: FileKind, mode: u32, generation: u64, now: i64, parent: Ino, target: &[u8], rdev: u64) -> InodeRec {
    let mut m = mode & 0o7777;
    let gid = if dir.mode & 0o2000 != 0 { dir.gid } else { caller.gid };
    if kind == FileKind::Dir && dir.mode & 0o2000 != 0 {
        m |= 0o2000;
    }
    if kind == FileKind::File && caller.uid != 0 && !caller.in_group(gid) {
        m &= !0o2000;
    }
    InodeRec {
        kind,
        mode: if kind == FileKind::Symlink { 0o777 } else { m },
        uid: caller.uid,
        gid,
        nlink: if kind == FileKind::Dir { 2 } else { 1 },
        size: if kind == FileKind::Symlink { target.len() as u64 } else { 0 },
        atime_ns: now,
        mtime_ns: now,
        ctime_ns: now,
        btime_ns: now,
        version: 1,
        generation,
        storage: Storage::Inline,
        parent: if kind == FileKind::Dir { parent } else { 0 },
        target: target.to_vec(),
        stored_bytes: 0,
        rdev,
    }
}

/// `trusted.*` extended attributes (residency labels among them) are set by admins only.
fn check_reserved_xattr(caller: &Caller, name: &[u8]) -> Result<()> {
    if name.starts_with(b"trusted.") && caller.uid != 0 && caller.role < Role::Admin {
        return Err(Error::PermissionDenied);
    }
    Ok(())
}

const R: u32 = 4;
pub(crate) const W: u32 = 2;
pub(crate) const X: u32 = 1;

fn may(caller: &Caller, rec: &InodeRec, mask: u32) -> bool {
    if caller.uid == 0 {
        // Root reads and writes anything, and executes what anybody may execute.
        return mask & X == 0 || rec.kind == FileKind::Dir || rec.mode & 0o111 != 0;
    }
    let bits = if caller.uid == rec.uid {
        (rec.mode >> 6) & 7
    } else if caller.in_group(rec.gid) {
        (rec.mode >> 3) & 7
    } else {
        rec.mode & 7
    };
    bits & mask == mask
}

pub(crate) fn check(caller: &Caller, rec: &InodeRec, mask: u32) -> Result<()> {
    if may(caller, rec, mask) { Ok(()) } else { Err(Error::PermissionDenied) }
}

/// Write permission on a file's data; with `owner_override`, its owner has it whatever the
/// mode (`Engine::write_as_owner`, `Engine::setattr_as_owner`).
fn check_write(caller: &Caller, rec: &InodeRec, owner_override: bool) -> Result<()> {
    if owner_override && caller.uid == rec.uid { Ok(()) } else { check(caller, rec, W) }
}

/// Sticky directories let only the owner of an entry (or of the directory) remove it.
pub(crate) fn sticky_ok(caller: &Caller, dir: &InodeRec, victim: &InodeRec) -> bool {
    dir.mode & 0o1000 == 0 || caller.uid == 0 || caller.uid == dir.uid || caller.uid == victim.uid
}

pub(crate) fn attr_of(ino: Ino, r: &InodeRec) -> Attr {
    Attr {
        ino,
        kind: r.kind,
        mode: r.mode,
        uid: r.uid,
        gid: r.gid,
        nlink: r.nlink,
        size: r.size,
        atime_ns: r.atime_ns,
        mtime_ns: r.mtime_ns,
        ctime_ns: r.ctime_ns,
        btime_ns: r.btime_ns,
        version: r.version,
        generation: r.generation,
        stored_bytes: r.stored_bytes,
        rdev: r.rdev,
    }
}

/// Extent pieces held in memory while a command rewrites part of a file's extent map.
#[derive(Debug, Clone, Copy)]
struct Piece {
    off: u64,
    len: u64,
    stripe: u64,
    stripe_off: u64,
}

impl Engine {
    /// Opens (formatting on first use) the metadata store and the drives.
    pub fn open(cfg: EngineConfig) -> Result<Arc<Engine>> {
        let meta_dir = cfg.data_dir.join("meta");
        std::fs::create_dir_all(&meta_dir)
            .map_err(|e| Error::Io(format!("create {}: {e}", meta_dir.display())))?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.increase_parallelism(2);
        opts.set_keep_log_file_num(4);
        // Logs that are no longer needed are overwritten by later ones rather than deleted:
        // a sync of a log written into blocks the file already has is a data write and a
        // cache flush, where a growing log's sync also commits the filesystem's journal
        // (measured: 90 µs against 160 µs a 4 KiB sync on the development VM).
        if cfg.log_reuse_bytes > 0 {
            opts.set_recycle_log_file_num(LOGS_KEPT_FOR_REUSE);
        }
        // An engine of this process that is still closing (its last handle dropped on
        // another of the process's threads) holds the RocksDB lock for a moment: wait for
        // it briefly.
        let mut attempt = 0;
        let db = loop {
            let cfs = ALL_CFS.iter().map(|n| ColumnFamilyDescriptor::new(*n, Options::default()));
            match DB::open_cf_descriptors(&opts, &meta_dir, cfs) {
                Ok(db) => break db,
                Err(e) if attempt < 100 && e.as_ref().contains("lock") => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };

        let formatted = db.get_cf(db.cf_handle(CF_SYSTEM).expect("cf"), KEY_CLUSTER)?;
        let cluster_uuid: [u8; 16] = match formatted {
            Some(v) => v.as_slice().try_into().map_err(|_| Error::Corrupt("cluster uuid".into()))?,
            None => Self::format(&db, &cfg)?,
        };
        Self::prepare_log(&db, &meta_dir, cfg.log_reuse_bytes)?;
        let (drives, pools) = Self::open_drives(&db, &cfg, cluster_uuid)?;
        let data = DataStore::new(drives, pools, cfg.data_cache_bytes);

        // Rebuild the allocators from the stripe table; find the next stripe id.
        let mut next_stripe = 1;
        {
            let cf = db.cf_handle(CF_STRIPES).expect("cf");
            for kv in db.iterator_cf(cf, IteratorMode::Start) {
                let (k, v) = kv?;
                let id = read_be64(&k)?;
                next_stripe = next_stripe.max(id + 1);
                data.claim(&StripeRec::decode(&v)?)?;
            }
        }
        let sys = db.cf_handle(CF_SYSTEM).expect("cf");
        let next_ino = match db.get_cf(sys, KEY_NEXT_INO)? {
            Some(v) => read_be64(&v)?,
            None => ROOT_INO + 1,
        };
        let files = match db.get_cf(sys, KEY_FILES)? {
            Some(v) => read_be64(&v)?,
            None => 1,
        };
        let (events, _) = tokio::sync::broadcast::channel(4096);
        let audit_next = Self::last_audit_seq(&db)? + 1;
        let has_stubs = db.iterator_cf(db.cf_handle(CF_REMOTE).expect("cf"), IteratorMode::Start).next().is_some();
        let (flush_tx, flush_rx) = std::sync::mpsc::channel();
        let engine = Arc::new(Engine {
            db: Arc::new(db),
            data: Arc::new(data),
            cfg,
            mutate: Mutex::new(()),
            next_ino: AtomicU64::new(next_ino),
            next_stripe: AtomicU64::new(next_stripe),
            files: AtomicU64::new(files),
            buffers: Mutex::new(HashMap::new()),
            flush_tx,
            flush_rx: Mutex::new(Some(flush_rx)),
            flush_threads: Mutex::new(Vec::new()),
            events,
            jobs: crate::jobs::Jobs::default(),
            auth_cache: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            sync_thread: Mutex::new(None),
            log_warmer: Mutex::new(None),
            wal_sync: Default::default(),
            cluster_uuid,
            audit_seq: AtomicU64::new(audit_next),
            remote: parking_lot::RwLock::new(None),
            has_stubs: AtomicBool::new(has_stubs),
        });
        engine.ensure_admin()?;
        engine.reclaim_orphans()?;
        engine.start_sync_thread();
        if engine.cfg.log_reuse_bytes > 0 {
            match crate::log_warm::LogWarmer::start(&meta_dir) {
                Ok(w) => *engine.log_warmer.lock() = Some(w),
                Err(e) => tracing::warn!("metadata log read-ahead not started: {e}"),
            }
        }
        engine.start_flush_threads();
        crate::jobs::resume(&engine)?;
        Ok(engine)
    }

    fn format(db: &DB, cfg: &EngineConfig) -> Result<[u8; 16]> {
        if cfg.pools.is_empty() {
            return Err(Error::InvalidArgument("no pool configured".into()));
        }
        let cluster = *uuid::Uuid::new_v4().as_bytes();
        let sys = db.cf_handle(CF_SYSTEM).expect("cf");
        let mut batch = WriteBatch::default();
        for (pi, p) in cfg.pools.iter().enumerate() {
            Codec::new(p.data_shards, p.parity_shards)
                .map_err(|e| Error::InvalidArgument(format!("pool {}: {e}", p.name)))?;
            if p.drives.len() < p.data_shards + 1 {
                return Err(Error::InvalidArgument(format!(
                    "pool {} has {} drives; {}+{} needs at least {}",
                    p.name,
                    p.drives.len(),
                    p.data_shards,
                    p.parity_shards,
                    p.data_shards + p.parity_shards
                )));
            }
            let mut e = Enc::new(1);
            e.bytes(p.name.as_bytes()).u8(p.data_shards as u8).u8(p.parity_shards as u8);
            e.u32(p.drives.len() as u32);
            for d in &p.drives {
                if *d as usize >= cfg.drives.len() {
                    return Err(Error::InvalidArgument(format!("pool {} names drive {d}", p.name)));
                }
                e.u32(*d);
            }
            batch.put_cf(sys, format!("{KEY_POOL_PREFIX}{pi:04}"), e.finish());
        }
        for (i, d) in cfg.drives.iter().enumerate() {
            let pool = cfg.pools.iter().position(|p| p.drives.contains(&(i as u32))).unwrap_or(0);
            if !d.path.exists() {
                let Some(bytes) = d.create_bytes else {
                    return Err(Error::InvalidArgument(format!("drive {} does not exist", d.path.display())));
                };
                if let Some(parent) = d.path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| Error::Io(format!("create {}: {e}", parent.display())))?;
                }
                hardware::create_file_drive(&d.path, bytes)
                    .map_err(|e| Error::Io(format!("create drive {}: {e}", d.path.display())))?;
            }
            let uuid = *uuid::Uuid::new_v4().as_bytes();
            let dev = hardware::open_drive(&d.path, &cfg.drive_open)
                .map_err(|e| Error::Io(format!("open drive {}: {e}", d.path.display())))?;
            let sb = Superblock {
                drive_uuid: uuid,
                cluster_uuid: cluster,
                drive_index: i as u32,
                epoch: 1,
                capacity_bytes: dev.capacity_bytes(),
            };
            dev.write(0, sb.encode())
                .wait()
                .and_then(|_| dev.sync().wait())
                .map_err(|e| Error::Io(format!("write superblock to {}: {e}", d.path.display())))?;
            batch.put_cf(sys, format!("{KEY_DRIVE_PREFIX}{i:04}"), encode_drive(&d.path, &uuid, 1, pool as u16, dev.capacity_bytes()));
        }
        let now = cfg.clock.now_ns();
        let root = InodeRec {
            kind: FileKind::Dir,
            mode: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            size: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            btime_ns: now,
            version: 1,
            generation: rand::random(),
            storage: Storage::Inline,
            parent: ROOT_INO,
            target: vec![],
            stored_bytes: 0,
            rdev: 0,
        };
        batch.put_cf(db.cf_handle(CF_INODES).expect("cf"), be64(ROOT_INO), root.encode());
        batch.put_cf(sys, KEY_NEXT_INO, be64(ROOT_INO + 1));
        batch.put_cf(sys, KEY_FILES, be64(1));
        // The cluster key goes last in the same batch: a crash during format leaves either
        // nothing formatted or everything.
        batch.put_cf(sys, KEY_CLUSTER, cluster);
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        db.write_opt(batch, &wo)?;
        tracing::info!(drives = cfg.drives.len(), "formatted a new node");
        Ok(cluster)
    }

    fn open_drives(db: &DB, cfg: &EngineConfig, cluster: [u8; 16]) -> Result<(Vec<DriveSlot>, Vec<Pool>)> {
        let sys = db.cf_handle(CF_SYSTEM).expect("cf");
        let mut drives = Vec::new();
        for kv in db.prefix_iterator_cf(sys, KEY_DRIVE_PREFIX.as_bytes()) {
            let (k, v) = kv?;
            if !k.starts_with(KEY_DRIVE_PREFIX.as_bytes()) {
                break;
            }
            let (path, uuid, epoch, pool, capacity) = decode_drive(&v)?;
            let index = drives.len() as u32;
            let (state, dev) = match Self::open_one(cfg, &path, index, uuid, epoch, cluster) {
                Ok(dev) => (DriveState::Online, Some(dev)),
                Err(reason) => {
                    tracing::error!(drive = index, path = %path.display(), "drive unusable: {reason}");
                    (DriveState::Failed(reason), None)
                }
            };
            drives.push(DriveSlot {
                index,
                path,
                uuid,
                epoch,
                pool,
                capacity_bytes: capacity,
                state,
                dev,
                counters: Default::default(),
            });
        }
        let mut pools = Vec::new();
        for kv in db.prefix_iterator_cf(sys, KEY_POOL_PREFIX.as_bytes()) {
            let (k, v) = kv?;
            if !k.starts_with(KEY_POOL_PREFIX.as_bytes()) {
                break;
            }
            let mut d = Dec::new(&v, "pool", 1)?;
            let name = utf8(d.bytes()?, "pool name")?;
            let k = d.u8()? as usize;
            let m = d.u8()? as usize;
            let n = d.u32()? as usize;
            let mut ds = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                ds.push(d.u32()?);
            }
            d.end()?;
            let codec = Codec::new(k, m).map_err(|e| Error::Corrupt(format!("pool {name}: {e}")))?;
            pools.push(Pool { name, k, m, codec, drives: ds, shard_bytes_max: cfg.shard_bytes_max });
        }
        Ok((drives, pools))
    }

    fn open_one(cfg: &EngineConfig, path: &Path, index: u32, uuid: [u8; 16], epoch: u32, cluster: [u8; 16]) -> std::result::Result<Arc<dyn BlockDevice>, String> {
        if !path.exists() {
            return Err(format!("{} is missing", path.display()));
        }
        let mut dev = hardware::open_drive(path, &cfg.drive_open).map_err(|e| format!("open: {e}"))?;
        if let Some(w) = &cfg.drive_wrapper {
            dev = w(index, dev);
        }
        let sb = dev.read(0, hardware::BLOCK_BYTES).wait().map_err(|e| format!("read superblock: {e}"))?;
        let sb = Superblock::decode(&sb)?;
        if sb.cluster_uuid != cluster {
            return Err("drive belongs to another cluster".into());
        }
        if sb.drive_uuid != uuid || sb.drive_index != index || sb.epoch != epoch {
            return Err(format!(
                "superblock names drive {} epoch {}, expected drive {index} epoch {epoch}",
                sb.drive_index, sb.epoch
            ));
        }
        Ok(dev)
    }

    pub(crate) fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(name).expect("column family exists")
    }

    pub(crate) fn emit(&self, e: ChangeEvent) {
        let _ = self.events.send(e);
    }

    pub(crate) fn now(&self) -> i64 {
        self.cfg.clock.now_ns()
    }

    pub(crate) fn load(&self, ino: Ino) -> Result<InodeRec> {
        match self.db.get_cf(self.cf(CF_INODES), be64(ino))? {
            Some(v) => InodeRec::decode(&v),
            None => Err(Error::NotFound),
        }
    }

    pub(crate) fn load_dentry(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>> {
        match self.db.get_cf(self.cf(CF_DENTRIES), dentry_key(parent, name))? {
            Some(v) => Ok(Some(decode_dentry(&v)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn load_stripe(&self, id: u64) -> Result<StripeRec> {
        match self.db.get_cf(self.cf(CF_STRIPES), be64(id))? {
            Some(v) => StripeRec::decode(&v),
            None => Err(Error::Corrupt(format!("extent names missing stripe {id}"))),
        }
    }

    fn buffer_of(&self, ino: Ino) -> Option<Arc<FileBuf>> {
        self.buffers.lock().get(&ino).cloned()
    }

    /// Discards a deleted file's buffered bytes; writers waiting on it look again.
    fn drop_buffer(&self, ino: Ino) {
        let dropped = self.buffers.lock().remove(&ino);
        if let Some(fb) = dropped {
            fb.state.lock().detached = true;
            fb.room.notify_all();
        }
    }

    /// Attributes with buffered (not yet flushed) writes taken into account.
    fn overlay_attr(&self, ino: Ino, rec: &InodeRec) -> Attr {
        let mut a = attr_of(ino, rec);
        if let Some(b) = self.buffer_of(ino) {
            let b = b.state.lock();
            if !b.is_empty() {
                a.size = a.size.max(b.size);
                a.mtime_ns = a.mtime_ns.max(b.mtime_ns);
                a.ctime_ns = a.ctime_ns.max(b.mtime_ns);
            }
        }
        a
    }

    // ---------------------------------------------------------------- read side

    /// `getattr` for callers on an event loop: None when `ino` is a portal mirror, whose
    /// attributes may have to come from the hub, so the caller must use `getattr` on a thread
    /// that may block. Otherwise the metadata lookups `getattr` makes.
    pub fn try_getattr(&self, caller: &Caller, ino: Ino) -> Option<Result<Attr>> {
        match self.may_need_hub(caller, ino) {
            Ok(true) => None,
            Ok(false) => Some(self.getattr(caller, ino)),
            Err(e) => Some(Err(e)),
        }
    }

    /// Whether reading `ino` may have to wait for a hub: it is a portal mirror and `caller`
    /// is not the portal itself. One metadata read, none while the engine holds no mirror.
    fn may_need_hub(&self, caller: &Caller, ino: Ino) -> Result<bool> {
        Ok(!caller.is_portal() && self.remote_stub(ino)?.is_some())
    }

    pub fn getattr(&self, caller: &Caller, ino: Ino) -> Result<Attr> {
        self.remote_ensure(caller, ino, crate::remote::Need::Attr)?;
        let rec = self.load(ino)?;
        let mut a = self.overlay_attr(ino, &rec);
        if !caller.is_portal() {
            if let Some(stub) = self.remote_stub(ino)? {
                // A mirror inode shows the hub's version, so every site names the same version.
                a.version = stub.hub_version;
            }
        }
        Ok(a)
    }

    /// `lookup` for callers on an event loop: None when the directory or the entry it names
    /// is a portal mirror (a portal's root sits in a local directory), which may need the
    /// hub; otherwise the metadata reads `lookup` makes.
    pub fn try_lookup(&self, caller: &Caller, parent: Ino, name: &[u8]) -> Option<Result<Attr>> {
        if !caller.is_portal() {
            let mirror = |ino: Ino| self.remote_stub(ino).map(|s| s.is_some());
            match mirror(parent) {
                Ok(true) => return None,
                Ok(false) => {}
                Err(e) => return Some(Err(e)),
            }
            if name != b"." && name != b".." {
                match self.load_dentry(parent, name) {
                    Ok(Some((child, _))) => match mirror(child) {
                        Ok(true) => return None,
                        Ok(false) => {}
                        Err(e) => return Some(Err(e)),
                    },
                    Ok(None) => {}
                    Err(e) => return Some(Err(e)),
                }
            }
        }
        Some(self.lookup(caller, parent, name))
    }

    pub fn lookup(&self, caller: &Caller, parent: Ino, name: &[u8]) -> Result<Attr> {
        let dir = self.load(parent)?;
        if dir.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        check(caller, &dir, X)?;
        if name == b"." {
            return Ok(self.overlay_attr(parent, &dir));
        }
        if name == b".." {
            let p = dir.parent.max(ROOT_INO);
            return Ok(self.overlay_attr(p, &self.load(p)?));
        }
        validate_name(name)?;
        self.remote_ensure(caller, parent, crate::remote::Need::Listing)?;
        let (ino, _) = self.load_dentry(parent, name)?.ok_or(Error::NotFound)?;
        // getattr brings a mirror inode's attributes up to date and shows the hub's version.
        self.getattr(caller, ino)
    }

    /// Resolves a `/`-separated path from the root, without following symlinks.
    pub fn resolve(&self, caller: &Caller, path: &str) -> Result<Attr> {
        let mut cur = self.getattr(caller, ROOT_INO)?;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            if cur.kind != FileKind::Dir {
                return Err(Error::NotDir);
            }
            cur = self.lookup(caller, cur.ino, comp.as_bytes())?;
        }
        Ok(cur)
    }

    /// `resolve` for callers on an event loop: None when a directory on the way is a portal
    /// mirror or names one (the hub may have to answer); otherwise the metadata reads
    /// `resolve` makes.
    pub fn try_resolve(&self, caller: &Caller, path: &str) -> Option<Result<Attr>> {
        let mut cur = match self.try_getattr(caller, ROOT_INO)? {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            if cur.kind != FileKind::Dir {
                return Some(Err(Error::NotDir));
            }
            cur = match self.try_lookup(caller, cur.ino, comp.as_bytes())? {
                Ok(a) => a,
                Err(e) => return Some(Err(e)),
            };
        }
        Some(Ok(cur))
    }

    /// Resolves the parent directory of a path and returns it with the last name.
    pub fn resolve_parent<'p>(&self, caller: &Caller, path: &'p str) -> Result<(Attr, &'p str)> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = match trimmed.rfind('/') {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => ("", trimmed),
        };
        validate_name(name.as_bytes())?;
        let parent = self.resolve(caller, dir)?;
        if parent.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        Ok((parent, name))
    }

    /// Which of `mask` (4 read, 2 write, 1 execute/search) the caller may do on `ino`, by the
    /// same rules every operation is checked with (NFS ACCESS, SMB maximal access).
    pub fn access(&self, caller: &Caller, ino: Ino, mask: u32) -> Result<u32> {
        let rec = self.load(ino)?;
        Ok([R, W, X].into_iter().filter(|b| mask & b != 0 && may(caller, &rec, *b)).fold(0, |a, b| a | b))
    }

    pub fn readlink(&self, _caller: &Caller, ino: Ino) -> Result<Vec<u8>> {
        let rec = self.load(ino)?;
        if rec.kind != FileKind::Symlink {
            return Err(Error::NotSymlink);
        }
        Ok(rec.target)
    }

    /// Lists a directory in name byte order, `max` entries from after `cursor`.
    pub fn readdir(&self, caller: &Caller, ino: Ino, cursor: Option<&[u8]>, max: usize) -> Result<DirPage> {
        self.readdir_from(caller, ino, cursor.map(|c| (c, false)), max)
    }

    /// [`Engine::readdir`] starting at `from`: `(name, inclusive)`, entries at or strictly
    /// after that name in byte order.
    pub(crate) fn readdir_from(&self, caller: &Caller, ino: Ino, from: Option<(&[u8], bool)>, max: usize) -> Result<DirPage> {
        let dir = self.load(ino)?;
        if dir.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        check(caller, &dir, R)?;
        self.remote_ensure(caller, ino, crate::remote::Need::Listing)?;
        let prefix = be64(ino);
        let start = match from {
            Some((name, inclusive)) => {
                let mut k = dentry_key(ino, name);
                if !inclusive {
                    k.push(0); // strictly after the cursor name
                }
                k
            }
            None => prefix.to_vec(),
        };
        let mut entries = Vec::new();
        let mut more = false;
        let it = self.db.iterator_cf(self.cf(CF_DENTRIES), IteratorMode::From(&start, Direction::Forward));
        for kv in it {
            let (k, v) = kv?;
            if !k.starts_with(&prefix) {
                break;
            }
            if entries.len() >= max.max(1) {
                more = true;
                break;
            }
            let (child, kind) = decode_dentry(&v)?;
            entries.push(DirEntry { name: k[8..].to_vec(), ino: child, kind });
        }
        let next_cursor = if more { entries.last().map(|e| e.name.clone()) } else { None };
        Ok(DirPage { entries, next_cursor })
    }

    /// Reads up to `len` bytes at `offset`; short only at end of file.
    pub fn read(&self, caller: &Caller, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>> {
        Ok(self.read_chunks(caller, ino, offset, len, usize::MAX)?.pop().unwrap_or_default())
    }

    /// `read` into buffers of `chunk_bytes` each (the last one shorter; none when nothing is
    /// read), for large reads: the drives are read as for one `read` of the whole range (shards
    /// that lie back to back with one request), without a buffer as large as the range.
    pub fn read_chunks(&self, caller: &Caller, ino: Ino, offset: u64, len: usize, chunk_bytes: usize) -> Result<Vec<Vec<u8>>> {
        assert!(chunk_bytes > 0, "chunks hold at least one byte");
        let rec = self.load(ino)?;
        match rec.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::IsDir),
            FileKind::Symlink => return Err(Error::InvalidArgument("read of a symlink".into())),
            k => return Err(Error::InvalidArgument(format!("read of a special file ({k:?})"))),
        }
        check(caller, &rec, R)?;
        if !caller.is_portal() {
            if let Some(stub) = self.remote_stub(ino)? {
                return self.read_mirror(caller, ino, stub, offset, len).map(|v| split_chunks(v, chunk_bytes));
            }
        }
        let buf = self.buffer_of(ino);
        let _committing = buf.as_ref().map(|b| b.commit.read());
        let guard = buf.as_ref().map(|b| b.state.lock());
        // Reload under the buffer lock: a flush may have committed meanwhile.
        let rec = if guard.is_some() { self.load(ino)? } else { rec };
        let size = match &guard {
            Some(b) if !b.is_empty() => rec.size.max(b.size),
            _ => rec.size,
        };
        if offset >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(offset.saturating_add(len as u64));
        let mut out = self.read_committed_chunks(ino, &rec, offset, (end - offset) as usize, chunk_bytes)?;
        if let Some(b) = &guard {
            let mut at = offset;
            for c in &mut out {
                b.overlay(at, c);
                at += c.len() as u64;
            }
        }
        Ok(out)
    }

    /// Reads committed data (extents or inline), zeros for holes, into buffers of
    /// `chunk_bytes` each (the last one shorter).
    fn read_committed_chunks(&self, ino: Ino, rec: &InodeRec, offset: u64, len: usize, chunk_bytes: usize) -> Result<Vec<Vec<u8>>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let end = offset + len as u64;
        let extents = match rec.storage {
            Storage::Extents => self.extents_overlapping(ino, offset, end)?,
            Storage::Inline => Vec::new(),
        };
        // One extent covering the whole range (a sequential reader's usual case), and no data
        // cache to consult or fill: its bytes are the answer, without zeroing and copying them
        // into another buffer.
        if let [(eoff, ext)] = extents.as_slice()
            && *eoff <= offset
            && eoff + ext.len >= end
            && !self.data.cache.enabled()
        {
            let stripe = self.load_stripe(ext.stripe_id)?;
            return Ok(split_chunks(self.data.read_range(&stripe, ext.stripe_offset + (offset - eoff), len)?, chunk_bytes));
        }
        match rec.storage {
            Storage::Inline => {
                let mut out = vec![0u8; len];
                if let Some(v) = self.db.get_cf(self.cf(CF_INLINE), be64(ino))? {
                    let a = (offset as usize).min(v.len());
                    let b = (end as usize).min(v.len());
                    out[..b - a].copy_from_slice(&v[a..b]);
                }
                Ok(split_chunks(out, chunk_bytes))
            }
            Storage::Extents => self.with_pieces(ino, extents, offset, end, |pieces| self.data.read_many_chunked(pieces, chunk_bytes)),
        }
    }

    /// Calls `f` with the pieces (stripe ranges and holes) that make up `[offset, end)` of
    /// `ino`, given the extents overlapping it: the data store reads them all at once, shards
    /// that lie back to back on a drive with one request.
    fn with_pieces<T>(&self, ino: Ino, extents: Vec<(u64, ExtentRec)>, offset: u64, end: u64, f: impl FnOnce(&[ReadPiece<'_>]) -> Result<T>) -> Result<T> {
        let stripes = extents.into_iter().map(|(o, e)| Ok((o, e, self.load_stripe(e.stripe_id)?))).collect::<Result<Vec<_>>>()?;
        let mut pieces = Vec::with_capacity(stripes.len() * 2 + 1);
        let mut pos = offset;
        for (eoff, ext, stripe) in &stripes {
            let a = (*eoff).max(offset);
            let b = (eoff + ext.len).min(end);
            if a < pos {
                return Err(Error::Corrupt(format!("inode {ino}: extents overlap at {a}")));
            }
            if a > pos {
                pieces.push(ReadPiece::Zeros((a - pos) as usize));
            }
            pieces.push(ReadPiece::Stripe { id: ext.stripe_id, rec: stripe, offset: ext.stripe_offset + (a - eoff), len: (b - a) as usize });
            pos = b;
        }
        if pos < end {
            pieces.push(ReadPiece::Zeros((end - pos) as usize));
        }
        f(&pieces)
    }

    /// `read` answered where the bytes lie: slices of the buffers the drives read into, in
    /// order, tiling what was read (nothing past the end of the file). For protocols that send
    /// large reads from the buffers (NFS READ from its read-ahead windows) instead of copying
    /// them into one first. A piece is sliced out of a drive request that may be larger (up to
    /// four stripes' shards on one drive), and keeps that whole buffer alive while it lives.
    /// Bytes still in the file's write buffer are overlaid on copies of the pieces they touch.
    pub fn read_shared(&self, caller: &Caller, ino: Ino, offset: u64, len: usize) -> Result<Vec<ReadBytes>> {
        let rec = self.load(ino)?;
        match rec.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::IsDir),
            FileKind::Symlink => return Err(Error::InvalidArgument("read of a symlink".into())),
            k => return Err(Error::InvalidArgument(format!("read of a special file ({k:?})"))),
        }
        check(caller, &rec, R)?;
        if !caller.is_portal() {
            if let Some(stub) = self.remote_stub(ino)? {
                let v = self.read_mirror(caller, ino, stub, offset, len)?;
                return Ok(if v.is_empty() { Vec::new() } else { vec![v.into()] });
            }
        }
        let buf = self.buffer_of(ino);
        let _committing = buf.as_ref().map(|b| b.commit.read());
        let guard = buf.as_ref().map(|b| b.state.lock());
        // Reload under the buffer lock: a flush may have committed meanwhile.
        let rec = if guard.is_some() { self.load(ino)? } else { rec };
        let size = match &guard {
            Some(b) if !b.is_empty() => rec.size.max(b.size),
            _ => rec.size,
        };
        if offset >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(offset.saturating_add(len as u64));
        let mut out = match rec.storage {
            Storage::Inline => self.read_committed_chunks(ino, &rec, offset, (end - offset) as usize, usize::MAX)?.into_iter().map(ReadBytes::from).collect(),
            Storage::Extents => {
                let extents = self.extents_overlapping(ino, offset, end)?;
                self.with_pieces(ino, extents, offset, end, |pieces| self.data.read_many_shared(pieces))?
            }
        };
        if let Some(b) = &guard
            && !b.is_empty()
        {
            let mut at = offset;
            for piece in &mut out {
                let mut v = piece.to_vec();
                b.overlay(at, &mut v);
                at += v.len() as u64;
                *piece = v.into();
            }
        }
        Ok(out)
    }

    /// `read` for callers on an event loop, of a file whose bytes lie in the metadata store
    /// (a small file), with the file's attributes after it: the inode, the caller's
    /// permission and the bytes, each one metadata read, taking no lock. None, with nothing
    /// done, when the read could wait: the file's bytes are on the drives, it has a write
    /// buffer (whose flush a read waits for), or it is a portal mirror (whose bytes may come
    /// from the hub). The inode is read again after the bytes, and gives the attributes: if
    /// its data changed meanwhile (size, mtime, generation, storage), or it is gone, the read
    /// declines too, so that bytes of one state are never answered under the attributes of
    /// another.
    pub fn try_read_inline(&self, caller: &Caller, ino: Ino, offset: u64, len: usize) -> Option<Result<(Vec<u8>, Attr)>> {
        let rec = match self.load(ino) {
            Ok(rec) => rec,
            Err(e) => return Some(Err(e)),
        };
        if rec.kind != FileKind::File || rec.storage != Storage::Inline || self.buffer_of(ino).is_some() {
            return None;
        }
        match self.may_need_hub(caller, ino) {
            Ok(true) => return None,
            Ok(false) => {}
            Err(e) => return Some(Err(e)),
        }
        if let Err(e) = check(caller, &rec, R) {
            return Some(Err(e));
        }
        let end = rec.size.min(offset.saturating_add(len as u64));
        let data = if offset >= end {
            Vec::new()
        } else {
            match self.read_committed_chunks(ino, &rec, offset, (end - offset) as usize, usize::MAX) {
                Ok(mut c) => c.pop().unwrap_or_default(),
                Err(e) => return Some(Err(e)),
            }
        };
        let same = |r: &InodeRec| (r.size, r.mtime_ns, r.generation, r.storage) == (rec.size, rec.mtime_ns, rec.generation, rec.storage);
        match self.load(ino) {
            Ok(now) if same(&now) => Some(Ok((data, self.overlay_attr(ino, &now)))),
            _ => None,
        }
    }

    /// Extents of `ino` overlapping [from, to), in offset order.
    pub(crate) fn extents_overlapping(&self, ino: Ino, from: u64, to: u64) -> Result<Vec<(u64, ExtentRec)>> {
        let cf = self.cf(CF_EXTENTS);
        let mut out = Vec::new();
        // The extent starting at or before `from` may reach into the range.
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek_for_prev(extent_key(ino, from));
        if it.valid() {
            if let (Some(k), Some(v)) = (it.key(), it.value()) {
                if read_be64(k)? == ino {
                    let off = read_be64(&k[8..])?;
                    let e = ExtentRec::decode(v)?;
                    if off + e.len > from {
                        out.push((off, e));
                    }
                }
            }
        }
        it.seek(extent_key(ino, from.saturating_add(if out.is_empty() { 0 } else { 1 })));
        if out.is_empty() {
            it.seek(extent_key(ino, from));
        }
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else { break };
            if read_be64(k)? != ino {
                break;
            }
            let off = read_be64(&k[8..])?;
            if off >= to {
                break;
            }
            if out.last().is_none_or(|(o, _)| *o < off) {
                out.push((off, ExtentRec::decode(v)?));
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    pub fn statfs(&self, _caller: &Caller) -> Result<StatFs> {
        let alloc = self.data.alloc.lock();
        let (raw_total, raw_free) = alloc.iter().fold((0, 0), |(t, f), a| (t + a.capacity, f + a.free_bytes()));
        let pool = &self.data.pools[0];
        let frac = |v: u64| v / (pool.k + pool.m) as u64 * pool.k as u64;
        Ok(StatFs {
            total_bytes: frac(raw_total),
            free_bytes: frac(raw_free),
            files: self.files.load(Ordering::Relaxed),
            raw_total_bytes: raw_total,
            raw_free_bytes: raw_free,
            name_bytes_max: NAME_BYTES_MAX as u32,
        })
    }

    pub fn getxattr(&self, caller: &Caller, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let rec = self.load(ino)?;
        check(caller, &rec, R)?;
        self.db.get_cf(self.cf(CF_XATTRS), xattr_key(ino, name))?.ok_or(Error::NotFound)
    }

    pub fn listxattr(&self, caller: &Caller, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let rec = self.load(ino)?;
        check(caller, &rec, R)?;
        let prefix = be64(ino);
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_XATTRS), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, _) = kv?;
            if !k.starts_with(&prefix) {
                break;
            }
            out.push(k[8..].to_vec());
        }
        Ok(out)
    }

    /// Subscribes to change events (committed mutations). A slow subscriber that falls
    /// more than 4096 events behind gets a Lagged error and must resynchronise.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ChangeEvent> {
        self.events.subscribe()
    }

    // ---------------------------------------------------------------- mutations

    fn alloc_ino(&self) -> Ino {
        self.next_ino.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn alloc_stripe_id(&self) -> u64 {
        self.next_stripe.fetch_add(1, Ordering::Relaxed)
    }

    /// Applies one command as one write batch; `durable` syncs the metadata log first.
    pub(crate) fn execute(&self, cmd: Command, durable: bool) -> Result<Option<Attr>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Unavailable("engine is shut down".into()));
        }
        let guard = self.mutate.lock();
        let (applied, freed) = self
            .apply_and_write(guard, &cmd, &WriteOptions::default())?
            .ok_or_else(|| Error::Metadata("metadata write refused as incomplete".into()))?;
        self.after_write(applied, freed, durable)
    }

    /// `execute` of a command that is not durable, for callers on an event loop: `None`, with
    /// nothing applied, when it would wait for the mutation lock (another mutation is being
    /// applied) or for RocksDB to accept the write (a write stall).
    fn try_execute(&self, cmd: Command) -> Option<Result<Option<Attr>>> {
        if self.closed.load(Ordering::Acquire) {
            return Some(Err(Error::Unavailable("engine is shut down".into())));
        }
        let guard = self.mutate.try_lock()?;
        let mut wo = WriteOptions::default();
        wo.set_no_slowdown(true);
        Some(match self.apply_and_write(guard, &cmd, &wo) {
            Ok(Some((applied, freed))) => self.after_write(applied, freed, false),
            Ok(None) => return None,
            Err(e) => Err(e),
        })
    }

    /// Applies `cmd` to a batch and writes it under the mutation lock `guard`. `Ok(None)`: the
    /// write was refused because it would have waited (only with `no_slowdown` set); the
    /// in-memory counters are as before and nothing was written.
    fn apply_and_write(&self, guard: parking_lot::MutexGuard<'_, ()>, cmd: &Command, wo: &WriteOptions) -> Result<Option<(Applied, Vec<(u64, StripeRec)>)>> {
        let _g = guard;
        let files_before = self.files.load(Ordering::Relaxed);
        let mut batch = WriteBatch::default();
        let mut freed = Vec::new();
        let applied = self.apply(cmd, &mut batch, &mut freed)?;
        match self.db.write_opt(batch, wo) {
            Ok(()) => Ok(Some((applied, freed))),
            Err(e) => {
                // The file count moves only under the mutation lock: put it back, since the
                // batch that stored the new count was not written.
                self.files.store(files_before, Ordering::Relaxed);
                if e.kind() == rocksdb::ErrorKind::Incomplete { Ok(None) } else { Err(e.into()) }
            }
        }
    }

    /// What follows a written batch: frees after the next log sync, the sync itself for a
    /// durable command, change events.
    fn after_write(&self, applied: Applied, freed: Vec<(u64, StripeRec)>, durable: bool) -> Result<Option<Attr>> {
        for (id, s) in &freed {
            self.data.free_after_sync(s);
            // Nobody reads a freed stripe again (ids are never reused): its shards in the
            // data cache would only be dead weight until evicted.
            self.data.cache.forget_stripe(*id, s.k as usize);
        }
        // Durable commands sync the log after the mutation lock is released, so concurrent
        // ones share a sync (group commit) instead of queueing behind each other's.
        if durable {
            self.sync_metadata()?;
        }
        for e in applied.events {
            let _ = self.events.send(e);
        }
        Ok(applied.attr)
    }

    /// Writes `bytes` of filler into each of the logs kept for reuse, so that the log the
    /// engine writes next overwrites a file whose blocks the filesystem has allocated and
    /// written. RocksDB reuses only logs of the current run that are no longer needed, so
    /// each log is filled, synced, and left behind by switching to the next (a flush: it
    /// needs an entry in a memtable, a key put and deleted). The filler is log data: it is
    /// in no memtable or table file, and recovery skips it.
    ///
    /// Skipped, with a warning, where the logs would take more than a quarter of the room
    /// left on the metadata filesystem: the engine opens, and its syncs cost what they cost
    /// without reuse until RocksDB has logs of its own to write over.
    fn prepare_log(db: &DB, meta_dir: &Path, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let needed = bytes.saturating_mul(LOGS_KEPT_FOR_REUSE as u64);
        let available = hardware::available_bytes(meta_dir).map_err(|e| Error::Io(format!("statvfs {}: {e}", meta_dir.display())))?;
        if !log_reuse_fits(needed, available) {
            tracing::warn!(
                needed,
                available,
                "metadata logs for reuse not written: they would take more than a quarter of the room left on the metadata filesystem"
            );
            return Ok(());
        }
        let chunk = vec![0u8; 1 << 20];
        let sys = db.cf_handle(CF_SYSTEM).expect("cf");
        let cfs: Vec<_> = ALL_CFS.iter().map(|n| db.cf_handle(n).expect("cf")).collect();
        let mut fo = rocksdb::FlushOptions::default();
        fo.set_wait(true);
        for _ in 0..LOGS_KEPT_FOR_REUSE {
            for _ in 0..bytes.div_ceil(chunk.len() as u64) {
                let mut b = WriteBatch::default();
                b.put_log_data(&chunk);
                db.write(b)?;
            }
            db.flush_wal(true)?;
            let mut b = WriteBatch::default();
            b.put_cf(sys, KEY_LOG_SWITCH, b"");
            b.delete_cf(sys, KEY_LOG_SWITCH);
            db.write(b)?;
            db.flush_cfs_opt(&cfs, &fo)?;
        }
        Ok(())
    }

    /// Makes all committed metadata durable and releases freed blocks.
    /// Concurrent callers share one log sync.
    pub fn sync_metadata(&self) -> Result<()> {
        sync_log(&self.wal_sync, &self.db, &self.data)
    }

    /// `sync_metadata` for callers on an event loop: ready once everything committed before
    /// the call is durable. The log-sync thread runs the sync as soon as a caller waits
    /// (shared with every caller waiting then, and with blocking callers'), so none of the
    /// caller's threads blocks.
    pub fn durable(&self) -> impl std::future::Future<Output = Result<()>> + Send + '_ {
        self.wal_sync.durable()
    }

    fn start_sync_thread(self: &Arc<Self>) {
        let (group, db, data) = (self.wal_sync.clone(), self.db.clone(), self.data.clone());
        let interval = Duration::from_millis(self.cfg.wal_sync_interval_ms.max(10));
        let h = std::thread::Builder::new()
            .name("aquifer-walsync".into())
            .spawn(move || {
                // Syncs every `interval`, and at once when a caller on an event loop waits
                // (`durable`), until the engine stops it (`stop_sync_thread`).
                loop {
                    let Some(upto) = group.wait_for_waiters(interval) else {
                        group.shut_down("the engine is shut down");
                        return;
                    };
                    if let Err(err) = sync_log(&group, &db, &data) {
                        tracing::error!("metadata sync: {err}");
                        group.fail_upto(upto, &err.to_string());
                    }
                }
            })
            .expect("spawn metadata sync thread");
        *self.sync_thread.lock() = Some(h);
    }

    /// Stops the log-sync thread and waits for it, so that nothing but the engine's callers
    /// holds its database afterwards. Futures waiting for a sync then fail.
    fn stop_sync_thread(&self) {
        if let Some(mut w) = self.log_warmer.lock().take() {
            w.stop();
        }
        self.wal_sync.stop();
        if let Some(h) = self.sync_thread.lock().take() {
            let _ = h.join();
        }
    }

    fn start_flush_threads(self: &Arc<Self>) {
        let Some(rx) = self.flush_rx.lock().take() else { return };
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = self.flush_threads.lock();
        for i in 0..self.cfg.write_flush_threads {
            let weak = Arc::downgrade(self);
            let rx = rx.clone();
            let h = std::thread::Builder::new()
                .name(format!("aquifer-flush-{i}"))
                .spawn(move || {
                    // The engine holds the sender: when it is dropped, `recv` fails and the
                    // thread ends. It holds the engine only while it writes a file out, so an
                    // idle thread never keeps a dropped engine (and its files) alive.
                    while let Ok(ino) = rx.lock().recv() {
                        let Some(e) = weak.upgrade() else { return };
                        if e.closed.load(Ordering::Acquire) {
                            return;
                        }
                        e.background_flush(ino);
                    }
                })
                .expect("spawn flush thread");
            handles.push(h);
        }
    }

    pub(crate) fn put_inode(&self, batch: &mut WriteBatch, ino: Ino, rec: &InodeRec) {
        batch.put_cf(self.cf(CF_INODES), be64(ino), rec.encode());
    }

    /// A directory whose entries changed: new mtime and ctime, next version, stored.
    /// Counts a new inode in the batch: the next inode number to hand out and the file count.
    fn count_new_inode(&self, batch: &mut WriteBatch, ino: Ino) {
        batch.put_cf(self.cf(CF_SYSTEM), KEY_NEXT_INO, be64(self.next_ino.load(Ordering::Relaxed).max(ino + 1)));
        let files = self.files.fetch_add(1, Ordering::Relaxed) + 1;
        batch.put_cf(self.cf(CF_SYSTEM), KEY_FILES, be64(files));
    }

    /// Drops the link of the file `name` in `dir` (if there is one) for a new file taking its
    /// place: a directory there is IsDir, a sticky directory protects other users' files.
    #[allow(clippy::too_many_arguments)]
    fn replace_file_entry(&self, caller: &Caller, parent: Ino, dir: &InodeRec, name: &[u8], batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>, now: i64) -> Result<()> {
        if let Some((old, okind)) = self.load_dentry(parent, name)? {
            if okind == FileKind::Dir {
                return Err(Error::IsDir);
            }
            let victim = self.load(old)?;
            if !sticky_ok(caller, dir, &victim) {
                return Err(Error::PermissionDenied);
            }
            self.drop_link(batch, freed, old, victim, now)?;
        }
        Ok(())
    }

    pub(crate) fn put_touched(&self, batch: &mut WriteBatch, ino: Ino, dir: &mut InodeRec, now: i64) {
        dir.mtime_ns = now;
        dir.ctime_ns = now;
        dir.version += 1;
        self.put_inode(batch, ino, dir);
    }

    fn apply(&self, cmd: &Command, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>) -> Result<Applied> {
        match cmd {
            Command::Create { caller, parent, name, kind, mode, ino, generation, now, target, rdev, exclusive, orphan } => {
                let mut dir = self.load(*parent)?;
                if dir.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                if !orphan {
                    validate_name(name)?;
                    check(caller, &dir, W | X)?;
                    if let Some((existing, ekind)) = self.load_dentry(*parent, name)? {
                        if *exclusive || *kind != FileKind::File || ekind != FileKind::File {
                            return Err(Error::Exists);
                        }
                        let rec = self.load(existing)?;
                        return Ok(Applied { attr: Some(attr_of(existing, &rec)), events: vec![] });
                    }
                } else {
                    check(caller, &dir, W | X)?;
                }
                let rec = new_inode(caller, &dir, *kind, *mode, *generation, *now, *parent, target, *rdev);
                self.put_inode(batch, *ino, &rec);
                self.count_new_inode(batch, *ino);
                let mut events = vec![];
                if *orphan {
                    batch.put_cf(self.cf(CF_ORPHANS), be64(*ino), be64(*now as u64));
                } else {
                    batch.put_cf(self.cf(CF_DENTRIES), dentry_key(*parent, name), encode_dentry(*ino, *kind));
                    if *kind == FileKind::Dir {
                        dir.nlink += 1;
                    }
                    self.put_touched(batch, *parent, &mut dir, *now);
                    events.push(ChangeEvent {
                        ino: *ino,
                        version: 1,
                        kind: ChangeKind::Created { parent: *parent, name: name.clone() },
                    });
                }
                Ok(Applied { attr: Some(attr_of(*ino, &rec)), events })
            }
            Command::Link { caller, ino, parent, name, replace, now } => {
                validate_name(name)?;
                let mut dir = self.load(*parent)?;
                if dir.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                check(caller, &dir, W | X)?;
                let mut rec = self.load(*ino)?;
                if rec.kind == FileKind::Dir {
                    return Err(Error::PermissionDenied);
                }
                if rec.nlink == 0 {
                    return Err(Error::NotFound);
                }
                let mut events = Vec::new();
                if let Some((old, okind)) = self.load_dentry(*parent, name)? {
                    if !*replace {
                        return Err(Error::Exists);
                    }
                    if old == *ino {
                        // Already this file's name: nothing to replace.
                        return Ok(Applied { attr: Some(attr_of(*ino, &rec)), events });
                    }
                    if okind == FileKind::Dir {
                        return Err(Error::IsDir);
                    }
                    let victim = self.load(old)?;
                    if !sticky_ok(caller, &dir, &victim) {
                        return Err(Error::PermissionDenied);
                    }
                    batch.delete_cf(self.cf(CF_DENTRIES), dentry_key(*parent, name));
                    self.drop_link(batch, freed, old, victim, *now)?;
                    events.push(ChangeEvent { ino: old, version: 0, kind: ChangeKind::Removed { parent: *parent, name: name.clone() } });
                }
                if rec.nlink >= LINKS_MAX {
                    return Err(Error::TooManyLinks);
                }
                rec.nlink += 1;
                rec.ctime_ns = *now;
                rec.version += 1;
                self.put_inode(batch, *ino, &rec);
                batch.put_cf(self.cf(CF_DENTRIES), dentry_key(*parent, name), encode_dentry(*ino, rec.kind));
                self.put_touched(batch, *parent, &mut dir, *now);
                events.push(ChangeEvent { ino: *ino, version: rec.version, kind: ChangeKind::Created { parent: *parent, name: name.clone() } });
                Ok(Applied { attr: Some(attr_of(*ino, &rec)), events })
            }
            Command::Unlink { caller, parent, name, dir: want_dir, now } => {
                validate_name(name)?;
                let mut dir = self.load(*parent)?;
                if dir.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                check(caller, &dir, W | X)?;
                let (ino, kind) = self.load_dentry(*parent, name)?.ok_or(Error::NotFound)?;
                let victim = self.load(ino)?;
                if !sticky_ok(caller, &dir, &victim) {
                    return Err(Error::PermissionDenied);
                }
                match (kind == FileKind::Dir, want_dir) {
                    (true, false) => return Err(Error::IsDir),
                    (false, true) => return Err(Error::NotDir),
                    _ => {}
                }
                if kind == FileKind::Dir {
                    // A bucket keeps its noncurrent versions under its inode.
                    if self.dir_has_entries(ino)? || crate::versions::has_versions(self, ino)? {
                        return Err(Error::NotEmpty);
                    }
                    dir.nlink -= 1;
                }
                batch.delete_cf(self.cf(CF_DENTRIES), dentry_key(*parent, name));
                self.drop_link(batch, freed, ino, victim, *now)?;
                self.put_touched(batch, *parent, &mut dir, *now);
                Ok(Applied {
                    attr: None,
                    events: vec![ChangeEvent { ino, version: 0, kind: ChangeKind::Removed { parent: *parent, name: name.clone() } }],
                })
            }
            Command::Rename { caller, from_parent, from_name, to_parent, to_name, now } => {
                self.apply_rename(caller, *from_parent, from_name, *to_parent, to_name, *now, batch, freed)
            }
            Command::Publish { caller, ino, parent, name, now } => {
                validate_name(name)?;
                let mut dir = self.load(*parent)?;
                if dir.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                check(caller, &dir, W | X)?;
                let mut rec = self.load(*ino)?;
                self.replace_file_entry(caller, *parent, &dir, name, batch, freed, *now)?;
                batch.delete_cf(self.cf(CF_ORPHANS), be64(*ino));
                batch.put_cf(self.cf(CF_DENTRIES), dentry_key(*parent, name), encode_dentry(*ino, rec.kind));
                rec.ctime_ns = *now;
                rec.version += 1;
                self.put_inode(batch, *ino, &rec);
                self.put_touched(batch, *parent, &mut dir, *now);
                Ok(Applied {
                    attr: Some(attr_of(*ino, &rec)),
                    events: vec![ChangeEvent { ino: *ino, version: rec.version, kind: ChangeKind::Created { parent: *parent, name: name.clone() } }],
                })
            }
            Command::PutInline { caller, parent, name, mode, ino, generation, data, xattrs, now } => {
                validate_name(name)?;
                let mut dir = self.load(*parent)?;
                if dir.kind != FileKind::Dir {
                    return Err(Error::NotDir);
                }
                check(caller, &dir, W | X)?;
                if data.len() as u64 > self.cfg.inline_bytes_max {
                    return Err(Error::InvalidArgument("inline content over the inline limit".into()));
                }
                for (n, v) in xattrs {
                    validate_xattr(n, Some(v))?;
                }
                self.replace_file_entry(caller, *parent, &dir, name, batch, freed, *now)?;
                let mut rec = new_inode(caller, &dir, FileKind::File, *mode, *generation, *now, *parent, &[], 0);
                rec.size = data.len() as u64;
                rec.stored_bytes = data.len() as u64;
                self.put_inode(batch, *ino, &rec);
                self.count_new_inode(batch, *ino);
                if !data.is_empty() {
                    batch.put_cf(self.cf(CF_INLINE), be64(*ino), data);
                }
                for (n, v) in xattrs {
                    batch.put_cf(self.cf(CF_XATTRS), xattr_key(*ino, n), v);
                }
                batch.put_cf(self.cf(CF_DENTRIES), dentry_key(*parent, name), encode_dentry(*ino, FileKind::File));
                self.put_touched(batch, *parent, &mut dir, *now);
                Ok(Applied {
                    attr: Some(attr_of(*ino, &rec)),
                    events: vec![ChangeEvent { ino: *ino, version: rec.version, kind: ChangeKind::Created { parent: *parent, name: name.clone() } }],
                })
            }
            Command::SetAttr { caller, ino, set, now, owner_override } => self.apply_setattr(caller, *ino, set, *now, *owner_override, batch, freed),
            Command::WriteExtents { ino, extents, inline, size_at_least, now } => {
                let mut rec = self.load(*ino)?;
                if rec.kind != FileKind::File {
                    return Err(Error::IsDir);
                }
                if let Some(data) = inline {
                    debug_assert!(extents.is_empty());
                    rec.stored_bytes = data.len() as u64;
                    batch.put_cf(self.cf(CF_INLINE), be64(*ino), data);
                } else if !extents.is_empty() {
                    if rec.storage == Storage::Inline {
                        // The writer merged the inline bytes into its extents.
                        batch.delete_cf(self.cf(CF_INLINE), be64(*ino));
                        rec.stored_bytes = 0;
                        rec.storage = Storage::Extents;
                    }
                    let new: Vec<(u64, u64, u64)> =
                        extents.iter().map(|(off, id, s)| (*off, s.data_len, *id)).collect();
                    let delta = self.replace_ranges(batch, freed, *ino, &new)?;
                    for (_, id, s) in extents {
                        let mut s = s.clone();
                        s.refs = 1;
                        batch.put_cf(self.cf(CF_STRIPES), be64(*id), s.encode());
                    }
                    rec.stored_bytes = (rec.stored_bytes as i64 + delta) as u64;
                }
                rec.size = rec.size.max(*size_at_least);
                rec.mtime_ns = *now;
                rec.ctime_ns = *now;
                rec.version += 1;
                self.put_inode(batch, *ino, &rec);
                Ok(Applied {
                    attr: Some(attr_of(*ino, &rec)),
                    events: vec![ChangeEvent { ino: *ino, version: rec.version, kind: ChangeKind::Data }],
                })
            }
            Command::Concat { ino, parts, now } => {
                let mut rec = self.load(*ino)?;
                if rec.kind != FileKind::File || rec.storage != Storage::Extents || rec.size != 0 {
                    return Err(Error::InvalidArgument("concatenation target must be an empty extent file".into()));
                }
                let mut pos = 0u64;
                for part in parts {
                    let prec = self.load(*part)?;
                    match prec.storage {
                        Storage::Extents => {
                            for (off, e) in self.extents_overlapping(*part, 0, u64::MAX)? {
                                batch.put_cf(self.cf(CF_EXTENTS), extent_key(*ino, pos + off), e.encode());
                                batch.delete_cf(self.cf(CF_EXTENTS), extent_key(*part, off));
                            }
                        }
                        Storage::Inline => {
                            return Err(Error::InvalidArgument("inline part cannot be concatenated".into()));
                        }
                    }
                    pos += prec.size;
                    rec.stored_bytes += prec.stored_bytes;
                    batch.delete_cf(self.cf(CF_INODES), be64(*part));
                    batch.delete_cf(self.cf(CF_ORPHANS), be64(*part));
                    batch.delete_cf(self.cf(CF_XATTRS), be64(*part)); // none on parts
                }
                let files = self.files.fetch_sub(parts.len() as u64, Ordering::Relaxed) - parts.len() as u64;
                batch.put_cf(self.cf(CF_SYSTEM), KEY_FILES, be64(files));
                rec.size = pos;
                rec.mtime_ns = *now;
                rec.ctime_ns = *now;
                rec.version += 1;
                self.put_inode(batch, *ino, &rec);
                Ok(Applied { attr: Some(attr_of(*ino, &rec)), events: vec![] })
            }
            Command::SetXattrs { caller, ino, remove, must_exist, set, now } => {
                for name in remove {
                    validate_xattr(name, None)?;
                }
                for (name, value) in set {
                    validate_xattr(name, Some(value))?;
                }
                let mut rec = self.load(*ino)?;
                if caller.uid != 0 && caller.uid != rec.uid {
                    check(caller, &rec, W)?;
                }
                if *must_exist {
                    for name in remove {
                        if self.db.get_cf(self.cf(CF_XATTRS), xattr_key(*ino, name))?.is_none() {
                            return Err(Error::NotFound);
                        }
                    }
                }
                // In batch order: a name both removed and set ends up set.
                for name in remove {
                    batch.delete_cf(self.cf(CF_XATTRS), xattr_key(*ino, name));
                }
                for (name, value) in set {
                    batch.put_cf(self.cf(CF_XATTRS), xattr_key(*ino, name), value);
                }
                rec.ctime_ns = *now;
                rec.version += 1;
                self.put_inode(batch, *ino, &rec);
                Ok(Applied {
                    attr: Some(attr_of(*ino, &rec)),
                    events: vec![ChangeEvent { ino: *ino, version: rec.version, kind: ChangeKind::Attr }],
                })
            }
            Command::DeleteOrphan { ino } => {
                if self.db.get_cf(self.cf(CF_ORPHANS), be64(*ino))?.is_none() {
                    return Err(Error::NotFound);
                }
                batch.delete_cf(self.cf(CF_ORPHANS), be64(*ino));
                if let Ok(rec) = self.load(*ino) {
                    self.drop_link(batch, freed, *ino, InodeRec { nlink: 1, ..rec }, 0)?;
                }
                Ok(Applied { attr: None, events: vec![] })
            }
            Command::Version(v) => crate::versions::apply(self, v, batch, freed),
        }
    }

    pub(crate) fn dir_has_entries(&self, ino: Ino) -> Result<bool> {
        let prefix = be64(ino);
        let mut it = self.db.raw_iterator_cf(self.cf(CF_DENTRIES));
        it.seek(prefix);
        Ok(it.valid() && it.key().is_some_and(|k| k.starts_with(&prefix)))
    }

    /// Removes one link to `ino`; at zero links deletes the inode and its data.
    pub(crate) fn drop_link(&self, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>, ino: Ino, mut rec: InodeRec, now: i64) -> Result<()> {
        let last = rec.kind == FileKind::Dir || rec.nlink <= 1;
        if !last {
            rec.nlink -= 1;
            rec.ctime_ns = now;
            rec.version += 1;
            self.put_inode(batch, ino, &rec);
            return Ok(());
        }
        batch.delete_cf(self.cf(CF_INODES), be64(ino));
        batch.delete_cf(self.cf(CF_INLINE), be64(ino));
        let prefix = be64(ino);
        for kv in self.db.iterator_cf(self.cf(CF_XATTRS), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, _) = kv?;
            if !k.starts_with(&prefix) {
                break;
            }
            batch.delete_cf(self.cf(CF_XATTRS), k);
        }
        if rec.storage == Storage::Extents {
            self.replace_ranges(batch, freed, ino, &[(0, u64::MAX, 0)])?;
        }
        let files = self.files.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        batch.put_cf(self.cf(CF_SYSTEM), KEY_FILES, be64(files));
        self.drop_buffer(ino);
        Ok(())
    }

    /// Rewrites the extent map of `ino` so that each (offset, len, stripe) in `new` covers
    /// its range (stripe 0 = punch a hole). Existing extents are trimmed or split; stripes
    /// whose reference count drops to zero are deleted and returned in `freed`. Returns the
    /// change of `stored_bytes`.
    fn replace_ranges(&self, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>, ino: Ino, new: &[(u64, u64, u64)]) -> Result<i64> {
        let lo = new.iter().map(|n| n.0).min().unwrap_or(0);
        let hi = new.iter().map(|n| n.0.saturating_add(n.1)).max().unwrap_or(0);
        let existing = self.extents_overlapping(ino, lo, hi)?;
        let mut pieces: Vec<Piece> = existing
            .iter()
            .map(|(off, e)| Piece { off: *off, len: e.len, stripe: e.stripe_id, stripe_off: e.stripe_offset })
            .collect();
        for &(noff, nlen, _) in new {
            let nend = noff.saturating_add(nlen);
            let mut next = Vec::with_capacity(pieces.len() + 1);
            for p in pieces {
                let pend = p.off + p.len;
                if pend <= noff || p.off >= nend {
                    next.push(p);
                    continue;
                }
                if p.off < noff {
                    next.push(Piece { len: noff - p.off, ..p });
                }
                if pend > nend {
                    next.push(Piece { off: nend, len: pend - nend, stripe: p.stripe, stripe_off: p.stripe_off + (nend - p.off) });
                }
            }
            pieces = next;
        }
        let mut refs: HashMap<u64, i64> = HashMap::new();
        let mut delta = 0i64;
        for (off, e) in &existing {
            batch.delete_cf(self.cf(CF_EXTENTS), extent_key(ino, *off));
            *refs.entry(e.stripe_id).or_default() -= 1;
            delta -= e.len as i64;
        }
        for p in &pieces {
            let e = ExtentRec { len: p.len, stripe_id: p.stripe, stripe_offset: p.stripe_off };
            batch.put_cf(self.cf(CF_EXTENTS), extent_key(ino, p.off), e.encode());
            *refs.entry(p.stripe).or_default() += 1;
            delta += p.len as i64;
        }
        for &(noff, nlen, stripe) in new {
            if stripe == 0 {
                continue;
            }
            let e = ExtentRec { len: nlen, stripe_id: stripe, stripe_offset: 0 };
            batch.put_cf(self.cf(CF_EXTENTS), extent_key(ino, noff), e.encode());
            delta += nlen as i64;
        }
        for (id, d) in refs {
            if d == 0 {
                continue;
            }
            let mut s = self.load_stripe(id)?;
            let r = s.refs as i64 + d;
            assert!(r >= 0, "stripe {id} reference count below zero");
            if r == 0 {
                batch.delete_cf(self.cf(CF_STRIPES), be64(id));
                freed.push((id, s));
            } else {
                s.refs = r as u32;
                batch.put_cf(self.cf(CF_STRIPES), be64(id), s.encode());
            }
        }
        Ok(delta)
    }

    #[allow(clippy::too_many_arguments)]
    fn apply_rename(&self, caller: &Caller, fp: Ino, fname: &[u8], tp: Ino, tname: &[u8], now: i64, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>) -> Result<Applied> {
        validate_name(fname)?;
        validate_name(tname)?;
        let mut fdir = self.load(fp)?;
        let mut tdir = if tp == fp { fdir.clone() } else { self.load(tp)? };
        if fdir.kind != FileKind::Dir || tdir.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        check(caller, &fdir, W | X)?;
        check(caller, &tdir, W | X)?;
        let (src, skind) = self.load_dentry(fp, fname)?.ok_or(Error::NotFound)?;
        let mut srec = self.load(src)?;
        if !sticky_ok(caller, &fdir, &srec) {
            return Err(Error::PermissionDenied);
        }
        let target = self.load_dentry(tp, tname)?;
        if let Some((t, _)) = target {
            if t == src {
                return Ok(Applied { attr: Some(attr_of(src, &srec)), events: vec![] });
            }
        }
        if skind == FileKind::Dir {
            // A directory may not move below itself.
            let mut cur = tp;
            loop {
                if cur == src {
                    return Err(Error::InvalidArgument("cannot move a directory below itself".into()));
                }
                if cur == ROOT_INO {
                    break;
                }
                let r = self.load(cur)?;
                if r.parent == 0 || r.parent == cur {
                    break;
                }
                cur = r.parent;
            }
            if tp != fp && caller.uid != 0 {
                // Moving a directory rewrites its ".." entry.
                check(caller, &srec, W)?;
            }
        }
        let same_dir = fp == tp;
        if let Some((t, tkind)) = target {
            let trec = self.load(t)?;
            if !sticky_ok(caller, &tdir, &trec) {
                return Err(Error::PermissionDenied);
            }
            match (skind == FileKind::Dir, tkind == FileKind::Dir) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) => {
                    // A bucket keeps its noncurrent versions under its inode.
                    if self.dir_has_entries(t)? || crate::versions::has_versions(self, t)? {
                        return Err(Error::NotEmpty);
                    }
                    tdir.nlink -= 1;
                }
                _ => {}
            }
            self.drop_link(batch, freed, t, trec, now)?;
        }
        batch.delete_cf(self.cf(CF_DENTRIES), dentry_key(fp, fname));
        batch.put_cf(self.cf(CF_DENTRIES), dentry_key(tp, tname), encode_dentry(src, skind));
        if skind == FileKind::Dir && !same_dir {
            srec.parent = tp;
            fdir.nlink -= 1;
            tdir.nlink += 1;
        }
        srec.ctime_ns = now;
        srec.version += 1;
        self.put_inode(batch, src, &srec);
        if same_dir {
            // One directory: `tdir` is the up-to-date copy (it lost a replaced subdirectory).
            let mut d = tdir;
            d.mtime_ns = now;
            d.ctime_ns = now;
            d.version += 1;
            self.put_inode(batch, fp, &d);
        } else {
            for (ino, d) in [(fp, &mut fdir), (tp, &mut tdir)] {
                d.mtime_ns = now;
                d.ctime_ns = now;
                d.version += 1;
                self.put_inode(batch, ino, d);
            }
        }
        Ok(Applied {
            attr: Some(attr_of(src, &srec)),
            events: vec![ChangeEvent {
                ino: src,
                version: srec.version,
                kind: ChangeKind::Renamed { from_parent: fp, from_name: fname.to_vec(), to_parent: tp, to_name: tname.to_vec() },
            }],
        })
    }

    fn apply_setattr(&self, caller: &Caller, ino: Ino, set: &SetAttr, now: i64, owner_override: bool, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>) -> Result<Applied> {
        let mut rec = self.load(ino)?;
        let owner = caller.uid == 0 || caller.uid == rec.uid;
        if let Some(mode) = set.mode {
            if !owner {
                return Err(Error::PermissionDenied);
            }
            let mut m = mode & 0o7777;
            if caller.uid != 0 && rec.kind == FileKind::File && !caller.in_group(rec.gid) {
                m &= !0o2000;
            }
            if rec.kind != FileKind::Symlink {
                rec.mode = m;
            }
        }
        let uid_change = set.uid.is_some_and(|u| u != rec.uid);
        let gid_change = set.gid.is_some_and(|g| g != rec.gid);
        if uid_change && caller.uid != 0 {
            return Err(Error::PermissionDenied);
        }
        if gid_change && caller.uid != 0 && !(caller.uid == rec.uid && caller.in_group(set.gid.unwrap_or(0))) {
            return Err(Error::PermissionDenied);
        }
        if set.uid.is_some() || set.gid.is_some() {
            if (set.uid.is_some() || set.gid.is_some()) && caller.uid != 0 && !owner {
                return Err(Error::PermissionDenied);
            }
            if let Some(u) = set.uid {
                rec.uid = u;
            }
            if let Some(g) = set.gid {
                rec.gid = g;
            }
            if rec.kind == FileKind::File && (uid_change || gid_change || caller.uid != 0) {
                // As on Linux: a change of owner drops setuid, and setgid of group-executable files.
                rec.mode &= !0o4000;
                if rec.mode & 0o010 != 0 {
                    rec.mode &= !0o2000;
                }
            }
        }
        if let Some(size) = set.size {
            match rec.kind {
                FileKind::Dir => return Err(Error::IsDir),
                FileKind::Symlink => return Err(Error::InvalidArgument("truncate of a symlink".into())),
                FileKind::File => {}
                k => return Err(Error::InvalidArgument(format!("truncate of a special file ({k:?})"))),
            }
            check_write(caller, &rec, owner_override)?;
            if size > FILE_BYTES_MAX {
                return Err(Error::FileTooLarge);
            }
            if size < rec.size {
                match rec.storage {
                    Storage::Inline => {
                        if let Some(mut v) = self.db.get_cf(self.cf(CF_INLINE), be64(ino))? {
                            if v.len() as u64 > size {
                                v.truncate(size as usize);
                                rec.stored_bytes = v.len() as u64;
                                batch.put_cf(self.cf(CF_INLINE), be64(ino), v);
                            }
                        }
                    }
                    Storage::Extents => {
                        let d = self.replace_ranges(batch, freed, ino, &[(size, u64::MAX - size, 0)])?;
                        rec.stored_bytes = (rec.stored_bytes as i64 + d) as u64;
                    }
                }
            }
            if size != rec.size {
                rec.size = size;
                rec.mtime_ns = now;
            }
        }
        for (which, t) in [(0, set.atime), (1, set.mtime)] {
            let Some(t) = t else { continue };
            match t {
                TimeSet::Now => {
                    if !owner && !may(caller, &rec, W) {
                        return Err(Error::PermissionDenied);
                    }
                }
                TimeSet::At(_) => {
                    if !owner {
                        return Err(Error::PermissionDenied);
                    }
                }
            }
            let v = match t {
                TimeSet::Now => now,
                TimeSet::At(v) => v,
            };
            if which == 0 { rec.atime_ns = v } else { rec.mtime_ns = v }
        }
        rec.ctime_ns = now;
        rec.version += 1;
        self.put_inode(batch, ino, &rec);
        Ok(Applied { attr: Some(attr_of(ino, &rec)), events: vec![ChangeEvent { ino, version: rec.version, kind: ChangeKind::Attr }] })
    }

    // ---------------------------------------------------------------- public mutations

    fn create_node(&self, caller: &Caller, parent: Ino, name: &[u8], kind: FileKind, mode: u32, target: Vec<u8>, exclusive: bool) -> Result<Attr> {
        let m = Mutation::Create { caller, parent, name, kind, mode, target: &target, exclusive };
        if let Some(done) = self.remote_mutation(&[parent], m)? {
            return done.ok_or_else(|| Error::Io("portal create returned no attributes".into()));
        }
        let cmd = Command::Create {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            kind,
            mode,
            ino: self.alloc_ino(),
            generation: rand::random(),
            now: self.now(),
            target,
            rdev: 0,
            exclusive,
            orphan: false,
        };
        Ok(self.execute(cmd, false)?.expect("create returns attributes"))
    }

    /// Creates a regular file. With `exclusive` false an existing regular file is returned
    /// unchanged (the caller truncates if it wants to).
    pub fn create(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32, exclusive: bool) -> Result<Attr> {
        self.create_node(caller, parent, name, FileKind::File, mode, vec![], exclusive)
    }

    /// `create` for callers on an event loop: metadata reads and one metadata batch written
    /// without a log sync, as `create` does. `None`, with nothing created, when it would have
    /// to wait: the parent is a portal mirror (the hub decides), another mutation holds the
    /// mutation lock, or RocksDB stalls writes; the caller then uses `create` on a thread
    /// that may block.
    pub fn try_create(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32, exclusive: bool) -> Option<Result<Attr>> {
        if !caller.is_portal() {
            match self.remote_stub(parent) {
                Ok(Some(_)) => return None,
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
        }
        let cmd = Command::Create {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            kind: FileKind::File,
            mode,
            ino: self.alloc_ino(),
            generation: rand::random(),
            now: self.now(),
            target: vec![],
            rdev: 0,
            exclusive,
            orphan: false,
        };
        self.try_execute(cmd).map(|r| r.map(|a| a.expect("create returns attributes")))
    }

    pub fn mkdir(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32) -> Result<Attr> {
        self.create_node(caller, parent, name, FileKind::Dir, mode, vec![], true)
    }

    pub fn symlink(&self, caller: &Caller, parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.is_empty() || target.len() > SYMLINK_TARGET_BYTES_MAX || target.contains(&0) {
            return Err(Error::InvalidArgument("symlink target must be 1-4096 bytes without NUL".into()));
        }
        self.create_node(caller, parent, name, FileKind::Symlink, 0o777, target.to_vec(), true)
    }

    /// Creates a fifo, socket or device node. Device nodes need root, as on Linux.
    pub fn mknod(&self, caller: &Caller, parent: Ino, name: &[u8], kind: FileKind, mode: u32, rdev: u64) -> Result<Attr> {
        self.remote_refuse(caller, parent, "mknod")?;
        if !kind.is_special() {
            return Err(Error::InvalidArgument("mknod makes fifos, sockets and device nodes".into()));
        }
        if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) && caller.uid != 0 {
            return Err(Error::PermissionDenied);
        }
        let rdev = if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) { rdev } else { 0 };
        let cmd = Command::Create {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            kind,
            mode,
            ino: self.alloc_ino(),
            generation: rand::random(),
            now: self.now(),
            target: vec![],
            rdev,
            exclusive: true,
            orphan: false,
        };
        Ok(self.execute(cmd, false)?.expect("create returns attributes"))
    }

    pub fn link(&self, caller: &Caller, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.link_as(caller, ino, parent, name, false)
    }

    /// Like `link`, but a file already named `name` is replaced in the same step (as rename
    /// replaces its target): a crash leaves the old file or the new link, never neither.
    /// Linking a file to a name it already has changes nothing.
    pub fn link_replacing(&self, caller: &Caller, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        self.link_as(caller, ino, parent, name, true)
    }

    fn link_as(&self, caller: &Caller, ino: Ino, parent: Ino, name: &[u8], replace: bool) -> Result<Attr> {
        self.remote_refuse(caller, ino, "link")?;
        self.remote_refuse(caller, parent, "link")?;
        self.flush(ino, false)?;
        let cmd = Command::Link { caller: caller.clone(), ino, parent, name: name.to_vec(), replace, now: self.now() };
        Ok(self.execute(cmd, false)?.expect("link returns attributes"))
    }

    pub fn unlink(&self, caller: &Caller, parent: Ino, name: &[u8]) -> Result<()> {
        if self.remote_mutation(&[parent], Mutation::Remove { caller, parent, name, dir: false })?.is_some() {
            return Ok(());
        }
        let cmd = Command::Unlink { caller: caller.clone(), parent, name: name.to_vec(), dir: false, now: self.now() };
        self.execute(cmd, false).map(|_| ())
    }

    pub fn rmdir(&self, caller: &Caller, parent: Ino, name: &[u8]) -> Result<()> {
        if self.remote_mutation(&[parent], Mutation::Remove { caller, parent, name, dir: true })?.is_some() {
            return Ok(());
        }
        let cmd = Command::Unlink { caller: caller.clone(), parent, name: name.to_vec(), dir: true, now: self.now() };
        self.execute(cmd, false).map(|_| ())
    }

    /// Atomic rename, also across directories; replaces a file or an empty directory.
    pub fn rename(&self, caller: &Caller, from_parent: Ino, from_name: &[u8], to_parent: Ino, to_name: &[u8]) -> Result<()> {
        let m = Mutation::Rename { caller, from_parent, from_name, to_parent, to_name };
        if self.remote_mutation(&[from_parent, to_parent], m)?.is_some() {
            return Ok(());
        }
        let cmd = Command::Rename {
            caller: caller.clone(),
            from_parent,
            from_name: from_name.to_vec(),
            to_parent,
            to_name: to_name.to_vec(),
            now: self.now(),
        };
        self.execute(cmd, false).map(|_| ())
    }

    pub fn setattr(&self, caller: &Caller, ino: Ino, set: SetAttr) -> Result<Attr> {
        self.setattr_checked(caller, ino, set, false)
    }

    /// [`setattr`](Self::setattr) as a server whose clients checked access when a file was
    /// opened: the file's owner may change its size whatever its mode, as it may write it in
    /// [`write_as_owner`](Self::write_as_owner) (`ftruncate` on a descriptor opened for
    /// writing; the Linux kernel NFS server's owner override covers size changes too). Every
    /// other change is checked as in `setattr`.
    pub fn setattr_as_owner(&self, caller: &Caller, ino: Ino, set: SetAttr) -> Result<Attr> {
        self.setattr_checked(caller, ino, set, true)
    }

    fn setattr_checked(&self, caller: &Caller, ino: Ino, set: SetAttr, owner_override: bool) -> Result<Attr> {
        if let Some(done) = self.remote_mutation(&[ino], Mutation::SetAttr { caller, ino, set: &set })? {
            return done.ok_or_else(|| Error::Io("portal setattr returned no attributes".into()));
        }
        if set.size.is_some() {
            // Truncation applies to flushed data; buffered bytes past the new end must not
            // reappear later.
            let rec = self.load(ino)?;
            if rec.kind == FileKind::File {
                check_write(caller, &rec, owner_override)?;
                self.flush(ino, false)?;
            }
        }
        let cmd = Command::SetAttr { caller: caller.clone(), ino, set, now: self.now(), owner_override };
        let attr = self.execute(cmd, false)?.expect("setattr returns attributes");
        Ok(attr)
    }

    /// `setattr` for callers on an event loop: one metadata batch without a log sync, as
    /// `setattr` writes it. `None`, with nothing changed, when it would have to wait: `ino` is
    /// a portal mirror (the hub decides), a size is set while the file has bytes in its write
    /// buffer (which `setattr` writes out first), another mutation holds the mutation lock,
    /// or RocksDB stalls writes; the caller then uses `setattr` on a thread that may block.
    pub fn try_setattr(&self, caller: &Caller, ino: Ino, set: SetAttr) -> Option<Result<Attr>> {
        self.try_setattr_checked(caller, ino, set, false)
    }

    /// [`try_setattr`](Self::try_setattr) with the owner's override of
    /// [`setattr_as_owner`](Self::setattr_as_owner).
    pub fn try_setattr_as_owner(&self, caller: &Caller, ino: Ino, set: SetAttr) -> Option<Result<Attr>> {
        self.try_setattr_checked(caller, ino, set, true)
    }

    fn try_setattr_checked(&self, caller: &Caller, ino: Ino, set: SetAttr, owner_override: bool) -> Option<Result<Attr>> {
        match self.may_need_hub(caller, ino) {
            Ok(true) => return None,
            Ok(false) => {}
            Err(e) => return Some(Err(e)),
        }
        if set.size.is_some() && self.buffer_of(ino).is_some() {
            return None;
        }
        let cmd = Command::SetAttr { caller: caller.clone(), ino, set, now: self.now(), owner_override };
        self.try_execute(cmd).map(|r| r.map(|a| a.expect("setattr returns attributes")))
    }

    pub fn setxattr(&self, caller: &Caller, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.remote_refuse(caller, ino, "setxattr")?;
        self.change_xattrs(caller, ino, &[], false, &[(name, value)])
    }

    pub fn removexattr(&self, caller: &Caller, ino: Ino, name: &[u8]) -> Result<()> {
        self.remote_refuse(caller, ino, "removexattr")?;
        self.change_xattrs(caller, ino, &[name], true, &[])
    }

    /// Removes the extended attributes `remove` of `ino` (names it lacks are passed over) and
    /// sets those of `set`, as one change: a reader sees all of it or none of it, and a
    /// refusal (permission, a bad name or value) changes nothing.
    pub fn set_xattrs(&self, caller: &Caller, ino: Ino, remove: &[&[u8]], set: &[(&[u8], &[u8])]) -> Result<()> {
        self.remote_refuse(caller, ino, "setxattr")?;
        self.change_xattrs(caller, ino, remove, false, set)
    }

    fn change_xattrs(&self, caller: &Caller, ino: Ino, remove: &[&[u8]], must_exist: bool, set: &[(&[u8], &[u8])]) -> Result<()> {
        for name in remove.iter().chain(set.iter().map(|(n, _)| n)) {
            check_reserved_xattr(caller, name)?;
        }
        let cmd = Command::SetXattrs {
            caller: caller.clone(),
            ino,
            remove: remove.iter().map(|n| n.to_vec()).collect(),
            must_exist,
            set: set.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect(),
            now: self.now(),
        };
        self.execute(cmd, false).map(|_| ())
    }

    /// Writes bytes at `offset`. Unstable writes collect in the file's write buffer; durable
    /// ones return after the data and metadata are synced.
    pub fn write(&self, caller: &Caller, ino: Ino, offset: u64, data: &[u8], stability: Stability) -> Result<Attr> {
        self.write_checked(caller, ino, offset, data, stability, false)
    }

    /// [`write`](Self::write) as an NFS server writes: the file's owner may write it whatever
    /// its mode (the Linux kernel server's owner override). An NFS client checks access when a
    /// file is opened and sends WRITEs afterwards, so a file created by `open(O_CREAT, 0444)`
    /// is written by its creator after its mode forbids it. Others are checked as in `write`.
    pub fn write_as_owner(&self, caller: &Caller, ino: Ino, offset: u64, data: &[u8], stability: Stability) -> Result<Attr> {
        self.write_checked(caller, ino, offset, data, stability, true)
    }

    fn write_checked(&self, caller: &Caller, ino: Ino, offset: u64, data: &[u8], stability: Stability, owner_override: bool) -> Result<Attr> {
        if let Some(done) = self.remote_mutation(&[ino], Mutation::Write { caller, ino, offset, data, stability })? {
            return done.ok_or_else(|| Error::Io("portal write returned no attributes".into()));
        }
        let rec = self.load_for_write(caller, ino, offset, data.len(), owner_override)?;
        if !data.is_empty() {
            self.buffer_write(ino, &rec, offset, WriteData::Bytes(data), true)?;
        }
        if stability == Stability::Durable {
            self.commit(caller, ino)?;
        }
        self.getattr(caller, ino)
    }

    /// An unstable [`write`](Self::write) of a whole buffer the caller hands over (an upload's
    /// chunk): it joins the file's write buffer as it is, without a copy, where it overlaps
    /// nothing buffered, and its full stripes are written to the drives from it. The caller
    /// must not change the buffer afterwards (it is shared and read-only).
    pub fn write_shared(&self, caller: &Caller, ino: Ino, offset: u64, data: Arc<AlignedBuf>) -> Result<()> {
        if self.remote_mutation(&[ino], Mutation::Write { caller, ino, offset, data: &data, stability: Stability::Unstable })?.is_some() {
            return Ok(());
        }
        let rec = self.load_for_write(caller, ino, offset, data.len(), false)?;
        if !data.is_empty() {
            self.buffer_write(ino, &rec, offset, WriteData::Shared(data), true)?;
        }
        Ok(())
    }

    /// An unstable write that only adds to the file's write buffer, for callers on an event
    /// loop: `Ok(false)`, with nothing written, when the write would have to wait (for room in
    /// the buffer, a flush, or a portal's hub) and must go through `write` on a thread that
    /// may block. Errors are `write`'s.
    pub fn try_write_buffered(&self, caller: &Caller, ino: Ino, offset: u64, data: &[u8]) -> Result<bool> {
        self.try_write_buffered_checked(caller, ino, offset, data, false)
    }

    /// [`try_write_buffered`](Self::try_write_buffered) with the owner's override of
    /// [`write_as_owner`](Self::write_as_owner).
    pub fn try_write_buffered_as_owner(&self, caller: &Caller, ino: Ino, offset: u64, data: &[u8]) -> Result<bool> {
        self.try_write_buffered_checked(caller, ino, offset, data, true)
    }

    fn try_write_buffered_checked(&self, caller: &Caller, ino: Ino, offset: u64, data: &[u8], owner_override: bool) -> Result<bool> {
        if !caller.is_portal() && self.has_stubs.load(Ordering::Relaxed) && self.remote_stub(ino)?.is_some() {
            return Ok(false);
        }
        let rec = self.load_for_write(caller, ino, offset, data.len(), owner_override)?;
        if data.is_empty() {
            return Ok(true);
        }
        self.buffer_write(ino, &rec, offset, WriteData::Bytes(data), false)
    }

    /// The file `write` may write `len` bytes at `offset` to; with `owner_override`, its owner
    /// may whatever its mode.
    fn load_for_write(&self, caller: &Caller, ino: Ino, offset: u64, len: usize, owner_override: bool) -> Result<InodeRec> {
        let rec = self.load(ino)?;
        match rec.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(Error::IsDir),
            FileKind::Symlink => return Err(Error::InvalidArgument("write to a symlink".into())),
            k => return Err(Error::InvalidArgument(format!("write to a special file ({k:?})"))),
        }
        check_write(caller, &rec, owner_override)?;
        if offset.checked_add(len as u64).is_none_or(|e| e > FILE_BYTES_MAX) {
            return Err(Error::FileTooLarge);
        }
        Ok(rec)
    }

    /// Adds `data` to the file's write buffer and has full stripes written out. With
    /// `may_wait` false it returns `Ok(false)` instead of waiting, before adding anything.
    fn buffer_write(&self, ino: Ino, rec: &InodeRec, offset: u64, data: WriteData<'_>, may_wait: bool) -> Result<bool> {
        let len = match &data {
            WriteData::Bytes(d) => d.len(),
            WriteData::Shared(d) => d.len(),
        };
        let mut data = Some(data);
        let max = self.cfg.write_buffer_bytes_max;
        let flush_here = loop {
            let fb = {
                let mut map = self.buffers.lock();
                map.entry(ino).or_insert_with(|| Arc::new(FileBuf::new(rec.size, self.stripe_bytes(ino)))).clone()
            };
            let mut b = match may_wait {
                true => fb.state.lock(),
                false => match fb.state.try_lock() {
                    Some(b) => b,
                    None => return Ok(false), // a reader or a flush taking its bytes holds it
                },
            };
            if b.detached {
                // A flush emptied and dropped this buffer after we looked it up.
                continue;
            }
            if let Some(e) = &b.flush_error {
                // Kept for the next flush (commit, close), which must report it too.
                return Err(earlier_write_out(e));
            }
            let after = b.bytes() + len;
            // Without waiting: no flush by this writer (no flush threads), and never as much as
            // the writers' limit below, whether or not a flush is pending yet.
            if !may_wait && after >= max && (self.cfg.write_flush_threads == 0 || after >= 2 * max) {
                return Ok(false);
            }
            if b.is_empty() {
                // Nothing buffered: the committed size is the base (a flush or a truncation
                // may have happened since the buffer, or `rec`, was made).
                b.size = self.load(ino)?.size;
            }
            match data.take().expect("the write is added once") {
                WriteData::Bytes(d) => b.insert(offset, d, self.now()),
                WriteData::Shared(d) => b.insert_shared(offset, d, self.now()),
            }
            if b.bytes() < max {
                break false;
            }
            if self.cfg.write_flush_threads == 0 {
                break true;
            }
            if !b.flush_pending {
                if self.flush_tx.send(ino).is_err() {
                    break true;
                }
                b.flush_pending = true;
            }
            // Bounded memory: a writer faster than the drives waits for room.
            while b.flush_pending && !b.detached && b.bytes() >= 2 * max {
                fb.room.wait(&mut b);
            }
            break false;
        };
        if flush_here {
            self.flush_full_stripes(ino)?;
        }
        Ok(true)
    }

    /// Flushes the write buffer and makes the file's data and metadata durable (fsync).
    pub fn commit(&self, caller: &Caller, ino: Ino) -> Result<()> {
        if self.remote_mutation(&[ino], Mutation::Flush { caller, ino, durable: true })?.is_some() {
            return Ok(());
        }
        self.flush_data_durable(ino)?;
        self.sync_metadata()
    }

    /// Writes the buffer out and fdatasyncs the drives, leaving the metadata log unsynced:
    /// the caller's next synced batch (publish, part record, `sync_metadata`) makes data and
    /// metadata durable with one log fsync instead of two. Data reaches the drives first.
    pub(crate) fn flush_data_durable(&self, ino: Ino) -> Result<()> {
        self.flush(ino, false)?;
        self.data.sync_dirty()
    }

    /// Flushes the write buffer without forcing durability (close).
    pub fn close(&self, caller: &Caller, ino: Ino) -> Result<()> {
        if self.remote_mutation(&[ino], Mutation::Flush { caller, ino, durable: false })?.is_some() {
            return Ok(());
        }
        self.flush(ino, false)
    }

    fn pool_of(&self, _ino: Ino) -> u16 {
        0
    }

    /// Writes out whole stripes from the buffer, keeping a partial tail buffered.
    fn flush_full_stripes(&self, ino: Ino) -> Result<()> {
        let Some(fb) = self.buffer_of(ino) else { return Ok(()) };
        let _flushing = fb.flushing.lock();
        let mut b = fb.state.lock();
        let segs = self.take_for_flush(ino, &mut b);
        if segs.is_empty() {
            return Ok(());
        }
        self.write_taken(ino, &fb, &mut b, segs, false)
    }

    /// Data bytes of a full stripe of `ino`'s pool.
    fn stripe_bytes(&self, ino: Ino) -> usize {
        self.data.pools[self.pool_of(ino) as usize].stripe_data_max() as usize
    }

    /// Whole stripes from the front of each long segment; with none (many small scattered
    /// writes), everything.
    fn take_for_flush(&self, ino: Ino, b: &mut WriteBuffer) -> Vec<Segment> {
        let segs = b.take_full(self.stripe_bytes(ino));
        if segs.is_empty() { b.take_all() } else { segs }
    }

    /// Writes and commits segments just taken from `fb`'s buffer (locked as `b`), unlocking the
    /// buffer meanwhile: writers go on adding to it and readers see the taken bytes as in
    /// flight. The caller holds the file's flush lock.
    fn write_taken(&self, ino: Ino, fb: &FileBuf, b: &mut parking_lot::MutexGuard<'_, WriteBuffer>, segs: Vec<Segment>, durable: bool) -> Result<()> {
        // The size these segments reach, not the buffer's: bytes still buffered (or in a later
        // write-out that fails) must not become part of the committed size before they are
        // written, or a failed write-out would leave the file ending in zeros nobody wrote.
        // The buffer's size covers every write (`overlay_attr`) until it is committed or lost.
        let size = segs.iter().map(|(o, d)| o + d.len() as u64).max().unwrap_or(0);
        b.set_in_flight(&segs);
        fb.room.notify_all();
        let frees = self.data.free_epoch();
        let res = parking_lot::MutexGuard::unlocked(b, || match self.write_segments(ino, &segs, size, durable, &fb.commit) {
            // Blocks freed by deletes become allocatable once their metadata is durable: with
            // the pool full and such frees waiting (or released by another thread's sync
            // since the write began), the log is synced now (releasing them) and the write
            // tried once more, so space a delete just gave back is there to write.
            Err(Error::NoSpace(_)) if self.data.frees_pending() || self.data.free_epoch() != frees => {
                self.sync_metadata()?;
                self.write_segments(ino, &segs, size, durable, &fb.commit)
            }
            res => res,
        });
        b.clear_in_flight();
        if res.is_err() {
            self.forget_failed(ino, b);
        }
        res
    }

    /// A flush thread's turn at `ino`: writes full stripes until less than the buffer limit
    /// is left. A failure is kept for the file's next flush to report.
    fn background_flush(&self, ino: Ino) {
        let Some(fb) = self.buffer_of(ino) else { return };
        let max = self.cfg.write_buffer_bytes_max;
        loop {
            let _flushing = fb.flushing.lock();
            let mut b = fb.state.lock();
            if b.detached || b.flush_error.is_some() || b.bytes() < max {
                b.flush_pending = false;
                fb.room.notify_all();
                return;
            }
            let segs = self.take_for_flush(ino, &mut b);
            if let Err(e) = self.write_taken(ino, &fb, &mut b, segs, false) {
                tracing::error!(ino, "background write-out: {e}");
                b.flush_error = Some(e);
            }
            fb.room.notify_all();
        }
    }

    /// After a failed flush the lost segments must not keep counting towards the size.
    fn forget_failed(&self, ino: Ino, b: &mut WriteBuffer) {
        let committed = self.load(ino).map(|r| r.size).unwrap_or(0);
        b.size = committed.max(b.end());
    }

    /// Writes every buffered byte of `ino` to stripes and commits the extents. Waits for a
    /// running background flush of the file first, and reports its failure if it had one.
    pub(crate) fn flush(&self, ino: Ino, durable: bool) -> Result<()> {
        let Some(fb) = self.buffer_of(ino) else {
            return if durable { self.data.sync_dirty() } else { Ok(()) };
        };
        let _flushing = fb.flushing.lock();
        let mut b = fb.state.lock();
        let earlier = b.flush_error.take();
        let segs = b.take_all();
        let res = if segs.is_empty() {
            // Nothing buffered, but earlier unstable flushes may still be unsynced.
            if durable { self.data.sync_dirty() } else { Ok(()) }
        } else {
            self.write_taken(ino, &fb, &mut b, segs, durable)
        };
        let res = match earlier {
            Some(e) => Err(earlier_write_out(&e)),
            None => res,
        };
        if res.is_ok() && b.is_empty() {
            drop(b);
            let mut map = self.buffers.lock();
            if let Some(x) = map.get(&ino).filter(|x| Arc::ptr_eq(x, &fb)).cloned() {
                let mut xb = x.state.lock();
                if xb.is_empty() {
                    xb.detached = true;
                    x.room.notify_all();
                    drop(xb);
                    map.remove(&ino);
                }
            }
        }
        res
    }

    /// Encodes buffered segments into stripes and commits them in one command. On error the
    /// segments are lost from the buffer and the error is returned to the writer, which has
    /// not been told the data is stable.
    /// `commit` is held exclusively while the extents are committed (readers of the file hold
    /// it shared).
    fn write_segments(&self, ino: Ino, segs: &[Segment], size: u64, durable: bool, commit: &parking_lot::RwLock<()>) -> Result<()> {
        let rec = self.load(ino)?;
        let end = segs.iter().map(|(o, d)| o + d.len() as u64).max().unwrap_or(0).max(size);
        if rec.storage == Storage::Inline && end <= self.cfg.inline_bytes_max {
            let mut data = self.db.get_cf(self.cf(CF_INLINE), be64(ino))?.unwrap_or_default();
            let data_end = segs.iter().map(|(o, d)| o + d.len() as u64).max().unwrap_or(0);
            if (data.len() as u64) < data_end {
                data.resize(data_end as usize, 0);
            }
            for (o, d) in segs {
                data[*o as usize..*o as usize + d.len()].copy_from_slice(d);
            }
            let cmd = Command::WriteExtents { ino, extents: vec![], inline: Some(data), size_at_least: size, now: self.now() };
            let _committing = commit.write();
            return self.execute(cmd, durable).map(|_| ());
        }
        let merged: Vec<Segment>;
        let mut segs = segs;
        if rec.storage == Storage::Inline {
            // Moving out of metadata: the inline bytes become the first extent's data.
            if let Some(old) = self.db.get_cf(self.cf(CF_INLINE), be64(ino))? {
                let mut wb = WriteBuffer::new(0);
                wb.insert(0, &old, 0);
                for (o, d) in segs {
                    wb.insert(*o, d, 0);
                }
                merged = wb.take_all();
                segs = &merged;
            }
        }
        let pool = self.pool_of(ino);
        let stripe_max = self.data.pools[pool as usize].stripe_data_max() as usize;
        let mut extents = Vec::new();
        let mut in_flight = std::collections::VecDeque::new();
        let mut failure = None;
        // Up to STRIPES_IN_FLIGHT_MAX stripes have their shard writes outstanding at once, so
        // encoding the next stripe overlaps the drives writing the previous ones.
        'outer: for (off, d) in segs {
            for (i, start) in (0..d.len()).step_by(stripe_max).enumerate() {
                let chunk = start..(start + stripe_max).min(d.len());
                if in_flight.len() >= STRIPES_IN_FLIGHT_MAX {
                    let (o, ps) = in_flight.pop_front().expect("non-empty");
                    match self.data.finish_stripe(ps) {
                        Ok(rec) => extents.push((o, self.alloc_stripe_id(), rec)),
                        Err(e) => {
                            failure = Some(e);
                            break 'outer;
                        }
                    }
                }
                match self.data.start_stripe(pool, d, chunk) {
                    Ok(ps) => in_flight.push_back((off + (i * stripe_max) as u64, ps)),
                    Err(e) => {
                        failure = Some(e);
                        break 'outer;
                    }
                }
            }
        }
        for (o, ps) in in_flight {
            match self.data.finish_stripe(ps) {
                Ok(rec) => extents.push((o, self.alloc_stripe_id(), rec)),
                Err(e) => failure = Some(failure.unwrap_or(e)),
            }
        }
        if failure.is_none() && durable {
            // Also covers stripes of this file's earlier unstable flushes.
            if let Err(e) = self.data.sync_dirty() {
                failure = Some(e);
            }
        }
        if let Some(e) = failure {
            for (_, _, rec) in &extents {
                self.data.free_now(rec);
            }
            return Err(e);
        }
        let written: Vec<StripeRec> = extents.iter().map(|(_, _, r)| r.clone()).collect();
        let cmd = Command::WriteExtents { ino, extents, inline: None, size_at_least: size, now: self.now() };
        let committed = {
            let _committing = commit.write();
            self.execute(cmd, durable)
        };
        match committed {
            Ok(_) => Ok(()),
            Err(e) => {
                for s in &written {
                    self.data.free_now(s);
                }
                Err(e)
            }
        }
    }

    // ---------------------------------------------------------------- objects (put-whole)

    /// Starts an atomic whole-file write: an unnamed file in `parent` that `finish_put`
    /// publishes under `name` (replacing what is there) and `abort_put` deletes. A crash
    /// before publishing leaves nothing visible; the orphan is reclaimed at the next start.
    pub fn begin_put(&self, caller: &Caller, parent: Ino, mode: u32) -> Result<Attr> {
        self.remote_mutation(&[parent], Mutation::Stage { caller, parent })?;
        let cmd = Command::Create {
            caller: caller.clone(),
            parent,
            name: vec![],
            kind: FileKind::File,
            mode,
            ino: self.alloc_ino(),
            generation: rand::random(),
            now: self.now(),
            target: vec![],
            rdev: 0,
            exclusive: true,
            orphan: true,
        };
        Ok(self.execute(cmd, false)?.expect("create returns attributes"))
    }

    /// Publishes a staged file under `name`, durably.
    pub fn finish_put(&self, caller: &Caller, ino: Ino, parent: Ino, name: &[u8]) -> Result<Attr> {
        if let Some(done) = self.remote_mutation(&[parent], Mutation::Publish { caller, staged: ino, parent, name })? {
            return done.ok_or_else(|| Error::Io("portal publish returned no attributes".into()));
        }
        self.flush_data_durable(ino)?;
        let cmd = Command::Publish { caller: caller.clone(), ino, parent, name: name.to_vec(), now: self.now() };
        Ok(self.execute(cmd, true)?.expect("publish returns attributes"))
    }

    /// Creates `name` in `parent` with `data` as its whole content and the extended
    /// attributes `xattrs` gives for the new file's size and modification time, in place of
    /// a file of that name, as one durable command: a small upload without staging, writing
    /// and publishing one after another. `Ok(None)`, with nothing done, when `data` is over
    /// the inline limit or `parent` is part of a portal (whose hub publishes): stage and
    /// publish instead.
    pub fn put_inline(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32, data: &[u8], xattrs: impl FnOnce(u64, i64) -> Vec<(Vec<u8>, Vec<u8>)>) -> Result<Option<Attr>> {
        if data.len() as u64 > self.cfg.inline_bytes_max || self.is_mirrored(caller, parent)? {
            return Ok(None);
        }
        let cmd = self.put_inline_command(caller, parent, name, mode, data, xattrs)?;
        self.execute(cmd, true)
    }

    /// Files up to this size are stored inside metadata (`put_inline` stores nothing larger).
    pub fn inline_bytes_max(&self) -> u64 {
        self.cfg.inline_bytes_max
    }

    /// `put_inline` for callers on an event loop, without the log sync: the caller makes it
    /// durable with [`durable`](Self::durable) before it answers. `None`, with nothing
    /// stored, where `put_inline` would store nothing (too large) or it would wait: the
    /// engine holds portal mirrors, another mutation holds the mutation lock, or RocksDB
    /// stalls writes.
    pub fn try_put_inline(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32, data: &[u8], xattrs: impl FnOnce(u64, i64) -> Vec<(Vec<u8>, Vec<u8>)>) -> Option<Result<Attr>> {
        if data.len() as u64 > self.cfg.inline_bytes_max || self.holds_mirrors() {
            return None;
        }
        let cmd = match self.put_inline_command(caller, parent, name, mode, data, xattrs) {
            Ok(cmd) => cmd,
            Err(e) => return Some(Err(e)),
        };
        self.try_execute(cmd).map(|r| r.map(|a| a.expect("put_inline returns attributes")))
    }

    fn put_inline_command(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32, data: &[u8], xattrs: impl FnOnce(u64, i64) -> Vec<(Vec<u8>, Vec<u8>)>) -> Result<Command> {
        let now = self.now();
        let xattrs = xattrs(data.len() as u64, now);
        for (n, _) in &xattrs {
            check_reserved_xattr(caller, n)?;
        }
        Ok(Command::PutInline {
            caller: caller.clone(),
            parent,
            name: name.to_vec(),
            mode,
            ino: self.alloc_ino(),
            generation: rand::random(),
            data: data.to_vec(),
            xattrs,
            now,
        })
    }

    pub fn abort_put(&self, _caller: &Caller, ino: Ino) -> Result<()> {
        self.drop_buffer(ino);
        self.execute(Command::DeleteOrphan { ino }, false).map(|_| ())
    }

    /// Deletes unpublished files left by a crash (put-whole staging that never finished).
    fn reclaim_orphans(&self) -> Result<()> {
        let mut live = crate::objects::upload_parts(self)?;
        live.extend(crate::versions::version_inos(self)?);
        live.extend(self.remote_cache_inos()?);
        let mut victims = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_ORPHANS), IteratorMode::Start) {
            let (k, _) = kv?;
            let ino = read_be64(&k)?;
            if !live.contains(&ino) {
                victims.push(ino);
            }
        }
        for ino in &victims {
            self.execute(Command::DeleteOrphan { ino: *ino }, false)?;
        }
        if !victims.is_empty() {
            tracing::info!(count = victims.len(), "reclaimed unfinished uploads");
        }
        Ok(())
    }

    pub(crate) fn create_orphan(&self, caller: &Caller, parent: Ino) -> Result<Attr> {
        self.begin_put(caller, parent, 0o644)
    }

    pub(crate) fn concat(&self, ino: Ino, parts: Vec<Ino>) -> Result<Attr> {
        for p in &parts {
            self.flush(*p, false)?;
        }
        self.data.sync_dirty()?;
        Ok(self.execute(Command::Concat { ino, parts, now: self.now() }, true)?.expect("attributes"))
    }

    /// Marks an empty staged file as extent-stored (the target of a concatenation).
    pub(crate) fn force_extents(&self, ino: Ino) -> Result<()> {
        let _g = self.mutate.lock();
        let mut rec = self.load(ino)?;
        rec.storage = Storage::Extents;
        let mut batch = WriteBatch::default();
        self.put_inode(&mut batch, ino, &rec);
        self.db.write(batch)?;
        Ok(())
    }

    // ---------------------------------------------------------------- drives, health

    pub fn drives(&self) -> Vec<DriveInfo> {
        let drives = self.data.drives.read();
        let alloc = self.data.alloc.lock();
        drives
            .iter()
            .map(|d| DriveInfo {
                index: d.index,
                path: d.path.clone(),
                uuid: uuid::Uuid::from_bytes(d.uuid).to_string(),
                epoch: d.epoch,
                pool: self.data.pools.get(d.pool as usize).map(|p| p.name.clone()).unwrap_or_default(),
                state: d.state.clone(),
                backend: d.dev.as_ref().map(|x| format!("{:?}", x.backend())).unwrap_or_else(|| "none".into()),
                capacity_bytes: d.capacity_bytes,
                used_bytes: alloc[d.index as usize].used,
                read_errors: d.counters.read_errors.load(Ordering::Relaxed),
                write_errors: d.counters.write_errors.load(Ordering::Relaxed),
                checksum_errors: d.counters.checksum_errors.load(Ordering::Relaxed),
                repaired_shards: d.counters.repaired_shards.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// What the data cache holds and how often it answered reads.
    pub fn data_cache_stats(&self) -> crate::cache::DataCacheStats {
        self.data.cache.stats()
    }

    /// Empties the data cache: the next reads go to the drives.
    pub fn clear_data_cache(&self) {
        self.data.cache.clear();
    }

    pub fn pools(&self) -> Vec<PoolInfo> {
        let alloc = self.data.alloc.lock();
        self.data
            .pools
            .iter()
            .map(|p| PoolInfo {
                name: p.name.clone(),
                data_shards: p.k,
                parity_shards: p.m,
                drives: p.drives.clone(),
                raw_capacity_bytes: p.drives.iter().map(|d| alloc[*d as usize].capacity).sum(),
                raw_used_bytes: p.drives.iter().map(|d| alloc[*d as usize].used).sum(),
            })
            .collect()
    }

    pub fn health(&self) -> Health {
        let drives = self.drives();
        let mut notes = vec![
            "metadata is kept on one local directory without replication: it is a single point of failure".to_string(),
        ];
        let mut state = "ok";
        for p in &self.data.pools {
            let down = p.drives.iter().filter(|d| drives[**d as usize].state != DriveState::Online).count();
            if down > p.m {
                state = "failed";
                notes.push(format!("pool {}: {down} drives down, more than its {} parity shards: some data is unavailable", p.name, p.m));
            } else if down > 0 {
                if state == "ok" {
                    state = "degraded";
                }
                notes.push(format!("pool {}: {down} of {} drives down; redundancy reduced until rebuild", p.name, p.drives.len()));
            }
        }
        if self.closed.load(Ordering::Acquire) {
            state = "failed";
            notes.push("engine is shut down".into());
        }
        Health { state, drives, notes }
    }

    /// Replaces drive `index` with a new (or the same, reformatted) file or device at `path`
    /// and starts a rebuild job onto it. Returns the job id.
    pub fn replace_drive(self: &Arc<Self>, caller: &Caller, index: u32, path: Option<PathBuf>, create_bytes: Option<u64>) -> Result<u64> {
        if caller.role < Role::Operator {
            return Err(Error::PermissionDenied);
        }
        let (old_path, old_epoch, pool, old_cap) = {
            let drives = self.data.drives.read();
            let d = drives.get(index as usize).ok_or(Error::NotFound)?;
            (d.path.clone(), d.epoch, d.pool, d.capacity_bytes)
        };
        let path = path.unwrap_or(old_path);
        if path.exists() {
            // Reusing a file in place: only when it is not a healthy member.
            let drives = self.data.drives.read();
            let d = &drives[index as usize];
            if d.path == path && d.state == DriveState::Online {
                return Err(Error::Busy(format!("drive {index} is online; take it out before replacing it in place")));
            }
        } else {
            let bytes = create_bytes.unwrap_or(old_cap);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::Io(format!("create {}: {e}", parent.display())))?;
            }
            hardware::create_file_drive(&path, bytes).map_err(|e| Error::Io(format!("create drive {}: {e}", path.display())))?;
        }
        let mut dev = hardware::open_drive(&path, &self.cfg.drive_open).map_err(|e| Error::Io(format!("open drive {}: {e}", path.display())))?;
        if let Some(w) = &self.cfg.drive_wrapper {
            dev = w(index, dev);
        }
        let epoch = old_epoch + 1;
        let uuid = *uuid::Uuid::new_v4().as_bytes();
        let sb = Superblock { drive_uuid: uuid, cluster_uuid: self.cluster_uuid, drive_index: index, epoch, capacity_bytes: dev.capacity_bytes() };
        dev.write(0, sb.encode())
            .wait()
            .and_then(|_| dev.sync().wait())
            .map_err(|e| Error::Io(format!("write superblock to {}: {e}", path.display())))?;
        {
            let _g = self.mutate.lock();
            let mut wo = WriteOptions::default();
            wo.set_sync(true);
            let mut batch = WriteBatch::default();
            batch.put_cf(self.cf(CF_SYSTEM), format!("{KEY_DRIVE_PREFIX}{index:04}"), encode_drive(&path, &uuid, epoch, pool, dev.capacity_bytes()));
            self.db.write_opt(batch, &wo)?;
            let mut drives = self.data.drives.write();
            let mut alloc = self.data.alloc.lock();
            let d = &mut drives[index as usize];
            d.path = path;
            d.uuid = uuid;
            d.epoch = epoch;
            d.capacity_bytes = dev.capacity_bytes();
            d.state = DriveState::Rebuilding;
            d.dev = Some(dev.clone());
            d.counters = Default::default();
            alloc[index as usize] = crate::data::Allocator::new(dev.capacity_bytes());
        }
        tracing::info!(drive = index, epoch, "drive replaced; rebuilding");
        crate::jobs::start(self, caller, crate::jobs::JobKind::Rebuild { drive: index })
    }

    /// Marks a drive failed (operator action, or a test pulling a drive).
    pub fn fail_drive(&self, caller: &Caller, index: u32, reason: &str) -> Result<()> {
        if caller.role < Role::Operator {
            return Err(Error::PermissionDenied);
        }
        let mut drives = self.data.drives.write();
        let d = drives.get_mut(index as usize).ok_or(Error::NotFound)?;
        d.state = DriveState::Failed(reason.to_string());
        Ok(())
    }

    /// Flushes every write buffer, syncs metadata, stops background work and waits for the
    /// engine's threads (after it, only callers hold the engine). Idempotent.
    pub fn shutdown(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.jobs.stop_all();
        let inos: Vec<Ino> = self.buffers.lock().keys().copied().collect();
        for ino in inos {
            if let Err(e) = self.flush(ino, false) {
                tracing::error!(ino, "flush at shutdown: {e}");
            }
        }
        self.data.sync_dirty()?;
        self.sync_metadata()?;
        for d in self.data.drives.read().iter() {
            if let Some(dev) = &d.dev {
                let _ = dev.sync().wait();
            }
        }
        self.closed.store(true, Ordering::Release);
        self.stop_sync_thread();
        // The flush threads end at the next file they are handed (the engine is closed):
        // one wake-up each, then wait for them, so that none holds the engine afterwards.
        let flushers = std::mem::take(&mut *self.flush_threads.lock());
        for _ in &flushers {
            let _ = self.flush_tx.send(ROOT_INO);
        }
        for h in flushers {
            let _ = h.join();
        }
        tracing::info!("storage engine shut down");
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.jobs.stop_all();
        // Before the fields go: the thread's references to the database are gone when
        // RocksDB closes here.
        self.stop_sync_thread();
    }
}

/// Whether logs of `needed` bytes in all may be written out for reuse on a filesystem with
/// `available` bytes left: at most a quarter of it.
fn log_reuse_fits(needed: u64, available: u64) -> bool {
    needed <= available / 4
}

/// Makes everything committed before the call durable (one sync shared by concurrent
/// callers), then makes the blocks freed before it allocatable.
fn sync_log(group: &crate::group_sync::GroupSync, db: &DB, data: &DataStore) -> Result<()> {
    group.sync(|| {
        let mark = data.pending_mark();
        db.flush_wal(true)?;
        data.release_pending(mark);
        Ok(())
    })
}

/// What a write or flush reports when an earlier background write-out of the file failed
/// with `e`: an error of the same kind where the client can act on it (a full pool, a
/// read-only one, data unavailable), so that NFS, SMB and SFTP clients see "no space" rather
/// than a bare I/O error when the pool filled under unstable writes; an I/O error otherwise.
fn earlier_write_out(e: &Error) -> Error {
    let msg = format!("an earlier write-out of this file failed: {e}");
    match e {
        Error::NoSpace(_) => Error::NoSpace(msg),
        Error::ReadOnly(_) => Error::ReadOnly(msg),
        Error::Unavailable(_) => Error::Unavailable(msg),
        _ => Error::Io(msg),
    }
}

/// The bytes of a write: borrowed (copied into the write buffer) or a buffer handed over.
enum WriteData<'a> {
    Bytes(&'a [u8]),
    Shared(Arc<AlignedBuf>),
}

fn encode_drive(path: &Path, uuid: &[u8; 16], epoch: u32, pool: u16, capacity: u64) -> Vec<u8> {
    let mut e = Enc::new(1);
    e.bytes(path.as_os_str().as_encoded_bytes()).0.extend_from_slice(uuid);
    e.u32(epoch).u16(pool).u64(capacity);
    e.finish()
}

fn decode_drive(v: &[u8]) -> Result<(PathBuf, [u8; 16], u32, u16, u64)> {
    let mut d = Dec::new(v, "drive", 1)?;
    let path = PathBuf::from(utf8(d.bytes()?, "drive path")?);
    let uuid = d.fixed::<16>()?;
    let r = (path, uuid, d.u32()?, d.u16()?, d.u64()?);
    d.end()?;
    Ok(r)
}

/// `v` as buffers of `chunk_bytes` each (the last one shorter); one copy only when `v` is
/// longer than a chunk.
fn split_chunks(v: Vec<u8>, chunk_bytes: usize) -> Vec<Vec<u8>> {
    if v.is_empty() {
        Vec::new()
    } else if v.len() <= chunk_bytes {
        vec![v]
    } else {
        v.chunks(chunk_bytes).map(<[u8]>::to_vec).collect()
    }
}
