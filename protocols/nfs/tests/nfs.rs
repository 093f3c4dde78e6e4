//! End-to-end tests of the NFSv3 service: libnfs's command-line client (`libnfs-utils`), the
//! `nfs3_client` crate, and raw RPC records over TCP.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aquifer_nfs::Export;
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::TokioIo;
use storage_engine::{Caller, Engine, EngineConfig, Stability};
use tokio::sync::oneshot;

fn config(dir: &Path) -> EngineConfig {
    let mut c = EngineConfig::with_file_drives(dir, 6, 64 << 20, 4, 2);
    c.shard_bytes_max = 16 * 1024;
    c.inline_bytes_max = 4096;
    c.write_buffer_bytes_max = 256 * 1024;
    c.argon2_memory_kib = 64;
    c.admin_password = Some("admin-password".into());
    c.wal_sync_interval_ms = 50;
    c
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn export(path: &str) -> Export {
    Export { path: path.into(), clients: vec!["127.0.0.1".into()], read_only: false, root_squash: false }
}

/// An NFS service on an ephemeral port, stopped when dropped.
struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Server {
    async fn start(engine: Arc<Engine>, exports: Vec<Export>) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(aquifer_nfs::serve(engine, listener, exports, async {
            let _ = rx.await;
        }));
        Server { addr, stop: Some(tx), task: Some(task) }
    }

    async fn start_opts(engine: Arc<Engine>, exports: Vec<Export>, opts: aquifer_nfs::ServeOptions) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel();
        let table = aquifer_nfs::ExportTable::new(engine, exports).expect("export table");
        let task = tokio::spawn(aquifer_nfs::serve_table_opts(table, opts, listener, async {
            let _ = rx.await;
        }));
        Server { addr, stop: Some(tx), task: Some(task) }
    }

    /// libnfs reads `nfs://host/EXPORT/PATH`; the root export is therefore `//PATH`.
    fn url(&self, export_and_path: &str) -> String {
        let p = self.addr.port();
        format!("nfs://127.0.0.1{export_and_path}?nfsport={p}&mountport={p}&version=3")
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.expect("join").expect("serve");
    }
}

