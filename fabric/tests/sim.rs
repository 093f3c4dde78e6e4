//! Deterministic simulation of the portal protocol: a hub engine and a spoke engine joined by
//! a simulated link driven by a seed, with an injected clock. The link delays answers,
//! delivers invalidations late and out of order, drops connections and partitions the two
//! sides. Every read the spoke serves is checked: its bytes must be a version of the file that
//! was current on the hub no longer than one lease before the read. After the last partition
//! heals, reads must succeed and return the hub's current bytes.
//!
//! `AQUIFER_SIM_SEEDS=N` runs seeds 0..N (default 12); `AQUIFER_SIM_SEED=S` runs one.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use fabric::hub::{HubPortal, HubService, ManifestCache};
use fabric::proto::{PortalMode, Request, Response};
use fabric::spoke::{Link, SpokePortal, SpokeSettings};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use storage_engine::{Caller, Clock, Engine, EngineConfig, Error, Ino, Mutation, Need, RemoteSource, RemoteStub, Stability, Verdict};

const LEASE_MS: u64 = 1000;
const DELAY_MAX_MS: i64 = 80;
const FILES: usize = 3;
const STEPS: usize = 250;

struct SimClock(AtomicI64);
impl Clock for SimClock {
    fn now_ns(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
impl SimClock {
    fn advance_ms(&self, ms: i64) {
        self.0.fetch_add(ms * 1_000_000, Ordering::SeqCst);
    }
    fn ms(&self) -> i64 {
        self.now_ns() / 1_000_000
    }
}

struct Net {
    rng: StdRng,
    epoch: u64,
    partitioned_until_ms: i64,
    /// The connection died; the next call that gets through is on a new one (new epoch), as
    /// when the daemon's supervisor reconnects.
    broken: bool,
    /// (deliver at ms, epoch sent on, changes)
    queue: Vec<(i64, u64, Vec<(u64, u64)>)>,
}

struct SimLink {
    hub: Arc<HubService>,
    clock: Arc<SimClock>,
    net: Mutex<Net>,
    calls: AtomicU64,
}

impl SimLink {
    fn reset(net: &mut Net) {
        net.broken = true;
        net.queue.clear();
    }
}

impl Link for SimLink {
    fn call(&self, req: Request) -> Result<Response, String> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        {
            let mut net = self.net.lock();
            if self.clock.ms() < net.partitioned_until_ms {
                return Err("partitioned".into());
            }
            if net.rng.random_ratio(1, 40) {
                Self::reset(&mut net);
                return Err("connection reset".into());
            }
            if net.broken {
                net.broken = false;
                net.epoch += 1;
            }
            let d = net.rng.random_range(0..DELAY_MAX_MS / 2);
            self.clock.advance_ms(d);
        }
        let resp = match req {
            Request::Renew => Response::Lease { lease_ms: LEASE_MS },
            other => self.hub.handle(other),
        };
        let mut net = self.net.lock();
        let d = net.rng.random_range(0..DELAY_MAX_MS / 2);
        self.clock.advance_ms(d);
        if self.clock.ms() < net.partitioned_until_ms {
            return Err("partitioned while answering".into());
        }
        Ok(resp)
    }
    fn epoch(&self) -> u64 {
        self.net.lock().epoch
    }
}

/// Held weakly, as the daemon's fabric is: the engine must not keep the portal (and through
/// it the engine itself) alive.
struct Source(std::sync::Weak<SpokePortal>);
impl Source {
    fn portal(&self) -> storage_engine::Result<Arc<SpokePortal>> {
        self.0.upgrade().ok_or_else(|| Error::Unavailable("portal gone".into()))
    }
}
impl RemoteSource for Source {
    fn ensure(&self, ino: Ino, stub: &RemoteStub, need: Need) -> storage_engine::Result<()> {
        self.portal()?.ensure(ino, stub, need)
    }
    fn before_mutation(&self, ino: Ino, stub: &RemoteStub, m: &Mutation<'_>) -> storage_engine::Result<Verdict> {
        self.portal()?.before_mutation(ino, stub, m)
    }
}

fn engine(dir: &std::path::Path, clock: Option<Arc<SimClock>>) -> Arc<Engine> {
    let mut cfg = EngineConfig::with_file_drives(dir, 6, 64 << 20, 4, 2);
    cfg.argon2_memory_kib = 8;
    cfg.admin_password = Some("sim-password".into());
    if let Some(c) = clock {
        cfg.clock = c;
    }
    Engine::open(cfg).unwrap()
}

fn hub_put(e: &Engine, dir: Ino, name: &str, data: &[u8]) {
    let c = Caller::system();
    let s = e.begin_put(&c, dir, 0o644).unwrap();
    e.write(&c, s.ino, 0, data, Stability::Unstable).unwrap();
    e.finish_put(&c, s.ino, dir, name.as_bytes()).unwrap();
}

fn spoke_read(e: &Engine, name: &str) -> Result<Vec<u8>, Error> {
    let c = Caller { user: "reader".into(), uid: 1000, gid: 1000, groups: vec![], role: storage_engine::Role::User };
    let a = e.resolve(&c, &format!("/mnt/{name}"))?;
    e.read(&c, a.ino, 0, 1 << 20)
}

fn content(file: usize, version: u64, rng: &mut StdRng) -> Vec<u8> {
    let len = rng.random_range(1..200_000);
    let mut v = format!("file {file} version {version}\n").into_bytes();
    v.extend((0..len).map(|i| (i as u64 ^ version) as u8));
    v
}

fn run(seed: u64) -> (u64, u64) {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = Arc::new(SimClock(AtomicI64::new(1_000_000_000_000)));
    let hub = engine(dirs.0.path(), None);
    let spoke = engine(dirs.1.path(), Some(clock.clone()));
    let c = Caller::system();
    let data_dir = hub.mkdir(&c, storage_engine::ROOT_INO, b"data", 0o755).unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    // history[file] = [(bytes, became current at ms)]
    let mut history: Vec<Vec<(Vec<u8>, i64)>> = vec![Vec::new(); FILES];
    for (f, h) in history.iter_mut().enumerate() {
        let b = content(f, 0, &mut rng);
        hub_put(&hub, data_dir.ino, &format!("f{f}"), &b);
        h.push((b, clock.ms()));
    }
    let svc = Arc::new(HubService::new(
        hub.clone(),
        HubPortal { id: "psim".into(), root: data_dir.ino, mode: PortalMode::ReadOnly, spoke_region: "r".into() },
        Arc::new(Mutex::new(ManifestCache::default())),
    ));
    let mut events = hub.subscribe();
    let link = Arc::new(SimLink {
        hub: svc.clone(),
        clock: clock.clone(),
        net: Mutex::new(Net { rng: StdRng::seed_from_u64(seed ^ 0x5eed), epoch: 1, partitioned_until_ms: 0, broken: false, queue: Vec::new() }),
        calls: AtomicU64::new(0),
    });
    let settings = SpokeSettings { id: "psim".into(), mode: PortalMode::ReadOnly, serve_stale: false, cache_bytes_max: u64::MAX, free_percent_min: 0, local_root: 0 };
    let portal = SpokePortal::new(spoke.clone(), settings, clock.clone(), None);
    portal.set_link(Some(link.clone()));
    spoke.set_remote_source(Arc::new(Source(Arc::downgrade(&portal))));
    let mnt = spoke.mkdir(&c, storage_engine::ROOT_INO, b"mnt", 0o755).unwrap();
    let root = hub.getattr(&c, data_dir.ino).unwrap();
    let stub = RemoteStub { portal: "psim".into(), hub_ino: root.ino, hub_version: 0, ..RemoteStub::default() };
    spoke.remote_stub_put(&Caller::portal(), mnt.ino, &stub).unwrap();

    let mut served = 0;
    let mut refused = 0;
    let mut versions = vec![0u64; FILES];
    let trace = std::env::var("AQUIFER_SIM_TRACE").is_ok();
    let deliver = |clock: &SimClock, events: &mut tokio::sync::broadcast::Receiver<storage_engine::ChangeEvent>| {
        let mut net = link.net.lock();
        let down = net.broken || clock.ms() < net.partitioned_until_ms;
        while let Ok(ev) = events.try_recv() {
            let inv = svc.invalidations(&ev);
            // A dead connection carries nothing; the spoke finds out on its next connection.
            if !inv.is_empty() && !down {
                let at = clock.ms() + net.rng.random_range(0..DELAY_MAX_MS);
                let epoch = net.epoch;
                net.queue.push((at, epoch, inv));
            }
        }
        let now = clock.ms();
        let epoch = net.epoch;
        if down {
            net.queue.clear();
        }
        let (due, rest): (Vec<_>, Vec<_>) = net.queue.drain(..).partition(|(at, _, _)| *at <= now);
        net.queue = rest;
        drop(net);
        for (_, e, changes) in due {
            if e == epoch {
                portal.on_invalidate(&changes);
            }
        }
    };
    for step in 0..STEPS {
        deliver(&clock, &mut events);
        match rng.random_range(0..100) {
            0..=24 => {
                let f = rng.random_range(0..FILES);
                versions[f] += 1;
                let b = content(f, versions[f], &mut rng);
                hub_put(&hub, data_dir.ino, &format!("f{f}"), &b);
                history[f].push((b, clock.ms()));
                if trace {
                    eprintln!("{step} t={} hub writes f{f} v{}", clock.ms(), versions[f]);
                }
            }
            25..=74 => {
                let f = rng.random_range(0..FILES);
                let t = clock.ms();
                match spoke_read(&spoke, &format!("f{f}")) {
                    Ok(bytes) => {
                        served += 1;
                        let i = history[f].iter().position(|(b, _)| *b == bytes).unwrap_or_else(|| {
                            panic!("seed {seed} step {step}: f{f} served {} bytes that were never a version of it", bytes.len())
                        });
                        // Superseded at (start of the next version), or still current.
                        if let Some((_, superseded_at)) = history[f].get(i + 1) {
                            let end = clock.ms().max(t);
                            assert!(
                                *superseded_at >= t - LEASE_MS as i64,
                                "seed {seed} step {step}: f{f} version {i} served at {t}..{end} ms was superseded at {superseded_at} ms, more than a lease ({LEASE_MS} ms) before"
                            );
                        }
                        if trace {
                            eprintln!("{step} t={t} spoke reads f{f}: version {i} of {}", history[f].len() - 1);
                        }
                    }
                    Err(Error::Unavailable(_)) | Err(Error::Stale) | Err(Error::NotFound) => refused += 1,
                    Err(e) => panic!("seed {seed} step {step}: unexpected error {e}"),
                }
            }
            75..=89 => clock.advance_ms(rng.random_range(0..(LEASE_MS as i64 / 2))),
            90..=94 => {
                let _ = portal.renew();
            }
            _ => {
                let mut net = link.net.lock();
                if clock.ms() < net.partitioned_until_ms {
                    continue;
                }
                let len = rng.random_range(100..3 * LEASE_MS as i64);
                net.partitioned_until_ms = clock.ms() + len;
                SimLink::reset(&mut net);
                if trace {
                    eprintln!("{step} t={} partition for {len} ms", clock.ms());
                }
            }
        }
    }
    // Heal and settle: every file reads back as the hub has it now.
    {
        let mut net = link.net.lock();
        net.partitioned_until_ms = 0;
    }
    clock.advance_ms(3 * LEASE_MS as i64);
    for f in 0..FILES {
        let want = &history[f].last().unwrap().0;
        let mut got = None;
        for _ in 0..50 {
            deliver(&clock, &mut events);
            match spoke_read(&spoke, &format!("f{f}")) {
                Ok(b) if &b == want => {
                    got = Some(b);
                    break;
                }
                _ => clock.advance_ms(DELAY_MAX_MS),
            }
        }
        assert!(got.is_some(), "seed {seed}: f{f} never converged to the hub's version after healing");
    }
    (served, refused)
}

#[test]
fn portal_protocol_under_a_seeded_hostile_network() {
    let seeds: Vec<u64> = match (std::env::var("AQUIFER_SIM_SEED"), std::env::var("AQUIFER_SIM_SEEDS")) {
        (Ok(s), _) => vec![s.parse().unwrap()],
        (_, Ok(n)) => (0..n.parse().unwrap()).collect(),
        _ => (0..12).collect(),
    };
    let (mut served, mut refused) = (0, 0);
    for s in seeds {
        let (a, b) = run(s);
        served += a;
        refused += b;
    }
    // The run must exercise both sides of the rule, not refuse everything.
    assert!(served > refused / 4, "{served} reads served, {refused} refused");
    eprintln!("{served} reads served, {refused} refused");
}
