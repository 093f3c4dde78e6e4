//! NFS exports managed at run time: `/api/v1/exports` and `aquifer exports` against a real
//! daemon, checked with libnfs's `nfs-ls` / `nfs-cp` (a client allowed mounts, one not in the
//! list is refused, read-only holds, a removed export is refused, exports survive a restart),
//! plus the refusals for bad input.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::{Value, json};

fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(program);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap_or_else(|e| panic!("run {program} ({e}); install libnfs-utils (scripts/deps.sh does)"))
}

fn nfs_url(d: &Daemon, path: &str) -> String {
    let port = d.nfs.rsplit(':').next().unwrap();
    format!("nfs://127.0.0.1{path}?nfsport={port}&mountport={port}&version=3")
}

fn nfs_ls(d: &Daemon, dir: &str) -> Output {
    run("nfs-ls", &[&nfs_url(d, dir)], &[])
}

fn cli(d: &Daemon, args: &[&str]) -> Output {
    run(bin().to_str().unwrap(), args, &[("AQUIFER_REST", &d.rest), ("AQUIFER_PASSWORD", ADMIN_PASSWORD)])
}

fn ok(o: Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: {}\n{}{}", o.status, String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A JSON admin call: (status, body or Null).
fn api(d: &Daemon, method: &str, path: &str, body: Option<Value>, user: (&str, &str)) -> (u16, Value) {
    let mut rb = d.client().request(method.parse().unwrap(), d.url(&format!("/api/v1/{path}"))).basic_auth(user.0, Some(user.1));
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (status, if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) })
}

const ADMIN: (&str, &str) = ("admin", ADMIN_PASSWORD);

fn start(data: &Path, config: &Path) -> Daemon {
    Daemon::start(data, &["--drive-size", "64MiB", "--config", config.to_str().unwrap()])
}

