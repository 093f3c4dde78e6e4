//! Shared by the tests that run Samba's `smbtorture` (apt `samba-testsuite`) against the SMB
//! service over an engine in a temporary directory: the service, and smbtorture's results.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use aquifer_smb::{ShareConfig, ShareTable, SmbOptions, SmbService};
use storage_engine::{Engine, EngineConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const ADMIN_PASSWORD: &str = "admin-password";

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::with_file_drives(dir, 6, 64 << 20, 4, 2);
    c.argon2_memory_kib = 64;
    c.admin_password = Some(ADMIN_PASSWORD.into());
    c.wal_sync_interval_ms = 50;
    c
}

/// The SMB service serving the share `aquifer` (the whole namespace, leases on, as
/// `scripts/smbtorture.sh` serves it) over an engine in a temporary directory.
pub struct Served {
    pub addr: SocketAddr,
    engine: Arc<Engine>,
    stop: oneshot::Sender<()>,
    serving: JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    pub async fn start() -> Self {
        Self::start_in(tempfile::tempdir().unwrap()).await
    }

    /// The service over the engine whose drives are in `dir`, made there if none are.
    async fn start_in(dir: tempfile::TempDir) -> Self {
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
        Served {
            addr,
            engine,
            stop,
            serving,
            _dir: dir,
        }
    }

    /// Stops the service and the engine; fails if the service failed.
    pub async fn stop(self) {
        self.stop_keeping_data().await;
    }

    /// Stops the service and the engine and starts both again on the same drives, as a
    /// daemon restart does (on another port).
    #[allow(dead_code)]
    pub async fn restart(self) -> Self {
        let dir = self.stop_keeping_data().await;
        Self::start_in(dir).await
    }

    async fn stop_keeping_data(self) -> tempfile::TempDir {
        let _ = self.stop.send(());
        self.serving.await.unwrap().expect("SMB service");
        self.engine.shutdown().unwrap();
        self._dir
    }

    /// The engine behind the share, to look at what SMB stored.
    #[allow(dead_code)]
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

/// Runs smbclient's `commands` (`;`-separated) against the share as admin, with `cwd` as its
/// local directory; returns its output, stdout and stderr together.
#[allow(dead_code)]
pub fn smbclient(addr: SocketAddr, cwd: &Path, commands: &str) -> String {
    let out = Command::new("smbclient")
        .current_dir(cwd)
        .arg("//127.0.0.1/aquifer")
        .args(["-p", &addr.port().to_string(), "-m", "SMB3", "-U"])
        .arg(format!("admin%{ADMIN_PASSWORD}"))
        .args(["-c", commands])
        .output()
        .unwrap_or_else(|e| panic!("run smbclient ({e}); install the Debian package smbclient"));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `tests` of smbtorture's suite `suite` (e.g. `smb2.oplock`) against `addr` as admin
/// and returns each test's result (`success`, `failure`, `error`, `skip`) with the whole
/// output.
#[allow(dead_code)]
pub fn smbtorture(
    addr: SocketAddr,
    suite: &str,
    tests: &[&str],
) -> (Vec<(String, String)>, String) {
    // smbtorture leaves an empty `smbtortureXXXXXX` directory in its working directory.
    let cwd = tempfile::tempdir().expect("create a working directory for smbtorture");
    let mut c = Command::new("smbtorture");
    c.current_dir(cwd.path());
    c.arg("//127.0.0.1/aquifer")
        .arg("-p")
        .arg(addr.port().to_string())
        .arg("-U")
        .arg(format!("admin%{ADMIN_PASSWORD}"));
    // Extra arguments for a closer look at a failure, e.g. `-d 10` for smbtorture's debug log.
    if let Ok(args) = std::env::var("AQUIFER_SMBTORTURE_ARGS") {
        c.args(args.split_whitespace());
    }
    for t in tests {
        c.arg(format!("{suite}.{t}"));
    }
    let out = c.output().unwrap_or_else(|e| {
        panic!("run smbtorture ({e}); install the Debian package samba-testsuite (scripts/deps.sh does)")
    });
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

/// The tests of `tests` that did not succeed.
#[allow(dead_code)]
pub fn not_passed<'a>(tests: &[&'a str], results: &[(String, String)]) -> Vec<&'a str> {
    tests
        .iter()
        .copied()
        .filter(|t| {
            !results
                .iter()
                .any(|(name, result)| name == t && result == "success")
        })
        .collect()
}

/// Runs `tests` of smbtorture's suite `suite` against a fresh service and fails, with
/// smbtorture's output, unless every one of them succeeds.
#[allow(dead_code)]
pub async fn assert_smbtorture_passes(suite: &'static str, tests: &'static [&'static str]) {
    let served = Served::start().await;
    let addr = served.addr;
    let (results, output) = tokio::task::spawn_blocking(move || smbtorture(addr, suite, tests))
        .await
        .unwrap();
    let failed = not_passed(tests, &results);
    assert!(
        failed.is_empty(),
        "{suite} tests not passed: {failed:?}\n{output}"
    );
    served.stop().await;
}
