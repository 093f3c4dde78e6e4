//! Mirror inodes: parts of the namespace whose truth lives on another cluster (a portal's hub).
//!
//! A spoke shows a hub directory as ordinary inodes of its own namespace ("mirror inodes"),
//! each carrying a [`RemoteStub`]: which portal, which hub inode and version, the path below
//! the portal root, whether a directory's entries were fetched, and for files which byte
//! ranges are present in the local cache. Cached file bytes live in a separate unnamed
//! "cache file" (an orphan kept alive by the stub), so the mirror inode keeps the hub's
//! attributes exactly while its data is filled and evicted piecemeal.
//!
//! The engine knows nothing about networks: before it serves a mirror inode it calls the
//! installed [`RemoteSource`] (the fabric) to bring what it needs up to date, and before a
//! mutation touching a mirror inode it asks the source whether that is allowed. The source
//! applies what the hub said through the mirror API below, as the [`Caller::portal`] caller,
//! which bypasses these hooks.

use std::sync::atomic::Ordering;

use rocksdb::{IteratorMode, WriteBatch};

use crate::engine::{CF_REMOTE, Engine};
use crate::error::{Error, Result};
use crate::records::*;
use crate::types::*;

/// The user name of [`Caller::portal`]; not a valid user name, so no login can carry it.
pub const PORTAL_CALLER: &str = "@portal";

impl Caller {
    /// The fabric applying what a hub said to mirror inodes: uid 0, admin, and exempt from
    /// the mirror hooks (it is the one that fills them).
    pub fn portal() -> Caller {
        Caller { user: PORTAL_CALLER.into(), uid: 0, gid: 0, groups: vec![], role: Role::Admin }
    }
    pub fn is_portal(&self) -> bool {
        self.user == PORTAL_CALLER
    }
}

/// What the engine needs before it serves a mirror inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Attributes (getattr, lookup result, access checks).
    Attr,
    /// A directory's entries (lookup in it, readdir).
    Listing,
    /// File bytes `[offset, offset + len)`, clamped to the file size by the engine.
    Data { offset: u64, len: u64 },
}

