//! The daemon end to end: first start, graceful restart, kill -9 during a write storm, SFTP
//! writes through a SIGTERM.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

#[test]
fn first_start_generates_a_private_admin_password_and_restarts_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = std::process::Command::new(bin())
        .args(["serve", "--rest", "127.0.0.1:0", "--s3", "127.0.0.1:0", "--nfs", "127.0.0.1:0", "--sftp", "127.0.0.1:0", "--drive-size", "64MiB", "--data-dir"])
        .arg(&data)
        .env_remove("AQUIFER_ADMIN_PASSWORD")
        .env_remove("AQUIFER_S3_ACCESS_KEY")
        .env_remove("AQUIFER_S3_SECRET_KEY")
        .env("AQUIFER_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut out, &mut first).unwrap();
    let printed = first.trim().strip_prefix("Created user admin with password ").expect(&first).to_string();
    let file = data.join("admin-password");
    let stored = std::fs::read_to_string(&file).unwrap();
    assert_eq!(stored.trim(), printed);
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_dir(data.join("drives")).unwrap().count(), 6);
    // Signal only once it serves (before that, SIGTERM simply ends the process).
    let (mut line, mut said) = (String::new(), String::new());
    while !line.starts_with("Aquifer is serving") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "daemon exited early");
        said.push_str(&line);
    }
    // With no key in the environment, admin's S3 key pair is made and kept in a private file
    // in the form awscli and `aquifer bench train --s3-credentials` read; it works.
    let creds_file = data.join("admin-s3-credentials");
    assert!(said.contains("Created S3 access key ") && said.contains(&creds_file.display().to_string()), "{said}");
    assert_eq!(std::fs::metadata(&creds_file).unwrap().permissions().mode() & 0o777, 0o600);
    let creds = std::fs::read_to_string(&creds_file).unwrap();
    let field = |name: &str| creds.lines().find_map(|l| l.strip_prefix(name)).unwrap_or_else(|| panic!("{name} in {creds}")).to_string();
    let (access, secret) = (field("AWS_ACCESS_KEY_ID="), field("AWS_SECRET_ACCESS_KEY="));
    assert!(said.contains(&format!("Created S3 access key {access} ")), "{said}");
    let s3: String = said.split("s3://").nth(1).expect("S3 address").chars().take_while(|c| *c != ',' && *c != ' ').collect();
    let list = String::from_utf8(curl_s3(&format!("{access}:{secret}"), &[&format!("http://{s3}/")])).unwrap();
    assert!(list.contains("ListAllMyBucketsResult"), "{list}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(wait_timeout(&mut child, Duration::from_secs(60)).unwrap().success());

    // The second start prints no password and keeps the first one.
    let mut child = std::process::Command::new(bin())
        .args(["serve", "--rest", "127.0.0.1:0", "--s3", "127.0.0.1:0", "--nfs", "127.0.0.1:0", "--sftp", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("AQUIFER_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("Aquifer is serving") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "daemon exited early");
        assert!(!line.starts_with("Created user"), "second start must not create admin again: {line}");
        assert!(!line.starts_with("Created S3"), "second start must not make another S3 key: {line}");
    }
    let addr: String = line[line.find("http://").unwrap() + 7..].chars().take_while(|c| *c != '/').collect();
    let r = reqwest::blocking::Client::new()
        .get(format!("http://{addr}/api/v1/drives"))
        .basic_auth("admin", Some(&printed))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(std::fs::read_to_string(&creds_file).unwrap(), creds, "the S3 key file is kept as it was");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(wait_timeout(&mut child, Duration::from_secs(60)).unwrap().success());
}

#[test]
fn graceful_restart_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &[]);
    let c = d.client();
    let big = bytes(1, 9 << 20);
    for (name, body) in [("small.txt", b"hello".to_vec()), ("big.bin", big.clone())] {
        let r = c.put(d.url(&format!("/api/v1/files/keep/{name}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).body(body).send().unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    d.stop();
    let d = Daemon::start(dir.path(), &[]);
    let c = d.client();
    let got = c.get(d.url("/api/v1/files/keep/big.bin")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().bytes().unwrap();
    assert!(got == big);
    let got = c.get(d.url("/api/v1/files/keep/small.txt")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().bytes().unwrap();
    assert_eq!(&got[..], b"hello");
    d.stop();
}

/// Writers PUT files as fast as they can; the daemon is killed with SIGKILL mid-storm.
/// After a restart every acknowledged file reads back bit-exact and no file is half-written.
#[test]
fn kill_9_during_a_write_storm_loses_no_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    // Drives large enough that the storm never fills them.
    let d = Daemon::start(dir.path(), &["--drive-size", "2GiB"]);
    let acked: Arc<Mutex<HashMap<String, (u64, usize)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let url = d.url("");
        let acked = acked.clone();
        let stop = stop.clone();
        writers.push(std::thread::spawn(move || {
            let c = reqwest::blocking::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
            let sizes = [10, 3000, 70_000, 700_000, 5_000_000];
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let seed = w * 1_000_000 + i;
                let len = sizes[(i % sizes.len() as u64) as usize];
                let path = format!("storm/w{w}/f{i}");
                let r = c.put(format!("{url}/api/v1/files/{path}")).basic_auth("admin", Some(ADMIN_PASSWORD)).body(bytes(seed, len)).send();
                if let Ok(r) = r {
                    if r.status().is_success() {
                        acked.lock().unwrap().insert(path, (seed, len));
                    }
                }
                i += 1;
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    d.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 10, "the storm wrote something: {}", acked.len());

    let d = Daemon::start(dir.path(), &["--drive-size", "2GiB"]);
    let c = d.client();
    for (path, (seed, len)) in &acked {
        let r = c.get(d.url(&format!("/api/v1/files/{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
        assert_eq!(r.status(), 200, "acknowledged {path} missing after kill -9");
        let got = r.bytes().unwrap();
        assert!(got.len() == *len && got[..] == bytes(*seed, *len)[..], "acknowledged {path} differs after kill -9");
    }
    // Files that were in flight are either absent or complete.
    for w in 0..4u64 {
        let r = c.get(d.url(&format!("/api/v1/dirs/storm/w{w}?limit=10000"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
        if r.status() == 404 {
            continue;
        }
        let v: serde_json::Value = r.json().unwrap();
        for ent in v["entries"].as_array().expect("entries array") {
            let name = ent["name"].as_str().unwrap();
            let path = format!("storm/w{w}/{name}");
            if acked.contains_key(&path) {
                continue;
            }
            let i: u64 = name[1..].parse().unwrap();
            let sizes = [10, 3000, 70_000, 700_000, 5_000_000];
            let len = sizes[(i % 5) as usize];
            let got = c.get(d.url(&format!("/api/v1/files/{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().bytes().unwrap();
            assert!(got[..] == bytes(w * 1_000_000 + i, len)[..], "unacknowledged {path} is visible but not complete");
        }
    }
    d.stop();
}

/// Two drive files lost while the daemon is stopped (one deleted, one scribbled over): every
/// file still reads back bit-exact over REST, scrub repairs, replace + rebuild restores
/// redundancy, all visible in the API.
#[test]
fn two_drives_lost_while_stopped_then_scrub_and_rebuild_over_rest() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &[]);
    let c = d.client();
    let auth = |r: reqwest::blocking::RequestBuilder| r.basic_auth("admin", Some(ADMIN_PASSWORD));
    let files: Vec<(String, Vec<u8>)> = (0..8u64).map(|i| (format!("set/f{i}"), bytes(i + 100, [1000, 80_000, 3_000_000, 9_000_000][i as usize % 4]))).collect();
    for (p, b) in &files {
        assert!(auth(c.put(d.url(&format!("/api/v1/files/{p}")))).body(b.clone()).send().unwrap().status().is_success());
    }
    d.stop();
    std::fs::remove_file(dir.path().join("drives/drive-2.img")).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(dir.path().join("drives/drive-5.img")).unwrap();
    for i in 0..64u64 {
        f.seek(SeekFrom::Start((1 << 20) + i * 97_001)).unwrap();
        f.write_all(&bytes(i, 20_000)).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);

    let d = Daemon::start(dir.path(), &[]);
    let c = d.client();
    let auth = |r: reqwest::blocking::RequestBuilder| r.basic_auth("admin", Some(ADMIN_PASSWORD));
    let health: serde_json::Value = c.get(d.url("/api/v1/health")).send().unwrap().json().unwrap();
    assert_eq!(health["state"], "degraded", "{health}");
    for (p, b) in &files {
        let got = auth(c.get(d.url(&format!("/api/v1/files/{p}")))).send().unwrap().bytes().unwrap();
        assert!(got[..] == b[..], "{p} differs with two drives lost");
    }
    let wait = |id: u64| -> serde_json::Value {
        for _ in 0..600 {
            let j: serde_json::Value = auth(c.get(d.url(&format!("/api/v1/jobs/{id}")))).send().unwrap().json().unwrap();
            if j["state"] != "running" {
                return j;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("job {id} did not finish");
    };
    let job: serde_json::Value = auth(c.post(d.url("/api/v1/jobs"))).json(&serde_json::json!({"kind": "scrub"})).send().unwrap().json().unwrap();
    let j = wait(job["job_id"].as_u64().expect("job id"));
    assert_eq!(j["state"], "completed", "{j}");
    let r = auth(c.post(d.url("/api/v1/drives/2/replace"))).json(&serde_json::json!({})).send().unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let job: serde_json::Value = r.json().unwrap();
    let j = wait(job["job_id"].as_u64().expect("job id"));
    assert_eq!(j["state"], "completed", "{j}");
    let health: serde_json::Value = c.get(d.url("/api/v1/health")).send().unwrap().json().unwrap();
    assert_eq!(health["state"], "ok", "{health}");
    d.stop();
    // Full redundancy again: two other drives can go.
    std::fs::remove_file(dir.path().join("drives/drive-0.img")).unwrap();
    std::fs::remove_file(dir.path().join("drives/drive-1.img")).unwrap();
    let d = Daemon::start(dir.path(), &[]);
    let c = d.client();
    for (p, b) in &files {
        let got = c.get(d.url(&format!("/api/v1/files/{p}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().bytes().unwrap();
        assert!(got[..] == b[..], "{p} differs after rebuild and two more losses");
    }
    d.stop();
}

/// An SFTP client writing 4 KiB at a time, each write answered before the next is sent,
/// while the daemon is stopped with SIGTERM: every write it was told had succeeded is in
/// the file after a restart. (Sessions must end before the engine's last write-out and
/// sync, or writes answered in between are lost.)
#[test]
fn sftp_writes_answered_before_a_sigterm_are_kept() {
    const SCRIPT: &str = r#"
import sys, paramiko
port, password = int(sys.argv[1]), sys.argv[2]
t = paramiko.Transport(("127.0.0.1", port))
t.connect(username="admin", password=password)
s = paramiko.SFTPClient.from_transport(t)
f = s.open("/sigterm.bin", "wb", bufsize=0)
i = 0
try:
    while True:
        f.write(bytes([i % 251]) * 4096)
        i += 1
        print(i * 4096, flush=True)
except Exception:
    pass
"#;
    let check = std::process::Command::new("python3").args(["-c", "import paramiko"]).output().unwrap();
    assert!(check.status.success(), "python3 has no paramiko: install it with `pip install paramiko` (scripts/deps.sh)");
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let d = Daemon::start(dir.path(), &[]);
        let port = d.sftp.rsplit(':').next().unwrap().to_string();
        let mut py = std::process::Command::new("python3")
            .args(["-c", SCRIPT, &port, ADMIN_PASSWORD])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(py.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            for line in std::io::BufRead::lines(out) {
                let Ok(line) = line else { break };
                last = line.trim().parse().unwrap();
                let _ = tx.send(last);
            }
            last
        });
        // Stop once the writes are under way.
        while rx.recv_timeout(Duration::from_secs(30)).expect("sftp writes under way") < 200 * 4096 {}
        d.stop();
        let acked = reader.join().unwrap();
        let _ = py.wait();

        let d = Daemon::start(dir.path(), &[]);
        let got = d.client().get(d.url("/api/v1/files/sigterm.bin")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().bytes().unwrap();
        assert!(got.len() as u64 >= acked, "round {round}: {} bytes kept of {acked} acknowledged", got.len());
        for (i, chunk) in got.chunks(4096).enumerate() {
            assert!(chunk.iter().all(|&b| b == (i % 251) as u8), "round {round}: block {i} differs");
        }
        d.stop();
    }
}
