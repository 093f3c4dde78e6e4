//! Object operations on the namespace: whole-object put (see `Engine::begin_put`),
//! multipart uploads, and listing by key prefix in byte order across directories.
//!
//! A bucket is a directory; key `a/b/c` is file `c` in directory `a/b` below it. Listing must
//! return keys in byte order, which is not the order of a depth-first walk by name: `a-b`
//! sorts before `a/b` because '-' < '/'. Each directory is read in name order from the
//! first name that can matter, with directories held back until their keys' turn, so a
//! page costs about what it returns, not the size of the directory.

use std::collections::HashSet;

use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions};

use crate::engine::{CF_UPLOADS, CF_XATTRS, Engine, validate_name};
use crate::error::{Error, Result};
use crate::records::{Dec, Enc, xattr_key};
use crate::types::*;
use crate::versions::VersionMode;

/// Most parts of one multipart upload (as S3).
pub const PARTS_MAX: u32 = 10_000;
/// Most entries one listing call returns.
pub const LIST_KEYS_MAX: usize = 10_000;
/// Directory entries a listing reads first from each directory; later reads grow fourfold
/// up to [`LIST_READ_MAX`], so a small page reads little and a large one few times.
const LIST_READ_FIRST: usize = 64;
const LIST_READ_MAX: usize = 4096;
/// Extended attribute of a directory that is also an object: key `path/` (an S3 "folder
/// marker"), whose content is the attribute's value (most often empty). Listings show such a
/// directory as an object of that size with that key, before the keys below it; the
/// directory itself is the same as any other.
pub const XATTR_FOLDER_OBJECT: &[u8] = b"aquifer.folder-object";

