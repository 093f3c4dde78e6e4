//! The Linux kernel's SMB client (cifs.ko, SMB 3.1.1) against the daemon's SMB service. The
//! QEMU guest of tests/guest/ (software emulation, Debian's kernel, a busybox initramfs)
//! mounts the default share `aquifer` as admin and runs tests/guest/cifs-check.sh: reads and
//! writes across several 1 MiB requests, truncation, mkdir/rmdir, renames, symbolic links
//! (mfsymlinks), unlink of an open file, utimes, a large directory. Halfway it waits while
//! the daemon restarts on the same port; the client reconnects and carries on with the
//! descriptor it held open. Before the restart it also mounts the share as a user other than
//! the administrator and copies a read-only file there. Afterwards the files are read back
//! through the REST API and compared bit for bit.
//!
//! A second test runs pjdfstest in the same guest on the CIFS mount and holds the set of
//! failing cases to tests/guest/pjdfstest-cifs-known-failures.txt.
//!
//! Needs `tests/guest/setup.sh`; without it the tests fail and say so. The mount options
//! and the pjdfstest results (beside stock Samba's) are in docs/smb-conformance.md.

mod common;

use std::path::Path;
use std::time::Duration;

use common::guest::*;
use common::*;

/// Size of the file the host writes and the guest copies: three full 1 MiB SMB READs and a
/// partial fourth, on no block boundary.
const FROM_HOST_BYTES: usize = 3 * 1024 * 1024 + 4097;
/// Seed of that file's contents.
const FROM_HOST_SEED: u64 = 11;
/// Longest the guest may take to boot and run all of pjdfstest.
const PJDFSTEST_TIMEOUT_S: u64 = 900;

/// The account the CIFS check mounts the share a second time with, to copy a read-only file
/// into `/alice` as a user other than the administrator.
const ALICE_PASSWORD: &str = "alice-password-1";

/// Makes the user alice and a directory `/alice` she owns (chown over SFTP: SMB without
/// POSIX extensions sets no owners); returns her uid.
fn alice_with_a_directory(d: &Daemon, work: &Path) -> u64 {
    let c = d.client();
    let r = c.post(d.url("/api/v1/users")).basic_auth("admin", Some(ADMIN_PASSWORD)).json(&serde_json::json!({"name": "alice", "password": ALICE_PASSWORD})).send().unwrap();
    assert!(r.status().is_success(), "create alice: {}", r.status());
    let user: serde_json::Value = c.get(d.url("/api/v1/users/alice")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().json().unwrap();
    let uid = user["uid"].as_u64().unwrap();
    let o = sftp_as(d, "admin", ADMIN_PASSWORD, &format!("mkdir /alice\nchown {uid} /alice\n"), work);
    assert!(o.status.success(), "mkdir and chown /alice: {}", String::from_utf8_lossy(&o.stderr));
    uid
}

/// Starts the daemon with its SMB service on `smb_port`, so a restart keeps the guest's mount.
fn start_daemon(data_dir: &Path, smb_port: u16) -> Daemon {
    Daemon::start(data_dir, &["--smb", &format!("127.0.0.1:{smb_port}")])
}

/// The guest's kernel parameters that mount the daemon's default share as admin.
fn cifs_params(smb_port: u16) -> String {
    format!("aq.fs=cifs aq.port={smb_port} aq.share=aquifer aq.user=admin aq.pass={ADMIN_PASSWORD}")
}

#[test]
fn kernel_cifs_client_reads_writes_and_survives_a_restart() {
    let work = tempfile::tempdir().unwrap();
    let guest_dir = work.path().join("guest");
    build_guest(&guest_dir, false);

    let port = free_port();
    let data = work.path().join("data");
    let d = start_daemon(&data, port);
    let alice_uid = alice_with_a_directory(&d, work.path());
    let from_host = bytes(FROM_HOST_SEED, FROM_HOST_BYTES);
    // The restart comes while the guest holds the mount and an open file: the client has to
    // reconnect to the new process, set its session up again and reopen the file.
    let params = format!("{} aq.mode=cifs-check aq.args=alice,{ALICE_PASSWORD}", cifs_params(port));
    let (d, lines) = check_across_a_restart(&guest_dir, &params, "cifs-check.sh", d, &from_host, || start_daemon(&data, port));
    let mounted = lines.iter().find(|l| l.starts_with("AQ-MOUNTED ")).unwrap();
    assert!(mounted.contains(" cifs ") && mounted.contains("vers=3.1.1"), "not an SMB 3.1.1 mount: {mounted}");

    // What the guest left, seen through REST from the restarted daemon.
    assert_check_files(&d, &from_host);
    assert_eq!(rest_file(&d, "kc/trunc-open.txt").unwrap(), b"0123tail\n");
    // An mfsymlinks symlink is a regular file that starts with "XSym" and names its target.
    let sym = rest_file(&d, "kc/d1/sym").unwrap();
    assert!(sym.starts_with(b"XSym\n") && String::from_utf8_lossy(&sym).contains("../renamed.txt"), "d1/sym: {sym:?}");
    // alice's copy of a read-only file: whole, read-only, hers.
    assert_eq!(rest_file(&d, "alice/ro-copy.txt").unwrap(), b"read-only source\n");
    assert_eq!(rest_dir(&d, "alice")["ro-copy.txt"]["mode"].as_u64().unwrap() & 0o777, 0o444);
    let head = d.client().head(d.url("/api/v1/files/alice/ro-copy.txt")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert_eq!(head.headers()["x-aquifer-uid"].to_str().unwrap(), alice_uid.to_string());
    for gone in ["kc/Renamed.tmp", "kc/held.txt"] {
        assert!(rest_file(&d, gone).is_none(), "{gone} should be gone");
    }
    d.stop();
}

#[test]
fn pjdfstest_through_the_kernel_cifs_client() {
    let work = tempfile::tempdir().unwrap();
    let guest_dir = work.path().join("guest");
    build_guest(&guest_dir, true);
    let port = free_port();
    let d = start_daemon(&work.path().join("data"), port);
    pjdfstest_against_known(&guest_dir, &cifs_params(port), "pjdfstest-cifs-known-failures.txt", Duration::from_secs(PJDFSTEST_TIMEOUT_S), 100);
    d.stop();
}
