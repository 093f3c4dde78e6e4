//! Aquifer patch: upstream granted no oplocks.
//!
//! Classic SMB2 oplocks of one open (MS-SMB2 3.3.1.10 Open.OplockLevel and
//! Open.OplockState, 3.3.4.6, 3.3.5.9, 3.3.5.22.1; MS-FSA 2.1.4.12,
//! 2.1.5.17). Plain rules and data: the file table builds the inputs and
//! applies the results under its lock, beside the file's leases.
//!
//! An oplock belongs to one open, not to a key shared by several opens as a
//! lease does. BATCH caches reads, writes and the handle, EXCLUSIVE reads
//! and writes, LEVEL_II reads; a break from BATCH or EXCLUSIVE needs the
//! client's acknowledgment, a break of LEVEL_II does not.

use crate::access_mask::{FILE_READ_ATTRIBUTES, FILE_WRITE_ATTRIBUTES, SYNCHRONIZE};
use crate::proto::header::{Command, HeaderTail, SMB2_FLAGS_SERVER_TO_REDIR, Smb2Header};
use crate::proto::messages::{FileId, OplockBreakNotification, OplockLevel};

use super::lease::Trigger;

/// StructureSize of an oplock break notification, acknowledgment and
/// response (MS-SMB2 2.2.23.1, 2.2.24.1, 2.2.25.1).
pub(crate) const OPLOCK_BREAK_SIZE: u16 = 24;

/// The oplock an open holds (Open.OplockLevel, Open.OplockState).
#[derive(Debug)]
pub(crate) struct Oplock {
    /// Open.OplockLevel: NONE once broken, II, EXCLUSIVE or BATCH. It keeps
    /// the level held while a break is in progress.
    pub level: OplockLevel,
    /// The open's FileId, which the break notification names.
    pub file_id: FileId,
    /// The CREATE response granting the oplock is not yet queued. A break
    /// notification waits in `unsent` meanwhile, so the client never sees a
    /// break before the grant.
    pub granting: bool,
    /// A break notification not yet sent.
    pub unsent: Option<Vec<u8>>,
    /// Open.OplockState Breaking: the break the client has to acknowledge.
    pub breaking: Option<OplockBreaking>,
}

/// A break from EXCLUSIVE or BATCH in progress.
#[derive(Debug)]
pub(crate) struct OplockBreaking {
    /// The level notified: the acknowledgment can keep no more than it.
    pub to: OplockLevel,
    /// What the server needs once the break completes, within `to`. A later
    /// trigger lowers it, and the acknowledgment then breaks on to it.
    pub required: OplockLevel,
    /// Tells this break from a later one of the same open.
    pub seq: u64,
    /// The acknowledgment timer, once the notification is sent.
    pub timer: Option<tokio::task::AbortHandle>,
}

impl Drop for OplockBreaking {
    fn drop(&mut self) {
        if let Some(timer) = self.timer.take() {
            timer.abort();
        }
    }
}

impl Oplock {
    /// Whether the oplock caches writes: EXCLUSIVE or BATCH, even while a
    /// break of it is in progress.
    pub fn exclusive(&self) -> bool {
        is_exclusive(self.level)
    }
}

/// True for an open whose access is limited to reading and writing
/// attributes and SYNCHRONIZE: it breaks no oplock. Unlike for leases, an
/// open that may read the security descriptor is not one (Windows and
/// Samba agree; smbtorture's `oplock.statopen1`).
pub(crate) fn oplock_stat_only(access: u32) -> bool {
    access & !(FILE_READ_ATTRIBUTES | FILE_WRITE_ATTRIBUTES | SYNCHRONIZE) == 0
}

/// EXCLUSIVE or BATCH.
pub(crate) fn is_exclusive(level: OplockLevel) -> bool {
    matches!(level, OplockLevel::Exclusive | OplockLevel::Batch)
}

/// The lower of two levels, ordered NONE < II < EXCLUSIVE < BATCH.
pub(crate) fn lower(a: OplockLevel, b: OplockLevel) -> OplockLevel {
    let rank = |l: OplockLevel| match l {
        OplockLevel::None | OplockLevel::Lease => 0,
        OplockLevel::Ii => 1,
        OplockLevel::Exclusive => 2,
        OplockLevel::Batch => 3,
    };
    if rank(a) <= rank(b) { a } else { b }
}