/// Runs one of libnfs's tools; a missing tool fails the test with the package to install.
async fn libnfs(tool: &str, args: Vec<String>) -> std::process::Output {
    let tool = tool.to_string();
    tokio::task::spawn_blocking(move || {
        Command::new(&tool).args(&args).output().unwrap_or_else(|e| {
            panic!("cannot run {tool} ({e}): install the Debian package libnfs-utils (scripts/deps.sh)")
        })
    })
    .await
    .unwrap()
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read_all(e: &Engine, path: &str) -> Vec<u8> {
    let c = Caller::system();
    let a = e.resolve(&c, path).expect("resolve");
    e.read(&c, a.ino, 0, a.size as usize + 1).expect("read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nfs_cp_copies_files_in_and_out_bit_exact() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let server = Server::start(engine.clone(), vec![export("/")]).await;
    let work = tempfile::tempdir().unwrap();
    // Sizes: empty, inline, one stripe plus a bit, several stripes and more than one 1 MiB WRITE.
    for (i, len) in [0usize, 1000, 70_000, 3 * 1024 * 1024 + 17].into_iter().enumerate() {
        let data = bytes(i as u64 + 1, len);
        let local = work.path().join(format!("in-{i}"));
        std::fs::write(&local, &data).unwrap();
        let out = libnfs("nfs-cp", vec![local.display().to_string(), server.url(&format!("//file-{i}.bin"))]).await;
        ok(&out, "nfs-cp in");
        assert_eq!(read_all(&engine, &format!("/file-{i}.bin")), data, "engine sees the bytes written over NFS ({len} bytes)");
        let back = work.path().join(format!("out-{i}"));
        let out = libnfs("nfs-cp", vec![server.url(&format!("//file-{i}.bin")), back.display().to_string()]).await;
        ok(&out, "nfs-cp out");
        assert_eq!(std::fs::read(&back).unwrap(), data, "bytes read back over NFS ({len} bytes)");
    }
    let out = libnfs("nfs-cat", vec![server.url("//file-1.bin")]).await;
    ok(&out, "nfs-cat");
    assert_eq!(out.stdout, bytes(2, 1000));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nfs_ls_lists_a_large_directory_and_subdirectory_exports() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let c = Caller::system();
    let d = engine.mkdir(&c, storage_engine::ROOT_INO, b"projects", 0o755).unwrap();
    let mut names: Vec<String> = (0..600).map(|i| format!("entry-with-a-longish-name-{i:04}")).collect();
    for n in &names {
        engine.create(&c, d.ino, n.as_bytes(), 0o644, true).unwrap();
    }
    let server = Server::start(engine.clone(), vec![export("/"), export("/projects")]).await;
    for url in [server.url("/projects/"), server.url("//projects/")] {
        let out = libnfs("nfs-ls", vec![url.clone()]).await;
        ok(&out, "nfs-ls");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut seen: Vec<String> = text
            .lines()
            .filter_map(|l| l.split_whitespace().last().map(str::to_string))
            .filter(|n| n != "." && n != "..")
            .collect();
        seen.sort();
        names.sort();
        assert_eq!(seen, names, "listing of {url}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exports_enforce_client_lists_read_only_and_root_squash() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let c = Caller::system();
    for name in ["elsewhere", "ro", "squashed"] {
        engine.mkdir(&c, storage_engine::ROOT_INO, name.as_bytes(), 0o755).unwrap();
    }
    let exports = vec![
        Export { path: "/elsewhere".into(), clients: vec!["10.0.0.0/8".into()], read_only: false, root_squash: false },
        Export { path: "/ro".into(), clients: vec!["*".into()], read_only: true, root_squash: false },
        Export { path: "/squashed".into(), clients: vec!["127.0.0.0/8".into()], read_only: false, root_squash: true },
    ];
    let server = Server::start(engine.clone(), exports).await;
    let work = tempfile::tempdir().unwrap();
    let local = work.path().join("f");
    std::fs::write(&local, b"hello").unwrap();
    let out = libnfs("nfs-ls", vec![server.url("/elsewhere/")]).await;
    assert!(!out.status.success(), "a client outside the export's list must not mount it");
    let out = libnfs("nfs-cp", vec![local.display().to_string(), server.url("/ro/f")]).await;
    assert!(!out.status.success(), "a read-only export refuses writes");
    let out = libnfs("nfs-cp", vec![local.display().to_string(), server.url("/squashed/f")]).await;
    assert!(!out.status.success(), "squashed root may not write into a directory owned by root");
    assert!(engine.resolve(&c, "/ro/f").is_err() && engine.resolve(&c, "/squashed/f").is_err());
    let out = libnfs("nfs-ls", vec![server.url("/ro/")]).await;
    ok(&out, "nfs-ls of the read-only export");
    server.stop().await;
}

fn cred(uid: u32) -> opaque_auth<'static> {
    opaque_auth::auth_unix(&auth_unix { stamp: 1, machinename: Opaque::owned(b"test".to_vec()), uid, gid: uid, gids: vec![] })
}

async fn client(addr: SocketAddr) -> nfs3_client::Nfs3Client<TokioIo<tokio::net::TcpStream>> {
    client_as(addr, 0).await
}

/// A client whose calls carry AUTH_SYS `uid` (and gid `uid`).
async fn client_as(addr: SocketAddr, uid: u32) -> nfs3_client::Nfs3Client<TokioIo<tokio::net::TcpStream>> {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    nfs3_client::Nfs3Client::new_with_auth(TokioIo::new(s), cred(uid), opaque_auth::default())
}

async fn mount_root(addr: SocketAddr, path: &str) -> nfs_fh3 {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut m = nfs3_client::MountClient::new_with_auth(TokioIo::new(s), cred(0), opaque_auth::default());
    let ok = m.mnt(nfs3_client::nfs3_types::mount::dirpath(Opaque::owned(path.as_bytes().to_vec()))).await.expect("mount");
    nfs_fh3 { data: ok.fhandle.0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handles_survive_a_restart_and_unstable_writes_commit() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(7, 200_000);
    let (file_fh, dir_fh, verf_before);
    {
        let engine = Engine::open(config(dir.path())).unwrap();
        let server = Server::start(engine.clone(), vec![export("/")]).await;
        let root = mount_root(server.addr, "/").await;
        let mut nfs = client(server.addr).await;
        let made = nfs
            .mkdir(&MKDIR3args { where_: diropargs3 { dir: root.clone(), name: filename3(Opaque::owned(b"d".to_vec())) }, attributes: sattr3::default() })
            .await
            .unwrap()
            .unwrap();
        let Nfs3Option::Some(d) = made.obj else { panic!("mkdir returned no handle") };
        dir_fh = d;
        let created = nfs
            .create(&CREATE3args {
                where_: diropargs3 { dir: dir_fh.clone(), name: filename3(Opaque::owned(b"f".to_vec())) },
                how: createhow3::GUARDED(sattr3::default()),
            })
            .await
            .unwrap()
            .unwrap();
        let Nfs3Option::Some(f) = created.obj else { panic!("create returned no handle") };
        file_fh = f;
        let again = nfs
            .create(&CREATE3args {
                where_: diropargs3 { dir: dir_fh.clone(), name: filename3(Opaque::owned(b"f".to_vec())) },
                how: createhow3::GUARDED(sattr3::default()),
            })
            .await
            .unwrap();
        assert!(matches!(again, Nfs3Result::Err((nfsstat3::NFS3ERR_EXIST, _))), "GUARDED create of an existing name");
        let mut verf = None;
        for (i, chunk) in data.chunks(64 * 1024).enumerate() {
            let w = nfs
                .write(&WRITE3args {
                    file: file_fh.clone(),
                    offset: (i * 64 * 1024) as u64,
                    count: chunk.len() as u32,
                    stable: stable_how::UNSTABLE,
                    data: Opaque::owned(chunk.to_vec()),
                })
                .await
                .unwrap()
                .unwrap();
            assert_eq!(w.committed, stable_how::UNSTABLE);
            verf = Some(w.verf);
        }
        let c = nfs.commit(&COMMIT3args { file: file_fh.clone(), offset: 0, count: 0 }).await.unwrap().unwrap();
        assert_eq!(Some(c.verf), verf, "COMMIT verifier matches the WRITE verifier of the same run");
        verf_before = c.verf;
        server.stop().await;
        engine.shutdown().unwrap();
    }
    let engine = Engine::open(config(dir.path())).unwrap();
    assert_eq!(read_all(&engine, "/d/f"), data, "committed data survives the restart");
    let server = Server::start(engine.clone(), vec![export("/")]).await;
    let mut nfs = client(server.addr).await;
    let attr = nfs.getattr(&GETATTR3args { object: file_fh.clone() }).await.unwrap().unwrap();
    assert_eq!(attr.obj_attributes.size, data.len() as u64, "old file handle is valid after restart");
    let looked = nfs
        .lookup(&LOOKUP3args { what: diropargs3 { dir: dir_fh.clone(), name: filename3(Opaque::owned(b"f".to_vec())) } })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(looked.object, file_fh, "handles are the same across restarts");
    let r = nfs.read(&READ3args { file: file_fh.clone(), offset: 1000, count: 5000 }).await.unwrap().unwrap();
    assert_eq!(&r.data[..], &data[1000..6000]);
    assert!(!r.eof);
    let w = nfs
        .write(&WRITE3args { file: file_fh.clone(), offset: 0, count: 3, stable: stable_how::FILE_SYNC, data: Opaque::owned(b"abc".to_vec()) })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(w.committed, stable_how::FILE_SYNC);
    assert_ne!(w.verf, verf_before, "the write verifier changes when the service restarts");
    // A removed file's handle is stale, even if its inode number is used again.
    nfs.remove(&REMOVE3args { object: diropargs3 { dir: dir_fh.clone(), name: filename3(Opaque::owned(b"f".to_vec())) } })
        .await
        .unwrap()
        .unwrap();
    let gone = nfs.getattr(&GETATTR3args { object: file_fh.clone() }).await.unwrap();
    assert!(matches!(gone, Nfs3Result::Err((nfsstat3::NFS3ERR_STALE, _))), "handle of a removed file: {gone:?}");
    // RMDIR of a file and REMOVE of a directory are refused.
    let rm = nfs.remove(&REMOVE3args { object: diropargs3 { dir: mount_root(server.addr, "/").await, name: filename3(Opaque::owned(b"d".to_vec())) } }).await.unwrap();
    assert!(matches!(rm, Nfs3Result::Err(_)), "REMOVE of a directory must fail");
    server.stop().await;
}

/// Many clients at once creating, writing and committing small files (CREATE answered on the
/// event loop or, when the engine is busy, on a blocking thread; COMMIT syncing on the call's
/// own thread; small replies written by the calls themselves): every call is answered, and
/// every committed file is there, whole, after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_and_commits_all_answer_and_persist() {
    let dir = tempfile::tempdir().unwrap();
    let (clients, per_client) = (8usize, 40usize);
    {
        let engine = Engine::open(config(dir.path())).unwrap();
        let server = Server::start(engine.clone(), vec![export("/")]).await;
        let root = mount_root(server.addr, "/").await;
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..clients {
            let (addr, root) = (server.addr, root.clone());
            tasks.spawn(async move {
                let mut nfs = client(addr).await;
                for i in 0..per_client {
                    let name = format!("c{c}-f{i}").into_bytes();
                    let made = nfs
                        .create(&CREATE3args {
                            where_: diropargs3 { dir: root.clone(), name: filename3(Opaque::owned(name.clone())) },
                            how: createhow3::GUARDED(sattr3 { mode: Nfs3Option::Some(0o640), ..Default::default() }),
                        })
                        .await
                        .unwrap()
                        .unwrap();
                    let Nfs3Option::Some(fh) = made.obj else { panic!("create returned no handle") };
                    let data = bytes((c * per_client + i) as u64, 3000);
                    nfs.write(&WRITE3args { file: fh.clone(), offset: 0, count: 3000, stable: stable_how::UNSTABLE, data: Opaque::owned(data) })
                        .await
                        .unwrap()
                        .unwrap();
                    nfs.commit(&COMMIT3args { file: fh, offset: 0, count: 0 }).await.unwrap().unwrap();
                    let again = nfs
                        .create(&CREATE3args {
                            where_: diropargs3 { dir: root.clone(), name: filename3(Opaque::owned(name)) },
                            how: createhow3::GUARDED(sattr3::default()),
                        })
                        .await
                        .unwrap();
                    assert!(matches!(again, Nfs3Result::Err((nfsstat3::NFS3ERR_EXIST, _))), "GUARDED create of an existing name");
                }
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.expect("client task");
        }
        server.stop().await;
        engine.shutdown().unwrap();
    }
    let engine = Engine::open(config(dir.path())).unwrap();
    let c = Caller::system();
    for cl in 0..clients {
        for i in 0..per_client {
            let path = format!("/c{cl}-f{i}");
            assert_eq!(read_all(&engine, &path), bytes((cl * per_client + i) as u64, 3000), "{path}");
            assert_eq!(engine.resolve(&c, &path).unwrap().mode & 0o7777, 0o640, "{path}");
        }
    }
    assert_eq!(engine.statfs(&c).unwrap().files, 1 + (clients * per_client) as u64);
}

/// Exports changed while the service runs apply to clients that already hold handles: a
/// client taken off the list gets ACCES, read-only refuses writes, a removed export's handles
/// are stale; an export added while running can be mounted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn export_table_changes_apply_to_mounted_clients() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let c = Caller::system();
    engine.mkdir(&c, storage_engine::ROOT_INO, b"live", 0o777).unwrap();
    let table = aquifer_nfs::ExportTable::new(engine.clone(), vec![export("/")]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(aquifer_nfs::serve_table(table.clone(), listener, async {
        let _ = rx.await;
    }));
    let admin = engine.authenticate_password("admin", "admin-password").unwrap();
    let e = Export { path: "/live".into(), clients: vec!["127.0.0.1".into()], read_only: false, root_squash: false };
    let info = table.add(&admin, e.clone()).unwrap();
    assert!(matches!(table.add(&admin, e.clone()), Err(aquifer_nfs::ExportError::Conflict(_))), "exported twice");
    assert!(matches!(table.add(&Caller::anonymous(), e), Err(aquifer_nfs::ExportError::PermissionDenied)));
    let fh = mount_root(addr, "/live").await;
    let mut nfs = client(addr).await;
    let write = |off: u64| WRITE3args { file: fh.clone(), offset: off, count: 0, stable: stable_how::FILE_SYNC, data: Opaque::owned(vec![]) };
    let made = nfs
        .create(&CREATE3args { where_: diropargs3 { dir: fh.clone(), name: filename3(Opaque::owned(b"f".to_vec())) }, how: createhow3::UNCHECKED(sattr3::default()) })
        .await
        .unwrap()
        .unwrap();
    let Nfs3Option::Some(file) = made.obj else { panic!("no handle") };
    let set = |p: aquifer_nfs::ExportPatch| table.update(&admin, &info.id, p).unwrap();
    set(aquifer_nfs::ExportPatch { read_only: Some(true), ..Default::default() });
    let w = nfs.write(&WRITE3args { file: file.clone(), ..write(0) }).await.unwrap();
    assert!(matches!(w, Nfs3Result::Err((nfsstat3::NFS3ERR_ROFS, _))), "read-only applies to a mounted client: {w:?}");
    set(aquifer_nfs::ExportPatch { clients: Some(vec!["10.0.0.1".into()]), ..Default::default() });
    let g = nfs.getattr(&GETATTR3args { object: fh.clone() }).await.unwrap();
    assert!(matches!(g, Nfs3Result::Err((nfsstat3::NFS3ERR_ACCES, _))), "a client taken off the list is refused: {g:?}");
    set(aquifer_nfs::ExportPatch { clients: Some(vec!["127.0.0.0/8".into()]), read_only: Some(false), ..Default::default() });
    nfs.getattr(&GETATTR3args { object: file.clone() }).await.unwrap().unwrap();
    table.remove(&admin, &info.id).unwrap();
    let g = nfs.getattr(&GETATTR3args { object: file.clone() }).await.unwrap();
    assert!(matches!(g, Nfs3Result::Err((nfsstat3::NFS3ERR_STALE, _))), "handles of a removed export are stale: {g:?}");
    assert!(matches!(table.remove(&admin, "/"), Err(aquifer_nfs::ExportError::Conflict(_))), "configuration exports stay");
    // Stored: a new table over the same engine (a restart) has no /live, and / still serves.
    assert_eq!(aquifer_nfs::ExportTable::new(engine.clone(), vec![export("/")]).unwrap().list().len(), 1);
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

/// A file `name` of `mode` holding `data` (written durably through the engine), served over
/// NFS from the export `/`: the engine, the file, the server, a client and the file's handle.
async fn serve_file(
    dir: &Path,
    name: &[u8],
    mode: u32,
    data: &[u8],
) -> (Arc<Engine>, storage_engine::Attr, Server, nfs3_client::Nfs3Client<TokioIo<tokio::net::TcpStream>>, nfs_fh3) {
    let engine = Engine::open(config(dir)).unwrap();
    let c = Caller::system();
    let f = engine.create(&c, storage_engine::ROOT_INO, name, mode, true).unwrap();
    engine.write(&c, f.ino, 0, data, Stability::Durable).unwrap();
    let server = Server::start(engine.clone(), vec![export("/")]).await;
    let root = mount_root(server.addr, "/").await;
    let mut nfs = client(server.addr).await;
    let fh = nfs.lookup(&LOOKUP3args { what: diropargs3 { dir: root, name: filename3(Opaque::owned(name.to_vec())) } }).await.unwrap().unwrap().object;
    (engine, f, server, nfs, fh)
}

/// READs of a small file (bytes in the metadata store, answered on the event loop): whole,
/// in part, past the end, refused by the mode, and while an unstable WRITE still holds new
/// bytes in the write buffer (which the in-place read leaves to a blocking thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn small_file_reads_answer_bytes_attributes_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(21, 5000);
    let (_engine, _f, server, mut nfs, fh) = serve_file(dir.path(), b"small", 0o600, &data).await;
    let read = |off: u64, count: u32| READ3args { file: fh.clone(), offset: off, count };
    let r = nfs.read(&read(0, 65536)).await.unwrap().unwrap();
    assert!(r.eof && r.data.as_ref() == data.as_slice(), "the whole file at once");
    let Nfs3Option::Some(attr) = r.file_attributes else { panic!("READ without attributes") };
    assert_eq!(attr.size, 5000);
    let r = nfs.read(&read(1000, 100)).await.unwrap().unwrap();
    assert!(!r.eof && r.data.as_ref() == &data[1000..1100], "a part");
    let r = nfs.read(&read(4990, 100)).await.unwrap().unwrap();
    assert!(r.eof && r.data.as_ref() == &data[4990..], "the tail");
    let r = nfs.read(&read(6000, 100)).await.unwrap().unwrap();
    assert!(r.eof && r.data.is_empty(), "past the end");
    // An unstable WRITE leaves its bytes in the write buffer until COMMIT: a READ sees them.
    let patch = bytes(22, 300);
    let w = nfs.write(&WRITE3args { file: fh.clone(), offset: 100, count: 300, stable: stable_how::UNSTABLE, data: Opaque::owned(patch.clone()) }).await.unwrap();
    assert!(matches!(w, Nfs3Result::Ok(_)), "unstable WRITE");
    let r = nfs.read(&read(0, 65536)).await.unwrap().unwrap();
    let mut expect = data.clone();
    expect[100..400].copy_from_slice(&patch);
    assert!(r.data.as_ref() == expect.as_slice(), "a READ sees the buffered bytes");
    // Another user is refused by the mode (0600, owned by root).
    let s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut other = nfs3_client::Nfs3Client::new_with_auth(TokioIo::new(s), cred(4242), opaque_auth::default());
    let r = other.read(&read(0, 100)).await.unwrap();
    assert!(matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_ACCES, _))), "mode 0600 refuses another user");
}

/// Sequential READs are served from windows read ahead; a change to the file between READs
/// (here through the engine, as another protocol would) is seen by the next READ.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sequential_reads_read_ahead_and_see_changes() {
    let dir = tempfile::tempdir().unwrap();
    let data = bytes(11, 9 * 1024 * 1024 + 333);
    let (engine, f, server, mut nfs, fh) = serve_file(dir.path(), b"seq", 0o644, &data).await;
    let c = Caller::system();
    let step = 256 * 1024;
    let mut got = Vec::new();
    let mut changed = data.clone();
    loop {
        let off = got.len() as u64;
        if off == 5 * 1024 * 1024 {
            // Windows ahead of the reader now hold the old bytes of this range.
            let patch = bytes(12, 100_000);
            engine.write(&c, f.ino, off + 10, &patch, Stability::Durable).unwrap();
            changed[off as usize + 10..off as usize + 10 + patch.len()].copy_from_slice(&patch);
        }
        let r = nfs.read(&READ3args { file: fh.clone(), offset: off, count: step }).await.unwrap().unwrap();
        got.extend_from_slice(&r.data);
        if r.eof {
            break;
        }
        assert_eq!(r.data.len(), step as usize, "short READ before the end");
    }
    assert_eq!(got.len(), changed.len());
    assert!(got == changed, "bytes read sequentially, with the change made during the pass");
    // Two more passes over the unchanged file, with a READ size that does not divide the
    // read-ahead buffers: the second starts where windows of the first are still held.
    for pass in 0..2 {
        let step = 1_000_000u32;
        let mut again = Vec::new();
        loop {
            let r = nfs.read(&READ3args { file: fh.clone(), offset: again.len() as u64, count: step }).await.unwrap().unwrap();
            again.extend_from_slice(&r.data);
            if r.eof {
                break;
            }
            assert_eq!(r.data.len(), step as usize, "short READ before the end");
        }
        assert!(again == changed, "pass {pass} read other bytes");
    }
    // Truncated and written again in the middle of a pass, while windows ahead of the reader
    // hold the old bytes: the rest of the pass reads the new, shorter file.
    let step = 1024 * 1024;
    let mut got = Vec::new();
    let rewritten = bytes(13, 6 * 1024 * 1024 + 5);
    loop {
        let off = got.len() as u64;
        if off == 2 * 1024 * 1024 {
            let set = storage_engine::SetAttr { size: Some(0), ..Default::default() };
            engine.setattr(&c, f.ino, set).unwrap();
            engine.write(&c, f.ino, 0, &rewritten, Stability::Durable).unwrap();
        }
        let r = nfs.read(&READ3args { file: fh.clone(), offset: off, count: step }).await.unwrap().unwrap();
        got.extend_from_slice(&r.data);
        if r.eof {
            break;
        }
    }
    assert_eq!(got.len(), rewritten.len(), "the pass ends at the new end of the file");
    assert!(got[2 * 1024 * 1024..] == rewritten[2 * 1024 * 1024..], "bytes after the truncation are the new ones");
    server.stop().await;
}

/// Sends raw bytes and returns what the server answers before closing or going quiet.
fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

fn record(body: &[u8]) -> Vec<u8> {
    let mut v = ((body.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// An RPC call header for the NFS program with AUTH_SYS uid 0.
fn call_header(xid: u32, proc_: u32) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [xid, 0, 2, 100_003, 3, proc_, 1] {
        v.extend_from_slice(&w.to_be_bytes());
    }
    let mut cred = Vec::new();
    for w in [0u32, 4] {
        cred.extend_from_slice(&w.to_be_bytes());
    }
    cred.extend_from_slice(b"test");
    for w in [0u32, 0, 0] {
        cred.extend_from_slice(&w.to_be_bytes());
    }
    v.extend_from_slice(&(cred.len() as u32).to_be_bytes());
    v.extend_from_slice(&cred);
    v.extend_from_slice(&[0; 8]); // AUTH_NULL verifier
    v
}

/// (xid, accept_stat, first word of the result) of a single accepted reply.
fn parse_reply(r: &[u8]) -> (u32, u32, Option<u32>) {
    assert!(r.len() >= 28, "short reply {r:?}");
    let w = |i: usize| u32::from_be_bytes(r[i..i + 4].try_into().unwrap());
    assert_eq!(w(8), 1, "a reply");
    assert_eq!(w(12), 0, "accepted");
    (w(4), w(24), if r.len() >= 32 { Some(w(28)) } else { None })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_records_get_errors_or_a_closed_connection_never_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let c = Caller::system();
    let f = engine.create(&c, storage_engine::ROOT_INO, b"f", 0o644, true).unwrap();
    engine.write(&c, f.ino, 0, b"content", Stability::Durable).unwrap();
    let server = Server::start(engine.clone(), vec![export("/")]).await;
    let addr = server.addr;
    let root = mount_root(addr, "/").await;
    let f_fh = client(addr)
        .await
        .lookup(&LOOKUP3args { what: diropargs3 { dir: root.clone(), name: filename3(Opaque::owned(b"f".to_vec())) } })
        .await
        .unwrap()
        .unwrap()
        .object;
    let (engine2, f_ino) = (engine.clone(), f.ino);
    let root2 = root.clone();
    tokio::task::spawn_blocking(move || {
        let root = root2;
        // Garbage that is not an RPC call: the connection closes without a reply.
        assert!(raw_exchange(addr, &record(b"this is not XDR at all, not even close")).is_empty());
        // A record mark claiming 2 GiB (the largest a mark can say) with the last-fragment bit
        // and one claiming 4 GiB in fragments: refused before any buffer of that size exists.
        assert!(raw_exchange(addr, &[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).is_empty());
        let mut frags = Vec::new();
        frags.extend_from_slice(&0x7fff_ffffu32.to_be_bytes());
        frags.extend_from_slice(&[0; 64]);
        assert!(raw_exchange(addr, &frags).is_empty());
        // A stream that ends inside a record mark.
        assert!(raw_exchange(addr, &[0x80, 0x00]).is_empty());
        // A FILE_SYNC WRITE of 20,000 bytes sent as 1-byte fragments (about 100,000 of them,
        // more than the connection's read buffer holds): answered and written like the
        // one-fragment call.
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut call = call_header(6, 7);
        call.extend_from_slice(&(f_fh.data.len() as u32).to_be_bytes());
        call.extend_from_slice(&f_fh.data);
        while !call.len().is_multiple_of(4) {
            call.push(0);
        }
        call.extend_from_slice(&0u64.to_be_bytes());
        for w in [data.len() as u32, 2, data.len() as u32] {
            call.extend_from_slice(&w.to_be_bytes());
        }
        call.extend_from_slice(&data);
        let mut frags = Vec::with_capacity(call.len() * 5);
        for (i, b) in call.iter().enumerate() {
            let last = if i + 1 == call.len() { 0x8000_0000u32 } else { 0 };
            frags.extend_from_slice(&(last | 1).to_be_bytes());
            frags.push(*b);
        }
        let (xid, stat, nfs) = parse_reply(&raw_exchange(addr, &frags));
        assert_eq!((xid, stat, nfs), (6, 0, Some(0)), "WRITE in {} fragments", call.len());
        assert_eq!(engine2.read(&Caller::system(), f_ino, 0, 30_000).unwrap(), data);
        // Truncated arguments: a GETATTR whose handle length says 64 but carries 3 bytes.
        let mut call = call_header(7, 1);
        call.extend_from_slice(&64u32.to_be_bytes());
        call.extend_from_slice(&[1, 2, 3]);
        let (xid, stat, _) = parse_reply(&raw_exchange(addr, &record(&call)));
        assert_eq!((xid, stat), (7, 4), "GARBAGE_ARGS");
        // An opaque length claiming 4 GiB inside a small record.
        let mut call = call_header(8, 1);
        call.extend_from_slice(&u32::MAX.to_be_bytes());
        let (xid, stat, _) = parse_reply(&raw_exchange(addr, &record(&call)));
        assert_eq!((xid, stat), (8, 4), "GARBAGE_ARGS for an impossible length");
        // Forged handles: wrong size, and right shape with a wrong generation.
        for (xid, fh, want) in [(9u32, vec![0u8; 8], 10001u32), (10, forge(&root, 12345), 70), (11, forge(&root, 0), 70)] {
            let mut call = call_header(xid, 1);
            call.extend_from_slice(&(fh.len() as u32).to_be_bytes());
            call.extend_from_slice(&fh);
            while call.len() % 4 != 0 {
                call.push(0);
            }
            let (rx, stat, nfs) = parse_reply(&raw_exchange(addr, &record(&call)));
            assert_eq!((rx, stat, nfs), (xid, 0, Some(want)), "forged handle {fh:?}");
        }
        // An unknown program and an unknown procedure.
        let mut call = call_header(12, 0);
        call[12..16].copy_from_slice(&100_099u32.to_be_bytes());
        assert_eq!(parse_reply(&raw_exchange(addr, &record(&call))).1, 1, "PROG_UNAVAIL");
        let call = call_header(13, 99);
        assert_eq!(parse_reply(&raw_exchange(addr, &record(&call))).1, 3, "PROC_UNAVAIL");
    })
    .await
    .unwrap();
    // The service still answers after all of that.
    let mut nfs = client(addr).await;
    nfs.null().await.unwrap();
    let a = nfs.getattr(&GETATTR3args { object: root }).await.unwrap().unwrap();
    assert_eq!(a.obj_attributes.fileid, storage_engine::ROOT_INO);
    server.stop().await;
}

/// Names a directory entry cannot have (with `/` or NUL, empty, `.`, `..`, over 255 bytes)
/// are refused by every procedure that makes an entry, a LOOKUP of a name with `/` does not
/// walk into a subdirectory, `..` at a mounted directory does not leave it, and a write or
/// size past the largest file is refused: each with an error, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_names_and_sizes_past_the_largest_file_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let c = Caller::system();
    let d = engine.mkdir(&c, storage_engine::ROOT_INO, b"d", 0o755).unwrap();
    let f = engine.create(&c, d.ino, b"f", 0o644, true).unwrap();
    engine.write(&c, f.ino, 0, b"content", Stability::Durable).unwrap();
    let server = Server::start(engine.clone(), vec![export("/")]).await;
    let root = mount_root(server.addr, "/").await;
    let mut nfs = client(server.addr).await;
    let fh = |name: &[u8], nfs_dir: &nfs_fh3| diropargs3 { dir: nfs_dir.clone(), name: filename3(Opaque::owned(name.to_vec())) };
    let d_fh = nfs.lookup(&LOOKUP3args { what: fh(b"d", &root) }).await.unwrap().unwrap().object;
    let f_fh = nfs.lookup(&LOOKUP3args { what: fh(b"f", &d_fh) }).await.unwrap().unwrap().object;
    let listing = |e: &Engine, ino| {
        let mut names: Vec<Vec<u8>> = e.readdir(&Caller::system(), ino, None, 1000).unwrap().entries.into_iter().map(|x| x.name).collect();
        names.sort();
        names
    };
    let (root_before, d_before) = (listing(&engine, storage_engine::ROOT_INO), listing(&engine, d.ino));
    let long = vec![b'x'; 256];
    let bad: [&[u8]; 7] = [b"a/b", b"d/f", b"a\0b", b"", b".", b"..", &long];
    for name in bad {
        let shown = String::from_utf8_lossy(name).into_owned();
        // A refusal is an NFS error, or GARBAGE_ARGS (the Linux server's answer to `/` and
        // NUL), after which the client's connection is replaced.
        macro_rules! refused {
            ($what:literal, $call:expr) => {{
                match $call {
                    Ok(Nfs3Result::Ok(_)) => panic!("{} {shown:?} was accepted", $what),
                    Ok(Nfs3Result::Err(_)) => {}
                    Err(_) => nfs = client(server.addr).await,
                }
            }};
        }
        refused!("CREATE", nfs.create(&CREATE3args { where_: fh(name, &root), how: createhow3::UNCHECKED(sattr3::default()) }).await);
        refused!("MKDIR", nfs.mkdir(&MKDIR3args { where_: fh(name, &root), attributes: sattr3::default() }).await);
        refused!(
            "SYMLINK",
            nfs.symlink(&SYMLINK3args {
                where_: fh(name, &root),
                symlink: symlinkdata3 { symlink_attributes: sattr3::default(), symlink_data: nfspath3(Opaque::owned(b"d/f".to_vec())) },
            })
            .await
        );
        refused!("MKNOD", nfs.mknod(&MKNOD3args { where_: fh(name, &root), what: mknoddata3::NF3FIFO(sattr3::default()) }).await);
        refused!("RENAME to", nfs.rename(&RENAME3args { from: fh(b"f", &d_fh), to: fh(name, &root) }).await);
        refused!("LINK", nfs.link(&LINK3args { file: f_fh.clone(), link: fh(name, &root) }).await);
        if name != b".." && !name.is_empty() && name != b"." {
            refused!("LOOKUP", nfs.lookup(&LOOKUP3args { what: fh(name, &root) }).await);
        }
    }
    assert_eq!(listing(&engine, storage_engine::ROOT_INO), root_before, "the root gained or lost entries");
    assert_eq!(listing(&engine, d.ino), d_before, "d gained or lost entries");
    // With /d the only export, `..` at its root does not lead above it (the Linux server
    // answers with the export's root itself).
    let only_d = Server::start(engine.clone(), vec![export("/d")]).await;
    let d_root = mount_root(only_d.addr, "/d").await;
    let mut in_d = client(only_d.addr).await;
    match in_d.lookup(&LOOKUP3args { what: fh(b"..", &d_root) }).await.unwrap() {
        Nfs3Result::Ok(up) => assert_eq!(
            in_d.getattr(&GETATTR3args { object: up.object }).await.unwrap().unwrap().obj_attributes.fileid,
            d.ino,
            "`..` at the export's root led above it"
        ),
        Nfs3Result::Err(_) => {}
    }
    only_d.stop().await;
    // Writes and sizes past the largest file the engine keeps.
    let max = storage_engine::FILE_BYTES_MAX;
    for offset in [max - 2, max, u64::MAX - 1] {
        let w = nfs
            .write(&WRITE3args { file: f_fh.clone(), offset, count: 4, stable: stable_how::FILE_SYNC, data: Opaque::owned(b"past".to_vec()) })
            .await
            .unwrap();
        assert!(matches!(w, Nfs3Result::Err((nfsstat3::NFS3ERR_FBIG, _))), "WRITE at {offset}: {w:?}");
    }
    for size in [max + 1, u64::MAX] {
        let s = nfs
            .setattr(&SETATTR3args { object: f_fh.clone(), new_attributes: sattr3 { size: Nfs3Option::Some(size), ..Default::default() }, guard: Nfs3Option::None })
            .await
            .unwrap();
        assert!(matches!(s, Nfs3Result::Err((nfsstat3::NFS3ERR_FBIG, _))), "SETATTR size {size}: {s:?}");
    }
    let a = nfs.getattr(&GETATTR3args { object: f_fh.clone() }).await.unwrap().unwrap();
    assert_eq!(a.obj_attributes.size, 7);
    assert_eq!(engine.read(&c, f.ino, 0, 100).unwrap(), b"content");
    server.stop().await;
}

/// An EXCLUSIVE create is idempotent for its verifier, as RFC 1813 asks: a retransmission
/// with the same verifier gets the same file, another verifier or a GUARDED create gets
/// NFS3ERR_EXIST; once the client has set the file's real times (what Linux's client does next),
/// the verifier no longer matches.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusive_create_is_idempotent_for_its_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let server = Server::start(engine.clone(), vec![export("/")]).await;
    let root = mount_root(server.addr, "/").await;
    let mut nfs = client(server.addr).await;
    let at = |name: &[u8]| diropargs3 { dir: root.clone(), name: filename3(Opaque::owned(name.to_vec())) };
    let v1 = createverf3([1, 2, 3, 4, 5, 6, 7, 8]);
    let v2 = createverf3([8, 7, 6, 5, 4, 3, 2, 1]);
    let first = nfs.create(&CREATE3args { where_: at(b"x"), how: createhow3::EXCLUSIVE(v1) }).await.unwrap().unwrap();
    let Nfs3Option::Some(fh) = first.obj else { panic!("create returned no handle") };
    let again = nfs.create(&CREATE3args { where_: at(b"x"), how: createhow3::EXCLUSIVE(v1) }).await.unwrap().unwrap();
    assert_eq!(again.obj, Nfs3Option::Some(fh.clone()), "a retransmitted EXCLUSIVE create gets the same file");
    for how in [createhow3::EXCLUSIVE(v2), createhow3::GUARDED(sattr3::default())] {
        let r = nfs.create(&CREATE3args { where_: at(b"x"), how }).await.unwrap();
        assert!(matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_EXIST, _))), "{r:?}");
    }
    let t = nfstime3 { seconds: 1_700_000_000, nseconds: 5 };
    nfs.setattr(&SETATTR3args {
        object: fh.clone(),
        new_attributes: sattr3 { atime: set_atime::SET_TO_CLIENT_TIME(t), mtime: set_mtime::SET_TO_CLIENT_TIME(t), ..Default::default() },
        guard: Nfs3Option::None,
    })
    .await
    .unwrap()
    .unwrap();
    let r = nfs.create(&CREATE3args { where_: at(b"x"), how: createhow3::EXCLUSIVE(v1) }).await.unwrap();
    assert!(matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_EXIST, _))), "after the times were set: {r:?}");
    let a = nfs.getattr(&GETATTR3args { object: fh }).await.unwrap().unwrap().obj_attributes;
    assert_eq!((a.mtime.seconds, a.mtime.nseconds, a.size), (1_700_000_000, 5, 0));
    server.stop().await;
}

