//! Opens of each file on a share, across every connection, keyed by file
//! identity. This holds the state MS-FSA keeps per file rather than per
//! open: sharing modes (2.1.5.1.2.2), the delete-pending flag (2.1.5.15.3),
//! byte-range locks (2.1.5.8) and leases (MS-SMB2 3.3.1.4).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tracing::{debug, warn};

use crate::access_mask::{
    DELETE, FILE_APPEND_DATA, FILE_EXECUTE, FILE_READ_DATA, FILE_WRITE_ATTRIBUTES, FILE_WRITE_DATA,
};
use crate::backend::FileInfo;
use crate::conn::outbound::Outbound;
use crate::error::SmbError;
use crate::ntstatus;
use crate::path::{SmbPath, rebase, same_path};
use crate::proto::messages::change_notify::{
    FILE_ACTION_REMOVED, FILE_NOTIFY_CHANGE_DIR_NAME, FILE_NOTIFY_CHANGE_FILE_NAME,
};
use crate::proto::messages::{FileId, OplockLevel};
use crate::server::ShareBindings;

use super::durable::DurableTable;
use super::lease::{
    Breaking, Current, FileLease, FileView, Granted, LeaseId, LeaseRequest, LeaseState, OpenView,
    Trigger, break_to, grant, needs_ack, stat_only,
};
use super::leases::{
    AckWait, BreakWait, Breaker, GrantGuard, LEASE_BREAK_TIMEOUT, LeaseRef, Notices,
    break_notification,
};
use super::oplock::{
    AckOutcome, Oplock, OplockBreaking, OplockFile, acknowledge, grant_oplock, is_exclusive, lower,
    oplock_break_to, oplock_notification, oplock_stat_only,
};
use super::watch::Change;

// ShareAccess (MS-SMB2 2.2.13)
pub(crate) const FILE_SHARE_READ: u32 = 0x0000_0001;
pub(crate) const FILE_SHARE_WRITE: u32 = 0x0000_0002;
pub(crate) const FILE_SHARE_DELETE: u32 = 0x0000_0004;

const READ_ACCESS: u32 = FILE_READ_DATA | FILE_EXECUTE;
const WRITE_ACCESS: u32 = FILE_WRITE_DATA | FILE_APPEND_DATA;
/// Access that takes part in the sharing check. An open holding none of
/// these never conflicts.
const SHARED_ACCESS: u32 = READ_ACCESS | WRITE_ACCESS | DELETE;

/// Identity of a file in a [`FileTable`]: the backend's file id, or the
/// path when the backend reports none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum FileKey {
    Index(u64),
    Path(String),
}

impl FileKey {
    fn new(file_index: u64, path: &SmbPath, case_sensitive: bool) -> Self {
        if file_index != 0 {
            Self::Index(file_index)
        } else {
            Self::Path(path_key(path, case_sensitive))
        }
    }
}

fn path_key(path: &SmbPath, case_sensitive: bool) -> String {
    let joined = path.display_backslash();
    if case_sensitive {
        joined
    } else {
        joined.to_lowercase()
    }
}

/// Access and sharing mode of an open, as CREATE requested them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sharing {
    /// Open.GrantedAccess.
    pub access: u32,
    /// ShareAccess of the CREATE request.
    pub share: u32,
}

impl Sharing {
    /// True if this open and `other` cannot both be open on one file.
    fn conflicts_with(self, other: Sharing) -> bool {
        let denies = |access: u32, share: u32| {
            (access & READ_ACCESS != 0 && share & FILE_SHARE_READ == 0)
                || (access & WRITE_ACCESS != 0 && share & FILE_SHARE_WRITE == 0)
                || (access & DELETE != 0 && share & FILE_SHARE_DELETE == 0)
        };
        self.access & SHARED_ACCESS != 0
            && other.access & SHARED_ACCESS != 0
            && (denies(self.access, other.share) || denies(other.access, self.share))
    }
}

/// Source of [`FileLease::serial`].
static NEXT_LEASE_SERIAL: AtomicU64 = AtomicU64::new(1);

/// Source of [`Breaking::seq`].
static NEXT_BREAK_SEQ: AtomicU64 = AtomicU64::new(1);

/// Every file on one share that has an open.
#[derive(Default)]
pub(crate) struct FileTable {
    files: Mutex<HashMap<FileKey, Arc<FileNode>>>,
    next_open: AtomicU64,
    renames: tokio::sync::RwLock<()>,
    /// How long a client has to acknowledge a lease or oplock break, in
    /// milliseconds; 0 for [`LEASE_BREAK_TIMEOUT`].
    ack_timeout_ms: AtomicU64,
}

pub(super) struct FileNode {
    state: Mutex<FileState>,
}

struct FileState {
    /// The node holding this state.
    me: Weak<FileNode>,
    key: FileKey,
    is_directory: bool,
    opens: Vec<OpenEntry>,
    /// The name to remove once the last open closes, while the file is
    /// delete-pending.
    delete_pending: Option<SmbPath>,
    locks: Vec<RangeLock>,
    /// Leases held by the opens, one per LeaseId.
    leases: Vec<FileLease>,
    /// Counts changes that can unblock an operation waiting on the file: a
    /// lease or oplock break that completed, a lease that ended, an open
    /// that left.
    changed: tokio::sync::watch::Sender<u64>,
    /// Counts what `changed` counts and byte-range locks released: the
    /// changes that can let a lock request waiting for a conflicting lock
    /// through (Aquifer patch; MS-SMB2 3.3.5.14.2).
    locks_changed: tokio::sync::watch::Sender<u64>,
    /// How long a client has to acknowledge a break.
    ack_timeout: Duration,
}

struct OpenEntry {
    id: u64,
    sharing: Sharing,
    path: SmbPath,
    /// The lease the open holds.
    lease: Option<LeaseId>,
    /// The connection the open belongs to, where breaks of its lease go.
    owner: Weak<Outbound>,
    /// A CREATE waiting for other clients to give up write caching. It
    /// counts against their write caching but not in the sharing check of
    /// other opens; it runs its own sharing check once the wait ends
    /// (MS-FSA 2.1.5.1 checks for oplock breaks before the open joins the
    /// file's opens).
    waiting: bool,
    /// Set on a durable open.
    durable: Option<DurableMark>,
    /// The oplock the open holds (never beside a lease).
    oplock: Option<Oplock>,
}

/// The durable side of an open's entry: where the open is registered,
/// whether it is kept without a connection, and whether a lease break
/// already decided to close it.
#[derive(Debug, Clone)]
pub(crate) struct DurableMark {
    pub table: Weak<DurableTable>,
    pub id: u64,
    pub detached: bool,
    pub doomed: bool,
}

/// What an open kept for reconnect holds again once reconnected
/// ([`FileRef::reattach`]).
pub(crate) enum Reattached {
    /// Its lease, as the CREATE response reports it, and a guard holding
    /// back the lease's break notifications until that response is queued.
    Lease(Granted, GrantGuard),
    /// The oplock level of an open durable through its oplock (Aquifer
    /// patch).
    Oplock(OplockLevel),
}

/// A new open, as [`FileRef::register`] enters it.
#[derive(Default)]
pub(crate) struct OpenRequest {
    pub sharing: Sharing,
    /// The connection the open belongs to.
    pub owner: Weak<Outbound>,
    /// The lease the CREATE asks for. Its own lease is not broken by the
    /// open (MS-FSA 2.1.4.12.2).
    pub lease: Option<LeaseId>,
    /// The CREATE supersedes or overwrites the file.
    pub overwrite: bool,
    /// On a sharing violation, break the handle caching of the leases on
    /// the file so their clients can close the handles they keep open
    /// (MS-FSA 2.1.5.1.2). Without it, a violation still waits while such a
    /// break is in progress.
    pub break_handles: bool,
}

/// Why [`FileRef::register`] refused an open.
#[derive(Debug)]
pub(crate) struct Refused {
    pub status: u32,
    /// Set when the refusal was a sharing violation that broke handle
    /// caching: once it completes, the open may succeed.
    pub wait: Option<BreakWait>,
}

impl From<u32> for Refused {
    fn from(status: u32) -> Self {
        Self { status, wait: None }
    }
}

