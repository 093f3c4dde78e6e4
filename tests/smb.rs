//! SMB 2/3 end to end with Samba's own client (`smbclient -m SMB3`, apt `smbclient`) against
//! real `aquifer serve` daemons: file operations with encryption off and on, shares from the
//! configuration file, accounts from the REST API with the engine's permissions, and bad
//! input (wrong passwords, malformed frames, paths leaving the share) that must leave the
//! daemon serving and the namespace unchanged.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

fn smbclient(d: &Daemon, share: &str, user: &str, password: &str, encrypt: bool, commands: &str) -> Output {
    smbclient_max(d, share, user, password, encrypt, commands, "SMB3")
}

fn smbclient_max(d: &Daemon, share: &str, user: &str, password: &str, encrypt: bool, commands: &str, max_protocol: &str) -> Output {
    let port = d.smb.rsplit(':').next().expect("daemon serves SMB");
    let mut c = Command::new("smbclient");
    c.arg(format!("//127.0.0.1/{share}"))
        .args(["-p", port, "-m", max_protocol, "-U", &format!("{user}%{password}"), "-c", commands])
        // No smb.conf of the machine, no Kerberos attempt.
        .args(["-s", "/dev/null", "--option=client use kerberos=off"]);
    if encrypt {
        c.arg("--option=client smb encrypt=required");
    } else {
        c.arg("--option=client smb encrypt=off");
    }
    c.output().unwrap_or_else(|e| panic!("run smbclient ({e}); install the Debian package smbclient (scripts/deps.sh does)"))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn smb_ok(d: &Daemon, share: &str, encrypt: bool, commands: &str) -> String {
    let o = smbclient(d, share, "admin", ADMIN_PASSWORD, encrypt, commands);
    let t = text(&o);
    assert!(o.status.success() && !t.contains("NT_STATUS_"), "smbclient {commands:?}: {}\n{t}", o.status);
    t
}

fn rest_get(d: &Daemon, path: &str) -> reqwest::blocking::Response {
    d.client().get(d.url(&format!("/api/v1/files/{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap()
}

fn put_get_round_trip(d: &Daemon, encrypt: bool, work: &Path) {
    let tag = if encrypt { "enc" } else { "plain" };
    let data = bytes(if encrypt { 7 } else { 8 }, 5_000_000 + 4321);
    let local = work.join(format!("{tag}.bin"));
    std::fs::write(&local, &data).unwrap();
    let back = work.join(format!("{tag}.back"));
    let listing = smb_ok(
        d,
        "aquifer",
        encrypt,
        &format!(
            "mkdir {tag}; put {} {tag}\\a.bin; rename {tag}\\a.bin {tag}\\b.bin; ls {tag}\\*; get {tag}\\b.bin {}",
            local.display(),
            back.display()
        ),
    );
    let names: Vec<&str> = listing.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.contains(&"b.bin") && !names.contains(&"a.bin"), "{listing}");
    assert!(listing.contains(&data.len().to_string()), "size in the listing: {listing}");
    assert!(std::fs::read(&back).unwrap() == data, "{tag}: get returns what put wrote");
    // The same bytes through REST: one namespace.
    let r = rest_get(d, &format!("{tag}/b.bin"));
    assert_eq!(r.status(), 200);
    assert!(r.bytes().unwrap().as_ref() == &data[..], "{tag}: REST reads what SMB wrote");
    smb_ok(d, "aquifer", encrypt, &format!("rm {tag}\\b.bin; rmdir {tag}"));
    assert_eq!(rest_get(d, &format!("{tag}/b.bin")).status(), 404, "{tag}: rm removed it");
    assert_eq!(rest_get(d, tag).status(), 404, "{tag}: rmdir removed it");
}

#[test]
fn a_full_pool_is_disk_full_to_smb_clients_and_a_delete_gives_the_space_back() {
    // WRITEs are acknowledged from the write buffer; when the write-out behind them finds
    // the pool full, the client must hear STATUS_DISK_FULL (from a later WRITE or from the
    // CLOSE), not an unexpected I/O error and not a CLOSE that reports success.
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "32MiB"]);
    let big = dir.path().join("big.bin");
    std::fs::write(&big, bytes(3, 160 << 20)).unwrap();
    let small = dir.path().join("small.bin");
    let data = bytes(4, 6 << 20);
    std::fs::write(&small, &data).unwrap();
    let t = text(&smbclient(&d, "aquifer", "admin", ADMIN_PASSWORD, false, &format!("put {} big.bin", big.display())));
    assert!(t.contains("NT_STATUS_DISK_FULL") && !t.contains("NT_STATUS_UNEXPECTED_IO_ERROR"), "160 MiB into 128: {t}");
    // Small puts until the pool is full (the failed write-out gave back what it had
    // allocated): 6 MiB fits in the write buffer, so a put whose bytes cannot be kept learns
    // it at the latest from its CLOSE. Every put told success kept its bytes.
    let mut full_at = None;
    for i in 0..30 {
        let t = text(&smbclient(&d, "aquifer", "admin", ADMIN_PASSWORD, false, &format!("put {} small{i}.bin", small.display())));
        assert!(!t.contains("NT_STATUS_UNEXPECTED_IO_ERROR"), "6 MiB put {i}: {t}");
        if t.contains("NT_STATUS_DISK_FULL") {
            full_at = Some(i);
            break;
        }
    }
    let full_at = full_at.expect("180 MiB of puts into a full 128 MiB pool end in STATUS_DISK_FULL");
    let back = dir.path().join("small.back");
    for i in 0..full_at {
        smb_ok(&d, "aquifer", false, &format!("get small{i}.bin {}", back.display()));
        assert!(std::fs::read(&back).unwrap() == data, "put {i} was told success and kept its bytes");
    }
    // Deleting gives the space back at once: the next put is kept, bit-exact.
    let rm: Vec<String> = (0..=full_at).map(|i| format!("rm small{i}.bin")).collect();
    smb_ok(&d, "aquifer", false, &format!("rm big.bin; {}", rm.join("; ")));
    smb_ok(&d, "aquifer", false, &format!("put {} small.bin; get small.bin {}", small.display(), back.display()));
    assert!(std::fs::read(&back).unwrap() == data, "the put after the delete is kept");
}

/// Creates an account through the REST API as the admin.
fn create_user(d: &Daemon, name: &str, password: &str) {
    let r = d
        .client()
        .post(d.url("/api/v1/users"))
        .basic_auth("admin", Some(ADMIN_PASSWORD))
        .json(&serde_json::json!({"name": name, "password": password}))
        .send()
        .unwrap();
    assert!(r.status().is_success(), "create {name}: {}", r.status());
}

#[test]
fn smbclient_file_operations_with_and_without_encryption() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB"]);
    put_get_round_trip(&d, false, work.path());
    put_get_round_trip(&d, true, work.path());
    // SMB 3.1.1 sessions sign with AES-GMAC, which smbclient offers, and smbclient checks
    // every signature it receives (a bad one fails the command); SMB 3.0 signs with AES-CMAC.
    for (max, algo) in [("SMB3", "sign_algo_id=2"), ("SMB3_00", "sign_algo_id=1")] {
        let mut c = Command::new("smbclient");
        c.arg("//127.0.0.1/aquifer").args(["-p", d.smb.rsplit(':').next().unwrap(), "-m", max, "-d", "10"]);
        c.args(["-U", &format!("admin%{ADMIN_PASSWORD}"), "-s", "/dev/null", "--option=client use kerberos=off"]);
        let o = c.args(["--option=client smb encrypt=off", "-c", "ls"]).output().unwrap();
        let t = text(&o);
        assert!(o.status.success() && t.contains(&format!("signed SMB2 message ({algo})")), "{max}: {}", &t[t.len().saturating_sub(3000)..]);
    }
    d.stop();
}

