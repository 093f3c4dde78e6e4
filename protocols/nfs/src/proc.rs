//! The NFSv3 procedures (RFC 1813 §3.3), each mapped onto the engine's namespace API.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::Mutex;

use nfs3_types::nfs3::*;
use nfs3_types::rpc::auth_unix;
use nfs3_types::xdr_codec::{List, Opaque, Void};
use storage_engine::{Attr, Caller, DirEntry, Engine, Error, FileKind, Ino, NameProblem, SetAttr, Stability, TimeSet};

use crate::handle::{Handle, cookie_of};
use crate::rpc::{CallInfo, Reply, ReplyData, packed};
use crate::wire::decode;
use crate::exports::ExportTable;
use crate::{ClientMatch, IO_BYTES_MAX};

/// uid and gid that root is squashed to, and that AUTH_NULL calls would act as.
const ANONYMOUS_ID: u32 = 65534;
/// Directory cookies remembered so that a listing resumes without a scan.
const COOKIE_CACHE_ENTRIES_MAX: usize = 65_536;
/// Entries asked of the engine per readdir page.
const READDIR_PAGE_ENTRIES: usize = 256;
/// Bytes of a READDIR(PLUS) reply outside the entries (status, attributes, verifier, eof).
const READDIR_REPLY_OVERHEAD_BYTES: usize = 128;

pub(crate) struct ExportState {
    pub export: crate::Export,
    /// Normalised: starts with `/`, no trailing `/` except for the root itself.
    pub path: String,
    pub id: u32,
    pub clients: Vec<ClientMatch>,
    pub source: crate::exports::ExportSource,
}

impl ExportState {
    pub(crate) fn allows(&self, peer: IpAddr) -> bool {
        self.clients.iter().any(|c| c.matches(peer))
    }

    /// The engine identity of a call under this export's squash rules.
    pub(crate) async fn caller(&self, state: &State, cred: Option<&auth_unix>) -> Caller {
        let Some(cred) = cred else { return Caller::anonymous() };
        let (mut uid, mut gid) = (cred.uid, cred.gid);
        let mut groups: Vec<u32> = cred.gids.clone();
        if self.export.root_squash && uid == 0 {
            uid = ANONYMOUS_ID;
            gid = ANONYMOUS_ID;
            groups.clear();
        }
        // Two metadata lookups: done here rather than on a blocking thread (every call makes
        // them, and the trip there and back cost more than they do).
        state.engine.caller_for_uid(uid, gid, &groups).unwrap_or_else(|_| Caller {
            user: format!("uid:{uid}"),
            uid,
            gid,
            groups: vec![],
            role: storage_engine::Role::User,
        })
    }
}

pub(crate) struct State {
    pub engine: Arc<Engine>,
    pub exports: ExportTable,
    /// Changes every time the service starts, so clients resend UNSTABLE writes that a
    /// restart may have lost.
    write_verf: writeverf3,
    /// (directory, cookie) → name of the entry the cookie stands for.
    cookies: Mutex<HashMap<(Ino, u64), Vec<u8>>>,
    pub readahead: crate::readahead::Readahead,
}

impl State {
    pub(crate) fn new(exports: ExportTable) -> State {
        State { engine: exports.engine().clone(), exports, write_verf: writeverf3(rand::random()), cookies: Mutex::new(HashMap::new()), readahead: Default::default() }
    }

    /// The export a mount path falls under (the longest matching export path) and the rest.
    pub(crate) fn export_for_path<'p>(&self, path: &'p str) -> Option<(Arc<ExportState>, &'p str)> {
        let mut best: Option<(&Arc<ExportState>, &'p str)> = None;
        let trimmed = path.trim_end_matches('/');
        let table = self.exports.snapshot();
        for e in table.iter() {
            let rest = if e.path == "/" {
                Some(trimmed.trim_start_matches('/'))
            } else {
                trimmed.strip_prefix(e.path.as_str()).filter(|r| r.is_empty() || r.starts_with('/'))
            };
            if let Some(rest) = rest {
                if best.is_none_or(|(b, _)| b.path.len() < e.path.len()) {
                    best = Some((e, rest));
                }
            }
        }
        best.map(|(e, rest)| (e.clone(), rest))
    }

    fn remember_cookie(&self, dir: Ino, cookie: u64, name: &[u8]) {
        let mut c = self.cookies.lock().expect("cookie cache lock");
        if c.len() >= COOKIE_CACHE_ENTRIES_MAX {
            c.clear();
        }
        c.insert((dir, cookie), name.to_vec());
    }

    fn cookie_name(&self, dir: Ino, cookie: u64) -> Option<Vec<u8>> {
        self.cookies.lock().expect("cookie cache lock").get(&(dir, cookie)).cloned()
    }
}

/// Runs an engine call on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(Error::Io(format!("engine task failed: {e}"))))
}

/// Runs an engine call that waits for a disk (a log or drive sync) on this worker thread,
/// which stops being one meanwhile: the runtime hands its other tasks to another thread
/// (`block_in_place`), so the event loop goes on. The call's own task goes on where the
/// sync ends, without the two thread wake-ups of a trip to the blocking pool and back. On a
/// single-threaded runtime, which cannot hand its tasks over, the call goes to the blocking
/// pool.
pub(crate) async fn blocking_in_place<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi { tokio::task::block_in_place(f) } else { blocking(f).await }
}