/// The fabric's side of mirror inodes.
pub trait RemoteSource: Send + Sync {
    /// Brings `need` of mirror inode `ino` up to date, or fails (e.g. `Unavailable` when the
    /// hub cannot be reached and the portal's lease has expired).
    fn ensure(&self, ino: Ino, stub: &RemoteStub, need: Need) -> Result<()>;
    /// Called before a client mutation that touches mirror inode `ino` (`stub`): the source
    /// refuses it (read-only portals answer `ReadOnly`), lets it run locally
    /// ([`Verdict::Local`]), or carries it out itself, at the hub and then on the mirror
    /// ([`Verdict::Done`], with the resulting attributes where the operation returns some).
    fn before_mutation(&self, ino: Ino, stub: &RemoteStub, m: &Mutation<'_>) -> Result<Verdict>;
}

/// A client mutation that touches a mirror inode, as the fabric is told about it.
#[derive(Debug)]
pub enum Mutation<'a> {
    /// `exclusive`: an existing entry is an error (O_EXCL, NFS GUARDED/EXCLUSIVE).
    Create { caller: &'a Caller, parent: Ino, name: &'a [u8], kind: FileKind, mode: u32, target: &'a [u8], exclusive: bool },
    Remove { caller: &'a Caller, parent: Ino, name: &'a [u8], dir: bool },
    Rename { caller: &'a Caller, from_parent: Ino, from_name: &'a [u8], to_parent: Ino, to_name: &'a [u8] },
    /// A staged whole file (`begin_put`) is about to be published as `parent/name`.
    Publish { caller: &'a Caller, staged: Ino, parent: Ino, name: &'a [u8] },
    /// `begin_put` in a mirror directory (staging stays local until publish).
    Stage { caller: &'a Caller, parent: Ino },
    /// Bytes written into a mirror file (in place).
    Write { caller: &'a Caller, ino: Ino, offset: u64, data: &'a [u8], stability: Stability },
    /// Attributes set on a mirror inode.
    SetAttr { caller: &'a Caller, ino: Ino, set: &'a SetAttr },
    /// A mirror file's writes must reach the hub now (`durable`: commit/fsync) or may
    /// (close).
    Flush { caller: &'a Caller, ino: Ino, durable: bool },
    /// Anything else (writes in place, setattr, links, xattrs, special files).
    Other { caller: &'a Caller, ino: Ino, what: &'static str },
}

/// What the fabric decided about a mutation.
#[derive(Debug)]
pub enum Verdict {
    Local,
    Done(Option<Attr>),
}

/// The record kept with every mirror inode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemoteStub {
    pub portal: String,
    pub hub_ino: Ino,
    pub hub_version: u64,
    /// Path below the portal root on the hub, `/`-separated, empty for the root itself.
    pub path: Vec<u8>,
    /// Directories: entries were fetched and applied.
    pub listed: bool,
    /// Files: the unnamed local file that holds cached bytes (0: none yet).
    pub cache_ino: Ino,
    /// Files: sorted, disjoint, non-adjacent byte ranges `(start, end)` present in the cache.
    pub present: Vec<(u64, u64)>,
}

const STUB_V1: u8 = 1;

impl RemoteStub {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Enc::new(STUB_V1);
        e.bytes(self.portal.as_bytes()).u64(self.hub_ino).u64(self.hub_version).bytes(&self.path);
        e.u8(self.listed as u8).u64(self.cache_ino).u32(self.present.len() as u32);
        for (a, b) in &self.present {
            e.u64(*a).u64(*b);
        }
        e.finish()
    }

    pub fn decode(v: &[u8]) -> Result<RemoteStub> {
        let mut d = Dec::new(v, "remote stub", STUB_V1)?;
        let portal = String::from_utf8(d.bytes()?.to_vec()).map_err(|_| Error::Corrupt("remote stub portal".into()))?;
        let hub_ino = d.u64()?;
        let hub_version = d.u64()?;
        let path = d.bytes()?.to_vec();
        let listed = d.u8()? != 0;
        let cache_ino = d.u64()?;
        let n = d.u32()? as usize;
        let mut present = Vec::with_capacity(n.min(4096));
        for _ in 0..n {
            present.push((d.u64()?, d.u64()?));
        }
        Ok(RemoteStub { portal, hub_ino, hub_version, path, listed, cache_ino, present })
    }

    /// Whether `[start, end)` is wholly present.
    pub fn has(&self, start: u64, end: u64) -> bool {
        start >= end || self.present.iter().any(|&(a, b)| a <= start && end <= b)
    }

    /// The parts of `[start, end)` not present, in order.
    pub fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = start;
        for &(a, b) in &self.present {
            if b <= cur {
                continue;
            }
            if a >= end {
                break;
            }
            if a > cur {
                out.push((cur, a.min(end)));
            }
            cur = cur.max(b);
            if cur >= end {
                break;
            }
        }
        if cur < end {
            out.push((cur, end));
        }
        out
    }

    /// Records `[start, end)` as present, merging neighbours.
    pub fn add_present(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let mut kept = Vec::with_capacity(self.present.len() + 1);
        for &(a, b) in &self.present {
            if b < s || a > e {
                kept.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        kept.push((s, e));
        kept.sort_unstable();
        self.present = kept;
    }

    /// Bytes present in the cache.
    pub fn present_bytes(&self) -> u64 {
        self.present.iter().map(|(a, b)| b - a).sum()
    }
}

/// Attributes a hub reports for one inode, applied verbatim to its mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteAttr {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub btime_ns: i64,
}

impl Engine {
    /// Installs the fabric's side of mirror inodes (once, at daemon start).
    pub fn set_remote_source(&self, source: std::sync::Arc<dyn RemoteSource>) {
        *self.remote.write() = Some(source);
    }

    /// Whether any inode of this engine is (or was, since it started) a portal mirror. While
    /// none is, every read is answered from local metadata and drives, never from a hub, so
    /// protocols may make short metadata reads where a request is being served instead of
    /// on a thread that may block.
    pub fn holds_mirrors(&self) -> bool {
        self.has_stubs.load(Ordering::Relaxed)
    }

    /// The stub of a mirror inode; `None` for ordinary inodes.
    pub fn remote_stub(&self, ino: Ino) -> Result<Option<RemoteStub>> {
        if !self.has_stubs.load(Ordering::Relaxed) {
            return Ok(None);
        }
        match self.db.get_cf(self.cf(CF_REMOTE), be64(ino))? {
            Some(v) => Ok(Some(RemoteStub::decode(&v)?)),
            None => Ok(None),
        }
    }

    /// Stores the stub of a mirror inode (the portal caller only).
    pub fn remote_stub_put(&self, caller: &Caller, ino: Ino, stub: &RemoteStub) -> Result<()> {
        if !caller.is_portal() {
            return Err(Error::PermissionDenied);
        }
        self.load(ino)?;
        self.has_stubs.store(true, Ordering::Relaxed);
        self.db.put_cf(self.cf(CF_REMOTE), be64(ino), stub.encode())?;
        Ok(())
    }

    /// Forgets a stub (the inode becomes ordinary or is gone), dropping its cache file.
    pub fn remote_stub_delete(&self, caller: &Caller, ino: Ino) -> Result<()> {
        if !caller.is_portal() {
            return Err(Error::PermissionDenied);
        }
        if let Some(stub) = self.remote_stub(ino)? {
            if stub.cache_ino != 0 {
                self.abort_put(caller, stub.cache_ino).or_else(|e| if matches!(e, Error::NotFound) { Ok(()) } else { Err(e) })?;
            }
        }
        self.db.delete_cf(self.cf(CF_REMOTE), be64(ino))?;
        Ok(())
    }

    /// Every stub, in inode order (the fabric rebuilds its indexes from these at start).
    pub fn remote_stubs(&self) -> Result<Vec<(Ino, RemoteStub)>> {
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_REMOTE), IteratorMode::Start) {
            let (k, v) = kv?;
            out.push((read_be64(&k)?, RemoteStub::decode(&v)?));
        }
        Ok(out)
    }

