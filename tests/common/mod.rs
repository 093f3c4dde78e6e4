//! Starts and stops real `aquifer serve` daemons for end-to-end tests.
#![allow(dead_code)]

pub mod guest;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN_PASSWORD: &str = "e2e-admin-password";
pub const S3_ACCESS: &str = "E2EADMINKEY";
pub const S3_SECRET: &str = "e2e-admin-s3-secret";

pub struct Daemon {
    pub child: Child,
    pub rest: String,
    /// host:port of S3, NFS and SFTP.
    pub s3: String,
    pub nfs: String,
    pub sftp: String,
    /// host:port of SMB; empty when the daemon serves no SMB.
    pub smb: String,
    /// host:port of the fabric listener.
    pub fabric: String,
    pub data_dir: PathBuf,
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_aquifer"))
}

impl Daemon {
    /// Starts a daemon on `data_dir` with an ephemeral REST port and waits until it serves.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Daemon {
        let mut child = Command::new(bin())
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--rest", "127.0.0.1:0", "--s3", "127.0.0.1:0", "--nfs", "127.0.0.1:0", "--sftp", "127.0.0.1:0"])
            .args(if extra.contains(&"--smb") || extra.contains(&"--config") { &[][..] } else { &["--smb", "127.0.0.1:0"][..] })
            .args(if extra.contains(&"--fabric") || extra.contains(&"--config") { &[][..] } else { &["--fabric", "127.0.0.1:0"][..] })
            .args(if extra.contains(&"--drive-size") { &[][..] } else { &["--drive-size", "256MiB"][..] })
            .args(extra)
            .env("AQUIFER_ADMIN_PASSWORD", ADMIN_PASSWORD)
            .env("AQUIFER_S3_ACCESS_KEY", S3_ACCESS)
            .env("AQUIFER_S3_SECRET_KEY", S3_SECRET)
            .env("AQUIFER_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn aquifer serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let after = |line: &str, scheme: &str| -> String {
                line.find(scheme).map(|i| line[i + scheme.len()..].chars().take_while(|c| *c != '/' && *c != ',' && *c != ' ').collect()).unwrap_or_default()
            };
            let mut others = (String::new(), String::new(), String::new(), String::new(), String::new());
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("SMB at") {
                    others.3 = after(&line, "smb://");
                }
                if line.starts_with("Fabric at") {
                    others.4 = after(&line, "fabric://");
                }
                if line.starts_with("S3 at") {
                    (others.0, others.1, others.2) = (after(&line, "s3://"), after(&line, "nfs://"), after(&line, "sftp://"));
                }
                if line.starts_with("Aquifer is serving") {
                    let _ = tx.send((after(&line, "http://"), others.clone()));
                }
            }
        });
        let Ok((rest, (s3, nfs, sftp, smb, fabric))) = rx.recv_timeout(Duration::from_secs(60)) else {
            // Stop it before the test's data directory goes, or it writes into a removed tree.
            let _ = child.kill();
            let _ = child.wait();
            panic!("daemon did not print its addresses within 60 s");
        };
        let d = Daemon { child, rest, s3, nfs, sftp, smb, fabric, data_dir: data_dir.to_path_buf() };
        d.wait_healthy();
        d
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.rest, path)
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = reqwest::blocking::Client::new();
        while Instant::now() < deadline {
            if client.get(self.url("/api/v1/health")).send().is_ok_and(|r| r.status().is_success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("daemon did not become healthy");
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let status = wait_timeout(&mut self.child, Duration::from_secs(60)).expect("daemon exits after SIGTERM");
        assert!(status.success(), "daemon exit status after SIGTERM: {status}");
    }

    /// SIGKILL: no flush, no shutdown.
    pub fn kill9(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    pub fn client(&self) -> reqwest::blocking::Client {
        reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// curl signing S3 requests (SigV4, unsigned payload) as `key` (`ACCESS:SECRET`), with `args`;
/// returns its output, failing the test when curl fails.
pub fn curl_s3(key: &str, args: &[&str]) -> Vec<u8> {
    let o = Command::new("curl")
        .args(["-sSf", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", key, "-H", "x-amz-content-sha256:UNSIGNED-PAYLOAD"])
        .args(args)
        .output()
        .expect("run curl (Debian package curl; scripts/deps.sh installs it)");
    assert!(o.status.success(), "curl {args:?}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    o.stdout
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs an OpenSSH `sftp -b` batch against the daemon as `user` with `password`.
pub fn sftp_as(d: &Daemon, user: &str, password: &str, batch: &str, work: &Path) -> std::process::Output {
    let file = work.join("batch");
    std::fs::write(&file, batch).unwrap();
    let port = d.sftp.rsplit(':').next().unwrap();
    Command::new("sshpass")
        .args(["-p", password, "sftp", "-o", "BatchMode=no", "-b", file.to_str().unwrap(), "-P", port])
        .args(["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "PreferredAuthentications=password", "-o", "PubkeyAuthentication=no"])
        .arg(format!("{user}@127.0.0.1"))
        .output()
        .expect("run sshpass sftp (Debian packages sshpass, openssh-client; scripts/deps.sh installs them)")
}
