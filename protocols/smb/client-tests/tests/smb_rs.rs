//! SMB 3 end to end with a Rust client, the `smb` crate (smb-rs), against a real `aquifer
//! serve` daemon: NTLM logon as admin, directories, a file of a few MiB written in several
//! writes and read back bit-exact with ranged reads, listing, rename, file information, delete,
//! a wrong password, and a share that requires encryption. What SMB wrote is read back through
//! the REST API too (one namespace).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use futures_util::StreamExt;
use smb::binrw_util::file_time::FileTime;
use smb::connection::EncryptionMode;
use smb::{
    Client, ClientConfig, ConnectionConfig, CreateOptions, Dialect, DirAccessMask, Directory, FileAccessMask, FileAttributes, FileBasicInformation,
    FileCreateArgs, FileDirectoryInformation, FileDispositionInformation, FileNetworkOpenInformation, FileRenameInformation,
    FileStandardInformation, ReadAt, Status, UncPath, WriteAt,
};

/// Bytes per SMB WRITE: the file below takes several.
const WRITE_BYTES: usize = 512 << 10;
/// Seconds between the FILETIME epoch (1601) and the Unix epoch.
const FILETIME_UNIX_OFFSET_S: u64 = 11_644_473_600;

fn config(d: &Daemon, encryption: EncryptionMode, dialect_max: Option<Dialect>) -> ClientConfig {
    let port = d.smb.rsplit(':').next().expect("daemon serves SMB").parse().unwrap();
    let mut c = ConnectionConfig { port: Some(port), timeout: Some(Duration::from_secs(30)), encryption_mode: encryption, max_dialect: dialect_max, ..Default::default() };
    c.auth_methods.ntlm = true;
    c.auth_methods.kerberos = false;
    ClientConfig { connection: c, dfs: false, ..Default::default() }
}

fn share(name: &str) -> UncPath {
    UncPath::new("127.0.0.1").unwrap().with_share(name).unwrap()
}

async fn connect(d: &Daemon, name: &str, password: &str, encryption: EncryptionMode, dialect_max: Option<Dialect>) -> smb::Result<(Client, UncPath)> {
    let client = Client::new(config(d, encryption, dialect_max));
    let unc = share(name);
    client.share_connect(&unc, "admin", password.to_string()).await?;
    Ok((client, unc))
}

/// The NT status of a refused request.
fn status_of(e: &smb::Error) -> Option<u32> {
    match e {
        smb::Error::UnexpectedMessageStatus(s) | smb::Error::ReceivedErrorMessage(s, _) => Some(*s),
        _ => None,
    }
}

fn unix_ns(t: FileTime) -> i128 {
    t.since_epoch().as_nanos() as i128 - (FILETIME_UNIX_OFFSET_S as i128) * 1_000_000_000
}

async fn write_all(file: &smb::File, data: &[u8]) -> usize {
    let mut writes = 0;
    let mut off = 0;
    while off < data.len() {
        let end = (off + WRITE_BYTES).min(data.len());
        let n = file.write_at(&data[off..end], off as u64).await.expect("write");
        assert!(n > 0, "write at {off} wrote nothing");
        off += n;
        writes += 1;
    }
    writes
}

async fn read_range(file: &smb::File, off: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let end = (got + WRITE_BYTES).min(len);
        let n = file.read_at(&mut out[got..end], (off + got) as u64).await.expect("read");
        assert!(n > 0, "read at {} returned nothing", off + got);
        got += n;
    }
    out
}

async fn list(client: &Client, dir: &UncPath) -> Vec<(String, u64)> {
    let access = DirAccessMask::new().with_list_directory(true).with_synchronize(true);
    let d = Arc::new(client.create_file(dir, &FileCreateArgs::make_open_existing(access.into())).await.expect("open directory").unwrap_dir());
    let entries: Vec<smb::Result<FileDirectoryInformation>> = Directory::query::<FileDirectoryInformation>(&d, "*").await.expect("query directory").collect().await;
    let mut out: Vec<(String, u64)> = entries
        .into_iter()
        .map(|e| e.expect("directory entry"))
        .map(|e| (e.file_name.to_string(), e.end_of_file))
        .filter(|(n, _)| n != "." && n != "..")
        .collect();
    out.sort();
    d.close().await.expect("close directory");
    out
}

