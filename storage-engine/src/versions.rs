//! Object versions of versioned buckets (S3 versioning; docs/formats/metadata.md, "versions").
//!
//! The current version of a key stays the file in the namespace, so every protocol sees the
//! latest object as a file. Older (noncurrent) versions and delete markers are kept in
//! column family `versions`, keyed by (bucket inode, key, inverted sequence number), newest
//! first. A noncurrent version is an unnamed inode, as a multipart part is: it is marked in
//! `orphans` and kept across restarts because a version record names it. Replacing or
//! deleting the current file of a versioned key moves its inode into the records in the same
//! metadata batch as the replacement, so a crash leaves the old or the new state, never a
//! lost version.
//!
//! Version ids are `null` (the one version a key may have that was written without
//! versioning, or while it was suspended) or 32 hex digits: the sequence number, then a
//! random nonce. Sequence numbers come from the clock in nanoseconds, kept strictly
//! increasing by a high-water mark stored with every allocation, so a version's sequence
//! number is about the time it was written.

use std::collections::HashSet;

use rocksdb::{Direction, IteratorMode, WriteBatch};

use crate::engine::{Applied, CF_DENTRIES, CF_ORPHANS, CF_VERSIONS, CF_XATTRS, Command, Engine, W, X, attr_of, check, sticky_ok, validate_name};
use crate::error::{Error, Result};
use crate::objects::{LIST_KEYS_MAX, split_key};
use crate::records::*;
use crate::types::*;

/// The version id of an object written without versioning (or while it was suspended).
pub const NULL_VERSION: &str = "null";
/// Extended attribute of an object inode: its version (sequence number and id).
pub const XATTR_VERSION: &[u8] = b"aquifer.version";
/// Key of the sequence high-water mark in `versions`.
const KEY_SEQ: &[u8] = b"s";
/// Prefix of version records in `versions`.
const RECORD_PREFIX: u8 = b'v';
/// Current objects a version listing reads at a time.
const LIST_CURRENT_BATCH: usize = 1000;

/// A bucket's versioning state, as the protocol layer keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionMode {
    /// Every write gets a new version id; replaced and deleted objects are kept.
    Enabled,
    /// Writes replace the `null` version; other versions are kept.
    Suspended,
}

#[derive(Debug, Clone)]
pub enum VersionKind {
    /// An object version: the inode's attributes (size, times, owner).
    Object(Attr),
    /// A delete marker: who deleted the key, and when.
    DeleteMarker { uid: u32, mtime_ns: i64 },
}

#[derive(Debug, Clone)]
pub struct VersionEntry {
    pub key: String,
    pub id: String,
    /// The newest version of the key (the current file, or the newest record when the key
    /// has no current file).
    pub latest: bool,
    /// The file in the namespace.
    pub current: bool,
    /// When a noncurrent version stopped being current: the next newer version's sequence
    /// number (about its write time, in ns since the epoch).
    pub successor_ns: Option<i64>,
    pub kind: VersionKind,
    /// Position among the key's versions (larger is newer).
    pub(crate) seq: u64,
}

#[derive(Debug, Clone, Default)]
pub struct VersionPage {
    pub versions: Vec<VersionEntry>,
    pub common_prefixes: Vec<String>,
    /// Set when truncated: the key and version id (none after a common prefix) to continue
    /// after.
    pub next: Option<(String, Option<String>)>,
}

/// What a version id names.
#[derive(Debug, Clone)]
pub enum FoundVersion {
    /// The current file.
    Current(Attr),
    /// A noncurrent object version (an unnamed inode).
    Noncurrent(Attr),
    /// A delete marker; `latest` when it is the key's newest version.
    DeleteMarker { latest: bool, uid: u32, mtime_ns: i64 },
}

/// Versioned-bucket mutations, applied like every other [`Command`] (one batch each).
#[derive(Debug, Clone)]
pub(crate) enum VersionCmd {
    /// Publishes staged `ino` as the current version of `key`, file `name` in `parent`.
    Publish { caller: Caller, ino: Ino, parent: Ino, name: Vec<u8>, bucket: Ino, key: String, mode: VersionMode, nonce: u64, now: i64 },
    /// Makes a delete marker the newest version; the current file (`at`, if any) becomes
    /// noncurrent (or is freed, when it is the null version of a suspended bucket).
    Delete { caller: Caller, at: Option<(Ino, Vec<u8>)>, bucket: Ino, key: String, mode: VersionMode, nonce: u64, now: i64 },
    /// Removes version `id` for good; when it was the newest, the next newest becomes the
    /// current file (in `at`, the key's directory) if it is an object.
    Remove { caller: Caller, at: Option<(Ino, Vec<u8>)>, bucket: Ino, key: String, id: String, now: i64 },
}