pub(crate) fn status(e: &Error) -> nfsstat3 {
    match e {
        Error::NotFound => nfsstat3::NFS3ERR_NOENT,
        Error::Exists => nfsstat3::NFS3ERR_EXIST,
        Error::NotDir => nfsstat3::NFS3ERR_NOTDIR,
        Error::IsDir => nfsstat3::NFS3ERR_ISDIR,
        Error::NotEmpty => nfsstat3::NFS3ERR_NOTEMPTY,
        Error::PermissionDenied | Error::Unauthenticated => nfsstat3::NFS3ERR_ACCES,
        Error::InvalidName(NameProblem::TooLong) => nfsstat3::NFS3ERR_NAMETOOLONG,
        Error::InvalidName(_) | Error::InvalidArgument(_) | Error::NotSymlink => nfsstat3::NFS3ERR_INVAL,
        Error::FileTooLarge => nfsstat3::NFS3ERR_FBIG,
        Error::NoSpace(_) => nfsstat3::NFS3ERR_NOSPC,
        Error::Stale => nfsstat3::NFS3ERR_STALE,
        Error::TooManyLinks => nfsstat3::NFS3ERR_MLINK,
        Error::NotSupported(_) => nfsstat3::NFS3ERR_NOTSUPP,
        Error::Busy(_) => nfsstat3::NFS3ERR_JUKEBOX,
        Error::ReadOnly(_) => nfsstat3::NFS3ERR_ROFS,
        Error::Unavailable(_) | Error::Io(_) | Error::Corrupt(_) | Error::Metadata(_) => nfsstat3::NFS3ERR_IO,
    }
}

fn time3(ns: i64) -> nfstime3 {
    let ns = ns.max(0);
    nfstime3 { seconds: (ns / 1_000_000_000).min(i64::from(u32::MAX)) as u32, nseconds: (ns % 1_000_000_000) as u32 }
}

fn time_ns(t: &nfstime3) -> i64 {
    i64::from(t.seconds) * 1_000_000_000 + i64::from(t.nseconds.min(999_999_999))
}

pub(crate) fn fattr(a: &Attr, fsid: u32) -> fattr3 {
    fattr3 {
        type_: match a.kind {
            FileKind::File => ftype3::NF3REG,
            FileKind::Dir => ftype3::NF3DIR,
            FileKind::Symlink => ftype3::NF3LNK,
            FileKind::Fifo => ftype3::NF3FIFO,
            FileKind::Socket => ftype3::NF3SOCK,
            FileKind::CharDevice => ftype3::NF3CHR,
            FileKind::BlockDevice => ftype3::NF3BLK,
        },
        mode: a.mode & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: a.stored_bytes.max(a.size),
        rdev: specdata3 { specdata1: (a.rdev >> 32) as u32, specdata2: a.rdev as u32 },
        fsid: u64::from(fsid),
        fileid: a.ino,
        atime: time3(a.atime_ns),
        mtime: time3(a.mtime_ns),
        ctime: time3(a.ctime_ns),
    }
}

fn wcc_of(a: &Attr) -> wcc_attr {
    wcc_attr { size: a.size, mtime: time3(a.mtime_ns), ctime: time3(a.ctime_ns) }
}

/// One call's resolved context: the export the handle belongs to and who is calling.
struct Ctx<'s> {
    state: &'s Arc<State>,
    export: Arc<ExportState>,
    caller: Caller,
}

impl Ctx<'_> {
    fn engine(&self) -> Arc<Engine> {
        self.state.engine.clone()
    }

    fn post(&self, a: &Result<Attr, Error>) -> post_op_attr {
        match a {
            Ok(a) => post_op_attr::Some(fattr(a, self.export.id)),
            Err(_) => post_op_attr::None,
        }
    }

    async fn getattr(&self, ino: Ino) -> Result<Attr, Error> {
        let engine = self.engine();
        if let Some(r) = engine.try_getattr(&self.caller, ino) {
            return r;
        }
        let caller = self.caller.clone();
        blocking(move || engine.getattr(&caller, ino)).await
    }

    async fn wcc_after(&self, before: Option<&Attr>, ino: Ino) -> wcc_data {
        let after = self.getattr(ino).await;
        wcc_data {
            before: before.map_or(pre_op_attr::None, |b| pre_op_attr::Some(wcc_of(b))),
            after: self.post(&after),
        }
    }

    fn handle_of(&self, a: &Attr) -> nfs_fh3 {
        nfs_fh3 { data: Opaque::owned(Handle { export_id: self.export.id, ino: a.ino, generation: a.generation }.encode()) }
    }

    async fn export_root(&self) -> Result<Attr, Error> {
        let engine = self.engine();
        let path = self.export.path.clone();
        blocking(move || engine.resolve(&Caller::system(), &path)).await
    }
}

/// Decodes a handle, checks the export's client list, maps the caller and loads the inode.
async fn resolve<'s>(state: &'s Arc<State>, call: &CallInfo, fh: &nfs_fh3) -> Result<(Ctx<'s>, Attr), nfsstat3> {
    let h = Handle::decode(&fh.data).ok_or(nfsstat3::NFS3ERR_BADHANDLE)?;
    let export = state.exports.snapshot().iter().find(|e| e.id == h.export_id).cloned().ok_or(nfsstat3::NFS3ERR_STALE)?;
    if !export.allows(call.peer) {
        return Err(nfsstat3::NFS3ERR_ACCES);
    }
    let caller = export.caller(state, call.cred.as_ref()).await;
    let ctx = Ctx { state, export, caller };
    let attr = match ctx.getattr(h.ino).await {
        Ok(a) if a.generation == h.generation => a,
        Ok(_) | Err(Error::NotFound) | Err(Error::Stale) => return Err(nfsstat3::NFS3ERR_STALE),
        Err(e) => return Err(status(&e)),
    };
    Ok((ctx, attr))
}

/// Resolves the handle of a call or answers the procedure's failure result.
macro_rules! resolve_or {
    ($state:expr, $call:expr, $fh:expr, $fail:expr) => {
        match resolve($state, $call, $fh).await {
            Ok(x) => x,
            Err(s) => return packed(&Nfs3Result::<Void, _>::Err((s, $fail))),
        }
    };
}

macro_rules! args_or_garbage {
    ($t:ty, $args:expr) => {
        match decode::<$t>($args) {
            Some(a) => a,
            None => return Reply::GarbageArgs,
        }
    };
}

