//! One namespace, every protocol: a file written through any of REST, S3, NFSv3, SFTP and SMB
//! reads back bit-exact, with the same size, through all the others — with the real clients
//! (awscli, libnfs `nfs-cp`/`nfs-cat`, OpenSSH `sftp` via `sshpass`, Samba's `smbclient`)
//! against one daemon.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;

fn run(program: &str, args: &[&str], env: &[(&str, &str)], package: &str) -> Output {
    let mut c = Command::new(program);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    match c.output() {
        Ok(o) => o,
        Err(e) => panic!("run {program} ({e}); install the Debian package {package} (scripts/deps.sh does)"),
    }
}

fn ok(o: Output, what: &str) -> Vec<u8> {
    assert!(o.status.success(), "{what}: {}\n{}", o.status, String::from_utf8_lossy(&o.stderr));
    o.stdout
}

fn aws(d: &Daemon, args: &[&str]) -> Vec<u8> {
    let endpoint = format!("http://{}", d.s3);
    let mut all = vec!["--endpoint-url", endpoint.as_str(), "--region", "us-east-1"];
    all.extend_from_slice(args);
    let env = [
        ("AWS_ACCESS_KEY_ID", S3_ACCESS),
        ("AWS_SECRET_ACCESS_KEY", S3_SECRET),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_CONFIG_FILE", "/dev/null"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
    ];
    ok(run("aws", &all, &env, "awscli"), &format!("aws {args:?}"))
}

fn nfs_url(d: &Daemon, path: &str) -> String {
    let port = d.nfs.rsplit(':').next().unwrap();
    format!("nfs://127.0.0.1/{path}?nfsport={port}&mountport={port}&version=3")
}

fn sftp(d: &Daemon, batch: &str, work: &Path) -> Vec<u8> {
    let port = d.sftp.rsplit(':').next().unwrap();
    let file = work.join("batch");
    std::fs::write(&file, batch).unwrap();
    let o = run(
        "sshpass",
        &[
            "-p", ADMIN_PASSWORD, "sftp", "-o", "BatchMode=no", "-b", file.to_str().unwrap(), "-P", port,
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "PubkeyAuthentication=no",
            "admin@127.0.0.1",
        ],
        &[],
        "sshpass and openssh-client",
    );
    ok(o, "sftp batch")
}

fn smb(d: &Daemon, commands: &str) {
    let port = d.smb.rsplit(':').next().unwrap();
    let o = run(
        "smbclient",
        &["//127.0.0.1/aquifer", "-p", port, "-m", "SMB3", "-U", &format!("admin%{ADMIN_PASSWORD}"), "-s", "/dev/null", "-c", commands],
        &[],
        "smbclient",
    );
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success() && !all.contains("NT_STATUS_"), "smbclient {commands:?}: {all}");
}

