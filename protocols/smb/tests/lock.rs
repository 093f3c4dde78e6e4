//! Byte-range locks end to end: Samba's `smbtorture` (apt `samba-testsuite`) runs the tests of
//! its `smb2.lock` suite that Samba passes against the SMB service over an engine in a
//! temporary directory.
//!
//! - `async`: a lock that conflicts with another open's lock, without FAIL_IMMEDIATELY, is
//!   answered STATUS_PENDING and completes with success once the other open unlocks.
//! - `cancel`: CANCEL ends a waiting lock with STATUS_CANCELLED; an unlock of the range it
//!   waits for, through its own open, is STATUS_RANGE_NOT_LOCKED; closing its open ends it
//!   with STATUS_RANGE_NOT_LOCKED.
//! - `cancel-tdis`, `cancel-logoff`: disconnecting the tree or logging off the session ends a
//!   waiting lock (STATUS_RANGE_NOT_LOCKED, as Samba answers) and closes its opens.
//! - `valid-request`: malformed LOCK requests (no elements, bad flag combinations, an unlock
//!   with FAIL_IMMEDIATELY) are STATUS_INVALID_PARAMETER and lock nothing.
//! - `replay_smb3_specification_multi`: on SMB 3.x a LOCK repeating the LockSequence index
//!   and number of the last one that succeeded is a replay, answered with success and not
//!   applied again; other numbers, and indexes outside 1 to 64, are applied.
//! - `replay_smb3_specification_durable`: the same on an open made durable (version 1) through
//!   a BATCH oplock, which is granted (MS-SMB2 3.3.5.9.6).
//!
//! The list holds every test of the suite that passes, so a regression in any of them fails
//! this test too (docs/smb-conformance.md has the per-test results).

mod common;

const LOCK: &[&str] = &[
    "valid-request",
    "rw-shared",
    "rw-exclusive",
    "auto-unlock",
    "lock",
    "async",
    "cancel",
    "cancel-tdis",
    "cancel-logoff",
    "errorcode",
    "zerobytelength",
    "zerobyteread",
    "unlock",
    "multiple-unlock",
    "stacking",
    "contend",
    "context",
    "range",
    "overlap",
    "truncate",
    "replay_smb3_specification_multi",
    "replay_smb3_specification_durable",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_lock_tests_pass() {
    common::assert_smbtorture_passes("smb2.lock", LOCK).await;
}