fn setattr_of(s: &sattr3) -> SetAttr {
    SetAttr {
        mode: match s.mode {
            Nfs3Option::Some(m) => Some(m & 0o7777),
            Nfs3Option::None => None,
        },
        uid: match s.uid {
            Nfs3Option::Some(u) => Some(u),
            Nfs3Option::None => None,
        },
        gid: match s.gid {
            Nfs3Option::Some(g) => Some(g),
            Nfs3Option::None => None,
        },
        size: match s.size {
            Nfs3Option::Some(n) => Some(n),
            Nfs3Option::None => None,
        },
        atime: match &s.atime {
            set_atime::DONT_CHANGE => None,
            set_atime::SET_TO_SERVER_TIME => Some(TimeSet::Now),
            set_atime::SET_TO_CLIENT_TIME(t) => Some(TimeSet::At(time_ns(t))),
        },
        mtime: match &s.mtime {
            set_mtime::DONT_CHANGE => None,
            set_mtime::SET_TO_SERVER_TIME => Some(TimeSet::Now),
            set_mtime::SET_TO_CLIENT_TIME(t) => Some(TimeSet::At(time_ns(t))),
        },
    }
}

fn is_empty_set(s: &SetAttr) -> bool {
    s.mode.is_none() && s.uid.is_none() && s.gid.is_none() && s.size.is_none() && s.atime.is_none() && s.mtime.is_none()
}

pub(crate) async fn dispatch(state: &Arc<State>, call: &CallInfo, proc_: u32, args: &[u8]) -> Reply {
    if proc_ == 0 {
        return match decode::<Void>(args) {
            Some(_) => packed(&Void),
            None => Reply::GarbageArgs,
        };
    }
    // Anonymous access is never on for NFS: every procedure but NULL needs AUTH_SYS.
    if call.cred.is_none() {
        return Reply::AuthTooWeak;
    }
    match proc_ {
        1 => getattr(state, call, args).await,
        2 => setattr(state, call, args).await,
        3 => lookup(state, call, args).await,
        4 => access(state, call, args).await,
        5 => readlink(state, call, args).await,
        6 => read(state, call, args).await,
        7 => write(state, call, args).await,
        8 => create(state, call, args).await,
        9 => mkdir(state, call, args).await,
        10 => symlink(state, call, args).await,
        11 => mknod(state, call, args).await,
        12 => remove(state, call, args, false).await,
        13 => remove(state, call, args, true).await,
        14 => rename(state, call, args).await,
        15 => link(state, call, args).await,
        16 => readdir(state, call, args, false).await,
        17 => readdir(state, call, args, true).await,
        18 => fsstat(state, call, args).await,
        19 => fsinfo(state, call, args).await,
        20 => pathconf(state, call, args).await,
        21 => commit(state, call, args).await,
        _ => Reply::ProcUnavailable,
    }
}

async fn getattr(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(GETATTR3args, args);
    let (ctx, attr) = resolve_or!(state, call, &a.object, Void);
    packed(&GETATTR3res::Ok(GETATTR3resok { obj_attributes: fattr(&attr, ctx.export.id) }))
}

async fn setattr(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(SETATTR3args, args);
    let (ctx, before) = resolve_or!(state, call, &a.object, SETATTR3resfail { obj_wcc: wcc_data::default() });
    let fail = |s: nfsstat3, wcc: wcc_data| packed(&SETATTR3res::Err((s, SETATTR3resfail { obj_wcc: wcc })));
    if ctx.export.export.read_only {
        return fail(nfsstat3::NFS3ERR_ROFS, ctx.wcc_after(Some(&before), before.ino).await);
    }
    if let Nfs3Option::Some(guard) = &a.guard {
        if time_ns(guard) != time_ns(&time3(before.ctime_ns)) {
            return fail(nfsstat3::NFS3ERR_NOT_SYNC, ctx.wcc_after(Some(&before), before.ino).await);
        }
    }
    let set = setattr_of(&a.new_attributes);
    let (engine, caller, ino) = (ctx.engine(), ctx.caller.clone(), before.ino);
    // One metadata batch: done here when the engine can take it without waiting (a client's
    // open with O_TRUNC sends one after each CREATE), else on a blocking thread. A size
    // change by the file's owner is not held to the mode, as WRITE is not (the client checked
    // access at open: `ftruncate` on a descriptor of a file created read-only).
    let r = match engine.try_setattr_as_owner(&caller, ino, set.clone()) {
        Some(r) => r,
        None => blocking(move || engine.setattr_as_owner(&caller, ino, set)).await,
    };
    let wcc = ctx.wcc_after(Some(&before), ino).await;
    match r {
        Ok(_) => packed(&SETATTR3res::Ok(SETATTR3resok { obj_wcc: wcc })),
        Err(e) => fail(status(&e), wcc),
    }
}

async fn lookup(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(LOOKUP3args, args);
    let (ctx, dir) = resolve_or!(state, call, &a.what.dir, LOOKUP3resfail { dir_attributes: post_op_attr::None });
    let name = a.what.name.0.to_vec();
    let dir_attr = post_op_attr::Some(fattr(&dir, ctx.export.id));
    // `..` of the export's root stays at the root: a client never walks out of its export.
    if name == b".." {
        if let Ok(root) = ctx.export_root().await {
            if root.ino == dir.ino {
                return packed(&LOOKUP3res::Ok(LOOKUP3resok {
                    object: ctx.handle_of(&dir),
                    obj_attributes: dir_attr.clone(),
                    dir_attributes: dir_attr,
                }));
            }
        }
    }
    let (engine, caller, ino) = (ctx.engine(), ctx.caller.clone(), dir.ino);
    let found = match engine.try_lookup(&caller, ino, &name) {
        Some(r) => r,
        None => blocking(move || engine.lookup(&caller, ino, &name)).await,
    };
    match found {
        Ok(obj) => packed(&LOOKUP3res::Ok(LOOKUP3resok {
            object: ctx.handle_of(&obj),
            obj_attributes: post_op_attr::Some(fattr(&obj, ctx.export.id)),
            dir_attributes: dir_attr,
        })),
        Err(e) => packed(&LOOKUP3res::Err((status(&e), LOOKUP3resfail { dir_attributes: dir_attr }))),
    }
}

