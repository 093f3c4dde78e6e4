//! LOCK handler: byte-range locks (MS-SMB2 3.3.5.14).
//!
//! A lone lock element without SMB2_LOCKFLAG_FAIL_IMMEDIATELY that
//! conflicts with a lock held through another open waits for it (MS-SMB2
//! 3.3.5.14.2, MS-FSA 2.1.5.8): the request goes asynchronous, answered
//! STATUS_PENDING at once, and completes when the range can be locked. A
//! CANCEL ends it with STATUS_CANCELLED; closing its open, disconnecting
//! its tree or logging off its session ends it with
//! STATUS_RANGE_NOT_LOCKED, as Windows and Samba answer (Aquifer patch:
//! upstream refused every conflicting lock with STATUS_LOCK_NOT_GRANTED).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::RwLock;
use tracing::warn;

use crate::proto::header::Smb2Header;
use crate::proto::messages::{Dialect, LockElement, LockRequest, LockResponse};

use crate::conn::pending::{Stop, stopped};
use crate::conn::state::{Connection, Open};
use crate::dispatch::HandlerResponse;
use crate::files::FileRef;
use crate::handlers::shared::{lookup_open, lookup_session_tree};
use crate::handlers::{Outcome, Pending};
use crate::ntstatus;
use crate::server::ServerState;

const SHARED: u32 = LockElement::FLAG_SHARED_LOCK;
const EXCLUSIVE: u32 = LockElement::FLAG_EXCLUSIVE_LOCK;
const UNLOCK: u32 = LockElement::FLAG_UNLOCK;
const FAIL_IMMEDIATELY: u32 = LockElement::FLAG_FAIL_IMMEDIATELY;

fn success() -> HandlerResponse {
    let mut buf = Vec::new();
    LockResponse::default().write_to(&mut buf).expect("encode");
    HandlerResponse::ok(buf)
}

