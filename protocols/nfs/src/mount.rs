//! MOUNT protocol version 3 (RFC 1813 appendix I), served on the NFS port.

use nfs3_types::mount::{dirpath, export_node, fhandle3, mountres3, mountres3_ok, mountstat3, name};
use nfs3_types::rpc::auth_flavor;
use nfs3_types::xdr_codec::{List, Opaque, Void};
use storage_engine::{Attr, Caller, Engine, Error, FileKind};
use tracing::info;

use crate::handle::Handle;
use crate::proc::{State, blocking};
use crate::rpc::{CallInfo, Reply, packed};
use crate::wire::decode;

const MOUNTPROC3_NULL: u32 = 0;
const MOUNTPROC3_MNT: u32 = 1;
const MOUNTPROC3_DUMP: u32 = 2;
const MOUNTPROC3_UMNT: u32 = 3;
const MOUNTPROC3_UMNTALL: u32 = 4;
const MOUNTPROC3_EXPORT: u32 = 5;

pub(crate) async fn dispatch(state: &std::sync::Arc<State>, call: &CallInfo, proc_: u32, args: &[u8]) -> Reply {
    match proc_ {
        MOUNTPROC3_NULL => match decode::<Void>(args) {
            Some(_) => packed(&Void),
            None => Reply::GarbageArgs,
        },
        MOUNTPROC3_MNT => match decode::<dirpath>(args) {
            Some(p) => packed(&mnt(state, call, &p.0).await),
            None => Reply::GarbageArgs,
        },
        // Aquifer keeps no list of mounts: NFSv3 is stateless and the list would only be a hint.
        MOUNTPROC3_DUMP => packed(&false),
        MOUNTPROC3_UMNT => match decode::<dirpath>(args) {
            Some(_) => packed(&Void),
            None => Reply::GarbageArgs,
        },
        MOUNTPROC3_UMNTALL => packed(&Void),
        MOUNTPROC3_EXPORT => {
            let nodes: Vec<export_node> = state
                .exports
                .snapshot()
                .iter()
                .map(|e| export_node {
                    ex_dir: dirpath(Opaque::owned(e.path.as_bytes().to_vec())),
                    ex_groups: List(e.export.clients.iter().map(|c| name(Opaque::owned(c.as_bytes().to_vec()))).collect()),
                })
                .collect();
            packed(&List(nodes))
        }
        _ => Reply::ProcUnavailable,
    }
}

/// The directory `rest` names below the export's root `root_path`, as the caller sees it.
/// With `here` (an event loop), None when a step would need the hub of a portal.
fn mount_point(engine: &Engine, caller: &Caller, root_path: &str, rest: &str, here: bool) -> Option<Result<Attr, Error>> {
    let root = if here { engine.try_resolve(&Caller::system(), root_path) } else { Some(engine.resolve(&Caller::system(), root_path)) };
    let mut cur = match root? {
        Ok(a) => a,
        Err(e) => return Some(Err(e)),
    };
    for comp in rest.split('/').filter(|c| !c.is_empty()) {
        if comp == ".." || comp == "." {
            return Some(Err(Error::InvalidArgument("mount path with . or ..".into())));
        }
        let next = if here { engine.try_lookup(caller, cur.ino, comp.as_bytes()) } else { Some(engine.lookup(caller, cur.ino, comp.as_bytes())) };
        cur = match next? {
            Ok(a) => a,
            Err(e) => return Some(Err(e)),
        };
    }
    if cur.kind != FileKind::Dir {
        return Some(Err(Error::NotDir));
    }
    Some(Ok(cur))
}

async fn mnt(state: &std::sync::Arc<State>, call: &CallInfo, path: &[u8]) -> mountres3<'static> {
    let Ok(path) = std::str::from_utf8(path) else { return mountres3::Err(mountstat3::MNT3ERR_INVAL) };
    if path.len() > nfs3_types::mount::MNTPATHLEN {
        return mountres3::Err(mountstat3::MNT3ERR_NAMETOOLONG);
    }
    let Some((export, rest)) = state.export_for_path(path) else { return mountres3::Err(mountstat3::MNT3ERR_NOENT) };
    if !export.allows(call.peer) {
        info!(peer = %call.peer, export = %export.path, "mount refused: client not in the export's list");
        return mountres3::Err(mountstat3::MNT3ERR_ACCES);
    }
    let caller = export.caller(state, call.cred.as_ref()).await;
    let engine = state.engine.clone();
    // Metadata reads only: done here unless a directory on the way is a portal mirror
    // (libnfs clients mount once per process, and some mount twice).
    let r = match mount_point(&engine, &caller, &export.path, rest, true) {
        Some(r) => r,
        None => {
            let (root_path, rest) = (export.path.clone(), rest.to_string());
            blocking(move || mount_point(&engine, &caller, &root_path, &rest, false).expect("a blocking walk always answers")).await
        }
    };
    match r {
        Ok(attr) => {
            let h = Handle { export_id: export.id, ino: attr.ino, generation: attr.generation };
            info!(peer = %call.peer, path, "mounted");
            mountres3::Ok(mountres3_ok {
                fhandle: fhandle3(Opaque::owned(h.encode())),
                auth_flavors: vec![auth_flavor::AUTH_UNIX as u32],
            })
        }
        Err(e) => mountres3::Err(match e {
            Error::NotFound => mountstat3::MNT3ERR_NOENT,
            Error::NotDir => mountstat3::MNT3ERR_NOTDIR,
            Error::PermissionDenied | Error::Unauthenticated => mountstat3::MNT3ERR_ACCES,
            Error::InvalidName(_) | Error::InvalidArgument(_) => mountstat3::MNT3ERR_INVAL,
            _ => mountstat3::MNT3ERR_IO,
        }),
    }
}
