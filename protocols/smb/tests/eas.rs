//! Extended attributes over SMB end to end, with Samba's `smbclient` (`setea`, `geteas`) and
//! `smbtorture` (apt `smbclient`, `samba-testsuite`) against the SMB service over an engine in
//! a temporary directory. An SMB EA `NAME` is the engine xattr `user.NAME`.

mod common;

use std::path::PathBuf;

use storage_engine::{Caller, Error};

/// smbclient's `commands` against `addr`, run off the runtime that serves it.
async fn smbclient(addr: std::net::SocketAddr, cwd: PathBuf, commands: String) -> String {
    tokio::task::spawn_blocking(move || common::smbclient(addr, &cwd, &commands))
        .await
        .unwrap()
}

/// The EAs `geteas` lists for `file`, as (name, value) pairs; `geteas` prints each as
/// `NAME (FLAGS) =` and a hex dump of the value.
async fn eas(addr: std::net::SocketAddr, cwd: PathBuf, file: &str) -> Vec<(String, Vec<u8>)> {
    let out = smbclient(addr, cwd, format!("geteas \"{file}\"")).await;
    let mut eas: Vec<(String, Vec<u8>)> = Vec::new();
    for line in out.lines() {
        if let Some(name) = line
            .strip_suffix(" =")
            .and_then(|l| l.rsplit_once(" ("))
            .map(|(n, _)| n)
        {
            eas.push((name.to_string(), Vec::new()));
        } else if let (Some(last), Some(hex)) = (eas.last_mut(), line.strip_prefix('[')) {
            // `[0000] 62 6C 75 65  ...  blue`: the bytes between the offset and the text.
            let bytes = hex.split_once("] ").map_or("", |(_, b)| b);
            last.1.extend(
                bytes
                    .split_whitespace()
                    .take_while(|t| t.len() == 2)
                    .filter_map(|t| u8::from_str_radix(t, 16).ok()),
            );
        }
    }
    eas
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eas_are_set_queried_and_removed_and_bad_ones_change_nothing() {
    let served = common::Served::start().await;
    let addr = served.addr;
    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("f.txt"), b"contents").unwrap();
    let cwd = local.path().to_path_buf();
    let out = smbclient(
        addr,
        cwd.clone(),
        "put f.txt; setea f.txt Colour blue; setea f.txt Second two".into(),
    )
    .await;
    assert!(!out.contains("STATUS_"), "{out}");
    assert_eq!(
        eas(addr, cwd.clone(), "f.txt").await,
        pairs(&[("Colour", "blue"), ("Second", "two")])
    );

    // Stored as the engine's `user.` xattrs of the file.
    let sys = Caller::system();
    let ino = served.engine().resolve(&sys, "f.txt").unwrap().ino;
    assert_eq!(
        served.engine().getxattr(&sys, ino, b"user.Colour").unwrap(),
        b"blue"
    );

    // A name in another case replaces the attribute; an empty value removes it.
    let out = smbclient(
        addr,
        cwd.clone(),
        "setea f.txt COLOUR red; setea f.txt Second".into(),
    )
    .await;
    assert!(!out.contains("STATUS_"), "{out}");
    assert_eq!(
        eas(addr, cwd.clone(), "f.txt").await,
        pairs(&[("COLOUR", "red")])
    );

    // Names MS-FSCC forbids, one too long to store, and a value that takes the file's EAs past
    // 64 KiB are refused, and nothing changes.
    let long = "n".repeat(251);
    let big = "v".repeat(40_000);
    for bad in [
        "\"a*b\" x",
        "\"a:b\" x",
        "\"a[1]\" x",
        &format!("{long} x"),
        &format!("big1 {big}"),
    ] {
        let out = smbclient(
            addr,
            cwd.clone(),
            format!("setea f.txt big0 {big}; setea f.txt {bad}"),
        )
        .await;
        assert!(
            out.contains("STATUS_") || out.contains("failed"),
            "{bad}: {out}"
        );
        let now = eas(addr, cwd.clone(), "f.txt").await;
        let names: Vec<&str> = now.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["COLOUR", "big0"], "{bad}");
        smbclient(addr, cwd.clone(), "setea f.txt big0".into()).await;
    }

    // SMB EAs never reach Aquifer's own attributes: this one is `user.aquifer.smb.dos_attributes`,
    // and the file is not hidden.
    let out = smbclient(
        addr,
        cwd.clone(),
        "setea f.txt aquifer.smb.dos_attributes 2222; allinfo f.txt".into(),
    )
    .await;
    assert!(!out.contains("STATUS_"), "{out}");
    assert!(matches!(
        served
            .engine()
            .getxattr(&sys, ino, b"aquifer.smb.dos_attributes"),
        Err(Error::NotFound)
    ));
    assert_eq!(
        served
            .engine()
            .getxattr(&sys, ino, b"user.aquifer.smb.dos_attributes")
            .unwrap(),
        b"2222"
    );
    let attributes = out
        .lines()
        .find(|l| l.starts_with("attributes:"))
        .unwrap_or_default()
        .to_string();
    assert!(!attributes.contains('H'), "{out}");
    // Nor are they read back as EAs: an xattr outside `user.` is not listed.
    served
        .engine()
        .setxattr(&sys, ino, b"aquifer.test", b"internal")
        .unwrap();
    let names: Vec<String> = eas(addr, cwd.clone(), "f.txt")
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["COLOUR", "aquifer.smb.dos_attributes"]);
    served.stop().await;
}

/// smbtorture's `getinfo.qfile_buffercheck` creates `bufsize.txt` with an EA buffer of two
/// EAs; they are stored with the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eas_in_a_create_are_stored() {
    let served = common::Served::start().await;
    let addr = served.addr;
    let (results, output) = tokio::task::spawn_blocking(move || {
        common::smbtorture(addr, "smb2.getinfo", &["qfile_buffercheck"])
    })
    .await
    .unwrap();
    assert!(
        common::not_passed(&["qfile_buffercheck"], &results).is_empty(),
        "{output}"
    );
    let local = tempfile::tempdir().unwrap();
    assert_eq!(
        eas(addr, local.path().to_path_buf(), "bufsize.txt").await,
        pairs(&[("EAONE", "VALUE1"), ("SECONDEA", "ValueTwo")])
    );
    served.stop().await;
}
