//! The share backend: SMB paths and handles mapped onto engine calls, each made as the user
//! whose session sent the request, so the engine enforces permissions.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use smb_server::{
    BackendCapabilities, Bytes, DirEntry, ExtendedAttribute, FileInfo, FileTimes, Handle, Identity, OpenAction,
    OpenIntent, OpenOptions, ShareBackend, SmbError, SmbPath, SmbResult, UnixSecurity, UnixSecurityChange, VolumeInfo,
};
use storage_engine::{Attr, Caller, Engine, Error, FileKind, Ino, SetAttr, Stability, TimeSet, XATTR_NAME_BYTES_MAX};

/// Entries fetched per engine readdir call while listing a directory.
const READDIR_PAGE: usize = 1024;
/// Mode bits of files and directories created over SMB (before the engine's own rules).
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;
/// FILETIME of the Unix epoch (100 ns ticks since 1601-01-01).
const FILETIME_UNIX_EPOCH: i64 = 116_444_736_000_000_000;
const FILE_ATTRIBUTE_READONLY: u32 = 0x1;
const FILE_ATTRIBUTE_HIDDEN: u32 = 0x2;
const FILE_ATTRIBUTE_SYSTEM: u32 = 0x4;
const FILE_ATTRIBUTE_ARCHIVE: u32 = 0x20;
const FILE_ATTRIBUTE_NORMAL: u32 = 0x80;
/// The DOS attributes kept in [`XATTR_DOS_ATTRIBUTES`].
const STORED_ATTRIBUTES: u32 = FILE_ATTRIBUTE_HIDDEN | FILE_ATTRIBUTE_SYSTEM;
/// Extended attribute holding a file's FILE_ATTRIBUTE_HIDDEN and FILE_ATTRIBUTE_SYSTEM, as a
/// 4-byte little-endian mask (Samba keeps them in `user.DOSATTRIB` the same way); absent when
/// neither is set.
const XATTR_DOS_ATTRIBUTES: &[u8] = b"aquifer.smb.dos_attributes";
/// Prefix of the engine xattrs that hold SMB extended attributes: the EA `NAME` is the xattr
/// `user.NAME`, the namespace Linux gives users' own attributes and the one Samba keeps EAs in.
/// SMB EAs are read and written only under it, so a client can never reach Aquifer's own
/// attributes (`aquifer.*`, such as the DOS attributes above or S3's metadata) or `trusted.*`.
const EA_XATTR_PREFIX: &[u8] = b"user.";
/// Allocation unit reported to clients.
const BLOCK: u64 = 4096;
/// Bytes read ahead for a handle read sequentially: one engine stripe (four 1 MiB data shards
/// read from four drives at once), so a client's MiB-sized READs do not each wait for their
/// own drive read.
const READ_AHEAD: usize = 4 << 20;
/// Read-ahead chunks being read at once for one handle, beyond the one being served: two
/// keep the drives busy while a client's pipelined READs take a chunk faster than one stripe
/// read completes.
const READ_AHEAD_DEPTH: usize = 2;
/// Most read-ahead bytes held by one share's handles together; past it reads go straight to
/// the engine.
const READ_AHEAD_BUDGET: usize = 256 << 20;

/// The one mapping of engine errors to SMB errors (and so to NTSTATUS).
pub fn smb_error(e: Error) -> SmbError {
    match e {
        Error::NotFound | Error::Stale => SmbError::NotFound,
        Error::Exists => SmbError::Exists,
        Error::NotDir => SmbError::NotADirectory,
        Error::IsDir => SmbError::IsDirectory,
        Error::NotEmpty => SmbError::NotEmpty,
        Error::PermissionDenied | Error::Unauthenticated => SmbError::AccessDenied,
        Error::InvalidName(_) => SmbError::NameInvalid,
        Error::NoSpace(_) => SmbError::DiskFull,
        Error::NotSupported(_) | Error::NotSymlink => SmbError::NotSupported,
        Error::InvalidArgument(m) => SmbError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, m)),
        Error::FileTooLarge => SmbError::DiskFull,
        Error::TooManyLinks => SmbError::AccessDenied,
        Error::Busy(_) => SmbError::Sharing,
        Error::ReadOnly(_) => SmbError::AccessDenied,
        e @ (Error::Unavailable(_) | Error::Io(_) | Error::Corrupt(_) | Error::Metadata(_)) => {
            SmbError::Io(std::io::Error::other(e.to_string()))
        }
    }
}

fn filetime(ns: i64) -> u64 {
    (ns.div_euclid(100) + FILETIME_UNIX_EPOCH).max(0) as u64
}

fn unix_ns(filetime: u64) -> i64 {
    (filetime as i64 - FILETIME_UNIX_EPOCH).saturating_mul(100)
}

/// The hidden and system attributes stored for `ino`; 0 when none are. Read as the engine, as
/// any open of the file may report them.
fn dos_attributes(e: &Engine, ino: Ino) -> u32 {
    e.getxattr(&Caller::system(), ino, XATTR_DOS_ATTRIBUTES)
        .ok()
        .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
        .map_or(0, u32::from_le_bytes)
        & STORED_ATTRIBUTES
}

/// Stores the hidden and system bits of `attributes` for `ino` as `c`, who needs write
/// permission on the file, as for any xattr.
fn set_dos_attributes(e: &Engine, c: &Caller, ino: Ino, attributes: u32) -> storage_engine::Result<()> {
    let stored = attributes & STORED_ATTRIBUTES;
    if stored == dos_attributes(e, ino) {
        return Ok(());
    }
    if stored == 0 {
        return match e.removexattr(c, ino, XATTR_DOS_ATTRIBUTES) {
            Err(Error::NotFound) => Ok(()),
            other => other,
        };
    }
    e.setxattr(c, ino, XATTR_DOS_ATTRIBUTES, &stored.to_le_bytes())
}

/// The xattr holding the SMB extended attribute `name`.
fn ea_xattr(name: &str) -> Vec<u8> {
    [EA_XATTR_PREFIX, name.as_bytes()].concat()
}