#[test]
fn exports_added_over_rest_are_served_at_once_changed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("aquifer.toml");
    // The configuration exports / to another host only: this machine reaches nothing through it.
    std::fs::write(
        &config,
        "[listen]\nsmb = \"127.0.0.1:0\"\n[fabric]\nlisten = \"127.0.0.1:0\"\n\
         [[exports]]\npath = \"/\"\nclients = [\"10.9.9.9\"]\n",
    )
    .unwrap();
    let data_dir = dir.path().join("data");
    let d = start(&data_dir, &config);
    let payload = bytes(7, 300_000);
    let r = d.client().put(d.url("/api/v1/files/proj/a.bin")).basic_auth("admin", Some(ADMIN_PASSWORD)).body(payload.clone()).send().unwrap();
    assert!(r.status().is_success(), "REST put: {}", r.status());
    d.client().put(d.url("/api/v1/files/notadir")).basic_auth("admin", Some(ADMIN_PASSWORD)).body("x").send().unwrap();

    assert!(!nfs_ls(&d, "/proj/").status.success(), "no export lets 127.0.0.1 in yet");

    // Added for another network: still refused.
    let (st, e) = api(&d, "POST", "exports", Some(json!({ "path": "/proj", "clients": ["10.1.2.0/24"] })), ADMIN);
    assert_eq!(st, 201, "{e}");
    let id = e["id"].as_str().unwrap().to_string();
    assert_eq!((e["source"].as_str(), e["root_squash"].as_bool(), e["read_only"].as_bool()), (Some("api"), Some(true), Some(false)));
    assert!(!nfs_ls(&d, "/proj/").status.success(), "a client not in the export's list is refused");

    // Let this machine in, read-only, through the CLI: mounts and reads, but cannot write.
    let out = ok(cli(&d, &["exports", "set", "/proj", "--clients", "127.0.0.1", "--read-only", "on", "--root-squash", "off"]), "exports set");
    assert!(out.contains(&id) && out.contains("ro"), "{out}");
    let listing = ok(nfs_ls(&d, "/proj/"), "nfs-ls of the new export");
    assert!(listing.contains("a.bin"), "{listing}");
    let back = work.path().join("back.bin");
    ok(run("nfs-cp", &[&nfs_url(&d, "/proj/a.bin"), back.to_str().unwrap()], &[]), "nfs-cp out");
    assert_eq!(std::fs::read(&back).unwrap(), payload, "bytes read over the new export");
    let local = work.path().join("in.bin");
    std::fs::write(&local, bytes(8, 5000)).unwrap();
    assert!(!run("nfs-cp", &[local.to_str().unwrap(), &nfs_url(&d, "/proj/in.bin")], &[]).status.success(), "read-only export refuses writes");

    // Writable: the write lands in the namespace.
    let (st, e) = api(&d, "PATCH", &format!("exports/{id}"), Some(json!({ "read_only": false })), ADMIN);
    assert_eq!((st, e["read_only"].as_bool()), (200, Some(false)), "{e}");
    ok(run("nfs-cp", &[local.to_str().unwrap(), &nfs_url(&d, "/proj/in.bin")], &[]), "nfs-cp in");
    let r = d.client().get(d.url("/api/v1/files/proj/in.bin")).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert_eq!(r.bytes().unwrap().to_vec(), bytes(8, 5000));

    // Listed beside the configuration's export, over REST and the CLI.
    let (st, list) = api(&d, "GET", "exports", None, ADMIN);
    assert_eq!(st, 200);
    let paths: Vec<(&str, &str)> = list.as_array().unwrap().iter().map(|e| (e["path"].as_str().unwrap(), e["source"].as_str().unwrap())).collect();
    assert_eq!(paths, vec![("/", "config"), ("/proj", "api")]);
    let out = ok(cli(&d, &["exports"]), "exports list");
    assert!(out.contains("/proj") && out.contains("127.0.0.1") && out.contains("config"), "{out}");

    // Bad input: clear refusals, nothing changed.
    let (st, e) = api(&d, "POST", "users", Some(json!({ "name": "dave", "password": "dave-password-1" })), ADMIN);
    assert_eq!(st, 201, "{e}");
    for (method, path, body, want) in [
        ("POST", "exports".to_string(), json!({ "path": "proj", "clients": ["*"] }), 400),
        ("POST", "exports".to_string(), json!({ "path": "/proj/../etc", "clients": ["*"] }), 400),
        ("POST", "exports".to_string(), json!({ "path": "/proj", "clients": ["not-an-address"] }), 400),
        ("POST", "exports".to_string(), json!({ "path": "/proj", "clients": ["10.0.0.0/33"] }), 400),
        ("POST", "exports".to_string(), json!({ "path": "/proj", "clients": [] }), 400),
        ("POST", "exports".to_string(), json!({ "path": "/proj", "clients": ["*"], "squash": true }), 422),
        ("POST", "exports".to_string(), json!({ "path": "/missing", "clients": ["*"] }), 404),
        ("POST", "exports".to_string(), json!({ "path": "/notadir", "clients": ["*"] }), 400),
        ("POST", "exports".to_string(), json!({ "path": "/proj/", "clients": ["*"] }), 409),
        ("PATCH", format!("exports/{id}"), json!({ "clients": ["bad/8"] }), 400),
        ("PATCH", "exports/%2F".to_string(), json!({ "read_only": true }), 409),
        ("DELETE", "exports/00000000".to_string(), Value::Null, 404),
    ] {
        let body = if body.is_null() { None } else { Some(body) };
        let (st, e) = api(&d, method, &path, body.clone(), ADMIN);
        assert_eq!(st, want, "{method} {path} {body:?}: {e}");
    }
    let (st, _) = api(&d, "DELETE", &format!("exports/{id}"), None, ("dave", "dave-password-1"));
    assert_eq!(st, 403, "only admins change exports");
    let (st, _) = api(&d, "GET", "exports", None, ("dave", "dave-password-1"));
    assert_eq!(st, 403);
    let (_, after) = api(&d, "GET", &format!("exports/{id}"), None, ADMIN);
    assert_eq!((after["clients"].clone(), after["read_only"].as_bool()), (json!(["127.0.0.1"]), Some(false)), "refusals changed nothing");

    // Kept across a restart.
    d.stop();
    let d = start(&data_dir, &config);
    ok(nfs_ls(&d, "/proj/"), "nfs-ls after a restart");

    // Removed: refused again, also for directories below it.
    ok(cli(&d, &["exports", "rm", &id]), "exports rm");
    assert!(!nfs_ls(&d, "/proj/").status.success(), "a removed export is refused");
    let (st, _) = api(&d, "GET", &format!("exports/{id}"), None, ADMIN);
    assert_eq!(st, 404);
    let (_, audit) = api(&d, "GET", "audit", None, ADMIN);
    let actions: Vec<&str> = audit.as_array().unwrap().iter().filter_map(|r| r["action"].as_str()).filter(|a| a.starts_with("nfs.export")).collect();
    assert!(actions.contains(&"nfs.export.add") && actions.contains(&"nfs.export.remove"), "{actions:?}");
    d.stop();
}