/// The file an oplock is requested on, as the grant rule sees it. Every
/// field leaves out the requesting open itself.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OplockFile {
    /// Another open that is not attribute-only, or that holds an oplock
    /// (an attribute-only open that created the file may).
    pub other_opens: bool,
    /// Another open holding EXCLUSIVE or BATCH, or breaking from it.
    pub other_exclusive: bool,
    /// Another open holding a lease that caches anything.
    pub other_lease: bool,
    /// Another open holding a lease that caches writes.
    pub other_lease_write: bool,
    /// Another open holding a lease that caches handles.
    pub other_lease_handle: bool,
    /// A byte-range lock on the file.
    pub has_locks: bool,
}

/// The oplock a CREATE gets (MS-SMB2 3.3.5.9, MS-FSA 2.1.5.17): EXCLUSIVE
/// or BATCH when asked for and no other open or lease shares the file;
/// otherwise LEVEL_II, when no other open caches writes or handles (a lease
/// with handle caching keeps oplocks out: MS-FSA 2.1.5.17.2) and no
/// byte-range lock is held; otherwise NONE. `refused` gets none: an attribute-only
/// open beside other opens, which breaks none of their oplocks.
pub(crate) fn grant_oplock(
    requested: OplockLevel,
    refused: bool,
    file: &OplockFile,
) -> OplockLevel {
    if matches!(requested, OplockLevel::None | OplockLevel::Lease) || refused {
        return OplockLevel::None;
    }
    if is_exclusive(requested) && !file.other_opens && !file.other_lease && !file.other_exclusive {
        return requested;
    }
    if file.other_exclusive || file.other_lease_write || file.other_lease_handle || file.has_locks {
        OplockLevel::None
    } else {
        OplockLevel::Ii
    }
}

/// How an oplock breaks for a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OplockBreakTo {
    pub to: OplockLevel,
    /// The client acknowledges the break: it was EXCLUSIVE or BATCH.
    pub ack: bool,
    /// The operation waits for the acknowledgment before it goes on.
    pub wait: bool,
}

/// How an oplock at `level` breaks for `trigger`, or `None` when it keeps
/// its level (MS-FSA 2.1.4.12 for oplocks that are not leases). `own` when
/// the trigger comes through the open holding the oplock: only a write
/// through it breaks its own LEVEL_II. An open breaks EXCLUSIVE and BATCH
/// to LEVEL_II, or everything to NONE when it overwrites; a write, size
/// change or byte-range lock breaks everything to NONE; a sharing
/// violation, a rename or a delete breaks BATCH, which caches the handle,
/// to LEVEL_II.
pub(crate) fn oplock_break_to(
    trigger: Trigger,
    level: OplockLevel,
    own: bool,
) -> Option<OplockBreakTo> {
    if level == OplockLevel::None
        || (own && !(trigger == Trigger::Write && level == OplockLevel::Ii))
    {
        return None;
    }
    let exclusive = is_exclusive(level);
    let to = match trigger {
        Trigger::Open { overwrite: false } if exclusive => OplockLevel::Ii,
        Trigger::Open { overwrite: false } => return None,
        Trigger::Open { overwrite: true } | Trigger::Write => OplockLevel::None,
        Trigger::SharingViolation | Trigger::Handle if level == OplockLevel::Batch => {
            OplockLevel::Ii
        }
        Trigger::SharingViolation | Trigger::Handle => return None,
    };
    Some(OplockBreakTo {
        to,
        ack: exclusive,
        wait: exclusive,
    })
}

/// What an acknowledgment of an open's oplock does (MS-SMB2 3.3.5.22.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckOutcome {
    /// The break completes at this level, which the response carries.
    Acked(OplockLevel),
    /// The acknowledgment fails with this status; `drop` when a break in
    /// progress completes with NONE all the same.
    Refused { status: u32, drop: bool },
}