/// smbclient keeps several MiB-sized READs and WRITEs of one transfer in flight, which the
/// server runs concurrently; with four sessions at once (one encrypted, whose requests run in
/// order), every byte must still land where it was written, the CLOSE after a put must not
/// overtake its WRITEs, and a file read while another session rewrites a different one stays
/// bit-exact, through SMB and through REST.
#[test]
fn pipelined_reads_and_writes_of_concurrent_sessions_are_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "128MiB"]);
    // Sizes that end mid-MiB and mid-stripe.
    let files: Vec<(String, Vec<u8>, bool)> = (0..4u64)
        .map(|i| (format!("c{i}.bin"), bytes(100 + i, (9 << 20) + 4096 * i as usize + 17), i == 3))
        .collect();
    for (name, data, _) in &files {
        std::fs::write(work.path().join(name), data).unwrap();
    }
    std::thread::scope(|s| {
        for (name, _, encrypt) in &files {
            let (d, work) = (&d, work.path());
            s.spawn(move || {
                let (local, back) = (work.join(name), work.join(format!("{name}.back")));
                // Put, get, put again over it and get again: WRITEs after READs on one file.
                let cmds = format!(
                    "put {l} {name}; get {name} {b}; put {l} {name}; get {name} {b}2",
                    l = local.display(),
                    b = back.display()
                );
                smb_ok(d, "aquifer", *encrypt, &cmds);
            });
        }
    });
    for (name, data, _) in &files {
        let back = work.path().join(format!("{name}.back"));
        assert!(std::fs::read(&back).unwrap() == *data, "{name}: first get returns what put wrote");
        assert!(std::fs::read(format!("{}2", back.display())).unwrap() == *data, "{name}: second get too");
        let r = rest_get(&d, name);
        assert_eq!(r.status(), 200);
        assert!(r.bytes().unwrap().as_ref() == &data[..], "{name}: REST reads what SMB wrote");
    }
    d.stop();
}

