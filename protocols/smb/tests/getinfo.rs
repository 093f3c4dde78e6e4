//! Query and set information, reads, directory listings and CREATE checks end to end: Samba's
//! `smbtorture` (apt `samba-testsuite`) runs tests of its `smb2.getinfo`, `smb2.read`,
//! `smb2.dir` and `smb2.create` suites against the SMB service over an engine in a temporary
//! directory (`smb2.lock` is in tests/lock.rs).
//!
//! - `getinfo.fsinfo`: every file system information class smbtorture knows is answered,
//!   FileFsControlInformation (no quotas) and FileFsObjectIdInformation included.
//! - `getinfo.granted`: an open asking for FILE_EXECUTE and FILE_READ_ATTRIBUTES is granted
//!   exactly that (FileAllInformation's AccessFlags), for a file and a directory.
//! - `getinfo.qfile_buffercheck`: a CREATE with an EA buffer, then every file class smbtorture
//!   knows at every output length up to its size (STATUS_INFO_LENGTH_MISMATCH below the
//!   minimum, STATUS_BUFFER_OVERFLOW below the whole answer), FileAlternateNameInformation
//!   and FileEaInformation included.
//! - `getinfo.getinfo_access`: the file classes on a file set up with EAs, through opens of
//!   different access, answered or refused as Windows does (FileFullEaInformation needs
//!   FILE_READ_EA and lists the EAs, FileAlternateNameInformation answers the short name).
//! - `read.position`: FilePositionInformation reports where the open's last READ ended.
//! - `dir.fixed`: a listing begun on one open leaves out the entries another open deleted
//!   before the listing went on.
//! - `create.impersonation`: an ImpersonationLevel past SecurityDelegation is
//!   STATUS_BAD_IMPERSONATION_LEVEL.
//! - `create.quota-fake-file`: `$Extend\$Quota:$Q:$INDEX_ALLOCATION` opens the NT quota fake
//!   file, a hidden system directory with every time zero, as on Samba (the quota queries and
//!   sets on it, and the requests it refuses, are tested in the vendored library's
//!   src/tests/quota.rs).
//!
//! Each list also holds the tests of its suite that passed before, so a regression in any of
//! them fails this test too (docs/smb-conformance.md has the per-test results).

mod common;

const GETINFO: &[&str] = &[
    "fsinfo",
    "qsec_buffercheck",
    "granted",
    "qfile_buffercheck",
    "getinfo_access",
];

const READ: &[&str] = &["eof", "position", "dir", "access"];

const DIR: &[&str] = &["find", "fixed", "many", "sorted", "file-index", "large-files"];

const CREATE: &[&str] = &[
    "impersonation",
    "brlocked",
    "multi",
    "delete",
    "leading-slash",
    "mkdir-dup",
    "dir-alloc-size",
    "dosattr_tmp_dir",
    "quota-fake-file",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_getinfo_tests_pass() {
    common::assert_smbtorture_passes("smb2.getinfo", GETINFO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_read_tests_pass() {
    common::assert_smbtorture_passes("smb2.read", READ).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_dir_tests_pass() {
    common::assert_smbtorture_passes("smb2.dir", DIR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_create_tests_pass() {
    common::assert_smbtorture_passes("smb2.create", CREATE).await;
}