#[cfg(test)]
impl From<Sharing> for OpenRequest {
    fn from(sharing: Sharing) -> Self {
        Self {
            sharing,
            ..Self::default()
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct RangeLock {
    owner: u64,
    offset: u64,
    length: u64,
    exclusive: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FileNode {
    fn state(&self) -> MutexGuard<'_, FileState> {
        lock(&self.state)
    }

    /// Whether the lease `id` is held on this file.
    pub(super) fn has_lease(&self, id: LeaseId) -> bool {
        self.state().leases.iter().any(|l| l.id == id)
    }

    /// The names of the opens holding the lease `id`, or `None` when the
    /// lease is not held on this file.
    pub(super) fn lease_paths(&self, id: LeaseId) -> Option<Vec<SmbPath>> {
        let state = self.state();
        state.leases.iter().any(|l| l.id == id).then(|| {
            state
                .opens
                .iter()
                .filter(|e| e.lease == Some(id))
                .map(|e| e.path.clone())
                .collect()
        })
    }

    /// MS-SMB2 3.3.5.22.2: completes the break of the lease `id` with the
    /// state `bits` the client acknowledged, and returns that state. When a
    /// later trigger needs less than that, the lease breaks on at once.
    /// Fails with STATUS_OBJECT_NAME_NOT_FOUND when the lease is not held
    /// here, STATUS_UNSUCCESSFUL when no break is in progress and
    /// STATUS_REQUEST_NOT_ACCEPTED when the state is not within the one
    /// notified.
    pub(super) fn acknowledge(&self, id: LeaseId, bits: u32) -> Result<(LeaseState, Notices), u32> {
        let mut state = self.state();
        let at = state
            .leases
            .iter()
            .position(|l| l.id == id)
            .ok_or(ntstatus::STATUS_OBJECT_NAME_NOT_FOUND)?;
        let lease = &mut state.leases[at];
        let breaking = lease
            .breaking
            .as_ref()
            .ok_or(ntstatus::STATUS_UNSUCCESSFUL)?;
        if bits & !breaking.to.bits() != 0 {
            return Err(ntstatus::STATUS_REQUEST_NOT_ACCEPTED);
        }
        let required = breaking.required;
        let acked = LeaseState::from_bits(bits);
        lease.breaking = None;
        lease.state = acked;
        debug!(key = ?id.key, state = ?acked, "lease break acknowledged");
        let mut notices = Notices::default();
        if !required.contains(acked) {
            // Aquifer patch: the lease breaks on in steps, as Windows breaks
            // it: a state still caching writes or handles keeps read
            // caching in this break (RH to R, then R to NONE), and only a
            // state that cached writes moves the epoch again.
            let mut to = acked.and(required);
            if acked.without(LeaseState::R) != LeaseState::NONE {
                to = LeaseState::from_bits(to.bits() | acked.and(LeaseState::R).bits());
            }
            if to != acked {
                let epoch = acked.contains(LeaseState::W);
                state.break_lease(at, to, epoch, &mut notices);
                // A step short of what the server needs breaks on again
                // at its acknowledgment.
                if let Some(breaking) = state.leases[at].breaking.as_mut() {
                    breaking.required = required;
                }
            }
        }
        let doomed = state.doom_uncovered(id);
        notices.close(doomed);
        state.bump();
        Ok((acked, notices))
    }

    /// Ends the break `seq` of the lease `id` with NONE, when it is still in
    /// progress: the client did not acknowledge in time (MS-SMB2 3.3.6.5),
    /// or no connection took the notification (MS-SMB2 3.3.4.7). Returns the
    /// closes of the opens kept for reconnect under the lease, which can no
    /// longer be taken back.
    pub(super) fn drop_break(&self, id: LeaseId, seq: u64) -> Notices {
        let mut state = self.state();
        let mut notices = Notices::default();
        let Some(lease) = state
            .leases
            .iter_mut()
            .find(|l| l.id == id && l.breaking.as_ref().is_some_and(|b| b.seq == seq))
        else {
            return notices;
        };
        lease.breaking = None;
        lease.state = LeaseState::NONE;
        debug!(key = ?id.key, "lease break not acknowledged; lease dropped to none");
        let doomed = state.doom_uncovered(id);
        notices.close(doomed);
        state.bump();
        notices
    }

    /// Ends the break `seq` of the lease or oplock `id` at NONE, when it is
    /// still in progress; see [`FileNode::drop_break`] and
    /// [`FileNode::drop_oplock_break`].
    pub(super) fn drop_any_break(&self, id: Breaker, seq: u64) -> Notices {
        match id {
            Breaker::Lease(id) => self.drop_break(id, seq),
            Breaker::Oplock(open) => {
                self.drop_oplock_break(open, seq);
                Notices::default()
            }
        }
    }

    /// Ends the break `seq` of the oplock of the open `open` at NONE, when
    /// it is still in progress: the client did not acknowledge in time
    /// (MS-SMB2 3.3.6.1), or its connection did not take the notification.
    fn drop_oplock_break(&self, open: u64, seq: u64) {
        let mut state = self.state();
        let Some(oplock) = state
            .opens
            .iter_mut()
            .find(|e| e.id == open)
            .and_then(|e| e.oplock.as_mut())
            .filter(|o| o.breaking.as_ref().is_some_and(|b| b.seq == seq))
        else {
            return;
        };
        oplock.breaking = None;
        oplock.level = OplockLevel::None;
        debug!(
            open,
            "oplock break not acknowledged; oplock dropped to none"
        );
        state.bump();
    }

    /// Keeps `timer` as the acknowledgment timer of the break `seq` of the
    /// lease or oplock `id`, or stops it when that break is over.
    pub(super) fn set_timer(&self, id: Breaker, seq: u64, timer: tokio::task::AbortHandle) {
        let mut state = self.state();
        let slot = match id {
            Breaker::Lease(id) => state
                .leases
                .iter_mut()
                .find(|l| l.id == id)
                .and_then(|l| l.breaking.as_mut())
                .filter(|b| b.seq == seq)
                .map(|b| &mut b.timer),
            Breaker::Oplock(open) => state
                .opens
                .iter_mut()
                .find(|e| e.id == open)
                .and_then(|e| e.oplock.as_mut())
                .and_then(|o| o.breaking.as_mut())
                .filter(|b| b.seq == seq)
                .map(|b| &mut b.timer),
        };
        match slot {
            Some(slot) => {
                *slot = Some(timer);
                state.bump();
            }
            None => timer.abort(),
        }
    }

    /// MS-SMB2 3.3.5.22.1: completes the break of the oplock of the open
    /// `open` with the level `acked` the client acknowledged, and returns
    /// the level it now holds. When a later trigger needs less than that,
    /// the oplock breaks on at once. See [`acknowledge`] for the statuses of
    /// a wrong acknowledgment; an open no longer on the file is
    /// STATUS_FILE_CLOSED.
    pub(super) fn acknowledge_oplock(
        &self,
        open: u64,
        acked: u8,
    ) -> Result<(OplockLevel, Notices), u32> {
        let mut state = self.state();
        let at = state
            .opens
            .iter()
            .position(|e| e.id == open)
            .ok_or(ntstatus::STATUS_FILE_CLOSED)?;
        let (level, breaking) = match &state.opens[at].oplock {
            Some(o) => (o.level, o.breaking.as_ref().map(|b| (b.to, b.required))),
            None => (OplockLevel::None, None),
        };
        let mut notices = Notices::default();
        let outcome = acknowledge(level, breaking.map(|b| b.0), acked);
        let new = match outcome {
            AckOutcome::Acked(new) => new,
            AckOutcome::Refused { drop: true, .. } => OplockLevel::None,
            AckOutcome::Refused { status, .. } => return Err(status),
        };
        if let Some(oplock) = state.opens[at].oplock.as_mut() {
            oplock.breaking = None;
            oplock.level = new;
        }
        debug!(open, level = ?new, "oplock break acknowledged");
        if let Some((_, required)) = breaking
            && lower(required, new) != new
        {
            state.start_oplock_break(at, required, &mut notices);
        }
        state.bump();
        match outcome {
            AckOutcome::Refused { status, .. } => {
                drop(state);
                drop(notices);
                Err(status)
            }
            AckOutcome::Acked(_) => Ok((new, notices)),
        }
    }

    /// Ends the hold the CREATE response granting the oplock of the open
    /// `open` had on its break notifications, and returns the one held back.
    pub(super) fn end_oplock_grant(&self, open: u64) -> Notices {
        let mut state = self.state();
        let me = state.me.clone();
        let timeout = state.ack_timeout;
        let mut notices = Notices::default();
        let Some(entry) = state.opens.iter_mut().find(|e| e.id == open) else {
            return notices;
        };
        let owner = entry.owner.clone();
        let Some(oplock) = entry.oplock.as_mut() else {
            return notices;
        };
        oplock.granting = false;
        if let Some(bytes) = oplock.unsent.take() {
            let ack = oplock.breaking.as_ref().map(|b| AckWait {
                node: me,
                id: Breaker::Oplock(open),
                seq: b.seq,
                timeout,
            });
            notices.push(bytes, vec![owner], ack);
        }
        notices
    }

    /// Ends one CREATE response's hold on the lease `id` created as
    /// `serial`, and returns the break notification held back for it once
    /// no response is pending. The notification goes first to `sender`,
    /// whose response was just queued, so it follows that response on the
    /// same connection. A hold on a lease that has since ended does nothing.
    pub(super) fn end_grant(&self, id: LeaseId, serial: u64, sender: &Weak<Outbound>) -> Notices {
        let mut state = self.state();
        let me = state.me.clone();
        let timeout = state.ack_timeout;
        let mut notices = Notices::default();
        let Some(lease) = state
            .leases
            .iter_mut()
            .find(|l| l.id == id && l.serial == serial)
        else {
            return notices;
        };
        lease.grants_in_flight -= 1;
        if lease.grants_in_flight == 0
            && let Some(bytes) = lease.unsent.take()
        {
            let ack = lease.breaking.as_ref().map(|b| AckWait {
                node: me,
                id: Breaker::Lease(id),
                seq: b.seq,
                timeout,
            });
            if state.held_only_detached(id) {
                let doomed = state.doom_detached(id, |_| true);
                notices.close(doomed);
                return notices;
            }
            let mut owners = state.owners(id);
            if let Some(at) = owners.iter().position(|o| o.ptr_eq(sender)) {
                owners[..=at].rotate_right(1);
            }
            notices.push(bytes, owners, ack);
        }
        notices
    }
}

impl FileState {
    /// MS-FSA 2.1.5.1: a delete-pending file opens for nobody; otherwise the
    /// sharing check of 2.1.5.1.2.2 runs against every open on the file.
    /// Waiting CREATEs and the open `except` take no part.
    fn admit(&self, sharing: Sharing, except: Option<u64>) -> Result<(), u32> {
        if self.delete_pending.is_some() {
            return Err(ntstatus::STATUS_DELETE_PENDING);
        }
        if self
            .opens
            .iter()
            .any(|e| !e.waiting && Some(e.id) != except && e.sharing.conflicts_with(sharing))
        {
            return Err(ntstatus::STATUS_SHARING_VIOLATION);
        }
        Ok(())
    }

    fn entry(&self, id: u64) -> Option<&OpenEntry> {
        self.opens.iter().find(|e| e.id == id)
    }

    /// Where a break of the lease `id` may go, in the order to try
    /// (MS-SMB2 3.3.4.7): the client's first connection still open, then
    /// the connections of the opens holding the lease, each once, in open
    /// order. A lease belongs to its client, and Windows and Samba send its
    /// breaks on that first connection also when only opens made through
    /// another connection of the client hold it (Aquifer patch; upstream
    /// tried the opens' connections only, smbtorture's
    /// `smb2.lease.v2_complex1`).
    fn owners(&self, id: LeaseId) -> Vec<Weak<Outbound>> {
        let mut owners: Vec<Weak<Outbound>> = Vec::new();
        for entry in self.opens.iter().filter(|e| e.lease == Some(id)) {
            if !owners.iter().any(|o| o.ptr_eq(&entry.owner)) {
                owners.push(entry.owner.clone());
            }
        }
        let first = owners
            .iter()
            .filter_map(Weak::upgrade)
            .find_map(|o| o.client_first());
        if let Some(first) = first {
            let first = Arc::downgrade(&first);
            match owners.iter().position(|o| o.ptr_eq(&first)) {
                Some(at) => owners[..=at].rotate_right(1),
                None => owners.insert(0, first),
            }
        }
        owners
    }

    /// Breaks every lease but `exempt`, and every oplock, that `trigger`
    /// through the open `actor` conflicts with (MS-FSA 2.1.4.12, MS-SMB2
    /// 3.3.4.6, 3.3.4.7). Returns the notifications to send once the file is
    /// unlocked, and whether the operation has to wait for a break to
    /// complete. A lease or oplock already breaking gets no second
    /// notification: what the server needs is lowered instead, and the
    /// acknowledgment breaks on to it.
    fn break_for(
        &mut self,
        trigger: Trigger,
        exempt: Option<LeaseId>,
        actor: Option<u64>,
    ) -> (Notices, bool) {
        let mut notices = Notices::default();
        let oplocks = self.break_oplocks(trigger, actor, &mut notices);
        let leases = self.break_leases(trigger, exempt, &mut notices);
        (notices, oplocks || leases)
    }

    /// The oplock half of [`FileState::break_for`]: returns whether the
    /// operation waits.
    fn break_oplocks(
        &mut self,
        trigger: Trigger,
        actor: Option<u64>,
        notices: &mut Notices,
    ) -> bool {
        let mut wait = false;
        for at in 0..self.opens.len() {
            let entry = &mut self.opens[at];
            let own = Some(entry.id) == actor;
            let Some(oplock) = entry.oplock.as_mut() else {
                continue;
            };
            let Some(to) = oplock_break_to(trigger, oplock.level, own) else {
                continue;
            };
            wait |= to.wait;
            match &mut oplock.breaking {
                Some(breaking) => breaking.required = lower(breaking.required, to.to),
                None => self.start_oplock_break(at, to.to, notices),
            }
        }
        wait
    }

    /// The lease half of [`FileState::break_for`]: returns whether the
    /// operation waits.
    fn break_leases(
        &mut self,
        trigger: Trigger,
        exempt: Option<LeaseId>,
        notices: &mut Notices,
    ) -> bool {
        let mut wait = false;
        for at in 0..self.leases.len() {
            let lease = &mut self.leases[at];
            if Some(lease.id) == exempt {
                continue;
            }
            let Some(to) = break_to(trigger, lease.state) else {
                continue;
            };
            wait |= to.wait;
            match &mut lease.breaking {
                Some(breaking) => breaking.required = breaking.required.and(to.to),
                None => self.start_break(at, to.to, notices),
            }
        }
        wait
    }

    /// Breaks the lease at `at` to `to`. A read lease drops at once; one
    /// caching more keeps its state until the client acknowledges, the
    /// acknowledgment times out, or no connection takes the notification.
    /// A notification for a lease whose grant is not yet sent waits for it.
    ///
    /// A lease held only by opens kept for reconnect has no connection to
    /// take the notification: those opens are closed instead (MS-SMB2
    /// 3.3.4.7), and the break completes when the last of them leaves the
    /// file. That includes a break that keeps handle caching, for which no
    /// other connection of the same client is tried.
    fn start_break(&mut self, at: usize, to: LeaseState, notices: &mut Notices) {
        self.break_lease(at, to, true, notices);
    }

    /// [`FileState::start_break`], moving a version 2 lease's epoch only
    /// when `epoch`: the break an acknowledgment starts moves it only when
    /// the acknowledged state cached writes, as Windows and Samba send it.
    fn break_lease(&mut self, at: usize, to: LeaseState, epoch: bool, notices: &mut Notices) {
        let id = self.leases[at].id;
        let orphaned = self.held_only_detached(id);
        let lease = &mut self.leases[at];
        let from = lease.state;
        let ack = needs_ack(from);
        let mut wait = None;
        if ack {
            if epoch {
                lease.bump_epoch();
            }
            let seq = NEXT_BREAK_SEQ.fetch_add(1, Ordering::Relaxed);
            lease.breaking = Some(Breaking {
                to,
                required: to,
                seq,
                timer: None,
            });
            wait = Some(AckWait {
                node: self.me.clone(),
                id: Breaker::Lease(lease.id),
                seq,
                timeout: self.ack_timeout,
            });
        } else if epoch {
            lease.set_state(to);
        } else {
            lease.state = to;
        }
        debug!(key = ?lease.id.key, ?from, ?to, ack, "lease broken");
        if orphaned && lease.grants_in_flight == 0 {
            let doomed = self.doom_detached(id, |_| true);
            notices.close(doomed);
            return;
        }
        let bytes = break_notification(lease, from, to, ack);
        if lease.grants_in_flight > 0 {
            lease.unsent = Some(bytes);
        } else {
            notices.push(bytes, self.owners(id), wait);
        }
    }

    /// Breaks the oplock of the open at `at` to `to` (MS-SMB2 3.3.4.6). One
    /// at EXCLUSIVE or BATCH keeps its level until the client acknowledges,
    /// the acknowledgment times out, or no connection takes the
    /// notification; LEVEL_II drops at once. A notification for an oplock
    /// whose grant is not yet sent waits for it.
    fn start_oplock_break(&mut self, at: usize, to: OplockLevel, notices: &mut Notices) {
        let me = self.me.clone();
        let timeout = self.ack_timeout;
        let entry = &mut self.opens[at];
        let (open, owner) = (entry.id, entry.owner.clone());
        let Some(oplock) = entry.oplock.as_mut() else {
            return;
        };
        let from = oplock.level;
        let bytes = oplock_notification(oplock.file_id, to);
        let ack = if is_exclusive(from) {
            let seq = NEXT_BREAK_SEQ.fetch_add(1, Ordering::Relaxed);
            oplock.breaking = Some(OplockBreaking {
                to,
                required: to,
                seq,
                timer: None,
            });
            Some(AckWait {
                node: me,
                id: Breaker::Oplock(open),
                seq,
                timeout,
            })
        } else {
            oplock.level = to;
            None
        };
        debug!(open, ?from, ?to, "oplock broken");
        // Aquifer patch: an open kept for reconnect through its oplock has
        // no connection to take the notification; it is closed instead,
        // and the break completes when it leaves the file (MS-SMB2 3.3.4.6).
        if let Some(mark) = entry.durable.as_mut().filter(|d| d.detached) {
            if !mark.doomed {
                mark.doomed = true;
                notices.close(vec![mark.clone()]);
            }
            return;
        }
        if oplock.granting {
            oplock.unsent = Some(bytes);
        } else {
            notices.push(bytes, vec![owner], ack);
        }
    }

    /// Whether the lease `id` is held, and only by opens kept for reconnect.
    fn held_only_detached(&self, id: LeaseId) -> bool {
        let mut holders = self.opens.iter().filter(|e| e.lease == Some(id)).peekable();
        holders.peek().is_some() && holders.all(|e| e.durable.as_ref().is_some_and(|d| d.detached))
    }

    /// Marks the opens kept for reconnect under the lease `id` that the
    /// lease no longer covers to be closed: every one once it stops caching
    /// handles, and the ones holding byte-range locks once it stops caching
    /// writes. MS-SMB2 3.3.7.1 keeps no others, and a lock left behind would
    /// block other clients' reads and writes, which break nothing.
    fn doom_uncovered(&mut self, id: LeaseId) -> Vec<DurableMark> {
        let state = self
            .leases
            .iter()
            .find(|l| l.id == id)
            .map_or(LeaseState::NONE, |l| l.state);
        if !state.contains(LeaseState::H) {
            return self.doom_detached(id, |_| true);
        }
        if state.contains(LeaseState::W) {
            return Vec::new();
        }
        let locked: Vec<u64> = self.locks.iter().map(|l| l.owner).collect();
        self.doom_detached(id, |open| locked.contains(&open))
    }

    /// Marks the opens kept for reconnect under the lease `id` that `pick`
    /// accepts, by entry id, to be closed, and returns the ones not marked
    /// before.
    fn doom_detached(&mut self, id: LeaseId, pick: impl Fn(u64) -> bool) -> Vec<DurableMark> {
        let mut doomed = Vec::new();
        for entry in self.opens.iter_mut().filter(|e| e.lease == Some(id)) {
            if !pick(entry.id) {
                continue;
            }
            if let Some(mark) = entry.durable.as_mut().filter(|d| d.detached && !d.doomed) {
                mark.doomed = true;
                doomed.push(mark.clone());
            }
        }
        doomed
    }

    /// Whether a lease other than `exempt`, or a BATCH oplock of an open
    /// other than `actor`, still caches handles while a break of it is in
    /// progress.
    fn handle_break_pending(&self, exempt: Option<LeaseId>, actor: Option<u64>) -> bool {
        self.leases.iter().any(|l| {
            Some(l.id) != exempt && l.breaking.is_some() && l.state.contains(LeaseState::H)
        }) || self.oplock_break_pending(actor, |o| o.level == OplockLevel::Batch)
    }

    /// Whether a lease other than `exempt`, or an EXCLUSIVE or BATCH oplock
    /// of an open other than `actor`, still caches writes while a break of
    /// it is in progress.
    fn write_break_pending(&self, exempt: Option<LeaseId>, actor: Option<u64>) -> bool {
        self.leases.iter().any(|l| {
            Some(l.id) != exempt && l.breaking.is_some() && l.state.contains(LeaseState::W)
        }) || self.oplock_break_pending(actor, Oplock::exclusive)
    }

    /// Whether a lease other than `exempt` is breaking.
    fn lease_break_pending(&self, exempt: Option<LeaseId>) -> bool {
        self.leases
            .iter()
            .any(|l| Some(l.id) != exempt && l.breaking.is_some())
    }

    /// Whether the oplock of an open other than `actor` that `pick` accepts
    /// is breaking.
    fn oplock_break_pending(&self, actor: Option<u64>, pick: impl Fn(&Oplock) -> bool) -> bool {
        self.opens.iter().any(|e| {
            Some(e.id) != actor
                && e.oplock
                    .as_ref()
                    .is_some_and(|o| o.breaking.is_some() && pick(o))
        })
    }

    /// Wakes operations waiting on the file.
    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        self.bump_locks();
    }

    /// Wakes lock requests waiting on the file, after a byte-range lock
    /// was released.
    fn bump_locks(&self) {
        self.locks_changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A wait for the next change on the file.
    fn wait(&self) -> BreakWait {
        BreakWait::new(self.changed.subscribe(), self.ack_timeout)
    }

    /// MS-FSA 2.1.4.10: whether the range conflicts with a lock. `exclusive`
    /// is the intent of the access (a write, or an exclusive lock) and
    /// `lock_intent` tells a lock request from a read or write.
    fn range_conflicts(
        &self,
        owner: u64,
        offset: u64,
        length: u64,
        exclusive: bool,
        lock_intent: bool,
    ) -> bool {
        if offset == 0 && length == 0 {
            return false;
        }
        self.locks.iter().any(|l| {
            overlaps(l.offset, l.length, offset, length)
                && if l.exclusive {
                    l.owner != owner || (exclusive && lock_intent)
                } else {
                    exclusive
                }
        })
    }
}

/// Offset of the last byte of a range. A zero-length range ends just before
/// its offset.
fn last_byte(offset: u64, length: u64) -> u64 {
    if length == 0 {
        offset.wrapping_sub(1)
    } else {
        offset.saturating_add(length - 1)
    }
}

fn overlaps(a_offset: u64, a_length: u64, b_offset: u64, b_length: u64) -> bool {
    if (a_offset == 0 && a_length == 0) || (b_offset == 0 && b_length == 0) {
        return false;
    }
    a_offset <= last_byte(b_offset, b_length) && last_byte(a_offset, a_length) >= b_offset
}

impl FileTable {
    fn files(&self) -> MutexGuard<'_, HashMap<FileKey, Arc<FileNode>>> {
        lock(&self.files)
    }

    /// Sets how long a client has to acknowledge a lease or oplock break on
    /// a file opened from now on, at most [`LEASE_BREAK_TIMEOUT`].
    pub(crate) fn set_ack_timeout(&self, timeout: Duration) {
        let ms = timeout.min(LEASE_BREAK_TIMEOUT).as_millis().max(1);
        self.ack_timeout_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn ack_timeout(&self) -> Duration {
        match self.ack_timeout_ms.load(Ordering::Relaxed) {
            0 => LEASE_BREAK_TIMEOUT,
            ms => Duration::from_millis(ms),
        }
    }

    /// Serializes renames on the share: a rename holds this while it checks
    /// the target, renames in the backend, moves the open names and the
    /// change notification watches, and reports the rename.
    pub(crate) async fn rename_lock(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.renames.write().await
    }

    /// Keeps renames out while a CREATE runs from its first backend call
    /// until its open is in the table, while a delete calls the backend and
    /// reports the removal, and while a CHANGE_NOTIFY arms a watch. Each
    /// then uses, and reports, the path the entry has on the share.
    pub(crate) async fn names_lock(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.renames.read().await
    }

    /// True if the directory named `dir` has an open with DELETE access.
    /// Windows and Samba refuse to rename an entry into such a directory
    /// with STATUS_SHARING_VIOLATION (smbtorture `oplock.exclusive6`,
    /// `oplock.batch19`).
    pub(crate) fn directory_open_for_delete(&self, dir: &SmbPath, case_sensitive: bool) -> bool {
        self.files().values().any(|node| {
            let state = node.state();
            state.is_directory
                && state.opens.iter().any(|e| {
                    !e.waiting
                        && e.sharing.access & DELETE != 0
                        && same_path(&e.path, dir, case_sensitive)
                })
        })
    }

    /// True if an open on the share currently has `path` as its name.
    pub(crate) fn path_is_open(&self, path: &SmbPath, case_sensitive: bool) -> bool {
        self.files().values().any(|node| {
            node.state()
                .opens
                .iter()
                .any(|e| same_path(&e.path, path, case_sensitive))
        })
    }

    /// For each of `paths`, whether an open on the share that may write
    /// the file's data or attributes currently has it as its name. The
    /// opens are looked at once for all of them.
    pub(crate) fn open_to_change(&self, paths: &[SmbPath], case_sensitive: bool) -> Vec<bool> {
        if paths.is_empty() {
            return Vec::new();
        }
        let mut open = HashSet::new();
        for node in self.files().values() {
            for entry in &node.state().opens {
                if entry.sharing.access & (WRITE_ACCESS | FILE_WRITE_ATTRIBUTES) != 0 {
                    open.insert(path_key(&entry.path, case_sensitive));
                }
            }
        }
        paths
            .iter()
            .map(|path| open.contains(&path_key(path, case_sensitive)))
            .collect()
    }

    /// True if the file named `path` is delete-pending.
    pub(crate) fn delete_pending_at(&self, path: &SmbPath, case_sensitive: bool) -> bool {
        self.files().values().any(|node| {
            let state = node.state();
            state.delete_pending.as_ref().is_some_and(|pending| {
                same_path(pending, path, case_sensitive)
                    || state
                        .opens
                        .iter()
                        .any(|e| same_path(&e.path, path, case_sensitive))
            })
        })
    }

    /// Breaks the handle caching of the leases on the file open as `path`,
    /// all but `exempt` (MS-FSA 2.1.4.12, SET_INFORMATION rename), when
    /// `start`. Returns a wait for the break to complete while one is in
    /// progress.
    pub(crate) fn break_handles_at(
        &self,
        path: &SmbPath,
        case_sensitive: bool,
        exempt: Option<LeaseId>,
        start: bool,
    ) -> Option<BreakWait> {
        let mut all = Vec::new();
        let mut wait = None;
        let files = self.files();
        for node in files.values() {
            let mut state = node.state();
            if !state
                .opens
                .iter()
                .any(|e| same_path(&e.path, path, case_sensitive))
            {
                continue;
            }
            let waits = if start {
                let (notices, waits) = state.break_for(Trigger::Handle, exempt, None);
                all.push(notices);
                waits
            } else {
                state.handle_break_pending(exempt, None)
            };
            if waits && wait.is_none() {
                wait = Some(state.wait());
            }
        }
        drop(files);
        drop(all);
        wait
    }

    /// True if an open on the share has a name below the directory `dir`
    /// (MS-FSA 2.1.4.2).
    pub(crate) fn open_below(&self, dir: &SmbPath, case_sensitive: bool) -> bool {
        self.files().values().any(|node| {
            node.state()
                .opens
                .iter()
                .any(|e| is_below(&e.path, dir, case_sensitive))
        })
    }

    /// Breaks the handle caching of every lease on a file open below the
    /// directory `dir`, which is being renamed, when `start` (MS-FSA 2.1.4.2,
    /// MS-SMB2 3.3.1.4). Returns a wait for a break to complete while one is
    /// in progress.
    pub(crate) fn break_handles_below(
        &self,
        dir: &SmbPath,
        case_sensitive: bool,
        start: bool,
    ) -> Option<BreakWait> {
        let mut all = Vec::new();
        let mut wait = None;
        let files = self.files();
        for node in files.values() {
            let mut state = node.state();
            if !state
                .opens
                .iter()
                .any(|e| is_below(&e.path, dir, case_sensitive))
            {
                continue;
            }
            let waits = if start {
                let (notices, waits) = state.break_for(Trigger::Handle, None, None);
                all.push(notices);
                waits
            } else {
                state.handle_break_pending(None, None)
            };
            if waits && wait.is_none() {
                wait = Some(state.wait());
            }
        }
        drop(files);
        drop(all);
        wait
    }

    /// Stops every acknowledgment timer on the share, as if they were lost.
    #[cfg(test)]
    pub(crate) fn stop_timers(&self) {
        for node in self.files().values() {
            for lease in &mut node.state().leases {
                if let Some(timer) = lease.breaking.as_mut().and_then(|b| b.timer.take()) {
                    timer.abort();
                }
            }
        }
    }

    /// Moves every open whose name is `from`, or lies below it, to the
    /// matching name under `to`.
    pub(crate) fn rename_paths(&self, from: &SmbPath, to: &SmbPath, case_sensitive: bool) {
        let mut files = self.files();
        let mut rekeyed = Vec::new();
        for node in files.values() {
            let mut state = node.state();
            for entry in &mut state.opens {
                if let Some(path) = rebase(&entry.path, from, to, case_sensitive) {
                    entry.path = path;
                }
            }
            if let Some(path) = state
                .delete_pending
                .as_ref()
                .and_then(|p| rebase(p, from, to, case_sensitive))
            {
                state.delete_pending = Some(path);
            }
            if matches!(state.key, FileKey::Path(_))
                && let Some(entry) = state.opens.first()
            {
                let key = FileKey::Path(path_key(&entry.path, case_sensitive));
                if key != state.key {
                    rekeyed.push((state.key.clone(), key));
                }
            }
        }
        for (old, new) in rekeyed {
            if files.contains_key(&new) {
                continue;
            }
            if let Some(node) = files.remove(&old) {
                node.state().key = new.clone();
                files.insert(new, node);
            }
        }
    }
}

/// One open's entry in its share's [`FileTable`]. Dropping it removes the
/// entry and its locks; [`FileRef::release`] does the same and hands back a
/// delete still to be done.
pub(crate) struct FileRef {
    share: Arc<ShareBindings>,
    node: Arc<FileNode>,
    id: u64,
    /// The binding of this open's lease, released after the entry leaves
    /// the table.
    lease: Option<LeaseRef>,
    released: bool,
    /// Open.CurrentByteOffset (MS-FSA 2.1.1.6): where the last READ through
    /// the open ended, or what FilePositionInformation set (Aquifer patch).
    /// It lives here, in the open's own entry, beside its oplock.
    position: AtomicU64,
    /// Open.LockSequenceArray (MS-SMB2 3.3.1.10): for each LockSequenceIndex
    /// 1 to 64, the LockSequenceNumber of the last LOCK that succeeded with
    /// it, or `LOCK_SEQUENCE_INVALID` (Aquifer patch).
    lock_sequences: Mutex<[u8; 64]>,
}

/// An entry of Open.LockSequenceArray that holds no LockSequenceNumber
/// (those are 4 bits).
const LOCK_SEQUENCE_INVALID: u8 = 0xFF;

impl FileRef {
    /// Adds the open `req` describes of the file `info` describes, reached
    /// through `path`, holding the lease it asks for. Fails with
    /// STATUS_DELETE_PENDING or STATUS_SHARING_VIOLATION when the opens
    /// already on the file do not allow it. An open that is not
    /// attribute-only breaks the leases it conflicts with, and returns a
    /// wait when other clients have to write back what they cache first
    /// (MS-FSA 2.1.4.12, OPEN).
    pub(crate) fn register(
        share: &Arc<ShareBindings>,
        info: &FileInfo,
        path: &SmbPath,
        req: OpenRequest,
    ) -> Result<(Self, Option<BreakWait>), Refused> {
        let case_sensitive = share.backend.capabilities().case_sensitive;
        let key = FileKey::new(info.file_index, path, case_sensitive);
        let table = &share.files;
        let mut files = table.files();
        let node = files
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new_cyclic(|me| FileNode {
                    state: Mutex::new(FileState {
                        me: me.clone(),
                        key,
                        is_directory: info.is_directory,
                        opens: Vec::new(),
                        delete_pending: None,
                        locks: Vec::new(),
                        leases: Vec::new(),
                        changed: tokio::sync::watch::Sender::new(0),
                        locks_changed: tokio::sync::watch::Sender::new(0),
                        ack_timeout: table.ack_timeout(),
                    }),
                })
            })
            .clone();
        let mut state = node.state();
        if let Err(status) = state.admit(req.sharing, None) {
            let mut wait = None;
            let mut notices = Notices::default();
            if status == ntstatus::STATUS_SHARING_VIOLATION {
                if req.break_handles {
                    let (sent, waits) = state.break_for(Trigger::SharingViolation, req.lease, None);
                    notices = sent;
                    wait = waits.then(|| state.wait());
                } else if state.handle_break_pending(req.lease, None) {
                    wait = Some(state.wait());
                }
            }
            drop(state);
            drop(files);
            drop(notices);
            return Err(Refused { status, wait });
        }
        let id = table.next_open.fetch_add(1, Ordering::Relaxed);
        state.opens.push(OpenEntry {
            id,
            sharing: req.sharing,
            path: path.clone(),
            lease: req.lease,
            owner: req.owner,
            waiting: false,
            durable: None,
            oplock: None,
        });
        // An attribute-only open breaks nothing unless it overwrites the
        // file (MS-FSA 2.1.4.12, OPEN). Reading the security descriptor
        // counts as attribute-only for leases, not for oplocks.
        let trigger = Trigger::Open {
            overwrite: req.overwrite,
        };
        let mut notices = Notices::default();
        let mut waits = false;
        if req.overwrite || !oplock_stat_only(req.sharing.access) {
            waits |= state.break_oplocks(trigger, Some(id), &mut notices);
        }
        if req.overwrite || !stat_only(req.sharing.access) {
            waits |= state.break_leases(trigger, req.lease, &mut notices);
        }
        if waits && let Some(entry) = state.opens.last_mut() {
            entry.waiting = true;
        }
        let wait = waits.then(|| state.wait());
        drop(state);
        drop(files);
        drop(notices);
        let file = Self {
            share: Arc::clone(share),
            node,
            id,
            lease: None,
            released: false,
            position: AtomicU64::new(0),
            lock_sequences: Mutex::new([LOCK_SEQUENCE_INVALID; 64]),
        };
        Ok((file, wait))
    }

    /// Ends the wait of a CREATE that waited for other clients to give up
    /// write caching: `Ok(None)` once it may go ahead, after it passes the
    /// delete-pending and sharing checks the opens on the file now ask
    /// for; a wait while a write break is still in progress; or the
    /// status the CREATE fails with.
    pub(crate) fn end_wait(&self) -> Result<Option<BreakWait>, u32> {
        let mut state = self.node.state();
        let Some(entry) = state.entry(self.id) else {
            return Err(ntstatus::STATUS_FILE_CLOSED);
        };
        let (lease, sharing) = (entry.lease, entry.sharing);
        // Aquifer patch: a CREATE that waited goes on once no other lease
        // is breaking, also one that caches no writes (an acknowledgment
        // may break it on, and Windows and Samba hold the CREATE until that
        // break completes too).
        if state.write_break_pending(lease, Some(self.id)) || state.lease_break_pending(lease) {
            return Ok(Some(state.wait()));
        }
        state.admit(sharing, Some(self.id))?;
        if let Some(entry) = state.opens.iter_mut().find(|e| e.id == self.id) {
            entry.waiting = false;
        }
        Ok(None)
    }

    /// Whether this open's file is `node`.
    pub(super) fn is_on(&self, node: &Arc<FileNode>) -> bool {
        Arc::ptr_eq(&self.node, node)
    }

    pub(super) fn node(&self) -> &Arc<FileNode> {
        &self.node
    }

    pub(super) fn share(&self) -> &Arc<ShareBindings> {
        &self.share
    }

    /// Makes this open a holder of the lease `req` asks for and grants it
    /// the best state within `grantable` that the file allows (MS-SMB2
    /// 3.3.5.9.8, 3.3.5.9.11). Lease breaks held back until the CREATE
    /// response is queued wait for the returned guard.
    pub(super) fn grant_lease(
        &self,
        req: &LeaseRequest,
        grantable: LeaseState,
    ) -> (Granted, GrantGuard) {
        let mut state = self.node.state();
        let mut sender = Weak::new();
        if let Some(entry) = state.opens.iter_mut().find(|e| e.id == self.id) {
            entry.lease = Some(req.id);
            sender = entry.owner.clone();
        }
        let opens: Vec<OpenView> = state
            .opens
            .iter()
            .map(|e| OpenView {
                lease: e.lease,
                stat_only: stat_only(e.sharing.access),
            })
            .collect();
        let leases: Vec<(LeaseId, LeaseState)> =
            state.leases.iter().map(|l| (l.id, l.state)).collect();
        let file = FileView {
            opens: &opens,
            leases: &leases,
            has_locks: !state.locks.is_empty(),
            delete_pending: state.delete_pending.is_some(),
            exclusive_oplock: state
                .opens
                .iter()
                .any(|e| e.oplock.as_ref().is_some_and(Oplock::exclusive)),
            oplock: state.opens.iter().any(|e| {
                e.oplock
                    .as_ref()
                    .is_some_and(|o| o.level != OplockLevel::None)
            }),
        };
        let existing = state.leases.iter().position(|l| l.id == req.id);
        let current = existing.map(|at| Current {
            state: state.leases[at].state,
            breaking: state.leases[at].breaking.is_some(),
        });
        let (granted, breaking) = grant(req.id, req.state, current, &file, grantable);
        let lease = match existing {
            Some(at) => {
                let lease = &mut state.leases[at];
                lease.set_state(granted);
                lease
            }
            None => {
                let serial = NEXT_LEASE_SERIAL.fetch_add(1, Ordering::Relaxed);
                state.leases.push(FileLease::new(req, granted, serial));
                state.leases.last_mut().expect("just pushed")
            }
        };
        lease.grants_in_flight += 1;
        debug!(key = ?req.id.key, state = ?lease.state, "lease granted");
        let serial = lease.serial;
        let snapshot = Granted {
            id: lease.id,
            state: lease.state,
            breaking,
            epoch: lease.epoch,
            version: lease.version,
            parent: lease.parent,
        };
        drop(state);
        let guard = GrantGuard::new(Arc::clone(&self.node), req.id, serial, sender);
        (snapshot, guard)
    }

    /// Grants this open the oplock `requested` asks for, as far as the other
    /// opens, leases and byte-range locks on the file allow (MS-SMB2
    /// 3.3.5.9, MS-FSA 2.1.5.17), and returns the level granted. `file_id`
    /// is the open's FileId, which break notifications name; `overwrite`
    /// when the CREATE supersedes or overwrites the file. Breaks of the
    /// oplock wait for the returned guard, dropped once the CREATE response
    /// is queued.
    pub(crate) fn grant_oplock(
        &self,
        requested: OplockLevel,
        file_id: FileId,
        overwrite: bool,
    ) -> (OplockLevel, Option<GrantGuard>) {
        let mut state = self.node.state();
        let Some(entry) = state.entry(self.id) else {
            return (OplockLevel::None, None);
        };
        let others = || state.opens.iter().filter(|e| e.id != self.id);
        // An attribute-only open, which breaks nothing, gets no oplock
        // beside other opens; alone on the file it gets what it asks for.
        let attribute_only =
            oplock_stat_only(entry.sharing.access) && !overwrite && others().next().is_some();
        let file = OplockFile {
            other_opens: others().any(|e| {
                !oplock_stat_only(e.sharing.access)
                    || e.oplock
                        .as_ref()
                        .is_some_and(|o| o.level != OplockLevel::None)
            }),
            other_exclusive: others().any(|e| e.oplock.as_ref().is_some_and(Oplock::exclusive)),
            other_lease: state.leases.iter().any(|l| l.state != LeaseState::NONE),
            other_lease_write: state.leases.iter().any(|l| l.state.contains(LeaseState::W)),
            other_lease_handle: state.leases.iter().any(|l| l.state.contains(LeaseState::H)),
            has_locks: !state.locks.is_empty(),
        };
        let level = grant_oplock(requested, attribute_only, &file);
        if level == OplockLevel::None {
            return (level, None);
        }
        let Some(entry) = state.opens.iter_mut().find(|e| e.id == self.id) else {
            return (OplockLevel::None, None);
        };
        entry.oplock = Some(Oplock {
            level,
            file_id,
            granting: true,
            unsent: None,
            breaking: None,
        });
        debug!(open = self.id, ?level, "oplock granted");
        let guard = GrantGuard::oplock(Arc::clone(&self.node), self.id);
        (level, Some(guard))
    }

    /// MS-SMB2 3.3.5.22.1: acknowledges a break of this open's oplock at
    /// `level`; see [`FileNode::acknowledge_oplock`]. A further break it
    /// starts is returned to send after the response.
    pub(crate) fn acknowledge_oplock(&self, level: u8) -> Result<(OplockLevel, Notices), u32> {
        self.node.acknowledge_oplock(self.id, level)
    }

    /// Keeps the lease binding for as long as this open lasts.
    pub(super) fn keep_lease(&mut self, lease: LeaseRef) {
        self.lease = Some(lease);
    }

    /// Marks the open durable, registered as `id` in `table`.
    pub(crate) fn mark_durable(&self, table: &Arc<DurableTable>, id: u64) {
        let mut state = self.node.state();
        if let Some(entry) = state.opens.iter_mut().find(|e| e.id == self.id) {
            entry.durable = Some(DurableMark {
                table: Arc::downgrade(table),
                id,
                detached: false,
                doomed: false,
            });
        }
    }

    /// Takes a durable open off its connection to keep it for reconnect
    /// (MS-SMB2 3.3.7.1): only while its lease caches handles with no break
    /// in progress (Open.OplockState Held), and while its byte-range locks,
    /// if it holds any, are covered by write caching. From then on breaks of
    /// the lease close it instead of going to a client. Returns whether the
    /// open is kept.
    pub(crate) fn try_detach(&self) -> bool {
        let mut state = self.node.state();
        let Some(at) = state.opens.iter().position(|e| e.id == self.id) else {
            return false;
        };
        let entry = &state.opens[at];
        let has_locks = state.locks.iter().any(|l| l.owner == self.id);
        let caches = match entry.lease {
            Some(id) => state.leases.iter().find(|l| l.id == id).is_some_and(|lease| {
                lease.state.contains(LeaseState::H)
                    && lease.breaking.is_none()
                    && (!has_locks || lease.state.contains(LeaseState::W))
            }),
            // Aquifer patch: an open durable through its oplock is kept
            // while it holds BATCH, which caches handles and writes, with
            // no break in progress.
            None => entry
                .oplock
                .as_ref()
                .is_some_and(|o| o.level == OplockLevel::Batch && o.breaking.is_none()),
        };
        let keeps = entry
            .durable
            .as_ref()
            .is_some_and(|d| !d.detached && !d.doomed)
            && caches;
        if !keeps {
            return false;
        }
        let entry = &mut state.opens[at];
        entry.owner = Weak::new();
        if let Some(mark) = entry.durable.as_mut() {
            mark.detached = true;
        }
        true
    }

    /// Whether a lease break decided to close this open while it was kept
    /// for reconnect.
    pub(crate) fn is_doomed(&self) -> bool {
        self.node
            .state()
            .entry(self.id)
            .and_then(|e| e.durable.as_ref())
            .is_some_and(|d| d.doomed)
    }

    /// Puts an open kept for reconnect back on the connection `owner`
    /// (MS-SMB2 3.3.5.9.7): only while it is still kept, no break decided to
    /// close it, and its lease caches handles, or, for an open durable
    /// through its oplock, it holds BATCH with no break in progress; that
    /// oplock's notifications name `file_id` from now on. Returns the lease
    /// as the CREATE response reports it, and a guard that holds back break
    /// notifications for the lease until that response is queued, or the
    /// oplock level.
    pub(crate) fn reattach(&self, owner: Weak<Outbound>, file_id: FileId) -> Option<Reattached> {
        let mut state = self.node.state();
        let at = state.opens.iter().position(|e| e.id == self.id)?;
        let entry = &state.opens[at];
        if !entry
            .durable
            .as_ref()
            .is_some_and(|d| d.detached && !d.doomed)
        {
            return None;
        }
        let Some(id) = entry.lease else {
            let entry = &mut state.opens[at];
            let oplock = entry
                .oplock
                .as_mut()
                .filter(|o| o.level == OplockLevel::Batch && o.breaking.is_none())?;
            oplock.file_id = file_id;
            entry.owner = owner;
            if let Some(mark) = entry.durable.as_mut() {
                mark.detached = false;
            }
            return Some(Reattached::Oplock(OplockLevel::Batch));
        };
        let lease = state.leases.iter_mut().find(|l| l.id == id)?;
        if !lease.state.contains(LeaseState::H) {
            return None;
        }
        lease.grants_in_flight += 1;
        let serial = lease.serial;
        let granted = Granted {
            id,
            state: lease.state,
            breaking: lease.breaking.is_some(),
            epoch: lease.epoch,
            version: lease.version,
            parent: lease.parent,
        };
        let entry = &mut state.opens[at];
        entry.owner = owner.clone();
        if let Some(mark) = entry.durable.as_mut() {
            mark.detached = false;
        }
        drop(state);
        let guard = GrantGuard::new(Arc::clone(&self.node), id, serial, owner);
        Some(Reattached::Lease(granted, guard))
    }

    /// Sends the open's breaks to the connection `to` from now on when they
    /// went to `from`: the connection the open was made on is gone and its
    /// session goes on over another channel (Aquifer patch, MS-SMB2
    /// 3.3.4.6, 3.3.4.7). The open keeps its oplock and lease.
    pub(crate) fn move_owner(&self, from: &Outbound, to: Weak<Outbound>) {
        let mut state = self.node.state();
        if let Some(entry) = state
            .opens
            .iter_mut()
            .find(|e| e.id == self.id && std::ptr::eq(e.owner.as_ptr(), from))
        {
            entry.owner = to;
        }
    }

    /// Breaks the leases on the file that `trigger` through this open
    /// conflicts with: every lease but the one this open holds, whichever
    /// client holds it.
    pub(crate) fn break_leases(&self, trigger: Trigger) {
        let notices = {
            let mut state = self.node.state();
            let exempt = state.entry(self.id).and_then(|e| e.lease);
            state.break_for(trigger, exempt, Some(self.id)).0
        };
        drop(notices);
    }

    /// Breaks what a rename of this open's file conflicts with (MS-FSA
    /// 2.1.4.12, SET_INFORMATION): handle caching of every lease but the
    /// one this open holds, and BATCH oplocks. Returns a wait while such a
    /// lease still caches handles with its break in progress: the rename
    /// waits for the client to give them up, as Windows and Samba let it
    /// through (Aquifer patch; oplock breaks are not waited for).
    pub(crate) fn break_handles_for_rename(&self) -> Option<BreakWait> {
        let mut state = self.node.state();
        let exempt = state.entry(self.id).and_then(|e| e.lease);
        let notices = state.break_for(Trigger::Handle, exempt, Some(self.id)).0;
        let waits = state.leases.iter().any(|l| {
            Some(l.id) != exempt && l.breaking.is_some() && l.state.contains(LeaseState::H)
        });
        let wait = waits.then(|| state.wait());
        drop(state);
        drop(notices);
        wait
    }

    /// The lease this open holds.
    pub(crate) fn lease_id(&self) -> Option<LeaseId> {
        self.node.state().entry(self.id).and_then(|e| e.lease)
    }

    /// The open's current name.
    pub(crate) fn path(&self) -> SmbPath {
        self.node
            .state()
            .entry(self.id)
            .map(|e| e.path.clone())
            .unwrap_or_default()
    }

    /// The names the opens of this file have, each once: every path a
    /// watch of it can be armed under.
    pub(crate) fn open_paths(&self) -> Vec<SmbPath> {
        let state = self.node.state();
        let mut paths: Vec<SmbPath> = Vec::new();
        for entry in &state.opens {
            if !paths.contains(&entry.path) {
                paths.push(entry.path.clone());
            }
        }
        paths
    }

    /// True if this is an entry for the file `info` describes, reached
    /// through `path`.
    pub(crate) fn is_for(&self, info: &FileInfo, path: &SmbPath) -> bool {
        let case_sensitive = self.share.backend.capabilities().case_sensitive;
        FileKey::new(info.file_index, path, case_sensitive) == self.node.state().key
    }

    /// True if the backend's file id `file_index` is this file's.
    pub(crate) fn has_index(&self, file_index: u64) -> bool {
        file_index != 0 && self.node.state().key == FileKey::Index(file_index)
    }

    /// Whether the file is delete-pending (MS-FSA Link.IsDeleted).
    pub(crate) fn delete_pending(&self) -> bool {
        self.node.state().delete_pending.is_some()
    }

    /// Sets or clears the delete-pending flag of the file (MS-FSA
    /// 2.1.5.15.3). The file is removed under this open's name when its last
    /// open closes.
    ///
    /// Marking the file breaks the handle caching of its leases, all but
    /// this open's, under the same lock, so no lease caches handles to a
    /// delete-pending file (MS-FSA 2.1.4.12, 2.1.5.18).
    pub(crate) fn set_delete_pending(&self, delete: bool) {
        let notices = {
            let mut state = self.node.state();
            if delete {
                let entry = state.entry(self.id).map(|e| (e.lease, e.path.clone()));
                let exempt = entry.as_ref().and_then(|e| e.0);
                state.delete_pending = entry.map(|e| e.1);
                state.break_for(Trigger::Handle, exempt, Some(self.id)).0
            } else {
                state.delete_pending = None;
                Notices::default()
            }
        };
        drop(notices);
    }

    /// Takes a byte-range lock for this open (MS-FSA 2.1.5.8). Fails with
    /// STATUS_INVALID_LOCK_RANGE when the range passes the largest offset,
    /// STATUS_INSUFFICIENT_RESOURCES when the open already holds `limit`
    /// locks, and STATUS_LOCK_NOT_GRANTED when it conflicts with a lock
    /// already held.
    pub(crate) fn lock_range(
        &self,
        offset: u64,
        length: u64,
        exclusive: bool,
        limit: usize,
    ) -> Result<(), u32> {
        if length != 0 && offset.checked_add(length - 1).is_none() {
            return Err(ntstatus::STATUS_INVALID_LOCK_RANGE);
        }
        let mut state = self.node.state();
        if state.locks.iter().filter(|l| l.owner == self.id).count() >= limit {
            return Err(ntstatus::STATUS_INSUFFICIENT_RESOURCES);
        }
        if state.range_conflicts(self.id, offset, length, exclusive, true) {
            return Err(ntstatus::STATUS_LOCK_NOT_GRANTED);
        }
        // MS-FSA 2.1.5.8: a lock breaks the leases on the file, all but the
        // one this open holds, wherever the range lies. Under the same lock
        // no lease can be granted between the two. While another lease
        // still caches writes, which only an attribute-only open allows,
        // the lock is refused: a lock taken now would keep that client from
        // writing back. A lock request without FAIL_IMMEDIATELY waits for
        // the break to complete (its lock watch sees it) and tries again.
        let exempt = state.entry(self.id).and_then(|e| e.lease);
        let caching_writes = state
            .leases
            .iter()
            .any(|l| Some(l.id) != exempt && l.state.contains(LeaseState::W))
            || state
                .opens
                .iter()
                .any(|e| e.id != self.id && e.oplock.as_ref().is_some_and(Oplock::exclusive));
        let notices = state.break_for(Trigger::Write, exempt, Some(self.id)).0;
        if !caching_writes {
            state.locks.push(RangeLock {
                owner: self.id,
                offset,
                length,
                exclusive,
            });
        }
        drop(state);
        drop(notices);
        if caching_writes {
            return Err(ntstatus::STATUS_LOCK_NOT_GRANTED);
        }
        Ok(())
    }

    /// Releases a lock this open holds on exactly this range, an exclusive
    /// one first (MS-FSA 2.1.5.9). Fails with STATUS_RANGE_NOT_LOCKED when it
    /// holds none.
    pub(crate) fn unlock_range(&self, offset: u64, length: u64) -> Result<(), u32> {
        let mut state = self.node.state();
        let matches = |l: &RangeLock, exclusive: bool| {
            l.owner == self.id
                && l.offset == offset
                && l.length == length
                && l.exclusive == exclusive
        };
        let at = state
            .locks
            .iter()
            .position(|l| matches(l, true))
            .or_else(|| state.locks.iter().position(|l| matches(l, false)))
            .ok_or(ntstatus::STATUS_RANGE_NOT_LOCKED)?;
        state.locks.remove(at);
        state.bump_locks();
        Ok(())
    }

    /// A watch that sees every change after this call that can let a lock
    /// request refused with STATUS_LOCK_NOT_GRANTED through: a byte-range
    /// lock released, an open leaving, a lease or oplock break completing
    /// (Aquifer patch). Taken before the attempt, it misses nothing that
    /// happens between the attempt and the wait.
    pub(crate) fn lock_watch(&self) -> LockWatch {
        LockWatch(self.node.state().locks_changed.subscribe())
    }

    /// Releases the lock [`FileRef::lock_range`] took last with these
    /// arguments.
    pub(crate) fn undo_lock(&self, offset: u64, length: u64, exclusive: bool) {
        let mut state = self.node.state();
        if let Some(at) = state.locks.iter().rposition(|l| {
            l.owner == self.id
                && l.offset == offset
                && l.length == length
                && l.exclusive == exclusive
        }) {
            state.locks.remove(at);
            state.bump_locks();
        }
    }

    /// The open's CurrentByteOffset, which FilePositionInformation reports.
    pub(crate) fn position(&self) -> u64 {
        self.position.load(Ordering::Relaxed)
    }

    /// Sets the open's CurrentByteOffset: after a READ, where it ended
    /// (as Samba keeps it; Windows servers report 0, which MS-SMB2
    /// 3.3.5.20.1 allows), or the value FilePositionInformation sets.
    pub(crate) fn set_position(&self, position: u64) {
        self.position.store(position, Ordering::Relaxed);
    }

    /// Lock sequence verification of MS-SMB2 3.3.5.14 for a LOCK whose
    /// LockSequence is `lock_sequence`: true when it replays the last LOCK
    /// that succeeded with the same LockSequenceIndex and number, which is
    /// then answered with success and not applied again. Otherwise the
    /// index's entry is invalidated until [`Self::lock_sequence_done`]
    /// records this request's number. Indexes outside 1 to 64 are not
    /// tracked.
    pub(crate) fn lock_sequence_replayed(&self, lock_sequence: u32) -> bool {
        let Some(at) = lock_sequence_slot(lock_sequence) else {
            return false;
        };
        let number = (lock_sequence & 0xF) as u8;
        let mut slots = self.lock_sequences.lock().unwrap_or_else(PoisonError::into_inner);
        if slots[at] == number {
            return true;
        }
        slots[at] = LOCK_SEQUENCE_INVALID;
        false
    }

    /// Records the LockSequenceNumber of a LOCK that succeeded.
    pub(crate) fn lock_sequence_done(&self, lock_sequence: u32) {
        if let Some(at) = lock_sequence_slot(lock_sequence) {
            let mut slots = self.lock_sequences.lock().unwrap_or_else(PoisonError::into_inner);
            slots[at] = (lock_sequence & 0xF) as u8;
        }
    }

    /// Fails with STATUS_FILE_LOCK_CONFLICT when a read (or a write, if
    /// `write`) of the range through this open conflicts with a byte-range
    /// lock (MS-FSA 2.1.5.3, 2.1.5.4).
    pub(crate) fn check_io(&self, offset: u64, length: u64, write: bool) -> Result<(), u32> {
        if self
            .node
            .state()
            .range_conflicts(self.id, offset, length, write, false)
        {
            return Err(ntstatus::STATUS_FILE_LOCK_CONFLICT);
        }
        Ok(())
    }

    /// Removes the open and its byte-range locks from the table (MS-FSA
    /// 2.1.5.5). With `delete_on_close` the file becomes delete-pending.
    /// When that leaves a delete-pending file with no opens, returns the
    /// removal still to be done; until that is dropped, the file opens for
    /// nobody.
    pub(crate) fn release(mut self, delete_on_close: bool) -> Option<PendingDelete> {
        self.detach(delete_on_close)
    }

    fn detach(&mut self, delete_on_close: bool) -> Option<PendingDelete> {
        if std::mem::replace(&mut self.released, true) {
            return None;
        }
        let mut files = self.share.files.files();
        let mut state = self.node.state();
        let entry = state
            .opens
            .iter()
            .position(|e| e.id == self.id)
            .map(|at| state.opens.remove(at));
        let held = state.locks.len();
        state.locks.retain(|l| l.owner != self.id);
        if state.locks.len() != held {
            state.bump_locks();
        }
        // MS-SMB2 3.3.4.17: a lease ends with its last open, without a
        // notification; a break in progress completes with it.
        if let Some(id) = entry.as_ref().and_then(|e| e.lease)
            && !state.opens.iter().any(|e| e.lease == Some(id))
        {
            state.leases.retain(|l| l.id != id);
        }
        if entry.is_some() {
            state.bump();
        }
        if delete_on_close && let Some(entry) = entry {
            state.delete_pending = Some(entry.path);
        }
        if !state.opens.is_empty() {
            return None;
        }
        if let Some(path) = state.delete_pending.clone() {
            let is_directory = state.is_directory;
            drop(state);
            drop(files);
            return Some(PendingDelete {
                share: Arc::clone(&self.share),
                node: Arc::clone(&self.node),
                path,
                is_directory,
            });
        }
        let key = state.key.clone();
        drop(state);
        remove_node(&mut files, &key, &self.node);
        None
    }
}

/// Changes on a file that can let a waiting lock request through; see
/// [`FileRef::lock_watch`].
pub(crate) struct LockWatch(tokio::sync::watch::Receiver<u64>);

impl LockWatch {
    /// Resolves at the next change since the watch was taken or last
    /// resolved, or at once when the file left the table (the lock request
    /// then finds its open closed).
    pub(crate) async fn changed(&mut self) {
        let _ = self.0.changed().await;
    }
}

/// The entry of Open.LockSequenceArray that LockSequenceIndex (the upper 28
/// bits of LockSequence) names, if it is 1 to 64.
fn lock_sequence_slot(lock_sequence: u32) -> Option<usize> {
    let index = (lock_sequence >> 4) as usize;
    (1..=64).contains(&index).then(|| index - 1)
}

impl Drop for FileRef {
    /// An entry dropped without a release still leaves the table. When it
    /// was the last open of a delete-pending file, the removal runs on the
    /// current runtime; without one, the name is freed and the file stays.
    fn drop(&mut self) {
        let Some(pending) = self.detach(false) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(pending.run());
        }
    }
}

