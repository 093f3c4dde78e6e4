//! Two engines (hub and spoke) with their fabrics on loopback, joined through the WAN
//! emulator: the portal life cycle, reads through the spoke, coherence, cuts, writes through
//! a read-write portal, residency and certificate refusals, malformed frames.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabric::wan::{WanConfig, WanEmulator};
use fabric::{CreatePortal, Fabric, FabricConfig, PortalState};
use rand::{Rng, SeedableRng};
use storage_engine::{Caller, Engine, EngineConfig, Error, Stability};
use tempfile::TempDir;

const LEASE_MS: u64 = 1500;

struct Node {
    engine: Arc<Engine>,
    fabric: Arc<Fabric>,
    dir: TempDir,
    region: String,
}

impl Drop for Node {
    /// Stops the node before its directory goes. The fabric's tasks (alive until the test's
    /// runtime ends) still hold the engine, so its database can be writing while the
    /// directory is removed; a removal that loses that race is tried again, or the test
    /// would leave the node's drive files behind.
    fn drop(&mut self) {
        self.fabric.shutdown();
        let _ = self.engine.shutdown();
        for _ in 0..20 {
            if std::fs::remove_dir_all(self.dir.path()).is_ok() || !self.dir.path().exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

async fn start_fabric(engine: Arc<Engine>, dir: &std::path::Path, region: &str) -> Arc<Fabric> {
    start_fabric_with(engine, dir, region, LEASE_MS, fabric::CONNECTIONS_MAX_DEFAULT).await
}

async fn start_fabric_with(engine: Arc<Engine>, dir: &std::path::Path, region: &str, lease_ms: u64, connections_max: usize) -> Arc<Fabric> {
    let cfg = FabricConfig {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listen_required: true,
        region: region.into(),
        name: format!("test-{region}"),
        identity_dir: dir.join("fabric"),
        lease_ms,
        cache_bytes_max: u64::MAX,
        free_percent_min: 0,
        connections_max,
    };
    Fabric::start(engine, cfg).await.unwrap()
}

async fn node(region: &str) -> Node {
    node_with(region, LEASE_MS, fabric::CONNECTIONS_MAX_DEFAULT).await
}

async fn node_with(region: &str, lease_ms: u64, connections_max: usize) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EngineConfig::with_file_drives(dir.path(), 6, 96 << 20, 4, 2);
    cfg.argon2_memory_kib = 8;
    cfg.admin_password = Some("fabric-test-pw".into());
    let engine = tokio::task::spawn_blocking(move || Engine::open(cfg)).await.unwrap().unwrap();
    let fabric = start_fabric_with(engine.clone(), dir.path(), region, lease_ms, connections_max).await;
    Node { engine, fabric, dir, region: region.into() }
}

fn admin() -> Caller {
    Caller::system()
}

async fn put(engine: &Arc<Engine>, path: &str, data: Vec<u8>) -> storage_engine::Result<()> {
    let e = engine.clone();
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let c = admin();
        let mut dir = e.getattr(&c, storage_engine::ROOT_INO)?;
        let comps: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        for comp in &comps[..comps.len() - 1] {
            dir = match e.lookup(&c, dir.ino, comp.as_bytes()) {
                Ok(a) => a,
                Err(Error::NotFound) => e.mkdir(&c, dir.ino, comp.as_bytes(), 0o755)?,
                Err(err) => return Err(err),
            };
        }
        let staged = e.begin_put(&c, dir.ino, 0o644)?;
        for (i, piece) in data.chunks(1 << 20).enumerate() {
            e.write(&c, staged.ino, (i as u64) << 20, piece, Stability::Unstable)?;
        }
        e.finish_put(&c, staged.ino, dir.ino, comps.last().unwrap().as_bytes()).map(|_| ())
    })
    .await
    .unwrap()
}

async fn get(engine: &Arc<Engine>, path: &str) -> storage_engine::Result<Vec<u8>> {
    let e = engine.clone();
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let c = Caller { user: "reader".into(), uid: 1000, gid: 1000, groups: vec![], role: storage_engine::Role::User };
        let a = e.resolve(&c, &path)?;
        let mut out = Vec::new();
        loop {
            let piece = e.read(&c, a.ino, out.len() as u64, 1 << 20)?;
            if piece.is_empty() {
                return Ok(out);
            }
            out.extend_from_slice(&piece);
        }
    })
    .await
    .unwrap()
}

async fn list(engine: &Arc<Engine>, path: &str) -> storage_engine::Result<Vec<String>> {
    let e = engine.clone();
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        let c = admin();
        let a = e.resolve(&c, &path)?;
        let page = e.readdir(&c, a.ino, None, 10_000)?;
        Ok(page.entries.iter().map(|d| String::from_utf8_lossy(&d.name).into_owned()).collect())
    })
    .await
    .unwrap()
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.random()).collect()
}