/// ACCESS asks the engine, which applies the same rules it checks every operation with; the
/// export's read-only flag is applied on top.
async fn access(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(ACCESS3args, args);
    let (ctx, attr) = resolve_or!(state, call, &a.object, ACCESS3resfail { obj_attributes: post_op_attr::None });
    // One inode read, local even for a portal mirror (whose attributes `resolve_or` brought
    // up to date): answered here, as GETATTR is, not on a blocking thread.
    let bits = match ctx.engine().access(&ctx.caller, attr.ino, 7) {
        Ok(b) => b,
        Err(e) => {
            return packed(&ACCESS3res::Err((status(&e), ACCESS3resfail { obj_attributes: post_op_attr::Some(fattr(&attr, ctx.export.id)) })));
        }
    };
    let mut granted = 0;
    if bits & 4 != 0 {
        granted |= ACCESS3_READ;
    }
    if bits & 2 != 0 && !ctx.export.export.read_only {
        granted |= ACCESS3_MODIFY | ACCESS3_EXTEND;
        if attr.kind == FileKind::Dir {
            granted |= ACCESS3_DELETE;
        }
    }
    if bits & 1 != 0 {
        granted |= if attr.kind == FileKind::Dir { ACCESS3_LOOKUP } else { ACCESS3_EXECUTE };
    }
    packed(&ACCESS3res::Ok(ACCESS3resok {
        obj_attributes: post_op_attr::Some(fattr(&attr, ctx.export.id)),
        access: a.access & granted,
    }))
}

async fn readlink(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(READLINK3args, args);
    let (ctx, attr) = resolve_or!(state, call, &a.symlink, READLINK3resfail { symlink_attributes: post_op_attr::None });
    let post = post_op_attr::Some(fattr(&attr, ctx.export.id));
    // One inode read (a mirror's target is kept locally): answered here.
    match ctx.engine().readlink(&ctx.caller, attr.ino) {
        Ok(t) => packed(&READLINK3res::Ok(READLINK3resok { symlink_attributes: post, data: nfspath3(Opaque::owned(t)) })),
        Err(e) => packed(&READLINK3res::Err((status(&e), READLINK3resfail { symlink_attributes: post }))),
    }
}

async fn read(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(READ3args, args);
    let (ctx, attr) = resolve_or!(state, call, &a.file, READ3resfail { file_attributes: post_op_attr::None });
    if attr.kind != FileKind::File {
        let s = if attr.kind == FileKind::Dir { nfsstat3::NFS3ERR_ISDIR } else { nfsstat3::NFS3ERR_INVAL };
        return packed(&READ3res::Err((s, READ3resfail { file_attributes: post_op_attr::Some(fattr(&attr, ctx.export.id)) })));
    }
    let count = a.count.min(IO_BYTES_MAX) as usize;
    let (engine, caller, ino, off) = (ctx.engine(), ctx.caller.clone(), attr.ino, a.offset);
    // From a window read ahead, under the attributes just loaded (unchanged since it was read).
    let r = match state.readahead.read(&engine, &caller, &attr, off, count).await {
        Some(bytes) => Ok((bytes, attr.clone())),
        // A small file's bytes in the metadata store, with no write buffer and no portal
        // mirror in the way: read here, with the attributes after it, without a trip to a
        // blocking thread (`try_read_inline` declines, with nothing done, what could wait).
        None if let Some(r) = engine.try_read_inline(&caller, ino, off, count) => r.map(|(data, after)| (data.into(), after)),
        None => {
            blocking(move || {
                let data = if count == 0 { Vec::new() } else { engine.read(&caller, ino, off, count)? };
                let after = engine.getattr(&caller, ino)?;
                Ok((data.into(), after))
            })
            .await
        }
    };
    match r {
        Ok((bytes, after)) => {
            let data = ReplyData(bytes);
            let n = data.bytes().len();
            let eof = off.saturating_add(n as u64) >= after.size;
            // The data is the reply's last field: packed empty here, and sent from the
            // window (or the engine's buffer) where it lies.
            let Reply::Success(body) = packed(&READ3res::Ok(READ3resok {
                file_attributes: post_op_attr::Some(fattr(&after, ctx.export.id)),
                count: n as u32,
                eof,
                data: Opaque::borrowed(&[]),
            })) else {
                unreachable!("packed answers Success")
            };
            Reply::SuccessWithData(body, data)
        }
        Err(e) => packed(&READ3res::Err((status(&e), READ3resfail { file_attributes: post_op_attr::Some(fattr(&attr, ctx.export.id)) }))),
    }
}