/// True if `path` lies below the directory `dir`.
fn is_below(path: &SmbPath, dir: &SmbPath, case_sensitive: bool) -> bool {
    path.components().len() > dir.components().len()
        && rebase(path, dir, dir, case_sensitive).is_some()
}

fn remove_node(files: &mut HashMap<FileKey, Arc<FileNode>>, key: &FileKey, node: &Arc<FileNode>) {
    if files.get(key).is_some_and(|n| Arc::ptr_eq(n, node)) {
        files.remove(key);
    }
}

/// A delete-pending file whose last open has closed. Dropping it frees the
/// name in the table, whether or not the removal ran.
pub(crate) struct PendingDelete {
    share: Arc<ShareBindings>,
    node: Arc<FileNode>,
    path: SmbPath,
    is_directory: bool,
}

impl PendingDelete {
    /// Removes the file from the share, reports the removal to the share's
    /// watchers (MS-FSA 2.1.5.5), then frees its name in the table. A
    /// failed delete does not fail the close (MS-SMB2 3.3.4.17); a
    /// directory that gained entries stays (MS-FSA 2.1.5.5).
    pub(crate) async fn run(self) {
        let _names = self.share.files.names_lock().await;
        // A rename that ran while this waited moved the name.
        let path = self
            .node
            .state()
            .delete_pending
            .clone()
            .unwrap_or_else(|| self.path.clone());
        let filter = if self.is_directory {
            FILE_NOTIFY_CHANGE_DIR_NAME
        } else {
            FILE_NOTIFY_CHANGE_FILE_NAME
        };
        let removed = [Change {
            path: &path,
            action: FILE_ACTION_REMOVED,
            filter,
            seen: true,
        }];
        let expected = self.share.watches.expect(&removed, None);
        match self.share.backend.unlink(&path).await {
            Ok(()) => expected.report(&self.share.watches, &removed),
            Err(SmbError::NotEmpty) => {
                debug!(path = %path, "delete-on-close skipped a non-empty directory");
            }
            Err(e) => warn!(error = %e, path = %path, "delete-on-close failed"),
        }
    }
}

