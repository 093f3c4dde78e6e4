//! Classic SMB2 oplocks end to end: Samba's `smbtorture` (apt `samba-testsuite`) runs tests of
//! its `smb2.oplock` suite against the SMB service over an engine in a temporary directory.
//! Each test opens files from one or two connections with EXCLUSIVE, BATCH or LEVEL_II
//! oplocks and checks the levels granted, the break notifications (level, FileId, count), the
//! acknowledgments and the statuses of the conflicting CREATEs, writes, size changes and
//! byte-range locks. The list is the tests Aquifer passes (docs/smb-conformance.md); a
//! regression in any of them fails this test.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use aquifer_smb::{ShareConfig, ShareTable, SmbOptions, SmbService};
use storage_engine::{Engine, EngineConfig};
use tokio::sync::oneshot;

const ADMIN_PASSWORD: &str = "admin-password";

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
    "batch21",
    "batch23",
    "batch24",
    "doc",
    "brl1",
    "brl2",
    "brl3",
    "levelii500",
    "levelii501",
    "levelii502",
    "statopen1",
];

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::with_file_drives(dir, 6, 64 << 20, 4, 2);
    c.argon2_memory_kib = 64;
    c.admin_password = Some(ADMIN_PASSWORD.into());
    c.wal_sync_interval_ms = 50;
    c
}

/// Runs `tests` of the `smb2.oplock` suite against `addr` and returns each test's result line
/// (`success`, `failure`, `error`, `skip`) with the whole output.
fn smbtorture(addr: SocketAddr, tests: &[&str]) -> (Vec<(String, String)>, String) {
    let mut c = Command::new("smbtorture");
    c.arg("//127.0.0.1/aquifer")
        .arg("-p")
        .arg(addr.port().to_string())
        .arg("-U")
        .arg(format!("admin%{ADMIN_PASSWORD}"));
    for t in tests {
        c.arg(format!("smb2.oplock.{t}"));
    }
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("run smbtorture ({e}); install the Debian package samba-testsuite (scripts/deps.sh does)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = text
        .lines()
        .filter_map(|l| {
            let (result, rest) = l.split_once(": ")?;
            matches!(result, "success" | "failure" | "error" | "skip" | "xfail").then(|| {
                (
                    rest.split_whitespace().next().unwrap_or("").to_string(),
                    result.to_string(),
                )
            })
        })
        .collect();
    (results, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smbtorture_oplock_tests_pass() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let mut share = ShareConfig::new("aquifer", "/");
    share.leases = true;
    let table = ShareTable::new(engine.clone(), vec![share]).unwrap();
    let service = SmbService::bind(
        Arc::clone(&engine),
        "127.0.0.1:0".parse().unwrap(),
        SmbOptions::default(),
        table,
    )
    .await
    .expect("bind SMB");
    let addr = service.local_addr();
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(service.serve(async {
        let _ = stopped.await;
    }));

    let (results, output) = tokio::task::spawn_blocking(move || smbtorture(addr, TESTS))
        .await
        .unwrap();
    let failed: Vec<&str> = TESTS
        .iter()
        .copied()
        .filter(|t| {
            !results
                .iter()
                .any(|(name, result)| name == t && result == "success")
        })
        .collect();
    assert!(
        failed.is_empty(),
        "smb2.oplock tests not passed: {failed:?}\n{output}"
    );

    let _ = stop.send(());
    serving.await.unwrap().expect("SMB service");
    engine.shutdown().unwrap();
}
