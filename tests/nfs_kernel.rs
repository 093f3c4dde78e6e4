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

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use common::*;

/// Size of the file the host writes and the guest copies: three full 1 MiB NFS READs and a
/// partial fourth, on no block boundary.
const FROM_HOST_BYTES: usize = 3 * 1024 * 1024 + 4097;
/// Seed of that file's contents.
const FROM_HOST_SEED: u64 = 7;
/// Longest the guest may take to boot and run one phase of the check (TCG emulation).
const PHASE_TIMEOUT_S: u64 = 240;
/// Longest the guest may take to boot and run all of pjdfstest (about 15 s here).
const PJDFSTEST_TIMEOUT_S: u64 = 600;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The QEMU guest: console lines arrive on `lines`, `stdin` types on its console.
struct Guest {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Every console line so far, for failure messages.
    transcript: Vec<String>,
}

impl Guest {
    fn boot(dir: &Path, nfs_port: u16, mode: &str) -> Guest {
        let append = format!("console=ttyS0 panic=-1 quiet aq.port={nfs_port} aq.mode={mode}");
        let mut child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m", "512", "-smp", "1", "-nodefaults", "-no-reboot"])
            .args(["-display", "none", "-monitor", "none", "-serial", "stdio"])
            .arg("-kernel")
            .arg(dir.join("vmlinuz"))
            .arg("-initrd")
            .arg(dir.join("initramfs.cpio.gz"))
            .args(["-append", &append])
            .args(["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("run qemu-system-x86_64 ({e}); run tests/guest/setup.sh"));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n') {
                let Ok(line) = line else { break };
                let line = String::from_utf8_lossy(&line).trim_end_matches('\r').to_string();
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Guest { child, stdin, lines, transcript: Vec::new() }
    }

    /// Reads console lines until one starts with `marker` (kernel messages may precede it on
    /// the same line, so the marker is searched for), and returns the `AQ-` lines read.
    fn until(&mut self, marker: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.transcript.push(line.clone());
                    if let Some(at) = line.find("AQ-") {
                        let line = line[at..].to_string();
                        if line.starts_with("AQ-FATAL") {
                            panic!("guest: {line}\n{}", self.transcript.join("\n"));
                        }
                        let done = line.starts_with(marker);
                        got.push(line);
                        if done {
                            return got;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("guest printed no {marker} within {timeout:?}; console:\n{}", self.transcript.join("\n"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("guest exited before {marker}; console:\n{}", self.transcript.join("\n"))
                }
            }
        }
    }

    fn type_line(&mut self, line: &str) {
        self.stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if wait_timeout(&mut self.child, Duration::from_secs(30)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The check names tests/guest/check.sh reports: the second word of each `run`, `expect`
/// and `refuse` line. Every one must come back `ok`, so a check that silently stops running
/// fails the test.
fn expected_checks() -> Vec<String> {
    let script = std::fs::read_to_string(repo().join("tests/guest/check.sh")).unwrap();
    let names: Vec<String> = script
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match w.next() {
                Some("run" | "expect" | "refuse") => w.next().map(str::to_string),
                _ => None,
            }
        })
        .collect();
    assert!(names.len() > 50, "check.sh lists {} checks", names.len());
    names
}

/// `AQ-CHECK name ok|FAIL ...` lines → name → verdict.
fn verdicts(lines: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for l in lines {
        if let Some(rest) = l.strip_prefix("AQ-CHECK ") {
            let (name, verdict) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(out.insert(name.to_string(), verdict.to_string()).is_none(), "check {name} reported twice");
        }
    }
    out
}

fn rest_file(d: &Daemon, path: &str) -> Option<Vec<u8>> {
    let r = d.client().get(d.url(&format!("/api/v1/files/{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    if r.status() == reqwest::StatusCode::NOT_FOUND {
        return None;
    }
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    Some(r.bytes().unwrap().to_vec())
}

/// name → entry of one directory, through the REST listing.
fn rest_dir(d: &Daemon, path: &str) -> BTreeMap<String, serde_json::Value> {
    let r = d.client().get(d.url(&format!("/api/v1/dirs/{path}?limit=10000"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert!(r.status().is_success(), "list {path}: {}", r.status());
    let v: serde_json::Value = r.json().unwrap();
    assert!(v.get("next_cursor").is_none(), "listing of {path} has more pages");
    v["entries"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap().to_string(), e.clone())).collect()
}

fn seq(from: u32, to: u32) -> Vec<u8> {
    (from..=to).map(|i| format!("{i}\n")).collect::<String>().into_bytes()
}

/// Assembles the guest (kernel and initramfs) into `dir`.
fn build_guest(dir: &Path, with_pjdfstest: bool) {
    let mut c = Command::new(repo().join("tests/guest/build-initramfs.sh"));
    c.arg(dir);
    if !with_pjdfstest {
        c.arg("--no-pjdfstest");
    }
    let built = c.output().expect("run tests/guest/build-initramfs.sh");
    assert!(built.status.success(), "build the guest (run tests/guest/setup.sh first):\n{}", String::from_utf8_lossy(&built.stderr));
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
    let r = d.client().put(d.url("/api/v1/files/kc/from-host.bin")).basic_auth("admin", Some(ADMIN_PASSWORD)).body(from_host.clone()).send().unwrap();
    assert!(r.status().is_success(), "PUT kc/from-host.bin: {}", r.status());

    let started = Instant::now();
    let mut guest = Guest::boot(&guest_dir, port, "check");
    let mut lines = guest.until("AQ-WAIT restart", Duration::from_secs(PHASE_TIMEOUT_S));
    assert!(lines.iter().any(|l| l.starts_with("AQ-MOUNTED ")), "guest did not mount: {lines:?}");
    let phase1 = started.elapsed();

    // Restart while the guest holds the mount. The guest's next operations start while the
    // daemon is still down, so the client has to retry and reconnect to the new process.
    d.stop();
    guest.type_line("go");
    std::thread::sleep(Duration::from_secs(1));
    let d = start_daemon(&data, port);
    lines.extend(guest.until("AQ-DONE", Duration::from_secs(PHASE_TIMEOUT_S)));
    eprintln!("kernel NFS client: boot and phase 1 took {phase1:?}, all {:?}", started.elapsed());

    let got = verdicts(&lines);
    let mut problems = Vec::new();
    for name in expected_checks() {
        match got.get(&name).map(String::as_str) {
            Some("ok") => {}
            Some(v) => problems.push(format!("{name}: {v}")),
            None => problems.push(format!("{name}: not reported")),
        }
    }
    assert!(problems.is_empty(), "guest checks failed:\n{}\nconsole:\n{}", problems.join("\n"), guest.transcript.join("\n"));
    assert!(lines.iter().any(|l| l == "AQ-UNMOUNTED"), "guest could not unmount: {lines:?}");

    // What the guest left, seen through REST from the restarted daemon.
    assert!(rest_file(&d, "kc/copy.bin").unwrap() == from_host, "copy.bin differs from from-host.bin");
    let mut patched = from_host.clone();
    patched[1_000_000..1_000_003].copy_from_slice(b"XYZ");
    assert!(rest_file(&d, "kc/patch.bin").unwrap() == patched, "patch.bin is not from-host.bin with XYZ at 1000000");
    let all = seq(1, 200_000);
    assert!(rest_file(&d, "kc/seq.txt").unwrap() == all, "seq.txt differs");
    assert_eq!(rest_file(&d, "kc/trunc-down.txt").unwrap(), all[..1000]);
    let mut up = b"abc\n".to_vec();
    up.resize(5000, 0);
    assert_eq!(rest_file(&d, "kc/trunc-up.txt").unwrap(), up);
    assert_eq!(rest_file(&d, "kc/renamed.txt").unwrap(), b"hello-from-guest\nappended\n");
    assert_eq!(rest_file(&d, "kc/over-dst.txt").unwrap(), b"new\n");
    assert_eq!(rest_file(&d, "kc/open.txt").unwrap(), b"before-restart\nafter-restart\n");
    assert_eq!(rest_file(&d, "kc/post.txt").unwrap(), b"created-after-restart\n");
    assert_eq!(rest_file(&d, "kc/d1/moved-back.txt").unwrap(), b"moving\n");
    for gone in ["kc/hello.txt", "kc/over-src.txt", "kc/doomed.txt", "kc/seq-link.txt", "kc/d1/mover.txt", "kc/d1/d2/d3/moved.txt"] {
        assert!(rest_file(&d, gone).is_none(), "{gone} should be gone");
    }

    let kc = rest_dir(&d, "kc");
    let renamed = &kc["renamed.txt"];
    assert_eq!(renamed["mode"].as_u64().unwrap() & 0o7777, 0o640, "renamed.txt mode");
    assert_eq!(kc["seq.txt"]["mtime_ns"].as_i64().unwrap(), 981_173_106 * 1_000_000_000, "seq.txt mtime");
    assert_eq!(kc["many"]["kind"], "dir");
    for gone in ["post-dir", "dirmove", "hello.txt"] {
        assert!(!kc.contains_key(gone), "{gone} still listed in kc");
    }
    let d1 = rest_dir(&d, "kc/d1");
    assert_eq!(d1["hardlink.txt"]["ino"], renamed["ino"], "hard link and its target are one inode");
    assert_eq!(d1["sym"]["kind"], "symlink");
    assert_eq!(d1["dirmoved"]["kind"], "dir");
    assert!(rest_dir(&d, "kc/d1/dirmoved").contains_key("inner"));
    assert!(!d1.contains_key("gone"), "rmdir'd d1/gone still listed");
    let many = rest_dir(&d, "kc/many");
    assert_eq!(many.len(), 300);
    assert!((0..300).all(|i| many.contains_key(&format!("file-with-a-longish-name-{i}"))));
    d.stop();
}

/// The case names in tests/guest/pjdfstest-known-failures.txt.
fn known_failures() -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("tests/guest/pjdfstest-known-failures.txt")).unwrap();
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect()
}

#[test]
fn pjdfstest_through_the_kernel_client() {
    let work = tempfile::tempdir().unwrap();
    let guest_dir = work.path().join("guest");
    build_guest(&guest_dir, true);
    let d = Daemon::start(&work.path().join("data"), &[]);
    let port: u16 = d.nfs.rsplit(':').next().unwrap().parse().unwrap();

    let started = Instant::now();
    let mut guest = Guest::boot(&guest_dir, port, "pjdfstest-run");
    let lines = guest.until("AQ-DONE", Duration::from_secs(PJDFSTEST_TIMEOUT_S));
    assert!(lines.iter().any(|l| l.starts_with("AQ-PJDFSTEST-END")), "pjdfstest did not finish: {lines:?}");
    let console = guest.transcript.join("\n");

    // Result lines are "<case name> <padding> ok|FAILED|skipped".
    let (mut passed, mut failed, mut skipped) = (0, std::collections::BTreeSet::new(), 0);
    for l in &guest.transcript {
        let mut w = l.split_whitespace();
        let (Some(name), Some(verdict), None) = (w.next(), w.next(), w.next()) else { continue };
        if !name.contains("::") {
            continue;
        }
        match verdict {
            "ok" => passed += 1,
            "FAILED" => {
                failed.insert(name.to_string());
            }
            "skipped" => skipped += 1,
            _ => {}
        }
    }
    eprintln!("pjdfstest: {passed} passed, {} failed, {skipped} skipped in {:?}", failed.len(), started.elapsed());
    let summary = guest.transcript.iter().find(|l| l.starts_with("Summary: ")).unwrap_or_else(|| panic!("no summary:\n{console}"));
    assert!(summary.contains(&format!("{passed} passed")), "counted {passed} passed, pjdfstest says {summary}");

    let known = known_failures();
    let new: Vec<_> = failed.difference(&known).collect();
    let fixed: Vec<_> = known.difference(&failed).collect();
    assert!(new.is_empty(), "pjdfstest cases that now fail: {new:?}\nconsole:\n{console}");
    assert!(fixed.is_empty(), "pjdfstest cases that now pass: delete them from tests/guest/pjdfstest-known-failures.txt: {fixed:?}");
    assert!(passed >= 180, "only {passed} pjdfstest cases passed");
    d.stop();
}
