//! The hub's side of a portal: answers a spoke's requests from the local engine, confined to
//! the portal's directory, and tells the spoke when something it was given has changed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use storage_engine::{Attr, Caller, ChangeEvent, ChangeKind, Engine, Error, FileKind, Ino, Stability};

use crate::chunks::{self, ChunkRef, Chunker, Hash};
use crate::proto::*;

/// The extended attribute that carries a directory's residency label (a region name).
pub const RESIDENCY_XATTR: &[u8] = b"trusted.aquifer.residency";
/// Manifests the hub keeps computed (per file version).
pub const MANIFESTS_CACHED_MAX: usize = 1024;
/// Bytes read from the engine at a time while chunking a file.
const CHUNKING_READ_BYTES: usize = 4 << 20;

/// What the hub knows of one authorized portal while serving it.
#[derive(Debug, Clone)]
pub struct HubPortal {
    pub id: String,
    pub root: Ino,
    pub mode: PortalMode,
    pub spoke_region: String,
}

/// Manifests by (inode, version), oldest dropped first.
#[derive(Default)]
pub struct ManifestCache {
    map: HashMap<(Ino, u64), Arc<Vec<ChunkRef>>>,
    order: VecDeque<(Ino, u64)>,
}

impl ManifestCache {
    fn get(&self, k: (Ino, u64)) -> Option<Arc<Vec<ChunkRef>>> {
        self.map.get(&k).cloned()
    }
    fn put(&mut self, k: (Ino, u64), v: Arc<Vec<ChunkRef>>) {
        if self.map.insert(k, v).is_none() {
            self.order.push_back(k);
        }
        while self.order.len() > MANIFESTS_CACHED_MAX {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

/// Serves one portal's requests. `watched` holds the hub inodes the spoke has been told about;
/// changes to those are pushed as invalidations.
pub struct HubService {
    pub engine: Arc<Engine>,
    pub portal: HubPortal,
    pub manifests: Arc<Mutex<ManifestCache>>,
    pub watched: Mutex<HashSet<Ino>>,
}

fn err(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error { code, message: message.into() }
}

pub fn engine_error(e: Error) -> Response {
    let code = match &e {
        Error::NotFound => ErrorCode::NotFound,
        Error::PermissionDenied | Error::Unauthenticated => ErrorCode::PermissionDenied,
        Error::Exists => ErrorCode::Exists,
        Error::NotEmpty => ErrorCode::NotEmpty,
        Error::ReadOnly(_) => ErrorCode::ReadOnly,
        Error::Stale => ErrorCode::Stale,
        Error::InvalidName(_) | Error::InvalidArgument(_) | Error::NotDir | Error::IsDir => ErrorCode::BadRequest,
        _ => ErrorCode::Internal,
    };
    err(code, e.to_string())
}

pub fn entry_of(engine: &Engine, a: &Attr) -> Entry {
    let kind = match a.kind {
        FileKind::File => EntryKind::File,
        FileKind::Dir => EntryKind::Dir,
        FileKind::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let target = if kind == EntryKind::Symlink { engine.readlink(&Caller::system(), a.ino).unwrap_or_default() } else { Vec::new() };
    Entry {
        hub_ino: a.ino,
        kind,
        version: a.version,
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        atime_ns: a.atime_ns,
        mtime_ns: a.mtime_ns,
        ctime_ns: a.ctime_ns,
        btime_ns: a.btime_ns,
        target,
    }
}

/// The residency label of a directory, if any.
pub fn label_of(engine: &Engine, ino: Ino) -> Option<String> {
    engine.getxattr(&Caller::system(), ino, RESIDENCY_XATTR).ok().map(|v| String::from_utf8_lossy(&v).into_owned())
}

/// Whether data labelled `label` may be shown to a cluster in `region`.
pub fn residency_allows(label: &str, region: &str) -> bool {
    label.split(',').map(str::trim).any(|l| l == region || l == "*")
}

/// Checks the labels of `path` and every directory above it (up to the root of the
/// namespace) against `region`; the first refusing label is returned as an error message.
pub fn check_residency_path(engine: &Engine, path: &str, region: &str) -> Result<Ino, String> {
    let caller = Caller::system();
    let mut cur = engine.getattr(&caller, storage_engine::ROOT_INO).map_err(|e| e.to_string())?;
    let mut at = String::from("/");
    let check = |ino: Ino, at: &str| -> Result<(), String> {
        if let Some(l) = label_of(engine, ino) {
            if !residency_allows(&l, region) {
                return Err(format!("{at} is labelled residency={l}; a cluster in region {region:?} may not hold it"));
            }
        }
        Ok(())
    };
    check(cur.ino, &at)?;
    for comp in path.split('/').filter(|c| !c.is_empty()) {
        cur = engine.lookup(&caller, cur.ino, comp.as_bytes()).map_err(|e| format!("{at}{comp}: {e}"))?;
        at.push_str(comp);
        at.push('/');
        check(cur.ino, &at)?;
    }
    if cur.kind != FileKind::Dir {
        return Err(format!("{path} is not a directory"));
    }
    Ok(cur.ino)
}

impl HubService {
    pub fn new(engine: Arc<Engine>, portal: HubPortal, manifests: Arc<Mutex<ManifestCache>>) -> HubService {
        HubService { engine, portal, manifests, watched: Mutex::new(HashSet::new()) }
    }

    fn sys() -> Caller {
        Caller::system()
    }

    /// Resolves a path below the portal root, refusing directories whose residency label
    /// excludes the spoke's region.
    fn resolve(&self, path: &RelPath) -> Result<Attr, Response> {
        check_path(path).map_err(|m| err(ErrorCode::BadRequest, m))?;
        let mut cur = self.engine.getattr(&Self::sys(), self.portal.root).map_err(engine_error)?;
        for name in path {
            if cur.kind != FileKind::Dir {
                return Err(err(ErrorCode::NotFound, "not a directory on the way"));
            }
            cur = self.engine.lookup(&Self::sys(), cur.ino, name).map_err(engine_error)?;
            if cur.kind == FileKind::Dir {
                self.check_label(cur.ino)?;
            }
        }
        Ok(cur)
    }

    fn check_label(&self, ino: Ino) -> Result<(), Response> {
        if let Some(l) = label_of(&self.engine, ino) {
            if !residency_allows(&l, &self.portal.spoke_region) {
                return Err(err(ErrorCode::Residency, format!("labelled residency={l}; not for region {}", self.portal.spoke_region)));
            }
        }
        Ok(())
    }

    fn watch(&self, ino: Ino) {
        self.watched.lock().insert(ino);
    }

    /// The invalidations an engine change event causes for this portal: (hub inode, version).
    pub fn invalidations(&self, ev: &ChangeEvent) -> Vec<(Ino, u64)> {
        let watched = self.watched.lock();
        let mut out = Vec::new();
        let parent = |p: Ino, out: &mut Vec<(Ino, u64)>| {
            if watched.contains(&p) {
                let v = self.engine.getattr(&Self::sys(), p).map(|a| a.version).unwrap_or(u64::MAX);
                out.push((p, v));
            }
        };
        match &ev.kind {
            ChangeKind::Created { parent: p, .. } | ChangeKind::Removed { parent: p, .. } => parent(*p, &mut out),
            ChangeKind::Renamed { from_parent, to_parent, .. } => {
                parent(*from_parent, &mut out);
                if to_parent != from_parent {
                    parent(*to_parent, &mut out);
                }
            }
            _ => {}
        }
        if watched.contains(&ev.ino) {
            out.push((ev.ino, ev.version));
        }
        out
    }

    fn manifest(&self, a: &Attr) -> Result<Arc<Vec<ChunkRef>>, Response> {
        if let Some(m) = self.manifests.lock().get((a.ino, a.version)) {
            return Ok(m);
        }
        let mut c = Chunker::default();
        let mut off = 0u64;
        while off < a.size {
            let piece = self.engine.read(&Self::sys(), a.ino, off, CHUNKING_READ_BYTES).map_err(engine_error)?;
            if piece.is_empty() {
                break;
            }
            off += piece.len() as u64;
            c.feed(&piece);
        }
        // The file must not have changed while it was read.
        let now = self.engine.getattr(&Self::sys(), a.ino).map_err(engine_error)?;
        if now.version != a.version {
            return Err(err(ErrorCode::Stale, "file changed while being chunked"));
        }
        let m = Arc::new(c.finish());
        self.manifests.lock().put((a.ino, a.version), m.clone());
        Ok(m)
    }

    /// Answers one request (Hello, Propose and the portal registry are handled above this).
    pub fn handle(&self, req: Request) -> Response {
        match self.handle_inner(req) {
            Ok(r) => r,
            Err(r) => r,
        }
    }

    fn handle_inner(&self, req: Request) -> Result<Response, Response> {
        match req {
            Request::GetAttr { path } => {
                let a = self.resolve(&path)?;
                self.watch(a.ino);
                Ok(Response::Attr(entry_of(&self.engine, &a)))
            }
            Request::List { path, cursor, max } => {
                let dir = self.resolve(&path)?;
                if dir.kind != FileKind::Dir {
                    return Err(err(ErrorCode::BadRequest, "not a directory"));
                }
                self.watch(dir.ino);
                let page = self
                    .engine
                    .readdir(&Self::sys(), dir.ino, cursor.as_deref(), max.clamp(1, LIST_ENTRIES_MAX) as usize)
                    .map_err(engine_error)?;
                let mut entries = Vec::with_capacity(page.entries.len());
                for e in page.entries {
                    let a = match self.engine.getattr(&Self::sys(), e.ino) {
                        Ok(a) => a,
                        Err(Error::NotFound) => continue,
                        Err(e) => return Err(engine_error(e)),
                    };
                    if a.kind == FileKind::Dir && self.check_label(a.ino).is_err() {
                        continue; // labelled for other regions: not shown
                    }
                    self.watch(a.ino);
                    entries.push((e.name, entry_of(&self.engine, &a)));
                }
                Ok(Response::Listing { dir: entry_of(&self.engine, &dir), entries, next: page.next_cursor })
            }
            Request::Manifest { path, hub_ino } => {
                let a = self.resolve(&path)?;
                if a.ino != hub_ino {
                    return Err(err(ErrorCode::Stale, "another file is at that path now"));
                }
                if a.kind != FileKind::File {
                    return Err(err(ErrorCode::BadRequest, "not a file"));
                }
                self.watch(a.ino);
                let m = self.manifest(&a)?;
                Ok(Response::Manifest { version: a.version, size: a.size, chunks: (*m).clone() })
            }
            Request::Chunks { path, hub_ino, version, wanted } => {
                let a = self.resolve(&path)?;
                if a.ino != hub_ino || a.version != version {
                    return Err(err(ErrorCode::Stale, "the file changed"));
                }
                let m = self.manifest(&a)?;
                let by_hash: HashMap<&Hash, &ChunkRef> = m.iter().map(|c| (&c.hash, c)).collect();
                let total: u64 = wanted.iter().filter_map(|h| by_hash.get(h)).map(|c| c.len as u64).sum();
                if total > CHUNK_REQUEST_BYTES_MAX {
                    return Err(err(ErrorCode::BadRequest, format!("{total} bytes asked at once; at most {CHUNK_REQUEST_BYTES_MAX}")));
                }
                let mut data = Vec::with_capacity(wanted.len());
                for h in &wanted {
                    let c = by_hash.get(h).ok_or_else(|| err(ErrorCode::BadRequest, "no such chunk in this file version"))?;
                    let bytes = self.engine.read(&Self::sys(), a.ino, c.offset, c.len as usize).map_err(engine_error)?;
                    if bytes.len() != c.len as usize {
                        return Err(err(ErrorCode::Stale, "file shorter than its manifest"));
                    }
                    data.push(chunks::compress(&bytes));
                }
                let now = self.engine.getattr(&Self::sys(), a.ino).map_err(engine_error)?;
                if now.version != version {
                    return Err(err(ErrorCode::Stale, "the file changed while being read"));
                }
                Ok(Response::Chunks { version, data })
            }
            Request::Whole { path, hub_ino } => {
                let a = self.resolve(&path)?;
                if a.ino != hub_ino {
                    return Err(err(ErrorCode::Stale, "another file is at that path now"));
                }
                if a.kind != FileKind::File || a.size > WHOLE_FILE_BYTES_MAX {
                    return Err(err(ErrorCode::BadRequest, format!("Whole is for files of at most {WHOLE_FILE_BYTES_MAX} bytes")));
                }
                self.watch(a.ino);
                let m = self.manifest(&a)?;
                let bytes = self.engine.read(&Self::sys(), a.ino, 0, a.size as usize).map_err(engine_error)?;
                if bytes.len() as u64 != a.size {
                    return Err(err(ErrorCode::Stale, "file shorter than its manifest"));
                }
                let data = m.iter().map(|c| chunks::compress(&bytes[c.offset as usize..c.end() as usize])).collect();
                let now = self.engine.getattr(&Self::sys(), a.ino).map_err(engine_error)?;
                if now.version != a.version {
                    return Err(err(ErrorCode::Stale, "the file changed while being read"));
                }
                Ok(Response::Whole { version: a.version, size: a.size, chunks: (*m).clone(), data })
            }
            Request::Put { path, name, size, chunks: refs, data } => {
                self.writable()?;
                check_name(&name).map_err(|m| err(ErrorCode::BadRequest, m))?;
                let dir = self.resolve(&path)?;
                self.put(dir.ino, &name, size, &refs, data)
            }
            Request::Mkdir { path, name, mode } => {
                self.writable()?;
                let dir = self.resolve(&path)?;
                let a = self.engine.mkdir(&Self::sys(), dir.ino, &name, mode).map_err(engine_error)?;
                self.watch(a.ino);
                Ok(Response::Attr(entry_of(&self.engine, &a)))
            }
            Request::Remove { path, name, dir: is_dir } => {
                self.writable()?;
                let dir = self.resolve(&path)?;
                let r = if is_dir { self.engine.rmdir(&Self::sys(), dir.ino, &name) } else { self.engine.unlink(&Self::sys(), dir.ino, &name) };
                r.map_err(engine_error)?;
                Ok(Response::Ok)
            }
            Request::Rename { from, from_name, to, to_name } => {
                self.writable()?;
                check_name(&from_name).map_err(|m| err(ErrorCode::BadRequest, m))?;
                check_name(&to_name).map_err(|m| err(ErrorCode::BadRequest, m))?;
                let f = self.resolve(&from)?;
                let t = self.resolve(&to)?;
                self.engine.rename(&Self::sys(), f.ino, &from_name, t.ino, &to_name).map_err(engine_error)?;
                Ok(Response::Ok)
            }
            other => Err(err(ErrorCode::BadRequest, format!("unexpected request {}", request_name(&other)))),
        }
    }

    fn writable(&self) -> Result<(), Response> {
        if self.portal.mode != PortalMode::ReadWrite {
            return Err(err(ErrorCode::ReadOnly, "the portal is read-only"));
        }
        Ok(())
    }

    /// A spoke's whole-file write: the chunks the hub already has (in any file it has a
    /// manifest of) are not sent again; the file is published atomically.
    fn put(&self, dir: Ino, name: &[u8], size: u64, refs: &[ChunkRef], data: Vec<(Hash, Vec<u8>)>) -> Result<Response, Response> {
        let mut expect = 0u64;
        for c in refs {
            if c.offset != expect || c.len == 0 || c.len > chunks::CHUNK_BYTES_MAX {
                return Err(err(ErrorCode::BadRequest, "chunk list does not tile the file"));
            }
            expect = c.end();
        }
        if expect != size {
            return Err(err(ErrorCode::BadRequest, "chunk list does not add up to the size"));
        }
        let sent: HashMap<Hash, Vec<u8>> = data.into_iter().collect();
        // Where each known chunk can be read on the hub.
        let known: HashMap<Hash, (Ino, ChunkRef)> = {
            let m = self.manifests.lock();
            m.map.iter().flat_map(|((ino, _), cs)| cs.iter().map(move |c| (c.hash, (*ino, *c)))).collect()
        };
        let missing: Vec<Hash> = refs.iter().filter(|c| !sent.contains_key(&c.hash) && !known.contains_key(&c.hash)).map(|c| c.hash).collect();
        if !missing.is_empty() {
            let mut seen = HashSet::new();
            return Ok(Response::NeedChunks { missing: missing.into_iter().filter(|h| seen.insert(*h)).collect() });
        }
        let sys = Self::sys();
        let staged = self.engine.begin_put(&sys, dir, 0o644).map_err(engine_error)?;
        let res = (|| -> Result<Attr, Response> {
            for c in refs {
                let bytes = match sent.get(&c.hash) {
                    Some(w) => chunks::decompress_checked(w, c.len, &c.hash).map_err(|m| err(ErrorCode::BadRequest, m))?,
                    None => {
                        let (ino, at) = known[&c.hash];
                        let b = self.engine.read(&sys, ino, at.offset, at.len as usize).map_err(engine_error)?;
                        if blake3::hash(&b).as_bytes() != &c.hash {
                            return Err(err(ErrorCode::Stale, "a known chunk changed; send it"));
                        }
                        b
                    }
                };
                self.engine.write(&sys, staged.ino, c.offset, &bytes, Stability::Unstable).map_err(engine_error)?;
            }
            self.engine.finish_put(&sys, staged.ino, dir, name).map_err(engine_error)
        })();
        match res {
            Ok(a) => {
                self.watch(a.ino);
                self.manifests.lock().put((a.ino, a.version), Arc::new(refs.to_vec()));
                Ok(Response::Attr(entry_of(&self.engine, &a)))
            }
            Err(r) => {
                let _ = self.engine.abort_put(&sys, staged.ino);
                Err(r)
            }
        }
    }
}

pub fn request_name(r: &Request) -> &'static str {
    match r {
        Request::Hello { .. } => "Hello",
        Request::Propose { .. } => "Propose",
        Request::Status { .. } => "Status",
        Request::Withdraw { .. } => "Withdraw",
        Request::Renew => "Renew",
        Request::GetAttr { .. } => "GetAttr",
        Request::List { .. } => "List",
        Request::Manifest { .. } => "Manifest",
        Request::Chunks { .. } => "Chunks",
        Request::Whole { .. } => "Whole",
        Request::Put { .. } => "Put",
        Request::Mkdir { .. } => "Mkdir",
        Request::Remove { .. } => "Remove",
        Request::Rename { .. } => "Rename",
    }
}