struct Record {
    id: String,
    /// 0 for a delete marker.
    ino: Ino,
    uid: u32,
    mtime_ns: i64,
}

fn encode_record(r: &Record) -> Vec<u8> {
    let mut e = Enc::new(1);
    e.bytes(r.id.as_bytes()).u64(r.ino).u32(r.uid).i64(r.mtime_ns);
    e.finish()
}

fn decode_record(b: &[u8]) -> Result<Record> {
    let mut d = Dec::new(b, "version", 1)?;
    let r = Record { id: utf8(d.bytes()?, "version id")?, ino: d.u64()?, uid: d.u32()?, mtime_ns: d.i64()? };
    d.end()?;
    Ok(r)
}

fn encode_current(seq: u64, id: &str) -> Vec<u8> {
    let mut e = Enc::new(1);
    e.u64(seq).bytes(id.as_bytes());
    e.finish()
}

fn decode_current(b: &[u8]) -> Result<(u64, String)> {
    let mut d = Dec::new(b, "object version", 1)?;
    let v = (d.u64()?, utf8(d.bytes()?, "version id")?);
    d.end()?;
    Ok(v)
}

fn bucket_prefix(bucket: Ino) -> Vec<u8> {
    let mut k = vec![RECORD_PREFIX];
    k.extend_from_slice(&be64(bucket));
    k
}

/// Every record of `key` starts with this: keys hold no NUL, so the records of `a` sort
/// before those of `a-b` and `a/b`, in key byte order.
fn key_prefix(bucket: Ino, key: &str) -> Vec<u8> {
    let mut k = bucket_prefix(bucket);
    k.extend_from_slice(key.as_bytes());
    k.push(0);
    k
}

fn record_key(bucket: Ino, key: &str, seq: u64) -> Vec<u8> {
    let mut k = key_prefix(bucket, key);
    k.extend_from_slice(&be64(!seq));
    k
}

/// (key, sequence number) of a record key of `bucket`.
fn parse_record_key(bucket: Ino, k: &[u8]) -> Result<(String, u64)> {
    let bad = || Error::Corrupt("version record key".into());
    if k.len() < 1 + 8 + 1 + 8 || k[0] != RECORD_PREFIX || k[1..9] != be64(bucket) || k[k.len() - 9] != 0 {
        return Err(bad());
    }
    let key = utf8(&k[9..k.len() - 9], "version key")?;
    Ok((key, !read_be64(&k[k.len() - 8..])?))
}

fn version_id(seq: u64, nonce: u64) -> String {
    format!("{seq:016x}{nonce:016x}")
}

/// The sequence number a non-null version id starts with; `None` for ids Aquifer never makes.
pub fn seq_of_version_id(id: &str) -> Option<u64> {
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())).then(|| u64::from_str_radix(&id[..16], 16).ok()).flatten()
}

/// Whether `id` could name a version: `null` or an id of Aquifer's form.
pub fn is_version_id(id: &str) -> bool {
    id == NULL_VERSION || seq_of_version_id(id).is_some()
}

/// Sequence numbers handed out in one batch: strictly above the stored high-water mark.
struct Seqs {
    next: u64,
    taken: bool,
}

impl Seqs {
    fn load(e: &Engine, now: i64) -> Result<Seqs> {
        let last = match e.db.get_cf(e.cf(CF_VERSIONS), KEY_SEQ)? {
            Some(v) => read_be64(&v)?,
            None => 0,
        };
        Ok(Seqs { next: (now.max(0) as u64).max(last + 1), taken: false })
    }
    fn take(&mut self) -> u64 {
        self.taken = true;
        self.next += 1;
        self.next - 1
    }
    fn store(&self, e: &Engine, batch: &mut WriteBatch) {
        if self.taken {
            batch.put_cf(e.cf(CF_VERSIONS), KEY_SEQ, be64(self.next - 1));
        }
    }
}