#[test]
fn shares_from_the_config_file_enforce_read_only_and_encryption() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("aquifer.toml");
    std::fs::write(
        &config,
        "[listen]\nsmb = \"127.0.0.1:0\"\n\
         [[shares]]\nname = \"all\"\npath = \"/\"\n\
         [[shares]]\nname = \"proj\"\npath = \"/projects\"\n\
         [[shares]]\nname = \"ro\"\npath = \"/projects\"\nread_only = true\n\
         [[shares]]\nname = \"secret\"\npath = \"/projects\"\nencrypt = true\n",
    )
    .unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB", "--config", config.to_str().unwrap()]);
    let local = work.path().join("x.txt");
    std::fs::write(&local, b"inside the share\n").unwrap();
    smb_ok(&d, "all", false, &format!("mkdir projects; put {} outside.txt", local.display()));
    smb_ok(&d, "proj", false, &format!("put {} x.txt", local.display()));
    // The share's root is /projects: x.txt is there, outside.txt is not reachable.
    assert_eq!(rest_get(&d, "projects/x.txt").status(), 200);
    let ls = smb_ok(&d, "proj", false, "ls");
    assert!(ls.contains("x.txt") && !ls.contains("outside.txt"), "{ls}");

    // Read-only: reads work, writes are refused and change nothing.
    let back = work.path().join("x.back");
    smb_ok(&d, "ro", false, &format!("get x.txt {}", back.display()));
    assert_eq!(std::fs::read(&back).unwrap(), b"inside the share\n");
    let o = smbclient(&d, "ro", "admin", ADMIN_PASSWORD, false, &format!("put {} new.txt", local.display()));
    assert!(text(&o).contains("NT_STATUS_ACCESS_DENIED") || text(&o).contains("NT_STATUS_MEDIA_WRITE_PROTECTED"), "{}", text(&o));
    assert_eq!(rest_get(&d, "projects/new.txt").status(), 404);

    // Encryption required: SMB 2.1 cannot encrypt and gets no tree (smbclient's SMB 3 turns
    // encryption on by itself when the share asks); an encrypted SMB 3 session works.
    let o = smbclient_max(&d, "secret", "admin", ADMIN_PASSWORD, false, "ls", "SMB2");
    assert!(text(&o).contains("NT_STATUS_ACCESS_DENIED"), "{}", text(&o));
    smb_ok(&d, "proj", false, "ls");
    let ls = smb_ok(&d, "secret", true, "ls");
    assert!(ls.contains("x.txt"), "{ls}");
    d.stop();
}

/// Waits out the SMB user table's sync (every second) after an account change. Not a retry
/// loop: failed logons count toward the server's lockout.
fn smb_as(d: &Daemon, user: &str, password: &str, commands: &str) -> String {
    text(&smbclient(d, "aquifer", user, password, false, commands))
}

fn account_sync() {
    std::thread::sleep(Duration::from_millis(2500));
}