fn rest_get(d: &Daemon, path: &str) -> Vec<u8> {
    let r = d.client().get(d.url(&format!("/api/v1/files/{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).send().unwrap();
    assert_eq!(r.status(), 200, "REST GET {path}");
    r.bytes().unwrap().to_vec()
}

#[test]
fn a_file_written_through_any_protocol_reads_back_through_all_others() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &[]);
    aws(&d, &["s3", "mb", "s3://shared"]);

    let sources = ["rest", "s3", "nfs", "sftp", "smb"];
    for (i, src) in sources.iter().enumerate() {
        let data = bytes(i as u64 + 1, 3_000_000 + i * 12_345);
        let local = work.path().join(format!("{src}.bin"));
        std::fs::write(&local, &data).unwrap();
        let l = local.to_str().unwrap();
        let key = format!("from-{src}.bin");
        match *src {
            "rest" => {
                let r = d.client().put(d.url(&format!("/api/v1/files/shared/{key}"))).basic_auth("admin", Some(ADMIN_PASSWORD)).body(data.clone()).send().unwrap();
                assert!(r.status().is_success());
            }
            "s3" => {
                aws(&d, &["s3", "cp", l, &format!("s3://shared/{key}")]);
            }
            "nfs" => {
                ok(run("nfs-cp", &[l, &nfs_url(&d, &format!("/shared/{key}"))], &[], "libnfs-utils"), "nfs-cp");
            }
            "sftp" => {
                sftp(&d, &format!("put {l} /shared/{key}\n"), work.path());
            }
            "smb" => {
                smb(&d, &format!("put {l} shared\\{key}"));
            }
            _ => unreachable!(),
        }
        // Read it through every protocol.
        assert!(rest_get(&d, &format!("shared/{key}")) == data, "{src} -> REST");
        assert!(aws(&d, &["s3", "cp", &format!("s3://shared/{key}"), "-"]) == data, "{src} -> S3");
        assert!(ok(run("nfs-cat", &[&nfs_url(&d, &format!("/shared/{key}"))], &[], "libnfs-utils"), "nfs-cat") == data, "{src} -> NFS");
        let back = work.path().join(format!("{src}.back"));
        sftp(&d, &format!("get /shared/{key} {}\n", back.display()), work.path());
        assert!(std::fs::read(&back).unwrap() == data, "{src} -> SFTP");
        let back = work.path().join(format!("{src}.smb-back"));
        smb(&d, &format!("get shared\\{key} {}", back.display()));
        assert!(std::fs::read(&back).unwrap() == data, "{src} -> SMB");
        let head: serde_json::Value = serde_json::from_slice(&aws(&d, &["s3api", "head-object", "--bucket", "shared", "--key", &key])).unwrap();
        assert_eq!(head["ContentLength"].as_u64(), Some(data.len() as u64), "{src}: S3 size");
    }
    let listing = String::from_utf8(aws(&d, &["s3", "ls", "s3://shared/"])).unwrap();
    for src in sources {
        assert!(listing.contains(&format!("from-{src}.bin")), "{listing}");
    }
    d.stop();
}

/// `--s3-domain`: curl (SigV4, the name mapped to the daemon with `--connect-to`) and awscli
/// in virtual-host mode write, read and list objects at `bucket.DOMAIN:port`, and awscli, path
/// style on the address, reads the same bytes; a domain given with a port stops the daemon at
/// once with an error that says so.
#[test]
fn s3_virtual_host_style_with_the_domain_flag() {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &["--s3-domain", "s3.aquifer.test"]);
    aws(&d, &["s3", "mb", "s3://vhost"]);
    let port = d.s3.rsplit(':').next().unwrap();
    let key = format!("{S3_ACCESS}:{S3_SECRET}");
    let connect = format!("vhost.s3.aquifer.test:{port}:127.0.0.1:{port}");
    let url = format!("http://vhost.s3.aquifer.test:{port}/dir/obj.bin");
    let curl = |extra: &[&str]| curl_s3(&key, &[&["--connect-to", connect.as_str()], extra].concat());
    let data = bytes(77, 2_500_000);
    let local = work.path().join("obj.bin");
    std::fs::write(&local, &data).unwrap();
    curl(&["-T", local.to_str().unwrap(), &url]);
    assert!(curl(&[&url]) == data, "virtual-host GET");
    assert!(aws(&d, &["s3", "cp", "s3://vhost/dir/obj.bin", "-"]) == data, "path-style GET of the virtual-host PUT");
    let list = String::from_utf8(curl(&[&format!("http://vhost.s3.aquifer.test:{port}/?list-type=2")])).unwrap();
    assert!(list.contains("<Key>dir/obj.bin</Key>"), "{list}");
    // awscli in virtual-host mode, with a hosts file of its own (bound over /etc/hosts in a
    // private mount namespace; there is no DNS here). The domain itself points at an address
    // the daemon does not listen on, so only virtual-host requests can succeed.
    let hosts = work.path().join("hosts");
    std::fs::write(&hosts, "127.0.0.1 localhost vhost.s3.aquifer.test\n127.0.0.2 s3.aquifer.test\n").unwrap();
    let cfg = work.path().join("aws-config");
    std::fs::write(&cfg, "[default]\ns3 =\n    addressing_style = virtual\n").unwrap();
    let copy = work.path().join("copy.bin");
    let aws_vhost = |args: &str| {
        let script = format!("mount --bind {} /etc/hosts && exec aws --endpoint-url http://s3.aquifer.test:{port} --region us-east-1 {args}", hosts.display());
        let env = [("AWS_CONFIG_FILE", cfg.to_str().unwrap()), ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"), ("AWS_EC2_METADATA_DISABLED", "true"), ("AWS_ACCESS_KEY_ID", S3_ACCESS), ("AWS_SECRET_ACCESS_KEY", S3_SECRET)];
        ok(run("unshare", &["--mount", "--propagation", "private", "sh", "-c", &script], &env, "util-linux"), &format!("aws {args} (virtual-host style)"))
    };
    aws_vhost(&format!("s3 cp {} s3://vhost/from-awscli.bin", local.display()));
    aws_vhost(&format!("s3 cp s3://vhost/dir/obj.bin {}", copy.display()));
    assert!(std::fs::read(&copy).unwrap() == data, "awscli virtual-host GET");
    let listing = String::from_utf8(aws_vhost("s3 ls s3://vhost/")).unwrap();
    assert!(listing.contains("from-awscli.bin") && listing.contains("dir/"), "{listing}");
    assert!(aws(&d, &["s3", "cp", "s3://vhost/from-awscli.bin", "-"]) == data, "path-style GET of awscli's virtual-host PUT");
    d.stop();

    let out = std::process::Command::new(bin())
        .args(["serve", "--rest", "127.0.0.1:0", "--s3", "127.0.0.1:0", "--nfs", "127.0.0.1:0", "--sftp", "127.0.0.1:0", "--smb", "127.0.0.1:0", "--fabric", "127.0.0.1:0"])
        .args(["--s3-domain", "s3.aquifer.test:9000", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("AQUIFER_ADMIN_PASSWORD", ADMIN_PASSWORD)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("without a port"), "{}: {err}", out.status);
}