/// The root handle with its generation replaced (or the inode replaced when `generation` is 0).
fn forge(root: &nfs_fh3, generation: u64) -> Vec<u8> {
    let mut v = root.data.to_vec();
    if generation == 0 {
        v[8..16].copy_from_slice(&999_999u64.to_be_bytes());
    } else {
        v[16..24].copy_from_slice(&generation.to_be_bytes());
    }
    v
}


/// A connection that completes no call for the idle limit while none is in progress is
/// closed: one that never sends anything, and one that stops in the middle of a record. One
/// that keeps calling, more slowly in all than the limit, stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_busy_ones_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let server = Server::start_opts(engine, vec![export("/")], aquifer_nfs::ServeOptions { idle_connection_timeout_ms: Some(1_000) }).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        let closed_after = |s: &mut TcpStream| {
            let t = Instant::now();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).expect("the server closes the connection, not the read timeout");
            assert_eq!(n, 0, "nothing but the close");
            t.elapsed()
        };
        let mut silent = TcpStream::connect(addr).unwrap();
        let waited = closed_after(&mut silent);
        assert!(waited >= Duration::from_millis(900), "closed after {waited:?}");
        let mut half = TcpStream::connect(addr).unwrap();
        let call = call_header(1, 0);
        let rec = record(&call);
        half.write_all(&rec[..rec.len() / 2]).unwrap();
        let waited = closed_after(&mut half);
        assert!(waited >= Duration::from_millis(900), "closed after {waited:?}");
        // NULL calls 600 ms apart for 3 s: every one answered on the same connection.
        let mut busy = TcpStream::connect(addr).unwrap();
        busy.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for xid in 0..5u32 {
            std::thread::sleep(Duration::from_millis(600));
            busy.write_all(&record(&call_header(100 + xid, 0))).unwrap();
            let mut reply = [0u8; 28];
            busy.read_exact(&mut reply).unwrap();
            assert_eq!(parse_reply(&reply).0, 100 + xid);
        }
    })
    .await
    .unwrap();
    server.stop().await;
}