#[test]
fn accounts_log_in_with_their_password_and_act_with_their_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB"]);
    let c = d.client();
    create_user(&d, "alice", "alice-password-1");
    account_sync();
    // A home for alice, owned by her; the root stays admin's.
    let local = work.path().join("a.txt");
    std::fs::write(&local, b"alice's file\n").unwrap();
    smb_ok(&d, "aquifer", false, "mkdir home; mkdir home\\alice");
    let uid = c.get(d.url("/api/v1/users/alice")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().json::<serde_json::Value>().unwrap()["uid"].as_u64().unwrap();
    // chown over SFTP (SMB has no POSIX owners to set).
    let o = sftp_as(&d, "admin", ADMIN_PASSWORD, &format!("chown {uid} /home/alice\n"), work.path());
    assert!(o.status.success(), "chown home/alice: {}", text(&o));
    let t = smb_as(&d, "alice", "alice-password-1", &format!("put {} home\\alice\\a.txt; ls home\\alice\\*", local.display()));
    assert!(t.contains("a.txt") && !t.contains("NT_STATUS_"), "alice writes her home: {t}");
    let t = smb_as(&d, "alice", "alice-password-1", &format!("put {} intruder.txt", local.display()));
    assert!(t.contains("NT_STATUS_ACCESS_DENIED"), "alice may not write the admin's root: {t}");
    assert_eq!(rest_get(&d, "intruder.txt").status(), 404);

    // Wrong password: refused.
    let t = smb_as(&d, "alice", "not-her-password", "ls");
    assert!(t.contains("NT_STATUS_LOGON_FAILURE"), "{t}");
    // A new password takes over from the old one.
    let r = c
        .patch(d.url("/api/v1/users/alice"))
        .basic_auth("admin", Some(ADMIN_PASSWORD))
        .json(&serde_json::json!({"password": "alice-password-2"}))
        .send()
        .unwrap();
    assert!(r.status().is_success());
    account_sync();
    let t = smb_as(&d, "alice", "alice-password-2", "ls home\\alice\\*");
    assert!(t.contains("a.txt"), "new password: {t}");
    let t = smb_as(&d, "alice", "alice-password-1", "ls");
    assert!(t.contains("NT_STATUS_LOGON_FAILURE"), "old password after the change: {t}");
    // A deleted account cannot log in.
    let r = c.delete(d.url("/api/v1/users/alice")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert!(r.status().is_success());
    account_sync();
    let t = smb_as(&d, "alice", "alice-password-2", "ls");
    assert!(t.contains("NT_STATUS_LOGON_FAILURE"), "deleted account: {t}");
    // Guest is off: no anonymous or guest session reaches a share.
    let t = text(&smbclient(&d, "aquifer", "guest", "", false, "ls"));
    assert!(t.contains("NT_STATUS_"), "guest: {t}");
    let o = Command::new("smbclient")
        .args(["//127.0.0.1/aquifer", "-p", d.smb.rsplit(':').next().unwrap(), "-m", "SMB3", "-N", "-s", "/dev/null", "-c", "ls"])
        .output()
        .unwrap();
    assert!(text(&o).contains("NT_STATUS_"), "anonymous: {}", text(&o));
    d.stop();
}

/// Sends `frame` on a fresh connection and reads until the server closes it or answers.
fn send_raw(addr: &str, frame: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
    let _ = s.write_all(frame);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[test]
fn bad_input_gets_an_error_or_a_closed_connection_and_the_daemon_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB"]);
    smb_ok(&d, "aquifer", false, "mkdir keep");

    // A NetBIOS length of 16 MiB, with nothing behind it.
    assert!(send_raw(&d.smb, &[0x00, 0xff, 0xff, 0xff]).is_empty(), "oversized length");
    // A session message type that is not 0, a header cut short, garbage where the SMB2 magic
    // should be.
    send_raw(&d.smb, &[0x85, 0, 0, 0]);
    let truncated = [&[0u8, 0, 0, 20][..], &[0xfe, b'S', b'M', b'B', 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0][..]].concat();
    let r = send_raw(&d.smb, &truncated);
    assert!(r.is_empty(), "truncated header must close the connection, got {} bytes", r.len());
    let mut garbage = vec![0u8, 0, 1, 0];
    garbage.extend(bytes(3, 256));
    assert!(send_raw(&d.smb, &garbage).is_empty(), "garbage");

    // Paths leaving the share: smbclient folds `..` itself, so this reaches the server as
    // \etc\passwd inside the share (the server's path parser refuses `..` outright).
    let t = text(&smbclient(&d, "aquifer", "admin", ADMIN_PASSWORD, false, "get ..\\..\\etc\\passwd /dev/null"));
    assert!(t.contains("NT_STATUS_OBJECT_PATH_NOT_FOUND") || t.contains("NT_STATUS_OBJECT_NAME_INVALID"), "{t}");
    // Missing files and directories get the Windows statuses.
    let t = text(&smbclient(&d, "aquifer", "admin", ADMIN_PASSWORD, false, "get nothing-here /dev/null"));
    assert!(t.contains("NT_STATUS_OBJECT_NAME_NOT_FOUND"), "{t}");
    let t = text(&smbclient(&d, "aquifer", "admin", ADMIN_PASSWORD, false, "get no-dir\\x /dev/null"));
    assert!(t.contains("NT_STATUS_OBJECT_PATH_NOT_FOUND"), "{t}");
    let t = text(&smbclient(&d, "aquifer", "admin", "wrong-password", false, "ls"));
    assert!(t.contains("NT_STATUS_LOGON_FAILURE"), "{t}");

    // Still serving, and nothing changed.
    let ls = smb_ok(&d, "aquifer", false, "ls");
    assert!(ls.contains("keep"), "{ls}");
    let local = work.path().join("after.txt");
    std::fs::write(&local, b"after the bad input\n").unwrap();
    smb_ok(&d, "aquifer", true, &format!("put {} keep\\after.txt", local.display()));
    assert_eq!(rest_get(&d, "keep/after.txt").bytes().unwrap().as_ref(), b"after the bad input\n");
    d.stop();
}

/// An admin JSON call to the REST API: (status, body or Null).
fn api(d: &Daemon, method: &str, path: &str, body: Option<serde_json::Value>, user: (&str, &str)) -> (u16, serde_json::Value) {
    let mut rb = d.client().request(method.parse().unwrap(), d.url(&format!("/api/v1/{path}"))).basic_auth(user.0, Some(user.1));
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().unwrap();
    let status = r.status().as_u16();
    let t = r.text().unwrap();
    (status, if t.is_empty() { serde_json::Value::Null } else { serde_json::from_str(&t).unwrap_or(serde_json::Value::String(t)) })
}

fn cli(d: &Daemon, args: &[&str]) -> String {
    let o = Command::new(bin()).args(args).env("AQUIFER_REST", &d.rest).env("AQUIFER_PASSWORD", ADMIN_PASSWORD).output().unwrap();
    assert!(o.status.success(), "aquifer {args:?}: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// smbclient as admin on `share` until the server has applied a share change (it does at once;
/// the wait covers the request racing the server's task). Tree connects do not count toward
/// the logon lockout.
fn smb_when(d: &Daemon, share: &str, commands: &str, done: impl Fn(&str) -> bool) -> String {
    let mut t = String::new();
    for _ in 0..20 {
        t = text(&smbclient(d, share, "admin", ADMIN_PASSWORD, false, commands));
        if done(&t) {
            return t;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("smbclient //{share} {commands:?}: {t}");
}

#[test]
fn shares_added_through_rest_and_the_cli_are_served_at_once_and_kept() {
    const ADMIN: (&str, &str) = ("admin", ADMIN_PASSWORD);
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = Daemon::start(&data, &["--drive-size", "64MiB"]);
    let local = work.path().join("p.txt");
    std::fs::write(&local, b"project file\n").unwrap();
    smb_ok(&d, "aquifer", false, &format!("mkdir projects; put {} projects\\p.txt; put {} top.txt", local.display(), local.display()));
    let (st, list) = api(&d, "GET", "shares", None, ADMIN);
    assert_eq!(st, 200);
    assert_eq!(list, serde_json::json!([{"name": "aquifer", "path": "/", "read_only": false, "guest": false, "encrypt": false, "leases": false, "source": "config"}]));

    // A read-only share of /projects, served without a restart.
    let (st, v) = api(&d, "POST", "shares", Some(serde_json::json!({"name": "Proj", "path": "/projects", "read_only": true})), ADMIN);
    assert_eq!((st, v["source"].as_str()), (201, Some("api")), "{v}");
    let ls = smb_when(&d, "proj", "ls", |t| !t.contains("NT_STATUS_"));
    assert!(ls.contains("p.txt") && !ls.contains("top.txt"), "{ls}");
    let t = text(&smbclient(&d, "proj", "admin", ADMIN_PASSWORD, false, &format!("put {} new.txt", local.display())));
    assert!(t.contains("NT_STATUS_ACCESS_DENIED") || t.contains("NT_STATUS_MEDIA_WRITE_PROTECTED"), "{t}");

    // Refusals change nothing.
    let (st, _) = api(&d, "POST", "users", Some(serde_json::json!({"name": "bob", "password": "bob-password-1"})), ADMIN);
    assert_eq!(st, 201);
    for (method, path, body, user, want) in [
        ("POST", "shares", serde_json::json!({"name": "proj", "path": "/"}), ADMIN, 409),
        ("POST", "shares", serde_json::json!({"name": "x", "path": "/missing"}), ADMIN, 400),
        ("POST", "shares", serde_json::json!({"name": "x", "path": "/top.txt"}), ADMIN, 400),
        ("POST", "shares", serde_json::json!({"name": "x y", "path": "/"}), ADMIN, 400),
        ("POST", "shares", serde_json::json!({"name": "x", "path": "/projects/../"}), ADMIN, 400),
        ("POST", "shares", serde_json::json!({"name": "x", "path": "/", "bogus": 1}), ADMIN, 422),
        ("POST", "shares", serde_json::json!({"name": "x", "path": "/"}), ("bob", "bob-password-1"), 403),
        ("PATCH", "shares/aquifer", serde_json::json!({"read_only": true}), ADMIN, 409),
        ("PATCH", "shares/nope", serde_json::json!({"read_only": true}), ADMIN, 404),
        ("PATCH", "shares/proj", serde_json::json!({"path": "relative"}), ADMIN, 400),
        ("DELETE", "shares/aquifer", serde_json::Value::Null, ADMIN, 409),
        ("DELETE", "shares/proj", serde_json::Value::Null, ("bob", "bob-password-1"), 403),
    ] {
        let (st, v) = api(&d, method, path, (!body.is_null()).then_some(body.clone()), user);
        assert_eq!(st, want, "{method} {path} {body}: {v}");
    }
    let (_, after) = api(&d, "GET", "shares", None, ADMIN);
    assert_eq!(after.as_array().unwrap().len(), 2, "{after}");
    assert_eq!(api(&d, "GET", "shares/PROJ", None, ADMIN).1["read_only"], true);

    // Writable after a change through the CLI; the CLI lists both sources.
    let out = cli(&d, &["shares", "set", "proj", "--read-only", "off"]);
    assert!(out.contains("proj") || out.contains("Proj"), "{out}");
    smb_when(&d, "proj", &format!("put {} new.txt", local.display()), |t| !t.contains("NT_STATUS_"));
    assert_eq!(rest_get(&d, "projects/new.txt").status(), 200);
    let out = cli(&d, &["shares", "add", "top", "/", "--encrypt"]);
    assert!(out.contains("encrypt"), "{out}");
    let out = cli(&d, &["shares"]);
    assert!(out.contains("aquifer") && out.contains("config") && out.contains("Proj") && out.contains("top"), "{out}");
    let ls = smb_when(&d, "top", "ls", |t| !t.contains("NT_STATUS_"));
    assert!(ls.contains("top.txt"), "{ls}");
    let t = text(&smbclient_max(&d, "top", "admin", ADMIN_PASSWORD, false, "ls", "SMB2"));
    assert!(t.contains("NT_STATUS_ACCESS_DENIED"), "encryption required on the added share: {t}");

    // Kept across a restart.
    d.stop();
    let d = Daemon::start(&data, &["--drive-size", "64MiB"]);
    let ls = smb_ok(&d, "proj", false, "ls");
    assert!(ls.contains("new.txt"), "{ls}");
    // Removed: clients are refused, the directory stays.
    cli(&d, &["shares", "rm", "proj"]);
    assert_eq!(api(&d, "DELETE", "shares/top", None, ADMIN).0, 204);
    smb_when(&d, "proj", "ls", |t| t.contains("NT_STATUS_BAD_NETWORK_NAME"));
    assert_eq!(rest_get(&d, "projects/p.txt").status(), 200);
    let (_, list) = api(&d, "GET", "shares", None, ADMIN);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    let audit = api(&d, "GET", "audit", None, ADMIN).1.to_string();
    assert!(audit.contains("smb.share.add") && audit.contains("smb.share.remove"), "{audit}");
    d.stop();
}

/// `smbclient hardlink` (SET_INFO FileLinkInformation): a second name of the same file, seen
/// over REST; an existing name collides, a directory has no links, and removing one name
/// keeps the other.
#[test]
fn hard_links_are_second_names_of_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB"]);
    let first = work.path().join("first.txt");
    let second = work.path().join("second.txt");
    std::fs::write(&first, b"first version").unwrap();
    std::fs::write(&second, b"second version, longer").unwrap();
    smb_ok(&d, "aquifer", false, &format!("mkdir links; put {} links\\a.txt; hardlink links\\a.txt links\\b.txt", first.display()));
    assert_eq!(rest_get(&d, "links/b.txt").bytes().unwrap().as_ref(), b"first version");
    // Rewriting the file through one name changes what the other shows.
    smb_ok(&d, "aquifer", false, &format!("put {} links\\a.txt", second.display()));
    assert_eq!(rest_get(&d, "links/b.txt").bytes().unwrap().as_ref(), b"second version, longer");
    for (commands, status) in [
        ("hardlink links\\a.txt links\\b.txt", "NT_STATUS_OBJECT_NAME_COLLISION"),
        ("mkdir links\\sub; hardlink links\\sub links\\sub2", "NT_STATUS_FILE_IS_A_DIRECTORY"),
    ] {
        let t = text(&smbclient(&d, "aquifer", "admin", ADMIN_PASSWORD, false, commands));
        assert!(t.contains(status), "{commands}: {t}");
    }
    assert_eq!(rest_get(&d, "links/sub2").status(), 404, "no link to a directory was made");
    smb_ok(&d, "aquifer", false, "rm links\\a.txt");
    assert_eq!(rest_get(&d, "links/a.txt").status(), 404);
    assert_eq!(rest_get(&d, "links/b.txt").bytes().unwrap().as_ref(), b"second version, longer", "the other name stays");
}

/// `smbcacls` (apt `smbclient`) reaches only port 445, so the daemon of this test serves SMB
/// on port 445 of a loopback address of its own, not 127.0.0.1.
fn loopback_address_on_445() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let n = std::process::id() ^ nanos;
    format!("127.{}.{}.{}:445", 1 + n % 250, (n >> 8) % 256, 1 + (n >> 16) % 250)
}

fn smbcacls(d: &Daemon, user: &str, password: &str, path: &str, args: &[&str]) -> String {
    let host = d.smb.rsplit_once(':').expect("daemon serves SMB").0;
    let o = Command::new("smbcacls")
        .args([&format!("//{host}/aquifer"), path, "-U", &format!("{user}%{password}"), "--numeric"])
        .args(["-s", "/dev/null", "--option=client use kerberos=off"])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run smbcacls ({e}); install the Debian package smbclient (scripts/deps.sh does)"));
    text(&o)
}

/// Mode, uid and gid of `path` as the engine has them (REST file headers).
fn mode_uid_gid(d: &Daemon, path: &str) -> (String, u64, u64) {
    let r = d.client().head(d.url(&format!("/api/v1/files/{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert!(r.status().is_success(), "HEAD {path}: {}", r.status());
    let h = |name: &str| r.headers()[name].to_str().unwrap().to_string();
    (h("x-aquifer-mode"), h("x-aquifer-uid").parse().unwrap(), h("x-aquifer-gid").parse().unwrap())
}

/// Security descriptors (QUERY_INFO and SET_INFO SMB2_0_INFO_SECURITY) through `smbcacls`:
/// the owner, group and mode bits shown as Unix user and group SIDs and a DACL for owner,
/// group and Everyone; a DACL of that shape set back as mode bits, under the engine's rules
/// (only the owner or an admin changes the mode, only an admin the owner); a DACL with other
/// SIDs or an owner that is no Unix user changes nothing.
#[test]
fn smbcacls_shows_and_sets_owner_group_and_mode() {
    let dir = tempfile::tempdir().unwrap();
    let addr = loopback_address_on_445();
    let d = Daemon::start(&dir.path().join("data"), &["--drive-size", "64MiB", "--smb", &addr]);
    let c = d.client();
    let r = c.put(d.url("/api/v1/files/acl.txt")).basic_auth("admin", Some(ADMIN_PASSWORD)).body("some text").send().unwrap();
    assert!(r.status().is_success(), "PUT acl.txt: {}", r.status());
    create_user(&d, "alice", "alice-password-1");
    let alice = c.get(d.url("/api/v1/users/alice")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap().json::<serde_json::Value>().unwrap()["uid"].as_u64().unwrap();
    account_sync();
    let admin = |args: &[&str]| smbcacls(&d, "admin", ADMIN_PASSWORD, "acl.txt", args);

    // rw-r--r-- as Samba shows it: owner FILE_GENERIC_READ|WRITE and DELETE, the others
    // FILE_GENERIC_READ.
    assert_eq!(mode_uid_gid(&d, "acl.txt"), ("0644".to_string(), 0, 0));
    let t = admin(&[]);
    for line in [
        "OWNER:S-1-22-1-0",
        "GROUP:S-1-22-2-0",
        "ACL:S-1-22-1-0:0/0x0/0x0013019f",
        "ACL:S-1-22-2-0:0/0x0/0x00120089",
        "ACL:S-1-1-0:0/0x0/0x00120089",
    ] {
        assert!(t.lines().any(|l| l == line), "{line} in:\n{t}");
    }
    assert_eq!(t.lines().filter(|l| l.starts_with("ACL:")).count(), 3, "{t}");

    // Alice may read the file but not change its DACL.
    let t = smbcacls(&d, "alice", "alice-password-1", "acl.txt", &["--modify", "ACL:S-1-1-0:ALLOWED/0x0/FULL"]);
    assert!(t.contains("NT_STATUS_ACCESS_DENIED"), "{t}");
    assert_eq!(mode_uid_gid(&d, "acl.txt").0, "0644");

    // The admin sets a DACL of the three ACEs (READ is smbcacls' read and execute).
    let t = admin(&["--set", "ACL:S-1-22-1-0:ALLOWED/0x0/FULL,ACL:S-1-22-2-0:ALLOWED/0x0/READ,ACL:S-1-1-0:ALLOWED/0x0/0x0"]);
    assert!(!t.contains("NT_STATUS_"), "{t}");
    assert_eq!(mode_uid_gid(&d, "acl.txt").0, "0750");
    assert!(admin(&[]).lines().any(|l| l == "ACL:S-1-22-2-0:0/0x0/0x001200a9"));
    // An ACE for another SID has no mode bits: refused, nothing changes.
    let t = admin(&["--add", "ACL:S-1-5-11:ALLOWED/0x0/READ"]);
    assert!(t.contains("NT_STATUS_NOT_SUPPORTED"), "{t}");
    assert_eq!(mode_uid_gid(&d, "acl.txt").0, "0750");
    // An owner that is not a Unix user SID.
    let t = admin(&["--chown", "S-1-1-0"]);
    assert!(t.contains("NT_STATUS_INVALID_OWNER"), "{t}");

    // The admin gives the file to alice, who then sets its mode herself.
    let t = admin(&["--chown", &format!("S-1-22-1-{alice}")]);
    assert!(!t.contains("NT_STATUS_"), "{t}");
    assert_eq!(mode_uid_gid(&d, "acl.txt"), ("0750".to_string(), alice, 0));
    let t = smbcacls(&d, "alice", "alice-password-1", "acl.txt", &["--modify", "ACL:S-1-1-0:ALLOWED/0x0/READ"]);
    assert!(!t.contains("NT_STATUS_"), "{t}");
    assert_eq!(mode_uid_gid(&d, "acl.txt").0, "0755");
    // But she cannot give it away.
    let t = smbcacls(&d, "alice", "alice-password-1", "acl.txt", &["--chown", "S-1-22-1-0"]);
    assert!(t.contains("NT_STATUS_ACCESS_DENIED"), "{t}");
    assert_eq!(mode_uid_gid(&d, "acl.txt").1, alice);
    d.stop();
}