impl Drop for PendingDelete {
    fn drop(&mut self) {
        let mut files = self.share.files.files();
        let key = self.node.state().key.clone();
        remove_node(&mut files, &key, &self.node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::OpenOptions;
    use crate::server::{ShareBindings, ShareMode};
    use crate::tests::memfs::MemFsBackend;

    const RW: u32 = FILE_SHARE_READ | FILE_SHARE_WRITE;
    const ALL: u32 = RW | FILE_SHARE_DELETE;
    const CAP: usize = super::super::DEFAULT_MAX_LOCKS_PER_OPEN;

    fn share() -> Arc<ShareBindings> {
        share_on(MemFsBackend::new())
    }

    fn share_on(backend: MemFsBackend) -> Arc<ShareBindings> {
        ShareBindings::new(
            "s".to_string(),
            Arc::new(backend),
            ShareMode::Public,
            HashMap::new(),
            false,
            true,
            true,
        )
    }

    fn info(file_index: u64) -> FileInfo {
        let mut info = FileInfo::new("");
        info.file_index = file_index;
        info
    }

    fn p(s: &str) -> SmbPath {
        s.parse().unwrap()
    }

    fn open(
        share: &Arc<ShareBindings>,
        name: &str,
        access: u32,
        share_access: u32,
    ) -> Result<FileRef, u32> {
        FileRef::register(
            share,
            &info(7),
            &p(name),
            Sharing {
                access,
                share: share_access,
            }
            .into(),
        )
        .map(|(file, _)| file)
        .map_err(|r| r.status)
    }

    #[test]
    fn sharing_modes_are_checked_both_ways() {
        let s = share();
        let a = open(&s, "f", FILE_READ_DATA | FILE_WRITE_DATA, 0).unwrap();
        assert_eq!(
            open(&s, "f", FILE_READ_DATA, ALL).err(),
            Some(ntstatus::STATUS_SHARING_VIOLATION)
        );
        // Attribute-only access never conflicts.
        let attrs = open(&s, "f", 0x80, 0).unwrap();
        assert!(a.release(false).is_none());
        let b = open(&s, "f", FILE_READ_DATA, FILE_SHARE_READ).unwrap();
        assert_eq!(
            open(&s, "f", FILE_WRITE_DATA, ALL).err(),
            Some(ntstatus::STATUS_SHARING_VIOLATION)
        );
        assert_eq!(
            open(&s, "f", FILE_READ_DATA, FILE_SHARE_WRITE).err(),
            Some(ntstatus::STATUS_SHARING_VIOLATION)
        );
        let c = open(&s, "f", FILE_READ_DATA, ALL).unwrap();
        for f in [attrs, b, c] {
            assert!(f.release(false).is_none());
        }
        assert!(s.files.files().is_empty());
    }

    #[test]
    fn identity_not_name_decides_the_file() {
        let s = share();
        let _a = open(&s, "one", FILE_WRITE_DATA, 0).unwrap();
        assert_eq!(
            open(&s, "other-link", FILE_READ_DATA, ALL).err(),
            Some(ntstatus::STATUS_SHARING_VIOLATION)
        );
    }

    #[test]
    fn delete_pending_blocks_opens_until_the_last_close() {
        let s = share();
        let a = open(&s, "f", DELETE, ALL).unwrap();
        let b = open(&s, "f", FILE_READ_DATA, ALL).unwrap();
        a.set_delete_pending(true);
        assert!(b.delete_pending());
        assert_eq!(
            open(&s, "f", FILE_READ_DATA, ALL).err(),
            Some(ntstatus::STATUS_DELETE_PENDING)
        );
        assert!(a.release(false).is_none());
        let pending = b.release(false).expect("last close removes the file");
        assert_eq!(pending.path, p("f"));
        assert_eq!(
            open(&s, "f", FILE_READ_DATA, ALL).err(),
            Some(ntstatus::STATUS_DELETE_PENDING)
        );
        drop(pending);
        assert!(open(&s, "f", FILE_READ_DATA, ALL).is_ok());
    }

    #[test]
    fn a_pending_delete_dropped_before_it_runs_frees_the_name() {
        let s = share();
        let a = open(&s, "f", DELETE, ALL).unwrap();
        a.set_delete_pending(true);
        let pending = a.release(false).expect("last close removes the file");
        drop(pending.run());
        assert!(s.files.files().is_empty());
        assert!(open(&s, "f", FILE_READ_DATA, ALL).is_ok());
    }

    #[test]
    fn a_dropped_open_leaves_the_table() {
        let s = share();
        let a = open(&s, "f", FILE_READ_DATA | FILE_WRITE_DATA, 0).unwrap();
        a.lock_range(0, 10, true, CAP).unwrap();
        drop(a);
        assert!(s.files.files().is_empty());
        let b = open(&s, "f", FILE_READ_DATA, ALL).unwrap();
        b.lock_range(0, 10, true, CAP).unwrap();
    }

    #[tokio::test]
    async fn dropping_the_last_open_of_a_delete_pending_file_removes_it() {
        let s = share_on(MemFsBackend::new().with_file("f", b"x"));
        let a = open(&s, "f", DELETE, ALL).unwrap();
        a.set_delete_pending(true);
        drop(a);
        for _ in 0..100 {
            if s.files.files().is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(s.files.files().is_empty());
        let missing = s.backend.open(&p("f"), OpenOptions::default()).await;
        assert!(matches!(missing, Err(SmbError::NotFound)));
    }

    #[test]
    fn byte_range_locks_follow_the_conflict_rules() {
        let s = share();
        let a = open(&s, "f", FILE_READ_DATA | FILE_WRITE_DATA, ALL).unwrap();
        let b = open(&s, "f", FILE_READ_DATA | FILE_WRITE_DATA, ALL).unwrap();
        a.lock_range(0, 50, true, CAP).unwrap();
        assert_eq!(
            b.lock_range(10, 5, true, CAP),
            Err(ntstatus::STATUS_LOCK_NOT_GRANTED)
        );
        assert_eq!(
            b.lock_range(49, 1, false, CAP),
            Err(ntstatus::STATUS_LOCK_NOT_GRANTED)
        );
        assert_eq!(
            a.lock_range(0, 50, true, CAP),
            Err(ntstatus::STATUS_LOCK_NOT_GRANTED)
        );
        // The owner reads and writes its own exclusive range.
        assert_eq!(a.check_io(0, 10, true), Ok(()));
        assert_eq!(
            b.check_io(0, 10, false),
            Err(ntstatus::STATUS_FILE_LOCK_CONFLICT)
        );
        assert_eq!(b.check_io(50, 10, true), Ok(()));

        b.lock_range(100, 10, false, CAP).unwrap();
        a.lock_range(105, 10, false, CAP).unwrap();
        assert_eq!(a.check_io(100, 1, false), Ok(()));
        // A shared lock blocks writes from every open, its owner included.
        assert_eq!(
            b.check_io(100, 1, true),
            Err(ntstatus::STATUS_FILE_LOCK_CONFLICT)
        );

        assert_eq!(
            b.unlock_range(0, 50),
            Err(ntstatus::STATUS_RANGE_NOT_LOCKED)
        );
        assert_eq!(
            a.unlock_range(0, 49),
            Err(ntstatus::STATUS_RANGE_NOT_LOCKED)
        );
        a.unlock_range(0, 50).unwrap();
        assert_eq!(b.check_io(0, 10, false), Ok(()));

        assert_eq!(
            a.lock_range(u64::MAX, 2, true, CAP),
            Err(ntstatus::STATUS_INVALID_LOCK_RANGE)
        );
        a.lock_range(u64::MAX, 1, true, CAP).unwrap();
        // Closing an open drops its locks.
        assert!(a.release(false).is_none());
        b.lock_range(105, 10, true, CAP).unwrap_err();
        b.lock_range(0, 100, true, CAP).unwrap();
    }

    #[tokio::test]
    async fn a_lock_watch_wakes_when_a_conflicting_lock_goes() {
        let s = share();
        let a = open(&s, "f", FILE_READ_DATA | FILE_WRITE_DATA, ALL).unwrap();
        let b = open(&s, "f", FILE_READ_DATA | FILE_WRITE_DATA, ALL).unwrap();
        let c = open(&s, "f", FILE_READ_DATA, ALL).unwrap();
        a.lock_range(0, 10, true, CAP).unwrap();
        a.lock_range(20, 10, true, CAP).unwrap();
        let mut watch = b.lock_watch();
        assert_eq!(
            b.lock_range(0, 10, true, CAP),
            Err(ntstatus::STATUS_LOCK_NOT_GRANTED)
        );
        let idle = tokio::time::timeout(Duration::from_millis(20), watch.changed()).await;
        assert!(idle.is_err(), "nothing was released yet");
        // A refused request and a lock taken release nothing.
        c.lock_range(50, 1, false, CAP).unwrap();
        let idle = tokio::time::timeout(Duration::from_millis(20), watch.changed()).await;
        assert!(idle.is_err(), "a new lock released nothing");
        // An unlock wakes the watch, even one that happened before the wait.
        a.unlock_range(0, 10).unwrap();
        watch.changed().await;
        b.lock_range(0, 10, true, CAP).unwrap();
        // So does a close, which drops the open's locks.
        let mut watch = b.lock_watch();
        assert_eq!(
            b.lock_range(20, 10, true, CAP),
            Err(ntstatus::STATUS_LOCK_NOT_GRANTED)
        );
        assert!(a.release(false).is_none());
        watch.changed().await;
        b.lock_range(20, 10, true, CAP).unwrap();
    }

    #[test]
    fn locks_per_open_stop_at_the_limit() {
        let s = share();
        let a = open(&s, "f", FILE_WRITE_DATA, ALL).unwrap();
        let b = open(&s, "f", FILE_WRITE_DATA, ALL).unwrap();
        a.lock_range(0, 10, true, 2).unwrap();
        a.lock_range(10, 10, true, 2).unwrap();
        assert_eq!(
            a.lock_range(20, 10, true, 2),
            Err(ntstatus::STATUS_INSUFFICIENT_RESOURCES)
        );
        // The limit counts this open's locks only.
        b.lock_range(20, 10, true, 2).unwrap();
        a.unlock_range(0, 10).unwrap();
        a.lock_range(30, 10, true, 2).unwrap();
    }

    #[test]
    fn zero_length_ranges() {
        let s = share();
        let a = open(&s, "f", FILE_WRITE_DATA, ALL).unwrap();
        let b = open(&s, "f", FILE_WRITE_DATA, ALL).unwrap();
        a.lock_range(0, 0, true, CAP).unwrap();
        b.lock_range(0, 0, true, CAP).unwrap();
        assert_eq!(b.check_io(0, 10, true), Ok(()));
        a.lock_range(10, 0, true, CAP).unwrap();
        assert_eq!(b.check_io(10, 0, true), Ok(()));
        assert_eq!(
            b.check_io(5, 10, true),
            Err(ntstatus::STATUS_FILE_LOCK_CONFLICT)
        );
    }

    #[test]
    fn a_directory_open_for_delete_is_found_by_name() {
        let s = share();
        let mut dir = info(3);
        dir.is_directory = true;
        let open_dir = |access| {
            FileRef::register(&s, &dir, &p("d"), Sharing { access, share: ALL }.into())
                .map(|(file, _)| file)
                .unwrap()
        };
        let reader = open_dir(FILE_READ_DATA);
        assert!(!s.files.directory_open_for_delete(&p("d"), true));
        let deleter = open_dir(DELETE);
        assert!(s.files.directory_open_for_delete(&p("d"), true));
        assert!(!s.files.directory_open_for_delete(&p("e"), true));
        drop(deleter);
        assert!(!s.files.directory_open_for_delete(&p("d"), true));
        drop(reader);
        // A file open for delete is no directory.
        let _file = open(&s, "d", DELETE, ALL).unwrap();
        assert!(!s.files.directory_open_for_delete(&p("d"), true));
    }

    #[test]
    fn renames_move_names_and_path_keys() {
        let s = share();
        let a = FileRef::register(
            &s,
            &info(0),
            &p("d\\f"),
            Sharing {
                access: FILE_WRITE_DATA,
                share: 0,
            }
            .into(),
        )
        .unwrap()
        .0;
        s.files.rename_paths(&p("d"), &p("e"), false);
        assert!(s.files.path_is_open(&p("E\\F"), false));
        assert!(!s.files.path_is_open(&p("d\\f"), false));
        let conflict = FileRef::register(
            &s,
            &info(0),
            &p("e\\f"),
            Sharing {
                access: FILE_READ_DATA,
                share: ALL,
            }
            .into(),
        );
        assert_eq!(
            conflict.err().map(|r| r.status),
            Some(ntstatus::STATUS_SHARING_VIOLATION)
        );
        a.set_delete_pending(true);
        assert!(s.files.delete_pending_at(&p("e\\f"), false));
        let pending = a.release(false).expect("pending removal");
        assert_eq!(pending.path, p("e\\f"));
        drop(pending);
        assert!(s.files.files().is_empty());
    }
}