/// A file's owner writes it whatever its mode, as the Linux kernel server lets it (its owner
/// override): the kernel client creates a file with the mode `open(O_CREAT, 0444)` asked for
/// and then sends its WRITEs, and `cp` of a read-only file by a user other than root would
/// otherwise fail with EACCES after creating it empty. Others are still refused, and the
/// owner may not read a file whose mode denies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_writes_a_file_it_created_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(config(dir.path())).unwrap();
    let sys = Caller::system();
    engine.mkdir(&sys, storage_engine::ROOT_INO, b"shared", 0o777).unwrap();
    let server = Server::start(engine.clone(), vec![export("/")]).await;
    let root = mount_root(server.addr, "/shared").await;
    let mut alice = client_as(server.addr, 1000).await;
    let mode_0444 = sattr3 { mode: Nfs3Option::Some(0o444), ..Default::default() };
    let made = alice
        .create(&CREATE3args { where_: diropargs3 { dir: root.clone(), name: filename3(Opaque::owned(b"ro.bin".to_vec())) }, how: createhow3::UNCHECKED(mode_0444) })
        .await
        .unwrap()
        .unwrap();
    let Nfs3Option::Some(fh) = made.obj else { panic!("create returned no handle") };
    let data = b"written after a 0444 create".to_vec();
    let w = alice
        .write(&WRITE3args { file: fh.clone(), offset: 0, count: data.len() as u32, stable: stable_how::FILE_SYNC, data: Opaque::owned(data.clone()) })
        .await
        .unwrap();
    assert!(matches!(w, Nfs3Result::Ok(_)), "the owner's WRITE: {w:?}");
    let a = engine.resolve(&sys, "/shared/ro.bin").unwrap();
    assert_eq!((a.size, a.mode & 0o777, a.uid), (data.len() as u64, 0o444, 1000));
    assert_eq!(engine.read(&sys, a.ino, 0, 100).unwrap(), data);
    // Someone else may not write it, and a mode without the owner's read bit keeps the owner
    // from reading.
    let mut bob = client_as(server.addr, 1001).await;
    let w = bob.write(&WRITE3args { file: fh.clone(), offset: 0, count: 1, stable: stable_how::FILE_SYNC, data: Opaque::owned(b"X".to_vec()) }).await.unwrap();
    assert!(matches!(w, Nfs3Result::Err((nfsstat3::NFS3ERR_ACCES, _))), "another user's WRITE: {w:?}");
    // The same for a size change (`ftruncate` on the descriptor the owner opened to write).
    let resize = |size: u64| SETATTR3args { object: fh.clone(), new_attributes: sattr3 { size: Nfs3Option::Some(size), ..Default::default() }, guard: Nfs3Option::None };
    let s = bob.setattr(&resize(0)).await.unwrap();
    assert!(matches!(s, Nfs3Result::Err((nfsstat3::NFS3ERR_ACCES, _))), "another user's SETATTR size: {s:?}");
    let s = alice.setattr(&resize(7)).await.unwrap();
    assert!(matches!(s, Nfs3Result::Ok(_)), "the owner's SETATTR size: {s:?}");
    let s = alice.setattr(&resize(data.len() as u64)).await.unwrap();
    assert!(matches!(s, Nfs3Result::Ok(_)), "the owner's SETATTR size: {s:?}");
    let mut data = data;
    data[7..].fill(0);
    engine.setattr(&sys, a.ino, storage_engine::SetAttr { mode: Some(0o200), ..Default::default() }).unwrap();
    let r = alice.read(&READ3args { file: fh.clone(), offset: 0, count: 10 }).await.unwrap();
    assert!(matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_ACCES, _))), "the owner's READ of a 0200 file: {r:?}");
    assert_eq!(engine.read(&sys, a.ino, 0, 100).unwrap(), data, "nothing changed");
    server.stop().await;
}