/// MS-SMB2 3.3.5.22.1 for an open holding `level`, with `breaking_to` the
/// level notified when a break is in progress, acknowledged with `acked`.
/// A level outside NONE and II, or anything but NONE for LEVEL_II, is
/// STATUS_INVALID_OPLOCK_PROTOCOL (a lease level STATUS_INVALID_PARAMETER);
/// during a break that also ends it at NONE. An acknowledgment for an open
/// holding no oplock is STATUS_INVALID_OPLOCK_PROTOCOL too, as the object
/// store answers when the file has no oplock (MS-FSA 2.1.5.18.3; a client
/// acknowledging a break of LEVEL_II, which needs none, gets it: smbtorture
/// `oplock.levelii500`); one for an oplock with no break in progress is
/// STATUS_INVALID_DEVICE_STATE. A break to NONE completes at NONE whatever
/// level the client acknowledges.
pub(crate) fn acknowledge(
    level: OplockLevel,
    breaking_to: Option<OplockLevel>,
    acked: u8,
) -> AckOutcome {
    let breaking = breaking_to.is_some();
    let refuse = |status| AckOutcome::Refused {
        status,
        drop: breaking,
    };
    let acked = OplockLevel::from_u8(acked);
    if acked == Some(OplockLevel::Lease) {
        return refuse(crate::ntstatus::STATUS_INVALID_PARAMETER);
    }
    let fits = match level {
        OplockLevel::Exclusive | OplockLevel::Batch => {
            matches!(acked, Some(OplockLevel::None | OplockLevel::Ii))
        }
        OplockLevel::Ii => acked == Some(OplockLevel::None),
        OplockLevel::None | OplockLevel::Lease => false,
    };
    if !fits {
        return refuse(crate::ntstatus::STATUS_INVALID_OPLOCK_PROTOCOL);
    }
    let Some(to) = breaking_to else {
        return AckOutcome::Refused {
            status: crate::ntstatus::STATUS_INVALID_DEVICE_STATE,
            drop: false,
        };
    };
    match acked {
        Some(OplockLevel::Ii) if to == OplockLevel::Ii => AckOutcome::Acked(OplockLevel::Ii),
        _ => AckOutcome::Acked(OplockLevel::None),
    }
}

/// An oplock break notification for the open `file_id`, to `to` (MS-SMB2
/// 2.2.23.1, 3.3.4.6): unsigned, SessionId and TreeId 0, MessageId all
/// ones, no credits.
pub(crate) fn oplock_notification(file_id: FileId, to: OplockLevel) -> Vec<u8> {
    let hdr = Smb2Header {
        command: Command::OplockBreak,
        flags: SMB2_FLAGS_SERVER_TO_REDIR,
        message_id: u64::MAX,
        tail: HeaderTail::sync(0),
        ..Smb2Header::default()
    };
    let mut out = Vec::with_capacity(64 + usize::from(OPLOCK_BREAK_SIZE));
    hdr.write(&mut out)
        .expect("encoding into a Vec cannot fail");
    oplock_body(file_id, to)
        .write_to(&mut out)
        .expect("encoding into a Vec cannot fail");
    out
}

