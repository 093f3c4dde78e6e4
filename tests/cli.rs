//! The `aquifer` CLI against a real daemon.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::*;

fn cli(d: &Daemon, args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args).env("AQUIFER_REST", &d.rest).env("AQUIFER_PASSWORD", ADMIN_PASSWORD).env_remove("AQUIFER_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run aquifer");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "exit {}: {}{}", o.status, String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn files_drives_jobs_users_and_tokens_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &[]);
    let local = dir.path().join("model.bin");
    let data = bytes(42, 6 << 20);
    std::fs::write(&local, &data).unwrap();
    let l = local.to_str().unwrap();

    ok(&cli(&d, &["files", "put", l, "/ckpt/run1/model.bin"], None, &[]));
    let ls = ok(&cli(&d, &["files", "ls", "/ckpt/run1"], None, &[]));
    assert!(ls.contains("model.bin"), "{ls}");
    let back = dir.path().join("back.bin");
    ok(&cli(&d, &["files", "get", "/ckpt/run1/model.bin", back.to_str().unwrap()], None, &[]));
    assert!(std::fs::read(&back).unwrap() == data);
    ok(&cli(&d, &["files", "mkdir", "-p", "/ckpt/archive/2026"], None, &[]));
    ok(&cli(&d, &["files", "mv", "/ckpt/run1/model.bin", "/ckpt/archive/2026/"], None, &[]));
    let ls = ok(&cli(&d, &["files", "ls", "/ckpt/archive/2026", "--json"], None, &[]));
    assert!(ls.contains("model.bin"), "{ls}");
    let gone = cli(&d, &["files", "get", "/ckpt/run1/model.bin", "-"], None, &[]);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("404"), "{}", String::from_utf8_lossy(&gone.stderr));

    let drives = ok(&cli(&d, &["drives", "list"], None, &[]));
    assert_eq!(drives.matches("online").count(), 6, "{drives}");
    let health = ok(&cli(&d, &["health"], None, &[]));
    assert!(health.contains("ok"), "{health}");
    let cache = ok(&cli(&d, &["cache"], None, &[]));
    assert!(cache.contains("data cache: ") && cache.contains(" shards from memory"), "{cache}");
    let scrub = ok(&cli(&d, &["jobs", "scrub", "--wait"], None, &[]));
    assert!(scrub.contains("completed"), "{scrub}");

    ok(&cli(&d, &["users", "add", "carol", "--password-stdin"], Some("carol-password-1\n"), &[]));
    let users = ok(&cli(&d, &["users", "list"], None, &[]));
    assert!(users.contains("carol"), "{users}");
    // carol may not list users or start jobs.
    let denied = cli(&d, &["users", "list"], None, &[("AQUIFER_USER", "carol"), ("AQUIFER_PASSWORD", "carol-password-1")]);
    assert!(!denied.status.success());
    assert!(String::from_utf8_lossy(&denied.stderr).contains("403"), "{}", String::from_utf8_lossy(&denied.stderr));
    let wrong = cli(&d, &["drives", "list"], None, &[("AQUIFER_PASSWORD", "not-the-password")]);
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("401"), "{}", String::from_utf8_lossy(&wrong.stderr));

    let tok = ok(&cli(&d, &["tokens", "create", "--role", "read-only", "--json"], None, &[]));
    let v: serde_json::Value = serde_json::from_str(&tok).unwrap();
    let secret = v["token"].as_str().expect("token field").to_string();
    let drives = ok(&cli(&d, &["drives", "list"], None, &[("AQUIFER_TOKEN", &secret), ("AQUIFER_PASSWORD", "")]));
    assert!(drives.contains("online"));
    let denied = cli(&d, &["jobs", "scrub"], None, &[("AQUIFER_TOKEN", &secret)]);
    assert!(!denied.status.success(), "a read-only token cannot start jobs");
    d.stop();
}

