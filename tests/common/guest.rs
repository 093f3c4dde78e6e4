//! Drives the QEMU guest of tests/guest/ (Debian's kernel, a busybox initramfs) for the
//! kernel-client tests (tests/nfs_kernel.rs, tests/smb_kernel.rs): builds it, boots it with
//! parameters on the kernel command line, reads the `AQ-` lines of its console, and checks
//! what its scripts and pjdfstest report.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use super::{ADMIN_PASSWORD, Daemon, wait_timeout};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Assembles the guest (kernel and initramfs) into `dir`.
pub fn build_guest(dir: &Path, with_pjdfstest: bool) {
    let mut c = Command::new(repo().join("tests/guest/build-initramfs.sh"));
    c.arg(dir);
    if !with_pjdfstest {
        c.arg("--no-pjdfstest");
    }
    let built = c.output().expect("run tests/guest/build-initramfs.sh");
    assert!(built.status.success(), "build the guest (run tests/guest/setup.sh first):\n{}", String::from_utf8_lossy(&built.stderr));
}

/// The QEMU guest: console lines arrive on `lines`, `stdin` types on its console.
pub struct Guest {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Every console line so far, for failure messages.
    pub transcript: Vec<String>,
}

impl Guest {
    /// Boots the guest in `dir` with `params` (the `aq.*` words, see tests/guest/init) on the
    /// kernel command line and `mem_mib` of memory.
    pub fn boot(dir: &Path, params: &str, mem_mib: u32) -> Guest {
        let append = format!("console=ttyS0 panic=-1 quiet {params}");
        let mut child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m", &mem_mib.to_string(), "-smp", "1", "-nodefaults", "-no-reboot"])
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
    pub fn until(&mut self, marker: &str, timeout: Duration) -> Vec<String> {
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

    pub fn type_line(&mut self, line: &str) {
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

/// The check names a guest script (tests/guest/SCRIPT) reports: the second word of each
/// `run`, `expect` and `refuse` line, in it and in the files it sources (`. /guest/NAME`).
/// Every one must come back `ok`, so a check that silently stops running fails the test.
pub fn expected_checks(script: &str) -> Vec<String> {
    fn collect(script: &str, names: &mut Vec<String>) {
        let text = std::fs::read_to_string(repo().join("tests/guest").join(script)).unwrap_or_else(|e| panic!("tests/guest/{script}: {e}"));
        for l in text.lines() {
            let mut w = l.split_whitespace();
            match (w.next(), w.next()) {
                (Some("run" | "expect" | "refuse"), Some(name)) => names.push(name.to_string()),
                (Some("."), Some(sourced)) if sourced.starts_with("/guest/") => collect(&sourced["/guest/".len()..], names),
                _ => {}
            }
        }
    }
    let mut names = Vec::new();
    collect(script, &mut names);
    assert!(names.len() > 40, "{script} lists {} checks", names.len());
    names
}

/// `AQ-CHECK name ok|FAIL ...` lines → name → verdict.
pub fn verdicts(lines: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for l in lines {
        if let Some(rest) = l.strip_prefix("AQ-CHECK ") {
            let (name, verdict) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(out.insert(name.to_string(), verdict.to_string()).is_none(), "check {name} reported twice");
        }
    }
    out
}

/// Asserts that every check of `script` came back ok in `lines`.
pub fn assert_checks(guest: &Guest, script: &str, lines: &[String]) {
    let got = verdicts(lines);
    let mut problems = Vec::new();
    for name in expected_checks(script) {
        match got.get(&name).map(String::as_str) {
            Some("ok") => {}
            Some(v) => problems.push(format!("{name}: {v}")),
            None => problems.push(format!("{name}: not reported")),
        }
    }
    assert!(problems.is_empty(), "guest checks failed:\n{}\nconsole:\n{}", problems.join("\n"), guest.transcript.join("\n"));
}

pub fn rest_file(d: &Daemon, path: &str) -> Option<Vec<u8>> {
    let r = d.client().get(d.url(&format!("/api/v1/files/{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    if r.status() == reqwest::StatusCode::NOT_FOUND {
        return None;
    }
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    Some(r.bytes().unwrap().to_vec())
}

/// name → entry of one directory, through the REST listing.
pub fn rest_dir(d: &Daemon, path: &str) -> BTreeMap<String, serde_json::Value> {
    let r = d.client().get(d.url(&format!("/api/v1/dirs/{path}?limit=10000"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert!(r.status().is_success(), "list {path}: {}", r.status());
    let v: serde_json::Value = r.json().unwrap();
    assert!(v.get("next_cursor").is_none(), "listing of {path} has more pages");
    v["entries"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap().to_string(), e.clone())).collect()
}

/// `seq FROM TO` output.
pub fn seq(from: u32, to: u32) -> Vec<u8> {
    (from..=to).map(|i| format!("{i}\n")).collect::<String>().into_bytes()
}

/// Longest the guest may take to boot and run one phase of a check script (TCG emulation).
const PHASE_TIMEOUT: Duration = Duration::from_secs(240);

/// Runs a check script with a restart of the daemon in the middle. Puts `from_host` at
/// kc/from-host.bin through REST, boots the guest with `params` (which mount and name the
/// script's mode), waits for `AQ-WAIT restart`, stops the daemon, lets the guest go on while
/// the daemon is down (its client has to retry and reconnect), starts a new one with
/// `restart` a second later, and waits for `AQ-DONE`. Asserts that every check of `script`
/// came back ok and that the guest unmounted. Returns the new daemon and the `AQ-` lines.
pub fn check_across_a_restart(guest_dir: &Path, params: &str, script: &str, d: Daemon, from_host: &[u8], restart: impl FnOnce() -> Daemon) -> (Daemon, Vec<String>) {
    let r = d.client().put(d.url("/api/v1/files/kc/from-host.bin")).basic_auth("admin", Some(ADMIN_PASSWORD)).body(from_host.to_vec()).send().unwrap();
    assert!(r.status().is_success(), "PUT kc/from-host.bin: {}", r.status());

    let started = Instant::now();
    let mut guest = Guest::boot(guest_dir, params, 512);
    let mut lines = guest.until("AQ-WAIT restart", PHASE_TIMEOUT);
    assert!(lines.iter().any(|l| l.starts_with("AQ-MOUNTED ")), "guest did not mount: {lines:?}");
    let phase1 = started.elapsed();

    d.stop();
    guest.type_line("go");
    std::thread::sleep(Duration::from_secs(1));
    let d = restart();
    lines.extend(guest.until("AQ-DONE", PHASE_TIMEOUT));
    eprintln!("{script}: boot and phase 1 took {phase1:?}, all {:?}", started.elapsed());

    assert_checks(&guest, script, &lines);
    assert!(lines.iter().any(|l| l == "AQ-UNMOUNTED"), "guest could not unmount: {lines:?}");
    (d, lines)
}

/// The files both kernel-client checks (check.sh, cifs-check.sh) leave under kc/, read back
/// through REST and compared with what the guest wrote; `from_host` is kc/from-host.bin.
pub fn assert_check_files(d: &Daemon, from_host: &[u8]) {
    assert!(rest_file(d, "kc/copy.bin").unwrap() == from_host, "copy.bin differs from from-host.bin");
    let mut patched = from_host.to_vec();
    patched[1_000_000..1_000_003].copy_from_slice(b"XYZ");
    assert!(rest_file(d, "kc/patch.bin").unwrap() == patched, "patch.bin is not from-host.bin with XYZ at 1000000");
    let all = seq(1, 200_000);
    assert!(rest_file(d, "kc/seq.txt").unwrap() == all, "seq.txt differs");
    assert_eq!(rest_file(d, "kc/trunc-down.txt").unwrap(), all[..1000]);
    let mut up = b"abc\n".to_vec();
    up.resize(5000, 0);
    assert_eq!(rest_file(d, "kc/trunc-up.txt").unwrap(), up);
    assert_eq!(rest_file(d, "kc/renamed.txt").unwrap(), b"hello-from-guest\nappended\n");
    assert_eq!(rest_file(d, "kc/over-dst.txt").unwrap(), b"new\n");
    assert_eq!(rest_file(d, "kc/open.txt").unwrap(), b"before-restart\nafter-restart\n");
    assert_eq!(rest_file(d, "kc/post.txt").unwrap(), b"created-after-restart\n");
    assert_eq!(rest_file(d, "kc/d1/moved-back.txt").unwrap(), b"moving\n");
    for gone in ["kc/hello.txt", "kc/over-src.txt", "kc/doomed.txt", "kc/d1/mover.txt", "kc/d1/d2/d3/moved.txt"] {
        assert!(rest_file(d, gone).is_none(), "{gone} should be gone");
    }
    let kc = rest_dir(d, "kc");
    assert_eq!(kc["seq.txt"]["mtime_ns"].as_i64().unwrap(), 981_173_106 * 1_000_000_000, "seq.txt mtime");
    assert_eq!(kc["many"]["kind"], "dir");
    for gone in ["post-dir", "dirmove", "hello.txt"] {
        assert!(!kc.contains_key(gone), "{gone} still listed in kc");
    }
    let d1 = rest_dir(d, "kc/d1");
    assert_eq!(d1["dirmoved"]["kind"], "dir");
    assert!(rest_dir(d, "kc/d1/dirmoved").contains_key("inner"));
    assert!(!d1.contains_key("gone"), "rmdir'd d1/gone still listed");
    let many = rest_dir(d, "kc/many");
    assert_eq!(many.len(), 300);
    assert!((0..300).all(|i| many.contains_key(&format!("file-with-a-longish-name-{i}"))));
}

/// Runs pjdfstest in a guest booted with `params` (which mount the file system; the mode is
/// added here) and holds its failing cases to tests/guest/`known_file`: any other failing
/// case fails the test, and so does a listed case that passes (its line is then to go).
/// Returns the number of cases that passed.
pub fn pjdfstest_against_known(guest_dir: &Path, params: &str, known_file: &str, timeout: Duration, min_passed: usize) -> usize {
    let started = Instant::now();
    let mut guest = Guest::boot(guest_dir, &format!("{params} aq.mode=pjdfstest-run"), 512);
    let lines = guest.until("AQ-DONE", timeout);
    assert!(lines.iter().any(|l| l.starts_with("AQ-PJDFSTEST-END")), "pjdfstest did not finish: {lines:?}");
    let console = guest.transcript.join("\n");

    // Result lines are "<case name> <padding> ok|FAILED|skipped".
    let (mut passed, mut failed, mut skipped) = (0, BTreeSet::new(), 0);
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
    eprintln!("pjdfstest ({params}): {passed} passed, {} failed, {skipped} skipped in {:?}", failed.len(), started.elapsed());
    let summary = guest.transcript.iter().find(|l| l.starts_with("Summary: ")).unwrap_or_else(|| panic!("no summary:\n{console}"));
    assert!(summary.contains(&format!("{passed} passed")), "counted {passed} passed, pjdfstest says {summary}");

    let text = std::fs::read_to_string(repo().join("tests/guest").join(known_file)).unwrap();
    let known: BTreeSet<String> = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect();
    let new: Vec<_> = failed.difference(&known).collect();
    let fixed: Vec<_> = known.difference(&failed).collect();
    assert!(new.is_empty(), "pjdfstest cases that now fail: {new:?}\nconsole:\n{console}");
    assert!(fixed.is_empty(), "pjdfstest cases that now pass: delete them from tests/guest/{known_file}: {fixed:?}");
    assert!(passed >= min_passed, "only {passed} pjdfstest cases passed");
    passed
}
