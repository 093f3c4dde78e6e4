//! Oplocks through the file table: grants, breaks, acknowledgments, the
//! acknowledgment timer, and oplocks beside leases on one file.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::access_mask::{DELETE, FILE_READ_ATTRIBUTES, FILE_READ_DATA, FILE_WRITE_DATA};
use crate::backend::FileInfo;
use crate::conn::outbound::Outbound;
use crate::conn::writer::{ResponseReceiver, response_queue};
use crate::ntstatus;
use crate::path::SmbPath;
use crate::proto::header::{Command, Smb2Header};
use crate::proto::messages::{
    FileId, LeaseBreakNotification, OplockBreakNotification, OplockLevel,
};
use crate::server::{ShareBindings, ShareMode};
use crate::tests::memfs::MemFsBackend;

use super::lease::{LeaseId, LeaseRequest, LeaseState, LeaseVersion, Trigger};
use super::leases::LeaseTable;
use super::table::{FileRef, OpenRequest, Sharing};

use OplockLevel::{Batch, Exclusive, Ii, None as NoOplock};

const ALL: u32 = 7;
const RW: u32 = FILE_READ_DATA | FILE_WRITE_DATA;

fn share() -> Arc<ShareBindings> {
    ShareBindings::new(
        "s".to_string(),
        Arc::new(MemFsBackend::new()),
        ShareMode::Public,
        HashMap::new(),
        false,
        true,
        true,
    )
}

fn connection() -> (Arc<Outbound>, ResponseReceiver) {
    let (tx, rx) = response_queue();
    let outbound = Arc::new(Outbound::default());
    outbound.attach(tx);
    (outbound, rx)
}

/// What [`open`] asks for.
#[derive(Clone, Copy)]
struct Ask {
    access: u32,
    share: u32,
    overwrite: bool,
    break_handles: bool,
}

const PLAIN: Ask = Ask {
    access: RW,
    share: ALL,
    overwrite: false,
    break_handles: true,
};

/// Registers an open of file 7 on `owner`'s connection.
fn register(
    share: &Arc<ShareBindings>,
    owner: &Arc<Outbound>,
    ask: Ask,
    lease: Option<LeaseId>,
) -> Result<(FileRef, Option<super::BreakWait>), super::Refused> {
    let mut info = FileInfo::new("");
    info.file_index = 7;
    let req = OpenRequest {
        sharing: Sharing {
            access: ask.access,
            share: ask.share,
        },
        owner: Arc::downgrade(owner),
        lease,
        overwrite: ask.overwrite,
        break_handles: ask.break_handles,
    };
    FileRef::register(share, &info, &"f".parse::<SmbPath>().unwrap(), req)
}

/// Opens file 7 and grants it the oplock `level` asks for, with the grant
/// already sent. Returns the open and the level granted.
fn oplocked(
    share: &Arc<ShareBindings>,
    owner: &Arc<Outbound>,
    ask: Ask,
    level: OplockLevel,
    volatile: u64,
) -> (FileRef, OplockLevel) {
    let (file, wait) = register(share, owner, ask, None).expect("open admitted");
    assert!(wait.is_none(), "nothing to wait for");
    let (granted, guard) = file.grant_oplock(level, FileId::new(1, volatile), ask.overwrite);
    drop(guard);
    (file, granted)
}

/// The oplock break in `frame`.
fn oplock_break(frame: &[u8]) -> OplockBreakNotification {
    let (hdr, body) = Smb2Header::parse(frame).unwrap();
    assert_eq!(hdr.command, Command::OplockBreak);
    assert_eq!((hdr.message_id, hdr.session_id), (u64::MAX, 0));
    OplockBreakNotification::parse(body).unwrap()
}

fn level(n: &OplockBreakNotification) -> OplockLevel {
    OplockLevel::from_u8(n.oplock_level).unwrap()
}