/// `aquifer sftp chroot` confines a user's OpenSSH `sftp` sessions from their next login, on
/// the running daemon; bad input is refused with a clear message and changes nothing.
#[test]
fn sftp_chroot_set_with_the_cli_confines_openssh_sftp() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let d = Daemon::start(&work.join("data"), &[]);
    ok(&cli(&d, &["users", "add", "alice", "--password-stdin"], Some("alice-password-1\n"), &[]));
    let inside = work.join("inside.txt");
    std::fs::write(&inside, b"inside the jail\n").unwrap();
    let secret = work.join("secret.txt");
    std::fs::write(&secret, b"outside the jail\n").unwrap();
    ok(&cli(&d, &["files", "put", inside.to_str().unwrap(), "/jail/alice/inside.txt"], None, &[]));
    ok(&cli(&d, &["files", "put", secret.to_str().unwrap(), "/secret.txt"], None, &[]));

    // Bad input: refused with the reason, nothing set.
    for (args, needle) in [
        (&["sftp", "chroot", "set", "alice", "jail/alice"][..], "400"),
        (&["sftp", "chroot", "set", "alice", "/jail/missing"][..], "/jail/missing does not exist"),
        (&["sftp", "chroot", "set", "alice", "/secret.txt"][..], "not a directory"),
        (&["sftp", "chroot", "set", "nobody", "/jail"][..], "no user nobody"),
        (&["sftp", "chroot", "rm", "alice"][..], "has no SFTP chroot"),
    ] {
        let o = cli(&d, args, None, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(needle), "{args:?}: {err}");
    }
    let denied = cli(&d, &["sftp", "chroot", "set", "alice", "/"], None, &[("AQUIFER_USER", "alice"), ("AQUIFER_PASSWORD", "alice-password-1")]);
    assert!(String::from_utf8_lossy(&denied.stderr).contains("403"), "{}", String::from_utf8_lossy(&denied.stderr));
    let list = ok(&cli(&d, &["sftp", "chroot", "list", "--json"], None, &[]));
    assert_eq!(serde_json::from_str::<serde_json::Value>(&list).unwrap(), serde_json::json!([]));

    // Unconfined, alice sees the whole namespace.
    let batch = "ls -1 /\n";
    let o = sftp_as(&d, "alice", "alice-password-1", batch, work);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success() && out.contains("secret.txt") && out.contains("jail"), "{out}{}", String::from_utf8_lossy(&o.stderr));

    // Confined by the CLI while the daemon runs: her next login sees /jail/alice as `/`.
    let set = ok(&cli(&d, &["sftp", "chroot", "set", "alice", "/jail/./alice/"], None, &[]));
    assert!(set.contains("alice") && set.contains("/jail/alice"), "{set}");
    let list = ok(&cli(&d, &["sftp", "chroot"], None, &[]));
    assert!(list.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["alice", "/jail/alice"]), "{list}");
    let got = work.join("got.txt");
    let escaped = [work.join("esc1.txt"), work.join("esc2.txt"), work.join("esc3.txt")];
    let batch = format!(
        "pwd\nls -1 /\nget /inside.txt {}\n-get /secret.txt {}\n-get ../../secret.txt {}\n-get /jail/alice/inside.txt {}\n",
        got.display(),
        escaped[0].display(),
        escaped[1].display(),
        escaped[2].display()
    );
    let o = sftp_as(&d, "alice", "alice-password-1", &batch, work);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("Remote working directory: /\n"), "{out}");
    assert!(out.contains("inside.txt") && !out.contains("secret.txt\n") && !out.contains("jail\n"), "{out}");
    assert_eq!(std::fs::read(&got).unwrap(), b"inside the jail\n");
    for e in &escaped {
        assert!(!e.exists(), "{} was fetched from outside the chroot: {out}", e.display());
    }

    // Lifted: the next login sees everything again.
    ok(&cli(&d, &["sftp", "chroot", "rm", "alice"], None, &[]));
    let o = sftp_as(&d, "alice", "alice-password-1", "ls -1 /\n", work);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success() && out.contains("secret.txt"), "{out}{}", String::from_utf8_lossy(&o.stderr));
    d.stop();
}