/// The SMB extended attributes of `ino` read as `c`, in xattr name order: the `user.` xattrs
/// whose names are valid EA names and whose values are not empty.
fn extended_attributes(e: &Engine, c: &Caller, ino: Ino) -> storage_engine::Result<Vec<ExtendedAttribute>> {
    let mut out = Vec::new();
    for xattr in e.listxattr(c, ino)? {
        let Some(name) = xattr.strip_prefix(EA_XATTR_PREFIX) else { continue };
        if !smb_server::valid_ea_name(name) {
            continue;
        }
        let name = String::from_utf8(name.to_vec()).expect("valid EA names are ASCII");
        match e.getxattr(c, ino, &xattr) {
            Ok(value) if !value.is_empty() => out.push(ExtendedAttribute::new(name, value)),
            Ok(_) | Err(Error::NotFound) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(out)
}

/// Applies SMB extended attribute changes to `ino` as `c` (who needs to own the file or may
/// write it, as for any xattr): each replaces the attribute of its name in any ASCII case, or
/// removes it when its value is empty. Names the engine cannot store (over its xattr name
/// limit with the prefix) are refused before anything changes.
fn set_extended_attributes(e: &Engine, c: &Caller, ino: Ino, changes: &[ExtendedAttribute]) -> SmbResult<()> {
    if changes.iter().any(|ch| EA_XATTR_PREFIX.len() + ch.name.len() > XATTR_NAME_BYTES_MAX) {
        return Err(SmbError::InvalidEaName);
    }
    // Names only, so read as the engine: the caller's right to change them is checked on write.
    let mut stored: Vec<Vec<u8>> = e
        .listxattr(&Caller::system(), ino)
        .map_err(smb_error)?
        .into_iter()
        .filter(|x| x.starts_with(EA_XATTR_PREFIX))
        .collect();
    for ch in changes {
        let xattr = ea_xattr(&ch.name);
        let same = |x: &Vec<u8>| x[EA_XATTR_PREFIX.len()..].eq_ignore_ascii_case(ch.name.as_bytes());
        for old in stored.iter().filter(|x| same(x) && (ch.value.is_empty() || **x != xattr)) {
            match e.removexattr(c, ino, old) {
                Ok(()) | Err(Error::NotFound) => {}
                Err(err) => return Err(smb_error(err)),
            }
        }
        stored.retain(|x| !same(x));
        if !ch.value.is_empty() {
            e.setxattr(c, ino, &xattr, &ch.value).map_err(smb_error)?;
            stored.push(xattr);
        }
    }
    Ok(())
}

/// The entry of directory `dir` whose short name is `short` (any ASCII case), by its long
/// name: a scan of the directory's names.
fn find_by_short_name(e: &Engine, c: &Caller, dir: Ino, short: &str) -> SmbResult<Option<String>> {
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let page = e.readdir(c, dir, cursor.as_deref(), READDIR_PAGE).map_err(smb_error)?;
        for entry in &page.entries {
            let Ok(name) = std::str::from_utf8(&entry.name) else { continue };
            if smb_server::short_name(name).is_some_and(|s| s.eq_ignore_ascii_case(short)) {
                return Ok(Some(name.to_string()));
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(None),
        }
    }
}

/// Whether a listing's `pattern` takes the entry `name`: by its name, or by its short name
/// (any case, as DOS names go), as MS-FSA 2.1.5.6.3 has a directory query match either.
fn matches(pattern: &str, name: &str, ignore_case: bool) -> bool {
    smb_server::name_matches(pattern, name, ignore_case)
        || smb_server::short_name(name).is_some_and(|short| smb_server::name_matches(pattern, &short, true))
}

fn file_info(name: &str, a: &Attr, dos: u32) -> FileInfo {
    let mut info = FileInfo::new(name);
    info.dos_attributes = dos;
    info.is_directory = a.kind == FileKind::Dir;
    info.end_of_file = if info.is_directory { 0 } else { a.size };
    info.allocation_size = info.end_of_file.div_ceil(BLOCK) * BLOCK;
    info.creation_time = filetime(a.btime_ns);
    info.last_access_time = filetime(a.atime_ns);
    info.last_write_time = filetime(a.mtime_ns);
    info.change_time = filetime(a.ctime_ns);
    // The owner's write bit is the DOS read-only attribute, as Samba maps it.
    info.read_only = !info.is_directory && a.mode & 0o200 == 0;
    info.file_index = a.ino;
    info
}

/// Runs blocking engine work off the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> SmbResult<T> + Send + 'static) -> SmbResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| SmbError::Io(std::io::Error::other(e)))?
}

/// One share: a directory of the namespace.
pub struct EngineShare {
    engine: Arc<Engine>,
    /// The share's root in the namespace, `/`-separated, without a trailing `/`.
    root: String,
    read_only: bool,
    /// Sessions without an account (guest, anonymous) act as `Caller::anonymous()`.
    guest: bool,
    /// Read-ahead bytes its handles hold now (at most [`READ_AHEAD_BUDGET`]).
    ahead_bytes: Arc<AtomicUsize>,
}

impl EngineShare {
    pub fn new(engine: Arc<Engine>, path: &str, read_only: bool, guest: bool) -> EngineShare {
        let root = path.split('/').filter(|c| !c.is_empty()).collect::<Vec<_>>().join("/");
        EngineShare { engine, root, read_only, guest, ahead_bytes: Arc::new(AtomicUsize::new(0)) }
    }

    /// Where `path` lies in the namespace.
    fn full(&self, path: &SmbPath) -> String {
        let mut s = self.root.clone();
        for c in path.components() {
            if !s.is_empty() {
                s.push('/');
            }
            s.push_str(c);
        }
        s
    }

    /// Resolves the two names of a rename or a link as the request's caller sees them and
    /// runs `f` on them off the async runtime. Neither name may be the share's root.
    async fn with_names(
        &self,
        from: &SmbPath,
        to: &SmbPath,
        f: impl FnOnce(&Engine, &Caller, Names<'_>) -> SmbResult<()> + Send + 'static,
    ) -> SmbResult<()> {
        if from.is_root() || to.is_root() {
            return Err(SmbError::AccessDenied);
        }
        let engine = self.engine.clone();
        let caller = request_caller(&engine, self.guest)?;
        let (from, to) = (self.full(from), self.full(to));
        blocking(move || {
            let (from_dir, from_name) = split(&from);
            let (to_dir, to_name) = split(&to);
            let from_parent = resolve_dir(&engine, &caller, from_dir)?;
            let source = lookup(&engine, &caller, from_parent.ino, from_name)?.ok_or(SmbError::NotFound)?;
            let to_parent = resolve_dir(&engine, &caller, to_dir)?;
            let target = lookup(&engine, &caller, to_parent.ino, to_name)?;
            f(&engine, &caller, Names { from_parent, from_name, source, to_parent, to_name, target })
        })
        .await
    }
}

/// The source and the destination of a rename or a link.
struct Names<'a> {
    from_parent: Attr,
    from_name: &'a str,
    /// What `from` names.
    source: Attr,
    to_parent: Attr,
    to_name: &'a str,
    /// What `to` names now, if anything.
    target: Option<Attr>,
}

/// The engine caller for the session whose request is being served. Outside a request (an
/// open closed at connection teardown) nobody is acting, and nothing is allowed.
fn request_caller(engine: &Engine, guest: bool) -> SmbResult<Caller> {
    match smb_server::request_identity() {
        Some(Identity::User { user, .. }) => engine.caller_for_user(&user).map_err(|_| SmbError::AccessDenied),
        Some(Identity::Anonymous) if guest => Ok(Caller::anonymous()),
        _ => Err(SmbError::AccessDenied),
    }
}

/// Resolves the directory holding `path`'s last component: a missing or non-directory
/// component on the way is STATUS_OBJECT_PATH_NOT_FOUND, as Windows answers.
fn resolve_dir(engine: &Engine, caller: &Caller, dir: &str) -> SmbResult<Attr> {
    match engine.resolve(caller, dir) {
        Ok(a) if a.kind == FileKind::Dir => Ok(a),
        Ok(_) | Err(Error::NotFound | Error::NotDir) => Err(SmbError::PathNotFound),
        Err(e) => Err(smb_error(e)),
    }
}

fn split(full: &str) -> (&str, &str) {
    match full.rfind('/') {
        Some(i) => (&full[..i], &full[i + 1..]),
        None => ("", full),
    }
}

/// Looks up `name` in `parent`: `None` when it does not exist.
fn lookup(engine: &Engine, caller: &Caller, parent: Ino, name: &str) -> SmbResult<Option<Attr>> {
    match engine.lookup(caller, parent, name.as_bytes()) {
        Ok(a) => Ok(Some(a)),
        Err(Error::NotFound) => Ok(None),
        Err(e) => Err(smb_error(e)),
    }
}

/// Opens `full` for `opts`. `in_place`: called where the request is served, so nothing that may
/// wait is done: `Ok(None)`, with nothing changed, when the open needs more than metadata
/// reads and a file created without waiting (`Engine::try_create`), for the caller to open
/// again on the blocking pool. Otherwise always `Some`.
fn open_file(engine: &Arc<Engine>, caller: &Caller, full: &str, root: bool, opts: OpenOptions, in_place: bool) -> SmbResult<Option<(Attr, OpenAction)>> {
    let (attr, action) = if root {
        let a = engine.resolve(caller, full).map_err(|e| match e {
            Error::NotFound | Error::NotDir => SmbError::PathNotFound,
            e => smb_error(e),
        })?;
        (a, OpenAction::Opened)
    } else {
        let (dir, name) = split(full);
        let parent = resolve_dir(engine, caller, dir)?;
        let existing = lookup(engine, caller, parent.ino, name)?;
        let create = |engine: &Engine| -> SmbResult<Option<Attr>> {
            let made = if opts.directory {
                if in_place {
                    return Ok(None);
                }
                engine.mkdir(caller, parent.ino, name.as_bytes(), DIR_MODE)
            } else if in_place {
                match engine.try_create(caller, parent.ino, name.as_bytes(), FILE_MODE, true) {
                    Some(made) => made,
                    None => return Ok(None),
                }
            } else {
                engine.create(caller, parent.ino, name.as_bytes(), FILE_MODE, true)
            };
            made.map(Some).map_err(smb_error)
        };
        // Truncating may free stripes: never in place.
        let overwrite = |a: Attr| -> SmbResult<Option<(Attr, OpenAction)>> {
            if a.kind == FileKind::Dir {
                return Err(SmbError::IsDirectory);
            }
            if in_place {
                return Ok(None);
            }
            let a = engine
                .setattr(caller, a.ino, SetAttr { size: Some(0), ..Default::default() })
                .map_err(smb_error)?;
            Ok(Some((a, OpenAction::Overwritten)))
        };
        match (opts.intent, existing) {
            (OpenIntent::Create, Some(_)) => return Err(SmbError::Exists),
            (OpenIntent::Open | OpenIntent::Truncate, None) => return Err(SmbError::NotFound),
            (OpenIntent::Create | OpenIntent::OpenOrCreate | OpenIntent::OverwriteOrCreate, None) => {
                match create(engine) {
                    Ok(Some(a)) => (a, OpenAction::Created),
                    Ok(None) => return Ok(None),
                    // Another client made the name between the lookup and the create: OPEN_IF
                    // and OVERWRITE_IF take what it made, as they would had it been there first
                    // (smbtorture's `create.mkdir-dup` races directory creations like this).
                    Err(SmbError::Exists) if opts.intent != OpenIntent::Create => {
                        let a = lookup(engine, caller, parent.ino, name)?.ok_or(SmbError::Exists)?;
                        if opts.intent == OpenIntent::OpenOrCreate {
                            (a, OpenAction::Opened)
                        } else {
                            match overwrite(a)? {
                                Some(done) => done,
                                None => return Ok(None),
                            }
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            (OpenIntent::Open | OpenIntent::OpenOrCreate, Some(a)) => (a, OpenAction::Opened),
            (OpenIntent::Truncate | OpenIntent::OverwriteOrCreate, Some(a)) => match overwrite(a)? {
                Some(done) => done,
                None => return Ok(None),
            },
            // OpenIntent is non-exhaustive: a disposition added upstream is refused until mapped.
            _ => return Err(SmbError::NotSupported),
        }
    };
    let is_dir = attr.kind == FileKind::Dir;
    if opts.directory && !is_dir {
        return Err(SmbError::NotADirectory);
    }
    if opts.non_directory && is_dir {
        return Err(SmbError::IsDirectory);
    }
    if !is_dir && action == OpenAction::Opened {
        // Data access is checked at open, as Windows does, not at the first READ or WRITE.
        let want = if opts.write { 2 } else { 0 } | if opts.read { 4 } else { 0 };
        let granted = engine.access(caller, attr.ino, want).map_err(smb_error)?;
        if granted != want {
            return Err(SmbError::AccessDenied);
        }
    }
    Ok(Some((attr, action)))
}

#[async_trait]
impl ShareBackend for EngineShare {
    async fn open(&self, path: &SmbPath, opts: OpenOptions) -> SmbResult<(Box<dyn Handle>, OpenAction)> {
        let engine = self.engine.clone();
        let caller = request_caller(&engine, self.guest)?;
        let full = self.full(path);
        let root = path.is_root();
        let name = path.file_name().unwrap_or_default().to_string();
        // Opened where the request is served when that takes only metadata reads and maybe a
        // file created without waiting, and no portal mirror could send a read to a hub (as
        // the handles' metadata reads, `EngineHandle::read_meta`): a trip to the blocking
        // pool costs a small file's open more than the reads do. Anything else (a directory
        // created, a file truncated, a mutation that would wait) on the blocking pool.
        let in_place = if engine.holds_mirrors() { None } else { open_file(&engine, &caller, &full, root, opts, true)? };
        let (attr, action, caller) = match in_place {
            Some((attr, action)) => (attr, action, caller),
            None => {
                blocking(move || {
                    let (attr, action) = open_file(&engine, &caller, &full, root, opts, false)?
                        .ok_or_else(|| SmbError::Io(std::io::Error::other("an open on the blocking pool did not complete")))?;
                    Ok((attr, action, caller))
                })
                .await?
            }
        };
        let handle = EngineHandle {
            engine: self.engine.clone(),
            caller,
            ino: attr.ino,
            name,
            is_dir: attr.kind == FileKind::Dir,
            case_sensitive: true,
            wrote: AtomicBool::new(false),
            writes_as_owner: opts.write,
            opened_by: smb_server::request_identity(),
            ahead: tokio::sync::Mutex::new(ReadAhead::default()),
            ahead_bytes: self.ahead_bytes.clone(),
        };
        Ok((Box::new(handle), action))
    }

    async fn unlink(&self, path: &SmbPath) -> SmbResult<()> {
        let engine = self.engine.clone();
        let caller = request_caller(&engine, self.guest)?;
        let full = self.full(path);
        if path.is_root() {
            return Err(SmbError::AccessDenied);
        }
        blocking(move || {
            let (dir, name) = split(&full);
            let parent = resolve_dir(&engine, &caller, dir)?;
            let a = lookup(&engine, &caller, parent.ino, name)?.ok_or(SmbError::NotFound)?;
            let r = if a.kind == FileKind::Dir {
                engine.rmdir(&caller, parent.ino, name.as_bytes())
            } else {
                engine.unlink(&caller, parent.ino, name.as_bytes())
            };
            r.map_err(smb_error)
        })
        .await
    }

    async fn rename(&self, from: &SmbPath, to: &SmbPath, replace_if_exists: bool) -> SmbResult<()> {
        self.with_names(from, to, move |engine, caller, m| {
            if let Some(target) = &m.target {
                if target.ino != m.source.ino {
                    if target.kind == FileKind::Dir {
                        return Err(SmbError::AccessDenied);
                    }
                    if !replace_if_exists {
                        return Err(SmbError::Exists);
                    }
                }
            }
            engine
                .rename(caller, m.from_parent.ino, m.from_name.as_bytes(), m.to_parent.ino, m.to_name.as_bytes())
                .map_err(smb_error)
        })
        .await
    }

    async fn link(&self, from: &SmbPath, to: &SmbPath, replace_if_exists: bool) -> SmbResult<()> {
        self.with_names(from, to, move |engine, caller, m| {
            if m.source.kind == FileKind::Dir {
                return Err(SmbError::AccessDenied);
            }
            if let Some(target) = &m.target {
                if target.kind == FileKind::Dir {
                    return Err(SmbError::AccessDenied);
                }
                if target.ino == m.source.ino {
                    return if replace_if_exists { Ok(()) } else { Err(SmbError::Exists) };
                }
                if !replace_if_exists {
                    return Err(SmbError::Exists);
                }
                // The old file goes and the new name comes in one engine step.
                return engine.link_replacing(caller, m.source.ino, m.to_parent.ino, m.to_name.as_bytes()).map(|_| ()).map_err(smb_error);
            }
            engine.link(caller, m.source.ino, m.to_parent.ino, m.to_name.as_bytes()).map(|_| ()).map_err(smb_error)
        })
        .await
    }

    fn capabilities(&self) -> BackendCapabilities {
        let mut c = BackendCapabilities::default();
        c.is_read_only = self.read_only;
        // The namespace is shared with NFS, S3 and SFTP, where `a` and `A` are two files.
        c.case_sensitive = true;
        c.extended_attributes = true;
        c
    }

    /// Walks `path` as the caller; a component that names nothing and has the shape of a short
    /// name is looked for among its directory's entries by their short names.
    async fn resolve_short_names(&self, path: &SmbPath) -> SmbResult<Option<SmbPath>> {
        let engine = self.engine.clone();
        let caller = request_caller(&engine, self.guest)?;
        let root = self.root.clone();
        let components = path.components().to_vec();
        blocking(move || {
            let mut dir = resolve_dir(&engine, &caller, &root)?;
            let mut long = Vec::with_capacity(components.len());
            let mut replaced = false;
            for (i, c) in components.iter().enumerate() {
                let mut found = lookup(&engine, &caller, dir.ino, c)?;
                let mut name = c.clone();
                if found.is_none()
                    && smb_server::looks_like_short_name(c)
                    && let Some(n) = find_by_short_name(&engine, &caller, dir.ino, c)?
                {
                    found = lookup(&engine, &caller, dir.ino, &n)?;
                    name = n;
                    replaced = true;
                }
                long.push(name);
                match found {
                    Some(a) if a.kind == FileKind::Dir => dir = a,
                    // Nothing below a file or a missing name to resolve: the rest stays.
                    _ => {
                        long.extend(components[i + 1..].iter().cloned());
                        break;
                    }
                }
            }
            if !replaced {
                return Ok(None);
            }
            long.join("\\").parse().map(Some)
        })
        .await
    }

    async fn volume_info(&self) -> SmbResult<VolumeInfo> {
        let engine = self.engine.clone();
        let fs = blocking(move || engine.statfs(&Caller::system()).map_err(smb_error)).await?;
        let mut v = VolumeInfo::default();
        v.total_allocation_units = fs.total_bytes / BLOCK;
        v.caller_available_allocation_units = fs.free_bytes / BLOCK;
        v.actual_available_allocation_units = fs.free_bytes / BLOCK;
        v.sectors_per_allocation_unit = 1;
        v.bytes_per_sector = BLOCK as u32;
        v.max_name_length = fs.name_bytes_max;
        Ok(v)
    }
}

/// An open file or directory: an inode and the caller who opened it.
struct EngineHandle {
    engine: Arc<Engine>,
    caller: Caller,
    ino: Ino,
    name: String,
    is_dir: bool,
    case_sensitive: bool,
    wrote: AtomicBool,
    /// The open was granted write access: its owner writes and resizes the file through it
    /// whatever the mode is by then, as on Windows and Samba, where access is checked once, at
    /// open. A client that copies a read-only file creates it with FILE_ATTRIBUTE_READONLY and
    /// writes its bytes after (Windows' CopyFile; the Linux client's `cp` of a 0444 file).
    writes_as_owner: bool,
    /// The session identity of the open: a delete-on-close completed by this handle's close
    /// runs as it, also at connection teardown.
    opened_by: Option<Identity>,
    ahead: tokio::sync::Mutex<ReadAhead>,
    ahead_bytes: Arc<AtomicUsize>,
}

/// What makes read-ahead bytes stale: any write, truncate or attribute change to the file,
/// through any protocol, moves its size, mtime or ctime (buffered writes included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl Stamp {
    fn of(a: &Attr) -> Stamp {
        Stamp { size: a.size, mtime_ns: a.mtime_ns, ctime_ns: a.ctime_ns }
    }
}

/// File bytes read from `offset` while the file had `stamp`; counted against the share's
/// read-ahead budget until dropped.
struct Chunk {
    offset: u64,
    /// The bytes from `offset`, in the pieces the drive reads left them (one 1 MiB shard
    /// each for striped data): a READ within one piece is sent from it without a copy.
    pieces: Vec<Bytes>,
    len: usize,
    stamp: Stamp,
    budget: Arc<AtomicUsize>,
    /// `data` is all the file had from `offset` (a short engine read): nothing follows it.
    at_eof: bool,
}

impl Chunk {
    /// Bytes `from..to` of the chunk (relative to its start): a slice of one piece, or a copy
    /// when the range crosses pieces.
    fn slice(&self, from: usize, to: usize) -> Bytes {
        let mut at = 0;
        let mut out: Option<Vec<u8>> = None;
        for p in &self.pieces {
            let (start, end) = (at, at + p.len());
            at = end;
            if end <= from || to <= start {
                continue;
            }
            let (a, b) = (from.max(start) - start, to.min(end) - start);
            if out.is_none() && from >= start && to <= end {
                return p.slice(a..b);
            }
            out.get_or_insert_with(|| Vec::with_capacity(to - from)).extend_from_slice(&p[a..b]);
        }
        out.map(Bytes::from).unwrap_or_default()
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.budget.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// A read-ahead chunk of a handle: read, or being read on the blocking pool.
enum Slot {
    Ready(Chunk),
    Reading(tokio::task::JoinHandle<SmbResult<Chunk>>),
}

/// Sequential read state of one handle: the furthest end of the READs of the current run, and
/// the chunks around it, in file order, each starting where the one before ends: one or two
/// behind the furthest READ (pipelined READs still on their way want them) and up to
/// [`READ_AHEAD_DEPTH`] ahead of it.
#[derive(Default)]
struct ReadAhead {
    next: u64,
    /// `(start, length asked for, chunk)`.
    chunks: std::collections::VecDeque<(u64, u64, Slot)>,
    /// Chunks started for this handle (each one engine read).
    started: u64,
    /// READs of a run read on their own, outside its chunks.
    direct: u64,
}

impl ReadAhead {
    fn clear(&mut self) {
        // A read still running finishes on its own; its chunk is dropped when it is done.
        self.chunks.clear();
    }

    /// Where the chunks end (where the next one would start).
    fn end(&self) -> Option<u64> {
        self.chunks.back().map(|(start, len, _)| start + len)
    }

    /// The chunks' stretch holds `[offset, offset + len)` (or its start, at the file's end).
    fn spans(&self, offset: u64, len: u64) -> bool {
        match (self.chunks.front(), self.end()) {
            (Some((start, _, _)), Some(end)) => *start <= offset && offset + len <= end,
            _ => false,
        }
    }

    /// Waits for the chunks that overlap `[offset, offset + len)` (which [`Self::spans`])
    /// and answers their bytes: a slice of one chunk's piece, or a copy across chunks; short
    /// only at the file's end. `None` when a chunk's read failed or it is stale (read under
    /// other attributes than `current`).
    async fn serve(&mut self, offset: u64, len: u64, current: Stamp) -> Option<Bytes> {
        let end = offset + len;
        let mut parts: Vec<Bytes> = Vec::new();
        for (start, asked, slot) in self.chunks.iter_mut() {
            if *start + *asked <= offset || end <= *start {
                continue;
            }
            if let Slot::Reading(task) = slot {
                match task.await {
                    Ok(Ok(c)) => *slot = Slot::Ready(c),
                    _ => return None,
                }
            }
            let Slot::Ready(c) = slot else { unreachable!("made ready above") };
            if c.stamp != current {
                return None;
            }
            let from = offset.max(c.offset) - c.offset;
            let to = (end.min(c.offset + *asked) - c.offset).min(c.len as u64);
            parts.push(c.slice(from.min(to) as usize, to as usize));
            if c.at_eof {
                break;
            }
        }
        match parts.len() {
            0 => None,
            1 => parts.pop(),
            _ => {
                let mut all = Vec::with_capacity(len as usize);
                for p in parts {
                    all.extend_from_slice(&p);
                }
                Some(Bytes::from(all))
            }
        }
    }
}

/// Reads `len` bytes at `offset` as a read-ahead chunk, taking its stamp first so a change
/// racing the read makes the chunk stale rather than the stamp new.
fn read_chunk(engine: &Engine, caller: &Caller, ino: Ino, offset: u64, len: usize, budget: Arc<AtomicUsize>) -> SmbResult<Chunk> {
    let stamp = Stamp::of(&engine.getattr(caller, ino).map_err(smb_error)?);
    let pieces: Vec<Bytes> = engine.read_shared(caller, ino, offset, len).map_err(smb_error)?.into_iter().map(Bytes::from_owner).collect();
    let total = pieces.iter().map(Bytes::len).sum::<usize>();
    budget.fetch_add(total, Ordering::Relaxed);
    let at_eof = total < len;
    Ok(Chunk { offset, pieces, len: total, stamp, budget, at_eof })
}

impl EngineHandle {
    async fn write_from(&self, offset: u64, data: std::borrow::Cow<'_, [u8]>) -> SmbResult<u32> {
        if self.is_dir {
            return Err(SmbError::IsDirectory);
        }
        let n = u32::try_from(data.len()).map_err(|_| SmbError::NotSupported)?;
        self.wrote.store(true, Ordering::Relaxed);
        self.ahead.lock().await.clear();
        // Unstable: collected in the engine's write buffer and flushed in whole stripes; FLUSH
        // (fsync on the client) commits, CLOSE flushes. A write that only adds to the buffer
        // is done here, without a trip to a blocking thread.
        let buffered = if self.writes_as_owner {
            self.engine.try_write_buffered_as_owner(&self.caller, self.ino, offset, &data)
        } else {
            self.engine.try_write_buffered(&self.caller, self.ino, offset, &data)
        };
        if buffered.map_err(smb_error)? {
            return Ok(n);
        }
        let data = data.into_owned();
        let as_owner = self.writes_as_owner;
        self.with(move |e, c, ino| {
            if as_owner { e.write_as_owner(c, ino, offset, &data, Stability::Unstable) } else { e.write(c, ino, offset, &data, Stability::Unstable) }
        })
        .await?;
        Ok(n)
    }

    async fn with<T: Send + 'static>(&self, f: impl FnOnce(&Engine, &Caller, Ino) -> storage_engine::Result<T> + Send + 'static) -> SmbResult<T> {
        let (engine, caller, ino) = (self.engine.clone(), self.caller.clone(), self.ino);
        blocking(move || f(&engine, &caller, ino).map_err(smb_error)).await
    }

    /// `with` for a few metadata reads (attributes, extended attributes, one entry): made
    /// where the request is served while no portal mirror could send one of them to a hub
    /// (`Engine::holds_mirrors`), since a trip to the blocking pool costs a small request more
    /// than the reads do; otherwise as `with`.
    async fn read_meta<T: Send + 'static>(&self, f: impl FnOnce(&Engine, &Caller, Ino) -> storage_engine::Result<T> + Send + 'static) -> SmbResult<T> {
        if self.engine.holds_mirrors() {
            return self.with(f).await;
        }
        f(&self.engine, &self.caller, self.ino).map_err(smb_error)
    }

    /// `Engine::read` of `len` bytes at `offset`: a small file's bytes in the metadata store
    /// are read where the request is served (`Engine::try_read_inline`, which declines, with
    /// nothing done, portal mirrors and whatever else could wait); otherwise on the blocking
    /// pool.
    async fn read_bytes(&self, offset: u64, len: usize) -> SmbResult<Vec<u8>> {
        if let Some(r) = self.engine.try_read_inline(&self.caller, self.ino, offset, len) {
            return r.map(|(data, _)| data).map_err(smb_error);
        }
        self.with(move |e, c, ino| e.read(c, ino, offset, len)).await
    }
}

#[async_trait]
impl Handle for EngineHandle {
    async fn read(&self, offset: u64, len: u32) -> SmbResult<Bytes> {
        if self.is_dir {
            return Err(SmbError::IsDirectory);
        }
        let mut ra = self.ahead.lock().await;
        let want = u64::from(len);
        // Read-ahead starts with the second READ that continues the one before. The library
        // runs a connection's READs concurrently, so a client's pipelined READs take this lock
        // in any order among themselves: one that falls in the chunks kept, or near the
        // furthest end so far, continues the run as well.
        let near = ra.next > 0 && offset <= ra.next + 2 * READ_AHEAD as u64 && offset + 2 * READ_AHEAD as u64 >= ra.next;
        let spans = ra.spans(offset, want);
        let beyond = ra.end().is_none_or(|e| offset >= e);
        let sequential = len > 0 && offset > 0 && (spans || (beyond && (offset == ra.next || (near && !ra.chunks.is_empty()))));
        if !sequential {
            if len > 0 && near && !ra.chunks.is_empty() {
                // Behind the run's chunks, or across their end: read on its own, the run left
                // as it is for the READs around it.
                ra.direct += 1;
                return Ok(Bytes::from(self.read_bytes(offset, len as usize).await?));
            }
            ra.clear();
            let out = self.read_bytes(offset, len as usize).await?;
            ra.next = offset + out.len() as u64;
            return Ok(Bytes::from(out));
        }
        let current = self.read_meta(|e, c, ino| e.getattr(c, ino)).await.map(|a| Stamp::of(&a))?;
        let chunk_len = READ_AHEAD.max(len as usize) as u64;
        // Chunks up to this READ: the first of a run starts at it; a READ that arrives ahead
        // of the chunks (its neighbours behind it still on their way) extends them to it. One
        // far past them (READs were served directly meanwhile) starts the run over from it.
        if ra.end().is_some_and(|e| offset >= e + 2 * READ_AHEAD as u64) {
            ra.clear();
        }
        while !ra.spans(offset, want) {
            if self.ahead_bytes.load(Ordering::Relaxed) + READ_AHEAD > READ_AHEAD_BUDGET {
                let out = self.read_bytes(offset, len as usize).await?;
                ra.next = ra.next.max(offset + out.len() as u64);
                return Ok(Bytes::from(out));
            }
            let start = ra.end().unwrap_or(offset);
            let (engine, caller, ino, budget) = (self.engine.clone(), self.caller.clone(), self.ino, self.ahead_bytes.clone());
            ra.started += 1;
            ra.chunks.push_back((start, chunk_len, Slot::Reading(tokio::task::spawn_blocking(move || read_chunk(&engine, &caller, ino, start, chunk_len as usize, budget)))));
        }
        let out = match ra.serve(offset, want, current).await {
            Some(out) => out,
            None => {
                // A chunk failed or the file changed since it was read: read directly.
                ra.clear();
                let out = self.read_bytes(offset, len as usize).await?;
                ra.next = offset + out.len() as u64;
                return Ok(Bytes::from(out));
            }
        };
        ra.next = ra.next.max(offset + out.len() as u64);
        // Chunks more than two behind the furthest READ are of no more use.
        let keep_from = ra.next.saturating_sub(2 * READ_AHEAD as u64);
        while ra.chunks.len() > 1 && ra.chunks.front().is_some_and(|(start, asked, _)| start + asked <= keep_from) {
            ra.chunks.pop_front();
        }
        // Read the next chunks while the client takes these, not past the file's end.
        let at_eof = ra.chunks.iter().any(|(_, _, s)| matches!(s, Slot::Ready(c) if c.at_eof));
        let reach = ra.next + (READ_AHEAD_DEPTH as u64) * chunk_len;
        while !at_eof && self.ahead_bytes.load(Ordering::Relaxed) + READ_AHEAD <= READ_AHEAD_BUDGET {
            let next = ra.end().expect("a chunk is kept");
            if next >= current.size || next >= reach {
                break;
            }
            let (engine, caller, ino, budget) = (self.engine.clone(), self.caller.clone(), self.ino, self.ahead_bytes.clone());
            ra.started += 1;
            ra.chunks.push_back((next, chunk_len, Slot::Reading(tokio::task::spawn_blocking(move || read_chunk(&engine, &caller, ino, next, chunk_len as usize, budget)))));
        }
        Ok(out)
    }

    /// A WRITE's data where it lies in the request: a write that only adds to the engine's
    /// write buffer copies it from there, once.
    async fn write(&self, offset: u64, data: &[u8]) -> SmbResult<u32> {
        self.write_from(offset, std::borrow::Cow::Borrowed(data)).await
    }

    async fn write_owned(&self, offset: u64, data: Vec<u8>) -> SmbResult<u32> {
        self.write_from(offset, std::borrow::Cow::Owned(data)).await
    }

    async fn flush(&self) -> SmbResult<()> {
        if self.is_dir {
            return Ok(());
        }
        self.with(|e, c, ino| e.commit(c, ino)).await
    }

    async fn stat(&self) -> SmbResult<FileInfo> {
        let (attr, dos) = self.read_meta(|e, c, ino| Ok((e.getattr(c, ino)?, dos_attributes(e, ino)))).await?;
        Ok(file_info(&self.name, &attr, dos))
    }

    async fn set_times(&self, times: FileTimes) -> SmbResult<()> {
        let set = SetAttr {
            atime: times.last_access_time.map(|t| TimeSet::At(unix_ns(t))),
            mtime: times.last_write_time.map(|t| TimeSet::At(unix_ns(t))),
            ..Default::default()
        };
        // Creation and change times are the engine's own (btime at creation, ctime on change).
        if set.atime.is_none() && set.mtime.is_none() {
            return Ok(());
        }
        self.with(move |e, c, ino| e.setattr(c, ino, set)).await.map(|_| ())
    }

    async fn set_attributes(&self, attributes: u32) -> SmbResult<()> {
        let known = FILE_ATTRIBUTE_READONLY | STORED_ATTRIBUTES | FILE_ATTRIBUTE_ARCHIVE | FILE_ATTRIBUTE_NORMAL;
        if attributes & !known != 0 {
            return Err(SmbError::NotSupported);
        }
        if self.is_dir {
            if attributes & FILE_ATTRIBUTE_READONLY != 0 {
                return Err(SmbError::NotSupported);
            }
            return self.with(move |e, c, ino| set_dos_attributes(e, c, ino, attributes)).await;
        }
        let read_only = attributes & FILE_ATTRIBUTE_READONLY != 0;
        self.with(move |e, c, ino| {
            let a = e.getattr(c, ino)?;
            let mode = if read_only { a.mode & !0o222 } else { a.mode | 0o200 };
            // The xattr needs write permission: stored while the file is still writable when
            // it becomes read-only, and after the mode when it stops being read-only.
            if read_only {
                set_dos_attributes(e, c, ino, attributes)?;
            }
            if mode != a.mode {
                e.setattr(c, ino, SetAttr { mode: Some(mode), ..Default::default() })?;
            }
            if !read_only {
                set_dos_attributes(e, c, ino, attributes)?;
            }
            Ok(())
        })
        .await
    }

    async fn truncate(&self, len: u64) -> SmbResult<()> {
        self.ahead.lock().await.clear();
        let as_owner = self.writes_as_owner;
        self.with(move |e, c, ino| {
            let set = SetAttr { size: Some(len), ..Default::default() };
            if as_owner { e.setattr_as_owner(c, ino, set) } else { e.setattr(c, ino, set) }
        })
        .await
        .map(|_| ())
    }

    async fn list_dir(&self, pattern: Option<&str>) -> SmbResult<Vec<DirEntry>> {
        let pattern = pattern.filter(|p| *p != "*").map(str::to_string);
        let ignore_case = !self.case_sensitive;
        self.with(move |e, c, ino| {
            let mut out = Vec::new();
            let mut cursor: Option<Vec<u8>> = None;
            loop {
                let page = e.readdir(c, ino, cursor.as_deref(), READDIR_PAGE)?;
                for entry in &page.entries {
                    // Names that are not UTF-8 have no SMB spelling; NFS clients still see them.
                    let Ok(name) = std::str::from_utf8(&entry.name) else { continue };
                    if pattern.as_deref().is_some_and(|p| !matches(p, name, ignore_case)) {
                        continue;
                    }
                    match e.getattr(c, entry.ino) {
                        Ok(a) => out.push(DirEntry { info: file_info(name, &a, dos_attributes(e, entry.ino)) }),
                        Err(Error::NotFound | Error::Stale) => {}
                        Err(err) => return Err(err),
                    }
                }
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            Ok(out)
        })
        .await
    }

    async fn dir_entry(&self, name: &str) -> SmbResult<Option<DirEntry>> {
        let name = name.to_string();
        self.read_meta(move |e, c, ino| match e.lookup(c, ino, name.as_bytes()) {
            Ok(a) => Ok(Some(DirEntry { info: file_info(&name, &a, dos_attributes(e, a.ino)) })),
            Err(Error::NotFound | Error::Stale) => Ok(None),
            Err(err) => Err(err),
        })
        .await
    }

    async fn close(self: Box<Self>) -> SmbResult<()> {
        if self.wrote.load(Ordering::Relaxed) {
            self.with(|e, c, ino| e.close(c, ino)).await?;
        }
        Ok(())
    }

    fn opened_by(&self) -> Option<Identity> {
        self.opened_by.clone()
    }

    async fn link_count(&self) -> SmbResult<u32> {
        match self.read_meta(|e, c, ino| e.getattr(c, ino)).await {
            Ok(a) => Ok(a.nlink),
            Err(SmbError::NotFound) => Ok(0),
            Err(e) => Err(e),
        }
    }

    async fn dir_is_empty(&self) -> SmbResult<bool> {
        self.read_meta(|e, c, ino| Ok(e.readdir(c, ino, None, 1)?.entries.is_empty())).await
    }

    /// Read as the caller: reading an attribute's value takes read permission on the file.
    async fn extended_attributes(&self) -> SmbResult<Vec<ExtendedAttribute>> {
        self.read_meta(extended_attributes).await
    }

    /// Read as the engine, as the DOS attributes are: only the size reaches the client, and
    /// FileAllInformation answers any open. A file deleted meanwhile has none.
    async fn ea_size(&self) -> SmbResult<u32> {
        match self.read_meta(|e, _, ino| extended_attributes(e, &Caller::system(), ino)).await {
            Ok(eas) => Ok(smb_server::ea_size(&eas)),
            Err(SmbError::NotFound) => Ok(0),
            Err(e) => Err(e),
        }
    }

    async fn set_extended_attributes(&self, changes: Vec<ExtendedAttribute>) -> SmbResult<()> {
        let (engine, caller, ino) = (self.engine.clone(), self.caller.clone(), self.ino);
        blocking(move || set_extended_attributes(&engine, &caller, ino, &changes)).await
    }

    async fn unix_security(&self) -> SmbResult<UnixSecurity> {
        let a = self.with(|e, c, ino| e.getattr(c, ino)).await?;
        Ok(UnixSecurity { uid: a.uid, gid: a.gid, mode: a.mode & 0o7777, is_directory: a.kind == FileKind::Dir })
    }

    /// One engine setattr, so the owner, group and mode change together or not at all, and
    /// the engine's rules decide who may: the mode only the owner or an admin, the owner only
    /// an admin, the group the owner among their own groups.
    async fn set_unix_security(&self, change: UnixSecurityChange) -> SmbResult<()> {
        let set = SetAttr { mode: change.mode, uid: change.uid, gid: change.gid, ..Default::default() };
        self.ahead.lock().await.clear();
        self.with(move |e, c, ino| e.setattr(c, ino, set)).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filetimes_round_trip_and_epoch_maps() {
        assert_eq!(filetime(0), FILETIME_UNIX_EPOCH as u64);
        let ns = 1_700_000_000_123_456_700;
        assert_eq!(unix_ns(filetime(ns)), ns);
        // Before 1970 counts back from the Unix epoch; the engine's earliest time is after 1601.
        assert_eq!(filetime(-100), FILETIME_UNIX_EPOCH as u64 - 1);
        assert!(filetime(i64::MIN) > 0);
    }

    #[test]
    fn every_engine_error_has_a_status() {
        assert_eq!(smb_error(Error::NotFound).to_nt_status(), 0xC000_0034);
        assert_eq!(smb_error(Error::PermissionDenied).to_nt_status(), 0xC000_0022);
        assert_eq!(smb_error(Error::NotEmpty).to_nt_status(), 0xC000_0101);
        assert_eq!(smb_error(Error::Exists).to_nt_status(), 0xC000_0035);
        assert_eq!(smb_error(Error::NoSpace("x".into())).to_nt_status(), 0xC000_007F);
    }

    /// An open made where the request is served answers as one made on the blocking pool, or
    /// hands over with nothing changed: it creates a file, opens what exists and refuses what
    /// the disposition refuses; a directory to create and a file to truncate are handed over.
    #[test]
    fn opens_in_place_answer_as_on_the_blocking_pool_or_hand_over_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(storage_engine::EngineConfig::with_file_drives(dir.path(), 6, 64 << 20, 4, 2)).unwrap();
        let sys = Caller::system();
        let d = engine.mkdir(&sys, storage_engine::ROOT_INO, b"d", 0o755).unwrap();
        let kept = engine.create(&sys, d.ino, b"kept", 0o644, true).unwrap();
        engine.write(&sys, kept.ino, 0, b"bytes", Stability::Durable).unwrap();
        let open = |path: &str, intent: OpenIntent, directory: bool, in_place: bool| {
            let opts = OpenOptions { intent, directory, write: true, ..Default::default() };
            open_file(&engine, &sys, path, false, opts, in_place).map(|o| o.map(|(a, action)| (a.ino, action)))
        };
        // Created in place: there after, as a file of no bytes.
        let (ino, action) = open("d/new", OpenIntent::OverwriteOrCreate, false, true).unwrap().expect("created in place");
        assert_eq!(action, OpenAction::Created);
        assert_eq!(engine.lookup(&sys, d.ino, b"new").unwrap().ino, ino);
        // What exists opens in place; refusals are the same either way.
        for in_place in [true, false] {
            assert_eq!(open("d/kept", OpenIntent::Open, false, in_place).unwrap(), Some((kept.ino, OpenAction::Opened)));
            assert_eq!(open("d/kept", OpenIntent::OpenOrCreate, false, in_place).unwrap(), Some((kept.ino, OpenAction::Opened)));
            assert!(matches!(open("d/kept", OpenIntent::Create, false, in_place), Err(SmbError::Exists)));
            assert!(matches!(open("d/missing", OpenIntent::Open, false, in_place), Err(SmbError::NotFound)));
            assert!(matches!(open("nowhere/x", OpenIntent::OpenOrCreate, false, in_place), Err(SmbError::PathNotFound)));
            assert!(matches!(open("d", OpenIntent::OverwriteOrCreate, false, in_place), Err(SmbError::IsDirectory)));
        }
        // Truncating and making a directory are handed over, with nothing done.
        assert_eq!(open("d/kept", OpenIntent::OverwriteOrCreate, false, true).unwrap(), None);
        assert_eq!(engine.getattr(&sys, kept.ino).unwrap().size, 5);
        assert_eq!(open("d/sub", OpenIntent::OpenOrCreate, true, true).unwrap(), None);
        assert!(matches!(engine.lookup(&sys, d.ino, b"sub"), Err(Error::NotFound)));
        // On the blocking pool they are done.
        assert_eq!(open("d/kept", OpenIntent::OverwriteOrCreate, false, false).unwrap(), Some((kept.ino, OpenAction::Overwritten)));
        assert_eq!(engine.getattr(&sys, kept.ino).unwrap().size, 0);
        assert_eq!(open("d/sub", OpenIntent::OpenOrCreate, true, false).unwrap().map(|(_, a)| a), Some(OpenAction::Created));
    }

    /// An engine on file drives in `dir` holding one file, `/f`, with `content` written durably.
    fn engine_with_file(dir: &std::path::Path, content: &[u8]) -> (Arc<Engine>, Ino) {
        let engine = Engine::open(storage_engine::EngineConfig::with_file_drives(dir, 6, 64 << 20, 4, 2)).unwrap();
        let sys = Caller::system();
        let f = engine.create(&sys, storage_engine::ROOT_INO, b"f", 0o644, true).unwrap();
        engine.write(&sys, f.ino, 0, content, Stability::Durable).unwrap();
        (engine, f.ino)
    }

    fn handle(engine: &Arc<Engine>, ino: Ino, budget: &Arc<AtomicUsize>) -> EngineHandle {
        EngineHandle {
            engine: engine.clone(),
            caller: Caller::system(),
            ino,
            name: "f".into(),
            is_dir: false,
            case_sensitive: true,
            wrote: AtomicBool::new(false),
            writes_as_owner: true,
            opened_by: None,
            ahead: tokio::sync::Mutex::new(ReadAhead::default()),
            ahead_bytes: budget.clone(),
        }
    }

    /// READs of a small file (bytes in the metadata store, read where the request is
    /// served) answer what the engine holds: whole, in part, past the end, and the bytes an
    /// unstable write left in the write buffer (which the in-place read leaves to the
    /// blocking pool).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_file_reads_answer_the_engine_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let (engine, ino) = engine_with_file(dir.path(), &content);
        let sys = Caller::system();
        let budget = Arc::new(AtomicUsize::new(0));
        let h = handle(&engine, ino, &budget);
        assert_eq!(engine.try_read_inline(&sys, ino, 0, 10).map(|r| r.is_ok()), Some(true), "a small file is read in place");
        assert_eq!(&h.read(0, 65536).await.unwrap()[..], &content[..]);
        assert_eq!(&h.read(1000, 100).await.unwrap()[..], &content[1000..1100]);
        assert_eq!(&h.read(4990, 100).await.unwrap()[..], &content[4990..]);
        assert!(h.read(6000, 100).await.unwrap().is_empty());
        engine.write(&sys, ino, 100, b"patch", Stability::Unstable).unwrap();
        assert!(engine.try_read_inline(&sys, ino, 0, 10).is_none(), "bytes in the write buffer");
        let mut expect = content.clone();
        expect[100..105].copy_from_slice(b"patch");
        assert_eq!(&h.read(0, 65536).await.unwrap()[..], &expect[..]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_ahead_serves_sequential_reads_and_never_stale_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..(20u32 << 20) + 123).map(|i| (i % 251) as u8).collect();
        let (engine, ino) = engine_with_file(dir.path(), &content);
        let sys = Caller::system();
        let budget = Arc::new(AtomicUsize::new(0));
        let h = handle(&engine, ino, &budget);
        const MIB: u32 = 1 << 20;
        // Sequential 1 MiB reads to the end, the last one short.
        let mut got = Vec::new();
        loop {
            let b = h.read(got.len() as u64, MIB).await.unwrap();
            if b.is_empty() {
                break;
            }
            got.extend_from_slice(&b);
        }
        assert!(got == content, "sequential reads return the file");
        assert!(budget.load(Ordering::Relaxed) > 0, "read-ahead was used");
        // A change through the engine (any protocol) between two sequential reads is seen.
        let h2 = handle(&engine, ino, &budget);
        assert_eq!(&h2.read(0, MIB).await.unwrap()[..], &content[..MIB as usize]);
        assert_eq!(&h2.read(u64::from(MIB), MIB).await.unwrap()[..], &content[MIB as usize..2 * MIB as usize]);
        engine.write(&sys, ino, 2 << 20, &[0xAB; 4096], Stability::Unstable).unwrap();
        let b = h2.read(2 * u64::from(MIB), MIB).await.unwrap();
        assert_eq!(&b[..4096], &[0xAB; 4096][..], "a buffered write elsewhere is not hidden by read-ahead");
        assert_eq!(&b[4096..], &content[(2 << 20) + 4096..3 << 20]);
        // The handle's own write, and a truncate, drop its read-ahead.
        h2.write_owned(3 << 20, vec![0xCD; 10]).await.unwrap();
        assert_eq!(&h2.read(3 << 20, 10).await.unwrap()[..], &[0xCD; 10][..]);
        h2.truncate(5 << 20).await.unwrap();
        assert!(h2.read(5 << 20, MIB).await.unwrap().is_empty());
        // Random reads go straight to the engine.
        assert_eq!(&h2.read(7, 100).await.unwrap()[..], &content[7..107]);
        assert_eq!(&h.read(7, 100).await.unwrap()[..], &content[7..107]);
        drop(h2);
        drop(h);
        // Chunks still being read in the background give their budget back when they finish.
        for _ in 0..100 {
            if budget.load(Ordering::Relaxed) == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(budget.load(Ordering::Relaxed), 0, "read-ahead bytes released");
        engine.shutdown().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_out_of_order_and_at_once_return_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..(24u32 << 20) + 77).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let (engine, ino) = engine_with_file(dir.path(), &content);
        let budget = Arc::new(AtomicUsize::new(0));
        let h = Arc::new(handle(&engine, ino, &budget));
        const MIB: u64 = 1 << 20;
        // Pipelined READs reaching the handle slightly out of order, as a client's concurrent
        // READs can: neighbours swapped, across chunk boundaries too (3/4, 7/8).
        let order = [0u64, 1, 2, 4, 3, 5, 6, 8, 7, 9, 11, 10, 12, 13, 14, 15];
        for &i in &order {
            let b = h.read(i * MIB, MIB as u32).await.unwrap();
            assert!(b[..] == content[(i * MIB) as usize..((i + 1) * MIB) as usize], "MiB {i}");
        }
        assert!(budget.load(Ordering::Relaxed) > 0, "read-ahead was used");
        // Eight READs at once, then the short end of the file.
        let reads = (16..24u64).map(|i| {
            let h = h.clone();
            tokio::spawn(async move { (i, h.read(i * MIB, MIB as u32).await.unwrap()) })
        });
        for r in reads.collect::<Vec<_>>() {
            let (i, b) = r.await.unwrap();
            assert!(b[..] == content[(i * MIB) as usize..((i + 1) * MIB) as usize], "MiB {i}");
        }
        assert_eq!(&h.read(24 * MIB, MIB as u32).await.unwrap()[..], &content[(24 * MIB) as usize..]);
        drop(h);
        engine.shutdown().unwrap();
    }

    /// A client with 8 READs in flight, which take the handle's lock in any order among
    /// themselves: every READ after the first two is served from the run's chunks, and each
    /// chunk is read once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pipelined_reads_in_any_order_read_each_chunk_once() {
        let dir = tempfile::tempdir().unwrap();
        const MIB: u64 = 1 << 20;
        let size = 64 * MIB + 4321;
        let content: Vec<u8> = (0..size).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let (engine, ino) = engine_with_file(dir.path(), &content);
        let budget = Arc::new(AtomicUsize::new(0));
        let h = handle(&engine, ino, &budget);
        // The next READ is sent as one is answered; of the 8 in flight any may come first (a
        // fixed pseudo-random pick), none more than 6 MiB behind the newest.
        let (mut inflight, mut next, mut seed) = (Vec::new(), 0u64, 0x2545_f491_u64);
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
            let pick = if inflight[oldest] + 6 * MIB < next { oldest } else { (seed >> 33) as usize % inflight.len() };
            let off = inflight.swap_remove(pick);
            let b = h.read(off, MIB as u32).await.unwrap();
            let want = &content[off as usize..(off + MIB).min(size) as usize];
            assert!(b[..] == *want, "READ at {} MiB: {} bytes, other than the file's", off / MIB, b.len());
        }
        let ra = h.ahead.lock().await;
        assert!(ra.direct <= 2, "{} READs read outside the chunks", ra.direct);
        assert!(ra.started <= size.div_ceil(READ_AHEAD as u64) + 1, "{} chunks read for {} MiB", ra.started, size / MIB);
        drop(ra);
        drop(h);
        engine.shutdown().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn owner_group_and_mode_change_under_the_engine_rules() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(storage_engine::EngineConfig::with_file_drives(dir.path(), 6, 64 << 20, 4, 2)).unwrap();
        let sys = Caller::system();
        let f = engine.create(&sys, storage_engine::ROOT_INO, b"f", 0o4640, true).unwrap();
        engine.setattr(&sys, f.ino, SetAttr { uid: Some(1000), gid: Some(100), ..Default::default() }).unwrap();
        let budget = Arc::new(AtomicUsize::new(0));
        let mut owner = handle(&engine, f.ino, &budget);
        owner.caller = Caller { user: "u".into(), uid: 1000, gid: 100, groups: vec![], role: storage_engine::Role::User };
        let now = owner.unix_security().await.unwrap();
        assert_eq!((now.uid, now.gid, now.mode & 0o777, now.is_directory), (1000, 100, 0o640, false));
        // The owner changes the mode.
        owner.set_unix_security(UnixSecurityChange { mode: Some(0o600), ..Default::default() }).await.unwrap();
        assert_eq!(engine.getattr(&sys, f.ino).unwrap().mode & 0o7777, 0o600);
        // Another user changes nothing, and a change of owner needs an admin: refused whole.
        let mut other = handle(&engine, f.ino, &budget);
        other.caller = Caller { user: "o".into(), uid: 1001, gid: 100, groups: vec![], role: storage_engine::Role::User };
        let chmod = UnixSecurityChange { mode: Some(0o777), ..Default::default() };
        assert!(matches!(other.set_unix_security(chmod).await, Err(SmbError::AccessDenied)));
        let chown = UnixSecurityChange { uid: Some(1001), mode: Some(0o644), ..Default::default() };
        assert!(matches!(owner.set_unix_security(chown).await, Err(SmbError::AccessDenied)));
        let a = engine.getattr(&sys, f.ino).unwrap();
        assert_eq!((a.uid, a.mode & 0o7777), (1000, 0o600));
        // An admin gives the file away.
        let admin = handle(&engine, f.ino, &budget);
        admin.set_unix_security(UnixSecurityChange { uid: Some(1001), gid: Some(7), ..Default::default() }).await.unwrap();
        let a = engine.getattr(&sys, f.ino).unwrap();
        assert_eq!((a.uid, a.gid), (1001, 7));
        engine.shutdown().unwrap();
    }

    /// A handle opened for writing lets the file's owner write and resize it after it became
    /// read-only (FILE_ATTRIBUTE_READONLY at create, or a chmod since); a handle opened only
    /// to read, and another user's handle, do not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_handle_lets_the_owner_write_a_file_made_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(storage_engine::EngineConfig::with_file_drives(dir.path(), 6, 64 << 20, 4, 2)).unwrap();
        let sys = Caller::system();
        let f = engine.create(&sys, storage_engine::ROOT_INO, b"f", 0o444, true).unwrap();
        engine.setattr(&sys, f.ino, SetAttr { uid: Some(1000), gid: Some(100), ..Default::default() }).unwrap();
        let alice = Caller { user: "alice".into(), uid: 1000, gid: 100, groups: vec![], role: storage_engine::Role::User };
        let budget = Arc::new(AtomicUsize::new(0));
        let mut writer = handle(&engine, f.ino, &budget);
        writer.caller = alice.clone();
        writer.write(0, b"copied ").await.unwrap();
        writer.write_owned(7, vec![b'x'; 2 << 20]).await.unwrap();
        writer.truncate(10).await.unwrap();
        writer.flush().await.unwrap();
        assert_eq!(engine.read(&sys, f.ino, 0, 100).unwrap(), b"copied xxx");

        let mut reader = handle(&engine, f.ino, &budget);
        reader.caller = alice;
        reader.writes_as_owner = false;
        assert!(matches!(reader.write(0, b"y").await, Err(SmbError::AccessDenied)));
        assert!(matches!(reader.truncate(0).await, Err(SmbError::AccessDenied)));
        let mut other = handle(&engine, f.ino, &budget);
        other.caller = Caller { user: "bob".into(), uid: 1001, gid: 100, groups: vec![], role: storage_engine::Role::User };
        assert!(matches!(other.write(0, b"y").await, Err(SmbError::AccessDenied)));
        assert!(matches!(other.truncate(0).await, Err(SmbError::AccessDenied)));
        let a = engine.getattr(&sys, f.ino).unwrap();
        assert_eq!((a.size, a.mode & 0o777), (10, 0o444));
        engine.shutdown().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hidden_and_system_are_stored_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(storage_engine::EngineConfig::with_file_drives(dir.path(), 6, 64 << 20, 4, 2)).unwrap();
        let sys = Caller::system();
        let f = engine.create(&sys, storage_engine::ROOT_INO, b"f", 0o644, true).unwrap();
        engine.setattr(&sys, f.ino, SetAttr { uid: Some(1000), gid: Some(1000), ..Default::default() }).unwrap();
        let budget = Arc::new(AtomicUsize::new(0));
        let mut h = handle(&engine, f.ino, &budget);
        h.caller = Caller { user: "u".into(), uid: 1000, gid: 1000, groups: vec![], role: storage_engine::Role::User };
        let attributes = |h: &EngineHandle| {
            let h = h.engine.clone();
            async move { file_info("f", &h.getattr(&Caller::system(), f.ino).unwrap(), dos_attributes(&h, f.ino)).attributes() }
        };
        assert_eq!(attributes(&h).await, FILE_ATTRIBUTE_ARCHIVE);
        // Hidden and read-only together, by the owner: the xattr is written before the file
        // stops being writable.
        h.set_attributes(FILE_ATTRIBUTE_HIDDEN | FILE_ATTRIBUTE_READONLY).await.unwrap();
        assert_eq!(h.stat().await.unwrap().attributes(), FILE_ATTRIBUTE_HIDDEN | FILE_ATTRIBUTE_READONLY | FILE_ATTRIBUTE_ARCHIVE);
        h.set_attributes(FILE_ATTRIBUTE_HIDDEN | FILE_ATTRIBUTE_SYSTEM).await.unwrap();
        assert_eq!(attributes(&h).await, FILE_ATTRIBUTE_HIDDEN | FILE_ATTRIBUTE_SYSTEM | FILE_ATTRIBUTE_ARCHIVE);
        // Listings report them too.
        let mut root = handle(&engine, storage_engine::ROOT_INO, &budget);
        root.is_dir = true;
        let listed = root.list_dir(None).await.unwrap();
        let entry = listed.iter().find(|e| e.info.name == "f").unwrap();
        assert_eq!(entry.info.attributes(), FILE_ATTRIBUTE_HIDDEN | FILE_ATTRIBUTE_SYSTEM | FILE_ATTRIBUTE_ARCHIVE);
        let one = root.dir_entry("f").await.unwrap().unwrap();
        assert_eq!(one.info.attributes(), entry.info.attributes());
        // Clearing them removes the xattr; attributes that are not stored are refused.
        h.set_attributes(FILE_ATTRIBUTE_ARCHIVE).await.unwrap();
        assert_eq!(attributes(&h).await, FILE_ATTRIBUTE_ARCHIVE);
        assert!(matches!(engine.getxattr(&sys, f.ino, XATTR_DOS_ATTRIBUTES), Err(Error::NotFound)));
        assert!(matches!(h.set_attributes(0x100).await, Err(SmbError::NotSupported)));
        // Another user who may not write the file cannot hide it.
        h.caller = Caller { user: "v".into(), uid: 1001, gid: 1001, groups: vec![], role: storage_engine::Role::User };
        assert!(h.set_attributes(FILE_ATTRIBUTE_HIDDEN).await.is_err());
        assert_eq!(attributes(&h).await, FILE_ATTRIBUTE_ARCHIVE);
        engine.shutdown().unwrap();
    }

    #[test]
    fn share_paths_join_under_the_share_root() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(storage_engine::EngineConfig::with_file_drives(dir.path(), 6, 64 << 20, 4, 2)).unwrap();
        let s = EngineShare::new(engine.clone(), "/projects/a/", false, false);
        let p: SmbPath = "x\\y.txt".parse().unwrap();
        assert_eq!(s.full(&p), "projects/a/x/y.txt");
        assert_eq!(s.full(&SmbPath::root()), "projects/a");
        assert_eq!(EngineShare::new(engine.clone(), "/", false, false).full(&p), "x/y.txt");
        // The only way a path reaches the backend is an SmbPath, and none climbs out.
        for bad in ["..", "..\\etc", "a\\..\\..\\b", "a\\\\b", "a/../b"] {
            assert!(bad.parse::<SmbPath>().is_err(), "{bad}");
        }
        engine.shutdown().unwrap();
    }
}

#[cfg(test)]
mod chunk_tests {
    use super::*;

    #[test]
    fn a_chunk_slices_within_a_piece_without_copying_and_copies_across_pieces() {
        let budget = Arc::new(AtomicUsize::new(6));
        let pieces = vec![Bytes::from_static(b"abc"), Bytes::from_static(b"de"), Bytes::from_static(b"f")];
        let c = Chunk { offset: 100, pieces, len: 6, stamp: Stamp { size: 106, mtime_ns: 0, ctime_ns: 0 }, budget: budget.clone(), at_eof: true };
        let within = c.slice(1, 3);
        assert_eq!(&within[..], b"bc");
        assert_eq!(within.as_ptr(), c.pieces[0][1..].as_ptr(), "a slice of the piece, not a copy");
        assert_eq!(&c.slice(2, 5)[..], b"cde");
        assert_eq!(&c.slice(0, 6)[..], b"abcdef");
        assert_eq!(&c.slice(5, 6)[..], b"f");
        assert!(c.slice(6, 6).is_empty());
        drop(c);
        assert_eq!(budget.load(Ordering::Relaxed), 0, "the read-ahead budget is given back");
    }
}