async fn wait_for<F: Fn() -> bool>(what: &str, f: F) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The WAN emulator in front of `hub`'s fabric listener, `delay_ms` each way.
async fn wan_to(hub: &Node, delay_ms: u64) -> WanEmulator {
    WanEmulator::start(WanConfig { delay: Duration::from_millis(delay_ms), ..WanConfig::new("127.0.0.1:0".parse().unwrap(), hub.fabric.local_addr().unwrap()) })
        .await
        .unwrap()
}

async fn portal(hub: &Node, spoke: &Node, via: SocketAddr, hub_path: &str, spoke_path: &str, mode: &str) -> String {
    let r = spoke
        .fabric
        .create(&admin(), CreatePortal {
            hub: via.to_string(),
            hub_path: hub_path.into(),
            spoke_path: spoke_path.into(),
            mode: mode.into(),
            serve_stale: false,
            hub_fingerprint: Some(hub.fabric.fingerprint().into()),
        })
        .await
        .unwrap();
    assert_eq!(r.state, PortalState::Pending);
    assert_eq!(hub.fabric.record(&r.id).unwrap().state, PortalState::Pending);
    hub.fabric.authorize(&admin(), &r.id).unwrap();
    let id = r.id.clone();
    wait_for("the spoke to see the portal active", || spoke.fabric.record(&id).is_some_and(|r| r.state == PortalState::Active && r.lease_ms > 0)).await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_only_portal_life_cycle_coherence_and_cuts() {
    let hub = node("eu").await;
    let spoke = node("eu").await;
    let wan = wan_to(&hub, 10).await;
    let big = random(5 << 20, 1);
    let small = random(10_000, 2);
    put(&hub.engine, "/data/big.bin", big.clone()).await.unwrap();
    put(&hub.engine, "/data/sub/small.txt", small.clone()).await.unwrap();
    put(&hub.engine, "/data/sub/deeper/empty", vec![]).await.unwrap();

    // Before the hub authorizes it, the spoke directory refuses to serve.
    let r = spoke
        .fabric
        .create(&admin(), CreatePortal {
            hub: wan.local_addr().to_string(),
            hub_path: "/data".into(),
            spoke_path: "/mnt/data".into(),
            mode: "ro".into(),
            serve_stale: false,
            hub_fingerprint: None,
        })
        .await
        .unwrap();
    match list(&spoke.engine, "/mnt/data").await {
        Err(Error::Unavailable(m)) => assert!(m.contains("pending"), "{m}"),
        other => panic!("pending portal served: {other:?}"),
    }
    hub.fabric.authorize(&admin(), &r.id).unwrap();
    let id = r.id.clone();
    wait_for("active", || spoke.fabric.record(&id).is_some_and(|r| r.state == PortalState::Active && r.lease_ms > 0)).await;

    // The whole tree, bit-exact.
    assert_eq!(list(&spoke.engine, "/mnt/data").await.unwrap(), vec!["big.bin", "sub"]);
    assert_eq!(list(&spoke.engine, "/mnt/data/sub").await.unwrap(), vec!["deeper", "small.txt"]);
    assert_eq!(get(&spoke.engine, "/mnt/data/big.bin").await.unwrap(), big);
    assert_eq!(get(&spoke.engine, "/mnt/data/sub/small.txt").await.unwrap(), small);
    assert_eq!(get(&spoke.engine, "/mnt/data/sub/deeper/empty").await.unwrap(), Vec::<u8>::new());
    let hub_attr = hub.engine.resolve(&admin(), "/data/big.bin").unwrap();
    let spoke_attr = spoke.engine.resolve(&admin(), "/mnt/data/big.bin").unwrap();
    assert_eq!((spoke_attr.size, spoke_attr.mtime_ns, spoke_attr.mode), (hub_attr.size, hub_attr.mtime_ns, hub_attr.mode));
    assert_eq!(spoke_attr.version, hub_attr.version, "both sides name the same version");
    let wire_first = wan.stats().bytes_down;
    // Read again: served from the spoke's cache, nothing new crosses the link.
    assert_eq!(get(&spoke.engine, "/mnt/data/big.bin").await.unwrap(), big);
    assert!(wan.stats().bytes_down < wire_first + 64 * 1024, "a cached read went over the WAN");
    // Once read-ahead has settled, the spoke keeps no per-file fill state for the files read.
    let busy = || spoke.fabric.spoke_stats(&id).expect("spoke stats")["files_busy"].as_u64();
    wait_for("the fill state of finished reads to be released", || busy() == Some(0)).await;

    // A read-only portal refuses writes on the spoke.
    assert!(matches!(put(&spoke.engine, "/mnt/data/new.txt", b"x".to_vec()).await, Err(Error::ReadOnly(_))));

    // Change on the hub: the spoke sees the new version on its next access.
    let mut big2 = big.clone();
    big2[4_000_000..4_100_000].fill(7);
    put(&hub.engine, "/data/big.bin", big2.clone()).await.unwrap();
    put(&hub.engine, "/data/sub/added.txt", b"hello".to_vec()).await.unwrap();
    let t = Instant::now();
    loop {
        let got = get(&spoke.engine, "/mnt/data/big.bin").await.unwrap();
        if got == big2 {
            break;
        }
        assert_eq!(got, big, "neither the old nor the new version");
        assert!(t.elapsed() < Duration::from_secs(5), "the spoke kept serving the old version");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = spoke.fabric.spoke_stats(&id).unwrap();
    assert!(stats["reused_bytes"].as_u64().unwrap() > 3 << 20, "unchanged chunks were fetched again: {stats}");
    wait_for("the new file", || spoke.engine.resolve(&admin(), "/mnt/data/sub/added.txt").is_ok()).await;
    assert_eq!(get(&spoke.engine, "/mnt/data/sub/added.txt").await.unwrap(), b"hello");

    // Cut the link: cached data is served until the lease runs out, then refused.
    wan.cut().await;
    put(&hub.engine, "/data/sub/small.txt", b"changed while cut".to_vec()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 1200)).await;
    match get(&spoke.engine, "/mnt/data/sub/small.txt").await {
        Err(Error::Unavailable(m)) => assert!(m.contains("lease") || m.contains("unreachable"), "{m}"),
        Ok(v) => panic!("served {} bytes after the lease ran out (stale: {})", v.len(), v == small),
        Err(e) => panic!("unexpected error {e}"),
    }
    assert_ne!(spoke.fabric.record(&id).unwrap().state, PortalState::Active);
    wan.restore().await;
    wait_for("reconnection", || spoke.fabric.record(&id).is_some_and(|r| r.state == PortalState::Active)).await;
    let t = Instant::now();
    loop {
        match get(&spoke.engine, "/mnt/data/sub/small.txt").await {
            Ok(v) if v == b"changed while cut" => break,
            Ok(v) => assert!(v != small || t.elapsed() < Duration::from_secs(1), "stale bytes after reconnecting"),
            Err(_) => {}
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no recovery after restore");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Delete on the spoke: the tree and its cached space go, the hub forgets the portal.
    let before = spoke.engine.statfs(&admin()).unwrap().free_bytes;
    spoke.fabric.delete(&admin(), &id).await.unwrap();
    assert!(spoke.fabric.record(&id).is_none());
    assert!(list(&spoke.engine, "/mnt/data").await.map(|v| v.is_empty()).unwrap_or(true));
    assert!(hub.fabric.record(&id).is_none());
    let after = spoke.engine.statfs(&admin()).unwrap().free_bytes;
    assert!(after > before, "cached space not reclaimed ({before} -> {after})");
    let audit = hub.engine.audit_list(&admin(), 0, 1000).unwrap();
    for action in ["portal.propose", "portal.authorize", "portal.withdraw"] {
        assert!(audit.iter().any(|r| r.action == action), "no {action} in the hub's audit log");
    }
    drop(wan);
    hub.fabric.shutdown();
    spoke.fabric.shutdown();
    let _ = (&hub.dir, &spoke.dir, &hub.region);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_write_portal_forwards_writes_to_the_hub() {
    let hub = node("us").await;
    let spoke = node("us").await;
    put(&hub.engine, "/proj/readme", b"hub file".to_vec()).await.unwrap();
    let wan = wan_to(&hub, 5).await;
    let id = portal(&hub, &spoke, wan.local_addr(), "/proj", "/proj", "rw").await;
    let ckpt = random(3 << 20, 9);
    put(&spoke.engine, "/proj/ckpt/step1.bin", ckpt.clone()).await.unwrap();
    // Acknowledged = on the hub.
    assert_eq!(get(&hub.engine, "/proj/ckpt/step1.bin").await.unwrap(), ckpt);
    assert_eq!(get(&spoke.engine, "/proj/ckpt/step1.bin").await.unwrap(), ckpt);
    let (h, s) = (hub.engine.resolve(&admin(), "/proj/ckpt/step1.bin").unwrap(), spoke.engine.resolve(&admin(), "/proj/ckpt/step1.bin").unwrap());
    assert_eq!((h.size, h.mtime_ns), (s.size, s.mtime_ns));
    // A second version that shares most chunks sends little.
    let mut ckpt2 = ckpt.clone();
    ckpt2[100..200].fill(1);
    let before = spoke.fabric.spoke_stats(&id).unwrap()["wire_bytes"].as_u64().unwrap();
    put(&spoke.engine, "/proj/ckpt/step2.bin", ckpt2.clone()).await.unwrap();
    let sent = spoke.fabric.spoke_stats(&id).unwrap()["wire_bytes"].as_u64().unwrap() - before;
    assert!(sent < 1 << 20, "{sent} bytes sent for a 100-byte change");
    assert_eq!(get(&hub.engine, "/proj/ckpt/step2.bin").await.unwrap(), ckpt2);
    // Rename and remove go to the hub too.
    let e = spoke.engine.clone();
    tokio::task::spawn_blocking(move || {
        let c = admin();
        let d = e.resolve(&c, "/proj/ckpt").unwrap();
        e.rename(&c, d.ino, b"step1.bin", d.ino, b"old.bin").unwrap();
        e.unlink(&c, d.ino, b"step2.bin").unwrap();
        // Links and xattrs are not forwarded: a clear refusal, nothing changed.
        let f = e.lookup(&c, d.ino, b"old.bin").unwrap();
        assert!(matches!(e.link(&c, f.ino, d.ino, b"hard"), Err(Error::NotSupported(_))));
        assert!(matches!(e.setxattr(&c, f.ino, b"user.x", b"1"), Err(Error::NotSupported(_))));
        // The spoke's permission rules apply before anything goes to the hub.
        let user = Caller { user: "u".into(), uid: 1000, gid: 1000, groups: vec![], role: storage_engine::Role::User };
        assert!(matches!(e.write(&user, f.ino, 0, b"x", Stability::Unstable), Err(Error::PermissionDenied)));
        assert!(matches!(e.unlink(&user, d.ino, b"old.bin"), Err(Error::PermissionDenied)));
        assert!(matches!(e.mkdir(&user, d.ino, b"mine", 0o755), Err(Error::PermissionDenied)));
        assert!(matches!(e.setattr(&user, f.ino, storage_engine::SetAttr { mode: Some(0o777), ..Default::default() }), Err(Error::PermissionDenied)));
    })
    .await
    .unwrap();
    assert_eq!(list(&hub.engine, "/proj/ckpt").await.unwrap(), vec!["old.bin"]);
    assert_eq!(get(&hub.engine, "/proj/ckpt/old.bin").await.unwrap(), ckpt);
    assert_eq!(get(&spoke.engine, "/proj/readme").await.unwrap(), b"hub file");

    // Link cut: a write is refused (never acknowledged without the hub), nothing half-made on
    // either side; what was acknowledged before is on the hub; after restore writes work again.
    wan.cut().await;
    let r = put(&spoke.engine, "/proj/ckpt/during-cut.bin", random(100_000, 3)).await;
    assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");
    assert!(hub.engine.resolve(&admin(), "/proj/ckpt/during-cut.bin").is_err());
    assert!(spoke.engine.resolve(&admin(), "/proj/ckpt/during-cut.bin").is_err());
    wan.restore().await;
    wait_for("reconnection", || spoke.fabric.record(&id).is_some_and(|r| r.state == PortalState::Active)).await;
    let after = random(200_000, 4);
    let t = Instant::now();
    while put(&spoke.engine, "/proj/ckpt/after-cut.bin", after.clone()).await.is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "writes did not resume after the link came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(&hub.engine, "/proj/ckpt/after-cut.bin").await.unwrap(), after);
    assert_eq!(get(&hub.engine, "/proj/ckpt/old.bin").await.unwrap(), ckpt);

    // In-place writes (as NFS, SMB and SFTP make them): local until commit or close, then on
    // the hub; the spoke's file keeps its inode.
    let mut patched = after.clone();
    patched[1000..1005].copy_from_slice(b"PATCH");
    patched.extend_from_slice(b"tail");
    let e = spoke.engine.clone();
    let ino = tokio::task::spawn_blocking(move || {
        let c = admin();
        let f = e.resolve(&c, "/proj/ckpt/after-cut.bin").unwrap();
        e.write(&c, f.ino, 1000, b"PATCH", Stability::Unstable).unwrap();
        e.write(&c, f.ino, 200_000, b"tail", Stability::Unstable).unwrap();
        f.ino
    })
    .await
    .unwrap();
    assert_eq!(get(&hub.engine, "/proj/ckpt/after-cut.bin").await.unwrap(), after, "uncommitted writes reached the hub");
    assert_eq!(get(&spoke.engine, "/proj/ckpt/after-cut.bin").await.unwrap(), patched);
    let e = spoke.engine.clone();
    tokio::task::spawn_blocking(move || e.commit(&admin(), ino).unwrap()).await.unwrap();
    assert_eq!(get(&hub.engine, "/proj/ckpt/after-cut.bin").await.unwrap(), patched);
    assert_eq!(spoke.engine.resolve(&admin(), "/proj/ckpt/after-cut.bin").unwrap().ino, ino);
    // A new file written piece by piece and closed.
    let body = random(300_000, 5);
    let (e, b) = (spoke.engine.clone(), body.clone());
    tokio::task::spawn_blocking(move || {
        let c = admin();
        let d = e.resolve(&c, "/proj/ckpt").unwrap();
        let f = e.create(&c, d.ino, b"pieces.bin", 0o644, true).unwrap();
        assert!(matches!(e.create(&c, d.ino, b"pieces.bin", 0o644, true), Err(Error::Exists)));
        assert_eq!(e.create(&c, d.ino, b"pieces.bin", 0o644, false).unwrap().ino, f.ino);
        for (i, p) in b.chunks(100_000).enumerate() {
            e.write(&c, f.ino, (i * 100_000) as u64, p, Stability::Unstable).unwrap();
        }
        e.close(&c, f.ino).unwrap();
    })
    .await
    .unwrap();
    assert_eq!(get(&hub.engine, "/proj/ckpt/pieces.bin").await.unwrap(), body);
    assert_eq!(get(&spoke.engine, "/proj/ckpt/pieces.bin").await.unwrap(), body);
    hub.fabric.shutdown();
    spoke.fabric.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn residency_certificates_and_bad_input_are_refused() {
    let hub = node("eu").await;
    let spoke = node("us").await;
    put(&hub.engine, "/eu-only/data/x", b"x".to_vec()).await.unwrap();
    put(&hub.engine, "/open/y", b"y".to_vec()).await.unwrap();
    let label = hub.engine.resolve(&admin(), "/eu-only").unwrap();
    hub.engine.setxattr(&admin(), label.ino, fabric::hub::RESIDENCY_XATTR, b"eu").unwrap();
    // Ordinary users cannot remove a label.
    let user = Caller { user: "u".into(), uid: 1000, gid: 1000, groups: vec![], role: storage_engine::Role::User };
    assert!(hub.engine.removexattr(&user, label.ino, fabric::hub::RESIDENCY_XATTR).is_err());
    let hub_addr = hub.fabric.local_addr().unwrap().to_string();
    let req = |hub_path: &str, spoke_path: &str| CreatePortal {
        hub: hub_addr.clone(),
        hub_path: hub_path.into(),
        spoke_path: spoke_path.into(),
        mode: "ro".into(),
        serve_stale: false,
        hub_fingerprint: None,
    };
    // Labelled data may not go to a cluster in another region: refused, logged, nothing made.
    let e = spoke.fabric.create(&admin(), req("/eu-only/data", "/mnt/eu")).await.unwrap_err();
    assert_eq!(e.status, 403, "{}", e.message);
    assert!(e.message.contains("residency"), "{}", e.message);
    assert!(hub.fabric.records().unwrap().is_empty());
    assert!(hub.engine.audit_list(&admin(), 0, 100).unwrap().iter().any(|r| r.action == "portal.refused"));
    // A hub path that does not exist.
    let e = spoke.fabric.create(&admin(), req("/nope", "/mnt/nope")).await.unwrap_err();
    assert_eq!(e.status, 404, "{}", e.message);
    // A pinned fingerprint that does not match.
    let mut bad = req("/open", "/mnt/open");
    bad.hub_fingerprint = Some("00".repeat(32));
    let e = spoke.fabric.create(&admin(), bad).await.unwrap_err();
    assert!(e.message.contains("pinned"), "{}", e.message);
    // Not an admin.
    assert_eq!(spoke.fabric.create(&user, req("/open", "/mnt/open")).await.unwrap_err().status, 403);

    // A working portal, then the spoke comes back with another certificate: refused.
    let id = portal(&hub, &spoke, hub.fabric.local_addr().unwrap(), "/open", "/mnt/open", "ro").await;
    assert_eq!(get(&spoke.engine, "/mnt/open/y").await.unwrap(), b"y");
    spoke.fabric.shutdown();
    std::fs::remove_file(spoke.dir.path().join("fabric/cluster-cert.pem")).unwrap();
    std::fs::remove_file(spoke.dir.path().join("fabric/cluster-key.pem")).unwrap();
    let impostor = start_fabric(spoke.engine.clone(), spoke.dir.path(), "us").await;
    wait_for("the hub to refuse the new certificate", || {
        impostor.record(&id).is_some_and(|r| r.state != PortalState::Active && r.reason.contains("certificate"))
    })
    .await;
    assert!(hub.engine.audit_list(&admin(), 0, 1000).unwrap().iter().any(|r| r.action == "portal.refused" && r.outcome.contains("certificate")));

    // Malformed input on the fabric port: plain garbage, then a TLS peer sending a huge
    // length and garbage frames. The hub closes those connections and keeps serving.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = hub.fabric.local_addr().unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n\x00\x01\x02garbage").await.unwrap();
    let mut buf = [0u8; 64];
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.expect("garbage connection closed");
    for payload in [vec![0xff, 0xff, 0xff, 0xff], vec![0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8]] {
        let mut tls = tls_to(addr, &fabric::tls::Identity::generate("stranger").unwrap()).await;
        tls.write_all(&payload).await.unwrap();
        tls.flush().await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await.expect("closed after bad frames");
        assert!(matches!(n, Ok(0) | Err(_)), "the hub answered a malformed frame");
    }
    // A stranger that speaks the protocol but names a portal it was not given.
    assert_eq!(hub.fabric.record(&id).unwrap().state, PortalState::Active);
    put(&hub.engine, "/open/z", b"z".to_vec()).await.unwrap();
    assert_eq!(get(&hub.engine, "/open/z").await.unwrap(), b"z");
    impostor.shutdown();
    hub.fabric.shutdown();
}

type TlsStream = tokio_openssl::SslStream<tokio::net::TcpStream>;

/// A TLS connection to a fabric listener with `id`'s certificate, handshake done; nothing sent.
async fn tls_to(addr: SocketAddr, id: &fabric::tls::Identity) -> TlsStream {
    let ssl = id.connector().unwrap().configure().unwrap().verify_hostname(false).into_ssl("aquifer").unwrap();
    let sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_openssl::SslStream::new(ssl, sock).unwrap();
    std::pin::Pin::new(&mut tls).connect().await.unwrap();
    tls
}

/// Whether the other end closed `s` within `wait` (a read ends or fails; what arrives
/// before, such as change notices, is read past).
async fn closed_within(s: &mut TlsStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_hub_bounds_its_connections_and_closes_idle_ones() {
    // Lease 4 s: connections idle for 12 s are closed; the spoke renews every 1.3 s.
    const HUB_LEASE_MS: u64 = 4000;
    const PLACES: usize = 72;
    let idle = Duration::from_millis(HUB_LEASE_MS * fabric::IDLE_LEASES);
    let hub = node_with("eu", HUB_LEASE_MS, PLACES).await;
    let spoke = node("eu").await;
    put(&hub.engine, "/open/y", b"y".to_vec()).await.unwrap();
    let addr = hub.fabric.local_addr().unwrap();
    let id = portal(&hub, &spoke, addr, "/open", "/mnt/open", "ro").await;
    assert_eq!(get(&spoke.engine, "/mnt/open/y").await.unwrap(), b"y");
    let hub_connections = || hub.fabric.describe(&hub.fabric.record(&id).unwrap())["connections"].as_u64().unwrap();
    let connects = || spoke.fabric.describe(&spoke.fabric.record(&id).unwrap())["connects"].as_u64().unwrap();
    assert_eq!((hub_connections(), connects()), (1, 1));
    let started = Instant::now();

    // Certificates that no portal names: 64 connections at once; the next is closed right
    // after its handshake, long before the idle limit.
    let stranger = fabric::tls::Identity::generate("stranger").unwrap();
    let mut strangers = Vec::new();
    for _ in 0..fabric::STRANGER_CONNECTIONS_MAX {
        strangers.push(tls_to(addr, &stranger).await);
    }
    let mut one_more = tls_to(addr, &stranger).await;
    assert!(closed_within(&mut one_more, idle / 3).await, "a stranger past the cap was served");
    assert!(!closed_within(&mut strangers[0], Duration::from_millis(100)).await, "a stranger within the cap was closed");

    // The spoke's certificate is known: its connections take the places left (72 less the
    // 64 strangers and the portal's own connection), and the next one waits in the backlog
    // until a place frees.
    let known = fabric::tls::Identity::load_or_create(&spoke.dir.path().join("fabric"), "test-eu").unwrap();
    assert_eq!(known.fingerprint, spoke.fabric.fingerprint());
    let mut known_conns = Vec::new();
    for _ in 0..PLACES - fabric::STRANGER_CONNECTIONS_MAX - 1 {
        known_conns.push(tls_to(addr, &known).await);
    }
    // One of them says Hello for the portal, as a spoke reconnecting would, and then nothing.
    let hello = fabric::proto::Request::Hello { version: fabric::proto::PROTOCOL_VERSION, portal: id.clone() };
    let r = call_raw(&mut known_conns[0], 1, hello).await;
    assert!(matches!(r, fabric::proto::Response::Welcome { .. }), "{r:?}");
    assert_eq!(hub_connections(), 2);
    let waiting = tokio::spawn({
        let known = fabric::tls::Identity::load_or_create(&spoke.dir.path().join("fabric"), "test-eu").unwrap();
        async move { tls_to(addr, &known).await }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!waiting.is_finished(), "a connection past the hub's places was served");
    // The portal works on through its connection meanwhile.
    // (the hub's change notice reaches the spoke shortly after the file is made).
    put(&hub.engine, "/open/z", b"z".to_vec()).await.unwrap();
    let t = Instant::now();
    while get(&spoke.engine, "/mnt/open/z").await.ok().as_deref() != Some(b"z") {
        assert!(t.elapsed() < Duration::from_secs(3), "a new hub file not seen through the portal");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(strangers.pop());
    let mut late = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("served once a place freed").unwrap();
    assert!(started.elapsed() < idle, "the test was too slow to tell the cap from the idle limit");

    // Connections that send nothing are closed after the idle limit; the portal's, which
    // renews its lease, stays.
    for s in strangers.iter_mut().chain(known_conns.iter_mut()) {
        assert!(closed_within(s, idle + Duration::from_secs(5)).await, "an idle connection was kept");
    }
    wait_for("the hub to drop the silent spoke connection", || hub_connections() == 1).await;
    assert!(started.elapsed() >= idle);
    assert!(closed_within(&mut late, idle + Duration::from_secs(5)).await, "an idle connection was kept");
    assert_eq!(hub.fabric.record(&id).unwrap().state, PortalState::Active);
    assert_eq!(spoke.fabric.record(&id).unwrap().state, PortalState::Active);
    assert_eq!((hub_connections(), connects()), (1, 1), "the portal's connection was closed");
    // Places are free again: a new stranger is served (and proposes nothing).
    let mut again = tls_to(addr, &stranger).await;
    assert!(!closed_within(&mut again, Duration::from_millis(500)).await);
    hub.fabric.shutdown();
    spoke.fabric.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_readers_at_once_through_a_distant_portal() {
    // More concurrent reads of files not yet cached than the hub takes requests in flight on
    // one connection (as a data loader with many workers does), over a 30 ms link: every
    // read gets its bytes; the spoke queues what the connection cannot carry yet.
    const FILES: usize = 3 * fabric::conn::REQUESTS_IN_FLIGHT_MAX / 2;
    let hub = node("eu").await;
    let spoke = node("eu").await;
    let files: Vec<Vec<u8>> = (0..FILES).map(|i| random((1 << 20) + i * 100, 100 + i as u64)).collect();
    for (i, f) in files.iter().enumerate() {
        put(&hub.engine, &format!("/shards/s{i:03}"), f.clone()).await.unwrap();
    }
    let wan = wan_to(&hub, 30).await;
    portal(&hub, &spoke, wan.local_addr(), "/shards", "/mnt/shards", "ro").await;
    assert_eq!(list(&spoke.engine, "/mnt/shards").await.unwrap().len(), FILES);
    let reads: Vec<_> = (0..FILES)
        .map(|i| {
            let e = spoke.engine.clone();
            tokio::spawn(async move { get(&e, &format!("/mnt/shards/s{i:03}")).await })
        })
        .collect();
    for (i, r) in reads.into_iter().enumerate() {
        match r.await.unwrap() {
            Ok(data) => assert!(data == files[i], "s{i:03}: other bytes"),
            Err(e) => panic!("s{i:03}: {e}"),
        }
    }
    hub.fabric.shutdown();
    spoke.fabric.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_writers_at_once_through_a_distant_portal() {
    // Whole-file writes of 96 new files at once through a read-write portal over a 30 ms
    // link: each is answered once the hub has it, and the hub has every byte.
    const FILES: usize = 96;
    let hub = node("eu").await;
    let spoke = node("eu").await;
    put(&hub.engine, "/out/keep", b"k".to_vec()).await.unwrap();
    let wan = wan_to(&hub, 30).await;
    portal(&hub, &spoke, wan.local_addr(), "/out", "/mnt/out", "rw").await;
    assert_eq!(list(&spoke.engine, "/mnt/out").await.unwrap().len(), 1);
    let files: Vec<Vec<u8>> = (0..FILES).map(|i| random((1 << 20) + i * 100, 500 + i as u64)).collect();
    let writes: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let e = spoke.engine.clone();
            let f = f.clone();
            tokio::spawn(async move { put(&e, &format!("/mnt/out/w{i:03}"), f).await })
        })
        .collect();
    for (i, w) in writes.into_iter().enumerate() {
        if let Err(e) = w.await.unwrap() {
            panic!("w{i:03}: {e}");
        }
    }
    for (i, f) in files.iter().enumerate() {
        assert!(get(&hub.engine, &format!("/out/w{i:03}")).await.unwrap() == *f, "w{i:03} on the hub");
    }
    hub.fabric.shutdown();
    spoke.fabric.shutdown();
}

/// Sends `req` as request `id` on a raw fabric connection and reads its answer.
async fn call_raw(s: &mut TlsStream, id: u64, req: fabric::proto::Request) -> fabric::proto::Response {
    use fabric::proto::{Frame, decode, encode};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(&encode(&Frame::Request { id, body: req })).await.unwrap();
    s.flush().await.unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.unwrap();
    match decode(&body) {
        Ok(Frame::Response { id: got, body }) if got == id => body,
        other => panic!("not the answer to {id}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_fill_the_hub_with_proposals_or_refusals() {
    use fabric::proto::{PortalMode, Request, Response};
    let hub = node("eu").await;
    put(&hub.engine, "/open/y", b"y".to_vec()).await.unwrap();
    let addr = hub.fabric.local_addr().unwrap();
    let stranger = fabric::tls::Identity::generate("stranger").unwrap();
    let mut s = tls_to(addr, &stranger).await;
    let propose = |id: String, spoke_path: String, spoke_name: String| Request::Propose {
        portal: id,
        hub_path: "/open".into(),
        spoke_path,
        mode: PortalMode::ReadOnly,
        spoke_region: "eu".into(),
        spoke_name,
    };
    // Oversized fields are refused and stored nowhere.
    for (path, name) in [("/x".repeat(3000), "n".to_string()), ("/x".into(), "n".repeat(256))] {
        match call_raw(&mut s, 1, propose("p-big".into(), path, name)).await {
            Response::Error { message, .. } => assert!(message.contains("at most"), "{message}"),
            other => panic!("{other:?}"),
        }
    }
    assert!(hub.fabric.records().unwrap().is_empty());
    // Up to the limit, then refused; asking again about one already pending still answers.
    for i in 0..fabric::PENDING_PER_CERTIFICATE_MAX {
        let r = call_raw(&mut s, 10 + i as u64, propose(format!("p-{i}"), format!("/mnt/{i}"), "stranger".into())).await;
        assert!(matches!(r, Response::Proposed { .. }), "{r:?}");
    }
    match call_raw(&mut s, 100, propose("p-more".into(), "/mnt/more".into(), "stranger".into())).await {
        Response::Error { message, .. } => assert!(message.contains("pending"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(call_raw(&mut s, 101, propose("p-0".into(), "/mnt/0".into(), "stranger".into())).await, Response::Proposed { .. }));
    assert_eq!(hub.fabric.records().unwrap().len(), fabric::PENDING_PER_CERTIFICATE_MAX);
    // Another cluster still proposes; once the admin deletes one of the stranger's, it may again.
    let other = fabric::tls::Identity::generate("other").unwrap();
    let mut o = tls_to(addr, &other).await;
    assert!(matches!(call_raw(&mut o, 1, propose("q-0".into(), "/mnt/q".into(), "other".into())).await, Response::Proposed { .. }));
    hub.fabric.delete(&admin(), "p-3").await.unwrap();
    assert!(matches!(call_raw(&mut s, 102, propose("p-more".into(), "/mnt/more".into(), "stranger".into())).await, Response::Proposed { .. }));

    // Refusals go to the audit log, but not one for each of a flood of them.
    let refused = || hub.engine.audit_list(&admin(), 0, 100_000).unwrap().iter().filter(|r| r.action == "portal.refused").count();
    let before = refused();
    for i in 0..300u64 {
        let r = call_raw(&mut s, 1000 + i, Request::Hello { version: fabric::proto::PROTOCOL_VERSION, portal: format!("nope-{i}") }).await;
        assert!(matches!(r, Response::Error { .. }), "{r:?}");
    }
    let logged = refused() - before;
    let per_minute = fabric::REFUSALS_LOGGED_PER_MINUTE as usize;
    // At most two minutes' worth (the flood may cross a minute) and the line counting the rest.
    assert!((per_minute.min(300)..=2 * per_minute + 1).contains(&logged), "{logged} refusals logged");
    hub.fabric.shutdown();
}
