//! Compounded requests end to end: Samba's `smbtorture` (apt `samba-testsuite`) runs the
//! tests of its `smb2.compound` suite that pass against the SMB service over an engine in a
//! temporary directory.
//!
//! - `related3`: a CREATE with related IOCTL FSCTL_CREATE_OR_GET_OBJECT_ID and CLOSE; the
//!   IOCTL answers the file's object id.
//! - `invalid1`: a chain whose first request is marked related fails that request and the
//!   related one after it with STATUS_INVALID_PARAMETER; the unrelated one after them runs.
//! - `invalid2`: a related request after one on a session that does not exist is
//!   STATUS_INVALID_PARAMETER (flagged signed, as the client signed it), where the unrelated
//!   ones on that session are STATUS_USER_SESSION_DELETED.
//! - `invalid4`: a request with an unknown Command, related to a READ, is answered
//!   STATUS_INVALID_PARAMETER and the connection stays open.
//!
//! The list holds every test of the suite that passes, so a regression in any of them fails
//! this test too (docs/smb-conformance.md has the per-test results).

mod common;

const COMPOUND: &[&str] = &[
    "related1",
    "related2",
    "related3",
    "related5",
    "related6",
    "related8",
    "related9",
    "unrelated1",
    "invalid1",
    "invalid2",
    "invalid3",
    "invalid4",
    "interim1",
    "interim2",
    "compound-break",
    "create-write-close",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_compound_tests_pass() {
    common::assert_smbtorture_passes("smb2.compound", COMPOUND).await;
}
