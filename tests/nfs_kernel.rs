//! The Linux kernel's NFSv3 client against the daemon. A QEMU guest (software emulation)
//! boots Debian's kernel with a busybox initramfs (tests/guest/), mounts the daemon's export
//! and runs tests/guest/check.sh: reads, writes, truncation, mkdir/rmdir, renames, hard and
//! symbolic links, unlink, chmod, utimes, a large directory. Halfway it waits while the
//! daemon restarts on the same port, then goes on with the file handles and the open file
//! descriptor it held before (no ESTALE allowed). Afterwards the files are read back through
//! the REST API and compared bit for bit.
//!
//! A second test runs pjdfstest (POSIX semantics, about 400 cases) in the same guest on the
//! mount and holds the set of failing cases to tests/guest/pjdfstest-known-failures.txt.
//!
//! Needs `tests/guest/setup.sh` (qemu-system-x86, linux-image-cloud-amd64, busybox-static,
//! pjdfstest); without it the tests fail and say so. docs/nfs-kernel-client.md has the details.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use common::guest::*;
use common::*;

/// Size of the file the host writes and the guest copies: three full 1 MiB NFS READs and a
/// partial fourth, on no block boundary.
const FROM_HOST_BYTES: usize = 3 * 1024 * 1024 + 4097;
/// Seed of that file's contents.
const FROM_HOST_SEED: u64 = 7;
/// Longest the guest may take to boot and run all of pjdfstest (about 15 s here).
const PJDFSTEST_TIMEOUT_S: u64 = 600;

/// Starts the daemon with its NFS service on `nfs_port`, so a restart keeps the guest's mount.
fn start_daemon(data_dir: &Path, nfs_port: u16) -> Daemon {
    let mut child = Command::new(bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--rest", "127.0.0.1:0", "--s3", "127.0.0.1:0", "--sftp", "127.0.0.1:0", "--fabric", "127.0.0.1:0", "--drive-size", "256MiB"])
        .arg("--nfs")
        .arg(format!("127.0.0.1:{nfs_port}"))
        .env("AQUIFER_ADMIN_PASSWORD", ADMIN_PASSWORD)
        .env("AQUIFER_S3_ACCESS_KEY", S3_ACCESS)
        .env("AQUIFER_S3_SECRET_KEY", S3_SECRET)
        .env("AQUIFER_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn aquifer serve");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(at) = line.strip_prefix("Aquifer is serving").and_then(|l| l.split("http://").nth(1)) {
                let _ = tx.send(at.chars().take_while(|c| *c != '/').collect::<String>());
            }
        }
    });
    let rest = rx.recv_timeout(Duration::from_secs(60)).expect("daemon printed its REST address");
    let d = Daemon {
        child,
        rest,
        s3: String::new(),
        nfs: format!("127.0.0.1:{nfs_port}"),
        sftp: String::new(),
        smb: String::new(),
        fabric: String::new(),
        data_dir: data_dir.to_path_buf(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if d.client().get(d.url("/api/v1/health")).send().is_ok_and(|r| r.status().is_success()) {
            return d;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("daemon did not become healthy");
}

#[test]
fn kernel_client_reads_writes_and_survives_a_restart() {
    let work = tempfile::tempdir().unwrap();
    let guest_dir = work.path().join("guest");
    build_guest(&guest_dir, false);

    let port = free_port();
    let data = work.path().join("data");
    let d = start_daemon(&data, port);
    let from_host = bytes(FROM_HOST_SEED, FROM_HOST_BYTES);
    // The guest's operations after the restart start while the daemon is still down.
    let (d, _) = check_across_a_restart(&guest_dir, &format!("aq.port={port} aq.mode=check"), "check.sh", d, &from_host, || start_daemon(&data, port));

    // What the guest left, seen through REST from the restarted daemon.
    assert_check_files(&d, &from_host);
    assert!(rest_file(&d, "kc/seq-link.txt").is_none(), "seq-link.txt should be gone");
    let kc = rest_dir(&d, "kc");
    let renamed = &kc["renamed.txt"];
    assert_eq!(renamed["mode"].as_u64().unwrap() & 0o7777, 0o640, "renamed.txt mode");
    let d1 = rest_dir(&d, "kc/d1");
    assert_eq!(d1["hardlink.txt"]["ino"], renamed["ino"], "hard link and its target are one inode");
    assert_eq!(d1["sym"]["kind"], "symlink");
    d.stop();
}

#[test]
fn pjdfstest_through_the_kernel_client() {
    let work = tempfile::tempdir().unwrap();
    let guest_dir = work.path().join("guest");
    build_guest(&guest_dir, true);
    let d = Daemon::start(&work.path().join("data"), &[]);
    let port: u16 = d.nfs.rsplit(':').next().unwrap().parse().unwrap();
    pjdfstest_against_known(&guest_dir, &format!("aq.port={port}"), "pjdfstest-known-failures.txt", Duration::from_secs(PJDFSTEST_TIMEOUT_S), 180);
    d.stop();
}