async fn delete(client: &Client, path: &UncPath) {
    let access = FileAccessMask::new().with_generic_read(true).with_delete(true);
    let r = client.create_file(path, &FileCreateArgs::make_open_existing(access)).await.expect("open for delete");
    match &r {
        smb::Resource::File(f) => f.set_info(FileDispositionInformation { delete_pending: true.into() }).await.expect("mark file deleted"),
        smb::Resource::Directory(d) => d.set_info(FileDispositionInformation { delete_pending: true.into() }).await.expect("mark directory deleted"),
        _ => panic!("{path} is neither file nor directory"),
    }
    match r {
        smb::Resource::File(f) => f.close().await.expect("close"),
        smb::Resource::Directory(d) => d.close().await.expect("close"),
        _ => unreachable!(),
    }
}

fn rest(d: &Daemon, method: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
    d.client().request(method, d.url(&format!("/api/v1{path}"))).basic_auth("admin", Some(ADMIN_PASSWORD))
}

fn rest_file(d: &Daemon, path: &str) -> (u16, Vec<u8>) {
    let r = rest(d, reqwest::Method::GET, &format!("/files/{path}")).send().unwrap();
    (r.status().as_u16(), r.bytes().unwrap().to_vec())
}

#[test]
fn smb_rs_client_file_operations_encryption_and_rest_cross_check() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(&dir.path().join("data"), &[]);
    // One thread: smb 0.12.1's directory stream can lose the wake-up of its fetch task when
    // the reader drains a page on another worker at the same moment, and then hangs.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let data = bytes(31, (3 << 20) + 12_345);

    // Write, read back with ranged reads, list, rename, query information.
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i128;
    let last_write_ns = rt.block_on(async {
        let (client, root) = connect(&d, "aquifer", ADMIN_PASSWORD, EncryptionMode::Allowed, None).await.expect("NTLM logon as admin");
        let dir_args = FileCreateArgs::make_create_new(FileAttributes::new().with_directory(true), CreateOptions::new().with_directory_file(true));
        client.create_file(&root.clone().with_path("smbrs"), &dir_args).await.expect("mkdir smbrs").unwrap_dir().close().await.unwrap();
        let again = client.create_file(&root.clone().with_path("smbrs"), &dir_args).await;
        assert_eq!(again.err().as_ref().and_then(status_of), Some(Status::ObjectNameCollision as u32), "creating an existing directory");

        let a = root.clone().with_path("smbrs\\a.bin");
        let f = client.create_file(&a, &FileCreateArgs::make_create_new(Default::default(), Default::default())).await.expect("create a.bin").unwrap_file();
        let writes = write_all(&f, &data).await;
        assert!(writes >= 6, "{writes} writes");
        f.close().await.expect("close a.bin");

        let f = client.create_file(&a, &FileCreateArgs::make_open_existing(FileAccessMask::new().with_generic_read(true))).await.expect("open a.bin").unwrap_file();
        let len = data.len();
        for (off, n) in [(0, len), (0, 1), (1, 4095), (4095, 2), (WRITE_BYTES - 3, 7), (1 << 20, 1 << 20), ((1 << 20) + 12_345, 777_777), (len - 1, 1), (len - 100_000, 100_000)] {
            let got = read_range(&f, off, n).await;
            assert!(got == data[off..off + n], "bytes {off}..{} differ", off + n);
        }
        f.close().await.unwrap();
        assert_eq!(list(&client, &root.clone().with_path("smbrs")).await, vec![("a.bin".to_string(), len as u64)]);

        let f = client
            .create_file(&a, &FileCreateArgs::make_open_existing(FileAccessMask::new().with_generic_read(true).with_delete(true)))
            .await
            .expect("open a.bin for rename")
            .unwrap_file();
        f.set_info(FileRenameInformation { replace_if_exists: false.into(), root_directory: 0, file_name: "smbrs\\b.bin".into() }).await.expect("rename");
        f.close().await.unwrap();
        assert_eq!(list(&client, &root.clone().with_path("smbrs")).await, vec![("b.bin".to_string(), len as u64)]);
        let gone = client.create_file(&a, &FileCreateArgs::make_open_existing(FileAccessMask::new().with_generic_read(true))).await;
        assert_eq!(gone.err().as_ref().and_then(status_of), Some(Status::ObjectNameNotFound as u32), "a.bin after the rename");

        let f = client
            .create_file(&root.clone().with_path("smbrs\\b.bin"), &FileCreateArgs::make_open_existing(FileAccessMask::new().with_generic_read(true)))
            .await
            .expect("open b.bin")
            .unwrap_file();
        let std_info = f.query_info::<FileStandardInformation>().await.expect("standard information");
        assert_eq!(std_info.end_of_file, len as u64);
        assert!(std_info.allocation_size >= len as u64);
        assert!(!bool::from(std_info.directory));
        let open_info = f.query_info::<FileNetworkOpenInformation>().await.expect("network open information");
        assert_eq!(open_info.end_of_file, len as u64);
        let basic = f.query_info::<FileBasicInformation>().await.expect("basic information");
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i128;
        let slack = 2_000_000_000;
        let written = unix_ns(basic.last_write_time);
        assert!(before - slack <= written && written <= now + slack, "last write {written} not within [{before}, {now}]");
        assert!(unix_ns(basic.creation_time) <= written + 1, "created after last written");
        assert_eq!(basic.last_write_time, open_info.last_write_time);
        f.close().await.unwrap();
        client.close().await.unwrap();
        written
    });
    // The same bytes and times through REST.
    let (status, body) = rest_file(&d, "smbrs/b.bin");
    assert_eq!(status, 200);
    assert!(body == data, "REST reads what SMB wrote");
    assert_eq!(rest_file(&d, "smbrs/a.bin").0, 404);
    let listing: serde_json::Value = rest(&d, reqwest::Method::GET, "/dirs/smbrs").send().unwrap().json().unwrap();
    let e = &listing["entries"][0];
    assert_eq!(e["name"], "b.bin");
    assert_eq!(e["size"].as_u64(), Some(data.len() as u64));
    let rest_mtime = e["mtime_ns"].as_i64().unwrap() as i128;
    assert!((rest_mtime - last_write_ns).abs() < 100, "REST mtime {rest_mtime} vs SMB last write {last_write_ns}");

    // Delete the file and the directory; a wrong password is refused.
    rt.block_on(async {
        let (client, root) = connect(&d, "aquifer", ADMIN_PASSWORD, EncryptionMode::Allowed, None).await.unwrap();
        delete(&client, &root.clone().with_path("smbrs\\b.bin")).await;
        assert_eq!(list(&client, &root.clone().with_path("smbrs")).await, vec![]);
        delete(&client, &root.clone().with_path("smbrs")).await;
        client.close().await.unwrap();

        let refused = connect(&d, "aquifer", "not-the-admin-password", EncryptionMode::Allowed, None).await;
        let e = refused.err().expect("a wrong password is refused");
        assert_eq!(status_of(&e), Some(Status::LogonFailure as u32), "{e}");
    });
    assert_eq!(rest_file(&d, "smbrs/b.bin").0, 404);
    assert_eq!(rest_file(&d, "smbrs").0, 404);
    // A share that requires encryption: an encrypted SMB 3 session reads and writes; SMB 2.1,
    // which cannot encrypt, gets no tree (but still reaches the unencrypted share).
    let r = rest(&d, reqwest::Method::POST, "/dirs/vault").send().unwrap();
    assert_eq!(r.status(), 201);
    let r = rest(&d, reqwest::Method::POST, "/shares").json(&serde_json::json!({ "name": "vault", "path": "/vault", "encrypt": true })).send().unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap());
    let secret = bytes(32, (1 << 20) + 333);
    rt.block_on(async {
        let (client, vault) = connect(&d, "vault", ADMIN_PASSWORD, EncryptionMode::Required, None).await.expect("encrypted session to vault");
        let p = vault.clone().with_path("secret.bin");
        let f = client.create_file(&p, &FileCreateArgs::make_create_new(Default::default(), Default::default())).await.expect("create secret.bin").unwrap_file();
        write_all(&f, &secret).await;
        f.close().await.unwrap();
        let f = client.create_file(&p, &FileCreateArgs::make_open_existing(FileAccessMask::new().with_generic_read(true))).await.unwrap().unwrap_file();
        assert!(read_range(&f, 0, secret.len()).await == secret, "encrypted read-back");
        f.close().await.unwrap();
        client.close().await.unwrap();

        let refused = connect(&d, "vault", ADMIN_PASSWORD, EncryptionMode::Disabled, Some(Dialect::Smb021)).await;
        let e = refused.err().expect("SMB 2.1 is refused on a share that requires encryption");
        assert_eq!(status_of(&e), Some(Status::AccessDenied as u32), "{e}");
        let (client, _) = connect(&d, "aquifer", ADMIN_PASSWORD, EncryptionMode::Disabled, Some(Dialect::Smb021)).await.expect("SMB 2.1 to the unencrypted share");
        client.close().await.unwrap();
    });
    let (status, body) = rest_file(&d, "vault/secret.bin");
    assert_eq!(status, 200);
    assert!(body == secret, "REST reads what the encrypted session wrote");
    drop(rt);
    d.stop();
}