#[test]
fn an_open_breaks_batch_to_level_ii_and_waits_for_the_acknowledgment() {
    let s = share();
    let (holder, mut rx) = connection();
    let (other, mut other_rx) = connection();
    let (a, granted) = oplocked(&s, &holder, PLAIN, Batch, 1);
    assert_eq!(granted, Batch);

    let (b, wait) = register(&s, &other, PLAIN, None).unwrap();
    assert!(wait.is_some(), "the open waits for the holder");
    let n = oplock_break(&rx.try_recv().expect("break"));
    assert_eq!((level(&n), n.file_id), (Ii, FileId::new(1, 1)));
    assert!(other_rx.try_recv().is_none());
    assert!(matches!(b.end_wait(), Ok(Some(_))), "still breaking");
    // A second open while the break is in progress sends nothing more.
    let (c, _) = register(&s, &other, PLAIN, None).unwrap();
    assert!(rx.try_recv().is_none());

    assert_eq!(a.acknowledge_oplock(1).map(|(l, _)| l), Ok(Ii));
    assert!(matches!(b.end_wait(), Ok(None)));
    assert!(matches!(c.end_wait(), Ok(None)));
    // Level II beside level II; no exclusive oplock beside another open.
    assert_eq!(b.grant_oplock(Batch, FileId::new(1, 2), false).0, Ii);
    // A second acknowledgment finds no break in progress.
    assert_eq!(
        a.acknowledge_oplock(0).err(),
        Some(ntstatus::STATUS_INVALID_DEVICE_STATE)
    );
}

#[test]
fn an_overwrite_breaks_to_none_whatever_level_is_acknowledged() {
    let s = share();
    let (holder, mut rx) = connection();
    let (a, _) = oplocked(&s, &holder, PLAIN, Exclusive, 1);
    let overwrite = Ask {
        overwrite: true,
        ..PLAIN
    };
    let (b, wait) = register(&s, &holder, overwrite, None).unwrap();
    assert!(wait.is_some());
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), NoOplock);
    assert_eq!(a.acknowledge_oplock(1).map(|(l, _)| l), Ok(NoOplock));
    assert!(matches!(b.end_wait(), Ok(None)));
    // The holder keeps no oplock, so the new open gets level II.
    assert_eq!(b.grant_oplock(Batch, FileId::new(1, 2), true).0, Ii);
}

#[test]
fn writes_break_every_level_ii_to_none_without_an_acknowledgment() {
    let s = share();
    let (first, mut first_rx) = connection();
    let (second, mut second_rx) = connection();
    let (a, granted) = oplocked(&s, &first, PLAIN, Ii, 1);
    assert_eq!(granted, Ii);
    let (b, granted) = oplocked(&s, &second, PLAIN, Ii, 2);
    assert_eq!(granted, Ii);
    // Both opens of one file may hold level II; a new open breaks neither.
    assert!(first_rx.try_recv().is_none());

    // A write breaks the writer's own level II as well.
    a.break_leases(Trigger::Write);
    let n = oplock_break(&first_rx.try_recv().expect("own break"));
    assert_eq!((level(&n), n.file_id), (NoOplock, FileId::new(1, 1)));
    let n = oplock_break(&second_rx.try_recv().expect("other break"));
    assert_eq!((level(&n), n.file_id), (NoOplock, FileId::new(1, 2)));
    // Nothing to acknowledge: the open holds no oplock any more.
    assert_eq!(
        b.acknowledge_oplock(0).err(),
        Some(ntstatus::STATUS_INVALID_OPLOCK_PROTOCOL)
    );
    // Nothing left to break.
    b.break_leases(Trigger::Write);
    assert!(first_rx.try_recv().is_none());
    assert!(second_rx.try_recv().is_none());
}

#[test]
fn a_break_waits_for_the_grant_to_be_sent() {
    let s = share();
    let (holder, mut rx) = connection();
    let (a, _) = register(&s, &holder, PLAIN, None).unwrap();
    let (granted, guard) = a.grant_oplock(Exclusive, FileId::new(1, 1), false);
    assert_eq!(granted, Exclusive);
    let (_b, wait) = register(&s, &holder, PLAIN, None).unwrap();
    assert!(wait.is_some());
    assert!(rx.try_recv().is_none(), "held back for the grant");
    drop(guard);
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), Ii);
}

#[test]
fn a_sharing_violation_breaks_batch_but_not_exclusive() {
    let s = share();
    let (holder, mut rx) = connection();
    let unshared = Ask { share: 0, ..PLAIN };
    let deleter = Ask {
        access: DELETE,
        ..PLAIN
    };
    let (a, _) = oplocked(&s, &holder, unshared, Exclusive, 1);
    let refused = register(&s, &holder, deleter, None).err().unwrap();
    assert_eq!(refused.status, ntstatus::STATUS_SHARING_VIOLATION);
    assert!(refused.wait.is_none());
    assert!(rx.try_recv().is_none());
    drop(a);

    let (a, _) = oplocked(&s, &holder, unshared, Batch, 1);
    let refused = register(&s, &holder, deleter, None).err().unwrap();
    assert!(refused.wait.is_some(), "the holder may close first");
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), Ii);
    // The holder closes instead of acknowledging; the open then succeeds.
    drop(a);
    assert!(register(&s, &holder, deleter, None).is_ok());
}