    /// Cache files that stubs keep alive (not reclaimed as orphans at start).
    pub(crate) fn remote_cache_inos(&self) -> Result<Vec<Ino>> {
        Ok(self.remote_stubs()?.into_iter().map(|(_, s)| s.cache_ino).filter(|i| *i != 0).collect())
    }

    /// Creates an unnamed cache file for a mirror file's bytes.
    pub fn remote_new_cache_file(&self, caller: &Caller) -> Result<Ino> {
        if !caller.is_portal() {
            return Err(Error::PermissionDenied);
        }
        Ok(self.begin_put(caller, ROOT_INO, 0o600)?.ino)
    }

    /// Applies hub attributes to a mirror inode as they are (times included).
    pub fn remote_set_attr(&self, caller: &Caller, ino: Ino, a: &RemoteAttr) -> Result<Attr> {
        if !caller.is_portal() {
            return Err(Error::PermissionDenied);
        }
        let _g = self.mutate.lock();
        let mut rec = self.load(ino)?;
        rec.mode = a.mode & 0o7777;
        rec.uid = a.uid;
        rec.gid = a.gid;
        if rec.kind == FileKind::File {
            rec.size = a.size;
        }
        rec.atime_ns = a.atime_ns;
        rec.mtime_ns = a.mtime_ns;
        rec.ctime_ns = a.ctime_ns;
        rec.btime_ns = a.btime_ns;
        rec.version += 1;
        let mut batch = WriteBatch::default();
        self.put_inode(&mut batch, ino, &rec);
        self.db.write(batch)?;
        let attr = crate::engine::attr_of(ino, &rec);
        self.emit(ChangeEvent { ino, version: rec.version, kind: ChangeKind::Attr });
        Ok(attr)
    }

    /// The hook before serving `ino` to a client.
    pub(crate) fn remote_ensure(&self, caller: &Caller, ino: Ino, need: Need) -> Result<()> {
        if caller.is_portal() {
            return Ok(());
        }
        let Some(stub) = self.remote_stub(ino)? else { return Ok(()) };
        let source = self.remote.read().clone();
        match source {
            Some(s) => s.ensure(ino, &stub, need),
            None => Err(Error::Unavailable(format!("{} is part of portal {} and the fabric is not running", ino, stub.portal))),
        }
    }