#[derive(Debug, Clone)]
pub struct UploadInfo {
    pub id: String,
    pub bucket: Ino,
    pub key: String,
    pub uid: u32,
    pub created_ns: i64,
    /// Protocol-defined bytes kept with the upload (content type, user metadata).
    pub meta: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct PartInfo {
    pub number: u32,
    pub size: u64,
    pub ino: Ino,
    /// Protocol-defined tag (the S3 ETag).
    pub tag: Vec<u8>,
    pub mtime_ns: i64,
}

#[derive(Debug, Clone)]
pub struct ObjectEntry {
    pub key: Vec<u8>,
    pub attr: Attr,
}

#[derive(Debug, Clone, Default)]
pub struct ObjectPage {
    pub objects: Vec<ObjectEntry>,
    pub common_prefixes: Vec<Vec<u8>>,
    /// Set when truncated: pass it as `start_after` to continue.
    pub next_start_after: Option<Vec<u8>>,
}

fn upload_key(id: &str) -> Vec<u8> {
    format!("u/{id}").into_bytes()
}

fn part_key(id: &str, n: u32) -> Vec<u8> {
    let mut k = format!("p/{id}/").into_bytes();
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn encode_upload(u: &UploadInfo) -> Vec<u8> {
    let mut e = Enc::new(1);
    e.bytes(u.id.as_bytes()).u64(u.bucket).bytes(u.key.as_bytes()).u32(u.uid).i64(u.created_ns).bytes(&u.meta);
    e.finish()
}

fn decode_upload(b: &[u8]) -> Result<UploadInfo> {
    let mut d = Dec::new(b, "upload", 1)?;
    let u = UploadInfo {
        id: crate::records::utf8(d.bytes()?, "upload id")?,
        bucket: d.u64()?,
        key: crate::records::utf8(d.bytes()?, "upload key")?,
        uid: d.u32()?,
        created_ns: d.i64()?,
        meta: d.bytes()?.to_vec(),
    };
    d.end()?;
    Ok(u)
}

fn encode_part(p: &PartInfo) -> Vec<u8> {
    let mut e = Enc::new(1);
    e.u32(p.number).u64(p.size).u64(p.ino).bytes(&p.tag).i64(p.mtime_ns);
    e.finish()
}

fn decode_part(b: &[u8]) -> Result<PartInfo> {
    let mut d = Dec::new(b, "part", 1)?;
    let p = PartInfo { number: d.u32()?, size: d.u64()?, ino: d.u64()?, tag: d.bytes()?.to_vec(), mtime_ns: d.i64()? };
    d.end()?;
    Ok(p)
}

/// Inodes of every part of every live upload (they are orphans that must survive restarts).
///
/// Run at start-up, before unreferenced orphans are reclaimed. Uploads whose bucket
/// directory no longer exists are dropped first (a crash between removing a bucket and
/// aborting its uploads leaves such records), so their parts are reclaimed with the other
/// orphans instead of leaking.
pub(crate) fn upload_parts(engine: &Engine) -> Result<HashSet<Ino>> {
    let mut dead = Vec::new();
    for kv in engine.db.iterator_cf(engine.cf(CF_UPLOADS), IteratorMode::From(b"u/", Direction::Forward)) {
        let (k, v) = kv?;
        if !k.starts_with(b"u/") {
            break;
        }
        let u = decode_upload(&v)?;
        match engine.load(u.bucket) {
            Ok(rec) if rec.kind == FileKind::Dir && rec.nlink > 0 => {}
            Ok(_) | Err(Error::NotFound) => dead.push(u.id),
            Err(e) => return Err(e),
        }
    }
    for id in &dead {
        engine.drop_upload(id, &HashSet::new())?;
    }
    if !dead.is_empty() {
        tracing::info!(count = dead.len(), "dropped multipart uploads of removed buckets");
    }
    let mut out = HashSet::new();
    for kv in engine.db.iterator_cf(engine.cf(CF_UPLOADS), IteratorMode::From(b"p/", Direction::Forward)) {
        let (k, v) = kv?;
        if !k.starts_with(b"p/") {
            break;
        }
        out.insert(decode_part(&v)?.ino);
    }
    Ok(out)
}

/// Splits an object key into directory components and a final name, refusing keys that
/// cannot be paths (empty components, `.`/`..`, NUL, over-long names).
pub fn split_key(key: &str) -> Result<(Vec<&str>, &str)> {
    if key.is_empty() || key.len() > 1024 {
        return Err(Error::InvalidArgument("object key must be 1-1024 bytes".into()));
    }
    let parts: Vec<&str> = key.split('/').collect();
    let (name, dirs) = parts.split_last().expect("split yields one part");
    for c in parts.iter() {
        validate_name(c.as_bytes())?;
    }
    Ok((dirs.to_vec(), name))
}

impl Engine {
    /// Resolves the directory that holds `key` below `bucket`, creating missing directories
    /// (mode 0755) when `create` is set. Returns (parent, final name).
    pub fn object_parent<'k>(&self, caller: &Caller, bucket: Ino, key: &'k str, create: bool) -> Result<(Ino, &'k str)> {
        let (dirs, name) = split_key(key)?;
        let mut cur = bucket;
        for d in dirs {
            cur = match self.lookup(caller, cur, d.as_bytes()) {
                Ok(a) if a.kind == FileKind::Dir => a.ino,
                Ok(_) => return Err(Error::NotDir),
                Err(Error::NotFound) if create => match self.mkdir(caller, cur, d.as_bytes(), 0o755) {
                    Ok(a) => a.ino,
                    Err(Error::Exists) => self.lookup(caller, cur, d.as_bytes())?.ino,
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            };
        }
        Ok((cur, name))
    }

    pub fn multipart_create(&self, caller: &Caller, bucket: Ino, key: &str, meta: Vec<u8>) -> Result<String> {
        // `prefix/` names a folder object (see [`XATTR_FOLDER_OBJECT`]): the protocol completes
        // its upload itself.
        split_key(key.strip_suffix('/').unwrap_or(key))?;
        let b = self.getattr(caller, bucket)?;
        if b.kind != FileKind::Dir {
            return Err(Error::NotDir);
        }
        let id = hex::encode(rand::random::<[u8; 16]>());
        let u = UploadInfo { id: id.clone(), bucket, key: key.to_string(), uid: caller.uid, created_ns: self.now(), meta };
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_UPLOADS), upload_key(&id), encode_upload(&u));
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo)?;
        Ok(id)
    }

    pub fn multipart_get(&self, caller: &Caller, id: &str) -> Result<UploadInfo> {
        let v = self.db.get_cf(self.cf(CF_UPLOADS), upload_key(id))?.ok_or(Error::NotFound)?;
        let u = decode_upload(&v)?;
        if u.uid != caller.uid && caller.uid != 0 {
            return Err(Error::PermissionDenied);
        }
        Ok(u)
    }

    /// Returns an unnamed file to write part `number` into; `multipart_part_finish` records it.
    pub fn multipart_part_begin(&self, caller: &Caller, id: &str, number: u32) -> Result<Attr> {
        if number == 0 || number > PARTS_MAX {
            return Err(Error::InvalidArgument(format!("part number must be 1-{PARTS_MAX}")));
        }
        let u = self.multipart_get(caller, id)?;
        let a = self.create_orphan(caller, u.bucket)?;
        // Parts always live in stripes so that completion can link them without copying.
        self.force_extents(a.ino)?;
        Ok(a)
    }

    pub fn multipart_part_finish(&self, caller: &Caller, id: &str, number: u32, ino: Ino, tag: Vec<u8>) -> Result<PartInfo> {
        self.multipart_get(caller, id)?;
        self.flush_data_durable(ino)?;
        let a = self.getattr(caller, ino)?;
        let p = PartInfo { number, size: a.size, ino, tag, mtime_ns: a.mtime_ns };
        let old = {
            let _g = self.mutate.lock();
            let old = self.db.get_cf(self.cf(CF_UPLOADS), part_key(id, number))?.map(|v| decode_part(&v)).transpose()?;
            let mut batch = WriteBatch::default();
            batch.put_cf(self.cf(CF_UPLOADS), part_key(id, number), encode_part(&p));
            self.db.write(batch)?;
            old
        };
        // Synced outside the lock, so that parts finishing together share the sync.
        self.sync_metadata()?;
        if let Some(old) = old {
            self.abort_put(caller, old.ino)?;
        }
        Ok(p)
    }

    pub fn multipart_list_parts(&self, caller: &Caller, id: &str) -> Result<Vec<PartInfo>> {
        self.multipart_get(caller, id)?;
        let prefix = format!("p/{id}/").into_bytes();
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_UPLOADS), IteratorMode::From(&prefix, Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(&prefix) {
                break;
            }
            out.push(decode_part(&v)?);
        }
        Ok(out)
    }

    /// Uploads in progress below `bucket`, by key then id.
    pub fn multipart_list_uploads(&self, caller: &Caller, bucket: Ino) -> Result<Vec<UploadInfo>> {
        let mut out = Vec::new();
        for kv in self.db.iterator_cf(self.cf(CF_UPLOADS), IteratorMode::From(b"u/", Direction::Forward)) {
            let (k, v) = kv?;
            if !k.starts_with(b"u/") {
                break;
            }
            let u = decode_upload(&v)?;
            if u.bucket == bucket && (u.uid == caller.uid || caller.uid == 0) {
                out.push(u);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    fn drop_upload(&self, id: &str, keep: &HashSet<Ino>) -> Result<()> {
        let parts = self.multipart_list_parts(&Caller::system(), id)?;
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.cf(CF_UPLOADS), upload_key(id));
        for p in &parts {
            batch.delete_cf(self.cf(CF_UPLOADS), part_key(id, p.number));
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo)?;
        for p in parts {
            if !keep.contains(&p.ino) {
                // Already gone if a crash interrupted an earlier abort.
                match self.abort_put(&Caller::system(), p.ino) {
                    Ok(()) | Err(Error::NotFound) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    pub fn multipart_abort(&self, caller: &Caller, id: &str) -> Result<()> {
        self.multipart_get(caller, id)?;
        self.drop_upload(id, &HashSet::new())
    }

    /// Aborts every upload into directory `bucket`, whoever started it; for a bucket that
    /// has just been removed (its uploads can no longer complete). Returns how many.
    pub fn multipart_abort_bucket(&self, bucket: Ino) -> Result<usize> {
        let uploads = self.multipart_list_uploads(&Caller::system(), bucket)?;
        for u in &uploads {
            match self.drop_upload(&u.id, &HashSet::new()) {
                Ok(()) | Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(uploads.len())
    }

    /// Joins the named parts, in the order given, into the object and publishes it
    /// atomically. No data is copied: the parts' stripes become the object's.
    /// `xattrs` are set on the object before it becomes visible (ETag, content type, user
    /// metadata), so no reader sees it without them.
    pub fn multipart_complete(&self, caller: &Caller, id: &str, numbers: &[u32], xattrs: &[(Vec<u8>, Vec<u8>)]) -> Result<Attr> {
        self.multipart_complete_with_mode(caller, id, numbers, xattrs, 0o644)
    }

    /// [`Engine::multipart_complete`] publishing the object with `mode` (a private canned ACL
    /// is 0600): the object is never visible with wider permissions, not even for a moment.
    pub fn multipart_complete_with_mode(&self, caller: &Caller, id: &str, numbers: &[u32], xattrs: &[(Vec<u8>, Vec<u8>)], mode: u32) -> Result<Attr> {
        self.multipart_complete_versioned(caller, id, numbers, |_| xattrs.to_vec(), mode, None).map(|(a, _)| a)
    }

    /// [`Engine::multipart_complete_with_mode`] in a bucket with versioning `versioning`
    /// (see [`Engine::finish_put_versioned`]): returns the object and, when versioned, its
    /// version id. `xattrs` is given the assembled file's attributes (its final size and
    /// modification time, which publishing does not change) before it is published, and
    /// returns the extended attributes to set on it then, so that a record naming that data
    /// state (an ETag with the size and time it belongs to) is there from the first moment
    /// the object is visible, and survives a crash with it.
    pub fn multipart_complete_versioned(
        &self,
        caller: &Caller,
        id: &str,
        numbers: &[u32],
        xattrs: impl FnOnce(&Attr) -> Vec<(Vec<u8>, Vec<u8>)>,
        mode: u32,
        versioning: Option<VersionMode>,
    ) -> Result<(Attr, Option<String>)> {
        let u = self.multipart_get(caller, id)?;
        if numbers.is_empty() {
            return Err(Error::InvalidArgument("no parts named".into()));
        }
        if numbers.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Error::InvalidArgument("parts must be in ascending order".into()));
        }
        let parts = self.multipart_list_parts(caller, id)?;
        let mut inos = Vec::with_capacity(numbers.len());
        for n in numbers {
            let p = parts.iter().find(|p| p.number == *n).ok_or_else(|| Error::InvalidArgument(format!("part {n} was not uploaded")))?;
            inos.push(p.ino);
        }
        let (parent, name) = self.object_parent(caller, u.bucket, &u.key, true)?;
        let target = self.begin_put(caller, parent, mode & 0o7777)?;
        self.force_extents(target.ino)?;
        // The parts' records go first, durably: from here on the parts belong to the target
        // (a crash leaves an orphan target, reclaimed at start, never a doubly owned stripe).
        let keep: HashSet<Ino> = inos.iter().copied().collect();
        let mut batch = WriteBatch::default();
        for p in &parts {
            if keep.contains(&p.ino) {
                batch.delete_cf(self.cf(CF_UPLOADS), part_key(id, p.number));
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo)?;
        let assembled = self.concat(target.ino, inos)?;
        let xattrs = xattrs(&assembled);
        if !xattrs.is_empty() {
            let set: Vec<(&[u8], &[u8])> = xattrs.iter().map(|(k, v)| (&k[..], &v[..])).collect();
            self.set_xattrs(caller, target.ino, &[], &set)?;
        }
        let (attr, version) = match versioning {
            Some(v) => {
                let (a, id) = self.finish_put_versioned(caller, target.ino, parent, name.as_bytes(), u.bucket, &u.key, v)?;
                (a, Some(id))
            }
            None => (self.finish_put(caller, target.ino, parent, name.as_bytes())?, None),
        };
        self.drop_upload(id, &keep)?;
        Ok((attr, version))
    }

    /// Lists keys below directory `bucket` in byte order: those starting with `prefix` and
    /// after `start_after`, grouped at `delimiter` into common prefixes, at most `max`
    /// entries (objects plus prefixes).
    pub fn list_objects(&self, caller: &Caller, bucket: Ino, prefix: &[u8], delimiter: Option<&[u8]>, start_after: &[u8], max: usize) -> Result<ObjectPage> {
        let max = max.clamp(1, LIST_KEYS_MAX);
        let mut page = ObjectPage::default();
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut st = ListState { prefix, delimiter, start_after, max, page: &mut page, last: None, done: false };
        self.list_dir(caller, bucket, &mut Vec::new(), &mut st)?;
        Ok(page)
    }

    /// Lists one directory's part of the key space in key order, reading its entries in
    /// name order from the first name that can matter, and stopping once the page is full
    /// or the names are past `prefix`. Key order differs from name order only for a
    /// directory `d`, whose keys (`d/...`) sort after names that extend `d` with a byte
    /// below '/' (`d-x`, `d.txt`): such directories wait on a stack until the names read
    /// no longer extend them.
    fn list_dir(&self, caller: &Caller, dir: Ino, path: &mut Vec<u8>, st: &mut ListState) -> Result<()> {
        // The part of `s` that names an entry of this directory, when `s` reaches below it.
        let component = |s: &[u8]| -> Option<Vec<u8>> {
            (s.len() > path.len() && s.starts_with(path)).then(|| {
                let rest = &s[path.len()..];
                rest[..rest.iter().position(|b| *b == b'/').unwrap_or(rest.len())].to_vec()
            })
        };
        // Names below the prefix's component cannot match it; names past it, not extending
        // it, end the directory.
        let prefix_name = component(st.prefix);
        let mut from = prefix_name.clone().unwrap_or_default();
        let mut waiting: Vec<DirEntry> = Vec::new();
        if let Some(after) = component(st.start_after).filter(|a| *a > from) {
            // Names below start_after's component sort before start_after, except
            // directories named by a prefix of it that its next byte sorts below '/'
            // (directory `a` holds `a/x`, after `a-b`).
            for i in 1..after.len() {
                if after[i] < b'/'
                    && let Some(e) = self.readdir_from(caller, dir, Some((&after[..i], true)), 1)?.entries.pop()
                    && e.name == after[..i]
                    && e.kind == FileKind::Dir
                {
                    waiting.push(e);
                }
            }
            from = after;
        }
        let mut cursor = (!from.is_empty()).then_some((from, true));
        let mut batch = LIST_READ_FIRST;
        loop {
            let page = self.readdir_from(caller, dir, cursor.as_ref().map(|(n, inclusive)| (n.as_slice(), *inclusive)), batch)?;
            for e in page.entries {
                if prefix_name.as_ref().is_some_and(|p| e.name > *p && !e.name.starts_with(p)) {
                    return self.list_waiting(caller, waiting, path, st);
                }
                while let Some(d) = waiting.last() {
                    if e.name.len() > d.name.len() && e.name.starts_with(&d.name) && e.name[d.name.len()] < b'/' {
                        break;
                    }
                    let d = waiting.pop().expect("a waiting directory");
                    self.list_entry(caller, d, path, st)?;
                }
                if st.done {
                    return Ok(());
                }
                if e.kind == FileKind::Dir {
                    waiting.push(e);
                } else {
                    self.list_entry(caller, e, path, st)?;
                }
            }
            match page.next_cursor {
                Some(c) => cursor = Some((c, false)),
                None => break,
            }
            batch = (batch * 4).min(LIST_READ_MAX);
        }
        self.list_waiting(caller, waiting, path, st)
    }

    /// Whether directory `ino` is also the object `path/` ([`XATTR_FOLDER_OBJECT`]).
    pub fn is_folder_object(&self, ino: Ino) -> Result<bool> {
        Ok(self.folder_object_size(ino)?.is_some())
    }

    /// The size of folder object `ino` (the value of its [`XATTR_FOLDER_OBJECT`]), `None`
    /// when the directory is no folder object.
    fn folder_object_size(&self, ino: Ino) -> Result<Option<u64>> {
        Ok(self.db.get_pinned_cf(self.cf(CF_XATTRS), xattr_key(ino, XATTR_FOLDER_OBJECT))?.map(|v| v.len() as u64))
    }

    /// Lists the directories still waiting, innermost (first in key order) first.
    fn list_waiting(&self, caller: &Caller, mut waiting: Vec<DirEntry>, path: &mut Vec<u8>, st: &mut ListState) -> Result<()> {
        while let Some(d) = waiting.pop() {
            if st.done {
                break;
            }
            self.list_entry(caller, d, path, st)?;
        }
        Ok(())
    }

    /// One entry of the directory at `path`, in key order: a file is an object or rolls
    /// into a common prefix; a directory is a common prefix or is listed in turn.
    fn list_entry(&self, caller: &Caller, e: DirEntry, path: &mut Vec<u8>, st: &mut ListState) -> Result<()> {
        if st.done {
            return Ok(());
        }
        let mut key = path.clone();
        key.extend_from_slice(&e.name);
        if e.kind == FileKind::Dir {
            key.push(b'/');
        }
        // Subtrees and keys that cannot match the prefix.
        let common = key.len().min(st.prefix.len());
        if key[..common] != st.prefix[..common] {
            return Ok(());
        }
        if e.kind == FileKind::Dir {
            // Every key below sorts after `key`; skip the subtree if all of it is at or
            // before start_after.
            if key.as_slice() < st.start_after && !st.start_after.starts_with(&key) {
                return Ok(());
            }
            if let Some(cp) = st.common_prefix_of(&key) {
                if cp.as_slice() > st.start_after && (self.dir_has_entries(e.ino)? || self.is_folder_object(e.ino)?) {
                    st.emit_prefix(cp);
                }
                return Ok(());
            }
            // A folder object's key sorts before every key below it.
            if key.as_slice() > st.start_after
                && key.starts_with(st.prefix)
                && let Some(size) = self.folder_object_size(e.ino)?
            {
                match self.getattr(caller, e.ino) {
                    Ok(attr) => st.emit_object(key, Attr { size, ..attr }),
                    Err(Error::NotFound) => return Ok(()), // removed while listing
                    Err(err) => return Err(err),
                }
                if st.done {
                    return Ok(());
                }
            }
            let saved = path.len();
            path.extend_from_slice(&e.name);
            path.push(b'/');
            let r = self.list_dir(caller, e.ino, path, st);
            path.truncate(saved);
            return r;
        }
        if e.kind != FileKind::File || key.as_slice() <= st.start_after || !key.starts_with(st.prefix) {
            return Ok(());
        }
        if let Some(cp) = st.common_prefix_of(&key) {
            if cp.as_slice() > st.start_after {
                st.emit_prefix(cp);
            }
            return Ok(());
        }
        match self.getattr(caller, e.ino) {
            Ok(attr) => st.emit_object(key, attr),
            Err(Error::NotFound) => {} // removed while listing
            Err(err) => return Err(err),
        }
        Ok(())
    }
}

struct ListState<'a> {
    prefix: &'a [u8],
    delimiter: Option<&'a [u8]>,
    start_after: &'a [u8],
    max: usize,
    page: &'a mut ObjectPage,
    last: Option<Vec<u8>>,
    done: bool,
}

impl ListState<'_> {
    /// The common prefix `key` rolls up into, if the delimiter occurs after the prefix.
    fn common_prefix_of(&self, key: &[u8]) -> Option<Vec<u8>> {
        let d = self.delimiter?;
        if !key.starts_with(self.prefix) {
            return None;
        }
        let rest = &key[self.prefix.len()..];
        let pos = rest.windows(d.len()).position(|w| w == d)?;
        Some(key[..self.prefix.len() + pos + d.len()].to_vec())
    }

    fn count(&self) -> usize {
        self.page.objects.len() + self.page.common_prefixes.len()
    }

    /// True (and the page closed) when the page already holds `max` entries.
    fn full_check(&mut self) -> bool {
        if self.count() >= self.max {
            self.page.next_start_after = self.last.clone();
            self.done = true;
            return true;
        }
        false
    }

    fn emit_prefix(&mut self, cp: Vec<u8>) {
        if self.page.common_prefixes.last() == Some(&cp) {
            return;
        }
        if self.full_check() {
            return;
        }
        self.last = Some(cp.clone());
        self.page.common_prefixes.push(cp);
    }

    fn emit_object(&mut self, key: Vec<u8>, attr: Attr) {
        if self.full_check() {
            return;
        }
        self.last = Some(key.clone());
        self.page.objects.push(ObjectEntry { key, attr });
    }
}
