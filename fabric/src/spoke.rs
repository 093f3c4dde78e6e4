//! The spoke's side of a portal: mirror inodes filled on demand from the hub, under a lease.
//!
//! Coherence (docs/rfcs/0002-portals.md):
//! - The spoke serves a mirror inode only while it holds a lease from the hub (renewed
//!   continuously) and the inode is *verified*: fetched or confirmed on the current
//!   connection and not invalidated since.
//! - The hub pushes an invalidation, with the new version, for every change to an inode it
//!   has told this spoke about. Answers older than the newest version an invalidation named
//!   are discarded, so a reply overtaken by an invalidation cannot re-verify stale data.
//! - A new connection (after a cut) makes everything unverified at once (a generation bump):
//!   invalidations sent while the link was down are lost, so nothing is trusted unchecked.
//! - With the lease expired, clients get `Unavailable` rather than possibly stale bytes,
//!   unless the portal is set to serve stale (then each stale answer is audit-logged).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use storage_engine::{
    Attr, Caller, Clock, Engine, Error, FileKind, Ino, Mutation, Need, RemoteAttr, RemoteStub, Result, Stability, Verdict,
};

use crate::chunks::{self, ChunkRef, Hash};
use crate::proto::*;

/// Chunk bytes asked for in one request.
pub const FETCH_REQUEST_BYTES: u64 = 4 << 20;
/// Chunk requests of one fill in flight at once (each up to FETCH_REQUEST_BYTES).
pub const FETCH_REQUESTS_IN_FLIGHT: usize = 8;
/// Files at most this large are fetched whole on first read.
pub const WHOLE_FILE_BELOW_BYTES: u64 = 4 << 20;
/// Bytes of superseded file versions kept for chunk reuse (deduplication across versions).
pub const RETIRED_CACHE_BYTES_MAX: u64 = 2 << 30;
/// Files after a small file (in name order) fetched ahead when it is read: training jobs that
/// do not shuffle read samples in directory order.
pub const SUCCESSORS_AHEAD: usize = 32;
/// Bytes of the next file fetched ahead when a large file (a shard) is half read.
pub const NEXT_FILE_HEAD_BYTES: u64 = 8 << 20;
/// Manifests kept on the spoke.
const MANIFESTS_MAX: usize = 4096;
/// Attempts before an answer that keeps being overtaken by changes is given up.
const ATTEMPTS_MAX: usize = 5;

/// The spoke's way to the hub: a request, answered or failed (`Err` = the link is down).
pub trait Link: Send + Sync {
    fn call(&self, req: Request) -> std::result::Result<Response, String>;
    /// Changes whenever a new connection replaces the old one.
    fn epoch(&self) -> u64;
}

/// Counters of one portal (also the benchmark's WAN byte count).
#[derive(Default, Debug)]
pub struct SpokeStats {
    pub wire_bytes: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub fetched_chunks: AtomicU64,
    pub reused_bytes: AtomicU64,
    pub reused_chunks: AtomicU64,
    pub requests: AtomicU64,
    pub refused_stale: AtomicU64,
    pub served_stale: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub prefetched_bytes: AtomicU64,
}

impl SpokeStats {
    pub fn to_json(&self) -> serde_json::Value {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "wire_bytes": g(&self.wire_bytes),
            "fetched_bytes": g(&self.fetched_bytes),
            "fetched_chunks": g(&self.fetched_chunks),
            "reused_bytes": g(&self.reused_bytes),
            "reused_chunks": g(&self.reused_chunks),
            "requests": g(&self.requests),
            "refused_stale": g(&self.refused_stale),
            "served_stale": g(&self.served_stale),
            "evicted_bytes": g(&self.evicted_bytes),
            "prefetched_bytes": g(&self.prefetched_bytes),
        })
    }
}

#[derive(Default)]
struct Coherence {
    lease_until_ns: i64,
    lease_ms: u64,
    /// Bumped by every new connection: verifications of older generations do not count.
    generation: u64,
    epoch_seen: u64,
    verified: HashMap<Ino, u64>,
    min_version: HashMap<Ino, u64>,
    link_down_since_ns: Option<i64>,
}

/// Where chunk bytes are held locally: hash → (cache file, offset, length).
#[derive(Default)]
struct ChunkIndex {
    at: HashMap<Hash, (Ino, u64, u32)>,
    of_cache: HashMap<Ino, Vec<Hash>>,
    retired: VecDeque<(Ino, u64)>,
    retired_bytes: u64,
}

impl ChunkIndex {
    fn add(&mut self, cache: Ino, c: &ChunkRef) {
        self.at.insert(c.hash, (cache, c.offset, c.len));
        self.of_cache.entry(cache).or_default().push(c.hash);
    }
    fn drop_cache(&mut self, cache: Ino) {
        for h in self.of_cache.remove(&cache).unwrap_or_default() {
            if self.at.get(&h).is_some_and(|(c, _, _)| *c == cache) {
                self.at.remove(&h);
            }
        }
    }
}

/// Cache use, for eviction: mirror inode → (last use, bytes present).
#[derive(Default)]
struct Lru {
    used: HashMap<Ino, (i64, u64)>,
    bytes: u64,
}

/// Byte spans of one file being fetched right now, and a condition to wait for them.
#[derive(Default)]
struct FillState {
    inflight: Vec<(u64, u64)>,
}

type FillSlot = Arc<(Mutex<FillState>, parking_lot::Condvar)>;

/// A file's fill slot while someone uses it. The last user to let go takes it out of the
/// table, so the table holds only files being filled, evicted or pushed right now.
struct SlotRef<'a> {
    table: &'a Mutex<HashMap<Ino, FillSlot>>,
    ino: Ino,
    slot: FillSlot,
}

impl std::ops::Deref for SlotRef<'_> {
    type Target = (Mutex<FillState>, parking_lot::Condvar);

    fn deref(&self) -> &Self::Target {
        &self.slot
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        let mut table = self.table.lock();
        // Two references: the table's and this one. Nobody else can take one meanwhile,
        // since taking one needs the table's lock.
        if Arc::strong_count(&self.slot) == 2 && table.get(&self.ino).is_some_and(|s| Arc::ptr_eq(s, &self.slot)) {
            table.remove(&self.ino);
        }
    }
}

/// Settings of a spoke portal.
#[derive(Debug, Clone)]
pub struct SpokeSettings {
    pub id: String,
    pub mode: PortalMode,
    pub serve_stale: bool,
    /// Evict least recently used cached files above this many bytes.
    pub cache_bytes_max: u64,
    /// Evict while the engine has less than this share of its capacity free.
    pub free_percent_min: u8,
    /// The local directory the portal shows (0: unknown; successor prefetch is then off).
    pub local_root: Ino,
}

/// Prefetch work the spoke hands to whoever runs it (a thread pool in the daemon).
pub type PrefetchSpawner = Arc<dyn Fn(Box<dyn FnOnce() + Send>) + Send + Sync>;

pub struct SpokePortal {
    pub settings: parking_lot::RwLock<SpokeSettings>,
    engine: Arc<Engine>,
    link: parking_lot::RwLock<Option<Arc<dyn Link>>>,
    clock: Arc<dyn Clock>,
    co: Mutex<Coherence>,
    manifests: Mutex<(HashMap<(Ino, u64), Arc<Vec<ChunkRef>>>, VecDeque<(Ino, u64)>)>,
    index: Mutex<ChunkIndex>,
    fill_locks: Mutex<HashMap<Ino, FillSlot>>,
    lru: Mutex<Lru>,
    prefetcher: Mutex<neuralcache::Prefetcher>,
    spawner: Option<PrefetchSpawner>,
    /// Successor fetches started and not finished.
    successors_asked: Mutex<std::collections::HashSet<Ino>>,
    /// Mirror files (read-write portals) with local writes not yet sent to the hub.
    dirty: Mutex<std::collections::HashSet<Ino>>,
    pub stats: SpokeStats,
    closed: AtomicBool,
}