#[test]
fn attribute_only_opens_break_nothing_and_get_no_oplock() {
    let s = share();
    let (holder, mut rx) = connection();
    let (_a, _) = oplocked(&s, &holder, PLAIN, Exclusive, 1);
    let stat = Ask {
        access: FILE_READ_ATTRIBUTES,
        ..PLAIN
    };
    let (b, wait) = register(&s, &holder, stat, None).unwrap();
    assert!(wait.is_none());
    assert!(rx.try_recv().is_none());
    assert_eq!(b.grant_oplock(Batch, FileId::new(1, 2), false).0, NoOplock);
    // Alone on a file, it gets what it asks for, and its oplock then keeps
    // others to level II.
    let alone = share();
    let (creator, mut creator_rx) = connection();
    let (c, _) = register(&alone, &creator, stat, None).unwrap();
    assert_eq!(c.grant_oplock(Batch, FileId::new(1, 3), false).0, Batch);
    let (d, _) = register(&alone, &creator, PLAIN, None).unwrap();
    assert_eq!(level(&oplock_break(&creator_rx.try_recv().unwrap())), Ii);
    c.acknowledge_oplock(1).unwrap();
    assert!(matches!(d.end_wait(), Ok(None)));
    drop(d);
    let (e, _) = register(&alone, &creator, PLAIN, None).unwrap();
    assert_eq!(e.grant_oplock(Batch, FileId::new(1, 5), false).0, Ii);
    // One that overwrites the file breaks, to none.
    let (_c, wait) = register(
        &s,
        &holder,
        Ask {
            overwrite: true,
            ..stat
        },
        None,
    )
    .unwrap();
    assert!(wait.is_some());
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), NoOplock);
}

#[test]
fn byte_range_locks_break_level_ii_and_keep_it_from_being_granted() {
    let s = share();
    let (holder, mut rx) = connection();
    let (a, _) = oplocked(&s, &holder, PLAIN, Ii, 1);
    a.lock_range(0, 10, true, 8).unwrap();
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), NoOplock);
    let (b, _) = register(&s, &holder, PLAIN, None).unwrap();
    assert_eq!(b.grant_oplock(Ii, FileId::new(1, 2), false).0, NoOplock);
}

#[test]
fn a_later_trigger_lowers_a_break_in_progress() {
    let s = share();
    let (holder, mut rx) = connection();
    let (a, _) = oplocked(&s, &holder, PLAIN, Batch, 1);
    let (b, _) = register(&s, &holder, PLAIN, None).unwrap();
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), Ii);
    b.break_leases(Trigger::Write);
    assert!(rx.try_recv().is_none(), "one notification per break");
    // The acknowledgment to level II is answered, then the oplock breaks on
    // to none.
    let (acked, breaks) = a.acknowledge_oplock(1).unwrap();
    assert_eq!(acked, Ii);
    assert!(rx.try_recv().is_none(), "after the response");
    drop(breaks);
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), NoOplock);
}

#[test]
fn wrong_acknowledgments_end_a_break_at_none() {
    let s = share();
    let (holder, mut rx) = connection();
    let (a, _) = oplocked(&s, &holder, PLAIN, Batch, 1);
    assert_eq!(
        a.acknowledge_oplock(1).err(),
        Some(ntstatus::STATUS_INVALID_DEVICE_STATE),
        "no break in progress"
    );
    assert_eq!(
        a.acknowledge_oplock(8).err(),
        Some(ntstatus::STATUS_INVALID_OPLOCK_PROTOCOL)
    );
    let (b, _) = register(&s, &holder, PLAIN, None).unwrap();
    rx.try_recv().unwrap();
    assert_eq!(
        a.acknowledge_oplock(9).err(),
        Some(ntstatus::STATUS_INVALID_OPLOCK_PROTOCOL)
    );
    assert!(matches!(b.end_wait(), Ok(None)), "the break ended");
    // The oplock is gone: a write breaks nothing.
    b.break_leases(Trigger::Write);
    assert!(rx.try_recv().is_none());
}