    /// The hook before a client mutation touching `inos` (targets and parent directories):
    /// `None` to go ahead locally, `Some(attr)` when the fabric carried it out.
    /// Whether a mutation of `ino` by `caller` would go to a portal's hub.
    pub(crate) fn is_mirrored(&self, caller: &Caller, ino: Ino) -> Result<bool> {
        if caller.is_portal() || !self.has_stubs.load(Ordering::Relaxed) {
            return Ok(false);
        }
        Ok(self.remote_stub(ino)?.is_some())
    }

    pub(crate) fn remote_mutation(&self, inos: &[Ino], m: Mutation<'_>) -> Result<Option<Option<Attr>>> {
        let caller = match &m {
            Mutation::Create { caller, .. }
            | Mutation::Remove { caller, .. }
            | Mutation::Rename { caller, .. }
            | Mutation::Publish { caller, .. }
            | Mutation::Stage { caller, .. }
            | Mutation::Write { caller, .. }
            | Mutation::Flush { caller, .. }
            | Mutation::SetAttr { caller, .. }
            | Mutation::Other { caller, .. } => *caller,
        };
        if caller.is_portal() || !self.has_stubs.load(Ordering::Relaxed) {
            return Ok(None);
        }
        for &ino in inos {
            if let Some(stub) = self.remote_stub(ino)? {
                let source = self.remote.read().clone();
                return match source {
                    Some(s) => match s.before_mutation(ino, &stub, &m)? {
                        Verdict::Local => Ok(None),
                        Verdict::Done(a) => Ok(Some(a)),
                    },
                    None => Err(Error::ReadOnly(format!("part of portal {}", stub.portal))),
                };
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_ranges_merge_and_report_gaps() {
        let mut s = RemoteStub::default();
        assert_eq!(s.missing(0, 10), vec![(0, 10)]);
        s.add_present(2, 4);
        s.add_present(6, 8);
        assert_eq!(s.missing(0, 10), vec![(0, 2), (4, 6), (8, 10)]);
        assert!(s.has(2, 4) && !s.has(2, 5));
        s.add_present(4, 6);
        assert_eq!(s.present, vec![(2, 8)]);
        s.add_present(0, 1);
        s.add_present(9, 12);
        assert_eq!(s.present, vec![(0, 1), (2, 8), (9, 12)]);
        assert_eq!(s.missing(0, 12), vec![(1, 2), (8, 9)]);
        assert_eq!(s.present_bytes(), 1 + 6 + 3);
        let d = RemoteStub::decode(&s.encode()).unwrap();
        assert_eq!(d, s);
        let enc = s.encode();
        for n in 0..enc.len() {
            assert!(RemoteStub::decode(&enc[..n]).is_err());
        }
    }
}

impl Engine {
    /// Reads a mirror file: the fabric makes the range present in the cache file, which is
    /// then read like any file. A range evicted between the two steps is fetched again.
    pub(crate) fn read_mirror(&self, _caller: &Caller, ino: Ino, stub: RemoteStub, offset: u64, len: usize) -> Result<Vec<u8>> {
        let source = self.remote.read().clone().ok_or_else(|| {
            Error::Unavailable(format!("{ino} is part of portal {} and the fabric is not running", stub.portal))
        })?;
        source.ensure(ino, &stub, Need::Attr)?;
        for _ in 0..3 {
            let size = self.load(ino)?.size;
            if offset >= size || len == 0 {
                return Ok(Vec::new());
            }
            let end = size.min(offset.saturating_add(len as u64));
            let stub = self.remote_stub(ino)?.ok_or(Error::Stale)?;
            source.ensure(ino, &stub, Need::Data { offset, len: end - offset })?;
            let stub = self.remote_stub(ino)?.ok_or(Error::Stale)?;
            if stub.cache_ino == 0 || !stub.has(offset, end) {
                continue;
            }
            match self.read(&Caller::portal(), stub.cache_ino, offset, (end - offset) as usize) {
                Ok(mut v) => {
                    v.resize((end - offset) as usize, 0);
                    return Ok(v);
                }
                Err(Error::NotFound) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unavailable(format!("portal {}: cached range of inode {ino} kept being evicted", stub.portal)))
    }
}