async fn write(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(WRITE3args, args);
    let (ctx, before) = resolve_or!(state, call, &a.file, WRITE3resfail { file_wcc: wcc_data::default() });
    let fail = |s, wcc| packed(&WRITE3res::Err((s, WRITE3resfail { file_wcc: wcc })));
    if ctx.export.export.read_only {
        return fail(nfsstat3::NFS3ERR_ROFS, ctx.wcc_after(Some(&before), before.ino).await);
    }
    if a.data.len() > IO_BYTES_MAX as usize || (a.count as usize) > a.data.len() {
        return fail(nfsstat3::NFS3ERR_INVAL, ctx.wcc_after(Some(&before), before.ino).await);
    }
    if before.kind != FileKind::File {
        let s = if before.kind == FileKind::Dir { nfsstat3::NFS3ERR_ISDIR } else { nfsstat3::NFS3ERR_INVAL };
        return fail(s, ctx.wcc_after(Some(&before), before.ino).await);
    }
    let stability = if a.stable == stable_how::UNSTABLE { Stability::Unstable } else { Stability::Durable };
    // The payload as it lies in the call's record: copied only into the write buffer, or
    // once more when the write goes to a blocking thread.
    let data = &a.data.0[..a.count as usize];
    let count = data.len() as u32;
    let (engine, caller, ino, off) = (ctx.engine(), ctx.caller.clone(), before.ino, a.offset);
    // An unstable WRITE that only adds to the file's write buffer is done here, without a
    // trip to a blocking thread; one that would wait goes to one. The file's owner writes it
    // whatever its mode, as the Linux kernel server lets it (the client checked at open).
    let inline = match stability {
        Stability::Unstable => match engine.try_write_buffered_as_owner(&caller, ino, off, data) {
            Ok(true) => Some(engine.getattr(&caller, ino)),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        },
        Stability::Durable => None,
    };
    let r = match inline {
        Some(r) => r,
        None => {
            let data = data.to_vec();
            blocking(move || engine.write_as_owner(&caller, ino, off, &data, stability)).await
        }
    };
    match r {
        Ok(after) => packed(&WRITE3res::Ok(WRITE3resok {
            file_wcc: wcc_data { before: pre_op_attr::Some(wcc_of(&before)), after: post_op_attr::Some(fattr(&after, ctx.export.id)) },
            count,
            committed: if stability == Stability::Unstable { stable_how::UNSTABLE } else { stable_how::FILE_SYNC },
            verf: state.write_verf,
        })),
        Err(e) => fail(status(&e), ctx.wcc_after(Some(&before), ino).await),
    }
}

/// The times an EXCLUSIVE create stores its verifier in, as Linux's server does: a retried
/// CREATE finds the same verifier and succeeds; the client then sets the real times.
fn verifier_time_ns(v: &createverf3) -> i64 {
    let secs = u32::from_be_bytes([v.0[0], v.0[1], v.0[2], v.0[3]]);
    let nsecs = u32::from_be_bytes([v.0[4], v.0[5], v.0[6], v.0[7]]) % 1_000_000_000;
    i64::from(secs) * 1_000_000_000 + i64::from(nsecs)
}

/// CREATE on a thread that may block: the create, then the attributes asked for, or an
/// EXCLUSIVE create's verifier.
fn create_blocking(engine: &Engine, caller: &Caller, parent: Ino, name: &[u8], how: createhow3, guarded: bool) -> Result<Attr, Error> {
    match how {
        createhow3::UNCHECKED(s) | createhow3::GUARDED(s) => {
            let mut set = setattr_of(&s);
            let mode = set.mode.take().unwrap_or(0o644);
            let attr = engine.create(caller, parent, name, mode, guarded)?;
            if is_empty_set(&set) { Ok(attr) } else { engine.setattr(caller, attr.ino, set) }
        }
        createhow3::EXCLUSIVE(verf) => {
            let t = verifier_time_ns(&verf);
            match engine.create(caller, parent, name, 0o644, true) {
                Ok(attr) => engine.setattr(
                    caller,
                    attr.ino,
                    SetAttr { atime: Some(TimeSet::At(t)), mtime: Some(TimeSet::At(t)), ..Default::default() },
                ),
                Err(Error::Exists) => {
                    let existing = engine.lookup(caller, parent, name)?;
                    if existing.kind == FileKind::File && existing.mtime_ns == t && existing.atime_ns == t {
                        Ok(existing)
                    } else {
                        Err(Error::Exists)
                    }
                }
                Err(e) => Err(e),
            }
        }
    }
}

async fn create(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(CREATE3args, args);
    let (ctx, dir) = resolve_or!(state, call, &a.where_.dir, CREATE3resfail { dir_wcc: wcc_data::default() });
    if ctx.export.export.read_only {
        let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
        return packed(&CREATE3res::Err((nfsstat3::NFS3ERR_ROFS, CREATE3resfail { dir_wcc: wcc })));
    }
    let name = a.where_.name.0.to_vec();
    let guarded = matches!(a.how, createhow3::GUARDED(_));
    let (engine, caller, parent) = (ctx.engine(), ctx.caller.clone(), dir.ino);
    // A create that sets nothing but the mode is one metadata batch without a log sync: done
    // here when the engine can take it without waiting, else on a blocking thread.
    let inline = match &a.how {
        createhow3::UNCHECKED(s) | createhow3::GUARDED(s) => {
            let set = setattr_of(s);
            let only_mode = SetAttr { mode: None, ..set.clone() };
            if is_empty_set(&only_mode) { engine.try_create(&caller, parent, &name, set.mode.unwrap_or(0o644), guarded) } else { None }
        }
        createhow3::EXCLUSIVE(_) => None,
    };
    let r = match inline {
        Some(r) => r,
        None => blocking(move || create_blocking(&engine, &caller, parent, &name, a.how, guarded)).await,
    };
    let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
    match r {
        Ok(obj) => packed(&CREATE3res::Ok(CREATE3resok {
            obj: post_op_fh3::Some(ctx.handle_of(&obj)),
            obj_attributes: post_op_attr::Some(fattr(&obj, ctx.export.id)),
            dir_wcc: wcc,
        })),
        Err(e) => packed(&CREATE3res::Err((status(&e), CREATE3resfail { dir_wcc: wcc }))),
    }
}