#[tokio::test(start_paused = true)]
async fn an_unacknowledged_break_times_out_to_none() {
    let s = share();
    s.files.set_ack_timeout(Duration::from_millis(200));
    let (holder, mut rx) = connection();
    let (a, _) = oplocked(&s, &holder, PLAIN, Batch, 1);
    let (b, wait) = register(&s, &holder, PLAIN, None).unwrap();
    let mut wait = wait.unwrap();
    rx.try_recv().unwrap();
    let started = tokio::time::Instant::now();
    while let Ok(Some(next)) = b.end_wait() {
        assert!(wait.changed().await);
        wait = next;
    }
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(waited < Duration::from_secs(1), "{waited:?}");
    assert_eq!(
        a.acknowledge_oplock(0).err(),
        Some(ntstatus::STATUS_INVALID_OPLOCK_PROTOCOL),
        "the break is over, and the oplock with it"
    );
}

#[test]
fn closing_the_holder_ends_its_break() {
    let s = share();
    let (holder, _rx) = connection();
    let (a, _) = oplocked(&s, &holder, PLAIN, Exclusive, 1);
    let (b, _) = register(&s, &holder, PLAIN, None).unwrap();
    assert!(matches!(b.end_wait(), Ok(Some(_))));
    drop(a);
    assert!(matches!(b.end_wait(), Ok(None)));
    // Alone on the file again, the open may hold an exclusive oplock.
    assert_eq!(
        b.grant_oplock(Exclusive, FileId::new(1, 2), false).0,
        Exclusive
    );
}

fn lease_id(n: u8) -> LeaseId {
    LeaseId {
        client: Uuid::nil(),
        key: [n; 16],
    }
}

#[test]
fn leases_and_oplocks_on_one_file_break_together() {
    let table = Arc::new(LeaseTable::default());
    let s = share();
    let (holder, mut rx) = connection();
    let (leaseholder, mut lease_rx) = connection();
    let (a, _) = oplocked(&s, &holder, PLAIN, Batch, 1);

    // A lease open breaks the batch oplock and waits for it.
    let path: SmbPath = "f".parse().unwrap();
    let lease_ref = table.acquire(lease_id(1), &s, &path).unwrap();
    let (mut l, wait) = register(&s, &leaseholder, PLAIN, Some(lease_id(1))).unwrap();
    assert!(wait.is_some());
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), Ii);
    assert!(matches!(l.end_wait(), Ok(Some(_))));
    a.acknowledge_oplock(1).unwrap();
    assert!(matches!(l.end_wait(), Ok(None)));
    // Beside an oplock the lease caches reads only.
    let req = LeaseRequest {
        id: lease_id(1),
        state: LeaseState::RWH,
        version: LeaseVersion::V2,
        epoch: 0,
        parent: None,
    };
    let (granted, guard) = table
        .grant(lease_ref, &mut l, &req, LeaseState::RWH)
        .unwrap();
    drop(guard);
    assert_eq!(granted.state, LeaseState::R);

    // A write through a third open breaks both, each its own way.
    let (c, _) = register(&s, &holder, PLAIN, None).unwrap();
    c.break_leases(Trigger::Write);
    assert_eq!(level(&oplock_break(&rx.try_recv().unwrap())), NoOplock);
    let frame = lease_rx.try_recv().expect("lease break");
    let n = LeaseBreakNotification::parse(&frame[64..]).unwrap();
    assert_eq!((n.current_lease_state, n.new_lease_state), (1, 0));

    // Beside the lease's open, a batch oplock asked for is level II.
    drop(c);
    drop(a);
    let (d, _) = register(&s, &holder, PLAIN, None).unwrap();
    assert_eq!(d.grant_oplock(Batch, FileId::new(1, 4), false).0, Ii);
}