/// Inodes that version records name (kept by orphan reclamation).
pub(crate) fn version_inos(e: &Engine) -> Result<HashSet<Ino>> {
    let mut out = HashSet::new();
    for kv in e.db.iterator_cf(e.cf(CF_VERSIONS), IteratorMode::From(&[RECORD_PREFIX], Direction::Forward)) {
        let (k, v) = kv?;
        if k.first() != Some(&RECORD_PREFIX) {
            break;
        }
        let r = decode_record(&v)?;
        if r.ino != 0 {
            out.insert(r.ino);
        }
    }
    Ok(out)
}

/// Whether any version record belongs to `bucket`.
pub(crate) fn has_versions(e: &Engine, bucket: Ino) -> Result<bool> {
    let prefix = bucket_prefix(bucket);
    let mut it = e.db.raw_iterator_cf(e.cf(CF_VERSIONS));
    it.seek(&prefix);
    Ok(it.valid() && it.key().is_some_and(|k| k.starts_with(&prefix)))
}

/// The version of a current file: (sequence number, id), `None` for a file written without
/// one (it is the `null` version). A value that does not decode (set through another
/// protocol) counts as none.
fn current_version(e: &Engine, ino: Ino) -> Result<Option<(u64, String)>> {
    Ok(e.db.get_cf(e.cf(CF_XATTRS), xattr_key(ino, XATTR_VERSION))?.and_then(|v| decode_current(&v).ok()))
}

/// The records of `key`, newest first.
fn records_of(e: &Engine, bucket: Ino, key: &str) -> Result<Vec<(u64, Record)>> {
    let prefix = key_prefix(bucket, key);
    let mut out = Vec::new();
    for kv in e.db.iterator_cf(e.cf(CF_VERSIONS), IteratorMode::From(&prefix, Direction::Forward)) {
        let (k, v) = kv?;
        if !k.starts_with(&prefix) {
            break;
        }
        out.push((parse_record_key(bucket, &k)?.1, decode_record(&v)?));
    }
    Ok(out)
}