async fn mkdir(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(MKDIR3args, args);
    let (ctx, dir) = resolve_or!(state, call, &a.where_.dir, MKDIR3resfail { dir_wcc: wcc_data::default() });
    if ctx.export.export.read_only {
        let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
        return packed(&MKDIR3res::Err((nfsstat3::NFS3ERR_ROFS, MKDIR3resfail { dir_wcc: wcc })));
    }
    let name = a.where_.name.0.to_vec();
    let mut set = setattr_of(&a.attributes);
    let (engine, caller, parent) = (ctx.engine(), ctx.caller.clone(), dir.ino);
    let r = blocking(move || {
        let mode = set.mode.take().unwrap_or(0o755);
        set.size = None;
        let attr = engine.mkdir(&caller, parent, &name, mode)?;
        if is_empty_set(&set) { Ok(attr) } else { engine.setattr(&caller, attr.ino, set) }
    })
    .await;
    let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
    match r {
        Ok(obj) => packed(&MKDIR3res::Ok(MKDIR3resok {
            obj: post_op_fh3::Some(ctx.handle_of(&obj)),
            obj_attributes: post_op_attr::Some(fattr(&obj, ctx.export.id)),
            dir_wcc: wcc,
        })),
        Err(e) => packed(&MKDIR3res::Err((status(&e), MKDIR3resfail { dir_wcc: wcc }))),
    }
}

async fn symlink(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(SYMLINK3args, args);
    let (ctx, dir) = resolve_or!(state, call, &a.where_.dir, SYMLINK3resfail { dir_wcc: wcc_data::default() });
    if ctx.export.export.read_only {
        let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
        return packed(&SYMLINK3res::Err((nfsstat3::NFS3ERR_ROFS, SYMLINK3resfail { dir_wcc: wcc })));
    }
    let name = a.where_.name.0.to_vec();
    let target = a.symlink.symlink_data.0.to_vec();
    let (engine, caller, parent) = (ctx.engine(), ctx.caller.clone(), dir.ino);
    let r = blocking(move || engine.symlink(&caller, parent, &name, &target)).await;
    let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
    match r {
        Ok(obj) => packed(&SYMLINK3res::Ok(SYMLINK3resok {
            obj: post_op_fh3::Some(ctx.handle_of(&obj)),
            obj_attributes: post_op_attr::Some(fattr(&obj, ctx.export.id)),
            dir_wcc: wcc,
        })),
        Err(e) => packed(&SYMLINK3res::Err((status(&e), SYMLINK3resfail { dir_wcc: wcc }))),
    }
}

/// The namespace holds files, directories and symlinks only: no devices, sockets or FIFOs.
async fn mknod(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(MKNOD3args, args);
    let (ctx, dir) = resolve_or!(state, call, &a.where_.dir, MKNOD3resfail { dir_wcc: wcc_data::default() });
    if ctx.export.export.read_only {
        let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
        return packed(&MKNOD3res::Err((nfsstat3::NFS3ERR_ROFS, MKNOD3resfail { dir_wcc: wcc })));
    }
    let (kind, sattr, rdev) = match &a.what {
        mknoddata3::NF3CHR(d) => (FileKind::CharDevice, &d.dev_attributes, (u64::from(d.spec.specdata1) << 32) | u64::from(d.spec.specdata2)),
        mknoddata3::NF3BLK(d) => (FileKind::BlockDevice, &d.dev_attributes, (u64::from(d.spec.specdata1) << 32) | u64::from(d.spec.specdata2)),
        mknoddata3::NF3SOCK(s) => (FileKind::Socket, s, 0),
        mknoddata3::NF3FIFO(s) => (FileKind::Fifo, s, 0),
        // Regular files, directories and symlinks have their own procedures (RFC 1813 §3.3.11).
        mknoddata3::default => {
            let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
            return packed(&MKNOD3res::Err((nfsstat3::NFS3ERR_BADTYPE, MKNOD3resfail { dir_wcc: wcc })));
        }
    };
    let name = a.where_.name.0.to_vec();
    let mut set = setattr_of(sattr);
    let (engine, caller, parent) = (ctx.engine(), ctx.caller.clone(), dir.ino);
    let r = blocking(move || {
        let mode = set.mode.take().unwrap_or(0o644);
        set.size = None;
        let attr = engine.mknod(&caller, parent, &name, kind, mode, rdev)?;
        if is_empty_set(&set) { Ok(attr) } else { engine.setattr(&caller, attr.ino, set) }
    })
    .await;
    let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
    match r {
        Ok(obj) => packed(&MKNOD3res::Ok(MKNOD3resok {
            obj: post_op_fh3::Some(ctx.handle_of(&obj)),
            obj_attributes: post_op_attr::Some(fattr(&obj, ctx.export.id)),
            dir_wcc: wcc,
        })),
        Err(e) => packed(&MKNOD3res::Err((status(&e), MKNOD3resfail { dir_wcc: wcc }))),
    }
}

async fn remove(state: &Arc<State>, call: &CallInfo, args: &[u8], dir_op: bool) -> Reply {
    // REMOVE3args and RMDIR3args have the same layout.
    let a = args_or_garbage!(REMOVE3args, args);
    let (ctx, dir) = match resolve(state, call, &a.object.dir).await {
        Ok(x) => x,
        Err(s) => return packed(&REMOVE3res::Err((s, REMOVE3resfail { dir_wcc: wcc_data::default() }))),
    };
    let r = if ctx.export.export.read_only {
        Err(nfsstat3::NFS3ERR_ROFS)
    } else {
        let name = a.object.name.0.to_vec();
        let (engine, caller, parent) = (ctx.engine(), ctx.caller.clone(), dir.ino);
        blocking(move || if dir_op { engine.rmdir(&caller, parent, &name) } else { engine.unlink(&caller, parent, &name) })
            .await
            .map_err(|e| status(&e))
    };
    let wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
    match r {
        Ok(()) => packed(&REMOVE3res::Ok(REMOVE3resok { dir_wcc: wcc })),
        Err(s) => packed(&REMOVE3res::Err((s, REMOVE3resfail { dir_wcc: wcc }))),
    }
}