#[test]
fn a_lease_caching_handles_keeps_oplocks_out() {
    let table = Arc::new(LeaseTable::default());
    let s = share();
    let (holder, mut rx) = connection();
    let path: SmbPath = "f".parse().unwrap();
    let lease_ref = table.acquire(lease_id(1), &s, &path).unwrap();
    let (mut l, _) = register(&s, &holder, PLAIN, Some(lease_id(1))).unwrap();
    let req = LeaseRequest {
        id: lease_id(1),
        state: LeaseState::RH,
        version: LeaseVersion::V1,
        epoch: 0,
        parent: None,
    };
    let (granted, guard) = table
        .grant(lease_ref, &mut l, &req, LeaseState::RWH)
        .unwrap();
    drop(guard);
    assert_eq!(granted.state, LeaseState::RH);
    // An open asking for an oplock breaks nothing and gets none.
    let (b, wait) = register(&s, &holder, PLAIN, None).unwrap();
    assert!(wait.is_none());
    assert!(rx.try_recv().is_none());
    assert_eq!(b.grant_oplock(Ii, FileId::new(1, 2), false).0, NoOplock);
}

/// Session binding (Aquifer patch): once the connection an open was made on
/// is gone, its breaks go to the session's other channel.
#[test]
fn a_moved_open_is_broken_on_its_new_connection() {
    let s = share();
    let (first, mut first_rx) = connection();
    let (second, mut second_rx) = connection();
    let (other, _other_rx) = connection();
    let (a, _) = oplocked(&s, &first, PLAIN, Batch, 1);
    // Moving from a connection that does not own the open changes nothing.
    a.move_owner(&other, Arc::downgrade(&other));
    a.move_owner(&first, Arc::downgrade(&second));

    let (b, wait) = register(&s, &other, PLAIN, None).unwrap();
    assert!(wait.is_some(), "the open waits for the holder");
    let n = oplock_break(&second_rx.try_recv().expect("break on the new connection"));
    assert_eq!((level(&n), n.file_id), (Ii, FileId::new(1, 1)));
    assert!(first_rx.try_recv().is_none());
    assert_eq!(a.acknowledge_oplock(1).map(|(l, _)| l), Ok(Ii));
    assert!(matches!(b.end_wait(), Ok(None)));
}

fn durable_table() -> Arc<super::DurableTable> {
    Arc::new(super::DurableTable::new(Duration::from_secs(60), 16))
}

#[test]
fn a_durable_batch_open_is_kept_and_a_break_closes_it() {
    let s = share();
    let durable = durable_table();
    let (holder, mut holder_rx) = connection();
    let (held, granted) = oplocked(&s, &holder, PLAIN, Batch, 1);
    assert_eq!(granted, Batch);
    held.mark_durable(&durable, 9);
    assert!(held.try_detach(), "BATCH caches handles");

    // No connection takes the break: the kept open is to be closed instead,
    // and the conflicting open waits for it to leave.
    let (other, second_rx) = connection();
    let (waiting, wait) = register(&s, &other, PLAIN, None).expect("open admitted");
    assert!(wait.is_some());
    assert!(holder_rx.try_recv().is_none());
    drop(second_rx);
    assert!(held.reattach(Arc::downgrade(&other), FileId::new(9, 2)).is_none());
    assert!(matches!(waiting.end_wait(), Ok(Some(_))));
    drop(held);
    assert!(matches!(waiting.end_wait(), Ok(None)));
}

#[test]
fn a_reconnected_batch_open_gets_its_breaks_under_its_new_file_id() {
    let s = share();
    let durable = durable_table();
    let (holder, _holder_rx) = connection();
    let (held, _) = oplocked(&s, &holder, PLAIN, Batch, 1);
    held.mark_durable(&durable, 9);
    assert!(held.try_detach());

    let (back, mut back_rx) = connection();
    let Some(super::Reattached::Oplock(kept)) =
        held.reattach(Arc::downgrade(&back), FileId::new(9, 5))
    else {
        panic!("the oplock comes back");
    };
    assert_eq!(kept, Batch);

    let (other, _other_rx) = connection();
    let (_waiting, wait) = register(&s, &other, PLAIN, None).expect("open admitted");
    assert!(wait.is_some());
    let n = oplock_break(&back_rx.try_recv().expect("break on the new connection"));
    assert_eq!(level(&n), Ii);
    assert_eq!((n.file_id.persistent, n.file_id.volatile), (9, 5));
}

#[test]
fn an_open_holding_less_than_batch_is_not_kept() {
    let s = share();
    let durable = durable_table();
    let (holder, _rx) = connection();
    let (held, granted) = oplocked(&s, &holder, PLAIN, Exclusive, 1);
    assert_eq!(granted, Exclusive);
    held.mark_durable(&durable, 9);
    assert!(!held.try_detach());
}
