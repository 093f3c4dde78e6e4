//! Classic SMB2 oplocks end to end: Samba's `smbtorture` (apt `samba-testsuite`) runs tests of
//! its `smb2.oplock` suite against the SMB service over an engine in a temporary directory.
//! Each test opens files from one or two connections with EXCLUSIVE, BATCH or LEVEL_II
//! oplocks and checks the levels granted, the break notifications (level, FileId, count), the
//! acknowledgments and the statuses of the conflicting CREATEs, writes, size changes and
//! byte-range locks; `batch19` also reads the open's name back from FileAllInformation after a
//! rename refused with a sharing violation, and `batch25` sets FILE_ATTRIBUTE_HIDDEN through
//! an attribute-only open beside a BATCH oplock, which succeeds without breaking it. The list is the tests Aquifer passes
//! (docs/smb-conformance.md); a regression in any of them fails this test.

mod common;

/// The `smb2.oplock` tests run here: every one Aquifer passes but `batch22a`, which waits out
/// the 35-second acknowledgment timeout. It runs in `scripts/smbtorture.sh`.
const TESTS: &[&str] = &[
    "exclusive1",
    "exclusive2",
    "exclusive3",
    "exclusive4",
    "exclusive5",
    "exclusive6",
    "exclusive9",
    "batch1",
    "batch2",
    "batch3",
    "batch4",
    "batch5",
    "batch6",
    "batch7",
    "batch8",
    "batch9",
    "batch9a",
    "batch10",
    "batch11",
    "batch12",
    "batch13",
    "batch14",
    "batch15",
    "batch16",
    "batch19",
    "batch21",
    "batch23",
    "batch24",
    "batch25",
    "doc",
    "brl1",
    "brl2",
    "brl3",
    "levelii500",
    "levelii501",
    "levelii502",
    "statopen1",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_oplock_tests_pass() {
    common::assert_smbtorture_passes("smb2.oplock", TESTS).await;
}