async fn rename(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(RENAME3args, args);
    let fail0 = |s| packed(&RENAME3res::Err((s, RENAME3resfail { fromdir_wcc: wcc_data::default(), todir_wcc: wcc_data::default() })));
    let (ctx, from) = match resolve(state, call, &a.from.dir).await {
        Ok(x) => x,
        Err(s) => return fail0(s),
    };
    let (ctx_to, to) = match resolve(state, call, &a.to.dir).await {
        Ok(x) => x,
        Err(s) => return fail0(s),
    };
    let r = if ctx.export.id != ctx_to.export.id {
        Err(nfsstat3::NFS3ERR_XDEV)
    } else if ctx.export.export.read_only {
        Err(nfsstat3::NFS3ERR_ROFS)
    } else {
        let (fname, tname) = (a.from.name.0.to_vec(), a.to.name.0.to_vec());
        let (engine, caller, fp, tp) = (ctx.engine(), ctx.caller.clone(), from.ino, to.ino);
        blocking(move || engine.rename(&caller, fp, &fname, tp, &tname)).await.map_err(|e| status(&e))
    };
    let fromdir_wcc = ctx.wcc_after(Some(&from), from.ino).await;
    let todir_wcc = ctx.wcc_after(Some(&to), to.ino).await;
    match r {
        Ok(()) => packed(&RENAME3res::Ok(RENAME3resok { fromdir_wcc, todir_wcc })),
        Err(s) => packed(&RENAME3res::Err((s, RENAME3resfail { fromdir_wcc, todir_wcc }))),
    }
}

async fn link(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(LINK3args, args);
    let fail0 = |s| packed(&LINK3res::Err((s, LINK3resfail { file_attributes: post_op_attr::None, linkdir_wcc: wcc_data::default() })));
    let (ctx, file) = match resolve(state, call, &a.file).await {
        Ok(x) => x,
        Err(s) => return fail0(s),
    };
    let (ctx_dir, dir) = match resolve(state, call, &a.link.dir).await {
        Ok(x) => x,
        Err(s) => return fail0(s),
    };
    let r = if ctx.export.id != ctx_dir.export.id {
        Err(nfsstat3::NFS3ERR_XDEV)
    } else if ctx.export.export.read_only {
        Err(nfsstat3::NFS3ERR_ROFS)
    } else {
        let name = a.link.name.0.to_vec();
        let (engine, caller, ino, parent) = (ctx.engine(), ctx.caller.clone(), file.ino, dir.ino);
        blocking(move || engine.link(&caller, ino, parent, &name)).await.map_err(|e| status(&e))
    };
    let linkdir_wcc = ctx.wcc_after(Some(&dir), dir.ino).await;
    let file_attributes = ctx.post(&ctx.getattr(file.ino).await);
    match r {
        Ok(_) => packed(&LINK3res::Ok(LINK3resok { file_attributes, linkdir_wcc })),
        Err(s) => packed(&LINK3res::Err((s, LINK3resfail { file_attributes, linkdir_wcc }))),
    }
}

/// Packed size of an XDR opaque of `n` bytes.
fn opaque_bytes(n: usize) -> usize {
    4 + n.div_ceil(4) * 4
}

/// READDIR and READDIRPLUS. A cookie names the entry it follows (a hash of its name), so a
/// listing resumes at the right place across restarts and concurrent changes; the cookie
/// verifier is unused (always zero).
async fn readdir(state: &Arc<State>, call: &CallInfo, args: &[u8], plus: bool) -> Reply {
    let (fh, cookie, byte_budget) = if plus {
        let a = args_or_garbage!(READDIRPLUS3args, args);
        (a.dir, a.cookie, a.maxcount as usize)
    } else {
        let a = args_or_garbage!(READDIR3args, args);
        (a.dir, a.cookie, a.count as usize)
    };
    let fail_plain = |s, attrs| {
        if plus {
            packed(&READDIRPLUS3res::Err((s, READDIRPLUS3resfail { dir_attributes: attrs })))
        } else {
            packed(&READDIR3res::Err((s, READDIR3resfail { dir_attributes: attrs })))
        }
    };
    let (ctx, dir) = match resolve(state, call, &fh).await {
        Ok(x) => x,
        Err(s) => return fail_plain(s, post_op_attr::None),
    };
    let dir_attr = post_op_attr::Some(fattr(&dir, ctx.export.id));
    if dir.kind != FileKind::Dir {
        return fail_plain(nfsstat3::NFS3ERR_NOTDIR, dir_attr);
    }
    let budget = byte_budget.min(IO_BYTES_MAX as usize).saturating_sub(READDIR_REPLY_OVERHEAD_BYTES);
    let start = if cookie == 0 {
        None
    } else if let Some(name) = state.cookie_name(dir.ino, cookie) {
        Some(name)
    } else {
        // Not remembered (restart or eviction): find the entry whose cookie it is.
        let (engine, caller, ino) = (ctx.engine(), ctx.caller.clone(), dir.ino);
        let found = blocking(move || {
            let mut cursor: Option<Vec<u8>> = None;
            loop {
                let page = engine.readdir(&caller, ino, cursor.as_deref(), READDIR_PAGE_ENTRIES)?;
                if let Some(e) = page.entries.iter().find(|e| cookie_of(&e.name) == cookie) {
                    return Ok(Some(e.name.clone()));
                }
                match page.next_cursor {
                    Some(c) => cursor = Some(c),
                    None => return Ok(None),
                }
            }
        })
        .await;
        match found {
            Ok(Some(n)) => Some(n),
            Ok(None) => return fail_plain(nfsstat3::NFS3ERR_BAD_COOKIE, dir_attr),
            Err(e) => return fail_plain(status(&e), dir_attr),
        }
    };
    // Gather entries (with attributes for READDIRPLUS) until the reply budget is used.
    let (engine, caller, ino) = (ctx.engine(), ctx.caller.clone(), dir.ino);
    let r = blocking(move || {
        let mut out: Vec<(DirEntry, Option<Attr>)> = Vec::new();
        let mut used = 0usize;
        let mut cursor = start;
        loop {
            let page = engine.readdir(&caller, ino, cursor.as_deref(), READDIR_PAGE_ENTRIES)?;
            for e in page.entries {
                let mut cost = 8 + opaque_bytes(e.name.len()) + 8 + 4;
                let attr = if plus {
                    cost += 4 + 84 + 4 + opaque_bytes(crate::handle::HANDLE_BYTES);
                    engine.getattr(&caller, e.ino).ok()
                } else {
                    None
                };
                if used + cost > budget {
                    return Ok((out, false));
                }
                used += cost;
                out.push((e, attr));
            }
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok((out, true)),
            }
        }
    })
    .await;
    let (entries, eof) = match r {
        Ok(x) => x,
        Err(e) => return fail_plain(status(&e), dir_attr),
    };
    if entries.is_empty() && !eof {
        return fail_plain(nfsstat3::NFS3ERR_TOOSMALL, dir_attr);
    }
    if let Some((last, _)) = entries.last() {
        state.remember_cookie(dir.ino, cookie_of(&last.name), &last.name);
    }
    let cookieverf = cookieverf3([0; 8]);
    if plus {
        let list = entries
            .into_iter()
            .map(|(e, attr)| entryplus3 {
                fileid: e.ino,
                cookie: cookie_of(&e.name),
                name_attributes: attr.as_ref().map_or(post_op_attr::None, |a| post_op_attr::Some(fattr(a, ctx.export.id))),
                name_handle: attr.as_ref().map_or(post_op_fh3::None, |a| post_op_fh3::Some(ctx.handle_of(a))),
                name: filename3(Opaque::owned(e.name)),
            })
            .collect();
        packed(&READDIRPLUS3res::Ok(READDIRPLUS3resok {
            dir_attributes: dir_attr,
            cookieverf,
            reply: dirlistplus3 { entries: List(list), eof },
        }))
    } else {
        let list = entries
            .into_iter()
            .map(|(e, _)| entry3 { fileid: e.ino, cookie: cookie_of(&e.name), name: filename3(Opaque::owned(e.name)) })
            .collect();
        packed(&READDIR3res::Ok(READDIR3resok { dir_attributes: dir_attr, cookieverf, reply: dirlist3 { entries: List(list), eof } }))
    }
}