pub async fn handle(
    server: &Arc<ServerState>,
    conn: &Arc<Connection>,
    hdr: &Smb2Header,
    body: &[u8],
    retained: usize,
) -> Outcome {
    let done = |status| Outcome::Done(HandlerResponse::err(status));
    let req = match LockRequest::parse(body) {
        Ok(r) => r,
        Err(_) => return done(ntstatus::STATUS_INVALID_PARAMETER),
    };
    let tree_arc = match lookup_session_tree(conn, hdr).await {
        Ok(t) => t,
        Err(s) => return done(s),
    };
    let Some(open_arc) = lookup_open(&tree_arc, req.file_id).await else {
        return done(ntstatus::STATUS_FILE_CLOSED);
    };
    let Some(first) = req.locks.first() else {
        return done(ntstatus::STATUS_INVALID_PARAMETER);
    };
    let open = open_arc.read().await;
    // MS-FSA 2.1.5.8: directories take no byte-range locks.
    if open.is_directory {
        return done(ntstatus::STATUS_INVALID_PARAMETER);
    }
    let Some(file) = open.file.as_ref() else {
        return done(ntstatus::STATUS_FILE_CLOSED);
    };
    // Aquifer patch: lock sequence verification (MS-SMB2 3.3.5.14), on SMB
    // 3.x connections, which all advertise multichannel, and on durable
    // opens; SMB 2.1 would need resilient handles, which are not offered.
    // A replay of the last LOCK that succeeded with the same index and
    // number succeeds without locking again.
    let dialect = *conn.dialect.read().await;
    let verify_sequence = open.durable.is_some()
        || matches!(
            dialect,
            Some(Dialect::Smb300 | Dialect::Smb302 | Dialect::Smb311)
        );
    if verify_sequence && file.lock_sequence_replayed(req.lock_sequence) {
        drop(open);
        return Outcome::Done(success());
    }
    let limit = server.max_locks_per_open.load(Ordering::Relaxed);

    let result = if first.flags & UNLOCK != 0 {
        // MS-SMB2 3.3.5.14.1: unlocks done before a failure stay done, and
        // an element whose LockFlags are anything but SMB2_LOCKFLAG_UNLOCK
        // (FAIL_IMMEDIATELY included; Aquifer patch) is
        // STATUS_INVALID_PARAMETER.
        req.locks.iter().try_for_each(|l| {
            if l.flags != UNLOCK {
                return Err(ntstatus::STATUS_INVALID_PARAMETER);
            }
            file.unlock_range(l.offset, l.length)
        })
    } else {
        let valid = |flags: u32| {
            matches!(flags & !FAIL_IMMEDIATELY, SHARED | EXCLUSIVE)
                && (req.locks.len() == 1 || flags & FAIL_IMMEDIATELY != 0)
        };
        if !req.locks.iter().all(|l| valid(l.flags)) {
            return done(ntstatus::STATUS_INVALID_PARAMETER);
        }
        // MS-SMB2 3.3.5.14.2: only a lone element may wait (more than one
        // element must all fail immediately, checked above). The watch is
        // taken before the attempt, so a release in between is not missed.
        if first.flags & FAIL_IMMEDIATELY == 0 {
            let element = first.clone();
            let mut watch = file.lock_watch();
            match take_one(file, &element, limit) {
                Err(ntstatus::STATUS_LOCK_NOT_GRANTED) => {}
                result => {
                    if result.is_ok() && verify_sequence {
                        file.lock_sequence_done(req.lock_sequence);
                    }
                    drop(open);
                    return Outcome::Done(result.map_or_else(HandlerResponse::err, |()| success()));
                }
            }
            drop(open);
            // MS-SMB2 3.3.4.2: past its limits the connection gets no more
            // asynchronous requests.
            let Some((op, mut stop)) = conn.pending.reserve(hdr, Some(req.file_id), retained)
            else {
                warn!("too many waiting requests on the connection");
                return done(ntstatus::STATUS_INSUFFICIENT_RESOURCES);
            };
            let sequence = verify_sequence.then_some(req.lock_sequence);
            let work = async move {
                loop {
                    tokio::select! {
                        biased;
                        why = stopped(&mut stop) => {
                            return HandlerResponse::err(match why {
                                Stop::Cancelled => ntstatus::STATUS_CANCELLED,
                                Stop::Retry => ntstatus::STATUS_RANGE_NOT_LOCKED,
                            });
                        }
                        () = watch.changed() => {}
                    }
                    match retry(&open_arc, &element, limit, sequence).await {
                        Err(ntstatus::STATUS_LOCK_NOT_GRANTED) => {}
                        Err(status) => return HandlerResponse::err(status),
                        Ok(()) => return success(),
                    }
                }
            };
            return Outcome::Pending(Pending {
                op,
                work: Box::pin(work),
            });
        }
        // MS-SMB2 3.3.5.14.2: a failed lock releases the ranges this request
        // locked before it.
        let mut taken = Vec::new();
        let mut result = Ok(());
        for l in &req.locks {
            match take_one(file, l, limit) {
                Ok(()) => taken.push(l),
                Err(status) => {
                    for t in &taken {
                        file.undo_lock(t.offset, t.length, t.flags & EXCLUSIVE != 0);
                    }
                    result = Err(status);
                    break;
                }
            }
        }
        result
    };
    if result.is_ok() && verify_sequence {
        file.lock_sequence_done(req.lock_sequence);
    }
    drop(open);

    Outcome::Done(result.map_or_else(HandlerResponse::err, |()| success()))
}

fn take_one(file: &FileRef, l: &LockElement, limit: usize) -> Result<(), u32> {
    file.lock_range(l.offset, l.length, l.flags & EXCLUSIVE != 0, limit)
}

/// Tries a waiting lock request again. An open closed meanwhile ends it
/// with STATUS_RANGE_NOT_LOCKED, as closing the open while it waits does.
async fn retry(
    open_arc: &Arc<RwLock<Open>>,
    l: &LockElement,
    limit: usize,
    sequence: Option<u32>,
) -> Result<(), u32> {
    let open = open_arc.read().await;
    let Some(file) = open.file.as_ref() else {
        return Err(ntstatus::STATUS_RANGE_NOT_LOCKED);
    };
    take_one(file, l, limit)?;
    if let Some(sequence) = sequence {
        file.lock_sequence_done(sequence);
    }
    Ok(())
}