/// The body of an oplock break notification or response.
pub(crate) fn oplock_body(file_id: FileId, level: OplockLevel) -> OplockBreakNotification {
    OplockBreakNotification {
        structure_size: OPLOCK_BREAK_SIZE,
        oplock_level: level as u8,
        reserved: 0,
        reserved2: 0,
        file_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ntstatus;

    use OplockLevel::{Batch, Exclusive, Ii, None as NoOplock};

    #[test]
    fn a_lone_open_gets_what_it_asks_for() {
        let alone = OplockFile::default();
        for level in [NoOplock, Ii, Exclusive, Batch] {
            assert_eq!(grant_oplock(level, false, &alone), level);
        }
        assert_eq!(grant_oplock(OplockLevel::Lease, false, &alone), NoOplock);
        assert_eq!(
            grant_oplock(Batch, true, &alone),
            NoOplock,
            "attribute-only"
        );
    }

    #[test]
    fn a_shared_file_gets_level_ii_at_most() {
        let shared = OplockFile {
            other_opens: true,
            ..OplockFile::default()
        };
        for level in [Ii, Exclusive, Batch] {
            assert_eq!(grant_oplock(level, false, &shared), Ii);
        }
        let leased = OplockFile {
            other_lease: true,
            ..OplockFile::default()
        };
        assert_eq!(grant_oplock(Batch, false, &leased), Ii);
        for blocked in [
            OplockFile {
                other_exclusive: true,
                ..shared
            },
            OplockFile {
                other_lease_write: true,
                ..leased
            },
            OplockFile {
                other_lease_handle: true,
                ..leased
            },
            OplockFile {
                has_locks: true,
                ..shared
            },
        ] {
            for level in [Ii, Exclusive, Batch] {
                assert_eq!(
                    grant_oplock(level, false, &blocked),
                    NoOplock,
                    "{blocked:?}"
                );
            }
        }
    }

    #[test]
    fn break_table() {
        let b = |to, ack| Some(OplockBreakTo { to, ack, wait: ack });
        let open = Trigger::Open { overwrite: false };
        let overwrite = Trigger::Open { overwrite: true };
        // Rows: trigger; then II, EXCLUSIVE, BATCH held by another open.
        let rows = [
            (open, [None, b(Ii, true), b(Ii, true)]),
            (
                overwrite,
                [b(NoOplock, false), b(NoOplock, true), b(NoOplock, true)],
            ),
            (
                Trigger::Write,
                [b(NoOplock, false), b(NoOplock, true), b(NoOplock, true)],
            ),
            (Trigger::SharingViolation, [None, None, b(Ii, true)]),
            (Trigger::Handle, [None, None, b(Ii, true)]),
        ];
        for (trigger, expected) in rows {
            for (level, to) in [Ii, Exclusive, Batch].into_iter().zip(expected) {
                assert_eq!(
                    oplock_break_to(trigger, level, false),
                    to,
                    "{trigger:?} {level:?}"
                );
            }
            assert_eq!(oplock_break_to(trigger, NoOplock, false), None);
        }
        // Through the holder itself only a write breaks, and only LEVEL_II.
        assert_eq!(
            oplock_break_to(Trigger::Write, Ii, true),
            b(NoOplock, false)
        );
        for trigger in [open, overwrite, Trigger::Write, Trigger::Handle] {
            for level in [Exclusive, Batch] {
                assert_eq!(oplock_break_to(trigger, level, true), None);
            }
        }
    }

    #[test]
    fn acknowledgments() {
        use AckOutcome::{Acked, Refused};
        let refused = |status, drop| Refused { status, drop };
        // A break to II keeps what the client acknowledges; one to NONE
        // ends at NONE.
        assert_eq!(acknowledge(Batch, Some(Ii), 1), Acked(Ii));
        assert_eq!(acknowledge(Batch, Some(Ii), 0), Acked(NoOplock));
        assert_eq!(acknowledge(Exclusive, Some(NoOplock), 1), Acked(NoOplock));
        assert_eq!(acknowledge(Exclusive, Some(NoOplock), 0), Acked(NoOplock));
        // Wrong levels.
        let invalid = ntstatus::STATUS_INVALID_OPLOCK_PROTOCOL;
        assert_eq!(acknowledge(Batch, Some(Ii), 8), refused(invalid, true));
        assert_eq!(acknowledge(Batch, None, 9), refused(invalid, false));
        assert_eq!(acknowledge(Ii, None, 1), refused(invalid, false));
        assert_eq!(acknowledge(Batch, Some(Ii), 7), refused(invalid, true));
        assert_eq!(
            acknowledge(Batch, Some(Ii), 0xFF),
            refused(ntstatus::STATUS_INVALID_PARAMETER, true)
        );
        // Nothing to acknowledge.
        let state = ntstatus::STATUS_INVALID_DEVICE_STATE;
        assert_eq!(acknowledge(Batch, None, 1), refused(state, false));
        assert_eq!(acknowledge(Ii, None, 0), refused(state, false));
        assert_eq!(acknowledge(NoOplock, None, 0), refused(invalid, false));
    }

    #[test]
    fn notification_layout() {
        let bytes = oplock_notification(FileId::new(7, 9), Ii);
        let (hdr, body) = Smb2Header::parse(&bytes).unwrap();
        assert_eq!(hdr.command, Command::OplockBreak);
        assert_eq!(hdr.message_id, u64::MAX);
        assert_eq!(hdr.session_id, 0);
        assert_eq!(hdr.flags & !SMB2_FLAGS_SERVER_TO_REDIR, 0, "unsigned");
        let n = OplockBreakNotification::parse(body).unwrap();
        assert_eq!(n, oplock_body(FileId::new(7, 9), Ii));
        assert_eq!(body.len(), usize::from(OPLOCK_BREAK_SIZE));
    }

    #[test]
    fn stat_opens_for_oplocks() {
        assert!(oplock_stat_only(FILE_READ_ATTRIBUTES | SYNCHRONIZE));
        assert!(oplock_stat_only(FILE_WRITE_ATTRIBUTES));
        assert!(!oplock_stat_only(crate::access_mask::READ_CONTROL));
        assert!(!oplock_stat_only(crate::access_mask::DELETE));
    }

    #[test]
    fn lower_orders_levels() {
        assert_eq!(lower(Batch, Ii), Ii);
        assert_eq!(lower(NoOplock, Exclusive), NoOplock);
        assert_eq!(lower(Exclusive, Batch), Exclusive);
    }
}