async fn fsstat(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(FSSTAT3args, args);
    let (ctx, attr) = resolve_or!(state, call, &a.fsroot, FSSTAT3resfail { obj_attributes: post_op_attr::None });
    let (engine, caller) = (ctx.engine(), ctx.caller.clone());
    let post = post_op_attr::Some(fattr(&attr, ctx.export.id));
    match blocking(move || engine.statfs(&caller)).await {
        Ok(s) => {
            // The engine does not limit the number of inodes; report what is used plus room.
            let free_files = s.free_bytes / 4096;
            packed(&FSSTAT3res::Ok(FSSTAT3resok {
                obj_attributes: post,
                tbytes: s.total_bytes,
                fbytes: s.free_bytes,
                abytes: s.free_bytes,
                tfiles: s.files.saturating_add(free_files),
                ffiles: free_files,
                afiles: free_files,
                invarsec: 0,
            }))
        }
        Err(e) => packed(&FSSTAT3res::Err((status(&e), FSSTAT3resfail { obj_attributes: post }))),
    }
}

async fn fsinfo(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(FSINFO3args, args);
    let (ctx, attr) = resolve_or!(state, call, &a.fsroot, FSINFO3resfail { obj_attributes: post_op_attr::None });
    packed(&FSINFO3res::Ok(FSINFO3resok {
        obj_attributes: post_op_attr::Some(fattr(&attr, ctx.export.id)),
        rtmax: IO_BYTES_MAX,
        rtpref: IO_BYTES_MAX,
        rtmult: 4096,
        wtmax: IO_BYTES_MAX,
        wtpref: IO_BYTES_MAX,
        wtmult: 4096,
        dtpref: 64 * 1024,
        maxfilesize: storage_engine::FILE_BYTES_MAX,
        time_delta: nfstime3 { seconds: 0, nseconds: 1 },
        properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
    }))
}

async fn pathconf(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(PATHCONF3args, args);
    let (ctx, attr) = resolve_or!(state, call, &a.object, PATHCONF3resfail { obj_attributes: post_op_attr::None });
    packed(&PATHCONF3res::Ok(PATHCONF3resok {
        obj_attributes: post_op_attr::Some(fattr(&attr, ctx.export.id)),
        linkmax: storage_engine::LINKS_MAX,
        name_max: storage_engine::NAME_BYTES_MAX as u32,
        no_trunc: true,
        chown_restricted: true,
        case_insensitive: false,
        case_preserving: true,
    }))
}

async fn commit(state: &Arc<State>, call: &CallInfo, args: &[u8]) -> Reply {
    let a = args_or_garbage!(COMMIT3args, args);
    let (ctx, before) = resolve_or!(state, call, &a.file, COMMIT3resfail { file_wcc: wcc_data::default() });
    let (engine, caller, ino) = (ctx.engine(), ctx.caller.clone(), before.ino);
    // `commit` returns once the file's data and metadata are synced (group commit: a log
    // sync that started after its writes), so an answered COMMIT is on disk.
    let r = blocking_in_place(move || engine.commit(&caller, ino)).await;
    let wcc = ctx.wcc_after(Some(&before), ino).await;
    match r {
        Ok(()) => packed(&COMMIT3res::Ok(COMMIT3resok { file_wcc: wcc, verf: state.write_verf })),
        Err(e) => packed(&COMMIT3res::Err((status(&e), COMMIT3resfail { file_wcc: wcc }))),
    }
}