fn unavailable(id: &str, what: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("portal {id}: {what}"))
}

fn hub_error(id: &str, code: ErrorCode, message: &str) -> Error {
    match code {
        ErrorCode::NotFound => Error::NotFound,
        ErrorCode::Stale => Error::Stale,
        ErrorCode::PermissionDenied | ErrorCode::Residency | ErrorCode::NotAuthorized => Error::PermissionDenied,
        ErrorCode::ReadOnly => Error::ReadOnly(format!("portal {id}: {message}")),
        ErrorCode::Exists => Error::Exists,
        ErrorCode::NotEmpty => Error::NotEmpty,
        ErrorCode::BadRequest => Error::InvalidArgument(format!("portal {id}: hub says: {message}")),
        ErrorCode::Internal => Error::Io(format!("portal {id}: hub says: {message}")),
    }
}

pub(crate) fn remote_attr(e: &Entry) -> RemoteAttr {
    RemoteAttr {
        mode: e.mode,
        uid: e.uid,
        gid: e.gid,
        size: e.size,
        atime_ns: e.atime_ns,
        mtime_ns: e.mtime_ns,
        ctime_ns: e.ctime_ns,
        btime_ns: e.btime_ns,
    }
}

fn kind_matches(k: FileKind, e: EntryKind) -> bool {
    matches!((k, e), (FileKind::File, EntryKind::File) | (FileKind::Dir, EntryKind::Dir) | (FileKind::Symlink, EntryKind::Symlink))
}

fn child_path(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() {
        name.to_vec()
    } else {
        let mut p = parent.to_vec();
        p.push(b'/');
        p.extend_from_slice(name);
        p
    }
}

impl SpokePortal {
    pub fn new(engine: Arc<Engine>, settings: SpokeSettings, clock: Arc<dyn Clock>, spawner: Option<PrefetchSpawner>) -> Arc<SpokePortal> {
        let p = Arc::new(SpokePortal {
            settings: parking_lot::RwLock::new(settings),
            engine,
            link: parking_lot::RwLock::new(None),
            clock,
            co: Mutex::new(Coherence::default()),
            manifests: Mutex::new((HashMap::new(), VecDeque::new())),
            index: Mutex::new(ChunkIndex::default()),
            fill_locks: Mutex::new(HashMap::new()),
            lru: Mutex::new(Lru::default()),
            prefetcher: Mutex::new(neuralcache::Prefetcher::new(neuralcache::PrefetchConfig {
                whole_file_below_bytes: WHOLE_FILE_BELOW_BYTES,
                // Across a WAN a window smaller than one request only adds round trips.
                readahead_min_bytes: FETCH_REQUEST_BYTES,
                request_bytes_max: FETCH_REQUEST_BYTES,
                ..neuralcache::PrefetchConfig::default()
            })),
            spawner,
            successors_asked: Mutex::new(std::collections::HashSet::new()),
            dirty: Mutex::new(std::collections::HashSet::new()),
            stats: SpokeStats::default(),
            closed: AtomicBool::new(false),
        });
        p.load_cache_state();
        p
    }

    pub fn id(&self) -> String {
        self.settings.read().id.clone()
    }

    fn caller() -> Caller {
        Caller::portal()
    }

    /// Rebuilds cache accounting from the stubs at start (chunk locations are not kept
    /// across restarts: chunks are re-fetched or found again by later manifests).
    fn load_cache_state(&self) {
        let id = self.id();
        let Ok(stubs) = self.engine.remote_stubs() else { return };
        let now = self.clock.now_ns();
        let mut lru = self.lru.lock();
        for (ino, s) in stubs.into_iter().filter(|(_, s)| s.portal == id && s.cache_ino != 0) {
            let b = s.present_bytes();
            lru.used.insert(ino, (now, b));
            lru.bytes += b;
        }
    }

