//! Durable handles end to end: Samba's `smbtorture` (apt `samba-testsuite`) runs tests of its
//! `smb2.durable-open` suite against the SMB service over an engine in a temporary directory.
//!
//! - `open-oplock`, `reopen1`, `reopen1a`, `reopen2`, `reopen2a`, `reopen3`, `reopen4`,
//!   `lock-oplock`, `delete_on_close2`, `file-position`, `read-only`: a version 1 durable
//!   handle asked for with a BATCH oplock is granted (MS-SMB2 3.3.5.9.6), kept when its
//!   connection or session goes, and taken back by its DurableFileId from any client and
//!   whatever name the reconnect gives, with its BATCH oplock (3.3.5.9.7).
//! - `reopen2-lease`, `reopen2-lease-v2`: a reconnect of a leased open without its lease
//!   context fails as not found whatever name it gives, and a version 2 reconnect takes back
//!   a version 1 open by the all-zero CreateGuid such an open has.
//! - `open-lease`, `reopen1a-lease`, `lock-lease`, `stat-open`: the same through leases,
//!   which passed before.
//!
//! The suite's `oplock`, `lease`, `open2-oplock`, `open2-lease` and `delete_on_close1` pass
//! too, but race with the server noticing that the first connection is gone: a second
//! client's request sent right after the disconnect can come first (then a break goes to
//! the connection being lost instead of closing the kept open, and the second open gets
//! less caching than the test expects), and `delete_on_close1`'s OPEN_IF can meet the close
//! of the first connection's delete-on-close open and fail as not found. They failed about
//! one run in twenty to a hundred here and are left out. A break of a kept BATCH open
//! closing it is covered by the vendored library's unit tests (src/files/oplock_tests.rs).
//! `alloc-size` (the allocation size a CREATE reports) fails.

mod common;

const TESTS: &[&str] = &[
    "open-oplock",
    "open-lease",
    "reopen1",
    "reopen1a",
    "reopen1a-lease",
    "reopen2",
    "reopen2-lease",
    "reopen2-lease-v2",
    "reopen2a",
    "reopen3",
    "reopen4",
    "delete_on_close2",
    "file-position",
    "lock-oplock",
    "lock-lease",
    "read-only",
    "stat-open",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_durable_open_tests_pass() {
    common::assert_smbtorture_passes("smb2.durable-open", TESTS).await;
}
