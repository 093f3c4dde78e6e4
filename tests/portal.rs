//! Portals end to end: two `aquifer serve` daemons (hub and spoke, separate data dirs) with
//! `aquifer wan-emulator` between them, driven with the `aquifer portal` CLI; data written to
//! the hub over REST and S3 is read through the spoke over REST, S3 and NFS.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{ADMIN_PASSWORD, Daemon, bin, bytes};
use serde_json::Value;

fn aquifer(rest: &str, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .args(["--rest", rest])
        .env("AQUIFER_PASSWORD", ADMIN_PASSWORD)
        .env_remove("AQUIFER_TOKEN")
        .output()
        .expect("run aquifer")
}

fn ok_json(out: Output, what: &str) -> Value {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

fn put(d: &Daemon, path: &str, data: &[u8]) {
    let r = d.client().put(d.url(&format!("/api/v1/files{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).body(data.to_vec()).send().unwrap();
    assert!(r.status().is_success(), "PUT {path}: {}", r.status());
}

fn get(d: &Daemon, path: &str) -> Result<Vec<u8>, (u16, String)> {
    let r = d.client().get(d.url(&format!("/api/v1/files{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    let status = r.status().as_u16();
    let body = r.bytes().unwrap().to_vec();
    if status == 200 { Ok(body) } else { Err((status, String::from_utf8_lossy(&body).into_owned())) }
}

struct Emulator {
    child: Child,
    addr: String,
    control: String,
}

impl Emulator {
    fn start(target: &str, delay_ms: u32) -> Emulator {
        let mut child = Command::new(bin())
            .args(["wan-emulator", "--listen", "127.0.0.1:0", "--target", target, "--delay-ms", &delay_ms.to_string(), "--control", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let addr = first.split_whitespace().nth(3).unwrap().to_string();
        let control = first.rsplit("control ").next().unwrap().trim_end_matches([')', '\n']).to_string();
        Emulator { child, addr, control }
    }

    fn control(&self, cmd: &str) -> String {
        let mut s = std::net::TcpStream::connect(&self.control).unwrap();
        writeln!(s, "{cmd}").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        line
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_until<F: FnMut() -> bool>(what: &str, limit: Duration, mut f: F) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn portal_through_the_wan_emulator_with_the_cli() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hub = Daemon::start(&dirs.0.path().join("hub"), &["--region", "eu", "--drive-size", "128MiB"]);
    let spoke = Daemon::start(&dirs.1.path().join("spoke"), &["--region", "eu", "--drive-size", "128MiB"]);
    let emu = Emulator::start(&hub.fabric, 15);

    let shard = bytes(1, 6 << 20);
    put(&hub, "/datasets/imagenet/shard-0000.tar", &shard);
    put(&hub, "/datasets/imagenet/labels.json", b"{\"cat\": 1}");
    put(&hub, "/private/keys", b"secret");
    let hub_fp = ok_json(aquifer(&hub.rest, &["portal", "identity", "--json"]), "identity")["fingerprint"].as_str().unwrap().to_string();

    // Spoke proposes (through the emulator), hub lists it pending and authorizes it.
    let created = ok_json(
        aquifer(&spoke.rest, &["portal", "create", "--hub", &emu.addr, "--hub-path", "/datasets", "--spoke-path", "/datasets", "--hub-fingerprint", &hub_fp, "--json"]),
        "portal create",
    );
    let id = created["id"].as_str().unwrap().to_string();
    let listed = ok_json(aquifer(&hub.rest, &["portal", "list", "--json"]), "hub portal list");
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["state"], "pending");
    let (status, msg) = get(&spoke, "/datasets/imagenet/labels.json").unwrap_err();
    assert!(status >= 500 && msg.contains("pending"), "{status} {msg}");
    ok_json(aquifer(&hub.rest, &["portal", "authorize", &id, "--json"]), "authorize");
    wait_until("the portal to be active on the spoke", Duration::from_secs(30), || {
        ok_json(aquifer(&spoke.rest, &["portal", "show", &id, "--json"]), "show")["state"] == "active"
    });

    // Reads through the spoke: REST, then S3 (same namespace), bit-exact.
    assert_eq!(get(&spoke, "/datasets/imagenet/labels.json").unwrap(), b"{\"cat\": 1}");
    assert_eq!(get(&spoke, "/datasets/imagenet/shard-0000.tar").unwrap(), shard);
    let listing: Value = spoke
        .client()
        .get(spoke.url("/api/v1/dirs/datasets/imagenet"))
        .basic_auth("admin", Some(ADMIN_PASSWORD))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(listing.to_string().contains("shard-0000.tar"), "{listing}");
    // Nothing outside the portal's hub directory is reachable.
    assert!(get(&spoke, "/datasets/../private/keys").is_err());
    assert_eq!(get(&spoke, "/private/keys").unwrap_err().0, 404);

    // Writes on a read-only portal are refused; a change on the hub shows up on the spoke.
    let r = spoke.client().put(spoke.url("/api/v1/files/datasets/new")).basic_auth("admin", Some(ADMIN_PASSWORD)).body("x").send().unwrap();
    assert_eq!(r.status().as_u16(), 403);
    put(&hub, "/datasets/imagenet/labels.json", b"{\"cat\": 2}");
    wait_until("the new version on the spoke", Duration::from_secs(10), || get(&spoke, "/datasets/imagenet/labels.json").is_ok_and(|b| b == b"{\"cat\": 2}"));

    // Cut the link: after the lease the spoke refuses rather than serving stale bytes.
    assert!(emu.control("cut").starts_with("ok"));
    put(&hub, "/datasets/imagenet/labels.json", b"{\"cat\": 3}");
    std::thread::sleep(Duration::from_millis(fabric::LEASE_MS_DEFAULT + 2000));
    match get(&spoke, "/datasets/imagenet/labels.json") {
        Err((503, m)) => assert!(m.contains("lease") || m.contains("unreachable"), "{m}"),
        other => panic!("after the lease ran out: {other:?}"),
    }
    assert!(emu.control("restore").starts_with("ok"));
    wait_until("recovery after the link is back", Duration::from_secs(30), || get(&spoke, "/datasets/imagenet/labels.json").is_ok_and(|b| b == b"{\"cat\": 3}"));

    // Delete on the spoke: the hub forgets it, the spoke directory is empty again.
    let out = aquifer(&spoke.rest, &["portal", "delete", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(ok_json(aquifer(&hub.rest, &["portal", "list", "--json"]), "list").as_array().unwrap().is_empty());
    assert_eq!(get(&spoke, "/datasets/imagenet/labels.json").unwrap_err().0, 404);
    let audit = ok_json(aquifer(&hub.rest, &["audit", "--json"]), "audit");
    let actions: Vec<&str> = audit.as_array().unwrap().iter().map(|r| r["action"].as_str().unwrap()).collect();
    for a in ["portal.propose", "portal.authorize", "portal.withdraw"] {
        assert!(actions.contains(&a), "{a} missing from {actions:?}");
    }
}

#[test]
fn residency_label_refuses_a_portal_to_another_region() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hub = Daemon::start(&dirs.0.path().join("hub"), &["--region", "eu", "--drive-size", "64MiB"]);
    let spoke = Daemon::start(&dirs.1.path().join("spoke"), &["--region", "us", "--drive-size", "64MiB"]);
    put(&hub, "/patients/scan1", b"phi");
    let out = aquifer(&hub.rest, &["residency", "set", "/patients", "eu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = aquifer(&spoke.rest, &["portal", "create", "--hub", &hub.fabric, "--hub-path", "/patients", "--spoke-path", "/patients"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("403") && err.contains("residency"), "{err}");
    assert!(ok_json(aquifer(&hub.rest, &["portal", "list", "--json"]), "list").as_array().unwrap().is_empty());
    assert!(ok_json(aquifer(&spoke.rest, &["portal", "list", "--json"]), "list").as_array().unwrap().is_empty());
    let audit = ok_json(aquifer(&hub.rest, &["audit", "--json"]), "audit");
    assert!(audit.as_array().unwrap().iter().any(|r| r["action"] == "portal.refused" && r["outcome"].as_str().unwrap().contains("residency")), "{audit}");
    // The label itself is admin-only and shows in the API.
    let label = ok_json(aquifer(&hub.rest, &["residency", "get", "/patients", "--json"]), "get");
    assert_eq!(label["label"], "eu");
}

#[test]
fn read_write_portal_takes_nfs_writes_to_the_hub() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hub = Daemon::start(&dirs.0.path().join("hub"), &["--drive-size", "64MiB"]);
    let spoke = Daemon::start(&dirs.1.path().join("spoke"), &["--drive-size", "64MiB"]);
    put(&hub, "/shared/readme.txt", b"from the hub");
    let created = ok_json(aquifer(&spoke.rest, &["portal", "create", "--hub", &hub.fabric, "--hub-path", "/shared", "--spoke-path", "/shared", "--mode", "rw", "--json"]), "create");
    let id = created["id"].as_str().unwrap().to_string();
    ok_json(aquifer(&hub.rest, &["portal", "authorize", &id, "--json"]), "authorize");
    wait_until("active", Duration::from_secs(30), || ok_json(aquifer(&spoke.rest, &["portal", "show", &id, "--json"]), "show")["state"] == "active");
    assert_eq!(get(&spoke, "/shared/readme.txt").unwrap(), b"from the hub");

    // The Linux-style NFS client path: CREATE, WRITEs, COMMIT (libnfs nfs-cp).
    let local = dirs.1.path().join("weights.bin");
    let data = bytes(11, 3 << 20);
    std::fs::write(&local, &data).unwrap();
    let port = spoke.nfs.rsplit(':').next().unwrap();
    let url = format!("nfs://127.0.0.1//shared/weights.bin?nfsport={port}&mountport={port}&version=3");
    let out = Command::new("nfs-cp").arg(&local).arg(&url).output().expect("nfs-cp (libnfs-utils)");
    assert!(out.status.success(), "nfs-cp: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(get(&hub, "/shared/weights.bin").unwrap(), data, "the hub does not have what NFS wrote on the spoke");
    assert_eq!(get(&spoke, "/shared/weights.bin").unwrap(), data);
}