    pub fn set_link(&self, link: Option<Arc<dyn Link>>) {
        *self.link.write() = link;
    }

    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.set_link(None);
    }

    // ------------------------------------------------------------ link, lease, coherence

    pub(crate) fn call(&self, req: Request) -> Result<Response> {
        let id = self.id();
        let link = self.link.read().clone().ok_or_else(|| unavailable(&id, "not connected to the hub"))?;
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        // A new connection may have lost invalidations: nothing verified before it counts.
        // Checked before the call and again after it, since the answer may have come on a
        // connection made during the call.
        let new_epoch = |epoch: u64| {
            let mut co = self.co.lock();
            if co.epoch_seen != epoch {
                co.epoch_seen = epoch;
                co.generation += 1;
                co.verified.clear();
            }
        };
        new_epoch(link.epoch());
        let answer = link.call(req);
        new_epoch(link.epoch());
        match answer {
            Ok(Response::Error { code, message }) => Err(hub_error(&id, code, &message)),
            Ok(r) => {
                self.co.lock().link_down_since_ns = None;
                Ok(r)
            }
            Err(e) => {
                let now = self.clock.now_ns();
                self.co.lock().link_down_since_ns.get_or_insert(now);
                Err(unavailable(&id, format!("hub unreachable: {e}")))
            }
        }
    }

    /// Asks the hub for a lease; it runs from when the request was sent.
    pub fn renew(&self) -> Result<()> {
        let sent = self.clock.now_ns();
        match self.call(Request::Renew)? {
            Response::Lease { lease_ms } => {
                let mut co = self.co.lock();
                co.lease_ms = lease_ms;
                co.lease_until_ns = co.lease_until_ns.max(sent + (lease_ms as i64) * 1_000_000);
                Ok(())
            }
            r => Err(unavailable(&self.id(), format!("unexpected answer to a lease renewal: {r:?}"))),
        }
    }

    /// The lease length the hub grants (0 before the first renewal).
    pub fn lease_ms(&self) -> u64 {
        self.co.lock().lease_ms
    }

    pub fn lease_remaining_ms(&self) -> i64 {
        let co = self.co.lock();
        ((co.lease_until_ns - self.clock.now_ns()) / 1_000_000).max(0)
    }

    pub fn link_down_since_ns(&self) -> Option<i64> {
        self.co.lock().link_down_since_ns
    }

    /// The hub says these inodes changed (to these versions).
    pub fn on_invalidate(&self, changes: &[(Ino, u64)]) {
        let mut co = self.co.lock();
        for &(h, v) in changes {
            co.verified.remove(&h);
            let m = co.min_version.entry(h).or_insert(0);
            *m = (*m).max(v);
        }
    }

    /// May mirror data be served now? Renews the lease on the spot when it ran out.
    fn check_lease(&self) -> Result<bool> {
        let now = self.clock.now_ns();
        if now < self.co.lock().lease_until_ns {
            return Ok(true);
        }
        if self.renew().is_ok() {
            return Ok(true);
        }
        if self.settings.read().serve_stale {
            return Ok(false);
        }
        self.stats.refused_stale.fetch_add(1, Ordering::Relaxed);
        let down = self.co.lock().link_down_since_ns.map(|t| (now - t) / 1_000_000_000).unwrap_or(0);
        Err(unavailable(&self.id(), format!("no lease from the hub (link down for {down} s); cached data may be stale and is not served")))
    }

    fn is_verified(&self, hub_ino: Ino) -> bool {
        let co = self.co.lock();
        co.verified.get(&hub_ino) == Some(&co.generation)
    }

    /// Marks `hub_ino` verified at `version` if nothing newer was announced meanwhile.
    fn mark_verified(&self, hub_ino: Ino, version: u64, generation: u64) -> bool {
        let mut co = self.co.lock();
        if co.generation != generation || co.min_version.get(&hub_ino).is_some_and(|m| *m > version) {
            return false;
        }
        co.verified.insert(hub_ino, generation);
        true
    }

    fn generation(&self) -> u64 {
        self.co.lock().generation
    }

    fn min_version(&self, hub_ino: Ino) -> u64 {
        self.co.lock().min_version.get(&hub_ino).copied().unwrap_or(0)
    }

    fn stale_served(&self, ino: Ino) {
        self.stats.served_stale.fetch_add(1, Ordering::Relaxed);
        let _ = self.engine.audit("fabric", "fabric", "portal.serve_stale", &format!("portal {} inode {ino}", self.id()), "served without a lease");
    }

    // ------------------------------------------------------------ serving

    pub fn ensure(self: &Arc<Self>, ino: Ino, stub: &RemoteStub, need: Need) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(unavailable(&stub.portal, "the portal is closed"));
        }
        let leased = self.check_lease()?;
        match need {
            Need::Attr => {
                if !self.is_verified(stub.hub_ino) {
                    self.revalidate_or_stale(ino, stub, leased)?;
                }
                Ok(())
            }
            Need::Listing => {
                if !self.is_verified(stub.hub_ino) {
                    self.revalidate_or_stale(ino, stub, leased)?;
                }
                let stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
                if !stub.listed {
                    if !leased {
                        return Err(unavailable(&stub.portal, "directory never listed and no lease"));
                    }
                    self.fetch_listing(ino, &stub)?;
                }
                Ok(())
            }
            Need::Data { offset, len } => {
                self.fill(ino, offset, len, !leased)?;
                self.after_access(ino, stub, offset, len);
                Ok(())
            }
        }
    }

    fn revalidate_or_stale(&self, ino: Ino, stub: &RemoteStub, leased: bool) -> Result<()> {
        match self.revalidate(ino, stub) {
            Ok(()) => Ok(()),
            Err(Error::Unavailable(m)) if !leased || self.settings.read().serve_stale => {
                if self.settings.read().serve_stale {
                    self.stale_served(ino);
                    Ok(())
                } else {
                    Err(Error::Unavailable(m))
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Asks the hub what is at this inode's path now and applies it.
    fn revalidate(&self, ino: Ino, stub: &RemoteStub) -> Result<()> {
        for _ in 0..ATTEMPTS_MAX {
            let generation = self.generation();
            let e = match self.call(Request::GetAttr { path: split_path(&stub.path) })? {
                Response::Attr(e) => e,
                r => return Err(unavailable(&stub.portal, format!("unexpected answer {r:?}"))),
            };
            if e.version < self.min_version(e.hub_ino) {
                continue; // overtaken by a change
            }
            let rec = self.engine.getattr(&Self::caller(), ino)?;
            if e.hub_ino != stub.hub_ino || !kind_matches(rec.kind, e.kind) {
                // Replaced on the hub under the same name: the parent's listing decides.
                return Err(Error::Stale);
            }
            let mut stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
            if e.version != stub.hub_version {
                self.apply_new_version(ino, &mut stub, &e)?;
            }
            if self.mark_verified(e.hub_ino, e.version, generation) {
                return Ok(());
            }
        }
        Err(unavailable(&stub.portal, "changes on the hub kept overtaking revalidation"))
    }

    /// A newer version of a mirror inode: new attributes; files drop their cached bytes
    /// (kept aside for chunk reuse), directories are listed again.
    fn apply_new_version(&self, ino: Ino, stub: &mut RemoteStub, e: &Entry) -> Result<()> {
        self.engine.remote_set_attr(&Self::caller(), ino, &remote_attr(e))?;
        match e.kind {
            EntryKind::File => {
                if stub.cache_ino != 0 {
                    self.retire_cache(ino, stub.cache_ino, stub.present_bytes());
                }
                stub.cache_ino = 0;
                stub.present.clear();
                self.prefetcher.lock().forget_file(ino);
            }
            EntryKind::Dir => stub.listed = false,
            _ => {}
        }
        stub.hub_version = e.version;
        self.engine.remote_stub_put(&Self::caller(), ino, stub)
    }

    fn fetch_listing(&self, ino: Ino, stub: &RemoteStub) -> Result<()> {
        for _ in 0..ATTEMPTS_MAX {
            let generation = self.generation();
            let path = split_path(&stub.path);
            let mut all = Vec::new();
            let mut cursor = None;
            let mut dir_entry = None;
            loop {
                match self.call(Request::List { path: path.clone(), cursor: cursor.clone(), max: LIST_ENTRIES_MAX })? {
                    Response::Listing { dir, entries, next } => {
                        if dir.hub_ino != stub.hub_ino {
                            return Err(Error::Stale);
                        }
                        dir_entry.get_or_insert(dir);
                        all.extend(entries);
                        match next {
                            Some(n) => cursor = Some(n),
                            None => break,
                        }
                    }
                    r => return Err(unavailable(&stub.portal, format!("unexpected answer {r:?}"))),
                }
            }
            let dir = dir_entry.expect("one page at least");
            if dir.version < self.min_version(dir.hub_ino) {
                continue;
            }
            self.apply_listing(ino, stub, &all, generation)?;
            let mut s = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
            if s.hub_version != dir.version {
                self.engine.remote_set_attr(&Self::caller(), ino, &remote_attr(&dir))?;
            }
            s.listed = true;
            s.hub_version = dir.version;
            self.engine.remote_stub_put(&Self::caller(), ino, &s)?;
            if self.mark_verified(dir.hub_ino, dir.version, generation) {
                return Ok(());
            }
            s.listed = false;
            self.engine.remote_stub_put(&Self::caller(), ino, &s)?;
        }
        Err(unavailable(&stub.portal, "changes on the hub kept overtaking the listing"))
    }

    fn local_entries(&self, dir: Ino) -> Result<HashMap<Vec<u8>, (Ino, FileKind)>> {
        let mut out = HashMap::new();
        let mut cursor: Option<Vec<u8>> = None;
        loop {
            let page = self.engine.readdir(&Self::caller(), dir, cursor.as_deref(), 4096)?;
            for e in page.entries {
                out.insert(e.name, (e.ino, e.kind));
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(out),
            }
        }
    }

    fn apply_listing(&self, dir: Ino, stub: &RemoteStub, entries: &[(Vec<u8>, Entry)], generation: u64) -> Result<()> {
        let c = Self::caller();
        let mut local = self.local_entries(dir)?;
        for (name, e) in entries {
            if check_name(name).is_err() || e.kind == EntryKind::Other {
                continue;
            }
            if let Some((l, kind)) = local.remove(name) {
                let ls = self.engine.remote_stub(l)?;
                match ls {
                    Some(mut ls) if ls.hub_ino == e.hub_ino && kind_matches(kind, e.kind) && (e.kind != EntryKind::Symlink || ls.hub_version == e.version) => {
                        if ls.hub_version != e.version {
                            self.apply_new_version(l, &mut ls, e)?;
                        }
                        self.mark_verified(e.hub_ino, e.version, generation);
                        continue;
                    }
                    _ => self.remove_tree(dir, name, l, kind)?,
                }
            }
            let a = match e.kind {
                EntryKind::File => self.engine.create(&c, dir, name, e.mode, true)?,
                EntryKind::Dir => self.engine.mkdir(&c, dir, name, e.mode)?,
                EntryKind::Symlink => self.engine.symlink(&c, dir, name, &e.target)?,
                EntryKind::Other => continue,
            };
            self.engine.remote_set_attr(&c, a.ino, &remote_attr(e))?;
            let s = RemoteStub {
                portal: stub.portal.clone(),
                hub_ino: e.hub_ino,
                hub_version: e.version,
                path: child_path(&stub.path, name),
                ..RemoteStub::default()
            };
            self.engine.remote_stub_put(&c, a.ino, &s)?;
            self.mark_verified(e.hub_ino, e.version, generation);
        }
        for (name, (l, kind)) in local {
            self.remove_tree(dir, &name, l, kind)?;
        }
        Ok(())
    }

    /// Removes a mirror entry and everything below it, with cached data.
    pub fn remove_tree(&self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) -> Result<()> {
        let c = Self::caller();
        if kind == FileKind::Dir {
            for (n, (l, k)) in self.local_entries(ino)? {
                self.remove_tree(ino, &n, l, k)?;
            }
        }
        // A replaced or removed file's cached chunks stay available for reuse (a new version
        // of a checkpoint usually shares most of them).
        if let Some(mut s) = self.engine.remote_stub(ino)? {
            if s.cache_ino != 0 && s.portal == self.id() {
                let cache = s.cache_ino;
                let bytes = s.present_bytes();
                s.cache_ino = 0;
                s.present.clear();
                self.engine.remote_stub_put(&c, ino, &s)?;
                self.retire_cache(ino, cache, bytes);
            }
        }
        self.forget_cache(ino);
        self.engine.remote_stub_delete(&c, ino)?;
        let r = if kind == FileKind::Dir { self.engine.rmdir(&c, parent, name) } else { self.engine.unlink(&c, parent, name) };
        match r {
            Ok(()) | Err(Error::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    // ------------------------------------------------------------ data

    fn fill_slot(&self, ino: Ino) -> SlotRef<'_> {
        let slot = self.fill_locks.lock().entry(ino).or_default().clone();
        SlotRef { table: &self.fill_locks, ino, slot }
    }

    /// Files whose cache is being filled, evicted or pushed to the hub right now.
    pub fn files_busy(&self) -> usize {
        self.fill_locks.lock().len()
    }

    fn manifest(&self, ino: Ino, stub: &RemoteStub) -> Result<Arc<Vec<ChunkRef>>> {
        if let Some(m) = self.manifests.lock().0.get(&(stub.hub_ino, stub.hub_version)) {
            return Ok(m.clone());
        }
        match self.call(Request::Manifest { path: split_path(&stub.path), hub_ino: stub.hub_ino })? {
            Response::Manifest { version, size, chunks } => {
                if version != stub.hub_version {
                    self.on_invalidate(&[(stub.hub_ino, version)]);
                    return Err(Error::Stale);
                }
                let total: u64 = chunks.iter().map(|c| c.len as u64).sum();
                let tiles = chunks.iter().scan(0u64, |at, c| {
                    let ok = c.offset == *at && c.len <= chunks::CHUNK_BYTES_MAX;
                    *at = c.end();
                    Some(ok)
                });
                if total != size || tiles.into_iter().any(|ok| !ok) {
                    return Err(unavailable(&stub.portal, format!("hub sent a malformed manifest for inode {ino}")));
                }
                let m = Arc::new(chunks);
                self.remember_manifest(stub.hub_ino, version, m.clone());
                Ok(m)
            }
            r => Err(unavailable(&stub.portal, format!("unexpected answer {r:?}"))),
        }
    }

    /// Makes `[offset, offset+len)` of mirror file `ino` present in its cache file.
    ///
    /// Several fills of one file run at once (demand reads and read-ahead): each claims the
    /// span of chunks it fetches, waits only for claimed spans it needs, fetches without the
    /// file's lock, and records what arrived under it.
    pub fn fill(&self, ino: Ino, offset: u64, len: u64, stale_ok: bool) -> Result<()> {
        let slot = self.fill_slot(ino);
        let (m, cv) = &*slot;
        // Rounds that made progress do not count; only retries after the file changed do.
        let mut retries = 0;
        while retries < ATTEMPTS_MAX {
            let mut st = m.lock();
            let (stub, wanted, span) = loop {
                let mut stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
                let size = self.engine.getattr(&Self::caller(), ino)?.size;
                let end = size.min(offset.saturating_add(len));
                let (start, end) = if size <= WHOLE_FILE_BELOW_BYTES { (0, size) } else { (offset, end) };
                if stub.has(start, end) {
                    if stale_ok && !self.is_verified(stub.hub_ino) {
                        self.stale_served(ino);
                    }
                    drop(st);
                    self.touch(ino, stub.present_bytes());
                    return Ok(());
                }
                if stale_ok {
                    return Err(unavailable(&stub.portal, "data not cached and no lease from the hub"));
                }
                if size <= WHOLE_FILE_BELOW_BYTES && st.inflight.is_empty() && !self.has_manifest(&stub) {
                    // A small file: manifest and bytes in one round trip.
                    match self.fetch_whole(ino, &mut stub) {
                        Ok(present) => {
                            drop(st);
                            self.touch(ino, present);
                            self.evict_if_needed(ino);
                            return Ok(());
                        }
                        Err(Error::Stale) if retries < ATTEMPTS_MAX => {
                            retries += 1;
                            self.revalidate(ino, &stub)?;
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                let manifest = match self.manifest(ino, &stub) {
                    Ok(m) => m,
                    Err(Error::Stale) if retries < ATTEMPTS_MAX => {
                        retries += 1;
                        self.revalidate(ino, &stub)?;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if stub.cache_ino == 0 {
                    stub.cache_ino = self.engine.remote_new_cache_file(&Self::caller())?;
                    self.engine.remote_stub_put(&Self::caller(), ino, &stub)?;
                }
                let claimed = |c: &ChunkRef| st.inflight.iter().any(|&(a, b)| a < c.end() && c.offset < b);
                let missing: Vec<ChunkRef> =
                    manifest.iter().filter(|c| c.end() > start && c.offset < end && !stub.has(c.offset, c.end())).copied().collect();
                let wanted: Vec<ChunkRef> = missing.iter().filter(|c| !claimed(c)).copied().collect();
                if wanted.is_empty() {
                    // Everything missing is being fetched by another fill: wait for it.
                    cv.wait(&mut st);
                    continue;
                }
                let span = (wanted[0].offset, wanted[wanted.len() - 1].end());
                break (stub, wanted, span);
            };
            st.inflight.push(span);
            drop(st);
            let fetched = self.fetch_into(&stub, &wanted);
            let mut st = m.lock();
            st.inflight.retain(|r| *r != span);
            cv.notify_all();
            let recorded = match fetched {
                Ok(()) => self.record_fill(ino, &stub, &wanted),
                Err(e) => Err(e),
            };
            drop(st);
            match recorded {
                Ok(present) => {
                    self.touch(ino, present);
                    self.evict_if_needed(ino);
                    // The span claimed may not cover all of the range if others held parts.
                    continue;
                }
                Err(Error::Stale) => {
                    retries += 1;
                    self.revalidate(ino, &stub)?;
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        // One more look: the range may be complete now.
        let stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
        let size = self.engine.getattr(&Self::caller(), ino)?.size;
        if stub.has(offset.min(size), size.min(offset.saturating_add(len))) || size <= WHOLE_FILE_BELOW_BYTES && stub.has(0, size) {
            return Ok(());
        }
        Err(unavailable(&self.id(), "the file kept changing while it was fetched"))
    }

    fn has_manifest(&self, stub: &RemoteStub) -> bool {
        self.manifests.lock().0.contains_key(&(stub.hub_ino, stub.hub_version))
    }

    fn remember_manifest(&self, hub_ino: Ino, version: u64, m: Arc<Vec<ChunkRef>>) {
        let mut ms = self.manifests.lock();
        if ms.0.insert((hub_ino, version), m).is_none() {
            ms.1.push_back((hub_ino, version));
        }
        while ms.1.len() > MANIFESTS_MAX {
            if let Some(k) = ms.1.pop_front() {
                ms.0.remove(&k);
            }
        }
    }

    /// Fetches a small file whole (under the file's fill lock, nothing else in flight).
    fn fetch_whole(&self, ino: Ino, stub: &mut RemoteStub) -> Result<u64> {
        let c = Self::caller();
        let (version, size, refs, data) = match self.call(Request::Whole { path: split_path(&stub.path), hub_ino: stub.hub_ino })? {
            Response::Whole { version, size, chunks, data } => (version, size, chunks, data),
            r => return Err(unavailable(&stub.portal, format!("unexpected answer {r:?}"))),
        };
        if version != stub.hub_version {
            self.on_invalidate(&[(stub.hub_ino, version)]);
            return Err(Error::Stale);
        }
        let tiles = refs.iter().try_fold(0u64, |at, ch| (ch.offset == at && ch.len <= chunks::CHUNK_BYTES_MAX).then_some(ch.end()));
        if tiles != Some(size) || data.len() != refs.len() {
            return Err(unavailable(&stub.portal, format!("hub sent a malformed file for inode {ino}")));
        }
        if stub.cache_ino == 0 {
            stub.cache_ino = self.engine.remote_new_cache_file(&c)?;
            self.engine.remote_stub_put(&c, ino, stub)?;
        }
        for (ch, wire) in refs.iter().zip(&data) {
            let bytes = chunks::decompress_checked(wire, ch.len, &ch.hash).map_err(|m| unavailable(&stub.portal, format!("bad chunk from the hub: {m}")))?;
            self.stats.wire_bytes.fetch_add(wire.len() as u64, Ordering::Relaxed);
            self.stats.fetched_bytes.fetch_add(ch.len as u64, Ordering::Relaxed);
            self.stats.fetched_chunks.fetch_add(1, Ordering::Relaxed);
            self.engine.write(&c, stub.cache_ino, ch.offset, &bytes, Stability::Unstable)?;
        }
        self.remember_manifest(stub.hub_ino, version, Arc::new(refs.clone()));
        self.record_fill(ino, stub, &refs)
    }

    /// Records chunks written into the cache file (under the file's fill lock). `Stale` when
    /// the file moved to another version (or cache file) meanwhile.
    fn record_fill(&self, ino: Ino, fetched_for: &RemoteStub, wanted: &[ChunkRef]) -> Result<u64> {
        let mut stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
        if stub.cache_ino != fetched_for.cache_ino || stub.hub_version != fetched_for.hub_version {
            return Err(Error::Stale);
        }
        self.engine.close(&Self::caller(), stub.cache_ino)?;
        let mut index = self.index.lock();
        for c in wanted {
            stub.add_present(c.offset, c.end());
            index.add(stub.cache_ino, c);
        }
        drop(index);
        self.engine.remote_stub_put(&Self::caller(), ino, &stub)?;
        Ok(stub.present_bytes())
    }

    /// Writes `wanted` chunks into the stub's cache file: copied from chunks held locally,
    /// fetched (compressed, several requests in flight) for the rest.
    fn fetch_into(&self, stub: &RemoteStub, wanted: &[ChunkRef]) -> Result<()> {
        let c = Self::caller();
        let mut remote = Vec::new();
        for ch in wanted {
            let local = self.index.lock().at.get(&ch.hash).copied();
            if let Some((cache, off, len)) = local {
                if let Ok(b) = self.engine.read(&c, cache, off, len as usize) {
                    if b.len() == ch.len as usize && blake3::hash(&b).as_bytes() == &ch.hash {
                        self.engine.write(&c, stub.cache_ino, ch.offset, &b, Stability::Unstable)?;
                        self.stats.reused_bytes.fetch_add(ch.len as u64, Ordering::Relaxed);
                        self.stats.reused_chunks.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
            }
            remote.push(*ch);
        }
        // Batches of at most FETCH_REQUEST_BYTES, asked for FETCH_REQUESTS_IN_FLIGHT at a time.
        let mut batches: Vec<Vec<ChunkRef>> = Vec::new();
        let mut cur: Vec<ChunkRef> = Vec::new();
        let mut cur_bytes = 0u64;
        let mut seen = std::collections::HashSet::new();
        for ch in remote {
            if !seen.insert(ch.hash) {
                continue;
            }
            if cur_bytes + ch.len as u64 > FETCH_REQUEST_BYTES && !cur.is_empty() {
                batches.push(std::mem::take(&mut cur));
                cur_bytes = 0;
            }
            cur_bytes += ch.len as u64;
            cur.push(ch);
        }
        if !cur.is_empty() {
            batches.push(cur);
        }
        let path = split_path(&stub.path);
        let results: Vec<Result<Vec<(ChunkRef, Vec<u8>)>>> = std::thread::scope(|s| {
            let mut out = Vec::new();
            for group in batches.chunks(FETCH_REQUESTS_IN_FLIGHT) {
                let hs: Vec<_> = group
                    .iter()
                    .map(|b| {
                        let path = path.clone();
                        s.spawn(move || self.fetch_batch(stub, path, b))
                    })
                    .collect();
                for h in hs {
                    out.push(h.join().unwrap_or_else(|_| Err(Error::Io("chunk fetch thread panicked".into()))));
                }
            }
            out
        });
        let mut written: HashMap<Hash, Vec<u8>> = HashMap::new();
        for r in results {
            for (ch, data) in r? {
                written.insert(ch.hash, data);
            }
        }
        for ch in wanted {
            if let Some(d) = written.get(&ch.hash) {
                self.engine.write(&c, stub.cache_ino, ch.offset, d, Stability::Unstable)?;
            }
        }
        Ok(())
    }

    fn fetch_batch(&self, stub: &RemoteStub, path: RelPath, batch: &[ChunkRef]) -> Result<Vec<(ChunkRef, Vec<u8>)>> {
        let wanted: Vec<Hash> = batch.iter().map(|c| c.hash).collect();
        match self.call(Request::Chunks { path, hub_ino: stub.hub_ino, version: stub.hub_version, wanted })? {
            Response::Chunks { version, data } if version == stub.hub_version && data.len() == batch.len() => {
                let mut out = Vec::with_capacity(batch.len());
                for (ch, wire) in batch.iter().zip(data) {
                    let bytes = chunks::decompress_checked(&wire, ch.len, &ch.hash)
                        .map_err(|m| unavailable(&stub.portal, format!("bad chunk from the hub: {m}")))?;
                    self.stats.wire_bytes.fetch_add(wire.len() as u64, Ordering::Relaxed);
                    self.stats.fetched_bytes.fetch_add(ch.len as u64, Ordering::Relaxed);
                    self.stats.fetched_chunks.fetch_add(1, Ordering::Relaxed);
                    out.push((*ch, bytes));
                }
                Ok(out)
            }
            Response::Chunks { .. } => Err(Error::Stale),
            r => Err(unavailable(&stub.portal, format!("unexpected answer {r:?}"))),
        }
    }

    /// Hands the access to the prefetcher and starts what it asks for.
    fn after_access(self: &Arc<Self>, ino: Ino, stub: &RemoteStub, offset: u64, len: u64) {
        let Some(spawn) = self.spawner.clone() else { return };
        let size = self.engine.getattr(&Self::caller(), ino).map(|a| a.size).unwrap_or(0);
        let ev = neuralcache::AccessEvent { stream: stub.hub_ino, file: ino, offset, len, file_size: size, now_ms: (self.clock.now_ns() / 1_000_000) as u64 };
        if size <= WHOLE_FILE_BELOW_BYTES {
            self.prefetch_successors(stub, &spawn, SUCCESSORS_AHEAD, WHOLE_FILE_BELOW_BYTES);
        } else if offset + len >= size / 2 {
            // Past the middle of a large file read in order (a shard): start on the next one.
            self.prefetch_successors(stub, &spawn, 1, NEXT_FILE_HEAD_BYTES);
        }
        let reqs = self.prefetcher.lock().on_access(&ev);
        for r in reqs {
            let me = self.clone();
            spawn(Box::new(move || {
                match me.fill(r.file, r.offset, r.len, false) {
                    Ok(()) => {
                        me.stats.prefetched_bytes.fetch_add(r.len, Ordering::Relaxed);
                        me.prefetcher.lock().on_prefetch_done(r.file, r.offset, r.len, (me.clock.now_ns() / 1_000_000) as u64);
                    }
                    // The range is not on its way any more: let the prefetcher ask again.
                    Err(e) => {
                        tracing::debug!(ino = r.file, error = %e, "prefetch failed");
                        me.prefetcher.lock().forget_file(r.file);
                    }
                }
            }));
        }
    }

    /// Fetches the first `head` bytes of the next `count` files of the directory (name order)
    /// that do not have them cached yet.
    fn prefetch_successors(self: &Arc<Self>, stub: &RemoteStub, spawn: &PrefetchSpawner, count: usize, head: u64) {
        let root = self.settings.read().local_root;
        if root == 0 {
            return;
        }
        let c = Self::caller();
        let comps = split_path(&stub.path);
        let Some((name, parents)) = comps.split_last() else { return };
        let mut dir = root;
        for p in parents {
            match self.engine.lookup(&c, dir, p) {
                Ok(a) => dir = a.ino,
                Err(_) => return,
            }
        }
        let Ok(page) = self.engine.readdir(&c, dir, Some(name), count) else { return };
        for e in page.entries.into_iter().filter(|e| e.kind == FileKind::File) {
            let size = self.engine.getattr(&c, e.ino).map(|a| a.size).unwrap_or(0);
            let want = size.min(head);
            let cached = self.engine.remote_stub(e.ino).ok().flatten().is_some_and(|s| s.cache_ino != 0 && s.has(0, want));
            if want == 0 || cached || !self.successors_asked.lock().insert(e.ino) {
                continue;
            }
            let me = self.clone();
            spawn(Box::new(move || {
                if me.fill(e.ino, 0, want, false).is_ok() {
                    me.stats.prefetched_bytes.fetch_add(want, Ordering::Relaxed);
                }
                me.successors_asked.lock().remove(&e.ino);
            }));
        }
    }

    // ------------------------------------------------------------ cache space

    fn touch(&self, ino: Ino, bytes: u64) {
        let now = self.clock.now_ns();
        let mut lru = self.lru.lock();
        let old = lru.used.insert(ino, (now, bytes)).map(|(_, b)| b).unwrap_or(0);
        lru.bytes = lru.bytes + bytes - old.min(lru.bytes + bytes);
    }

    /// Total bytes of file data cached by this portal.
    pub fn cached_bytes(&self) -> u64 {
        self.lru.lock().bytes
    }

    fn evict_if_needed(&self, keep: Ino) {
        let (max, free_min) = {
            let s = self.settings.read();
            (s.cache_bytes_max, s.free_percent_min)
        };
        loop {
            let over_cap = self.cached_bytes() > max;
            let low_space = self
                .engine
                .statfs(&Self::caller())
                .map(|s| s.total_bytes > 0 && s.free_bytes * 100 < s.total_bytes * free_min as u64)
                .unwrap_or(false);
            if !over_cap && !low_space {
                return;
            }
            let victim = {
                let lru = self.lru.lock();
                lru.used.iter().filter(|(i, _)| **i != keep).min_by_key(|(_, (t, _))| *t).map(|(i, _)| *i)
            };
            let Some(v) = victim else { return };
            if let Err(e) = self.evict(v) {
                tracing::warn!(ino = v, error = %e, "evicting a cached file failed");
                self.lru.lock().used.remove(&v);
            }
        }
    }

    /// Drops the cached bytes of one mirror file.
    pub fn evict(&self, ino: Ino) -> Result<()> {
        let slot = self.fill_slot(ino);
        let (m, cv) = &*slot;
        let mut st = m.lock();
        while !st.inflight.is_empty() {
            cv.wait(&mut st);
        }
        let bytes = self.forget_cache(ino);
        if let Some(mut stub) = self.engine.remote_stub(ino)? {
            if stub.cache_ino != 0 {
                self.index.lock().drop_cache(stub.cache_ino);
                let _ = self.engine.abort_put(&Self::caller(), stub.cache_ino);
            }
            stub.cache_ino = 0;
            stub.present.clear();
            self.engine.remote_stub_put(&Self::caller(), ino, &stub)?;
        }
        self.stats.evicted_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn forget_cache(&self, ino: Ino) -> u64 {
        let mut lru = self.lru.lock();
        let b = lru.used.remove(&ino).map(|(_, b)| b).unwrap_or(0);
        lru.bytes = lru.bytes.saturating_sub(b);
        b
    }

    /// A superseded version's cache file stays for chunk reuse until the retired set is
    /// over its byte limit.
    fn retire_cache(&self, ino: Ino, cache: Ino, bytes: u64) {
        self.forget_cache(ino);
        let mut index = self.index.lock();
        index.retired.push_back((cache, bytes));
        index.retired_bytes += bytes;
        while index.retired_bytes > RETIRED_CACHE_BYTES_MAX {
            let Some((old, b)) = index.retired.pop_front() else { break };
            index.retired_bytes -= b;
            index.drop_cache(old);
            let _ = self.engine.abort_put(&Self::caller(), old);
        }
    }

    /// Deletes every retired cache file (portal deletion).
    pub fn drop_retired(&self) {
        let mut index = self.index.lock();
        while let Some((old, _)) = index.retired.pop_front() {
            index.drop_cache(old);
            let _ = self.engine.abort_put(&Self::caller(), old);
        }
        index.retired_bytes = 0;
    }

    // ------------------------------------------------------------ mutations (rw portals)

    pub fn before_mutation(&self, _ino: Ino, stub: &RemoteStub, m: &Mutation<'_>) -> Result<Verdict> {
        let id = stub.portal.clone();
        if let Mutation::Flush { ino, .. } = m {
            // Closing or committing a file with no local writes: nothing to send (also on
            // read-only portals, where every close lands here).
            if !self.dirty.lock().contains(ino) {
                return Ok(Verdict::Done(None));
            }
        }
        if self.settings.read().mode != PortalMode::ReadWrite {
            return Err(Error::ReadOnly(format!("portal {id} is read-only")));
        }
        if !self.check_lease()? {
            return Err(unavailable(&id, "no lease from the hub; writes are not accepted"));
        }
        let c = Self::caller();
        // The hub carries these out as the portal; the spoke's own permission rules apply
        // first, on the mirror's attributes (the hub's mode, owner and group).
        let may = |caller: &Caller, ino: Ino, mask: u32| -> Result<()> {
            if self.engine.access(caller, ino, mask)? == mask { Ok(()) } else { Err(Error::PermissionDenied) }
        };
        match m {
            Mutation::Create { caller, parent, .. } | Mutation::Remove { caller, parent, .. } | Mutation::Publish { caller, parent, .. } => may(caller, *parent, 3)?,
            Mutation::Rename { caller, from_parent, to_parent, .. } => {
                may(caller, *from_parent, 3)?;
                may(caller, *to_parent, 3)?;
            }
            Mutation::Write { caller, ino, .. } => may(caller, *ino, 2)?,
            Mutation::SetAttr { caller, ino, set } => {
                let a = self.engine.getattr(&c, *ino)?;
                let owner = caller.uid == 0 || caller.uid == a.uid;
                if set.size.is_some() {
                    may(caller, *ino, 2)?;
                }
                if (set.mode.is_some() || set.uid.is_some() || set.gid.is_some() || matches!(set.mtime, Some(storage_engine::TimeSet::At(_))) || matches!(set.atime, Some(storage_engine::TimeSet::At(_)))) && !owner {
                    return Err(Error::PermissionDenied);
                }
                if set.uid.is_some_and(|u| u != a.uid) && caller.uid != 0 {
                    return Err(Error::PermissionDenied);
                }
            }
            _ => {}
        }
        let path_of = |dir: Ino| -> Result<RelPath> {
            let s = self.engine.remote_stub(dir)?.ok_or_else(|| Error::NotSupported(format!("operation across the edge of portal {id}")))?;
            if s.portal != id {
                return Err(Error::NotSupported("operation across two portals".into()));
            }
            Ok(split_path(&s.path))
        };
        match m {
            Mutation::Create { parent, name, kind: FileKind::Dir, mode, .. } => {
                let r = self.call(Request::Mkdir { path: path_of(*parent)?, name: name.to_vec(), mode: *mode })?;
                let Response::Attr(e) = r else { return Err(unavailable(&id, "unexpected answer to mkdir")) };
                let a = self.adopt(*parent, name, &e, None)?;
                Ok(Verdict::Done(Some(a)))
            }
            Mutation::Create { parent, name, kind: FileKind::File, mode, exclusive, .. } => {
                // An empty file, created on the hub first. Without O_EXCL an existing regular
                // file is returned unchanged, as for any create.
                if let Ok(l) = self.engine.lookup(&c, *parent, name) {
                    return if *exclusive || l.kind != FileKind::File { Err(Error::Exists) } else { Ok(Verdict::Done(Some(l))) };
                }
                let e = self.put_hub(path_of(*parent)?, name, &[], *mode)?;
                let a = self.adopt(*parent, name, &e, None)?;
                Ok(Verdict::Done(Some(a)))
            }
            Mutation::Remove { parent, name, dir, .. } => {
                self.call(Request::Remove { path: path_of(*parent)?, name: name.to_vec(), dir: *dir })?;
                if let Ok(l) = self.engine.lookup(&c, *parent, name) {
                    self.remove_tree(*parent, name, l.ino, l.kind)?;
                }
                Ok(Verdict::Done(None))
            }
            Mutation::Rename { from_parent, from_name, to_parent, to_name, .. } => {
                let (from, to) = (path_of(*from_parent)?, path_of(*to_parent)?);
                self.call(Request::Rename { from, from_name: from_name.to_vec(), to, to_name: to_name.to_vec() })?;
                // Both directories are listed again on next use; drop the moved entry now.
                for (p, n) in [(*from_parent, *from_name), (*to_parent, *to_name)] {
                    if let Ok(l) = self.engine.lookup(&c, p, n) {
                        self.remove_tree(p, n, l.ino, l.kind)?;
                    }
                    if let Some(s) = self.engine.remote_stub(p)? {
                        self.on_invalidate(&[(s.hub_ino, 0)]);
                        let mut s = s;
                        s.listed = false;
                        self.engine.remote_stub_put(&c, p, &s)?;
                    }
                }
                Ok(Verdict::Done(None))
            }
            Mutation::Stage { .. } => Ok(Verdict::Local),
            Mutation::Write { ino, offset, data, stability, .. } => {
                self.write_local(*ino, *offset, data)?;
                if *stability == Stability::Durable {
                    self.push_dirty(*ino)?;
                }
                Ok(Verdict::Done(Some(self.engine.getattr(&c, *ino)?)))
            }
            Mutation::SetAttr { ino, set, .. } => {
                let a = self.engine.getattr(&c, *ino)?;
                if let (Some(size), FileKind::File) = (set.size, a.kind) {
                    self.truncate_local(*ino, size)?;
                }
                // Mode, owner and times change on the mirror; the hub keeps its own (they are
                // not part of what a push sends).
                let a = self.engine.getattr(&c, *ino)?;
                let now = self.clock.now_ns();
                let at = |t: Option<storage_engine::TimeSet>, old: i64| match t {
                    Some(storage_engine::TimeSet::Now) => now,
                    Some(storage_engine::TimeSet::At(v)) => v,
                    None => old,
                };
                let attr = RemoteAttr {
                    mode: set.mode.unwrap_or(a.mode),
                    uid: set.uid.unwrap_or(a.uid),
                    gid: set.gid.unwrap_or(a.gid),
                    size: a.size,
                    atime_ns: at(set.atime, a.atime_ns),
                    mtime_ns: at(set.mtime, a.mtime_ns),
                    ctime_ns: now,
                    btime_ns: a.btime_ns,
                };
                Ok(Verdict::Done(Some(self.engine.remote_set_attr(&c, *ino, &attr)?)))
            }
            Mutation::Flush { ino, .. } => {
                // Close and commit both send the file: a client is told its writes are safe
                // only once the hub has them.
                self.push_dirty(*ino)?;
                Ok(Verdict::Done(None))
            }
            Mutation::Publish { staged, parent, name, .. } => {
                let size = self.engine.getattr(&c, *staged)?.size;
                let mut data = Vec::with_capacity(size as usize);
                let mut off = 0;
                while off < size {
                    let piece = self.engine.read(&c, *staged, off, 4 << 20)?;
                    if piece.is_empty() {
                        break;
                    }
                    off += piece.len() as u64;
                    data.extend_from_slice(&piece);
                }
                let e = self.put_hub(path_of(*parent)?, name, &data, 0o644)?;
                // The staged file becomes the new version's cache: its bytes are the hub's.
                let a = self.adopt(*parent, name, &e, Some((*staged, &data)))?;
                Ok(Verdict::Done(Some(a)))
            }
            Mutation::Create { .. } | Mutation::Other { .. } => Err(Error::NotSupported(format!(
                "portal {id}: files, directories, writes, removal and rename are forwarded to the hub; links, special files, xattrs and setattr are not"
            ))),
        }
    }

    /// An in-place write into a mirror file of a read-write portal: the file is made wholly
    /// present, the bytes go into its cache file, its size and times change locally, and the
    /// file is marked dirty until `push_dirty` sends it to the hub.
    fn write_local(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<()> {
        let c = Self::caller();
        let size = self.engine.getattr(&c, ino)?.size;
        if size > 0 && !self.dirty.lock().contains(&ino) {
            self.fill(ino, 0, size, false)?;
        }
        let slot = self.fill_slot(ino);
        let (m, cv) = &*slot;
        let mut st = m.lock();
        while !st.inflight.is_empty() {
            cv.wait(&mut st);
        }
        let mut stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
        if !stub.has(0, size) {
            return Err(unavailable(&stub.portal, "the file's bytes were evicted during the write; retry"));
        }
        if stub.cache_ino == 0 {
            stub.cache_ino = self.engine.remote_new_cache_file(&c)?;
        }
        self.engine.write(&c, stub.cache_ino, offset, data, Stability::Unstable)?;
        let end = offset + data.len() as u64;
        let new_size = size.max(end);
        stub.add_present(0, new_size);
        self.engine.remote_stub_put(&c, ino, &stub)?;
        let a = self.engine.getattr(&c, ino)?;
        let now = self.clock.now_ns();
        let attr = RemoteAttr { mode: a.mode, uid: a.uid, gid: a.gid, size: new_size, atime_ns: a.atime_ns, mtime_ns: now, ctime_ns: now, btime_ns: a.btime_ns };
        self.engine.remote_set_attr(&c, ino, &attr)?;
        self.dirty.lock().insert(ino);
        drop(st);
        self.touch(ino, new_size);
        Ok(())
    }

    /// Truncates or extends a mirror file locally (sent to the hub with its next push).
    fn truncate_local(&self, ino: Ino, size: u64) -> Result<()> {
        let c = Self::caller();
        let old = self.engine.getattr(&c, ino)?.size;
        if old > 0 && !self.dirty.lock().contains(&ino) {
            self.fill(ino, 0, old.min(size), false)?;
        }
        let slot = self.fill_slot(ino);
        let (m, cv) = &*slot;
        let mut st = m.lock();
        while !st.inflight.is_empty() {
            cv.wait(&mut st);
        }
        let mut stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
        if stub.cache_ino == 0 {
            stub.cache_ino = self.engine.remote_new_cache_file(&c)?;
        }
        self.engine.setattr(&c, stub.cache_ino, storage_engine::SetAttr { size: Some(size), ..Default::default() })?;
        stub.present.retain(|(s, _)| *s < size);
        for r in stub.present.iter_mut() {
            r.1 = r.1.min(size);
        }
        stub.add_present(0, size);
        self.engine.remote_stub_put(&c, ino, &stub)?;
        let a = self.engine.getattr(&c, ino)?;
        let now = self.clock.now_ns();
        let attr = RemoteAttr { mode: a.mode, uid: a.uid, gid: a.gid, size, atime_ns: a.atime_ns, mtime_ns: now, ctime_ns: now, btime_ns: a.btime_ns };
        self.engine.remote_set_attr(&c, ino, &attr)?;
        self.dirty.lock().insert(ino);
        Ok(())
    }

    /// Sends every dirty file to the hub (portal deletion).
    pub fn push_all_dirty(&self) -> Result<()> {
        let dirty: Vec<Ino> = self.dirty.lock().iter().copied().collect();
        for ino in dirty {
            self.push_dirty(ino)?;
        }
        Ok(())
    }

    /// Sends a dirty mirror file to the hub (whole, only the chunks the hub lacks) and points
    /// the mirror at the version the hub made of it.
    pub fn push_dirty(&self, ino: Ino) -> Result<()> {
        let c = Self::caller();
        let slot = self.fill_slot(ino);
        let (m, cv) = &*slot;
        let mut st = m.lock();
        while !st.inflight.is_empty() {
            cv.wait(&mut st);
        }
        if !self.dirty.lock().contains(&ino) {
            return Ok(());
        }
        let mut stub = self.engine.remote_stub(ino)?.ok_or(Error::Stale)?;
        let a = self.engine.getattr(&c, ino)?;
        let mut data = Vec::with_capacity(a.size as usize);
        while (data.len() as u64) < a.size {
            let piece = self.engine.read(&c, stub.cache_ino, data.len() as u64, (4 << 20).min((a.size - data.len() as u64) as usize))?;
            if piece.is_empty() {
                break;
            }
            data.extend_from_slice(&piece);
        }
        data.resize(a.size as usize, 0);
        let mut comps = split_path(&stub.path);
        let name = comps.pop().ok_or_else(|| Error::InvalidArgument("the portal root is not a file".into()))?;
        let e = self.put_hub(comps, &name, &data, a.mode)?;
        stub.hub_ino = e.hub_ino;
        stub.hub_version = e.version;
        stub.present.clear();
        stub.add_present(0, a.size);
        self.engine.close(&c, stub.cache_ino)?;
        self.engine.remote_stub_put(&c, ino, &stub)?;
        self.engine.remote_set_attr(&c, ino, &remote_attr(&e))?;
        let refs = chunks::chunk(&data, 0);
        {
            let mut index = self.index.lock();
            index.drop_cache(stub.cache_ino);
            for ch in &refs {
                index.add(stub.cache_ino, ch);
            }
        }
        self.remember_manifest(e.hub_ino, e.version, Arc::new(refs));
        let generation = self.generation();
        self.mark_verified(e.hub_ino, e.version, generation);
        self.dirty.lock().remove(&ino);
        Ok(())
    }

    /// Sends a whole file to the hub: chunk names first, then the chunks it lacks.
    fn put_hub(&self, path: RelPath, name: &[u8], data: &[u8], _mode: u32) -> Result<Entry> {
        let refs = chunks::chunk(data, 0);
        let mut send: Vec<(Hash, Vec<u8>)> = Vec::new();
        for _ in 0..3 {
            let req = Request::Put { path: path.clone(), name: name.to_vec(), size: data.len() as u64, chunks: refs.clone(), data: std::mem::take(&mut send) };
            match self.call(req)? {
                Response::Attr(e) => return Ok(e),
                Response::NeedChunks { missing } => {
                    let by: HashMap<Hash, &ChunkRef> = refs.iter().map(|c| (c.hash, c)).collect();
                    for h in missing {
                        let c = by.get(&h).ok_or_else(|| unavailable(&self.id(), "hub asked for a chunk it was not offered"))?;
                        let w = chunks::compress(&data[c.offset as usize..c.end() as usize]);
                        self.stats.wire_bytes.fetch_add(w.len() as u64, Ordering::Relaxed);
                        send.push((h, w));
                    }
                }
                r => return Err(unavailable(&self.id(), format!("unexpected answer to a write {r:?}"))),
            }
        }
        Err(unavailable(&self.id(), "the hub kept asking for chunks"))
    }

    /// Makes `parent/name` the mirror of hub entry `e` (replacing what was there).
    fn adopt(&self, parent: Ino, name: &[u8], e: &Entry, cache: Option<(Ino, &[u8])>) -> Result<Attr> {
        let c = Self::caller();
        let pstub = self.engine.remote_stub(parent)?.ok_or(Error::Stale)?;
        if let Ok(l) = self.engine.lookup(&c, parent, name) {
            self.remove_tree(parent, name, l.ino, l.kind)?;
        }
        let a = match e.kind {
            EntryKind::Dir => self.engine.mkdir(&c, parent, name, e.mode)?,
            _ => self.engine.create(&c, parent, name, e.mode, true)?,
        };
        self.engine.remote_set_attr(&c, a.ino, &remote_attr(e))?;
        let mut s = RemoteStub {
            portal: pstub.portal.clone(),
            hub_ino: e.hub_ino,
            hub_version: e.version,
            path: child_path(&pstub.path, name),
            listed: e.kind == EntryKind::Dir,
            ..RemoteStub::default()
        };
        if let Some((staged, data)) = cache {
            self.engine.close(&c, staged)?;
            s.cache_ino = staged;
            s.add_present(0, data.len() as u64);
            let mut index = self.index.lock();
            for ch in chunks::chunk(data, 0) {
                index.add(staged, &ch);
            }
        }
        self.engine.remote_stub_put(&c, a.ino, &s)?;
        self.touch(a.ino, s.present_bytes());
        let generation = self.generation();
        self.mark_verified(e.hub_ino, e.version, generation);
        if let Some(ps) = self.engine.remote_stub(parent)? {
            // The parent changed on the hub too.
            self.on_invalidate(&[(ps.hub_ino, 0)]);
        }
        self.engine.getattr(&c, a.ino)
    }
}