/// Frees a noncurrent version's inode (and its data).
fn free_inode(e: &Engine, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>, ino: Ino) -> Result<()> {
    batch.delete_cf(e.cf(CF_ORPHANS), be64(ino));
    match e.load(ino) {
        Ok(rec) => e.drop_link(batch, freed, ino, InodeRec { nlink: 1, ..rec }, 0),
        Err(Error::NotFound) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Removes the key's `null` record, if it has one (a new null version replaces it).
fn drop_null_record(e: &Engine, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>, bucket: Ino, key: &str) -> Result<()> {
    for (seq, r) in records_of(e, bucket, key)? {
        if r.id == NULL_VERSION {
            batch.delete_cf(e.cf(CF_VERSIONS), record_key(bucket, key, seq));
            if r.ino != 0 {
                free_inode(e, batch, freed, r.ino)?;
            }
        }
    }
    Ok(())
}

/// The current file `old` (its name already removed or about to be replaced) stops being
/// current: it becomes a noncurrent version, or is freed when it is the null version of a
/// suspended bucket or has other names (a hard link made through another protocol).
#[allow(clippy::too_many_arguments)] // one retirement and everything it touches
fn retire(e: &Engine, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>, seqs: &mut Seqs, bucket: Ino, key: &str, old: Ino, victim: InodeRec, mode: VersionMode, now: i64) -> Result<()> {
    let (seq, id) = match current_version(e, old)? {
        Some(v) => v,
        None => (seqs.take(), NULL_VERSION.to_string()),
    };
    if victim.nlink > 1 || (id == NULL_VERSION && mode == VersionMode::Suspended) {
        return e.drop_link(batch, freed, old, victim, now);
    }
    if id == NULL_VERSION {
        drop_null_record(e, batch, freed, bucket, key)?;
    }
    batch.put_cf(e.cf(CF_ORPHANS), be64(old), be64(now as u64));
    batch.put_cf(e.cf(CF_XATTRS), xattr_key(old, XATTR_VERSION), encode_current(seq, &id));
    batch.put_cf(e.cf(CF_VERSIONS), record_key(bucket, key, seq), encode_record(&Record { id, ino: old, uid: victim.uid, mtime_ns: victim.mtime_ns }));
    Ok(())
}

/// The sequence number and id of a key's newest version (the last allocated in this batch);
/// under Suspended it is the `null` version, which replaces the key's null record.
#[allow(clippy::too_many_arguments)] // one allocation and the key it belongs to
fn new_version(e: &Engine, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>, mut seqs: Seqs, bucket: Ino, key: &str, mode: VersionMode, nonce: u64) -> Result<(u64, String)> {
    let seq = seqs.take();
    let id = match mode {
        VersionMode::Enabled => version_id(seq, nonce),
        VersionMode::Suspended => {
            drop_null_record(e, batch, freed, bucket, key)?;
            NULL_VERSION.to_string()
        }
    };
    seqs.store(e, batch);
    Ok((seq, id))
}

/// The current file of `key` in directory `at`: (inode, record).
fn current_at(e: &Engine, at: &Option<(Ino, Vec<u8>)>) -> Result<Option<(Ino, InodeRec)>> {
    let Some((parent, name)) = at else { return Ok(None) };
    match e.load_dentry(*parent, name)? {
        Some((ino, FileKind::File)) => Ok(Some((ino, e.load(ino)?))),
        _ => Ok(None),
    }
}

fn load_dir(e: &Engine, ino: Ino) -> Result<InodeRec> {
    let d = e.load(ino)?;
    if d.kind != FileKind::Dir {
        return Err(Error::NotDir);
    }
    Ok(d)
}

pub(crate) fn apply(e: &Engine, cmd: &VersionCmd, batch: &mut WriteBatch, freed: &mut Vec<(u64, StripeRec)>) -> Result<Applied> {
    match cmd {
        VersionCmd::Publish { caller, ino, parent, name, bucket, key, mode, nonce, now } => {
            validate_name(name)?;
            let mut dir = load_dir(e, *parent)?;
            check(caller, &dir, W | X)?;
            let mut rec = e.load(*ino)?;
            let mut seqs = Seqs::load(e, *now)?;
            let mut events = Vec::new();
            if let Some((old, okind)) = e.load_dentry(*parent, name)? {
                if okind == FileKind::Dir {
                    return Err(Error::IsDir);
                }
                let victim = e.load(old)?;
                if !sticky_ok(caller, &dir, &victim) {
                    return Err(Error::PermissionDenied);
                }
                retire(e, batch, freed, &mut seqs, *bucket, key, old, victim, *mode, *now)?;
                events.push(ChangeEvent { ino: old, version: 0, kind: ChangeKind::Removed { parent: *parent, name: name.clone() } });
            }
            let (seq, id) = new_version(e, batch, freed, seqs, *bucket, key, *mode, *nonce)?;
            batch.put_cf(e.cf(CF_XATTRS), xattr_key(*ino, XATTR_VERSION), encode_current(seq, &id));
            batch.delete_cf(e.cf(CF_ORPHANS), be64(*ino));
            batch.put_cf(e.cf(CF_DENTRIES), dentry_key(*parent, name), encode_dentry(*ino, rec.kind));
            rec.ctime_ns = *now;
            rec.version += 1;
            e.put_inode(batch, *ino, &rec);
            e.put_touched(batch, *parent, &mut dir, *now);
            events.push(ChangeEvent { ino: *ino, version: rec.version, kind: ChangeKind::Created { parent: *parent, name: name.clone() } });
            Ok(Applied { attr: Some(attr_of(*ino, &rec)), events })
        }
        VersionCmd::Delete { caller, at, bucket, key, mode, nonce, now } => {
            let mut seqs = Seqs::load(e, *now)?;
            let mut events = Vec::new();
            // Whoever may delete objects in the bucket may add a delete marker.
            check(caller, &load_dir(e, *bucket)?, W | X)?;
            if let Some((old, victim)) = current_at(e, at)? {
                let (parent, name) = at.as_ref().expect("a current file has a place");
                let mut dir = load_dir(e, *parent)?;
                check(caller, &dir, W | X)?;
                if !sticky_ok(caller, &dir, &victim) {
                    return Err(Error::PermissionDenied);
                }
                batch.delete_cf(e.cf(CF_DENTRIES), dentry_key(*parent, name));
                retire(e, batch, freed, &mut seqs, *bucket, key, old, victim, *mode, *now)?;
                e.put_touched(batch, *parent, &mut dir, *now);
                events.push(ChangeEvent { ino: old, version: 0, kind: ChangeKind::Removed { parent: *parent, name: name.clone() } });
            }
            let (seq, id) = new_version(e, batch, freed, seqs, *bucket, key, *mode, *nonce)?;
            batch.put_cf(e.cf(CF_VERSIONS), record_key(*bucket, key, seq), encode_record(&Record { id, ino: 0, uid: caller.uid, mtime_ns: *now }));
            Ok(Applied { attr: None, events })
        }
        VersionCmd::Remove { caller, at, bucket, key, id, now } => {
            let mut events = Vec::new();
            let mut records = records_of(e, *bucket, key)?;
            let current = current_at(e, at)?;
            let had_current = current.is_some();
            let current_id = match &current {
                Some((ino, _)) => Some(current_version(e, *ino)?.map_or_else(|| NULL_VERSION.to_string(), |v| v.1)),
                None => None,
            };
            let mut dir = None;
            let promote = if current_id.as_deref() == Some(id.as_str()) {
                let (old, victim) = current.expect("a current id has a file");
                let (parent, name) = at.as_ref().expect("a current file has a place");
                let d = dir.insert(load_dir(e, *parent)?);
                check(caller, d, W | X)?;
                if !sticky_ok(caller, d, &victim) {
                    return Err(Error::PermissionDenied);
                }
                batch.delete_cf(e.cf(CF_DENTRIES), dentry_key(*parent, name));
                e.drop_link(batch, freed, old, victim, *now)?;
                events.push(ChangeEvent { ino: old, version: 0, kind: ChangeKind::Removed { parent: *parent, name: name.clone() } });
                true
            } else if let Some(pos) = records.iter().position(|(_, r)| r.id == *id) {
                let b = load_dir(e, *bucket)?;
                check(caller, &b, W | X)?;
                let (seq, r) = records.remove(pos);
                if r.ino != 0 {
                    // Only its owner (or who may write it) removes an object version, as for
                    // a file in a sticky directory.
                    let vrec = e.load(r.ino)?;
                    if !sticky_ok(caller, &b, &vrec) {
                        return Err(Error::PermissionDenied);
                    }
                    free_inode(e, batch, freed, r.ino)?;
                }
                batch.delete_cf(e.cf(CF_VERSIONS), record_key(*bucket, key, seq));
                pos == 0 && current.is_none()
            } else {
                return Err(Error::NotFound);
            };
            // The next newest version becomes current, if it is an object and its name is
            // free (a directory made there since, for keys below it, stays).
            if promote
                && let Some((seq, r)) = records.first()
                && r.ino != 0
                && let Some((parent, name)) = at
                && (had_current || e.load_dentry(*parent, name)?.is_none())
            {
                if dir.is_none() {
                    dir = Some(load_dir(e, *parent)?);
                }
                check(caller, dir.as_ref().expect("loaded"), W | X)?;
                let mut rec = e.load(r.ino)?;
                batch.delete_cf(e.cf(CF_VERSIONS), record_key(*bucket, key, *seq));
                batch.delete_cf(e.cf(CF_ORPHANS), be64(r.ino));
                batch.put_cf(e.cf(CF_XATTRS), xattr_key(r.ino, XATTR_VERSION), encode_current(*seq, &r.id));
                batch.put_cf(e.cf(CF_DENTRIES), dentry_key(*parent, name), encode_dentry(r.ino, FileKind::File));
                rec.ctime_ns = *now;
                rec.version += 1;
                e.put_inode(batch, r.ino, &rec);
                events.push(ChangeEvent { ino: r.ino, version: rec.version, kind: ChangeKind::Created { parent: *parent, name: name.clone() } });
            }
            if let (Some(d), Some((parent, _))) = (&mut dir, at) {
                e.put_touched(batch, *parent, d, *now);
            }
            Ok(Applied { attr: None, events })
        }
    }
}

impl Engine {
    /// Where `key`'s file is or would be (its directory, created when `create`), or `None`
    /// when a directory on the way is missing (or is a file).
    fn version_place(&self, caller: &Caller, bucket: Ino, key: &str, create: bool) -> Result<Option<(Ino, Vec<u8>)>> {
        match self.object_parent(caller, bucket, key, create) {
            Ok((parent, name)) => Ok(Some((parent, name.as_bytes().to_vec()))),
            Err(Error::NotFound) if !create => Ok(None),
            // A file where a directory of the key would be: the key has no place now.
            Err(Error::NotDir) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Publishes staged file `ino` as the newest version of `key` in versioned bucket
    /// `bucket` (file `name` in `parent`), durably; the file it replaces becomes noncurrent
    /// in the same batch. Returns the object and its version id.
    #[allow(clippy::too_many_arguments)] // a publish plus the key it versions
    pub fn finish_put_versioned(&self, caller: &Caller, ino: Ino, parent: Ino, name: &[u8], bucket: Ino, key: &str, mode: VersionMode) -> Result<(Attr, String)> {
        split_key(key)?;
        self.remote_refuse(caller, parent, "versioned object write")?;
        self.flush_data_durable(ino)?;
        let cmd = VersionCmd::Publish { caller: caller.clone(), ino, parent, name: name.to_vec(), bucket, key: key.to_string(), mode, nonce: rand::random(), now: self.now() };
        let attr = self.execute(Command::Version(cmd), true)?.expect("publish returns attributes");
        // The id stays with the inode for as long as it exists (current or not).
        let id = current_version(self, ino)?.map_or_else(|| NULL_VERSION.to_string(), |v| v.1);
        Ok((attr, id))
    }

    /// Deletes `key` in a versioned bucket: a delete marker becomes its newest version and
    /// its current file (if any) noncurrent. Returns the marker's version id.
    pub fn delete_versioned(&self, caller: &Caller, bucket: Ino, key: &str, mode: VersionMode) -> Result<String> {
        split_key(key)?;
        self.remote_refuse(caller, bucket, "versioned delete")?;
        let at = self.version_place(caller, bucket, key, false)?;
        let nonce: u64 = rand::random();
        let cmd = VersionCmd::Delete { caller: caller.clone(), at, bucket, key: key.to_string(), mode, nonce, now: self.now() };
        self.execute(Command::Version(cmd), true)?;
        if mode == VersionMode::Suspended {
            return Ok(NULL_VERSION.to_string());
        }
        let suffix = format!("{nonce:016x}");
        records_of(self, bucket, key)?
            .into_iter()
            .find(|(_, r)| r.ino == 0 && r.id.ends_with(&suffix))
            .map(|(_, r)| r.id)
            .ok_or_else(|| Error::Io("the delete marker just added is gone".into()))
    }

    /// Removes version `id` of `key` for good (its data is freed). When it was the newest,
    /// the next newest becomes the current file if it is an object. `Error::NotFound` when
    /// the key has no such version.
    pub fn delete_version(&self, caller: &Caller, bucket: Ino, key: &str, id: &str) -> Result<()> {
        split_key(key)?;
        self.remote_refuse(caller, bucket, "version delete")?;
        // The key's directories are made first when a version may come back as the file;
        // the protocol removes those left empty.
        let may_promote = !records_of(self, bucket, key)?.is_empty();
        let at = self.version_place(caller, bucket, key, may_promote)?;
        let cmd = VersionCmd::Remove { caller: caller.clone(), at, bucket, key: key.to_string(), id: id.to_string(), now: self.now() };
        self.execute(Command::Version(cmd), true).map(|_| ())
    }

    /// The version id of a current file (`null` for one written without versioning).
    pub fn version_id_of(&self, ino: Ino) -> Result<String> {
        Ok(current_version(self, ino)?.map_or_else(|| NULL_VERSION.to_string(), |v| v.1))
    }

    /// The current file of `key`, if any.
    fn current_file(&self, caller: &Caller, bucket: Ino, key: &str) -> Result<Option<Attr>> {
        let Some((parent, name)) = self.version_place(caller, bucket, key, false)? else { return Ok(None) };
        match self.lookup(caller, parent, &name) {
            Ok(a) if a.kind == FileKind::File => Ok(Some(a)),
            Ok(_) | Err(Error::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What version `id` of `key` is; `Error::NotFound` when the key has no such version.
    pub fn find_version(&self, caller: &Caller, bucket: Ino, key: &str, id: &str) -> Result<FoundVersion> {
        split_key(key)?;
        let current = self.current_file(caller, bucket, key)?;
        if let Some(a) = &current
            && self.version_id_of(a.ino)? == id
        {
            return Ok(FoundVersion::Current(a.clone()));
        }
        let wanted = if id == NULL_VERSION { None } else { Some(seq_of_version_id(id).ok_or(Error::NotFound)?) };
        let records = records_of(self, bucket, key)?;
        for (i, (seq, r)) in records.iter().enumerate() {
            if r.id != id || wanted.is_some_and(|w| w != *seq) {
                continue;
            }
            if r.ino == 0 {
                return Ok(FoundVersion::DeleteMarker { latest: i == 0 && current.is_none(), uid: r.uid, mtime_ns: r.mtime_ns });
            }
            return Ok(FoundVersion::Noncurrent(self.getattr(caller, r.ino)?));
        }
        Err(Error::NotFound)
    }

    /// The newest version of `key` when it is a delete marker and the key has no current
    /// file: its id.
    pub fn latest_delete_marker(&self, caller: &Caller, bucket: Ino, key: &str) -> Result<Option<String>> {
        split_key(key)?;
        if self.current_file(caller, bucket, key)?.is_some() {
            return Ok(None);
        }
        Ok(records_of(self, bucket, key)?.into_iter().next().filter(|(_, r)| r.ino == 0).map(|(_, r)| r.id))
    }

    /// Whether `bucket` holds noncurrent versions or delete markers (it cannot be removed
    /// while it does).
    pub fn bucket_has_versions(&self, bucket: Ino) -> Result<bool> {
        has_versions(self, bucket)
    }

    /// Every version of `key`, newest first (the current file, then the records).
    fn versions_of_key(&self, caller: &Caller, bucket: Ino, key: &str, current: Option<Attr>) -> Result<Vec<VersionEntry>> {
        let mut out = Vec::new();
        let has_current = current.is_some();
        let mut newer: Option<i64> = None;
        if let Some(a) = current {
            let v = current_version(self, a.ino)?;
            newer = Some(v.as_ref().map_or(a.mtime_ns, |v| v.0 as i64));
            // A file without a version is newer than every record.
            let seq = v.as_ref().map_or(u64::MAX, |v| v.0);
            let id = v.map_or_else(|| NULL_VERSION.to_string(), |v| v.1);
            out.push(VersionEntry { key: key.to_string(), id, latest: true, current: true, successor_ns: None, kind: VersionKind::Object(a), seq });
        }
        for (i, (seq, r)) in records_of(self, bucket, key)?.into_iter().enumerate() {
            let successor_ns = newer.replace(seq as i64);
            let kind = if r.ino == 0 {
                VersionKind::DeleteMarker { uid: r.uid, mtime_ns: r.mtime_ns }
            } else {
                match self.getattr(caller, r.ino) {
                    Ok(a) => VersionKind::Object(a),
                    Err(Error::NotFound) => continue, // removed while listing
                    Err(e) => return Err(e),
                }
            };
            out.push(VersionEntry { key: key.to_string(), id: r.id, latest: i == 0 && !has_current, current: false, successor_ns, kind, seq });
        }
        Ok(out)
    }

    /// Lists the versions of the keys below `bucket` that start with `prefix`, in key order
    /// and newest first within a key, from after (`key_marker`, `version_marker`): all of
    /// `key_marker` is skipped without a version marker. Keys whose rest after the prefix
    /// holds `delimiter` roll up into common prefixes. At most `max` entries (versions plus
    /// prefixes).
    #[allow(clippy::too_many_arguments)] // S3's ListObjectVersions parameters
    pub fn list_versions(&self, caller: &Caller, bucket: Ino, prefix: &str, delimiter: Option<&str>, key_marker: &str, version_marker: Option<&str>, max: usize) -> Result<VersionPage> {
        let max = max.clamp(1, LIST_KEYS_MAX);
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut out = VersionOut { page: VersionPage::default(), max, last: None, done: false };
        // The rest of the marker's key, after the marked version.
        if let Some(vm) = version_marker
            && !key_marker.is_empty()
            && key_marker.starts_with(prefix)
            && split_key(key_marker).is_ok()
        {
            let current = self.current_file(caller, bucket, key_marker)?;
            let all = self.versions_of_key(caller, bucket, key_marker, current)?;
            // The versions after the marker; when the marked version is gone (deleted since
            // the last page), those older than its sequence number, or all for `null`.
            let rest: Vec<VersionEntry> = match all.iter().position(|v| v.id == vm) {
                Some(pos) => all.into_iter().skip(pos + 1).collect(),
                None => match seq_of_version_id(vm) {
                    Some(ms) => all.into_iter().filter(|v| v.seq < ms).collect(),
                    None => all,
                },
            };
            for v in rest {
                if !out.emit(v) {
                    return Ok(out.page);
                }
            }
        }
        let start_after = if key_marker.as_bytes() > prefix.as_bytes() { key_marker.as_bytes().to_vec() } else { Vec::new() };
        let mut currents = CurrentStream { start_after: start_after.clone(), buf: std::collections::VecDeque::new(), more: true };
        let bp = bucket_prefix(bucket);
        let mut it = self.db.raw_iterator_cf(self.cf(CF_VERSIONS));
        let seek_after = |it: &mut rocksdb::DBRawIteratorWithThreadMode<'_, rocksdb::DB>, after: &[u8]| {
            // Past every record of key `after` (whose next byte is NUL) and, for a common
            // prefix, of every key below it.
            let mut k = bp.clone();
            k.extend_from_slice(after);
            k.push(0xff);
            it.seek(&k);
        };
        if start_after.is_empty() {
            let mut k = bp.clone();
            k.extend_from_slice(prefix.as_bytes());
            it.seek(&k);
        } else {
            let mut k = bp.clone();
            k.extend_from_slice(&start_after);
            k.push(1);
            it.seek(&k);
        }
        loop {
            let a = currents.peek(self, caller, bucket, prefix)?.map(|o| o.key.clone());
            it.status()?;
            let b = match it.key() {
                Some(k) if it.valid() && k.starts_with(&bp) && k[bp.len()..].starts_with(prefix.as_bytes()) => Some(parse_record_key(bucket, k)?.0.into_bytes()),
                _ => None,
            };
            let key = match (a, b) {
                (None, None) => break,
                (Some(x), None) | (None, Some(x)) => x,
                (Some(x), Some(y)) => x.min(y),
            };
            let key = String::from_utf8(key).map_err(|_| Error::Corrupt("object key not UTF-8".into()))?;
            if let Some(d) = delimiter
                && let Some(pos) = key[prefix.len()..].find(d)
            {
                let cp = key[..prefix.len() + pos + d.len()].to_string();
                if cp.as_str() > key_marker && !out.emit_prefix(cp.clone()) {
                    break;
                }
                let mut past = cp.clone().into_bytes();
                past.push(0xff);
                currents.skip_to(past);
                seek_after(&mut it, cp.as_bytes());
                continue;
            }
            let current = match currents.peek(self, caller, bucket, prefix)? {
                Some(o) if o.key == key.as_bytes() => currents.buf.pop_front().map(|o| o.attr),
                _ => None,
            };
            let vs = self.versions_of_key(caller, bucket, &key, current)?;
            seek_after(&mut it, key.as_bytes());
            if vs.iter().any(|v| !out.emit(v.clone())) {
                break;
            }
        }
        Ok(out.page)
    }
}

/// Current objects of a version listing, read in batches.
struct CurrentStream {
    start_after: Vec<u8>,
    buf: std::collections::VecDeque<crate::objects::ObjectEntry>,
    more: bool,
}

impl CurrentStream {
    fn peek(&mut self, e: &Engine, caller: &Caller, bucket: Ino, prefix: &str) -> Result<Option<&crate::objects::ObjectEntry>> {
        if self.buf.is_empty() && self.more {
            let page = e.list_objects(caller, bucket, prefix.as_bytes(), None, &self.start_after, LIST_CURRENT_BATCH)?;
            match page.next_start_after {
                Some(n) => self.start_after = n,
                None => self.more = false,
            }
            self.buf.extend(page.objects);
        }
        Ok(self.buf.front())
    }

    /// Drops the objects up to `after` and reads on from there.
    fn skip_to(&mut self, after: Vec<u8>) {
        while self.buf.front().is_some_and(|o| o.key <= after) {
            self.buf.pop_front();
        }
        if self.buf.is_empty() && self.more && after > self.start_after {
            self.start_after = after;
        }
    }
}

struct VersionOut {
    page: VersionPage,
    max: usize,
    last: Option<(String, Option<String>)>,
    done: bool,
}

impl VersionOut {
    fn full(&mut self) -> bool {
        if self.page.versions.len() + self.page.common_prefixes.len() >= self.max {
            self.page.next = self.last.clone();
            self.done = true;
        }
        self.done
    }

    /// Adds a version; false when the page was already full (and is now closed).
    fn emit(&mut self, v: VersionEntry) -> bool {
        if self.full() {
            return false;
        }
        self.last = Some((v.key.clone(), Some(v.id.clone())));
        self.page.versions.push(v);
        true
    }

    fn emit_prefix(&mut self, cp: String) -> bool {
        if self.page.common_prefixes.last() == Some(&cp) {
            return true;
        }
        if self.full() {
            return false;
        }
        self.last = Some((cp.clone(), None));
        self.page.common_prefixes.push(cp);
        true
    }
}
