//! 8.3 short names over SMB end to end, with Samba's `smbclient` (apt `smbclient`) against the
//! SMB service over an engine in a temporary directory: FileAlternateNameInformation
//! (`allinfo`'s `altname`), listings that match a short name, opens by a short name, and the
//! same short names after a restart (they are made from the name alone).

mod common;

use std::path::PathBuf;

const LONG: &str = "Long File Name.html";

async fn smbclient(addr: std::net::SocketAddr, cwd: PathBuf, commands: String) -> String {
    tokio::task::spawn_blocking(move || common::smbclient(addr, &cwd, &commands))
        .await
        .unwrap()
}

/// The `altname` `allinfo` reports for `file`.
async fn altname(addr: std::net::SocketAddr, cwd: PathBuf, file: &str) -> String {
    let out = smbclient(addr, cwd, format!("allinfo \"{file}\"")).await;
    out.lines()
        .find_map(|l| l.strip_prefix("altname: "))
        .unwrap_or_else(|| panic!("no altname: {out}"))
        .trim()
        .to_string()
}

/// Checks what a client sees of `LONG` by its short name: the name, a listing by it, an open.
async fn check_short_name(addr: std::net::SocketAddr, cwd: PathBuf) -> String {
    let short = altname(addr, cwd.clone(), LONG).await;
    assert_eq!(
        Some(short.as_str()),
        smb_server::short_name(LONG).as_deref()
    );
    assert!(
        short.len() <= 12 && short.contains('~') && short.ends_with(".HTM"),
        "{short}"
    );
    // A listing by the short name (in any case) finds the file under its long name.
    let out = smbclient(addr, cwd.clone(), format!("ls {}", short.to_lowercase())).await;
    assert!(out.contains(LONG), "{out}");
    // An open by the short name opens the file; a name already 8.3 is its own short name.
    let _ = std::fs::remove_file(cwd.join("copy"));
    let out = smbclient(addr, cwd.clone(), format!("get {short} copy")).await;
    assert!(!out.contains("STATUS_"), "{out}");
    assert_eq!(std::fs::read(cwd.join("copy")).unwrap(), b"long contents");
    assert_eq!(altname(addr, cwd.clone(), "short.txt").await, "short.txt");
    // In a directory with a long name too.
    let dir_short = smb_server::short_name("Long Directory").unwrap();
    let _ = std::fs::remove_file(cwd.join("copy2"));
    let out = smbclient(addr, cwd.clone(), format!("get {dir_short}\\{short} copy2")).await;
    assert!(!out.contains("STATUS_"), "{out}");
    assert_eq!(std::fs::read(cwd.join("copy2")).unwrap(), b"inner");
    short
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_names_are_reported_listed_opened_and_stable_across_a_restart() {
    let served = common::Served::start().await;
    let local = tempfile::tempdir().unwrap();
    let cwd = local.path().to_path_buf();
    std::fs::write(cwd.join("long"), b"long contents").unwrap();
    std::fs::write(cwd.join("inner"), b"inner").unwrap();
    std::fs::write(cwd.join("short.txt"), b"short").unwrap();
    let out = smbclient(
        served.addr,
        cwd.clone(),
        format!("put long \"{LONG}\"; put short.txt; mkdir \"Long Directory\"; put inner \"Long Directory\\{LONG}\""),
    )
    .await;
    assert!(!out.contains("STATUS_"), "{out}");
    let before = check_short_name(served.addr, cwd.clone()).await;

    let served = served.restart().await;
    let after = check_short_name(served.addr, cwd.clone()).await;
    assert_eq!(before, after);
    served.stop().await;
}
